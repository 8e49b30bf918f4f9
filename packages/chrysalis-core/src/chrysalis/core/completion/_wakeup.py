"""``Wakeup``: one notifier that threads, asyncio tasks and trio tasks can all wait on.

Why: the driver may run on its own OS thread while the application runs asyncio, trio or plain
threads. The queues, credit pools and byte budgets of this package only know the ``Notifier``
protocol; ``Wakeup`` is the bridge that turns those signals into a wait for any runtime, without
importing a runtime: the asyncio and trio waiting code lives in ``_wakeup_asyncio`` and
``_wakeup_trio`` and is imported on the first ``await``.

Lost-wakeup safety uses an epoch (sequence) counter. Every ``notify()`` increments the epoch.
A waiter first snapshots ``epoch()``, then checks the state it cares about, and only if that
check failed waits with ``since=snapshot``. The wait returns at once when the epoch already
moved, so a ``notify()`` that lands between "check" and "sleep" is never lost::

    while True:
        seen = wakeup.epoch()
        item = queue.try_pop()
        if item is not None:
            break
        wakeup.wait(seen, timeout=1.0)      # or: await wakeup.wait_async(seen)

A notification wakes every current waiter (broadcast); each re-checks its own condition.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import final

from chrysalis.core._async_library import current_async_library
from chrysalis.core.completion._errors import TooManyWaiters

__all__ = ["DEFAULT_MAX_WAITERS", "Wakeup", "WakeupStatistics"]

DEFAULT_MAX_WAITERS = 65_536
"""Default bound on the coroutines that may wait on one ``Wakeup`` at the same time."""

_WakeCallback = Callable[[], None]


@dataclass(frozen=True, slots=True)
class WakeupStatistics:
    """A snapshot of a ``Wakeup``.

    Attributes:
        epoch: the number of ``notify()`` calls so far.
        thread_waiters: OS threads blocked in ``wait``.
        async_waiters: asyncio or trio tasks suspended in ``wait_async``.
    """

    epoch: int
    thread_waiters: int
    async_waiters: int


@final
class Wakeup:
    """A thread-safe ``Notifier`` that plain threads, asyncio tasks and trio tasks can wait on.

    ``notify()`` never blocks on a waiter and never runs waiter code: sleeping threads are
    signalled through a condition variable, coroutines are woken through their event loop's
    thread-safe scheduling call (``call_soon_threadsafe`` / ``TrioToken.run_sync_soon``).

    Args:
        max_waiters: the most coroutines that may wait at once; one more raises
            ``TooManyWaiters`` (threads are bounded by the threads that exist).
        threadsafe: False promises that every call comes from one thread (an inline driver
            and its application on one event loop): ``notify`` then skips its lock.
    """

    __slots__ = (
        "_async_waiters",
        "_cond",
        "_epoch",
        "_lock",
        "_max_waiters",
        "_single",
        "_sleepers",
    )

    def __init__(self, *, max_waiters: int = DEFAULT_MAX_WAITERS, threadsafe: bool = True) -> None:
        if max_waiters < 1:
            raise ValueError(f"max_waiters must be at least 1, got {max_waiters}")
        self._single = not threadsafe
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._epoch = 0
        self._sleepers = 0
        self._async_waiters: dict[_WakeCallback, None] = {}
        self._max_waiters = max_waiters

    def notify(self) -> None:
        """Increment the epoch and wake every current waiter. Safe from any thread (from
        the owning thread only when made with ``threadsafe=False``)."""
        if self._single and not self._sleepers:
            # One thread: nothing can race (a lock costs as much as a few Python calls).
            self._epoch += 1
            waiters = self._async_waiters
            if waiters:
                self._async_waiters = {}
                for wake in waiters:
                    wake()
            return
        with self._lock:
            self._epoch += 1
            if self._sleepers:
                self._cond.notify_all()
            waiters = self._async_waiters
            if waiters:
                self._async_waiters = {}
        if waiters:
            for wake in waiters:
                wake()

    def epoch(self) -> int:
        """The number of notifications so far; snapshot it *before* checking state."""
        # No lock: reading one int attribute is atomic, and a snapshot that misses a notify
        # racing with this call only makes the caller's wait return at once (never sleep
        # through a change). Every admission attempt takes one or more snapshots, so this is
        # on the hot path.
        return self._epoch

    def wait(self, since: int, timeout: float | None = None) -> bool:
        """Block this thread until the epoch differs from ``since`` or ``timeout`` elapses.

        Returns True when the epoch moved (possibly before the call), False on timeout.
        ``timeout=None`` waits without limit. Do not call this from an event loop thread.
        """
        with self._cond:
            if self._epoch != since:
                return True
            self._sleepers += 1
            try:
                return self._cond.wait_for(lambda: self._epoch != since, timeout)
            finally:
                self._sleepers -= 1

    async def wait_async(self, since: int) -> None:
        """Suspend the current asyncio or trio task until the epoch differs from ``since``.

        The running library is detected per call. Always a scheduling point (it yields once
        even when the epoch already moved). Cancel it with the runtime's own tools
        (``asyncio.timeout``, ``trio.move_on_after``); a cancelled wait leaves no waiter behind.
        """
        if current_async_library("wait_async") == "trio":
            from chrysalis.core.completion._wakeup_trio import wait_trio

            await wait_trio(self, since)
        else:
            from chrysalis.core.completion._wakeup_asyncio import wait_asyncio

            await wait_asyncio(self, since)

    def statistics(self) -> WakeupStatistics:
        """Return an immutable snapshot of the epoch and the waiter counts."""
        with self._lock:
            return WakeupStatistics(self._epoch, self._sleepers, len(self._async_waiters))

    def __repr__(self) -> str:
        return f"Wakeup(epoch={self._epoch})"

    # Runtime adapters (``_wakeup_asyncio``, ``_wakeup_trio``) use the two methods below.

    def _register(self, since: int, wake: _WakeCallback) -> bool:
        """Add ``wake`` unless the epoch already moved; False means "do not sleep"."""
        with self._lock:
            if self._epoch != since:
                return False
            if len(self._async_waiters) >= self._max_waiters:
                raise TooManyWaiters(self._max_waiters)
            self._async_waiters[wake] = None
            return True

    def _unregister(self, wake: _WakeCallback) -> None:
        """Remove ``wake`` if a notification has not already taken it."""
        with self._lock:
            self._async_waiters.pop(wake, None)
