"""The completion side's one-call paths give exactly what the general paths give.

Why: on the path from a datagram to the woken reader a driver appends the bytes into the
posted receive, completes it and queues the completion (``CompletionSender.deliver_nowait``
does the three in one call), and the dispatcher pops and releases each lease
(``CompletionReceiver.drain_released``); with ``threadsafe=False`` the lease and the push
are inline (``complete_nowait``). These tests pin them to ``posted.append`` +
``submission.complete`` + the locked ``complete_nowait``, and to ``pop_nowait``: the same
completions, the same buffers, the same refusals, the same credit and byte accounting.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core.completion import (
    CompletionQueueClosed,
    CompletionQueueFull,
    ConnectionRef,
    DriverId,
    EndpointChannels,
    QueueEmpty,
    ReceiveCompletion,
    ReceiveOptions,
    ReceiveStatus,
    ReceiveSubmission,
    SendOutcome,
    SendSubmission,
    StreamRef,
    SubmissionLimits,
)

DRIVER = DriverId(5)
STREAM = StreamRef(ConnectionRef(DRIVER, 3), 0)


def _channels(threadsafe: bool, *, queue: int = 8, credits: int = 8) -> EndpointChannels[str]:
    return EndpointChannels[str](
        DRIVER,
        SubmissionLimits(queue_capacity=8, retained_send_bytes=256, posted_receive_bytes=256),
        completion_credits=credits,
        event_credits=2,
        completion_queue_capacity=queue,
        threadsafe=threadsafe,
    )


def _posted(
    ch: EndpointChannels[str], prefix: bytes, capacity: int, min_bytes: int = 1
) -> ReceiveSubmission:
    ch.streams.receive_nowait(STREAM, bytearray(prefix), capacity, ReceiveOptions(min_bytes))
    (submission,) = ch.submissions.drain(1)
    assert isinstance(submission, ReceiveSubmission)
    return submission


@settings(max_examples=60, deadline=None)
@given(
    threadsafe=st.booleans(),
    prefix=st.binary(max_size=6),
    spare=st.integers(1, 24),
    min_bytes=st.integers(1, 24),
    data=st.binary(min_size=1, max_size=24),
    cancelled=st.booleans(),
)
def test_deliver_matches_append_complete_and_queue(
    threadsafe: bool, prefix: bytes, spare: int, min_bytes: int, data: bytes, cancelled: bool
) -> None:
    fast, slow = _channels(threadsafe), _channels(threadsafe)
    capacity = len(prefix) + spare
    min_bytes = min(min_bytes, spare)  # a receive may not ask for more than fits
    mine, theirs = (
        _posted(fast, prefix, capacity, min_bytes),
        _posted(slow, prefix, capacity, min_bytes),
    )
    if cancelled:
        mine.cancellation.cancel()
        theirs.cancellation.cancel()
    applies = (
        not cancelled and len(data) <= spare and len(data) >= min_bytes
    )  # the general path's own decision
    delivered = fast.completion_sender.deliver_nowait(mine, data)
    assert delivered is applies
    if not applies:  # declined: nothing changed, nothing queued
        assert bytes(mine.posted.buffer) == prefix
        assert len(fast.completions) == 0
        assert not mine.permit.released
        return
    theirs.posted.append(data)
    slow.completion_sender.complete_nowait(theirs.complete(ReceiveStatus.DATA), theirs.permit)
    got, want = fast.completions.pop_nowait(), slow.completions.pop_nowait()
    assert isinstance(got, ReceiveCompletion)
    assert isinstance(want, ReceiveCompletion)
    assert got == ReceiveCompletion(mine.operation, STREAM, mine.posted, ReceiveStatus.DATA)
    assert (got.status, got.error_code, got.start, got.end) == (
        want.status,
        want.error_code,
        want.start,
        want.end,
    )
    assert got.buffer is mine.posted.buffer  # the caller's own bytearray comes back
    assert bytes(got.buffer) == bytes(want.buffer) == prefix + data
    assert bytes(got.data()) == bytes(want.data()) == data
    # The receive is finished: a late cancel only records the request (no hint queued).
    assert mine.cancellation.cancel()
    assert fast.submissions.drain_cancellations(4) == []
    # Popping released the credit and the posted bytes, on both paths alike.
    for ch in (fast, slow):
        assert ch.credits.in_use == 0
        assert ch.submissions.posted_budget.used == 0


@pytest.mark.parametrize("threadsafe", [True, False])
def test_deliver_into_a_full_or_closed_queue_hands_both_back(threadsafe: bool) -> None:
    ch = _channels(threadsafe, queue=1)
    first, second = _posted(ch, b"", 8), _posted(ch, b"", 8)
    assert ch.completion_sender.deliver_nowait(first, b"one")
    with pytest.raises(CompletionQueueFull) as full:
        ch.completion_sender.deliver_nowait(second, b"two")
    # Appended and finished (the driver stages it), the permit not leased: it queues later.
    completion, permit = full.value.completion, full.value.permit
    assert isinstance(completion, ReceiveCompletion)
    assert permit is second.permit
    assert bytes(completion.data()) == b"two"
    assert completion.status is ReceiveStatus.DATA
    assert not permit.released
    assert bytes(ch.completions.pop_nowait().buffer) == b"one"  # type: ignore[union-attr]
    ch.completion_sender.complete_nowait(completion, permit)  # the staged retry
    assert bytes(ch.completions.pop_nowait().buffer) == b"two"  # type: ignore[union-attr]
    third = _posted(ch, b"", 8)
    ch.completions.close()
    with pytest.raises(CompletionQueueClosed) as closed:
        ch.completion_sender.deliver_nowait(third, b"three")
    assert closed.value.permit is third.permit
    assert not third.permit.released
    third.posted.release()
    third.permit.release()
    assert ch.credits.in_use == 0
    assert ch.submissions.posted_budget.used == 0


@pytest.mark.parametrize("threadsafe", [True, False])
def test_complete_refuses_a_released_or_leased_permit_on_both_paths(threadsafe: bool) -> None:
    ch = _channels(threadsafe)
    submission = _posted(ch, b"", 4)
    completion = submission.complete(ReceiveStatus.CLOSED)
    ch.completion_sender.complete_nowait(completion, submission.permit)
    with pytest.raises(ValueError):  # already backs a queued completion
        ch.completion_sender.complete_nowait(completion, submission.permit)
    ch.completions.pop_nowait()
    with pytest.raises(ValueError):  # released by the pop
        ch.completion_sender.complete_nowait(completion, submission.permit)
    assert len(ch.completions) == 0


@pytest.mark.parametrize("threadsafe", [True, False])
def test_drain_released_is_pop_nowait_for_each(threadsafe: bool) -> None:
    """FIFO order, every credit and posted reservation back before the completions are
    handed out, at most ``max_items`` per call."""
    ch = _channels(threadsafe)
    receives = [_posted(ch, b"p", 9) for _ in range(3)]
    ch.streams.send_nowait(STREAM, b"sent")
    (send,) = ch.submissions.drain(1)
    assert isinstance(send, SendSubmission)
    send.payload.release()
    expected = []
    for index, receive in enumerate(receives):
        assert ch.completion_sender.deliver_nowait(receive, bytes([65 + index]) * 2)
        expected.append(receive.operation)
    ch.completion_sender.complete_nowait(send.complete(SendOutcome.ABANDONED), send.permit)
    expected.append(send.operation)
    assert ch.credits.in_use == 4
    assert ch.submissions.posted_budget.used == 27
    first = ch.completions.drain_released(3)
    assert [c.operation for c in first] == expected[:3]  # type: ignore[union-attr]
    assert ch.credits.in_use == 1
    assert ch.submissions.posted_budget.used == 0
    assert [bytes(c.buffer) for c in first] == [b"pAA", b"pBB", b"pCC"]  # type: ignore[union-attr]
    rest = ch.completions.drain_released(3)
    assert [c.operation for c in rest] == expected[3:]  # type: ignore[union-attr]
    assert ch.credits.in_use == 0
    assert ch.completions.drain_released(3) == []
    with pytest.raises(QueueEmpty):
        ch.completions.pop_nowait()
