"""``@returns_future`` bodies under ``.get()``: one event loop per thread, reused only while a
body leaves it as ``asyncio.run`` would have left a fresh one, and never shared with a forked
child (``_runtime.returns_future``, "One loop per thread" and "Forks").

The bodies run through ``_BodyCell`` directly (what ``returns_future`` builds, without its
``context()`` call): the forked children here must not start a client runtime.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import gc
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Future
from monarch.actor._runtime.returns_future import _BodyCell, _local, _tasks

T = 30.0


def observe(body: Coroutine[Any, Any, Any]) -> Future[Any]:
    return Future._create(_BodyCell(body, contextvars.copy_context()))


def run(body: Coroutine[Any, Any, Any], timeout: float | None = T) -> Any:
    return observe(body).get(timeout=timeout)


async def running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    executor = concurrent.futures.ThreadPoolExecutor(2)
    yield executor
    executor.shutdown(wait=True)


async def from_another_thread(pool: concurrent.futures.ThreadPoolExecutor) -> str:
    """Completed by a pool thread: the loop wakes through ``call_soon_threadsafe`` (its
    self-pipe), as a data lane's chunk or any executor job completes."""

    def job() -> str:
        time.sleep(0.05)
        return "woken"

    return await asyncio.wrap_future(pool.submit(job))


def test_consecutive_gets_on_a_thread_reuse_one_loop() -> None:
    first = run(running_loop())
    assert run(running_loop()) is first
    assert not first.is_closed()

    seen: list[asyncio.AbstractEventLoop] = []
    thread = threading.Thread(target=lambda: seen.append(run(running_loop())))
    thread.start()
    thread.join(T)
    assert seen
    assert seen[0] is not first  # a loop per thread
    assert run(running_loop()) is first


def test_a_task_a_body_leaves_behind_is_cancelled_and_awaited_before_get_returns() -> None:
    """As ``asyncio.run``: nothing a body started stays suspended on the thread's loop until a
    later ``.get()`` (which is what another thread waiting on it would hang on)."""
    events: list[str] = []
    started = threading.Event()

    async def background() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            events.append("background cleaned up")

    async def leaves_a_task() -> asyncio.AbstractEventLoop:
        _tasks.add(asyncio.get_running_loop().create_task(background()))  # kept alive
        await asyncio.sleep(0)
        return asyncio.get_running_loop()

    loop = run(leaves_a_task())
    assert started.is_set()
    assert events == ["background cleaned up"]  # when .get() returned, not at a later one
    assert loop.is_closed()  # that loop was shut down as asyncio.run's is
    assert run(running_loop()) is not loop  # the next body runs on a fresh one


def test_a_background_task_another_thread_waits_on_is_not_left_suspended() -> None:
    """Another thread waits for what a body's background task does. Under ``asyncio.run`` the
    task is cancelled when the body returns (its ``finally`` runs); it must not stay suspended
    on a loop that nobody runs until the next ``.get()`` on this thread."""
    outcome: concurrent.futures.Future[str] = concurrent.futures.Future()

    async def settle_later() -> None:
        try:
            await asyncio.sleep(3600)
            outcome.set_result("ran on")
        except asyncio.CancelledError:
            outcome.set_result("cancelled at the body's end")
            raise

    async def body() -> None:
        _tasks.add(asyncio.get_running_loop().create_task(settle_later()))
        await asyncio.sleep(0)

    waiter = concurrent.futures.ThreadPoolExecutor(1)
    try:
        waited = waiter.submit(outcome.result, T)
        run(body())
        assert waited.result(T) == "cancelled at the body's end"
    finally:
        waiter.shutdown()


def test_timers_and_callbacks_a_body_leaves_do_not_run_in_a_later_body() -> None:
    fired: list[str] = []

    async def leaves_a_timer() -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, fired.append, "timer")
        return loop

    async def waits() -> asyncio.AbstractEventLoop:
        await asyncio.sleep(0.1)
        return asyncio.get_running_loop()

    loop = run(leaves_a_timer())
    assert run(waits()) is not loop
    assert fired == []  # asyncio.run drops a pending timer with its loop

    async def leaves_a_callback() -> None:
        asyncio.get_running_loop().call_soon(fired.append, "soon")

    run(leaves_a_callback())
    assert fired == ["soon"]  # run before .get() returned (asyncio.run's shutdown runs it)


@pytest.mark.parametrize(
    "leftover",
    ["reader", "exception handler", "task factory", "default executor", "async generator"],
)
def test_a_body_that_changes_its_loop_gets_it_shut_down(leftover: str) -> None:
    closed: list[str] = []

    async def agen() -> Any:
        try:
            yield 1
            yield 2
        finally:
            closed.append("async generator")

    kept: list[Any] = []

    async def body() -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if leftover == "reader":
            read, write = os.pipe()
            kept.extend((read, write))
            loop.add_reader(read, lambda: None)
        elif leftover == "exception handler":
            loop.set_exception_handler(lambda loop, ctx: None)
        elif leftover == "task factory":
            loop.set_task_factory(None)
        elif leftover == "default executor":
            await loop.run_in_executor(None, lambda: None)
        else:
            generator = agen()
            kept.append(generator)
            await generator.__anext__()
        return loop

    try:
        loop = run(body())
        assert loop.is_closed()
        assert run(running_loop()) is not loop
        if leftover == "async generator":
            assert closed == ["async generator"]  # shutdown_asyncgens, as asyncio.run
    finally:
        for item in kept:
            if isinstance(item, int):
                os.close(item)


