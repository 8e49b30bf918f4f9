"""The resolver cache of one parent-link incarnation, ``ResolverCache`` (spec 2.2).

Why revision floors: answers from the parent arrive from two sources (correlated
``ResolveResult`` answers and unsolicited ``CacheUpdate`` pushes) and may be reordered with
respect to each other. Each cached answer keeps its revision, and a later answer with a lower
revision is ignored, so the cache never moves backwards within one parent incarnation. Revisions
are only comparable within one authority, so the cache is scoped to one parent PID and answers
from any other authority (for example a root's answer forwarded by the parent) are refused.

Negative answers are valid for ``valid_for_millis`` from when *this* cache received them
(receiver-relative deadlines; clocks are never compared across processes). An exact replay
keeps the original deadline. Expired negatives stay stored as revision floors.

Time is passed in (``now`` in milliseconds of any monotonic clock); nothing here reads a clock.
The cache holds at most ``capacity`` PIDs; inserting a new PID into a full cache evicts the
least recently stored one (its floor is lost, which can only make the cache accept an older
answer for that PID later, never an answer from another authority).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final, final

from chrysalis.core import Pid
from chrysalis.nameserver._errors import CacheError, CacheErrorKind
from chrysalis.nameserver._protocol import U64_MAX, Found, NotFound, Resolution

__all__ = ["DEFAULT_CACHE_CAPACITY", "ResolverCache"]

DEFAULT_CACHE_CAPACITY: Final = 65_536
"""Default bound on PIDs held by a ``ResolverCache``."""


@final
@dataclass(frozen=True, slots=True)
class _Cached:
    result: Resolution
    expires_at: int | None  # None: positive, never expires


def _check_time(now: object) -> int:
    if not isinstance(now, int) or isinstance(now, bool) or not 0 <= now <= U64_MAX:
        raise ValueError(f"now must be an int in 0..{U64_MAX} milliseconds, got {now!r}")
    return now


@final
class ResolverCache:
    """Cached resolutions from one parent authority; see the module docstring.

    ``ResolverCache(authority)`` rejects the link-local PID (``CacheError`` kind
    ``RESERVED_PID``).
    """

    __slots__ = ("_authority", "_capacity", "_entries")

    def __init__(self, authority: Pid, *, capacity: int = DEFAULT_CACHE_CAPACITY) -> None:
        if not isinstance(authority, Pid):
            raise TypeError(f"authority must be a Pid, not {type(authority).__name__}")
        if authority.is_link_local:
            raise CacheError(CacheErrorKind.RESERVED_PID, "the link-local PID is no authority")
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self._authority = authority
        self._capacity = capacity
        self._entries: OrderedDict[Pid, _Cached] = OrderedDict()

    @property
    def authority(self) -> Pid:
        """The parent authority whose answers this cache holds."""
        return self._authority

    @property
    def capacity(self) -> int:
        """The bound on cached PIDs."""
        return self._capacity

    def __len__(self) -> int:
        return len(self._entries)

    def update(self, result: Resolution, now: int) -> bool:
        """Offer an answer received at ``now``; return whether the cache changed.

        ``CacheError``: ``AUTHORITY_MISMATCH`` (the answer's revision is from another
        authority), ``CONFLICTING_REVISION`` (a different answer with the same revision),
        ``DEADLINE_OVERFLOW`` (``now + valid_for_millis`` exceeds a u64). A stale answer
        (lower revision than the stored one) or an exact replay returns ``False``; a replay
        does not extend a negative deadline.
        """
        if not isinstance(result, Found | NotFound):
            raise TypeError(f"result must be Found or NotFound, not {type(result).__name__}")
        now = _check_time(now)
        if result.revision.authority != self._authority:
            raise CacheError(
                CacheErrorKind.AUTHORITY_MISMATCH,
                f"answer from {result.revision.authority}, cache for {self._authority}",
            )
        pid = result.pid
        existing = self._entries.get(pid)
        if existing is not None:
            stored = existing.result.revision.value
            incoming = result.revision.value
            if stored > incoming:
                return False
            if stored == incoming:
                if existing.result == result:
                    return False
                raise CacheError(
                    CacheErrorKind.CONFLICTING_REVISION,
                    f"two different answers for {pid} at revision {incoming}",
                )
        expires_at: int | None = None
        if isinstance(result, NotFound):
            expires_at = now + result.valid_for_millis
            if expires_at > U64_MAX:
                raise CacheError(
                    CacheErrorKind.DEADLINE_OVERFLOW, f"{now} + {result.valid_for_millis}"
                )
        entries = self._entries
        if existing is None and len(entries) >= self._capacity:
            entries.popitem(last=False)
        entries[pid] = _Cached(result, expires_at)
        entries.move_to_end(pid)
        return True

    def resolve(self, pid: Pid, now: int) -> Resolution | None:
        """The cached answer for ``pid`` at ``now``: positive answers always, negative ones
        until their deadline (``now >= expires_at`` is expired)."""
        now = _check_time(now)
        cached = self._entries.get(pid)
        if cached is None:
            return None
        if cached.expires_at is not None and now >= cached.expires_at:
            return None
        return cached.result

    def clear(self) -> None:
        """Forget everything, revision floors included (the parent link closed)."""
        self._entries.clear()
