"""The process's runtime loop: one asyncio event loop on one daemon thread.

Why a background thread: Monarch programs are written in two styles that must both work, plain
synchronous scripts (``mesh.ep.call().get()``) and asyncio programs (``await mesh.ep.call()``),
and actors' own code runs on actor threads. None of those threads can be relied on to run the
runtime's work (routing inbound messages to mailboxes and ports, completing reply futures), so
each process owns exactly one ``RuntimeLoop`` ("one event loop per process") that does only
that work and never runs user code. User threads hand it work with ``call_soon`` (a thread-safe,
FIFO hand-off: callbacks scheduled from one thread run in the order they were scheduled, which
is what keeps per-sender message order). A user ``Future`` is completed *by* the loop and waited
on *outside* it: blocking the loop thread on a ``Future`` would deadlock, and ``Future.get``
refuses to do it.

Lifecycle: the loop starts lazily when a process runtime is created, survives until
``shutdown_context()`` (or interpreter exit), and is a daemon thread so it never keeps a
finished program alive. After ``fork`` the thread does not exist in the child; the client
runtime notices the PID change and builds a new loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["RuntimeLoop", "RuntimeLoopClosedError", "is_runtime_thread"]

T = TypeVar("T")
_log = logging.getLogger("monarch.actor.runtime")
_RUNTIME_THREADS: set[int] = set()


# No RuntimeLoop thread survives a fork, and a child's new threads can reuse the parent's
# thread idents (a zygote-forked worker did): forget them in the child.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_RUNTIME_THREADS.clear)


def is_runtime_thread() -> bool:
    """True on the thread of any live ``RuntimeLoop`` (where blocking would deadlock)."""
    return threading.get_ident() in _RUNTIME_THREADS


class RuntimeLoopClosedError(RuntimeError):
    """Work was handed to a runtime loop that has been stopped."""


class RuntimeLoop:
    """An asyncio event loop running on its own daemon thread.

    ``start()`` launches it (bounded wait for readiness); ``call_soon(fn, *args)`` schedules
    ``fn`` on it from any thread, FIFO per calling thread; ``stop(timeout)`` stops and joins it.
    """

    def __init__(self, name: str = "monarch-runtime") -> None:
        self._name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._ready = threading.Event()
        self._closed = False
        self._ident: int | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop (use only from its own thread or through thread-safe calls)."""
        return self._loop

    @property
    def closed(self) -> bool:
        """True once ``stop`` was called."""
        return self._closed

    def start(self, timeout: float = 5.0) -> None:
        """Start the thread and wait (at most ``timeout`` seconds) until the loop runs."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"runtime loop {self._name!r} did not start within {timeout} s")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._ident = threading.get_ident()
        _RUNTIME_THREADS.add(self._ident)
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_forever()
        finally:
            _RUNTIME_THREADS.discard(self._ident)
            with contextlib.suppress(Exception):
                pending = asyncio.all_tasks(self._loop)
                for task in pending:
                    task.cancel()
                if pending:
                    self._loop.run_until_complete(
                        asyncio.wait(pending, timeout=1.0)  # bounded cleanup
                    )
            self._loop.close()

    def in_loop_thread(self) -> bool:
        """True when called from this loop's thread."""
        return threading.get_ident() == self._ident

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule ``fn(*args)`` on the loop; FIFO with other calls from the same thread."""
        if self._closed:
            raise RuntimeLoopClosedError(f"runtime loop {self._name!r} is stopped")
        try:
            if threading.get_ident() == self._ident:  # same queue, no wake-up write needed
                self._loop.call_soon(fn, *args)
                return
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError as exc:  # the loop closed under us
            raise RuntimeLoopClosedError(str(exc)) from None

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the loop and join its thread (at most ``timeout`` seconds). Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.ident is None:  # never started
            self._loop.close()
            return
        if self._thread.is_alive() and not self.in_loop_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                _log.warning("runtime loop %r did not stop within %.1f s", self._name, timeout)
