"""``ChildPublisher`` and ``export_view``: the publication half of the parent link (spec 3.5;
inventory link.rs, pure parts)."""

from __future__ import annotations

import pytest

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.nameserver import (
    ChildPublisher,
    ChildSession,
    Delta,
    Labels,
    LocalProtocolError,
    Locator,
    NsCodec,
    NsMessage,
    ProcEntry,
    PublicationAcked,
    RemoteProtocolError,
    ResnapshotRequested,
    SessionErrorKind,
    SnapshotBegin,
    SnapshotChunk,
    SnapshotEnd,
    Welcome,
    export_view,
)

CHILD = Pid(b"\xc1" * 16)
PARENT = Pid(b"\xaa" * 16)
LINK = LinkId(b"\x01" * 16)
HERE = (Locator(DatagramAddr.inproc(9, 9), 0),)
S = SessionErrorKind


def entry(n: int, name: str = "n") -> ProcEntry:
    return ProcEntry(Pid(bytes([n]) * 16), name, locators=(Locator(DatagramAddr.inproc(1, n)),))


def publisher(**options: int) -> ChildPublisher:
    session = ChildSession(CHILD, PARENT)
    session.hello()
    session.receive(Welcome(3, PARENT, LINK))
    return ChildPublisher(session, **options)


def kinds(messages: list[NsMessage]) -> list[str]:
    return [type(m).__name__ for m in messages]


def test_export_rewrites_descendants_and_diff_is_deterministic() -> None:
    local = ProcEntry(CHILD, "me", Labels({"role": "mid"}), HERE)
    grandchild = ProcEntry(Pid(b"\x05" * 16), "gc", Labels({"role": "leaf"}), entry(5).locators)
    view = export_view(local, [grandchild])
    assert view[CHILD] is local
    assert view[grandchild.pid] == ProcEntry(grandchild.pid, "gc", Labels({"role": "leaf"}), HERE)
    with pytest.raises(ValueError, match="repeats"):
        export_view(local, [ProcEntry(CHILD, "dup")])
    first = publisher()
    second = publisher()
    for pub in (first, second):
        pub.set_export([entry(3), entry(1), entry(2)])
        pub.start()
        pub.handle(PublicationAcked(0))
        pub.set_export([entry(2, "changed"), entry(4), entry(3)])
    a, b = first.poll(), second.poll()
    assert a == b == [Delta(1, (entry(2, "changed"), entry(4)), (entry(1).pid,))]
    assert [NsCodec.encode(m) for m in a] == [NsCodec.encode(m) for m in b]


def test_initial_snapshot_is_pid_ordered_in_bounded_chunks() -> None:
    pub = publisher(chunk_entries=2)
    pub.set_export([entry(5), entry(1), entry(3), entry(2), entry(4)])
    messages = pub.start()
    assert messages == [
        SnapshotBegin(1, 0),
        SnapshotChunk(1, 0, (entry(1), entry(2))),
        SnapshotChunk(1, 1, (entry(3), entry(4))),
        SnapshotChunk(1, 2, (entry(5),)),
        SnapshotEnd(1, 3),
    ]
    assert (pub.synchronized, pub.idle) == (False, False)
    assert pub.handle(PublicationAcked(0)) == []
    assert (pub.synchronized, pub.idle) == (True, True)


def test_empty_export_sends_a_snapshot_without_chunks() -> None:
    pub = publisher()
    assert pub.start() == [SnapshotBegin(1, 0), SnapshotEnd(1, 0)]


def test_one_update_in_flight_by_default() -> None:
    pub = publisher()
    pub.set_export([entry(1)])
    pub.start()
    pub.set_export([entry(1), entry(2)])
    assert pub.poll() == []  # the snapshot is not acknowledged yet
    assert pub.dirty
    assert pub.handle(PublicationAcked(0)) == [Delta(1, (entry(2),))]
    pub.set_export([entry(2)])
    assert pub.poll() == []
    assert pub.handle(PublicationAcked(1)) == [Delta(2, (), (entry(1).pid,))]
    assert pub.handle(PublicationAcked(2)) == []
    assert pub.idle
    assert pub.sequence == 2


def test_nothing_is_sent_when_nothing_changed() -> None:
    pub = publisher()
    pub.set_export([entry(1)])
    pub.start()
    pub.handle(PublicationAcked(0))
    pub.set_export([entry(1)])
    assert pub.poll() == []
    assert pub.sequence == 0
    assert not pub.dirty


