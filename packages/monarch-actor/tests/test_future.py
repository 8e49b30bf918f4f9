"""``Future``: the reference's future characterization (catalogue item 76) and thread hand-off."""

from __future__ import annotations

import asyncio
import threading
import warnings
from typing import Any

import pytest

from monarch.actor import Future
from monarch.actor._base import future as future_module
from monarch.actor._base.future import _all_done, _Cell
from monarch.actor._base.loop import RuntimeLoop
from monarch.config import configured


def pending() -> tuple[_Cell[Any], Future[Any]]:
    cell: _Cell[Any] = _Cell()
    return cell, Future._create(cell)


def later(cell: _Cell[Any], value: Any, delay: float = 0.02) -> threading.Timer:
    timer = threading.Timer(delay, cell.set_result, (value,))
    timer.start()
    return timer


def test_direct_construction_is_rejected() -> None:
    with pytest.raises(TypeError, match="cannot be constructed directly"):
        Future()
    with pytest.raises(TypeError):
        Future(coro=None)


def test_get_returns_the_value_and_caches_it() -> None:
    calls: list[int] = []

    def double(raw: int) -> int:
        calls.append(raw)
        return raw * 2

    cell: _Cell[int] = _Cell()
    future = Future._create(cell, double)
    cell.set_result(21)
    assert future.get() == 42
    assert future.get() == 42
    assert calls == [21]  # decoded once


def test_get_reraises_the_identical_exception() -> None:
    cell, future = pending()
    error = ValueError("boom")
    cell.set_exception(error)
    with pytest.raises(ValueError) as first:
        future.get()
    with pytest.raises(ValueError) as second:
        future.get()
    assert first.value is error
    assert second.value is error


