"""The per-operation fast paths give exactly what the general paths give.

Why: an inline QUIC driver makes a submission, a receipt and a completion per stream
operation, hashes stream handles several times and takes about a dozen locks, so those paths
were specialised (descriptor-built dataclasses, cached hashes, ``threadsafe=False``). These
tests pin them to the validating constructors and the locked paths.
"""

from __future__ import annotations

import asyncio
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chrysalis.core.completion import (
    BlockReason,
    ConnectionRef,
    DriverId,
    EndpointChannels,
    ReceiveCompletion,
    ReceiveStatus,
    ReceiveSubmission,
    SendCompletion,
    SendOutcome,
    SendSubmission,
    StreamRef,
    SubmissionLimits,
    Wakeup,
    WouldBlock,
)

DRIVER = DriverId(3)
STREAM = StreamRef(ConnectionRef(DRIVER, 7), 4)


def _channels(threadsafe: bool) -> EndpointChannels[str]:
    return EndpointChannels[str](
        DRIVER,
        SubmissionLimits(queue_capacity=4, retained_send_bytes=64, posted_receive_bytes=64),
        completion_credits=3,
        event_credits=2,
        threadsafe=threadsafe,
    )


@given(
    st.integers(0, 2**16 - 1),
    st.integers(1, 2**62 - 1),
    st.integers(0, 2**62 - 1),
)
def test_cached_ref_hashes_agree_with_equality(driver: int, sequence: int, stream: int) -> None:
    ref = StreamRef(ConnectionRef(DriverId(driver), sequence), stream)
    twin = StreamRef(ConnectionRef(DriverId(driver), sequence), stream)
    assert ref == twin
    assert hash(ref) == hash(twin)
    assert hash(ref.connection) == hash(twin.connection)
    copy = pickle.loads(pickle.dumps(ref))
    assert copy == ref
    assert hash(copy) == hash(ref)
    assert {ref: 1}[twin] == 1
    assert "_hash" not in repr(ref)
    other = StreamRef(ConnectionRef(DriverId(driver), sequence), stream ^ 1)
    assert other != ref
    assert (ref < other) == (stream < (stream ^ 1))


@pytest.mark.parametrize("threadsafe", [True, False])
def test_send_completions_match_the_validating_constructor(threadsafe: bool) -> None:
    ch = _channels(threadsafe)
    ch.streams.send_nowait(STREAM, b"abcdef")
    (submission,) = ch.submissions.drain(4)
    assert isinstance(submission, SendSubmission)
    assert bytes(submission.payload.data) == b"abcdef"
    for outcome, through in [
        (SendOutcome.ACKNOWLEDGED, 6),
        (SendOutcome.ABANDONED, None),
        (SendOutcome.REJECTED, None),
    ]:
        made = submission.complete(outcome, through)
        assert made == SendCompletion(submission.operation, STREAM, 6, outcome, through)
    with pytest.raises(ValueError):
        submission.complete(SendOutcome.ACKNOWLEDGED)  # the offset is required
    with pytest.raises(ValueError):
        submission.complete(SendOutcome.ABANDONED, 3)  # and only then
    with pytest.raises(ValueError):
        submission.complete(SendOutcome.ACKNOWLEDGED, -1)


@pytest.mark.parametrize("threadsafe", [True, False])
def test_receive_completions_match_the_validating_constructor(threadsafe: bool) -> None:
    ch = _channels(threadsafe)
    buffer = bytearray(b"pre")
    receipt = ch.streams.receive_nowait(STREAM, buffer, 16)
    (submission,) = ch.submissions.drain(4)
    assert isinstance(submission, ReceiveSubmission)
    assert receipt.cancellation is submission.cancellation
    submission.posted.append(b"data")
    made = submission.complete(ReceiveStatus.DATA)
    assert made == ReceiveCompletion(submission.operation, STREAM, submission.posted, made.status)
    assert made.end == len(buffer) == 7
    assert bytes(made.data()) == b"data"
    reset = submission.complete(ReceiveStatus.RESET, 9)
    assert reset.error_code == 9
    with pytest.raises(ValueError):
        submission.complete(ReceiveStatus.RESET)  # a code is required for RESET


