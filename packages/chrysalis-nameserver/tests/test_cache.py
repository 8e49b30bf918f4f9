"""The resolver cache (spec 2.2; inventory cache.rs)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import Pid
from chrysalis.nameserver import (
    CacheError,
    CacheErrorKind,
    Found,
    NotFound,
    ProcEntry,
    ResolverCache,
    Revision,
)

PARENT = Pid(b"\xaa" * 16)
ROOT = Pid(b"\xbb" * 16)
TARGET = Pid(b"\x01" * 16)
U64_MAX = (1 << 64) - 1


def found(value: int, name: str = "n", pid: Pid = TARGET) -> Found:
    return Found(ProcEntry(pid, name), Revision(PARENT, value))


def not_found(value: int, ttl: int, pid: Pid = TARGET) -> NotFound:
    return NotFound(pid, Revision(PARENT, value), ttl)


def test_positive_updates_are_revision_ordered() -> None:
    cache = ResolverCache(PARENT)
    assert cache.update(found(5), now=0)
    assert cache.resolve(TARGET, now=10**12) == found(5)
    assert not cache.update(found(4, "older"), now=1)
    assert not cache.update(found(5), now=2)
    with pytest.raises(CacheError) as info:
        cache.update(found(5, "different"), now=3)
    assert info.value.kind is CacheErrorKind.CONFLICTING_REVISION
    assert cache.update(found(6, "newer"), now=4)
    assert cache.resolve(TARGET, now=5) == found(6, "newer")


def test_negative_expiry_is_receiver_relative_and_replay_does_not_extend_it() -> None:
    cache = ResolverCache(PARENT)
    assert cache.update(not_found(3, 100), now=1000)
    assert cache.resolve(TARGET, now=1099) == not_found(3, 100)
    assert not cache.update(not_found(3, 100), now=1050)  # replay keeps the first deadline
    assert cache.resolve(TARGET, now=1100) is None
    # The expired answer still acts as a revision floor.
    assert not cache.update(found(2), now=1200)
    assert cache.resolve(TARGET, now=1200) is None
    assert cache.update(found(4), now=1300)
    assert cache.resolve(TARGET, now=1300) == found(4)


def test_validates_authority_deadline_and_link_clear() -> None:
    with pytest.raises(CacheError) as reserved:
        ResolverCache(Pid.LINK_LOCAL)
    assert reserved.value.kind is CacheErrorKind.RESERVED_PID
    cache = ResolverCache(PARENT)
    with pytest.raises(CacheError) as foreign:
        cache.update(Found(ProcEntry(TARGET, "n"), Revision(ROOT, 9)), now=0)
    assert foreign.value.kind is CacheErrorKind.AUTHORITY_MISMATCH
    with pytest.raises(CacheError) as overflow:
        cache.update(not_found(1, 2), now=U64_MAX - 1)
    assert overflow.value.kind is CacheErrorKind.DEADLINE_OVERFLOW
    assert len(cache) == 0
    cache.update(found(7), now=0)
    cache.clear()
    assert cache.resolve(TARGET, now=0) is None
    assert cache.update(found(1), now=0)  # floors are gone too


def test_rejects_invalid_times() -> None:
    cache = ResolverCache(PARENT)
    with pytest.raises(ValueError, match="now"):
        cache.resolve(TARGET, now=-1)
    with pytest.raises(ValueError, match="now"):
        cache.update(found(1), now=U64_MAX + 1)


def test_capacity_evicts_the_least_recently_stored_pid() -> None:
    cache = ResolverCache(PARENT, capacity=2)
    a, b, c = (Pid(bytes([n]) * 16) for n in (1, 2, 3))
    cache.update(found(1, pid=a), now=0)
    cache.update(found(1, pid=b), now=0)
    cache.update(found(2, pid=a), now=0)  # refreshes a
    cache.update(found(1, pid=c), now=0)
    assert len(cache) == 2
    assert cache.resolve(b, now=0) is None
    assert cache.resolve(a, now=0) == found(2, pid=a)
    assert cache.resolve(c, now=0) == found(1, pid=c)


answers = st.one_of(
    st.builds(found, st.integers(0, 5), st.sampled_from(["a", "b"])),
    st.builds(not_found, st.integers(0, 5), st.integers(0, 50)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(answers, st.integers(0, 20)), max_size=12))
def test_cache_never_moves_backwards(updates: list[tuple[Found | NotFound, int]]) -> None:
    cache = ResolverCache(PARENT)
    now = 0
    stored: Found | NotFound | None = None
    stored_at = 0
    for answer, advance in updates:
        now += advance
        value = answer.revision.value
        if stored is not None and value == stored.revision.value and answer != stored:
            with pytest.raises(CacheError) as info:
                cache.update(answer, now)
            assert info.value.kind is CacheErrorKind.CONFLICTING_REVISION
            continue
        changed = cache.update(answer, now)
        assert changed == (stored is None or value > stored.revision.value)
        if changed:
            stored, stored_at = answer, now
        assert stored is not None
        expired = isinstance(stored, NotFound) and now >= stored_at + stored.valid_for_millis
        assert cache.resolve(TARGET, now) == (None if expired else stored)
