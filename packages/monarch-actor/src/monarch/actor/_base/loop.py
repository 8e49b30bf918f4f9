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

Batched wake-ups: ``asyncio``'s ``call_soon_threadsafe`` writes one byte to the loop's self-pipe
on every call, and in a pipelined workload that write was most of a call's cost. ``call_soon``
instead appends to a submission queue (a ``deque`` under a lock) and writes to the self-pipe
only when no drain of that queue is already scheduled: a burst of submissions from any number
of threads costs one write, and the loop runs the whole burst in one callback (``_drain``, at
most ``DRAIN_BATCH`` callbacks before it lets I/O in and goes on). Every ``call_soon``,
whatever its thread, joins that one queue while a drain is pending, so callbacks run in the
order they were submitted (a total order, stronger than the per-thread FIFO promised); each
runs in the ``contextvars`` context of its submitter, as a ``Handle`` would, and an exception
goes to the loop's exception handler without disturbing the rest. ``stop`` refuses later
submissions and the loop thread runs what was already queued before it exits, so nothing
accepted is lost. Bound: ``max_pending`` queued callbacks (``RuntimeLoopOverloadedError``, a
``RuntimeLoopClosedError``, beyond it: callers bounce the work as for a stopped loop). Before,
the hand-off was asyncio's unbounded ready queue, and the bounds sat at the producers (the node
transport's ``max_queued_frames``/``bytes``, mailboxes after delivery); the in-process seam had
none but the loop keeping up. Order is not promised between ``call_soon`` and raw asyncio
hand-offs to ``loop`` (``call_soon_threadsafe``, ``run_coroutine_threadsafe``), which bypass
the queue: use one or the other for work whose order matters.

Lifecycle: the loop starts lazily when a process runtime is created, survives until
``shutdown_context()`` (or interpreter exit), and is a daemon thread so it never keeps a
finished program alive. After ``fork`` the thread does not exist in the child; the client
runtime notices the PID change and builds a new loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import os
import reprlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "DRAIN_BATCH",
    "MAX_PENDING",
    "RuntimeLoop",
    "RuntimeLoopClosedError",
    "RuntimeLoopOverloadedError",
    "is_runtime_thread",
]

T = TypeVar("T")
_log = logging.getLogger("monarch.actor.runtime")
_RUNTIME_THREADS: set[int] = set()
#: Callbacks one drain runs before it yields to I/O and reschedules itself.
DRAIN_BATCH = 1024
#: Default bound of a loop's submission queue (callbacks accepted and not yet run).
MAX_PENDING = 1 << 20


# No RuntimeLoop thread survives a fork, and a child's new threads can reuse the parent's
# thread idents (a zygote-forked worker did): forget them in the child.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_RUNTIME_THREADS.clear)


def is_runtime_thread() -> bool:
    """True on the thread of any live ``RuntimeLoop`` (where blocking would deadlock)."""
    return threading.get_ident() in _RUNTIME_THREADS


class RuntimeLoopClosedError(RuntimeError):
    """Work was handed to a runtime loop that has been stopped."""


class RuntimeLoopOverloadedError(RuntimeLoopClosedError):
    """Work was handed to a runtime loop whose submission queue is full (``max_pending``): the
    loop is not keeping up (or is stuck). A subclass of ``RuntimeLoopClosedError`` so callers
    that bounce work for a closed loop bounce it here too."""


