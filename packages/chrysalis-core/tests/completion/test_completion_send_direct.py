"""``StreamSubmitter.send_direct_nowait``: a send admitted for a driver that executes it at
once (the QUIC inline driver's send lane), never queued.

Why these checks: the lane skips the queue, so it must never overtake anything queued (a
submission or a cancellation hint), must take exactly what ``send_nowait`` takes (one credit,
the payload's retained bytes, the next operation id) and, when it does not apply, take nothing
at all, so that the caller's fallback to ``send_nowait`` sees the bounds untouched.
"""

from __future__ import annotations

import pytest

from chrysalis.core.completion import (
    ByteBudget,
    CompletionCredits,
    ConnectionRef,
    DriverId,
    EndpointChannels,
    SendOutcome,
    SendSubmission,
    StreamRef,
    SubmissionLimits,
    Wakeup,
    WouldBlock,
)

DRIVER = DriverId(5)
STREAM = StreamRef(ConnectionRef(DRIVER, 2), 0)


def _channels(
    *, threadsafe: bool = False, credits: int = 4, notifier: Wakeup | None = None
) -> EndpointChannels[str]:
    return EndpointChannels[str](
        DRIVER,
        SubmissionLimits(queue_capacity=4, retained_send_bytes=64, posted_receive_bytes=64),
        completion_credits=credits,
        event_credits=2,
        driver_notifier=notifier,
        threadsafe=threadsafe,
    )


def _taken(ch: EndpointChannels[str]) -> tuple[int, int, int]:
    """What admission holds: credits, retained bytes, and queued submissions."""
    return ch.credits.in_use, ch.submissions.retained_budget.used, len(ch.submissions)


def test_admits_like_send_nowait_without_queueing_or_notifying() -> None:
    notifier = Wakeup(threadsafe=False)
    ch = _channels(notifier=notifier)
    sequence = ch.submissions.sequence()
    before = ch.streams.send_nowait(STREAM, b"first")
    (queued,) = ch.submissions.drain(4)
    epoch = notifier.epoch()
    direct = ch.streams.send_direct_nowait(STREAM, b"second")
    assert isinstance(direct, SendSubmission)
    after = ch.streams.send_nowait(STREAM, b"third")
    # One counter: the direct send sits between its neighbours in submission order.
    assert before.operation.sequence < direct.operation.sequence < after.operation.sequence
    assert direct.operation.driver == DRIVER
    assert direct.stream == STREAM
    assert bytes(direct.payload.data) == b"second"
    # Taken like a queued send (credit and bytes), but nothing was queued or notified for it.
    assert _taken(ch) == (3, len(b"firstsecondthird"), 1)
    assert ch.submissions.sequence() == sequence + 2
    assert notifier.epoch() == epoch + 1  # the third send's push, not the direct one
    # Completing it releases what it took, as for a popped submission.
    completion = direct.complete(SendOutcome.ACKNOWLEDGED, 11)
    assert (completion.operation, completion.nbytes) == (direct.operation, 6)
    assert direct.payload.release()
    assert direct.permit.release()
    (third,) = ch.submissions.drain(4)
    for item in (queued, third):
        assert isinstance(item, SendSubmission)
        assert item.payload.release()
        assert item.permit.release()
    assert _taken(ch) == (0, 0, 0)


def test_bytearray_and_memoryview_payloads_are_retained_read_only() -> None:
    ch = _channels()
    for payload in (bytearray(b"abc"), memoryview(b"xyzw")[1:]):
        direct = ch.streams.send_direct_nowait(STREAM, payload)
        assert direct is not None
        assert direct.payload.data.readonly
        assert bytes(direct.payload.data) == bytes(payload)
        direct.payload.release()
        direct.permit.release()
    assert _taken(ch) == (0, 0, 0)


def test_never_overtakes_a_queued_submission() -> None:
    ch = _channels()
    ch.streams.send_nowait(STREAM, b"queued")
    taken = _taken(ch)
    assert ch.streams.send_direct_nowait(STREAM, b"x") is None
    assert _taken(ch) == taken
    # A command ahead counts the same: one FIFO.
    (item,) = ch.submissions.drain(4)
    ch.commands.submit_nowait("command")
    assert ch.streams.send_direct_nowait(STREAM, b"x") is None
    ch.submissions.drain(4)
    direct = ch.streams.send_direct_nowait(STREAM, b"x")
    assert direct is not None
    assert isinstance(item, SendSubmission)
    assert item.operation.sequence < direct.operation.sequence


