"""Completion credits: a counting semaphore that bounds accepted work end to end.

Why (spec 4.3): the submission queue only bounds work that is *waiting*. A credit is reserved
when an operation is admitted and travels with it: through the driver, into the completion
queue, and to the application, which frees it by consuming the completion. So the number of
credits bounds every accepted command and every retained buffer across their whole life, and
the driver can always place a terminal completion for each of them.

A second pool of the same type (``EVENT_CREDIT_CAPACITY`` credits in the endpoint) is used for
unsolicited lifecycle events (connection established, incoming stream, driver stopped, ...), so
events never starve the application's operations and vice versa.

``try_acquire`` never blocks. A permit releases exactly once (a second ``release()`` is a
harmless no-op). Each release signals the pool's notifier and its ``released`` wakeup, which is
how a blocked submitter waits for a credit instead of spinning.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import TracebackType
from typing import final

from chrysalis.core.completion._notify import NOOP_NOTIFIER, Notifier, _fanout
from chrysalis.core.completion._wakeup import Wakeup

__all__ = ["EVENT_CREDIT_CAPACITY", "CompletionCredits", "CreditPermit", "CreditStatistics"]

_new = object.__new__

EVENT_CREDIT_CAPACITY = 4096
"""Credits of the endpoint's separate pool for unsolicited lifecycle events."""

MAX_CREDIT_CAPACITY = 1 << 24
"""Largest accepted pool capacity (a guard against accidental huge bounds)."""


@dataclass(frozen=True, slots=True)
class CreditStatistics:
    """A snapshot of a credit pool: ``capacity`` credits, ``in_use`` of them held."""

    capacity: int
    in_use: int

    @property
    def available(self) -> int:
        """Credits that ``try_acquire`` could take right now."""
        return self.capacity - self.in_use


@final
class CompletionCredits:
    """A pool of ``capacity`` completion credits. Thread-safe.

    Args:
        capacity: the number of credits (1 to 2**24).
        notifier: signalled on every release (for example the driver's, or a consumer's).
        name: a label for ``repr`` (for example "completion" or "event").
        threadsafe: False promises that the pool and its permits are used from one thread
            only (an inline driver and its application on one event loop): the acquire,
            lease and release paths then skip the lock.
    """

    __slots__ = ("_capacity", "_in_use", "_lock", "_name", "_notify", "_released", "_single")

    def __init__(
        self,
        capacity: int,
        notifier: Notifier = NOOP_NOTIFIER,
        *,
        name: str = "completion",
        threadsafe: bool = True,
    ) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool):
            raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
        if not 1 <= capacity <= MAX_CREDIT_CAPACITY:
            raise ValueError(f"capacity must be in 1..{MAX_CREDIT_CAPACITY}, got {capacity}")
        self._capacity = capacity
        self._in_use = 0
        self._lock = threading.Lock()
        self._single = not threadsafe
        self._name = name
        self._released = Wakeup(threadsafe=threadsafe)
        self._notify = _fanout(notifier, self._released).notify

    @property
    def capacity(self) -> int:
        """The number of credits in the pool."""
        return self._capacity

    @property
    def in_use(self) -> int:
        """Credits held by unreleased permits."""
        with self._lock:
            return self._in_use

    @property
    def available(self) -> int:
        """Credits that ``try_acquire`` could take right now."""
        with self._lock:
            return self._capacity - self._in_use

    @property
    def released(self) -> Wakeup:
        """Notified after every permit release: wait on it to get a credit without spinning."""
        return self._released

    def try_acquire(self) -> CreditPermit | None:
        """Take one credit and return its permit, or None when every credit is held."""
        if self._single:
            if self._in_use >= self._capacity:
                return None
            self._in_use += 1
        else:
            with self._lock:
                if self._in_use >= self._capacity:
                    return None
                self._in_use += 1
        # ``CreditPermit(self)`` without its ``__init__`` frame: one is made per admitted
        # operation (every stream read and write), so this is on the hot path.
        permit: CreditPermit = _new(CreditPermit)
        permit._pool = self
        permit._released = False
        permit._leased = False
        return permit

    def statistics(self) -> CreditStatistics:
        """Return an immutable snapshot of the pool."""
        with self._lock:
            return CreditStatistics(self._capacity, self._in_use)

    def __repr__(self) -> str:
        return f"CompletionCredits({self._name!r}, in_use={self._in_use}/{self._capacity})"


@final
class CreditPermit:
    """One held credit: a reserved terminal-completion slot.

    ``release()`` returns the credit exactly once; later calls do nothing. Usable as a context
    manager. Thread-safe: concurrent releases free the credit once.
    """

    __slots__ = ("_leased", "_pool", "_released")

    def __init__(self, pool: CompletionCredits) -> None:
        self._pool = pool
        self._released = False
        self._leased = False

    @property
    def pool(self) -> CompletionCredits:
        """The pool this permit was taken from."""
        return self._pool

    @property
    def released(self) -> bool:
        """True once the credit went back to the pool."""
        return self._released

    def release(self) -> bool:
        """Return the credit to its pool. True the first time, False afterwards."""
        pool = self._pool
        if pool._single:
            if self._released:
                return False
            self._released = True
            pool._in_use -= 1
            pool._notify()
            return True
        with pool._lock:
            if self._released:
                return False
            self._released = True
            pool._in_use -= 1
        pool._notify()
        return True

    def _lease(self) -> bool:
        """Mark the permit as backing a completion; False if released or already leased."""
        if self._pool._single:
            if self._released or self._leased:
                return False
            self._leased = True
            return True
        with self._pool._lock:
            if self._released or self._leased:
                return False
            self._leased = True
            return True

    def _unlease(self) -> None:
        """Undo ``_lease`` after the completion could not be queued."""
        with self._pool._lock:
            self._leased = False

    def __enter__(self) -> CreditPermit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"CreditPermit({state})"
