"""The authoritative directory ``Nameserver`` (spec 2.1; inventory state.rs)."""

from __future__ import annotations

import pickle

import pytest

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.nameserver import (
    AdmitLink,
    AppendSnapshotChunk,
    ApplyDelta,
    ApplyEffects,
    ApplyError,
    ApplyErrorKind,
    BeginSnapshot,
    CommitSnapshot,
    DirectoryChange,
    LinkIdAllocator,
    Locator,
    Nameserver,
    ProcEntry,
    PublicationAck,
    RemoveLink,
    ResnapshotRequired,
    Revision,
)

AUTH = Pid(b"\xaa" * 16)
CHILD = Pid(b"\xc1" * 16)
OTHER_CHILD = Pid(b"\xc2" * 16)
L1 = LinkId(b"\x01" * 16)
L2 = LinkId(b"\x02" * 16)
K = ApplyErrorKind


def pid(n: int) -> Pid:
    return Pid(bytes([n]) * 16)


def entry(n: int, name: str = "n") -> ProcEntry:
    return ProcEntry(pid(n), name, locators=(Locator(DatagramAddr.inproc(1, n)),))


def error_kind(ns: Nameserver, command: object) -> ApplyErrorKind:
    with pytest.raises(ApplyError) as info:
        ns.apply(command)  # type: ignore[arg-type]
    return info.value.kind


def admitted(*links: tuple[LinkId, Pid]) -> Nameserver:
    ns = Nameserver(AUTH)
    for link, child in links or ((L1, CHILD),):
        assert ns.apply(AdmitLink(link, child)).is_empty
    return ns


def publish_snapshot(
    ns: Nameserver, link: LinkId, snapshot: int, base: int, *chunks: tuple[ProcEntry, ...]
) -> ApplyEffects:
    assert ns.apply(BeginSnapshot(link, snapshot, base)).is_empty
    for index, chunk in enumerate(chunks):
        assert ns.apply(AppendSnapshotChunk(link, snapshot, index, chunk)).is_empty
    return ns.apply(CommitSnapshot(link, snapshot, len(chunks)))


def test_snapshot_is_invisible_until_commit_and_acknowledged_afterward() -> None:
    ns = admitted()
    assert ns.apply(BeginSnapshot(L1, 1, 0)).is_empty
    assert ns.apply(AppendSnapshotChunk(L1, 1, 0, (entry(1), entry(2)))).is_empty
    assert ns.snapshot() == ()
    assert ns.revision == Revision(AUTH, 0)
    effects = ns.apply(CommitSnapshot(L1, 1, 1))
    assert effects.link_response == PublicationAck(0)
    assert effects.directory_change == DirectoryChange(
        L1, Revision(AUTH, 1), (entry(1), entry(2)), ()
    )
    assert ns.snapshot() == (entry(1), entry(2))
    assert ns.owner(pid(1)) == L1
    replay = ns.apply(CommitSnapshot(L1, 1, 1))
    assert replay == ApplyEffects(None, PublicationAck(0))
    assert ns.revision.value == 1


def test_replacement_snapshot_keeps_old_state_until_atomic_commit() -> None:
    ns = admitted()
    publish_snapshot(ns, L1, 1, 0, (entry(1), entry(2)))
    ns.apply(BeginSnapshot(L1, 2, 0))
    ns.apply(AppendSnapshotChunk(L1, 2, 0, (entry(2, "changed"), entry(3))))
    assert ns.snapshot() == (entry(1), entry(2))
    effects = ns.apply(CommitSnapshot(L1, 2, 1))
    assert effects.directory_change == DirectoryChange(
        L1, Revision(AUTH, 2), (entry(2, "changed"), entry(3)), (pid(1),)
    )
    assert ns.snapshot() == (entry(2, "changed"), entry(3))
    assert ns.link_pids(L1) == {pid(2), pid(3)}


def test_identical_replacement_snapshot_changes_nothing_but_acks() -> None:
    ns = admitted()
    publish_snapshot(ns, L1, 1, 0, (entry(1),))
    effects = publish_snapshot(ns, L1, 2, 0, (entry(1),))
    assert effects == ApplyEffects(None, PublicationAck(0))
    assert ns.revision.value == 1


