"""Completions and the completion queue (spec 4.6): leases hold credits until consumed, a
failed driver push returns completion and permit, dropping the queue releases everything."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from chrysalis.core._pid import Pid
from chrysalis.core.completion import (
    AbortStarted,
    AuthenticationFailed,
    CommandCompletion,
    CommandError,
    CommandFailed,
    CompletionCredits,
    CompletionQueueClosed,
    CompletionQueueFull,
    CompletionReceiver,
    CompletionSender,
    ConnectionClosed,
    ConnectionEstablished,
    ConnectionRef,
    DiscardCompletion,
    DriverId,
    DriverStopped,
    EndpointChannels,
    IncomingStream,
    OperationId,
    QueueEmpty,
    QueueExhausted,
    ReceiveCompletion,
    ReceiveStatus,
    ReceiveSubmission,
    RequestId,
    SendCompletion,
    SendOutcome,
    StreamClosed,
    StreamRef,
    SubmissionLimits,
    completion_queue,
)

DRIVER = DriverId(2)
CONNECTION = ConnectionRef(DRIVER, 1)
STREAM = StreamRef(CONNECTION, 4)
OP = OperationId(DRIVER, 1)


class CountingNotifier:
    def __init__(self) -> None:
        self.count = 0

    def notify(self) -> None:
        self.count += 1


def _queue(
    capacity: int = 4, notifier: CountingNotifier | None = None
) -> tuple[CompletionSender, CompletionReceiver]:
    if notifier is None:
        return completion_queue(capacity)
    return completion_queue(capacity, notifier)


def _event() -> IncomingStream:
    return IncomingStream(STREAM)


def test_notifier_coalesces_until_the_queue_becomes_empty() -> None:
    notifier = CountingNotifier()
    credits = CompletionCredits(4)
    tx, rx = _queue(4, notifier)
    for _ in range(2):
        permit = credits.try_acquire()
        assert permit is not None
        tx.complete_nowait(_event(), permit)
    assert notifier.count == 1
    rx.pop_nowait()
    rx.pop_nowait()
    permit = credits.try_acquire()
    assert permit is not None
    tx.complete_nowait(_event(), permit)
    assert notifier.count == 2


def test_full_completion_queue_returns_event_ownership() -> None:
    credits = CompletionCredits(4)
    tx, rx = _queue(1)
    first = credits.try_acquire()
    second = credits.try_acquire()
    assert first is not None
    assert second is not None
    tx.complete_nowait(_event(), first)
    event = StreamClosed(STREAM, 3)
    with pytest.raises(CompletionQueueFull) as info:
        tx.complete_nowait(event, second)
    assert info.value.completion is event
    assert info.value.permit is second
    assert not second.released
    # The returned permit can be used for the retry once there is room.
    rx.pop_nowait()
    tx.complete_nowait(event, second)
    assert rx.pop_nowait() is event


def test_closed_completion_queue_returns_ownership() -> None:
    credits = CompletionCredits(1)
    tx, rx = _queue(2)
    rx.close()
    permit = credits.try_acquire()
    assert permit is not None
    completion = DriverStopped(DRIVER)
    with pytest.raises(CompletionQueueClosed) as info:
        tx.complete_nowait(completion, permit)
    assert info.value.completion is completion
    assert info.value.permit is permit
    permit.release()
    assert credits.in_use == 0


def test_leased_completion_retains_credit_until_consumed() -> None:
    credits = CompletionCredits(1)
    tx, rx = _queue(2)
    permit = credits.try_acquire()
    assert permit is not None
    tx.complete_nowait(_event(), permit)
    lease = rx.pop_leased_nowait()
    assert credits.in_use == 1
    assert credits.try_acquire() is None
    assert lease.release() == _event()
    assert credits.in_use == 0
    lease.release()  # harmless
    assert credits.in_use == 0


def test_pop_releases_the_credit_immediately() -> None:
    credits = CompletionCredits(1)
    tx, rx = _queue(2)
    permit = credits.try_acquire()
    assert permit is not None
    tx.complete_nowait(_event(), permit)
    assert credits.in_use == 1
    assert rx.pop_nowait() == _event()
    assert credits.in_use == 0


def test_lease_as_context_manager_releases_at_block_end() -> None:
    credits = CompletionCredits(1)
    tx, rx = _queue(2)
    permit = credits.try_acquire()
    assert permit is not None
    tx.complete_nowait(_event(), permit)
    with rx.pop_leased_nowait() as completion:
        assert completion == _event()
        assert credits.in_use == 1
    assert credits.in_use == 0


def test_receive_completion_returns_appended_bytes_and_original_allocation() -> None:
    channels = EndpointChannels[str](DRIVER, SubmissionLimits(4, 64, 64), completion_credits=2)
    buffer = bytearray(b"prefix")
    channels.streams.receive_nowait(STREAM, buffer, 32)
    item = channels.submissions.try_pop()
    assert isinstance(item, ReceiveSubmission)
    item.posted.append(b"data")
    channels.completion_sender.complete_nowait(item.complete(ReceiveStatus.FIN), item.permit)
    completion = channels.completions.pop_nowait()
    assert isinstance(completion, ReceiveCompletion)
    assert completion.buffer is buffer
    assert bytes(buffer) == b"prefixdata"
    assert bytes(completion.data()) == b"data"
    assert (completion.start, completion.end) == (6, 10)
    assert completion.status is ReceiveStatus.FIN
    assert channels.submissions.posted_budget.used == 0
    assert channels.credits.in_use == 0


def test_last_sender_close_changes_sequence_and_wakes_consumer() -> None:
    tx, rx = completion_queue(2)
    seen = rx.arrived.epoch()
    before = rx.sequence()
    tx.close()
    assert rx.sequence() == before + 1
    assert rx.arrived.wait(seen, timeout=0)
    assert rx.is_closed()
    with pytest.raises(QueueExhausted):
        rx.pop_leased_nowait()


def test_dropping_completion_queue_releases_posted_receive_budget() -> None:
    channels = EndpointChannels[str](DRIVER, SubmissionLimits(4, 64, 64), completion_credits=4)
    channels.streams.receive_nowait(STREAM, bytearray(), 16)
    item = channels.submissions.try_pop()
    assert isinstance(item, ReceiveSubmission)
    channels.completion_sender.complete_nowait(item.complete(ReceiveStatus.CLOSED), item.permit)
    event_permit = channels.event_credits.try_acquire()
    assert event_permit is not None
    channels.completion_sender.complete_nowait(DriverStopped(DRIVER), event_permit)
    assert channels.submissions.posted_budget.used == 16
    released = channels.completions.discard()
    assert [type(c) for c in released] == [ReceiveCompletion, DriverStopped]
    assert channels.submissions.posted_budget.used == 0
    assert channels.credits.in_use == 0
    assert channels.event_credits.in_use == 0
    assert len(channels.completions) == 0


def _eventually(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5.0
    while not predicate():
        assert time.monotonic() < deadline, "not released in time"
        time.sleep(0.001)


def test_dropping_the_completion_receiver_releases_leases_and_closes_the_queue() -> None:
    credits = CompletionCredits(4)
    tx, rx = _queue(4)
    for _ in range(2):
        permit = credits.try_acquire()
        assert permit is not None
        tx.complete_nowait(_event(), permit)
    assert credits.in_use == 2
    del rx  # never discarded explicitly
    _eventually(lambda: credits.in_use == 0)
    permit = credits.try_acquire()
    assert permit is not None
    with pytest.raises(CompletionQueueClosed):
        tx.complete_nowait(_event(), permit)


def test_a_completion_receiver_collected_in_a_cycle_releases_posted_budgets() -> None:
    channels = EndpointChannels[str](DRIVER, SubmissionLimits(4, 64, 64), completion_credits=4)
    channels.streams.receive_nowait(STREAM, bytearray(), 16)
    item = channels.submissions.try_pop()
    assert isinstance(item, ReceiveSubmission)
    channels.completion_sender.complete_nowait(item.complete(ReceiveStatus.CLOSED), item.permit)
    posted = channels.submissions.posted_budget
    credits = channels.credits
    cycle: list[object] = [channels.completions]
    cycle.append(cycle)
    del item, cycle, channels  # the completion receiver now lives only in a garbage cycle
    gc.collect()
    _eventually(lambda: posted.used == 0 and credits.in_use == 0)


# The receiver is created by the last atexit handler to run, so ``weakref.finalize``'s own exit
# hook (registered with the first finalizer, during atexit) never disarms it; the garbage cycle
# is collected once the interpreter is finalizing, when no new thread can ever run.
_DROPPED_AT_FINALIZATION = """
import atexit

