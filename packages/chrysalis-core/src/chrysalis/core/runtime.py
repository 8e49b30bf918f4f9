"""Runtime services shared by the Chrysalis packages, for asyncio and for trio.

What a thin driver of a pure (sans-IO) core needs from an event loop is small: which library
runs the current task, an event, a sleep, a deadline, a monotonic clock, supervised tasks that
can be cancelled and joined. Writing them once here keeps one I/O layer for both runtimes in
every package above (``chrysalis.quic``, ``chrysalis.nameserver``, ``chrysalis.node``) instead
of copies that drift apart.

Nothing here imports trio: it is looked up in ``sys.modules`` (``current_async_library``,
``is_cancellation``) or imported when a trio task actually runs, so trio stays an optional
dependency.

The running library is detected per call (``current_async_library``), so plain helpers
(``sleep``, ``new_event``, ``fail_after``...) need no argument. Only spawning needs an owner:
under asyncio a task belongs to the running loop (``AsyncioSpawner``, the default); under trio
every task belongs to a nursery (``TrioSpawner(nursery)``), which the caller opens and
therefore bounds: nothing spawned outlives it.

A ``Task`` records the exception its function raised instead of propagating it (a failing
link must not tear a trio nursery down); the owner decides what a failure means. Cancellation
is the runtime's own (``asyncio.CancelledError`` or ``trio.Cancelled``); ``is_cancellation``
tells them from errors.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final, Protocol, TypeVar, final

from chrysalis.core._async_library import current_async_library

__all__ = [
    "AsyncioSpawner",
    "Event",
    "Spawner",
    "Task",
    "TrioSpawner",
    "current_async_library",
    "default_spawner",
    "fail_after",
    "is_cancellation",
    "join_shielded",
    "monotonic",
    "monotonic_millis",
    "new_event",
    "race",
    "run_in_thread",
    "sleep",
]

T = TypeVar("T")
_log = logging.getLogger("chrysalis.runtime")
_MS: Final = 1000.0


def _trio() -> Any:
    import trio

    return trio


class Event(Protocol):
    """A one-shot event (``asyncio.Event`` and ``trio.Event`` both are).

    ``wait`` returns an awaitable: a coroutine (both libraries' events) or a future (an
    event implemented over the loop's futures, as ``chrysalis.quic``'s asyncio adapter has).
    """

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self) -> Awaitable[Any]: ...


def new_event() -> Event:
    """An event of the running library."""
    if current_async_library() == "trio":
        event: Event = _trio().Event()
        return event
    return asyncio.Event()


async def sleep(seconds: float) -> None:
    """Sleep on the running library."""
    if current_async_library() == "trio":
        await _trio().sleep(seconds)
    else:
        await asyncio.sleep(seconds)


def monotonic() -> float:
    """The running library's clock in seconds (the loop time under asyncio)."""
    if current_async_library() == "trio":
        return float(_trio().current_time())
    return asyncio.get_running_loop().time()


def monotonic_millis() -> int:
    """``monotonic()`` in whole milliseconds (what the resolver cache is fed)."""
    return int(monotonic() * _MS)


async def fail_after(seconds: float, fn: Callable[[], Awaitable[T]]) -> T:
    """``await fn()`` within ``seconds`` (``TimeoutError`` after it)."""
    if current_async_library() == "trio":
        trio = _trio()
        try:
            with trio.fail_after(seconds):
                return await fn()
        except trio.TooSlowError:
            raise TimeoutError(f"no answer within {seconds} s") from None
    async with asyncio.timeout(seconds):
        return await fn()


async def run_in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking ``fn(*args)`` on a worker thread."""
    if current_async_library() == "trio":
        result: T = await _trio().to_thread.run_sync(fn, *args)
        return result
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def is_cancellation(exc: BaseException) -> bool:
    """True for the runtime's cancellation exception."""
    if isinstance(exc, asyncio.CancelledError):
        return True
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, trio.Cancelled)