def test_snapshot_chunks_require_order_and_exact_replays() -> None:
    ns = admitted()
    ns.apply(BeginSnapshot(L1, 1, 0))
    assert error_kind(ns, AppendSnapshotChunk(L1, 1, 1, (entry(1),))) is K.UNEXPECTED_SNAPSHOT_CHUNK
    ns.apply(AppendSnapshotChunk(L1, 1, 0, (entry(1),)))
    assert ns.apply(AppendSnapshotChunk(L1, 1, 0, (entry(1),))).is_empty
    assert error_kind(ns, AppendSnapshotChunk(L1, 1, 0, (entry(2),))) is K.CONFLICTING_REPLAY
    assert error_kind(ns, AppendSnapshotChunk(L1, 1, 1, (entry(1),))) is K.DUPLICATE_PID
    assert error_kind(ns, AppendSnapshotChunk(L1, 1, 1, (entry(2), entry(2)))) is K.DUPLICATE_PID
    ns.apply(AppendSnapshotChunk(L1, 1, 1, (entry(2),)))
    assert ns.apply(CommitSnapshot(L1, 1, 2)).link_response == PublicationAck(0)


def test_empty_snapshot_commits_without_chunks() -> None:
    ns = admitted()
    effects = publish_snapshot(ns, L1, 1, 5)
    assert effects == ApplyEffects(None, PublicationAck(5))
    assert ns.link_sequence(L1) == 5


def test_link_and_snapshot_incarnations_cannot_regress() -> None:
    ns = admitted()
    assert ns.apply(AdmitLink(L1, CHILD)).is_empty
    assert error_kind(ns, AdmitLink(L1, OTHER_CHILD)) is K.LINK_ALREADY_EXISTS
    publish_snapshot(ns, L1, 1, 4, (entry(1),))
    assert ns.apply(BeginSnapshot(L1, 1, 4)).is_empty  # replay of the committed begin
    assert ns.apply(CommitSnapshot(L1, 1, 1)).link_response == PublicationAck(4)
    with pytest.raises(ApplyError) as info:
        ns.apply(BeginSnapshot(L1, 2, 3))
    assert info.value.kind is K.STALE_PUBLICATION_SEQUENCE
    assert (info.value.expected, info.value.actual) == (4, 3)
    ns.apply(BeginSnapshot(L1, 3, 4))
    assert ns.apply(BeginSnapshot(L1, 3, 4)).is_empty
    assert error_kind(ns, BeginSnapshot(L1, 3, 5)) is K.CONFLICTING_REPLAY


def test_delta_gap_requests_snapshot_and_contiguous_delta_is_atomic() -> None:
    ns = admitted()
    publish_snapshot(ns, L1, 1, 10, (entry(1), entry(2)))
    assert ns.apply(ApplyDelta(L1, 12, (entry(3),))) == ApplyEffects(None, ResnapshotRequired(11))
    assert ns.snapshot() == (entry(1), entry(2))
    effects = ns.apply(ApplyDelta(L1, 11, (entry(3), entry(1)), (pid(2),)))
    assert effects.link_response == PublicationAck(11)
    assert effects.directory_change == DirectoryChange(
        L1, Revision(AUTH, 2), (entry(3),), (pid(2),)
    )
    assert ns.snapshot() == (entry(1), entry(3))
    replay = ns.apply(ApplyDelta(L1, 11, (entry(3), entry(1)), (pid(2),)))
    assert replay == ApplyEffects(None, PublicationAck(11))
    assert ns.apply(ApplyDelta(L1, 7, (entry(9),))) == ApplyEffects(None, PublicationAck(11))
    assert error_kind(ns, ApplyDelta(L1, 11, (entry(4),))) is K.CONFLICTING_REPLAY
    assert ns.revision.value == 2


def test_unchanged_delta_acks_without_revision_bump() -> None:
    ns = admitted()
    publish_snapshot(ns, L1, 1, 0, (entry(1),))
    effects = ns.apply(ApplyDelta(L1, 1, (entry(1),)))
    assert effects == ApplyEffects(None, PublicationAck(1))
    assert ns.revision.value == 1
    assert ns.link_sequence(L1) == 1


def test_delta_is_rejected_while_replacement_snapshot_is_staging() -> None:
    ns = admitted()
    publish_snapshot(ns, L1, 1, 0, (entry(1),))
    ns.apply(BeginSnapshot(L1, 2, 0))
    assert error_kind(ns, ApplyDelta(L1, 1, (entry(2),))) is K.SNAPSHOT_IN_PROGRESS