def late():
    from chrysalis.core.completion import completion_queue
    cycle = [completion_queue(4)]
    cycle.append(cycle)

atexit.register(late)
"""


def test_a_receiver_dropped_during_interpreter_finalization_does_not_hang_the_exit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _DROPPED_AT_FINALIZATION],
        capture_output=True,
        text=True,
        timeout=30,  # it hung forever: a finalizer waited for a thread that never started
    )
    assert done.returncode == 0, done.stderr


def test_empty_queue_raises_queue_empty_until_closed() -> None:
    tx, rx = completion_queue(2)
    with pytest.raises(QueueEmpty):
        rx.pop_nowait()
    rx.close()
    with pytest.raises(QueueExhausted):
        rx.pop_nowait()
    assert tx.is_closed()


def test_a_permit_backs_at_most_one_completion() -> None:
    credits = CompletionCredits(2)
    tx, rx = _queue(4)
    permit = credits.try_acquire()
    assert permit is not None
    tx.complete_nowait(_event(), permit)
    with pytest.raises(ValueError):
        tx.complete_nowait(_event(), permit)
    rx.pop_nowait()
    with pytest.raises(ValueError):
        tx.complete_nowait(_event(), permit)  # released


def test_async_pop_waits_for_a_driver_thread_under_asyncio() -> None:
    credits = CompletionCredits(8)
    tx, rx = completion_queue(8)

    def driver() -> None:
        for sequence in range(1, 6):
            permit = credits.try_acquire()
            assert permit is not None
            completion = CommandCompletion(RequestId(DRIVER, sequence), AbortStarted())
            tx.complete_nowait(completion, permit)
        tx.close()

    async def main() -> list[int]:
        thread = threading.Thread(target=driver)
        thread.start()
        seen: list[int] = []
        while True:
            try:
                completion = await asyncio.wait_for(rx.pop(), 5)
            except QueueExhausted:
                break
            assert isinstance(completion, CommandCompletion)
            seen.append(completion.request.sequence)
        thread.join(timeout=5)
        return seen

    assert asyncio.run(main()) == [1, 2, 3, 4, 5]
    assert credits.in_use == 0


def test_async_pop_leased_waits_under_trio() -> None:
    trio = pytest.importorskip("trio")
    credits = CompletionCredits(2)
    tx, rx = completion_queue(2)

    def driver() -> None:
        permit = credits.try_acquire()
        assert permit is not None
        tx.complete_nowait(DriverStopped(DRIVER), permit)

    async def main() -> None:
        timer = threading.Timer(0.01, driver)
        timer.start()
        with trio.fail_after(5):
            lease = await rx.pop_leased()
        timer.join()
        assert credits.in_use == 1
        assert lease.release() == DriverStopped(DRIVER)

    trio.run(main)
    assert credits.in_use == 0


def test_incoming_stream_retains_event_credit_until_acceptance() -> None:
    channels = EndpointChannels[str](DRIVER, event_credits=1, completion_credits=1)
    permit = channels.event_credits.try_acquire()
    assert permit is not None
    channels.completion_sender.complete_nowait(IncomingStream(STREAM), permit)
    lease = channels.completions.pop_leased_nowait()
    assert channels.event_credits.try_acquire() is None
    assert channels.credits.in_use == 0  # events never consume operation credits
    lease.release()
    assert channels.event_credits.in_use == 0


def test_event_credit_release_wakes_the_driver() -> None:
    driver = CountingNotifier()
    channels = EndpointChannels[str](DRIVER, event_credits=1, driver_notifier=driver)
    assert channels.driver_notifier is driver
    permit = channels.event_credits.try_acquire()
    assert permit is not None
    channels.completion_sender.complete_nowait(IncomingStream(STREAM), permit)
    before = driver.count
    channels.completions.pop_nowait()
    assert driver.count > before


# --- record validation --------------------------------------------------------------------


def test_send_completion_requires_offset_exactly_when_acknowledged() -> None:
    SendCompletion(OP, STREAM, 5, SendOutcome.ACKNOWLEDGED, 5)
    SendCompletion(OP, STREAM, 5, SendOutcome.ABANDONED)
    with pytest.raises(ValueError):
        SendCompletion(OP, STREAM, 5, SendOutcome.ACKNOWLEDGED)
    with pytest.raises(ValueError):
        SendCompletion(OP, STREAM, 5, SendOutcome.REJECTED, 5)
    with pytest.raises(ValueError):
        SendCompletion(OP, STREAM, -1, SendOutcome.REJECTED)


@pytest.mark.parametrize(
    ("status", "code", "valid"),
    [
        (ReceiveStatus.RESET, 4, True),
        (ReceiveStatus.STOPPED, 0, True),
        (ReceiveStatus.RESET, None, False),
        (ReceiveStatus.FIN, 1, False),
        (ReceiveStatus.DATA, None, True),
        (ReceiveStatus.STOPPED, 1 << 62, False),
    ],
)
def test_receive_status_codes_match_their_status(
    status: ReceiveStatus, code: int | None, valid: bool
) -> None:
    if valid:
        assert DiscardCompletion(OP, STREAM, 0, status, code).error_code == code
    else:
        with pytest.raises(ValueError):
            DiscardCompletion(OP, STREAM, 0, status, code)


def test_connection_events_carry_pids_and_codes() -> None:
    local = Pid(bytes(16))
    peer = Pid(bytes(range(16)))
    established = ConnectionEstablished(CONNECTION, local, peer)
    assert established.peer_pid == peer
    failed = AuthenticationFailed(CONNECTION, expected=Pid(b"\xa5" * 16), actual=None)
    assert failed.actual is None
    assert ConnectionClosed(CONNECTION, application_code=42).application_code == 42
    with pytest.raises(ValueError):
        ConnectionClosed(CONNECTION, application_code=1, transport_code=2)
    with pytest.raises(ValueError):
        StreamClosed(STREAM, -1)
    with pytest.raises(ValueError):
        CommandFailed(CommandError.TRANSPORT, "x" * 2000)


def test_completions_are_frozen() -> None:
    completion = DriverStopped(DRIVER)
    with pytest.raises(AttributeError):
        completion.driver = DriverId(1)  # type: ignore[misc]
    assert not hasattr(completion, "__dict__")