class Task(Protocol):
    """A spawned function: cancel it, wait for it, read how it ended."""

    @property
    def done(self) -> bool: ...

    @property
    def error(self) -> BaseException | None: ...

    def cancel(self) -> None: ...

    async def join(self) -> None: ...


class Spawner(Protocol):
    """Where tasks are started (a loop under asyncio, a nursery under trio)."""

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any, log: bool = True) -> Task: ...


@final
class _AsyncioTask:
    __slots__ = ("_error", "_task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._task.done()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def cancel(self) -> None:
        self._task.cancel()

    async def join(self) -> None:
        # ``asyncio.wait`` neither raises the task's exception nor cancels the task when the
        # joining task is cancelled.
        await asyncio.wait({self._task})


@final
class AsyncioSpawner:
    """Tasks on the running asyncio loop."""

    __slots__ = ()

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any, log: bool = True) -> Task:
        """Start ``fn(*args)``; its exception is recorded (and logged when ``log``)."""
        handle: _AsyncioTask

        async def run() -> None:
            try:
                await fn(*args)
            except Exception as exc:
                handle._error = exc
                if log:
                    _log.exception("a task failed")

        handle = _AsyncioTask(asyncio.get_running_loop().create_task(run()))
        return handle


@final
class _TrioTask:
    __slots__ = ("_done", "_error", "_scope")

    def __init__(self) -> None:
        trio = _trio()
        self._scope = trio.CancelScope()
        self._done = trio.Event()
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return bool(self._done.is_set())

    @property
    def error(self) -> BaseException | None:
        return self._error

    def cancel(self) -> None:
        self._scope.cancel()

    async def join(self) -> None:
        await self._done.wait()

    async def run(
        self, fn: Callable[..., Awaitable[object]], args: tuple[Any, ...], log: bool
    ) -> None:
        try:
            with self._scope:
                await fn(*args)
        except Exception as exc:
            self._error = exc
            if log:
                _log.exception("a task failed")
        finally:
            self._done.set()


@final
class TrioSpawner:
    """Tasks in a trio nursery (the nursery bounds their lifetime)."""

    __slots__ = ("nursery",)

    def __init__(self, nursery: Any) -> None:
        self.nursery = nursery

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any, log: bool = True) -> Task:
        """Start ``fn(*args)`` in the nursery; its exception is recorded, never raised into
        the nursery (and logged when ``log``)."""
        task = _TrioTask()
        self.nursery.start_soon(task.run, fn, args, log)
        return task


def default_spawner(spawner: Spawner | None) -> Spawner:
    """``spawner``, or the asyncio loop's; under trio a nursery must be given."""
    if spawner is not None:
        return spawner
    if current_async_library() == "trio":
        raise RuntimeError("under trio pass spawner=TrioSpawner(nursery)")
    return AsyncioSpawner()


async def join_shielded(tasks: Iterable[Task]) -> None:
    """Wait for ``tasks`` even while the caller is being cancelled (cleanup paths)."""
    pending = [task for task in tasks if not task.done]
    if not pending:
        return
    if current_async_library() == "trio":
        with _trio().CancelScope(shield=True):
            for task in pending:
                await task.join()
        return
    for task in pending:
        await task.join()


async def race(spawner: Spawner, *fns: Callable[[], Awaitable[object]]) -> None:
    """Run ``fns`` concurrently until the first one returns or raises; cancel and join the
    others; re-raise the first failure."""
    finished = new_event()

    async def notify(fn: Callable[[], Awaitable[object]]) -> None:
        try:
            await fn()
        finally:
            finished.set()

    tasks = [spawner.spawn(notify, fn, log=False) for fn in fns]
    try:
        await finished.wait()
    finally:
        for task in tasks:
            task.cancel()
        await join_shielded(tasks)
    for task in tasks:
        if task.error is not None:
            raise task.error