def test_publication_conflicts_are_rejected_without_partial_changes() -> None:
    ns = admitted((L1, CHILD), (L2, OTHER_CHILD))
    publish_snapshot(ns, L1, 1, 0, (entry(1),))
    ns.apply(BeginSnapshot(L2, 1, 0))
    ns.apply(AppendSnapshotChunk(L2, 1, 0, (entry(2), entry(1))))
    assert error_kind(ns, CommitSnapshot(L2, 1, 1)) is K.PID_OWNED_BY_ANOTHER_LINK
    assert ns.snapshot() == (entry(1),)
    assert ns.revision.value == 1
    assert ns.link_pids(L2) == frozenset()


def test_invalid_deltas_cannot_modify_another_links_state() -> None:
    ns = admitted((L1, CHILD), (L2, OTHER_CHILD))
    publish_snapshot(ns, L1, 1, 0, (entry(1),))
    publish_snapshot(ns, L2, 1, 0, (entry(2),))
    before = (ns.snapshot(), ns.revision)
    assert error_kind(ns, ApplyDelta(L2, 1, (entry(1, "stolen"),))) is K.PID_OWNED_BY_ANOTHER_LINK
    assert error_kind(ns, ApplyDelta(L2, 1, (), (pid(1),))) is K.PID_NOT_OWNED_BY_LINK
    assert (
        error_kind(ns, ApplyDelta(L2, 1, (entry(3),), (pid(3),))) is K.PID_BOTH_UPSERTED_AND_REMOVED
    )
    assert error_kind(ns, ApplyDelta(L2, 1, (), (pid(2), pid(2)))) is K.DUPLICATE_PID
    assert error_kind(ns, ApplyDelta(L2, 1, (entry(3), entry(3)))) is K.DUPLICATE_PID
    assert (ns.snapshot(), ns.revision) == before
    assert ns.link_sequence(L2) == 0


def test_incomplete_or_wrong_snapshot_cannot_become_visible() -> None:
    ns = admitted()
    ns.apply(BeginSnapshot(L1, 1, 0))
    ns.apply(AppendSnapshotChunk(L1, 1, 0, (entry(1),)))
    with pytest.raises(ApplyError) as info:
        ns.apply(CommitSnapshot(L1, 1, 2))
    assert info.value.kind is K.INCOMPLETE_SNAPSHOT
    assert error_kind(ns, CommitSnapshot(L1, 2, 1)) is K.WRONG_SNAPSHOT
    assert error_kind(ns, AppendSnapshotChunk(L1, 2, 1, (entry(2),))) is K.WRONG_SNAPSHOT
    assert ns.snapshot() == ()
    fresh = admitted()
    assert error_kind(fresh, CommitSnapshot(L1, 1, 0)) is K.WRONG_SNAPSHOT
    assert error_kind(fresh, AppendSnapshotChunk(L1, 1, 0, (entry(1),))) is K.WRONG_SNAPSHOT


def test_removing_link_revokes_every_owned_entry_once() -> None:
    ns = admitted()
    publish_snapshot(ns, L1, 1, 0, (entry(2), entry(1)))
    effects = ns.apply(RemoveLink(L1))
    assert effects == ApplyEffects(DirectoryChange(L1, Revision(AUTH, 2), (), (pid(1), pid(2))))
    assert ns.snapshot() == ()
    assert ns.apply(RemoveLink(L1)).is_empty
    assert ns.revision.value == 2
    assert ns.child_links() == {}
    assert ns.apply(AdmitLink(L2, CHILD)).is_empty
    assert ns.child_links() == {CHILD: L2}


def test_removing_link_without_publication_changes_no_revision() -> None:
    ns = admitted()
    ns.apply(BeginSnapshot(L1, 1, 0))
    assert ns.apply(RemoveLink(L1)).is_empty
    assert ns.revision.value == 0
    assert ns.link_child(L1) is None


