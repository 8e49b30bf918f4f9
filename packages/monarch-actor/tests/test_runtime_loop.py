"""RuntimeLoop's batched wake-ups (issues #21, #23): submission order, exceptions, contexts,
the bound, and what ``stop`` does with submissions still queued."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor._base import loop as loop_module
from monarch.actor._base.envelope import ActorAddr, Envelope, MessageKind
from monarch.actor._base.loop import (
    RuntimeLoop,
    RuntimeLoopClosedError,
    RuntimeLoopOverloadedError,
)
from monarch.actor._transport.seam import InProcessFabric

WAIT = 5.0


@pytest.fixture
def rloop() -> Iterator[RuntimeLoop]:
    loop = RuntimeLoop("test-runtime-loop")
    loop.start()
    try:
        yield loop
    finally:
        loop.stop(timeout=WAIT)


def block(loop: RuntimeLoop) -> tuple[threading.Event, threading.Event]:
    """Occupy ``loop``'s thread in a callback until the second event is set; the first says
    it runs."""
    running, release = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        release.wait(WAIT)

    loop.call_soon(hold)
    assert running.wait(WAIT)
    return running, release


def flush(loop: RuntimeLoop) -> None:
    """Wait until everything submitted to ``loop`` before this call ran."""
    done = threading.Event()
    loop.call_soon(done.set)
    assert done.wait(WAIT)


# Each step: (submitter, value). Submitter 0 submits from the loop's own thread, 1..3 are
# other threads. The steps happen in exactly this order (a coordinator hands the turn over),
# so the loop must run the values in exactly this order too.
_steps = st.lists(st.tuples(st.integers(0, 3), st.integers()), max_size=40)


@given(steps=_steps, busy=st.booleans(), batch=st.sampled_from([1, 2, 1024]))
def test_callbacks_run_in_submission_order_across_threads(
    steps: list[tuple[int, int]], busy: bool, batch: int
) -> None:
    saved = loop_module.DRAIN_BATCH
    loop_module.DRAIN_BATCH = batch  # small batches: drains interleave with the submissions
    loop = RuntimeLoop("test-order")
    loop.start()
    try:
        ran: list[int] = []
        turns = [threading.Semaphore(0) for _ in range(4)]
        done = threading.Semaphore(0)
        mine: list[list[int]] = [[v for who, v in steps if who == t] for t in range(4)]

        def submitter(t: int) -> None:
            for value in mine[t]:
                assert turns[t].acquire(timeout=WAIT)
                loop.call_soon(ran.append, value)
                done.release()

        def from_loop(value: int) -> None:
            loop.call_soon(ran.append, value)
            done.release()

        threads = [threading.Thread(target=submitter, args=(t,)) for t in (1, 2, 3)]
        for thread in threads:
            thread.start()
        # busy: the loop thread is held at first, so submissions pile up behind one drain; it
        # is let go at the half-way step, or at the first one that needs the loop thread.
        release = block(loop)[1] if busy else None
        for step, (who, value) in enumerate(steps):
            if release is not None and (who == 0 or step == len(steps) // 2):
                release.set()
                release = None
            if who == 0:  # asyncio's own hand-off (outside the queue under test) to get there
                loop.loop.call_soon_threadsafe(from_loop, value)
            else:
                turns[who].release()
            assert done.acquire(timeout=WAIT)
        if release is not None:
            release.set()
        for thread in threads:
            thread.join(WAIT)
        flush(loop)
        assert ran == [value for _who, value in steps]
    finally:
        loop_module.DRAIN_BATCH = saved
        loop.stop(timeout=WAIT)


def test_a_burst_while_the_loop_is_busy_writes_no_wakeup(rloop: RuntimeLoop) -> None:
    _running, release = block(rloop)
    before = rloop.wakeups
    ran: list[tuple[int, int]] = []

    def burst(t: int) -> None:
        for i in range(200):
            rloop.call_soon(ran.append, (t, i))

    threads = [threading.Thread(target=burst, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert rloop.pending == 800
    assert rloop.wakeups == before  # the running drain takes them all: no self-pipe write
    release.set()
    flush(rloop)
    assert len(ran) == 800
    for t in range(4):
        assert [i for who, i in ran if who == t] == list(range(200))


def test_an_idle_loop_is_woken_once_per_burst(rloop: RuntimeLoop) -> None:
    flush(rloop)
    before = rloop.wakeups
    gate = threading.Event()
    ran: list[int] = []
    # The loop thread stays asleep in select until the first wake-up; everything submitted
    # before the drain runs shares that one.
    rloop.call_soon(gate.wait, WAIT)  # one wake-up; the drain then holds the thread
    for i in range(50):
        rloop.call_soon(ran.append, i)
    gate.set()
    flush(rloop)
    assert ran == list(range(50))
    assert rloop.wakeups - before <= 2  # the burst's (and at most the flush's)


def test_a_failing_callback_is_reported_and_the_rest_still_run(rloop: RuntimeLoop) -> None:
    reported: list[dict[str, Any]] = []
    rloop.loop.set_exception_handler(lambda _loop, context: reported.append(context))

    def boom() -> None:
        raise ValueError("boom")

    _running, release = block(rloop)
    ran: list[int] = []
    rloop.call_soon(ran.append, 1)
    rloop.call_soon(boom)
    rloop.call_soon(ran.append, 2)
    release.set()
    flush(rloop)
    assert ran == [1, 2]
    assert len(reported) == 1
    assert isinstance(reported[0]["exception"], ValueError)
    assert "boom" in reported[0]["message"]


_var: contextvars.ContextVar[str] = contextvars.ContextVar("_var", default="unset")


def test_callbacks_run_in_their_submitters_context(rloop: RuntimeLoop) -> None:
    seen: list[str] = []

    def submit(value: str) -> None:
        _var.set(value)
        rloop.call_soon(lambda: seen.append(_var.get()))

    _running, release = block(rloop)
    threads = [threading.Thread(target=submit, args=(v,)) for v in ("a", "b")]
    for thread in threads:
        thread.start()
        thread.join(WAIT)
    release.set()
    flush(rloop)
    assert seen == ["a", "b"]


def test_the_queue_is_bounded() -> None:
    loop = RuntimeLoop("test-bounded", max_pending=3)
    loop.start()
    try:
        _running, release = block(loop)
        ran: list[int] = []
        emptied = threading.Event()
        loop.call_soon(ran.append, 0)
        loop.call_soon(ran.append, 1)
        loop.call_soon(emptied.set)
        with pytest.raises(RuntimeLoopOverloadedError, match="max_pending 3"):
            loop.call_soon(ran.append, 3)
        assert issubclass(RuntimeLoopOverloadedError, RuntimeLoopClosedError)
        release.set()
        assert emptied.wait(WAIT)
        flush(loop)  # room again once the drain took them
        assert ran == [0, 1]
    finally:
        loop.stop(timeout=WAIT)
    with pytest.raises(ValueError, match="max_pending"):
        RuntimeLoop("bad", max_pending=0)


@pytest.mark.parametrize("batch", [1, 1024])
def test_stop_runs_what_was_queued_and_refuses_the_rest(batch: int) -> None:
    saved = loop_module.DRAIN_BATCH
    loop_module.DRAIN_BATCH = batch  # 1: the drain reschedules itself behind loop.stop
    loop = RuntimeLoop("test-stop")
    loop.start()
    try:
        _running, release = block(loop)
        ran: list[int] = []
        for i in range(100):
            loop.call_soon(ran.append, i)
        loop.stop(timeout=0.01)  # the thread is held: stop marks it closed and returns
        assert loop.closed
        with pytest.raises(RuntimeLoopClosedError):
            loop.call_soon(ran.append, -1)
        release.set()
        loop._thread.join(WAIT)  # the loop thread runs the accepted callbacks, then exits
        assert not loop._thread.is_alive()
        assert ran == list(range(100))
        assert loop.pending == 0
    finally:
        loop_module.DRAIN_BATCH = saved
        loop.stop(timeout=WAIT)


def test_stop_before_start_drops_the_queue_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = RuntimeLoop("test-never-started")
    loop.call_soon(lambda: None)
    with caplog.at_level("WARNING", logger="monarch.actor.runtime"):
        loop.stop()
    assert loop.pending == 0
    assert "1 queued callbacks dropped" in caplog.text


def test_an_overloaded_loop_refuses_an_in_process_send_to_its_sender() -> None:
    """The in-process seam hands each envelope to the destination's loop: when that loop's
    queue is full, the sender gets the error (its own loop would refuse a bounce as well)
    rather than the envelope vanishing."""
    loop = RuntimeLoop("test-seam-bounded", max_pending=2)
    loop.start()
    try:
        fabric = InProcessFabric()
        got: list[Envelope] = []
        bounced: list[str] = []
        two = threading.Event()

        def deliver(envelope: Envelope, _buffers: object) -> None:
            got.append(envelope)
            if len(got) == 2:
                two.set()

        a = fabric.attach(loop, deliver, lambda _e, r: bounced.append(r))
        b = fabric.attach(loop, deliver, lambda _e, r: bounced.append(r))

        def envelope(seq: int) -> Envelope:
            return Envelope(
                MessageKind.CALL, ActorAddr(a.pid.raw, "root"), ActorAddr(b.pid.raw, "x"),
                -1, "ep", seq, None, None, b"x",
            )  # fmt: skip

        _running, release = block(loop)
        a.send(envelope(0), [])
        a.send(envelope(1), [])
        with pytest.raises(RuntimeLoopOverloadedError):
            a.send(envelope(2), [])
        release.set()
        assert two.wait(WAIT)
        flush(loop)
        assert [e.sequence for e in got] == [0, 1]
        assert bounced == []
    finally:
        loop.stop(timeout=WAIT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_loop_that_dies_runs_what_it_accepted_and_refuses_the_rest() -> None:
    """``SystemExit`` in a callback ends the loop thread (as asyncio lets it): the callbacks
    queued behind it still run, and later submissions are refused instead of hanging."""
    loop = RuntimeLoop("test-dies")
    loop.start()
    try:
        _running, release = block(loop)
        ran: list[int] = []

        def leave() -> None:
            raise SystemExit

        loop.call_soon(ran.append, 1)
        loop.call_soon(leave)
        loop.call_soon(ran.append, 2)
        release.set()
        loop._thread.join(WAIT)
        assert not loop._thread.is_alive()
        assert ran == [1, 2]
        assert loop.closed
        with pytest.raises(RuntimeLoopClosedError):
            loop.call_soon(ran.append, 3)
    finally:
        loop.stop(timeout=WAIT)