class RuntimeLoop:
    """An asyncio event loop running on its own daemon thread.

    ``start()`` launches it (bounded wait for readiness); ``call_soon(fn, *args)`` schedules
    ``fn`` on it from any thread, FIFO per calling thread; ``stop(timeout)`` stops and joins it.
    """

    def __init__(self, name: str = "monarch-runtime", max_pending: int = MAX_PENDING) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self._name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._ready = threading.Event()
        self._closed = False
        self._ident: int | None = None
        self._max_pending = max_pending
        # The submission queue: (callback, args, context), FIFO. ``_lock`` guards appends,
        # ``_closed`` and ``_scheduled``; only the loop thread pops. ``_scheduled``: a drain is
        # pending or running (then the queue needs no wake-up); False implies an empty queue.
        self._lock = threading.Lock()
        self._queue: collections.deque[
            tuple[Callable[..., Any], tuple[Any, ...], contextvars.Context]
        ] = collections.deque()
        self._scheduled = False
        self._wakeups = 0

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

    @property
    def pending(self) -> int:
        """Callbacks submitted with ``call_soon`` and not yet run (any thread; a snapshot)."""
        return len(self._queue)

    @property
    def wakeups(self) -> int:
        """Self-pipe writes ``call_soon`` made so far (a counter, for tests and benchmarks)."""
        return self._wakeups

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._ident = threading.get_ident()
        _RUNTIME_THREADS.add(self._ident)
        self._loop.call_soon(self._ready.set)
        try:
            self._loop.run_forever()
        finally:
            # Refuse later submissions (``stop`` did already, unless the loop died of an
            # exception), then run what was accepted before (a drain left in the ready queue
            # behind ``loop.stop`` would otherwise never run).
            with self._lock:
                self._closed = True
            with contextlib.suppress(Exception):
                self._drain(final=True)
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
        """Schedule ``fn(*args)`` on the loop from any thread, in submission order.

        ``RuntimeLoopClosedError`` once ``stop`` was called, ``RuntimeLoopOverloadedError``
        when ``max_pending`` callbacks are queued already.
        """
        if self._closed:
            raise RuntimeLoopClosedError(f"runtime loop {self._name!r} is stopped")
        if not self._scheduled and threading.get_ident() == self._ident:
            # The loop thread with nothing queued: straight into the ready queue (only the
            # loop thread clears ``_scheduled``, so nothing can be queued ahead of this).
            self._loop.call_soon(fn, *args)
            return
        context = contextvars.copy_context()
        with self._lock:
            if self._closed:
                raise RuntimeLoopClosedError(f"runtime loop {self._name!r} is stopped")
            queue = self._queue
            if len(queue) >= self._max_pending:
                raise RuntimeLoopOverloadedError(
                    f"runtime loop {self._name!r} has {len(queue)} callbacks queued "
                    f"(max_pending {self._max_pending}): it is not keeping up"
                )
            queue.append((fn, args, context))
            if self._scheduled:
                return  # a drain is pending (it runs this too): no second wake-up
            # Scheduled under the lock: once a submitter returns, the drain that will run its
            # callback is in the loop's ready queue (ahead of any I/O it causes later).
            try:
                if threading.get_ident() == self._ident:
                    self._loop.call_soon(self._drain)
                else:
                    self._loop.call_soon_threadsafe(self._drain)
                    self._wakeups += 1
            except RuntimeError as exc:  # the asyncio loop closed under us
                queue.pop()
                raise RuntimeLoopClosedError(str(exc)) from None
            self._scheduled = True

    def _drain(self, final: bool = False) -> None:
        """Run queued callbacks in order (loop thread): until the queue is empty, or
        ``DRAIN_BATCH`` of them ran (then reschedule, letting I/O in). ``final``: after the
        loop stopped, run everything left."""
        queue = self._queue
        budget = DRAIN_BATCH
        while final or budget > 0:
            try:
                fn, args, context = queue.popleft()
            except IndexError:
                with self._lock:
                    if queue:  # appended between the popleft and the lock
                        continue
                    self._scheduled = False
                return
            budget -= 1
            try:
                context.run(fn, *args)
            except (SystemExit, KeyboardInterrupt) as exc:
                if final:  # the loop is gone already: nothing left to end
                    _log.warning(
                        "a callback raised %r after runtime loop %r stopped", exc, self._name
                    )
                    continue
                with self._lock:  # as asyncio does: propagate; what is queued still runs
                    if queue:
                        self._loop.call_soon(self._drain)
                    else:
                        self._scheduled = False
                raise
            except BaseException as exc:
                self._loop.call_exception_handler(
                    {
                        "message": f"Exception in callback {fn!r}{reprlib.repr(args)}",
                        "exception": exc,
                    }
                )
        self._loop.call_soon(self._drain)  # ``_scheduled`` stays True: no wake-up needed

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the loop and join its thread (at most ``timeout`` seconds). Idempotent.

        Callbacks accepted before ``stop`` still run (on the loop thread, before it exits);
        ``call_soon`` refuses later ones."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.ident is None:  # never started
            if self._queue:
                _log.warning(
                    "runtime loop %r stopped before it started: %d queued callbacks dropped",
                    self._name,
                    len(self._queue),
                )
                self._queue.clear()
            self._loop.close()
            return
        if self._thread.is_alive() and not self.in_loop_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                _log.warning("runtime loop %r did not stop within %.1f s", self._name, timeout)