def test_rejects_reserved_pid_and_delta_without_baseline() -> None:
    with pytest.raises(ApplyError) as info:
        Nameserver(Pid.LINK_LOCAL)
    assert info.value.kind is K.RESERVED_PID
    ns = admitted()
    assert error_kind(ns, AdmitLink(L2, Pid.LINK_LOCAL)) is K.RESERVED_PID
    zero = ProcEntry(Pid.LINK_LOCAL, "zero")
    ns.apply(BeginSnapshot(L1, 1, 0))
    assert error_kind(ns, AppendSnapshotChunk(L1, 1, 0, (zero,))) is K.RESERVED_PID
    fresh = admitted()
    assert fresh.apply(ApplyDelta(L1, 1, (entry(1),))) == ApplyEffects(None, ResnapshotRequired(0))
    assert error_kind(fresh, ApplyDelta(L1, 1, (zero,))) is K.RESERVED_PID


def test_rejects_child_publication_of_authority_pid() -> None:
    ns = admitted()
    mine = ProcEntry(AUTH, "me")
    ns.apply(BeginSnapshot(L1, 1, 0))
    assert error_kind(ns, AppendSnapshotChunk(L1, 1, 0, (mine,))) is K.AUTHORITY_PID
    assert error_kind(ns, ApplyDelta(L1, 1, (mine,))) is K.AUTHORITY_PID


def test_unknown_link_is_rejected() -> None:
    ns = admitted()
    assert error_kind(ns, BeginSnapshot(L2, 1, 0)) is K.UNKNOWN_LINK
    assert error_kind(ns, ApplyDelta(L2, 1)) is K.UNKNOWN_LINK
    assert error_kind(ns, CommitSnapshot(L2, 1, 0)) is K.UNKNOWN_LINK


def test_snapshot_is_pid_ordered_and_excludes_authority() -> None:
    ns = admitted()
    publish_snapshot(ns, L1, 1, 0, (entry(9), entry(3)), (entry(5),))
    assert [e.pid for e in ns.snapshot()] == [pid(3), pid(5), pid(9)]
    assert AUTH not in ns
    assert ns.get(AUTH) is None
    assert ns.resolve(pid(5)) is not None
    assert ns.entries_after(pid(3), 1) == [entry(5)]
    assert ns.entries_after(None, 10) == [entry(3), entry(5), entry(9)]


def test_bounds_are_enforced_atomically() -> None:
    ns = Nameserver(AUTH, max_links=1, max_entries=2, max_staged_entries=3)
    ns.apply(AdmitLink(L1, CHILD))
    assert error_kind(ns, AdmitLink(L2, OTHER_CHILD)) is K.CAPACITY_EXCEEDED
    ns.apply(BeginSnapshot(L1, 1, 0))
    ns.apply(AppendSnapshotChunk(L1, 1, 0, (entry(1), entry(2), entry(3))))
    assert error_kind(ns, AppendSnapshotChunk(L1, 1, 1, (entry(4),))) is K.CAPACITY_EXCEEDED
    assert error_kind(ns, CommitSnapshot(L1, 1, 1)) is K.CAPACITY_EXCEEDED
    assert ns.snapshot() == ()
    publish_snapshot(ns, L1, 2, 0, (entry(1), entry(2)))
    assert error_kind(ns, ApplyDelta(L1, 1, (entry(3),))) is K.CAPACITY_EXCEEDED
    assert ns.apply(ApplyDelta(L1, 1, (entry(3),), (pid(1),))).link_response == PublicationAck(1)
    with pytest.raises(ValueError, match="max_entries"):
        Nameserver(AUTH, max_entries=0)


def test_apply_errors_describe_themselves_and_pickle() -> None:
    ns = admitted()
    publish_snapshot(ns, L1, 1, 0)
    with pytest.raises(ApplyError) as info:
        ns.apply(ApplyDelta(L1, 1, (), (CHILD,)))
    assert str(CHILD) in str(info.value)
    again = pickle.loads(pickle.dumps(info.value))
    assert (again.kind, again.pid, str(again)) == (info.value.kind, CHILD, str(info.value))


def test_allocated_link_ids_are_parent_scoped_and_monotonic() -> None:
    first = LinkIdAllocator(AUTH)
    other = LinkIdAllocator(Pid(b"\xbb" * 16))
    ids = [first.allocate() for _ in range(3)]
    assert ids == [LinkId(AUTH.raw[:8] + n.to_bytes(8, "big")) for n in (1, 2, 3)]
    assert other.allocate() == LinkId(b"\xbb" * 8 + (1).to_bytes(8, "big"))
    assert other.allocate() not in ids
