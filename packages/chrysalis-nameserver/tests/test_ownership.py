"""Issue 15, items 3 and 5: who may publish a PID, and a restarted child's new link.

The owner of a PID, proven by its certificate on its own link, always wins over an entry
relayed by another link; a child that connects again supersedes its stale link.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    Established,
    Labels,
    Locator,
    Nameserver,
    ProcEntry,
    PublicationAck,
    PublicationAcked,
    Reject,
    RejectCode,
    Rejected,
    RemoveLink,
    Revision,
)
from chrysalis.nameserver.testing import SessionPair

ROOT = Pid(b"\xaa" * 16)
OWNER = Pid(b"\x0b" * 16)  # a pre-issued identity, or a node that is restarting
RELAY = Pid(b"\x0c" * 16)  # another authenticated child
L_RELAY = LinkId(b"\x01" * 16)
L_OWNER = LinkId(b"\x02" * 16)
L_OWNER2 = LinkId(b"\x03" * 16)


def claim(pid: Pid, via: int, name: str = "forged") -> ProcEntry:
    return ProcEntry(pid, name, Labels({"by": name}), (Locator(DatagramAddr.inproc(1, via)),))


def snapshot(
    ns: Nameserver, link: LinkId, sid: int, *entries: ProcEntry, base: int = 0
) -> ApplyEffects:
    ns.apply(BeginSnapshot(link, sid, base))
    ns.apply(AppendSnapshotChunk(link, sid, 0, entries))
    return ns.apply(CommitSnapshot(link, sid, 1))


def test_the_owner_on_its_own_link_replaces_a_relayed_entry() -> None:
    ns = Nameserver(ROOT)
    ns.apply(AdmitLink(L_RELAY, RELAY))
    snapshot(ns, L_RELAY, 1, claim(RELAY, 1, "relay"), claim(OWNER, 1))
    assert ns.owner(OWNER) == L_RELAY  # the squatter got there first
    ns.apply(AdmitLink(L_OWNER, OWNER))
    mine = claim(OWNER, 2, "owner")
    effects = snapshot(ns, L_OWNER, 1, mine)
    assert effects.link_response == PublicationAck(0)
    assert ns.get(OWNER) == mine
    assert ns.owner(OWNER) == L_OWNER
    assert ns.link_pids(L_RELAY) == {RELAY}  # the relayed claim is dropped
    # The relaying child's later removal of the dropped claim is a no-op, not an error...
    assert ns.apply(ApplyDelta(L_RELAY, 1, (), (OWNER,))).link_response == PublicationAck(1)
    assert ns.get(OWNER) == mine
    # ... and its claim is refused (dropped, without ending its link) while the owner is linked.
    assert ns.apply(ApplyDelta(L_RELAY, 2, (claim(OWNER, 1),))).directory_change is None
    snapshot(ns, L_RELAY, 2, claim(RELAY, 1, "relay"), claim(OWNER, 1), base=2)
    assert ns.get(OWNER) == mine
    assert ns.link_pids(L_RELAY) == {RELAY}


def test_an_identical_relayed_entry_is_still_handed_to_its_owner() -> None:
    ns = Nameserver(ROOT)
    ns.apply(AdmitLink(L_RELAY, RELAY))
    same = claim(OWNER, 9, "same")
    snapshot(ns, L_RELAY, 1, same)
    ns.apply(AdmitLink(L_OWNER, OWNER))
    effects = snapshot(ns, L_OWNER, 1, same)
    assert ns.owner(OWNER) == L_OWNER
    assert effects.directory_change is not None
    assert effects.directory_change.upserts == (same,)  # routes move to the owner's link
    ns.apply(RemoveLink(L_RELAY))
    assert ns.get(OWNER) == same


def test_the_owner_takes_over_with_a_delta_too() -> None:
    ns = Nameserver(ROOT)
    ns.apply(AdmitLink(L_RELAY, RELAY))
    snapshot(ns, L_RELAY, 1, claim(OWNER, 1))
    ns.apply(AdmitLink(L_OWNER, OWNER))
    snapshot(ns, L_OWNER, 1)
    mine = claim(OWNER, 2, "owner")
    ns.apply(ApplyDelta(L_OWNER, 1, (mine,)))
    assert ns.get(OWNER) == mine
    assert ns.link_pids(L_RELAY) == frozenset()


def test_two_relayed_claims_still_conflict() -> None:
    ns = Nameserver(ROOT)
    ns.apply(AdmitLink(L_RELAY, RELAY))
    ns.apply(AdmitLink(L_OWNER, OWNER))
    third = Pid(b"\x0d" * 16)
    snapshot(ns, L_RELAY, 1, claim(third, 1))
    ns.apply(BeginSnapshot(L_OWNER, 1, 0))
    ns.apply(AppendSnapshotChunk(L_OWNER, 1, 0, (claim(third, 2),)))
    with pytest.raises(ApplyError) as info:
        ns.apply(CommitSnapshot(L_OWNER, 1, 1))
    assert info.value.kind is ApplyErrorKind.PID_OWNED_BY_ANOTHER_LINK


@settings(max_examples=80, deadline=None)
@given(
    forged=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4),
    owner_first=st.booleans(),
    resnapshots=st.integers(0, 2),
)
def test_whatever_a_relay_publishes_the_linked_owner_is_what_resolves(
    forged: list[str], owner_first: bool, resnapshots: int
) -> None:
    ns = Nameserver(ROOT)
    ns.apply(AdmitLink(L_RELAY, RELAY))
    mine = claim(OWNER, 2, "owner")
    sid = 0
    sequence = 0

    def relay_publishes(name: str) -> None:
        nonlocal sid, sequence
        if sid < resnapshots:
            sid += 1
            sequence = 0
            ns.apply(BeginSnapshot(L_RELAY, sid, 0))
            ns.apply(AppendSnapshotChunk(L_RELAY, sid, 0, (claim(OWNER, 1, name),)))
            ns.apply(CommitSnapshot(L_RELAY, sid, 1))
        else:
            if ns.link_sequence(L_RELAY) is None:
                sid += 1
                ns.apply(BeginSnapshot(L_RELAY, sid, 0))
                ns.apply(CommitSnapshot(L_RELAY, sid, 0))
            sequence += 1
            ns.apply(ApplyDelta(L_RELAY, sequence, (claim(OWNER, 1, name),)))

    if owner_first:
        ns.apply(AdmitLink(L_OWNER, OWNER))
        snapshot(ns, L_OWNER, 1, mine)
    for name in forged:
        relay_publishes(name)
    if not owner_first:
        ns.apply(AdmitLink(L_OWNER, OWNER))
        snapshot(ns, L_OWNER, 1, mine)
    assert ns.get(OWNER) == mine
    assert ns.owner(OWNER) == L_OWNER
    assert OWNER not in ns.link_pids(L_RELAY)


def test_a_squatted_pid_no_longer_locks_its_owner_out_through_sessions() -> None:
    """Session level: a sibling publishes the PID first; the owner's own link still gets
    its entry published (before the fix its snapshot was refused and the link ended)."""
    directory = Nameserver(ROOT)
    links: dict[LinkId, SessionPair] = {}
    squatter = SessionPair(
        parent_pid=ROOT, child_pid=RELAY, link=L_RELAY, nameserver=directory, links=links
    )
    squatter.connect()
    squatter.run()
    squatter.publish([claim(RELAY, 1, "relay"), claim(OWNER, 1)])
    squatter.run()
    assert directory.owner(OWNER) == L_RELAY
    owner = SessionPair(
        parent_pid=ROOT, child_pid=OWNER, link=L_OWNER, nameserver=directory, links=links
    )
    owner.connect()
    owner.run()
    mine = claim(OWNER, 2, "owner")
    owner.publish([mine])
    owner.run()
    assert owner.parent.failure is None
    assert not owner.parent.closed
    assert directory.get(OWNER) == mine
    # The squatter keeps its link; its claim is dropped and stays dropped.
    squatter.publish([claim(RELAY, 1, "relay"), claim(OWNER, 1, "again")])
    squatter.run()
    squatter.publish([claim(RELAY, 1, "relay")])
    squatter.run()
    assert squatter.parent.failure is None
    assert not squatter.parent.closed
    assert directory.get(OWNER) == mine
    assert directory.get(RELAY) == claim(RELAY, 1, "relay")


def test_a_restarted_child_supersedes_its_stale_link_through_sessions() -> None:
    """Issue 15, item 3: the old link is still held by the parent (its QUIC connection has
    not timed out) when the child, restarted with the same identity, connects again."""
    directory = Nameserver(ROOT)
    links: dict[LinkId, SessionPair] = {}
    stale = SessionPair(
        parent_pid=ROOT, child_pid=OWNER, link=L_OWNER, nameserver=directory, links=links
    )
    stale.connect()
    stale.run()
    stale.publish([claim(OWNER, 2, "before"), claim(Pid(b"\x21" * 16), 2, "grandchild")])
    stale.run()
    # The old process dies: nothing more arrives from it for now.
    fresh = SessionPair(
        parent_pid=ROOT, child_pid=OWNER, link=L_OWNER2, nameserver=directory, links=links
    )
    fresh.connect()
    fresh.run()
    assert isinstance(fresh.child.events[0], Established)  # not Rejected(ALREADY_LINKED)
    assert fresh.parent.superseded == L_OWNER
    assert stale.parent.closed
    assert directory.child_links() == {OWNER: L_OWNER2}
    assert directory.snapshot() == ()  # the stale subtree is revoked...
    after = claim(OWNER, 3, "after")
    fresh.publish([after])
    fresh.run()
    assert directory.snapshot() == (after,)  # ... and the new link's subtree published
    assert isinstance(fresh.child.events[-1], PublicationAcked)
    # A late message of the old link is refused and changes nothing.
    revision = directory.revision
    stale.publish([claim(OWNER, 2, "late")])
    stale.run()
    assert directory.snapshot() == (after,)
    assert directory.revision == revision
    # Had the old process been alive, it would have been told why its link ended.
    assert stale.child.events[-1] == Rejected(RejectCode.ALREADY_LINKED)
    assert Revision(ROOT, directory.revision.value) == directory.revision


def test_a_rejected_publication_tells_the_child_why() -> None:
    pair = SessionPair(parent_pid=ROOT, child_pid=RELAY, link=L_RELAY)
    pair.connect()
    pair.run()
    pair.publish([ProcEntry(ROOT, "the parent itself")])  # AUTHORITY_PID: refused
    pair.run()
    assert pair.parent.closed
    assert pair.child.events[-1] == Rejected(RejectCode.UNAVAILABLE)
    assert Reject(RejectCode.UNAVAILABLE) == pair.parent.session.publication_refused()
