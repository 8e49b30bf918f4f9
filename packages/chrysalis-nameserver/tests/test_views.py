"""Read-side views: local resolution, enumeration pages, locator rewriting (spec 1.6, 1.7,
3.3; inventory service.rs, pure parts)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.nameserver import (
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    AdmitLink,
    AppendSnapshotChunk,
    ApplyDelta,
    BeginSnapshot,
    CommitSnapshot,
    EnumerationCursor,
    EnumerationPage,
    EnumerationStale,
    Found,
    Locator,
    Nameserver,
    NotFound,
    ProcEntry,
    Revision,
    clamp_page_limit,
    enumerate_local,
    lookup_local,
    resolve_local,
    rewrite_enumeration,
    rewrite_resolution,
)

AUTH = Pid(b"\x80" * 16)
CHILD = Pid(b"\xc1" * 16)
LINK = LinkId(b"\x01" * 16)
GATEWAY = (Locator(DatagramAddr.inproc(7, 7), 0),)
LOCAL = ProcEntry(AUTH, "self", locators=GATEWAY)


def entry(n: int) -> ProcEntry:
    return ProcEntry(Pid(bytes([n]) * 16), f"n{n}", locators=(Locator(DatagramAddr.inproc(1, n)),))


def directory(*ns_entries: ProcEntry) -> Nameserver:
    ns = Nameserver(AUTH)
    ns.apply(AdmitLink(LINK, CHILD))
    ns.apply(BeginSnapshot(LINK, 1, 0))
    ns.apply(AppendSnapshotChunk(LINK, 1, 0, ns_entries))
    ns.apply(CommitSnapshot(LINK, 1, 1))
    return ns


def test_absent_resolution_uses_local_revision_and_ttl() -> None:
    ns = Nameserver(AUTH)
    assert resolve_local(ns, entry(1).pid) == NotFound(entry(1).pid, Revision(AUTH, 0), 1000)
    assert resolve_local(ns, entry(1).pid, negative_ttl_ms=5) == NotFound(
        entry(1).pid, Revision(AUTH, 0), 5
    )
    with pytest.raises(ValueError, match="negative_ttl_ms"):
        resolve_local(ns, entry(1).pid, negative_ttl_ms=-1)


def test_local_hits_are_authoritative() -> None:
    ns = directory(entry(1))
    assert resolve_local(ns, AUTH, local_entry=LOCAL) == Found(LOCAL, Revision(AUTH, 1))
    assert lookup_local(ns, entry(1).pid) == Found(entry(1), Revision(AUTH, 1))
    assert lookup_local(ns, entry(2).pid, LOCAL) is None
    with pytest.raises(ValueError, match="local_entry"):
        lookup_local(ns, AUTH, entry(3))


def test_rewrites_child_resolution_to_the_local_gateway() -> None:
    ns = directory(entry(1))
    found = resolve_local(ns, entry(1).pid, local_entry=LOCAL)
    rewritten = rewrite_resolution(found, GATEWAY)
    assert isinstance(rewritten, Found)
    assert rewritten.entry == ProcEntry(entry(1).pid, "n1", locators=GATEWAY)
    assert rewritten.revision == found.revision
    missing = resolve_local(ns, entry(9).pid)
    assert rewrite_resolution(missing, GATEWAY) is missing


def test_enumerates_stable_pages_rewrites_locators_and_rejects_stale_cursors() -> None:
    ns = directory(entry(0x90), entry(0x10))
    first = enumerate_local(ns, local_entry=LOCAL, limit=1)
    assert isinstance(first, EnumerationPage)
    assert first.entries == (entry(0x10),)
    assert first.next == EnumerationCursor(Revision(AUTH, 1), entry(0x10).pid)
    second = enumerate_local(ns, local_entry=LOCAL, cursor=first.next, limit=1)
    assert isinstance(second, EnumerationPage)
    assert second.entries == (LOCAL,)
    third = enumerate_local(ns, local_entry=LOCAL, cursor=second.next, limit=1)
    assert isinstance(third, EnumerationPage)
    assert third.entries == (entry(0x90),)
    assert third.next is None
    rewritten = rewrite_enumeration(first, GATEWAY)
    assert isinstance(rewritten, EnumerationPage)
    assert rewritten.entries == (ProcEntry(entry(0x10).pid, "n16", locators=GATEWAY),)
    ns.apply(ApplyDelta(LINK, 1, (entry(0x20),)))
    stale = enumerate_local(ns, cursor=first.next, limit=1)
    assert stale == EnumerationStale(Revision(AUTH, 2))
    assert rewrite_enumeration(stale, GATEWAY) is stale


def test_page_limits_default_and_clamp() -> None:
    assert clamp_page_limit(0) == DEFAULT_PAGE_LIMIT
    assert clamp_page_limit(10) == 10
    assert clamp_page_limit(10**9) == MAX_PAGE_LIMIT
    with pytest.raises(ValueError, match="limit"):
        clamp_page_limit(-1)
    ns = directory(*(ProcEntry(Pid(i.to_bytes(16, "big")), "") for i in range(1, 301)))
    page = enumerate_local(ns)
    assert isinstance(page, EnumerationPage)
    assert len(page.entries) == DEFAULT_PAGE_LIMIT


@settings(max_examples=100, deadline=None)
@given(
    st.sets(st.integers(1, 60), max_size=25),
    st.integers(1, 7),
    st.booleans(),
)
def test_paging_visits_every_entry_once_in_pid_order(
    numbers: set[int], limit: int, with_local: bool
) -> None:
    # The local PID sorts between the entries but is never one of them (not all bytes equal).
    local = ProcEntry(Pid(b"\x20" * 15 + b"\x00"), "self") if with_local else None
    ns = Nameserver(local.pid if local is not None else AUTH)
    ns.apply(AdmitLink(LINK, CHILD))
    ns.apply(BeginSnapshot(LINK, 1, 0))
    ns.apply(AppendSnapshotChunk(LINK, 1, 0, tuple(entry(n) for n in sorted(numbers))))
    ns.apply(CommitSnapshot(LINK, 1, 1))
    seen: list[ProcEntry] = []
    cursor = None
    for _ in range(100):
        page = enumerate_local(ns, local_entry=local, cursor=cursor, limit=limit)
        assert isinstance(page, EnumerationPage)
        assert len(page.entries) <= limit
        seen.extend(page.entries)
        cursor = page.next
        if cursor is None:
            break
    expected = sorted([entry(n) for n in numbers] + ([local] if local else []), key=lambda e: e.pid)
    assert seen == expected
