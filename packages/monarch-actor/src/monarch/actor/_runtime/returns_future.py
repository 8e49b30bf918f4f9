"""``@returns_future``: an ``async def`` that returns a ``monarch.actor.Future``.

Why: Monarch's own APIs and its users write one ``async`` implementation and let synchronous
callers ``.get()`` it and asyncio callers ``await`` it. The reference's rules, kept here:

- Calling the decorated function runs ``context()`` on the caller's thread (so the first call
  bootstraps the client outside any loop made here) and copies the caller's context variables;
  it does not start the body. The body runs at most once, in that copy.
- The first observer starts the body: ``await`` (or ``as_asyncio()``) runs it as a task on the
  awaiting loop; ``.get()`` runs it on an event loop of the calling thread until it finishes,
  as ``asyncio.run`` does, or on a short-lived helper thread when the calling thread already
  runs a loop. Cancelling an ``await`` cancels only that observer; an owning ``.get(timeout)``
  that times out cancels the body and the future fails with ``TimeoutError`` for everyone.
- A future dropped before anyone observed it closes its coroutine unstarted.

One loop per thread (``.get()``). Making and closing an event loop for every ``.get()``
(``asyncio.run``: an epoll instance, a socket pair, the shutdown steps) cost about 0.1 ms, more
than a 1 MiB memcpy, and was most of a small RDMA transfer. So each thread keeps one loop for
its ``.get()`` bodies (``_ThreadLoop``) and reuses it while it stays as ``asyncio.run`` would
have left a fresh one: after a body, the loop is checked (``_ThreadLoop.clean``: no task made
on it still pending, no callback or live timer queued, nothing registered but its self-pipe,
no async generator, default executor, signal or exception handler, task factory or debug mode
left behind by the body); where anything is left, the loop is shut down exactly as
``asyncio.run`` shuts its loop down (leftover tasks cancelled and awaited, async generators
and the default executor shut down, the loop closed) and the next ``.get()`` makes a new one.
So a body never finds another body's leftovers, and nothing a body left behind waits,
suspended, for a later ``.get()`` on that thread. The helper threads (a ``.get()`` inside a
running loop, a callback added before anyone observed) run a fresh loop each, as before.

Forks: an idle loop is shared with every child forked while it exists (the zygote forks from
the client's thread that calls ``spawn_procs``): the child holds the same epoll instance and
the same self-pipe. A child that ran that loop would take the parent's wake-ups (only one of
the processes waiting on one epoll instance is woken, and the child would read the byte the
parent's ``call_soon_threadsafe`` wrote, leaving the parent asleep until its timeout), and a
child that closed it would remove the parent's self-pipe from the epoll instance they share
(``EPOLL_CTL_DEL`` acts on the instance, not on the child's copy). So in a forked child every
inherited loop is abandoned, never run or closed (``forked_loops``: marked closed so that
neither ``close()`` nor its finalizer touches the epoll instance; its descriptors are closed
when it is collected, which does not affect the parent's), and the child makes its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
import os
import signal
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from monarch.actor._base.future import Future, _Cell
from monarch.actor._runtime.context import context
from monarch.actor._runtime.forked_loops import LOOPS as _LOOPS
from monarch.actor._runtime.forked_loops import abandon as _abandon

__all__ = ["returns_future"]

#: ``signal``'s C module: ``signal.signal``/``getsignal`` convert handlers to enums, a failed
#: conversion formatting the handler's ``repr`` (a few microseconds per ``.get()``).
_signal: Any = importlib.import_module("_signal")

P = ParamSpec("P")
T = TypeVar("T")


def _track(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
    """The task factory of a ``_ThreadLoop``: every task made on it is recorded until done."""
    task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
    owner = _LOOPS.get(id(loop))
    if owner is not None and owner.loop is loop:
        owner.tasks.add(task)
        task.add_done_callback(owner.tasks.discard)
    return task


class _ThreadLoop:
    """One thread's event loop for ``.get()`` bodies (module docstring, "One loop per thread"):
    an ``asyncio.Runner`` kept open while every body leaves its loop clean."""

    __slots__ = (
        "__weakref__",
        "debug",
        "interrupts",
        "loop",
        "main_task",
        "pid",
        "runner",
        "tasks",
    )

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.main_task: asyncio.Task[Any] | None = None
        self.interrupts = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self.runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        self.loop = self.runner.get_loop()
        self.debug = self.loop.get_debug()
        _LOOPS[id(self.loop)] = self
        self.loop.set_task_factory(_track)

    def run(self, coro: Coroutine[Any, Any, Any], ctx: contextvars.Context) -> Any:
        """``asyncio.Runner.run``: the body as a task in ``ctx``, Ctrl-C on the main thread
        cancelling it (then ``KeyboardInterrupt``); afterwards, the loop is shut down unless
        clean (``clean``). (``Runner.run`` itself spent about 25 us a call on the main thread
        converting signal handlers to enums, formatting the task's ``repr`` each time.)"""
        loop = self.loop
        task = loop.create_task(coro, context=ctx)
        sigint = (
            threading.current_thread() is threading.main_thread()
            and _signal.getsignal(signal.SIGINT) is signal.default_int_handler
        )
        if sigint:
            self.main_task = task
            self.interrupts = 0
            try:
                _signal.signal(signal.SIGINT, _on_sigint)
            except ValueError:  # a main thread that cannot take signals (embedded)
                sigint = False
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if sigint and self.interrupts > 0 and task.uncancel() == 0:
                raise KeyboardInterrupt() from None
            raise
        finally:
            if sigint:
                self.main_task = None
                if _signal.getsignal(signal.SIGINT) is _on_sigint:
                    _signal.signal(signal.SIGINT, signal.default_int_handler)
            if not self.clean():
                self.close()

    def clean(self) -> bool:
        """Whether the loop is as a fresh one would be: what a body left queued to run now is
        run first (one pass, as ``asyncio.run``'s shutdown would have run it)."""
        loop: Any = self.loop
        try:
            if loop._ready:
                loop.call_soon(loop.stop)
                loop.run_forever()
            return (
                not self.tasks
                and not loop._ready
                and all(handle.cancelled() for handle in loop._scheduled)
                and len(loop._selector.get_map()) == 1  # its self-pipe
                and not loop._asyncgens
                and loop._default_executor is None
                and not getattr(loop, "_signal_handlers", None)
                and loop._exception_handler is None
                and loop.get_task_factory() is _track
                and loop.get_debug() == self.debug
                and not loop.is_closed()
            )
        except AttributeError:  # another event loop implementation: never reused
            return False

    def close(self) -> None:
        """Shut the loop down as ``asyncio.run`` does (leftover tasks cancelled and awaited,
        async generators and the default executor shut down, the loop closed) and forget it."""
        if getattr(_local, "loop", None) is self:
            del _local.loop
        if _LOOPS.get(id(self.loop)) is self:
            del _LOOPS[id(self.loop)]
        if self.pid == os.getpid():
            self.runner.close()
        else:  # a forked child's copy: never closed here
            _abandon(self.loop)

    # kept at hand: late in interpreter exit the module's globals are gone
    def __del__(
        self, _getpid: Callable[[], int] = os.getpid, _inert: Callable[[Any], None] = _abandon
    ) -> None:
        # the thread ended: its loop is clean (else closed already)
        loop = getattr(self, "loop", None)
        if loop is None or loop.is_running():
            return
        if getattr(self, "pid", None) == _getpid():
            loop.close()
        else:
            _inert(loop)


def _on_sigint(signum: int, frame: Any) -> None:
    """``asyncio.Runner``'s SIGINT handler, for the main thread's loop: the first Ctrl-C
    cancels the running body, a second one raises ``KeyboardInterrupt`` at once."""
    owner = getattr(_local, "loop", None)  # signal handlers run on the main thread
    task = None if owner is None else owner.main_task
    if owner is None or task is None:
        raise KeyboardInterrupt()
    owner.interrupts += 1
    if owner.interrupts == 1 and not task.done():
        task.cancel()
        owner.loop.call_soon_threadsafe(_nothing)  # wake a loop blocked in select()
        return
    raise KeyboardInterrupt()


def _nothing() -> None:
    pass


class _Local(threading.local):
    loop: _ThreadLoop


_local = _Local()


def _thread_loop() -> _ThreadLoop:
    """This thread's loop for ``.get()`` bodies, made on first use (and after a fork)."""
    current = getattr(_local, "loop", None)
    if current is None or current.pid != os.getpid():
        current = _local.loop = _ThreadLoop()
    return current


class _BodyCell(_Cell[Any]):
    """A cell whose outcome is the body's, and whose first observer starts the body."""

    __slots__ = ("_body", "_context", "_start_lock")

    def __init__(self, body: Coroutine[Any, Any, Any], ctx: contextvars.Context) -> None:
        super().__init__()
        self._body: Coroutine[Any, Any, Any] | None = body
        self._context = ctx
        self._start_lock = threading.Lock()

    def _take(self) -> Coroutine[Any, Any, Any] | None:
        with self._start_lock:
            body, self._body = self._body, None
            return body

    def _settle(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self.set_exception(asyncio.CancelledError())
        elif (exc := task.exception()) is not None:
            self.set_exception(exc)
        else:
            self.set_result(task.result())

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        body = self._take() if self._body is not None else None
        if body is not None:
            loop = asyncio._get_running_loop()
            if loop is not None:  # an ``await`` or ``as_asyncio()``: a task on that loop
                task = loop.create_task(body, context=self._context)
                _tasks.add(task)
                task.add_done_callback(_tasks.discard)
                task.add_done_callback(self._settle)
            else:
                threading.Thread(
                    target=self._run, args=(body, None, False), name="monarch-returns-future",
                    daemon=True,
                ).start()  # fmt: skip
        super().add_done_callback(callback)

    def wait(self, timeout: float | None) -> bool:
        body = self._take() if self._body is not None else None
        if body is None:
            return super().wait(timeout)
        if asyncio._get_running_loop() is not None:  # never a second loop inside a running one
            helper = threading.Thread(
                target=self._run, args=(body, timeout, False), name="monarch-returns-future",
                daemon=True,
            )  # fmt: skip
            helper.start()
            helper.join()
        else:
            self._run(body, timeout, True)
        return True

    def _run(self, body: Coroutine[Any, Any, Any], timeout: float | None, reuse: bool) -> None:
        """Run the body on this thread's loop (``reuse``) or a fresh one, as ``asyncio.run``
        does; a timeout cancels the body, drives its cleanup, then fails the future with
        ``TimeoutError``."""

        scopes: list[asyncio.Timeout] = []

        async def bounded() -> Any:
            async with asyncio.timeout(timeout) as scope:
                scopes.append(scope)
                return await body

        try:
            if reuse:
                result = _thread_loop().run(bounded(), self._context)
            else:
                with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
                    result = runner.run(bounded(), context=self._context)
        except TimeoutError as exc:
            if scopes and scopes[0].expired():  # our deadline, not the body's own TimeoutError
                self.set_exception(TimeoutError(f"monarch Future not ready after {timeout} s"))
            else:
                self.set_exception(exc)
        except BaseException as exc:
            self.set_exception(exc)
        else:
            self.set_result(result)

    def __del__(self) -> None:
        body = getattr(self, "_body", None)
        if body is not None:
            body.close()


_tasks: set[asyncio.Task[Any]] = set()  # asyncio holds tasks weakly: keep started bodies


def returns_future(
    function: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Future[T]]:
    """Make an ``async def`` return a ``monarch.actor.Future`` (see the module docstring).

    ``TypeError`` if ``function`` is not an ``async def``. For class or static methods, put
    ``@classmethod``/``@staticmethod`` above ``@returns_future``.
    """
    if not inspect.iscoroutinefunction(function):
        raise TypeError("returns_future requires an async function")

    @functools.wraps(function)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> Future[T]:
        body = function(*args, **kwargs)
        try:
            context()
            ctx = contextvars.copy_context()
        except BaseException:
            body.close()
            raise
        return Future._create(_BodyCell(body, ctx))

    return wrapped
