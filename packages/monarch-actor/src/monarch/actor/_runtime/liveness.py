"""Liveness of worker processes: heartbeats with a timeout, as two sans-IO state machines.

Why: a process that stops answering (``SIGSTOP``, a debugger, a deadlock with the GIL held, a
frozen host) neither exits nor breaks its links, so nothing else ever tells its peers: on a
direct lane a call to it waited forever. The client therefore pings every worker process it
watches over the path its messages take (lane or QUIC stream, answered by the worker's runtime
loop), and declares a worker dead when it has heard nothing from it for ``timeout`` seconds
(setting ``supervision_watchdog_timeout``). A declared process is *fenced*: everyone refuses its
messages, and the process itself stops sending and exits once it runs again, because the
heartbeats it lives on stopped.

Two machines, time passed in (seconds, any monotonic clock), no I/O:

- ``HeartbeatMonitor`` (the watching side): ``poll(now, timeout)`` says which watched processes
  to ping now and which were silent for ``timeout`` seconds (each declared once, then
  forgotten); ``heard(key, now)`` records an answer; ``next_poll`` says when to poll next.
  Pings go out ``PINGS_PER_TIMEOUT`` times per timeout. If the monitor itself did not run for
  more than half a timeout (its own process stalled), answers may be waiting unread: every
  watched process gets a fresh window instead of being declared on the monitor's account; a
  changed timeout gives a fresh window too (a shorter one must not declare at once what was
  answering at the old pace). A timeout of 0 turns the check off: each watched process gets
  one more ping, carrying that 0, so that its lease is disarmed rather than left to run out.
- ``Lease`` (the watched side): every heartbeat renews it for the timeout it carries. Once that
  time passes without one, the lease is expired for good (latched): the watcher may have
  declared this process dead, so the process must not send anything more and should exit. A
  lease is not armed before its first heartbeat (no watcher, no deadline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Generic, TypeVar

__all__ = ["MAX_WATCHED", "PINGS_PER_TIMEOUT", "Due", "HeartbeatMonitor", "Lease"]

#: Heartbeats sent per timeout: a process is declared after missing about this many.
PINGS_PER_TIMEOUT: Final = 4
#: Processes one monitor watches at most (``watch`` raises ``OverflowError`` beyond).
MAX_WATCHED: Final = 65_536

K = TypeVar("K")


@dataclass(slots=True)
class _Watched:
    last_heard: float
    next_ping: float
    told_off: bool = False  # got a ping since the check was turned off


@dataclass(frozen=True, slots=True)
class Due(Generic[K]):
    """What a ``poll`` asks for: ``pings`` to send now, and ``dead``: the processes silent for
    the timeout, each with how long it was silent (they are no longer watched)."""

    pings: tuple[K, ...]
    dead: tuple[tuple[K, float], ...]


class HeartbeatMonitor(Generic[K]):
    """The watching side (see the module docstring). Not thread-safe: one owner drives it."""

    def __init__(self, max_watched: int = MAX_WATCHED) -> None:
        if max_watched < 1:
            raise ValueError("max_watched must be positive")
        self._max = max_watched
        self._watched: dict[K, _Watched] = {}
        self._last_poll: float | None = None
        self._last_timeout: float | None = None

    def __len__(self) -> int:
        return len(self._watched)

    def __contains__(self, key: object) -> bool:
        return key in self._watched

    def watch(self, key: K, now: float) -> None:
        """Start watching ``key`` (idempotent): pinged at the next poll, declared dead after
        ``timeout`` seconds without an answer."""
        if key in self._watched:
            return
        if len(self._watched) >= self._max:
            raise OverflowError(f"a heartbeat monitor watches at most {self._max} processes")
        if not self._watched:
            self._last_poll = None  # idle until now: that is no stall
        self._watched[key] = _Watched(now, now)

    def forget(self, key: K) -> None:
        """Stop watching ``key`` (idempotent)."""
        self._watched.pop(key, None)

    def heard(self, key: K, now: float) -> None:
        """``key`` answered at ``now`` (ignored when not watched)."""
        watched = self._watched.get(key)
        if watched is not None and now > watched.last_heard:
            watched.last_heard = now

    def poll(self, now: float, timeout: float) -> Due[K]:
        """The pings due at ``now`` and the processes silent for ``timeout`` seconds.
        ``timeout <= 0`` turns the check off: nothing is declared, and each process is pinged
        once more (to carry the 0); it gets a fresh window when the check is turned on again."""
        last, self._last_poll = self._last_poll, now
        changed = self._last_timeout is not None and timeout != self._last_timeout
        self._last_timeout = timeout
        if timeout <= 0:
            off: list[K] = []
            for key, watched in self._watched.items():
                watched.last_heard = max(watched.last_heard, now)
                watched.next_ping = now
                if not watched.told_off:
                    watched.told_off = True
                    off.append(key)
            return Due(tuple(off), ())
        if changed or (last is not None and now - last > timeout / 2):
            # This side did not run for a while (answers may be unread), or the pace changed:
            # a fresh window for all.
            for watched in self._watched.values():
                watched.last_heard = max(watched.last_heard, now)
                watched.next_ping = min(watched.next_ping, now)
        interval = timeout / PINGS_PER_TIMEOUT
        pings: list[K] = []
        dead: list[tuple[K, float]] = []
        for key, watched in list(self._watched.items()):
            watched.told_off = False
            if now >= watched.last_heard + timeout:  # the very sum ``next_poll`` returns
                del self._watched[key]
                dead.append((key, now - watched.last_heard))
            elif now >= watched.next_ping:
                watched.next_ping = now + interval
                pings.append(key)
        return Due(tuple(pings), tuple(dead))

    def next_poll(self, now: float, timeout: float) -> float | None:
        """When the next ping or declaration falls due (``None``: nothing is watched, or the
        check is off)."""
        if not self._watched or timeout <= 0:
            return None
        return max(
            now,
            min(min(w.next_ping, w.last_heard + timeout) for w in self._watched.values()),
        )


class Lease:
    """The watched side (see the module docstring). Renewed on one thread; ``expired`` may be
    asked from any thread (a stale read only moves the answer by the race's microseconds)."""

    __slots__ = ("_expired", "_expiry", "_released")

    def __init__(self) -> None:
        self._expiry: float | None = None
        self._expired = False
        self._released = False

    @property
    def armed(self) -> bool:
        """True once a heartbeat set a deadline (and the check is on)."""
        return self._expiry is not None

    @property
    def expiry(self) -> float | None:
        """When the lease runs out (``None``: not armed)."""
        return self._expiry

    def renew(self, now: float, timeout: float) -> bool:
        """A heartbeat arrived at ``now`` carrying the watcher's ``timeout``: extend the lease,
        or return False if it had already run out (it stays expired). ``timeout <= 0``: the
        watcher turned the check off, the lease is disarmed."""
        if self.expired(now):
            return False
        self._expiry = now + timeout if timeout > 0 and not self._released else None
        return True

    def release(self) -> None:
        """Disarm the lease for good, later heartbeats included, unless it already ran out
        (the owner is stopping this process: no watcher waits for it any more)."""
        if not self._expired:
            self._released = True
            self._expiry = None

    def expired(self, now: float) -> bool:
        """True once the lease ran out before ``now`` without renewal (latched)."""
        if not self._expired and self._expiry is not None and now > self._expiry:
            self._expired = True
        return self._expired
