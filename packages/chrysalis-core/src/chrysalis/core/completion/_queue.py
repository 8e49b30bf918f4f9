"""Bounded multi-producer, single-consumer queue: the conveyor between application and driver.

Why this shape (spec 4.2): the application and the driver hand owned items to each other
through queues that never block and never grow. A full queue refuses the item and hands it
back (``QueueFull``), a closed one too (``QueueClosed``), so ownership is never lost.

Wakeups are edge-triggered to keep them cheap: a push notifies the consumer only on the
empty -> non-empty transition, and a pop notifies ``space_notifier`` only on the full ->
not-full transition. Both calls happen after the lock is released, so a notifier may take its
own locks. A consumer that drains until empty and then sleeps never misses an edge; the
monotonic ``sequence()`` (bumped by every push, close and last-sender drop) lets it detect
arrivals between "check" and "sleep" (see ``Wakeup`` for the pattern).

Lifecycle: senders are counted handles (``clone()`` / ``close()``). The receiver may ``close()``
(admission stops, accepted items stay drainable) or ``discard()`` (close and hand every queued
item back to the caller, who releases what the items own). ``try_push_and_close`` accepts a
terminal item and closes admission in one step, so nothing can be queued after it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar, final

from chrysalis.core.completion._errors import CompletionModelError, QueueClosed, QueueFull
from chrysalis.core.completion._notify import NOOP_NOTIFIER, Notifier

__all__ = ["QueueReceiver", "QueueSender", "QueueStatistics", "bounded_queue"]

T = TypeVar("T")

MAX_QUEUE_CAPACITY = 1 << 24
"""Largest accepted queue capacity (a guard against accidental huge bounds)."""


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    """A snapshot of a bounded queue.

    Attributes:
        capacity: the most items the queue holds at once.
        length: items waiting right now.
        senders: live sender handles.
        admitting: False once the receiver closed or a terminal item closed admission.
        sequence: the arrival/lifecycle sequence counter (see ``QueueReceiver.sequence``).
    """

    capacity: int
    length: int
    senders: int
    admitting: bool
    sequence: int


def _run_detached(discard: Callable[[], object]) -> None:
    # During interpreter finalization no new thread ever runs: on Python 3.11 ``start()`` then
    # waits forever for the thread to report that it started (3.12+ raises RuntimeError). The
    # process is ending anyway, so nothing is released. The check matters because a finalizer
    # created during ``atexit`` (a node still starting when the script ended) is not disarmed
    # by ``weakref.finalize``'s own exit hook, which was then registered too late to run.
    if sys.is_finalizing():
        return
    with contextlib.suppress(RuntimeError):
        threading.Thread(target=discard, name="chrysalis-receiver-drop", daemon=True).start()


def _discard_when_dropped(owner: object, discard: Callable[[], object]) -> None:
    """Run ``discard`` once ``owner`` (a typed receiver) is garbage-collected: the spec's
    "receiver drop closes the queue and releases what is queued".

    ``discard`` must not refer to ``owner``. It runs on a short-lived thread, not in the
    collector's context: the collector can run inside any allocation, including one made while
    this very thread holds a lock that ``discard`` needs (the queue's, a budget's), and running
    it inline there would deadlock. Nothing runs at interpreter exit or during finalization.
    """
    weakref.finalize(owner, _run_detached, discard).atexit = False


def _check_capacity(capacity: int) -> int:
    if not isinstance(capacity, int) or isinstance(capacity, bool):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if not 1 <= capacity <= MAX_QUEUE_CAPACITY:
        raise ValueError(f"capacity must be in 1..{MAX_QUEUE_CAPACITY}, got {capacity}")
    return capacity


@final
class _QueueCore(Generic[T]):
    """Shared state of one queue; all fields are guarded by ``lock``."""

    __slots__ = (
        "admitting",
        "capacity",
        "items",
        "lock",
        "notifier",
        "senders",
        "sequence",
        "single",
        "space_notifier",
    )

    def __init__(
        self,
        capacity: int,
        notifier: Notifier,
        space_notifier: Notifier,
        threadsafe: bool = True,
    ) -> None:
        self.capacity = _check_capacity(capacity)
        self.items: deque[T] = deque()
        self.lock = threading.Lock()
        self.single = not threadsafe  # one thread only: push and drain skip the lock
        self.senders = 1
        self.admitting = True
        self.sequence = 0
        self.notifier = notifier
        self.space_notifier = space_notifier


def bounded_queue(
    capacity: int,
    notifier: Notifier = NOOP_NOTIFIER,
    *,
    space_notifier: Notifier = NOOP_NOTIFIER,
    threadsafe: bool = True,
) -> tuple[QueueSender[T], QueueReceiver[T]]:
    """Create a bounded MPSC queue and return its first sender and its receiver.

    Args:
        capacity: the most items waiting at once (1 to 2**24).
        notifier: the consumer's notifier: signalled on the empty -> non-empty transition,
            on ``try_push_and_close``, on receiver ``close``/``discard`` and when the last
            sender closes.
        space_notifier: signalled on the full -> not-full transition and when the receiver
            closes, so senders waiting for a slot re-check.
        threadsafe: False promises that every handle is used from one thread (an inline
            driver and its application on one event loop): ``try_push`` and ``drain`` then
            skip the lock.
    """
    core: _QueueCore[T] = _QueueCore(capacity, notifier, space_notifier, threadsafe)
    return QueueSender(core), QueueReceiver(core)


@final
class QueueSender(Generic[T]):
    """A counted producer handle of a bounded queue. Thread-safe.

    ``close()`` (or leaving a ``with`` block) drops this handle; when the last handle is
    dropped the consumer is notified and, once drained, sees ``is_closed()``.
    """

    __slots__ = ("_core", "_dropped")

    def __init__(self, core: _QueueCore[T]) -> None:
        self._core = core
        self._dropped = False

    @property
    def capacity(self) -> int:
        """The most items the queue holds at once."""
        return self._core.capacity

    def try_push(self, item: T) -> None:
        """Queue ``item`` or raise ``QueueFull(item)`` / ``QueueClosed(item)``.

        ``None`` is not a valid item (``TypeError``): ``try_pop`` uses it to mean "empty".
        Notifies the consumer only when the queue was empty.
        """
        if item is None:
            raise TypeError("None cannot be queued")
        core = self._core
        if core.single:
            if self._dropped or not core.admitting:
                raise QueueClosed(item)
            items = core.items
            if len(items) >= core.capacity:
                raise QueueFull(item)
            was_empty = not items
            items.append(item)
            core.sequence += 1
        else:
            with core.lock:
                if self._dropped or not core.admitting:
                    raise QueueClosed(item)
                items = core.items
                if len(items) >= core.capacity:
                    raise QueueFull(item)
                was_empty = not items
                items.append(item)
                core.sequence += 1
        if was_empty:
            core.notifier.notify()

    def try_push_and_close(self, item: T) -> None:
        """Queue a terminal ``item`` and close admission atomically; always notifies.

        Raises ``QueueFull(item)`` / ``QueueClosed(item)`` like ``try_push`` (admission then
        stays as it was). After success every ``try_push`` raises ``QueueClosed``.
        """
        if item is None:
            raise TypeError("None cannot be queued")
        core = self._core
        with core.lock:
            if self._dropped or not core.admitting:
                raise QueueClosed(item)
            if len(core.items) >= core.capacity:
                raise QueueFull(item)
            core.items.append(item)
            core.admitting = False
            core.sequence += 1
        core.notifier.notify()
        core.space_notifier.notify()

    def clone(self) -> QueueSender[T]:
        """Return a new sender handle of the same queue (the sender count grows by one)."""
        core = self._core
        with core.lock:
            if self._dropped:
                raise CompletionModelError("cannot clone a closed sender handle")
            core.senders += 1
        return QueueSender(core)

    def close(self) -> None:
        """Drop this handle (idempotent). The last drop bumps the sequence and notifies."""
        core = self._core
        with core.lock:
            if self._dropped:
                return
            self._dropped = True
            core.senders -= 1
            last = core.senders == 0
            if last:
                core.sequence += 1
        if last:
            core.notifier.notify()

    def is_closed(self) -> bool:
        """True when this handle was closed or the queue no longer admits items."""
        core = self._core
        with core.lock:
            return self._dropped or not core.admitting

    def __enter__(self) -> QueueSender[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@final
class QueueReceiver(Generic[T]):
    """The single consumer handle of a bounded queue. Thread-safe."""

    __slots__ = ("_core",)

    def __init__(self, core: _QueueCore[T]) -> None:
        self._core = core

    @property
    def capacity(self) -> int:
        """The most items the queue holds at once."""
        return self._core.capacity

    def try_pop(self) -> T | None:
        """Remove and return the oldest item, or None when the queue is empty."""
        core = self._core
        with core.lock:
            items = core.items
            if not items:
                return None
            was_full = len(items) >= core.capacity
            item = items.popleft()
        if was_full:
            core.space_notifier.notify()
        return item

    def drain(self, max_items: int) -> list[T]:
        """Remove and return up to ``max_items`` of the oldest items (FIFO order)."""
        if max_items < 0:
            raise ValueError(f"max_items must be non-negative, got {max_items}")
        core = self._core
        if not core.items:
            # Empty: no lock needed (an item pushed concurrently is taken by the next drain,
            # exactly as if it had been pushed just after this call).
            return []
        items = core.items
        if core.single:
            was_full = len(items) >= core.capacity
            if len(items) <= max_items:
                out = list(items)
                items.clear()
            else:
                out = [items.popleft() for _ in range(max_items)]
        else:
            with core.lock:
                count = min(max_items, len(items))
                if count == 0:
                    return []
                was_full = len(items) >= core.capacity
                out = [items.popleft() for _ in range(count)]
        if was_full:
            core.space_notifier.notify()
        return out

    def close(self) -> None:
        """Stop admission; accepted items stay drainable. Bumps the sequence and notifies."""
        core = self._core
        with core.lock:
            core.admitting = False
            core.sequence += 1
        core.notifier.notify()
        core.space_notifier.notify()

    def discard(self) -> list[T]:
        """Close admission and remove every queued item, returning them (oldest first).

        The caller owns the returned items and must release what they hold (this is the
        "receiver dropped" path of the spec).
        """
        core = self._core
        with core.lock:
            core.admitting = False
            core.sequence += 1
            out = list(core.items)
            core.items.clear()
        core.notifier.notify()
        core.space_notifier.notify()
        return out

    def sequence(self) -> int:
        """A counter bumped by every push, close and last-sender drop (never decreases)."""
        core = self._core
        with core.lock:
            return core.sequence

    def is_closed(self) -> bool:
        """True when the queue is empty and nothing more can arrive.

        That is: empty, and either every sender handle is closed or admission is closed.
        """
        core = self._core
        if core.admitting and core.senders > 0:
            # Still open (closing never reverts), so not closed, without the lock: this is
            # the answer of every call made before a concurrent close, which is allowed.
            return False
        with core.lock:
            return not core.items and (core.senders == 0 or not core.admitting)

    def is_admitting(self) -> bool:
        """True while senders may still push."""
        core = self._core
        with core.lock:
            return core.admitting and core.senders > 0

    def __len__(self) -> int:
        core = self._core
        with core.lock:
            return len(core.items)

    def statistics(self) -> QueueStatistics:
        """Return an immutable snapshot of the queue."""
        core = self._core
        with core.lock:
            return QueueStatistics(
                capacity=core.capacity,
                length=len(core.items),
                senders=core.senders,
                admitting=core.admitting,
                sequence=core.sequence,
            )