def test_resnapshot_request_restarts_complete_publication() -> None:
    pub = publisher()
    pub.set_export([entry(1)])
    pub.start()
    pub.handle(PublicationAcked(0))
    pub.set_export([entry(1), entry(2)])
    assert pub.poll() == [Delta(1, (entry(2),))]
    pub.set_export([entry(2), entry(3)])
    messages = pub.handle(ResnapshotRequested(1))
    assert messages == [
        SnapshotBegin(2, 1),
        SnapshotChunk(2, 0, (entry(2), entry(3))),
        SnapshotEnd(2, 1),
    ]
    assert (pub.synchronized, pub.idle) == (False, False)
    assert pub.handle(PublicationAcked(1)) == []
    assert (pub.synchronized, pub.idle) == (True, True)


def test_acknowledgement_of_an_unsent_sequence_is_a_protocol_error() -> None:
    pub = publisher()
    with pytest.raises(RemoteProtocolError):
        pub.handle(PublicationAcked(0))  # nothing was published yet
    pub.start()
    with pytest.raises(RemoteProtocolError) as info:
        pub.handle(PublicationAcked(7))
    assert info.value.kind is S.UNEXPECTED_ACK
    pub.handle(PublicationAcked(0))
    assert pub.handle(PublicationAcked(0)) == []  # a repeated cumulative ack is harmless


def test_pipelined_deltas_are_settled_by_one_cumulative_ack() -> None:
    pub = publisher(max_in_flight=3)
    pub.start()
    pub.handle(PublicationAcked(0))
    for n in (1, 2, 3, 4):
        pub.set_export([entry(k) for k in range(1, n + 1)])
        pub.poll()
    assert pub.in_flight == 3
    assert pub.dirty
    assert pub.handle(PublicationAcked(2)) == [Delta(4, (entry(4),))]
    assert pub.in_flight == 2
    pub.handle(PublicationAcked(4))
    assert pub.idle


def test_stale_resnapshot_requests_after_a_gap_cost_one_snapshot() -> None:
    pub = publisher(max_in_flight=4)
    pub.start()
    pub.handle(PublicationAcked(0))
    for n in (1, 2, 3):
        pub.set_export([entry(k) for k in range(1, n + 1)])
        pub.poll()
    # Delta 1 was lost: the parent answers deltas 2 and 3 with ResnapshotRequired(1).
    first = pub.handle(ResnapshotRequested(1))
    assert first[0] == SnapshotBegin(2, 3)
    assert pub.handle(ResnapshotRequested(1)) == []
    assert pub.handle(PublicationAcked(3)) == []
    assert pub.synchronized
    assert pub.idle
    pub.set_export([entry(9)])
    assert pub.poll()[0] == Delta(4, (entry(9),), tuple(entry(k).pid for k in (1, 2, 3)))
    assert pub.handle(ResnapshotRequested(4))[0] == SnapshotBegin(3, 4)


def test_a_delta_too_large_for_one_frame_becomes_a_snapshot() -> None:
    pub = publisher()
    pub.start()
    pub.handle(PublicationAcked(0))
    many = [ProcEntry(Pid(i.to_bytes(16, "big")), "") for i in range(1, 4100)]
    pub.set_export(many)
    messages = pub.poll()
    assert kinds(messages) == ["SnapshotBegin", *["SnapshotChunk"] * 5, "SnapshotEnd"]
    for message in messages:
        NsCodec.encode(message)


def test_start_and_resync_contracts() -> None:
    session = ChildSession(CHILD, PARENT)
    pub = ChildPublisher(session)
    with pytest.raises(LocalProtocolError) as info:
        pub.start()
    assert info.value.kind is S.NOT_ACTIVE
    with pytest.raises(LocalProtocolError):
        pub.resync()
    assert pub.poll() == []
    ready = publisher()
    ready.start()
    with pytest.raises(LocalProtocolError):
        ready.start()
    assert ready.resync()[0] == SnapshotBegin(2, 0)


def test_export_validation_and_bounds() -> None:
    pub = publisher(max_entries=2)
    with pytest.raises(ValueError, match="repeats"):
        pub.set_export([entry(1), entry(1)])
    with pytest.raises(LocalProtocolError) as info:
        pub.set_export([entry(1), entry(2), entry(3)])
    assert info.value.kind is S.EXPORT_TOO_LARGE
    with pytest.raises(ValueError, match="max_in_flight"):
        publisher(max_in_flight=0)
    with pytest.raises(ValueError, match="chunk_entries"):
        publisher(chunk_entries=5000)
