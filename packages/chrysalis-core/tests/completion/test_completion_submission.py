"""Commands and stream submissions (spec 4.4, 4.5): admission order, block reasons, ownership
on every refusal, cancellation, the shared endpoint FIFO, and waiting instead of spinning."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from chrysalis.core.completion import (
    BlockReason,
    CommandSubmission,
    CompletionCredits,
    ConnectionRef,
    ControlOutcome,
    DiscardSubmission,
    DriverId,
    EndpointSubmissionQueue,
    ExceedsBudget,
    FinishSubmission,
    InvalidReceiveBuffer,
    OperationId,
    ReceiveOptions,
    ReceiveStatus,
    ReceiveSubmission,
    RequestId,
    ResetSubmission,
    SendOutcome,
    SendSubmission,
    StopSubmission,
    StreamRef,
    SubmissionClosed,
    SubmissionLimits,
    WouldBlock,
)

DRIVER = DriverId(3)
STREAM = StreamRef(ConnectionRef(DRIVER, 1), 0)


class CountingNotifier:
    def __init__(self) -> None:
        self.count = 0

    def notify(self) -> None:
        self.count += 1


def make(
    queue: int = 4, retained: int = 64, posted: int = 64, credits: int = 8
) -> tuple[EndpointSubmissionQueue[str], CompletionCredits, CountingNotifier]:
    notifier = CountingNotifier()
    pool = CompletionCredits(credits)
    endpoint = EndpointSubmissionQueue[str](
        DRIVER, SubmissionLimits(queue, retained, posted), pool, notifier
    )
    return endpoint, pool, notifier


# --- the reference's tests ---------------------------------------------------------------


def test_typed_commands_are_correlated_and_drained_after_close() -> None:
    endpoint, _, _ = make()
    receipt = endpoint.commands.submit_nowait("connect")
    endpoint.receiver.close()
    with pytest.raises(SubmissionClosed) as info:
        endpoint.commands.submit_nowait("late")
    assert info.value.returned == "late"
    item = endpoint.receiver.try_pop()
    assert isinstance(item, CommandSubmission)
    assert item.command == "connect"
    assert item.request == receipt.request
    assert item.request.driver == DRIVER


def test_retained_send_budget_lasts_until_every_view_is_dropped() -> None:
    endpoint, _, _ = make(retained=4)
    endpoint.streams.send_nowait(STREAM, b"abcd")
    budget = endpoint.receiver.retained_budget
    assert budget.used == 4
    item = endpoint.receiver.try_pop()
    assert isinstance(item, SendSubmission)
    head = item.payload.split_to(2)
    head.release()
    assert budget.used == 4
    item.payload.release()
    assert budget.used == 0


def test_full_queue_returns_the_original_send_allocation() -> None:
    endpoint, pool, _ = make(queue=1)
    endpoint.streams.send_nowait(STREAM, b"first")
    payload = bytearray(b"second")
    with pytest.raises(WouldBlock) as info:
        endpoint.streams.send_nowait(STREAM, payload)
    assert info.value.reason is BlockReason.QUEUE_FULL
    assert info.value.returned is payload
    assert payload == bytearray(b"second")
    assert endpoint.receiver.retained_budget.used == 5  # only the accepted send
    assert pool.in_use == 1


def test_refused_send_leaves_the_bytearray_resizable_while_the_error_is_alive() -> None:
    endpoint, _, _ = make(queue=1)
    endpoint.streams.send_nowait(STREAM, b"first")
    payload = bytearray(b"second")
    with pytest.raises(WouldBlock) as info:
        endpoint.streams.send_nowait(STREAM, payload)
    returned = info.value.returned
    assert isinstance(returned, bytearray)
    returned.extend(b"!")  # the refused submission's view of it was released
    assert payload == bytearray(b"second!")


def test_driver_release_of_a_send_leaves_the_bytearray_resizable() -> None:
    endpoint, _, _ = make()
    payload = bytearray(b"abc")
    endpoint.streams.send_nowait(STREAM, payload)
    item = endpoint.receiver.try_pop()
    assert isinstance(item, SendSubmission)
    with pytest.raises(BufferError):
        payload.extend(b"x")  # owned by the driver
    item.payload.release()
    item.permit.release()
    payload.extend(b"x")  # while the submission object is still alive
    assert payload == bytearray(b"abcx")
    assert item.payload.released


def test_posted_receive_returns_the_same_buffer_and_releases_budget() -> None:
    endpoint, pool, _ = make(posted=16)
    buffer = bytearray(b"pre")
    receipt = endpoint.streams.receive_nowait(STREAM, buffer, 10)
    budget = endpoint.receiver.posted_budget
    assert budget.used == 10
    item = endpoint.receiver.try_pop()
    assert isinstance(item, ReceiveSubmission)
    assert item.operation == receipt.operation
    assert item.posted.buffer is buffer
    item.posted.append(b"data")
    completion = item.complete(ReceiveStatus.DATA)
    assert completion.buffer is buffer
    assert bytes(completion.data()) == b"data"
    assert budget.used == 10  # held until the application consumes the buffer
    item.posted.release()
    item.permit.release()
    assert budget.used == 0
    assert pool.in_use == 0


def test_receive_rejects_insufficient_spare_capacity() -> None:
    endpoint, pool, _ = make()
    buffer = bytearray(b"content")
    options = ReceiveOptions(min_bytes=4)
    with pytest.raises(InvalidReceiveBuffer) as info:
        endpoint.streams.receive_nowait(STREAM, buffer, 10, options)
    assert info.value.returned is buffer
    assert buffer == bytearray(b"content")
    assert info.value.options is options
    assert info.value.capacity == 10
    assert pool.in_use == 0
    assert endpoint.receiver.posted_budget.used == 0


def test_receive_budget_rejection_returns_the_original_allocation() -> None:
    endpoint, pool, _ = make(posted=8)
    endpoint.streams.receive_nowait(STREAM, bytearray(), 6)
    buffer = bytearray(b"x")
    with pytest.raises(WouldBlock) as info:
        endpoint.streams.receive_nowait(STREAM, buffer, 4)
    assert info.value.reason is BlockReason.POSTED_BYTES
    assert info.value.returned is buffer
    assert pool.in_use == 1  # the refused receive's credit came back
    assert endpoint.receiver.posted_budget.used == 6


def test_dropping_driver_queue_closes_senders_and_releases_commands() -> None:
    endpoint, pool, _ = make()
    endpoint.commands.submit_nowait("connect")
    endpoint.streams.send_nowait(STREAM, b"abc")
    endpoint.streams.receive_nowait(STREAM, bytearray(), 5)
    assert pool.in_use == 3
    discarded = endpoint.receiver.discard()
    assert len(discarded) == 3
    assert pool.in_use == 0
    assert endpoint.receiver.retained_budget.used == 0
    assert endpoint.receiver.posted_budget.used == 0
    assert endpoint.commands.is_closed()
    assert endpoint.streams.is_closed()
    with pytest.raises(SubmissionClosed):
        endpoint.commands.submit_nowait("late")
    with pytest.raises(SubmissionClosed):
        endpoint.streams.send_nowait(STREAM, b"late")


def test_dropping_the_driver_receiver_releases_queued_work_and_closes_admission() -> None:
    endpoint, pool, _ = make(posted=16)
    streams = endpoint.streams
    retained = endpoint.receiver.retained_budget
    posted = endpoint.receiver.posted_budget
    streams.send_nowait(STREAM, b"abc")
    streams.receive_nowait(STREAM, bytearray(), 8)
    assert (pool.in_use, retained.used, posted.used) == (2, 3, 8)
    del endpoint  # the driver went away without discarding
    deadline = time.monotonic() + 5.0
    while (pool.in_use, retained.used, posted.used) != (0, 0, 0):
        assert time.monotonic() < deadline, "dropping the receiver released nothing"
        time.sleep(0.001)
    with pytest.raises(SubmissionClosed):
        streams.send_nowait(STREAM, b"late")
    assert pool.in_use == 0


def test_closing_driver_queue_rejects_new_work_but_preserves_accepted_commands() -> None:
    endpoint, pool, _ = make()
    first = endpoint.commands.submit_nowait("a")
    second = endpoint.commands.submit_nowait("b")
    endpoint.receiver.close()
    with pytest.raises(SubmissionClosed):
        endpoint.streams.finish_nowait(STREAM)
    popped = endpoint.receiver.drain(10)
    assert [p.request for p in popped if isinstance(p, CommandSubmission)] == [
        first.request,
        second.request,
    ]
    assert pool.in_use == 2  # accepted work keeps its credits until completed
    assert endpoint.receiver.is_closed()


def test_receive_cancellation_is_idempotent_and_wakes_the_driver_queue() -> None:
    endpoint, _, notifier = make()
    receipt = endpoint.streams.receive_nowait(STREAM, bytearray(), 4)
    cancellation = receipt.cancellation
    assert cancellation is not None
    before = notifier.count
    assert cancellation.cancel() is True
    assert notifier.count == before + 1
    assert cancellation.cancel() is False
    assert notifier.count == before + 1
    hints = endpoint.receiver.drain_cancellations(10)
    assert [(h.operation, h.stream) for h in hints] == [(receipt.operation, STREAM)]
    assert endpoint.receiver.drain_cancellations(10) == []
    item = endpoint.receiver.try_pop()
    assert isinstance(item, ReceiveSubmission)
    assert item.cancellation.cancelled
    completion = item.complete(ReceiveStatus.CANCELLED)
    assert completion.status is ReceiveStatus.CANCELLED


def test_commands_and_stream_work_share_fifo_and_terminal_close() -> None:
    endpoint, _, _ = make()
    send = endpoint.streams.send_nowait(STREAM, b"payload")
    shutdown = endpoint.commands.submit_and_close_nowait("shutdown")
    with pytest.raises(SubmissionClosed) as command_info:
        endpoint.commands.submit_nowait("connect")
    assert command_info.value.returned == "connect"
    payload = b"late"
    with pytest.raises(SubmissionClosed) as send_info:
        endpoint.streams.send_nowait(STREAM, payload)
    assert send_info.value.returned is payload
    first = endpoint.receiver.try_pop()
    second = endpoint.receiver.try_pop()
    assert isinstance(first, SendSubmission)
    assert first.operation == send.operation
    assert isinstance(second, CommandSubmission)
    assert second.request == shutdown.request
    assert endpoint.receiver.try_pop() is None
    assert endpoint.receiver.is_closed()


# --- admission order and block reasons ----------------------------------------------------


def test_send_checks_credit_before_retained_bytes() -> None:
    endpoint, pool, _ = make(retained=4, credits=1)
    endpoint.streams.send_nowait(STREAM, b"abcd")
    with pytest.raises(WouldBlock) as info:
        endpoint.streams.send_nowait(STREAM, b"x")
    assert info.value.reason is BlockReason.COMPLETION_FULL  # both bounds full: credit first
    assert info.value.released is pool.released


def test_send_over_retained_budget_returns_the_credit() -> None:
    endpoint, pool, _ = make(retained=4)
    endpoint.streams.send_nowait(STREAM, b"abc")
    payload = b"de"
    with pytest.raises(WouldBlock) as info:
        endpoint.streams.send_nowait(STREAM, payload)
    assert info.value.reason is BlockReason.RETAINED_BYTES
    assert info.value.returned is payload
    assert info.value.released is endpoint.receiver.retained_budget.released
    assert pool.in_use == 1


def test_payload_larger_than_the_whole_budget_is_refused_outright() -> None:
    endpoint, pool, _ = make(retained=4, posted=8)
    payload = b"too large"
    with pytest.raises(ExceedsBudget) as info:
        endpoint.streams.send_nowait(STREAM, payload)
    assert info.value.returned is payload
    assert info.value.reason is BlockReason.RETAINED_BYTES
    buffer = bytearray()
    with pytest.raises(ExceedsBudget) as receive_info:
        endpoint.streams.receive_nowait(STREAM, buffer, 9)
    assert receive_info.value.returned is buffer
    assert receive_info.value.reason is BlockReason.POSTED_BYTES
    assert pool.in_use == 0


def test_control_operations_block_on_credit_then_queue() -> None:
    endpoint, pool, _ = make(queue=1, credits=2)
    endpoint.streams.finish_nowait(STREAM)
    with pytest.raises(WouldBlock) as queue_info:
        endpoint.streams.reset_nowait(STREAM, 7)
    assert queue_info.value.reason is BlockReason.QUEUE_FULL
    assert queue_info.value.returned is None
    assert pool.in_use == 1
    endpoint.receiver.try_pop()  # credit still held by the popped finish
    endpoint.streams.stop_nowait(STREAM, 9)
    with pytest.raises(WouldBlock) as credit_info:
        endpoint.streams.discard_nowait(STREAM, 10)
    assert credit_info.value.reason is BlockReason.COMPLETION_FULL


def test_commands_block_with_their_command_returned() -> None:
    endpoint, _, _ = make(queue=1, credits=1)
    endpoint.commands.submit_nowait("a")
    with pytest.raises(WouldBlock) as credit_info:
        endpoint.commands.submit_nowait("b")
    assert credit_info.value.reason is BlockReason.COMPLETION_FULL
    assert credit_info.value.returned == "b"
    endpoint2, _, _ = make(queue=1, credits=4)
    endpoint2.commands.submit_nowait("a")
    with pytest.raises(WouldBlock) as queue_info:
        endpoint2.commands.submit_and_close_nowait("shutdown")
    assert queue_info.value.reason is BlockReason.QUEUE_FULL
    assert not endpoint2.commands.is_closed()  # a refused terminal command closes nothing


def test_control_submissions_carry_their_arguments() -> None:
    endpoint, _, _ = make(queue=8)
    endpoint.streams.finish_nowait(STREAM)
    endpoint.streams.discard_nowait(STREAM, 100)
    endpoint.streams.reset_nowait(STREAM, 11)
    endpoint.streams.stop_nowait(STREAM, 12)
    items = endpoint.receiver.drain(10)
    assert isinstance(items[0], FinishSubmission)
    assert isinstance(items[1], DiscardSubmission)
    assert items[1].max_bytes == 100
    assert isinstance(items[2], ResetSubmission)
    assert items[2].error_code == 11
    assert isinstance(items[3], StopSubmission)
    assert items[3].error_code == 12
    completion = items[2].complete(ControlOutcome.COMPLETE)
    assert completion.operation == items[2].operation


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.reset_nowait(STREAM, -1),
        lambda s: s.stop_nowait(STREAM, 1 << 62),
        lambda s: s.discard_nowait(STREAM, 0),
        lambda s: s.send_nowait(StreamRef(ConnectionRef(DriverId(9), 1), 0), b"x"),
        lambda s: s.send_nowait(STREAM, "text"),
        lambda s: s.receive_nowait(STREAM, b"immutable", 8),
    ],
)
def test_malformed_submissions_are_rejected_before_taking_anything(call: object) -> None:
    endpoint, pool, _ = make()
    with pytest.raises((ValueError, TypeError)):
        call(endpoint.streams)  # type: ignore[operator]
    assert pool.in_use == 0
    assert len(endpoint.receiver) == 0


def test_operation_and_request_ids_count_from_one_per_kind() -> None:
    endpoint, _, _ = make(queue=8)
    clone = endpoint.streams.clone()
    a = endpoint.streams.finish_nowait(STREAM)
    b = clone.finish_nowait(STREAM)
    c = endpoint.commands.submit_nowait("x")
    assert a.operation == OperationId(DRIVER, 1)
    assert b.operation == OperationId(DRIVER, 2)
    assert c.request == RequestId(DRIVER, 1)


def test_send_completion_builder_reports_the_payload_length() -> None:
    endpoint, _, _ = make()
    endpoint.streams.send_nowait(STREAM, b"hello")
    item = endpoint.receiver.try_pop()
    assert isinstance(item, SendSubmission)
    completion = item.complete(SendOutcome.ACKNOWLEDGED, 5)
    assert (completion.nbytes, completion.acknowledged_through) == (5, 5)


def test_late_cancel_after_completion_queues_no_hint() -> None:
    endpoint, _, notifier = make()
    receipt = endpoint.streams.receive_nowait(STREAM, bytearray(), 4)
    item = endpoint.receiver.try_pop()
    assert isinstance(item, ReceiveSubmission)
    assert receipt.cancellation is not None
    item.complete(ReceiveStatus.FIN)
    before = notifier.count
    assert receipt.cancellation.cancel() is True
    assert endpoint.receiver.drain_cancellations(10) == []
    assert notifier.count == before


def test_completed_receives_leave_no_stale_hints_that_crowd_out_new_cancellations() -> None:
    endpoint, _, notifier = make(credits=1)
    for _ in range(3):  # with one credit, a stale hint used to fill the side queue
        receipt = endpoint.streams.receive_nowait(STREAM, bytearray(), 4)
        assert receipt.cancellation is not None
        before = notifier.count
        assert receipt.cancellation.cancel()
        assert notifier.count == before + 1
        assert endpoint.receiver.statistics().pending_cancellations == 1
        item = endpoint.receiver.try_pop()
        assert isinstance(item, ReceiveSubmission)
        item.complete(ReceiveStatus.CANCELLED)  # completed before the hints were drained
        assert endpoint.receiver.statistics().pending_cancellations == 0
        item.permit.release()  # the application consumed the completion
    receipt = endpoint.streams.receive_nowait(STREAM, bytearray(), 4)
    assert receipt.cancellation is not None
    assert receipt.cancellation.cancel()
    hints = endpoint.receiver.drain_cancellations(10)
    assert [hint.operation for hint in hints] == [receipt.operation]


def test_cancellation_hints_drain_oldest_first_in_bounded_batches() -> None:
    endpoint, _, _ = make(queue=8)
    receipts = [endpoint.streams.receive_nowait(STREAM, bytearray(), 2) for _ in range(3)]
    for receipt in reversed(receipts):
        assert receipt.cancellation is not None
        receipt.cancellation.cancel()
    expected = [receipt.operation for receipt in reversed(receipts)]
    first = endpoint.receiver.drain_cancellations(2)
    assert [hint.operation for hint in first] == expected[:2]
    rest = endpoint.receiver.drain_cancellations(2)
    assert [hint.operation for hint in rest] == expected[2:]
    assert endpoint.receiver.drain_cancellations(2) == []


def test_statistics_snapshot_every_bound() -> None:
    endpoint, _, _ = make()
    endpoint.streams.send_nowait(STREAM, b"abc")
    receipt = endpoint.streams.receive_nowait(STREAM, bytearray(), 5)
    assert receipt.cancellation is not None
    receipt.cancellation.cancel()
    stats = endpoint.receiver.statistics()
    assert stats.queue.length == 2
    assert stats.credits.in_use == 2
    assert stats.retained.used == 3
    assert stats.posted.used == 5
    assert stats.pending_cancellations == 1


# --- waiting instead of spinning ---------------------------------------------------------


def _release_later(action: object, delay: float = 0.01) -> threading.Timer:
    timer = threading.Timer(delay, action)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_async_send_waits_for_a_queue_slot() -> None:
    endpoint, _, _ = make(queue=1)
    endpoint.streams.finish_nowait(STREAM)

    async def main() -> None:
        timer = _release_later(endpoint.receiver.try_pop)
        receipt = await asyncio.wait_for(endpoint.streams.send(STREAM, b"x"), 5)
        timer.join()
        # Exactly one refused attempt (it consumed id 2), then admission after the slot was
        # freed: the submitter slept instead of retrying in a loop.
        assert receipt.operation.sequence == 3

    asyncio.run(main())


def test_async_send_waits_for_a_completion_credit() -> None:
    endpoint, pool, _ = make(credits=1)
    held = pool.try_acquire()
    assert held is not None

    async def main() -> None:
        timer = _release_later(held.release)
        await asyncio.wait_for(endpoint.streams.send(STREAM, b"x"), 5)
        timer.join()

    asyncio.run(main())
    assert pool.in_use == 1


def test_async_send_waits_for_retained_bytes() -> None:
    endpoint, _, _ = make(retained=4)
    endpoint.streams.send_nowait(STREAM, b"abcd")
    first = endpoint.receiver.try_pop()
    assert isinstance(first, SendSubmission)

    async def main() -> None:
        timer = _release_later(first.payload.release)
        await asyncio.wait_for(endpoint.streams.send(STREAM, b"efgh"), 5)
        timer.join()

    asyncio.run(main())
    assert endpoint.receiver.retained_budget.used == 4


def test_async_receive_waits_for_posted_bytes_under_trio() -> None:
    trio = pytest.importorskip("trio")
    endpoint, _, _ = make(posted=8)
    endpoint.streams.receive_nowait(STREAM, bytearray(), 8)
    first = endpoint.receiver.try_pop()
    assert isinstance(first, ReceiveSubmission)

    async def main() -> None:
        timer = _release_later(first.posted.release)
        with trio.fail_after(5):
            receipt = await endpoint.streams.receive(STREAM, bytearray(), 8)
        timer.join()
        assert receipt.cancellation is not None

    trio.run(main)


def test_async_submit_stops_with_closed_when_admission_closes_while_waiting() -> None:
    endpoint, pool, _ = make(credits=1)
    held = pool.try_acquire()
    assert held is not None

    async def main() -> None:
        timer = _release_later(endpoint.receiver.close)
        with pytest.raises(SubmissionClosed) as info:
            await asyncio.wait_for(endpoint.commands.submit("connect"), 5)
        timer.join()
        assert info.value.returned == "connect"

    asyncio.run(main())
    held.release()


def test_blocked_thread_can_wait_on_the_reported_wakeup() -> None:
    endpoint, pool, _ = make(credits=1)
    held = pool.try_acquire()
    assert held is not None
    with pytest.raises(WouldBlock) as info:
        endpoint.streams.finish_nowait(STREAM)
    timer = _release_later(held.release)
    assert info.value.released.wait(info.value.epoch, timeout=5)
    timer.join()
    endpoint.streams.finish_nowait(STREAM)