def test_a_decode_failure_is_the_cached_outcome() -> None:
    cell: _Cell[int] = _Cell()
    future = Future._create(cell, lambda raw: 1 // raw)
    cell.set_result(0)
    with pytest.raises(ZeroDivisionError) as first:
        future.get()
    with pytest.raises(ZeroDivisionError) as second:
        future.get()
    assert first.value is second.value


def test_timeout_does_not_cancel_the_work() -> None:
    cell, future = pending()
    with pytest.raises(TimeoutError):
        future.get(timeout=0.01)
    cell.set_result("late")
    assert future.get(timeout=1) == "late"


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", True])
def test_invalid_timeouts_are_value_errors(bad: Any) -> None:
    cell, future = pending()
    with pytest.raises(ValueError, match="timeout"):
        future.get(timeout=bad)
    cell.set_result(1)
    assert future.get() == 1


def test_first_completion_wins() -> None:
    cell, future = pending()
    assert cell.set_result(1)
    assert not cell.set_result(2)
    assert not cell.set_exception(ValueError())
    assert future.get() == 1


def test_done_reports_completion() -> None:
    cell, future = pending()
    assert not future.done()
    cell.set_result(None)
    assert future.done()


def test_result_and_exception_aliases() -> None:
    cell, future = pending()
    cell.set_exception(KeyError("k"))
    assert isinstance(future.exception(timeout=1), KeyError)
    with pytest.raises(KeyError):
        future.result()
    ok = Future._completed(5)
    assert ok.exception() is None
    assert ok.result() == 5


def test_completion_from_another_thread_wakes_get() -> None:
    cell, future = pending()
    later(cell, "hi")
    assert future.get(timeout=5) == "hi"


def test_await_repeatedly_and_mixed_with_get() -> None:
    cell, future = pending()

    async def main() -> list[Any]:
        later(cell, 7)
        first = await future
        second = await future
        return [first, second, await future.as_asyncio()]

    assert asyncio.run(main()) == [7, 7, 7]
    assert future.get() == 7


def test_get_after_await_and_await_after_get_share_the_exception() -> None:
    cell, future = pending()
    cell.set_exception(RuntimeError("x"))
    with pytest.raises(RuntimeError) as from_get:
        future.get()

    async def main() -> BaseException:
        try:
            await future
        except RuntimeError as exc:
            return exc
        raise AssertionError("no exception")

    assert asyncio.run(main()) is from_get.value


def test_awaiting_without_a_running_loop_is_a_value_error_and_leaves_the_future_usable() -> None:
    cell, future = pending()

    async def waiter() -> Any:
        return await future

    coro = waiter()
    with pytest.raises(ValueError, match="no active event loop"):
        coro.send(None)
    coro.close()
    cell.set_result(3)
    assert future.get() == 3


def test_get_inside_a_running_loop_warns_but_returns() -> None:
    future = Future._completed("v")

    async def main() -> str:
        with pytest.warns(UserWarning, match="running asyncio event loop"):
            return future.get()

    assert asyncio.run(main()) == "v"


def test_get_outside_a_loop_does_not_warn() -> None:
    future = Future._completed("v")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert future.get() == "v"


def test_as_asyncio_needs_a_running_loop_and_returns_a_new_future_each_time() -> None:
    cell, future = pending()
    with pytest.raises(RuntimeError):
        future.as_asyncio()

    async def main() -> tuple[bool, Any, Any]:
        a = future.as_asyncio()
        b = future.as_asyncio()
        later(cell, "x")
        return a is b, await a, await b

    assert asyncio.run(main()) == (False, "x", "x")


def test_a_cancelled_awaiter_does_not_disturb_the_future() -> None:
    cell, future = pending()

    async def main() -> None:
        task = asyncio.ensure_future(future)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    cell.set_result(1)
    assert future.get() == 1


def test_awaiting_across_two_user_loops() -> None:
    cell, future = pending()
    results: list[Any] = []

    def run_loop() -> None:
        results.append(asyncio.run(_await(future)))

    threads = [threading.Thread(target=run_loop) for _ in range(2)]
    for t in threads:
        t.start()
    later(cell, "shared", 0.05)
    for t in threads:
        t.join(5)
    assert results == ["shared", "shared"]


async def _await(future: Future[Any]) -> Any:
    return await future


def test_blocking_on_the_runtime_loop_thread_is_refused() -> None:
    loop = RuntimeLoop("test-loop")
    loop.start()
    try:
        _, future = pending()
        outcome: _Cell[BaseException] = _Cell()

        def block() -> None:
            try:
                future.get(timeout=1)
            except BaseException as exc:
                outcome.set_result(exc)

        loop.call_soon(block)
        assert outcome.wait(5)
        _, error = outcome.outcome()
        assert isinstance(error, RuntimeError)
        assert "deadlock" in str(error)
    finally:
        loop.stop()


def test_all_done_joins_cells() -> None:
    cells: list[_Cell[int]] = [_Cell() for _ in range(3)]
    joined = _all_done(cells)
    cells[0].set_result(1)
    cells[2].set_exception(ValueError())
    assert not joined.done()
    cells[1].set_result(2)
    assert joined.done()
    assert _all_done([]).done()


def test_every_waiter_of_a_cell_wakes_once_it_completes() -> None:
    """Several threads block on one pending cell (one of them after a timed-out wait): the one
    completion releases all of them, and a wait after completion returns at once."""
    cell: _Cell[int] = _Cell()
    assert not cell.wait(0.01)  # times out, leaves the cell pending and waitable
    ready = threading.Barrier(5)
    woke: list[bool] = []

    def waiter() -> None:
        ready.wait()
        woke.append(cell.wait(30.0))

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for t in threads:
        t.start()
    ready.wait()
    cell.set_result(7)
    for t in threads:
        t.join(30.0)
    assert woke == [True] * 4
    assert cell.wait(0)
    assert cell.wait(None)
    assert cell.outcome() == (True, 7)


def test_an_interrupt_after_the_gate_was_taken_leaves_it_open() -> None:
    """A signal handler's exception can come on the main thread between taking a completed
    cell's gate and passing it on: the gate is opened again, so another thread's wait on the
    cell does not hang."""
    import _thread

    cell: _Cell[int] = _Cell()
    real = _thread.allocate_lock()
    real.acquire()  # held while the cell is pending, as ``wait`` makes it

    class Interrupted:  # the exception right after the acquire succeeded
        def acquire(self, blocking: bool, timeout: float) -> bool:
            if real.acquire(blocking, timeout):
                raise KeyboardInterrupt
            return False

        def release(self) -> None:
            real.release()

    cell._gate = Interrupted()
    timer = later(cell, 5)
    try:
        with pytest.raises(KeyboardInterrupt):
            cell.wait(10)
    finally:
        timer.join()
    assert not real.locked()  # open: the next waiter, on any thread, passes
    cell._gate = real
    waiter: list[bool] = []
    thread = threading.Thread(target=lambda: waiter.append(cell.wait(10)))
    thread.start()
    thread.join(10)
    assert waiter == [True]


class _CountingClock:
    """A clock for the spin that advances ``step_ns`` at every reading, and counts the polls
    (``give_way`` calls); ``on_poll`` runs at each poll (to complete the cell mid-spin)."""

    def __init__(self, step_ns: int, on_poll: Any = None) -> None:
        self.now = 0
        self.step = step_ns
        self.polls = 0
        self.on_poll = on_poll

    def clock(self) -> int:
        now = self.now
        self.now += self.step
        return now

    def give_way(self) -> None:
        self.polls += 1
        if self.on_poll is not None:
            self.on_poll(self.polls)


@pytest.fixture
def spin_clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(step_ns: int, on_poll: Any = None) -> _CountingClock:
        counting = _CountingClock(step_ns, on_poll)
        monkeypatch.setattr(future_module, "_spin_clock", counting.clock)
        monkeypatch.setattr(future_module, "_spin_yield", counting.give_way)
        return counting

    return make


def test_spin_wait_zero_sleeps_at_once(spin_clock: Any) -> None:
    """``future_spin_wait`` 0: a wait on a pending cell polls nothing and sleeps on its gate."""
    counting = spin_clock(1_000)
    cell: _Cell[int] = _Cell()
    with configured(future_spin_wait="0s"):
        assert not cell.wait(0.01)
    assert counting.polls == 0
    assert cell._gate is not None  # it slept on the gate


def test_spin_wait_polls_for_its_window_then_sleeps(spin_clock: Any) -> None:
    """A pending cell is polled until the window ends on the (counting) clock, then the waiter
    sleeps on the gate; a completion after that still wakes it."""
    counting = spin_clock(10_000)  # 10 us per clock reading
    cell: _Cell[int] = _Cell()
    with configured(future_spin_wait="300us"):
        assert not cell.wait(0.05)
        # The first reading sets the end (300 us on); each poll reads the clock once more.
        assert counting.polls == 300 // 10 - 1
        assert cell._gate is not None
        timer = later(cell, 3)
        try:
            assert cell.wait(30.0)
        finally:
            timer.join()
    assert cell.outcome() == (True, 3)


def test_spin_wait_is_bounded_by_the_timeout(spin_clock: Any) -> None:
    """A timeout shorter than the window bounds the spin."""
    counting = spin_clock(1_000_000)  # 1 ms per reading
    cell: _Cell[int] = _Cell()
    with configured(future_spin_wait="1s"):
        assert not cell.wait(0.01)
    assert counting.polls == 10 - 1
    assert cell.wait(0) is False  # a zero timeout neither spins nor sleeps
    assert counting.polls == 10 - 1


def test_the_spin_comes_off_the_timeout(spin_clock: Any) -> None:
    """The poll's time is taken off the wait's timeout: with the (counting) clock past the
    whole timeout when the poll ends, the wait returns at once instead of sleeping the full
    30 s on the gate (a waiting thread, joined with a bound far below 30 s)."""
    spin_clock(30_000_000_000)  # 30 s per clock reading
    cell: _Cell[int] = _Cell()
    outcome: list[bool] = []
    with configured(future_spin_wait="1s"):
        waiter = threading.Thread(target=lambda: outcome.append(cell.wait(30.0)), daemon=True)
        waiter.start()
        waiter.join(10.0)
    alive = waiter.is_alive()
    cell.set_result(0)  # (releases a waiter that overran, so the thread ends either way)
    waiter.join(10.0)
    assert not alive, "the wait slept the whole timeout after the poll"
    assert outcome == [False]


def test_a_completion_during_the_spin_returns_without_sleeping(spin_clock: Any) -> None:
    """The cell completed while the waiter polls (another thread, here at the third poll): the
    wait returns True and never made a gate (nobody had to be woken)."""
    cell: _Cell[int] = _Cell()

    def complete_at_third(polls: int) -> None:
        if polls == 3:
            cell.set_result(11)

    counting = spin_clock(1_000, complete_at_third)
    with configured(future_spin_wait="1s"):
        assert Future._create(cell).get() == 11
    assert counting.polls == 3
    assert cell._gate is None