def test_never_overtakes_a_pending_cancellation() -> None:
    ch = _channels()
    receipt = ch.streams.receive_nowait(STREAM, bytearray(), 8)
    ch.submissions.drain(4)
    assert receipt.cancellation is not None
    assert receipt.cancellation.cancel()
    assert ch.streams.send_direct_nowait(STREAM, b"x") is None
    (hint,) = ch.submissions.drain_cancellations(4)
    assert hint.operation == receipt.operation
    assert ch.streams.send_direct_nowait(STREAM, b"x") is not None


def test_thread_safe_channels_never_take_the_lane() -> None:
    ch = _channels(threadsafe=True)
    assert ch.streams.send_direct_nowait(STREAM, b"x") is None
    assert _taken(ch) == (0, 0, 0)


def test_closed_admission_or_a_dropped_handle_takes_nothing() -> None:
    ch = _channels()
    handle = ch.streams.clone()
    handle.close()
    assert handle.send_direct_nowait(STREAM, b"x") is None
    assert ch.streams.send_direct_nowait(STREAM, b"x") is not None  # the other handle
    ch.submissions.close()
    taken = _taken(ch)
    assert ch.streams.send_direct_nowait(STREAM, b"y") is None
    assert _taken(ch) == taken


def test_refused_bounds_take_nothing_and_send_nowait_names_them() -> None:
    ch = _channels(credits=2)
    # Larger than the whole retained budget.
    assert ch.streams.send_direct_nowait(STREAM, b"z" * 65) is None
    assert _taken(ch) == (0, 0, 0)
    # The retained budget is full: the credit taken first is given back.
    held = ch.streams.send_direct_nowait(STREAM, b"a" * 60)
    assert held is not None
    assert ch.streams.send_direct_nowait(STREAM, b"b" * 5) is None
    assert _taken(ch) == (1, 60, 0)
    with pytest.raises(WouldBlock):
        ch.streams.send_nowait(STREAM, b"b" * 5)
    # Every credit is held.
    other = ch.streams.send_direct_nowait(STREAM, b"c")
    assert other is not None
    assert ch.streams.send_direct_nowait(STREAM, b"d") is None
    assert _taken(ch) == (2, 61, 0)
    for item in (held, other):
        item.payload.release()
        item.permit.release()
    assert _taken(ch) == (0, 0, 0)


def test_a_foreign_stream_is_refused_as_by_send_nowait() -> None:
    ch = _channels()
    foreign = StreamRef(ConnectionRef(DriverId(99), 1), 0)
    with pytest.raises(ValueError, match="another driver"):
        ch.streams.send_direct_nowait(foreign, b"x")
    with pytest.raises(TypeError):
        ch.streams.send_direct_nowait("stream", b"x")  # type: ignore[arg-type]
    assert _taken(ch) == (0, 0, 0)


@pytest.mark.parametrize("threadsafe", [True, False])
def test_permits_and_reservations_built_without_init_are_complete(threadsafe: bool) -> None:
    """``try_acquire``, ``try_retain`` and ``try_post`` build their objects without the
    constructors' frames (every admitted operation makes them): they must be whole."""
    credits = CompletionCredits(2, threadsafe=threadsafe)
    permit = credits.try_acquire()
    assert permit is not None
    assert permit.pool is credits
    assert not permit.released
    assert repr(permit) == "CreditPermit(held)"
    assert permit._lease()
    assert not permit._lease()
    assert permit.release()
    assert not permit.release()
    assert credits.in_use == 0
    budget = ByteBudget(16, threadsafe=threadsafe)
    retained = budget.try_retain(b"abcd")
    assert retained is not None
    assert (len(retained), bytes(retained), retained.reservation.nbytes) == (4, b"abcd", 4)
    assert retained.reservation.budget is budget
    assert not retained.released
    assert not retained.reservation.released
    head = retained.split_to(1)
    assert (bytes(head), bytes(retained)) == (b"a", b"bcd")
    assert head.release()
    assert budget.used == 4  # shared: the bytes stay until the last view goes
    assert retained.release()
    assert not retained.release()
    assert budget.used == 0
    posted = budget.try_post(bytearray(b"x"), 8)
    assert posted is not None
    assert (posted.capacity, posted.start, posted.spare, posted.appended) == (8, 1, 7, 0)
    assert posted.reservation.budget is budget
    assert posted.reservation.nbytes == 8
    assert budget.used == 8
    assert posted.release()
    assert not posted.release()
    assert budget.used == 0
