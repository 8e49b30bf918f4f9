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
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from monarch.actor._base.future import Future, _Cell
from monarch.actor._runtime.context import context

__all__ = ["returns_future"]

P = ParamSpec("P")
T = TypeVar("T")


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
                    target=self._run, args=(body, None), name="monarch-returns-future", daemon=True
                ).start()
        super().add_done_callback(callback)

    def wait(self, timeout: float | None) -> bool:
        body = self._take() if self._body is not None else None
        if body is None:
            return super().wait(timeout)
        if asyncio._get_running_loop() is not None:  # never a second loop inside a running one
            helper = threading.Thread(
                target=self._run, args=(body, timeout), name="monarch-returns-future", daemon=True
            )
            helper.start()
            helper.join()
        else:
            self._run(body, timeout)
        return True

    def _run(self, body: Coroutine[Any, Any, Any], timeout: float | None) -> None:
        """Run the body on a fresh loop of this thread (``asyncio.run``); a timeout publishes
        ``TimeoutError`` first, then cancels the body and drives its cleanup."""

        scopes: list[asyncio.Timeout] = []

        async def bounded() -> Any:
            async with asyncio.timeout(timeout) as scope:
                scopes.append(scope)
                return await body

        runner = asyncio.Runner()
        try:
            with runner:
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