def test_context_variables_timeouts_and_errors_on_the_reused_loop() -> None:
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")
    cleaned = threading.Event()

    async def reads_and_sets() -> str:
        seen = marker.get()
        marker.set("set by the body")
        return seen

    marker.set("caller's")
    assert run(reads_and_sets()) == "caller's"
    assert marker.get() == "caller's"  # the body ran in a copy
    assert run(reads_and_sets()) == "caller's"  # a second body: a fresh copy again

    async def slow() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.set()

    future = observe(slow())
    with pytest.raises(TimeoutError, match="not ready after"):
        future.get(timeout=0.1)
    assert cleaned.is_set()
    with pytest.raises(TimeoutError):
        future.get()

    async def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        run(fails())
    loop = run(running_loop())
    assert run(running_loop()) is loop  # a failing or timed-out body leaves the loop clean


def test_get_inside_a_running_loop_uses_a_helper_thread() -> None:
    async def outer() -> tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop, str]:
        with pytest.warns(UserWarning, match="within a running asyncio event loop"):
            inner = observe(running_loop()).get(timeout=T)
        return asyncio.get_running_loop(), inner, threading.current_thread().name

    loop, inner, _ = run(outer())
    assert inner is not loop
    assert inner.is_closed()  # the helper's own loop, closed after
    assert run(running_loop()) is loop


def wait_in_epoll_wait(pid: int) -> None:
    """Until process ``pid`` sleeps in ``epoll_wait`` (its kernel wait channel), at most ``T``
    seconds; where the kernel does not show wait channels, a short sleep instead."""
    wchan = Path(f"/proc/{pid}/wchan")
    deadline = time.monotonic() + T
    while time.monotonic() < deadline:
        try:
            channel = wchan.read_text()
        except OSError:
            channel = "0"
        if channel == "0":  # hidden (or not a Linux /proc): no way to tell
            time.sleep(0.1)
            return
        if "epoll" in channel:
            return
        time.sleep(0.001)
    raise AssertionError(f"process {pid} never waited in epoll_wait")


@pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(os, "fork"), reason="epoll and fork (Linux)"
)
@pytest.mark.parametrize("child", ["runs a body", "closes the inherited loop"])
def test_a_forked_child_never_touches_the_parents_loop(
    child: str, pool: concurrent.futures.ThreadPoolExecutor
) -> None:
    """A child forked while this thread's loop exists shares its epoll instance and self-pipe.
    Running it in the child would take the parent's wake-ups (the child, waiting first, is the
    one the kernel wakes, and it reads the byte); closing it would remove the parent's
    self-pipe from the shared epoll instance. Either way the parent's next body that is
    completed from another thread would sleep until its timeout."""
    parent_loop = run(running_loop())
    ready_read, ready_write = os.pipe()
    done_read, done_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(ready_read)
            os.close(done_write)
            inherited = _local.loop.loop
            if child == "runs a body":

                async def wait_in_the_loop() -> asyncio.AbstractEventLoop:
                    os.write(ready_write, b"r")
                    await asyncio.sleep(1.0)  # in epoll_wait while the parent waits too
                    return asyncio.get_running_loop()

                code = 0 if run(wait_in_the_loop()) is not inherited else 3
            else:
                fresh = run(running_loop())
                inherited.close()
                del inherited
                gc.collect()
                os.write(ready_write, b"r")
                code = 0 if fresh is not parent_loop else 3
            select.select([done_read], [], [], T)  # alive until the parent is done
        finally:
            os._exit(code)
    os.close(ready_write)
    os.close(done_read)
    try:
        select.select([ready_read], [], [], T)
        if child == "runs a body":
            wait_in_epoll_wait(pid)  # the child waits first: the kernel would wake it
        assert run(from_another_thread(pool), timeout=10) == "woken"
        assert run(running_loop()) is parent_loop
    finally:
        os.close(done_write)  # the child may exit
        os.close(ready_read)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_ctrl_c_on_the_main_thread_cancels_the_body_then_raises_keyboard_interrupt() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("the runner replaced SIGINT's handler")
    cleaned: list[str] = []

    async def interrupted() -> None:
        try:
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
            await asyncio.sleep(3600)
        finally:
            cleaned.append("cleaned")

    with pytest.raises(KeyboardInterrupt):
        run(interrupted())
    assert cleaned == ["cleaned"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert run(running_loop()) is not None


@pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(os, "fork"), reason="epoll and fork (Linux)"
)
def test_a_child_forked_from_another_thread_may_collect_the_loop_it_inherited(
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    """The hang of monarch-rdma's ``test_net_procs`` (a drop over the Unix data lane timing out
    after the first mesh stopped): the zygote is forked from the thread that runs
    ``spawn_procs``, so in it the main thread's idle loop is unreachable garbage (a cycle
    through its self-pipe handler), frozen by the zygote's ``gc.freeze()``; every worker it
    forks collects it when it exits (``gc.unfreeze()``, ``gc.collect()``), and the loop's
    finalizer closed it: ``EPOLL_CTL_DEL`` of the client's self-pipe from the epoll instance
    they all share. The client's next body completed from another thread then slept until its
    timeout."""
    parent_loop = id(run(running_loop()))  # no reference: the child's copy must be garbage
    children: list[int] = []

    def fork() -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                gc.collect()  # finalizes what it inherited and cannot reach
                code = 0
            finally:
                os._exit(code)
        children.append(pid)

    thread = threading.Thread(target=fork)
    thread.start()
    thread.join(T)
    _, status = os.waitpid(children[0], 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert run(from_another_thread(pool), timeout=10) == "woken"
    assert id(run(running_loop())) == parent_loop
