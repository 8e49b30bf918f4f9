"""Parent and child sessions back to back in memory (through the real codec): the parent's
directory converges to the child's export under random interleavings, lost deltas are repaired
by a resnapshot, and every way a link ends revokes what it published (spec 3.1-3.5;
inventory service.rs and link.rs, pure parts)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.nameserver import (
    Consistency,
    Delta,
    Established,
    Found,
    Labels,
    Locator,
    Nameserver,
    NotFound,
    NsMessage,
    ProcEntry,
    PublicationRejected,
    Reject,
    RejectCode,
    Rejected,
    RemoteProtocolError,
    ResnapshotRequested,
    ResolveCompleted,
    Revision,
    SnapshotChunk,
    Welcome,
    export_view,
)
from chrysalis.nameserver.testing import SessionPair

SETTINGS = settings(max_examples=60, deadline=None)
ROOT = Pid(b"\xaa" * 16)
MIDDLE = Pid(b"\xbb" * 16)
LEAF = Pid(b"\xcc" * 16)
LINK = LinkId(b"\x01" * 16)
LINK2 = LinkId(b"\x02" * 16)
ROOT_ADDR = (Locator(DatagramAddr.inproc(1, 1)),)
MIDDLE_ADDR = (Locator(DatagramAddr.inproc(1, 2)),)
LEAF_ADDR = (Locator(DatagramAddr.inproc(1, 3)),)


def entry(n: int, name: str = "a") -> ProcEntry:
    return ProcEntry(Pid(bytes([n]) * 16), name, Labels({"v": name}), LEAF_ADDR)


def connected(**options: int) -> SessionPair:
    pair = SessionPair(parent_pid=ROOT, child_pid=LEAF, link=LINK, **options)  # type: ignore[arg-type]
    pair.connect()
    pair.run()
    assert isinstance(pair.child.events[0], Established)
    return pair


exports = st.dictionaries(st.integers(1, 8), st.sampled_from(["a", "b", "c"]), max_size=6).map(
    lambda d: [entry(n, name) for n, name in sorted(d.items())]
)


def assert_converged(pair: SessionPair, export: list[ProcEntry]) -> None:
    assert pair.parent.nameserver.snapshot() == tuple(sorted(export, key=lambda e: e.pid))
    assert pair.child.publisher.synchronized
    assert pair.child.publisher.idle
    assert not pair.parent.closed


# --------------------------------------------------------------------------------------------
# Property tests


@SETTINGS
@given(
    st.lists(st.tuples(exports, st.integers(0, 6)), min_size=1, max_size=6),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
)
def test_sessions_converge_under_random_interleavings(
    steps: list[tuple[list[ProcEntry], int]], window: int, rng: random.Random
) -> None:
    pair = SessionPair(parent_pid=ROOT, child_pid=LEAF, link=LINK, max_in_flight=window)
    pair.connect()
    for export, deliveries in steps:
        pair.publish(export)
        for _ in range(deliveries):
            if rng.random() < 0.5:
                pair.step_parent()
            else:
                pair.step_child()
    pair.run(rng)
    # A final poll covers an export changed while the window was full.
    pair.publish(steps[-1][0])
    pair.run(rng)
    assert_converged(pair, steps[-1][0])
    assert pair.parent.failure is None


@SETTINGS
@given(
    st.lists(st.tuples(exports, st.integers(0, 6)), min_size=1, max_size=6),
    st.integers(2, 4),
    st.floats(0.1, 0.6),
    st.randoms(use_true_random=False),
)
def test_dropped_deltas_trigger_resnapshot_and_still_converge(
    steps: list[tuple[list[ProcEntry], int]],
    window: int,
    loss: float,
    rng: random.Random,
) -> None:
    pair = connected(max_in_flight=window)

    def lose_deltas(message: NsMessage) -> bool:
        return isinstance(message, Delta) and rng.random() < loss

    for export, deliveries in steps:
        pair.publish(export)
        for _ in range(deliveries):
            if rng.random() < 0.5:
                pair.step_parent(lose_deltas)
            else:
                pair.step_child()
    pair.run(rng, lose_deltas)
    final = [*steps[-1][0], ProcEntry(Pid(b"\x7f" * 16), "sentinel")]
    pair.publish(final)  # delivered without loss: exposes any earlier gap
    pair.run(rng)
    if not pair.child.publisher.idle:
        # Every delta of a full window was lost: nothing reveals the gap, so the driver's
        # acknowledgement timeout forces a snapshot.
        pair.resync()
        pair.run(rng)
    assert_converged(pair, final)
    assert pair.parent.failure is None


# --------------------------------------------------------------------------------------------
# Examples


def test_a_lost_delta_is_repaired_by_one_snapshot() -> None:
    pair = connected(max_in_flight=3)
    pair.publish([entry(1)])
    pair.publish([entry(1), entry(2)])
    pair.publish([entry(1), entry(2), entry(3)])
    lost: list[NsMessage] = []

    def lose_first_delta(message: NsMessage) -> bool:
        if isinstance(message, Delta) and not lost:
            lost.append(message)
            return True
        return False

    pair.run(drop=lose_first_delta)
    requests = [e for e in pair.child.events if isinstance(e, ResnapshotRequested)]
    assert lost
    assert requests
    assert requests[0].expected_sequence == 1
    snapshots = [m for m in pair.dropped if isinstance(m, SnapshotChunk)]
    assert snapshots == []
    assert_converged(pair, [entry(1), entry(2), entry(3)])


def test_serves_publication_resolution_and_eof_cleanup() -> None:
    root_local = ProcEntry(ROOT, "root", locators=ROOT_ADDR)
    pair = SessionPair(parent_pid=ROOT, child_pid=LEAF, link=LINK, local_entry=root_local)
    pair.connect()
    pair.publish([entry(1), entry(2)])
    pair.run()
    assert_converged(pair, [entry(1), entry(2)])
    missing = Pid(b"\x09" * 16)
    session = pair.child.session
    pair.send_to_parent(session.resolve(1, entry(1).pid), session.resolve(2, missing))
    pair.run()
    answers = {
        e.request: e.resolution for e in pair.child.events if isinstance(e, ResolveCompleted)
    }
    assert answers[1] == Found(entry(1).with_locators(ROOT_ADDR), Revision(ROOT, 1))
    assert answers[2] == NotFound(missing, Revision(ROOT, 1), 1000)
    pair.parent.close()  # the stream ended
    assert pair.parent.nameserver.snapshot() == ()
    assert pair.parent.nameserver.child_links() == {}


def test_identity_mismatch_sends_reject_and_installs_no_link() -> None:
    pair = SessionPair(
        parent_pid=ROOT, child_pid=LEAF, link=LINK, authenticated_child=Pid(b"\xdd" * 16)
    )
    pair.connect()
    pair.run()
    assert pair.child.events == [Rejected(RejectCode.IDENTITY_MISMATCH)]
    assert pair.parent.closed
    assert pair.parent.nameserver.revision == Revision(ROOT, 0)
    assert pair.parent.nameserver.child_links() == {}


def test_duplicate_child_supersedes_and_the_first_gets_already_linked() -> None:
    directory = Nameserver(ROOT)
    links: dict[LinkId, SessionPair] = {}
    first = SessionPair(
        parent_pid=ROOT, child_pid=LEAF, link=LINK, nameserver=directory, links=links
    )
    first.connect()
    first.run()
    second = SessionPair(
        parent_pid=ROOT, child_pid=LEAF, link=LINK2, nameserver=directory, links=links
    )
    second.connect()
    second.run()
    first.run()
    assert isinstance(second.child.events[0], Established)
    assert first.child.events[-1] == Rejected(RejectCode.ALREADY_LINKED)
    assert directory.child_links() == {LEAF: LINK2}


def test_protocol_error_revokes_committed_publications() -> None:
    pair = connected()
    pair.publish([entry(1)])
    pair.run()
    assert len(pair.parent.nameserver) == 1
    pair.send_to_parent(Welcome(3, ROOT, LINK))  # wrong direction
    pair.run()
    assert isinstance(pair.parent.failure, RemoteProtocolError)
    assert pair.parent.closed
    assert pair.parent.nameserver.snapshot() == ()


def test_rejected_publication_sends_no_ack_and_removes_link() -> None:
    pair = connected()
    pair.publish([entry(1)])
    pair.run()
    events = len(pair.child.events)
    pair.send_to_parent(SnapshotChunk(99, 0, (entry(2),)))  # no begin
    pair.run()
    assert isinstance(pair.parent.failure, PublicationRejected)
    # No acknowledgement; the child is told why its link ends (issue 15).
    assert pair.child.events[events:] == [Rejected(RejectCode.UNAVAILABLE)]
    assert pair.parent.nameserver.snapshot() == ()
    assert pair.parent.nameserver.child_links() == {}


def test_recursively_replicates_resolves_and_withdraws_subtree() -> None:
    middle_ns = Nameserver(MIDDLE)
    middle_local = ProcEntry(MIDDLE, "middle", Labels({"role": "mid"}), MIDDLE_ADDR)
    leaf_link = SessionPair(
        parent_pid=MIDDLE,
        child_pid=LEAF,
        link=LINK,
        nameserver=middle_ns,
        local_entry=middle_local,
    )
    up_link = SessionPair(parent_pid=ROOT, child_pid=MIDDLE, link=LINK2)
    leaf_entry = ProcEntry(LEAF, "leaf", Labels({"role": "leaf"}), LEAF_ADDR)
    for pair in (leaf_link, up_link):
        pair.connect()
        pair.run()
    leaf_link.publish([leaf_entry])
    leaf_link.run()
    up_link.publish(export_view(middle_local, middle_ns.snapshot()).values())
    up_link.run()
    root_view = up_link.parent.nameserver
    assert root_view.get(LEAF) == ProcEntry(LEAF, "leaf", Labels({"role": "leaf"}), MIDDLE_ADDR)
    assert root_view.get(MIDDLE) == middle_local
    # The middle answers the leaf with its own locators (it is the leaf's next hop).
    session = leaf_link.child.session
    leaf_link.send_to_parent(session.resolve(1, MIDDLE, Consistency.CACHED))
    leaf_link.run()
    answer = leaf_link.child.events[-1]
    assert isinstance(answer, ResolveCompleted)
    assert isinstance(answer.resolution, Found)
    assert answer.resolution.entry.locators == MIDDLE_ADDR
    # Withdrawal propagates: the leaf's link ends, the middle republishes.
    leaf_link.parent.close()
    up_link.publish(export_view(middle_local, middle_ns.snapshot()).values())
    up_link.run()
    assert root_view.get(LEAF) is None
    assert root_view.snapshot() == (middle_local,)


def test_child_discards_frames_after_a_reject() -> None:
    pair = SessionPair(parent_pid=ROOT, child_pid=LEAF, link=LINK)
    pair.connect()
    pair.send_to_child(Reject(RejectCode.UNAVAILABLE))
    pair.step_child()
    pair.send_to_child(Reject(RejectCode.UNAVAILABLE))
    assert pair.step_child()
    assert pair.child.events == [Rejected(RejectCode.UNAVAILABLE)]