@pytest.mark.parametrize("threadsafe", [True, False])
def test_bounds_refuse_and_release_alike(threadsafe: bool) -> None:
    """Credits, budgets and the queue bound the same way with and without locks, and every
    release comes back (the lock-free paths keep the same counters)."""
    ch = _channels(threadsafe)
    ch.streams.send_nowait(STREAM, b"x" * 40)
    with pytest.raises(WouldBlock):  # 40 + 40 > 64 retained bytes
        ch.streams.send_nowait(STREAM, b"y" * 40)
    ch.streams.receive_nowait(STREAM, bytearray(), 32)
    ch.streams.send_nowait(STREAM, b"z")
    with pytest.raises(WouldBlock):  # three credits are held
        ch.streams.send_nowait(STREAM, b"w")
    items = ch.submissions.drain(10)
    assert [type(item) for item in items] == [SendSubmission, ReceiveSubmission, SendSubmission]
    operations = [
        item.operation.sequence
        for item in items
        if isinstance(item, SendSubmission | ReceiveSubmission)
    ]
    assert operations == sorted(set(operations))
    for item in items:
        if isinstance(item, SendSubmission):
            assert item.payload.release()
            assert not item.payload.release()
        else:
            assert isinstance(item, ReceiveSubmission)
            item.cancellation._finish()
            assert item.posted.release()
        assert item.permit.release()
        assert not item.permit.release()
    assert ch.credits.in_use == 0
    assert ch.submissions.retained_budget.used == 0
    assert ch.submissions.posted_budget.used == 0


def test_single_threaded_wakeup_wakes_async_waiters() -> None:
    async def main() -> None:
        wakeup = Wakeup(threadsafe=False)
        seen = wakeup.epoch()
        waiter = asyncio.ensure_future(wakeup.wait_async(seen))
        await asyncio.sleep(0)
        assert not waiter.done()
        wakeup.notify()
        await asyncio.wait_for(waiter, 1)
        assert wakeup.epoch() == seen + 1
        assert wakeup.statistics().async_waiters == 0

    asyncio.run(main())


@pytest.mark.parametrize("threadsafe", [True, False])
@pytest.mark.parametrize("bound", ["credits", "retained", "posted", "queue"])
def test_a_refusal_carries_a_snapshot_that_the_next_release_moves(
    threadsafe: bool, bound: str
) -> None:
    """Every ``WouldBlock`` names its bound's wakeup and an epoch snapshot: waiting on it must
    sleep while nothing was released and return once something is. (Single-threaded
    submitters take the snapshot after the failed attempt instead of before it.)"""

    async def main() -> None:
        ch = EndpointChannels[str](
            DRIVER,
            SubmissionLimits(queue_capacity=2, retained_send_bytes=8, posted_receive_bytes=8),
            completion_credits=2 if bound == "credits" else 8,
            threadsafe=threadsafe,
        )

        def send_one() -> None:
            ch.streams.send_nowait(STREAM, b"c")

        def receive_one() -> None:
            ch.streams.receive_nowait(STREAM, bytearray(), 1)

        attempt = send_one
        if bound == "retained":
            ch.streams.send_nowait(STREAM, b"a" * 8)
        elif bound == "posted":
            ch.streams.receive_nowait(STREAM, bytearray(), 8)
            attempt = receive_one
        else:  # two credits, or two queue slots
            ch.streams.send_nowait(STREAM, b"a")
            ch.streams.send_nowait(STREAM, b"b")
        with pytest.raises(WouldBlock) as refused:
            attempt()
        blocked = refused.value
        expected = {
            "credits": BlockReason.COMPLETION_FULL,
            "retained": BlockReason.RETAINED_BYTES,
            "posted": BlockReason.POSTED_BYTES,
            "queue": BlockReason.QUEUE_FULL,
        }
        assert blocked.reason is expected[bound]
        waiter = asyncio.ensure_future(blocked.released.wait_async(blocked.epoch))
        await asyncio.sleep(0.01)
        assert not waiter.done(), "a wait on an unchanged bound must sleep"
        items = ch.submissions.drain(10)  # frees a queue slot (the queue bound's wakeup)
        for item in items:
            if isinstance(item, SendSubmission):
                item.payload.release()
            elif isinstance(item, ReceiveSubmission):
                item.cancellation._finish()
                item.posted.release()
            item.permit.release()
        await asyncio.wait_for(waiter, 1)
        attempt()  # and the bound has room again

    asyncio.run(main())


@pytest.mark.parametrize("threadsafe", [True, False])
def test_submission_queue_empty_and_open_answers(threadsafe: bool) -> None:
    """``drain`` and ``is_closed`` answer "empty" and "open" without the receiver; what they
    answer must not change."""
    ch = _channels(threadsafe)
    assert ch.submissions.drain(4) == []
    with pytest.raises(ValueError):
        ch.submissions.drain(-1)
    assert not ch.submissions.is_closed()
    ch.streams.send_nowait(STREAM, b"x")
    assert not ch.submissions.is_closed()
    ch.submissions.close()
    assert not ch.submissions.is_closed()  # closed, but an accepted item is still queued
    (item,) = ch.submissions.drain(4)
    assert isinstance(item, SendSubmission)
    assert ch.submissions.is_closed()
    assert ch.submissions.drain(4) == []
