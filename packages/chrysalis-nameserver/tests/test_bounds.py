"""Issue 15, item 6: an entry that cannot be encoded cannot be built, and the namespace is
bounded by accounted bytes as well as by entries."""

from __future__ import annotations

import contextlib
import gc
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.datagram import Router
from chrysalis.nameserver import (
    DEFAULT_MAX_BYTES,
    MAX_LABELS,
    MAX_LOCATORS_PER_ENTRY,
    MAX_SERVER_NAME_LEN,
    AdmitLink,
    AppendSnapshotChunk,
    ApplyDelta,
    ApplyError,
    ApplyErrorKind,
    BeginSnapshot,
    CommitSnapshot,
    FieldTooLarge,
    InvalidUtf8,
    LabelError,
    LabelErrorKind,
    Labels,
    Locator,
    Nameserver,
    NameserverService,
    NsCodec,
    ProcEntry,
    PublicationRejected,
    RejectCode,
    Rejected,
    RemoveLink,
    RouteSession,
    SnapshotChunk,
    TooManyItems,
    entry_cost,
)
from chrysalis.nameserver.testing import SessionPair

A = Pid(b"\x0a" * 16)


def test_more_than_256_labels_are_refused_where_they_are_given() -> None:
    Labels({f"k{i}": "v" for i in range(MAX_LABELS)})
    with pytest.raises(LabelError, match="too many labels") as info:
        Labels({f"k{i}": "v" for i in range(MAX_LABELS + 1)})
    assert info.value.kind is LabelErrorKind.TOO_MANY_LABELS
    assert "256" in str(info.value)
    with pytest.raises(LabelError):
        Labels((f"k{i}", "") for i in range(10_000))  # an iterable is not read to its end


def test_entry_fields_that_cannot_be_encoded_are_refused_at_construction() -> None:
    ProcEntry(A, "n" * MAX_SERVER_NAME_LEN)
    with pytest.raises(FieldTooLarge, match="tls server name"):
        ProcEntry(A, "n" * (MAX_SERVER_NAME_LEN + 1))
    with pytest.raises(FieldTooLarge):
        ProcEntry(A, "é" * 128)  # 256 UTF-8 bytes
    locators = tuple(Locator(DatagramAddr.inproc(1, i)) for i in range(MAX_LOCATORS_PER_ENTRY + 1))
    ProcEntry(A, "", Labels(), locators[:MAX_LOCATORS_PER_ENTRY])
    with pytest.raises(TooManyItems, match="locators"):
        ProcEntry(A, "", Labels(), locators)
    entry = ProcEntry(A, "x")
    with pytest.raises(TooManyItems):
        entry.with_locators(locators)


label_sets = st.dictionaries(
    st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True),
    st.from_regex(r"([a-z0-9]{1,8})?", fullmatch=True),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(
    label_sets,
    st.text(max_size=300),
    st.integers(0, MAX_LOCATORS_PER_ENTRY + 2),
)
def test_every_entry_that_can_be_built_can_be_encoded(
    labels: dict[str, str], name: str, locators: int
) -> None:
    try:
        entry = ProcEntry(
            A,
            name,
            Labels(labels),
            tuple(Locator(DatagramAddr.inproc(1, i)) for i in range(locators)),
        )
    except (FieldTooLarge, TooManyItems):
        assert len(name.encode("utf-8", "surrogatepass")) > MAX_SERVER_NAME_LEN or (
            locators > MAX_LOCATORS_PER_ENTRY
        )
        return
    with contextlib.suppress(InvalidUtf8):  # lone surrogates are not text
        NsCodec.encode(SnapshotChunk(1, 0, (entry,)))


# --------------------------------------------------------------------------------------------
# The namespace is bounded by accounted bytes


ROOT = Pid(b"\xaa" * 16)
CHILD = Pid(b"\xcc" * 16)
LINK = LinkId(b"\x01" * 16)


def worker(n: int, labels: int = 2) -> ProcEntry:
    return ProcEntry(
        Pid(n.to_bytes(16, "big")),
        f"proc-{n}.example",
        Labels({f"key-{i}": f"v{n}" for i in range(labels)}),
        (Locator(DatagramAddr.udp("10.0.0.2", 4433)),),
    )


def test_entry_cost_grows_with_what_the_entry_holds() -> None:
    small, big = worker(1, 0), worker(1, 200)
    assert 300 < entry_cost(small) < 2_000
    assert entry_cost(big) > entry_cost(small) + 200 * 176
    assert DEFAULT_MAX_BYTES == 256 * 1024 * 1024
    assert Nameserver(ROOT).max_bytes == DEFAULT_MAX_BYTES


def test_a_commit_past_the_byte_bound_is_refused_and_changes_nothing() -> None:
    entries = [worker(n) for n in range(1, 11)]
    budget = sum(entry_cost(e) for e in entries[:5])
    ns = Nameserver(ROOT, max_bytes=budget)
    ns.apply(AdmitLink(LINK, CHILD))
    ns.apply(BeginSnapshot(LINK, 1, 0))
    ns.apply(AppendSnapshotChunk(LINK, 1, 0, tuple(entries[:5])))
    ns.apply(CommitSnapshot(LINK, 1, 1))
    assert ns.bytes_used == budget
    with pytest.raises(ApplyError, match=r"at most .* bytes") as info:
        ns.apply(ApplyDelta(LINK, 1, (entries[5],)))
    assert info.value.kind is ApplyErrorKind.CAPACITY_EXCEEDED
    assert len(ns) == 5
    assert ns.bytes_used == budget
    # Replacing an entry by one of the same size, or removing one, is still possible.
    ns.apply(ApplyDelta(LINK, 1, (), (entries[0].pid,)))
    ns.apply(ApplyDelta(LINK, 2, (entries[5],)))
    assert ns.bytes_used == budget


def test_staged_snapshots_are_bounded_by_bytes_too() -> None:
    entries = tuple(worker(n) for n in range(1, 5))
    ns = Nameserver(ROOT, max_bytes=sum(entry_cost(e) for e in entries[:2]))
    ns.apply(AdmitLink(LINK, CHILD))
    ns.apply(BeginSnapshot(LINK, 1, 0))
    ns.apply(AppendSnapshotChunk(LINK, 1, 0, entries[:2]))
    with pytest.raises(ApplyError) as info:
        ns.apply(AppendSnapshotChunk(LINK, 1, 1, entries[2:]))
    assert info.value.kind is ApplyErrorKind.CAPACITY_EXCEEDED
    assert ns.staged_bytes == sum(entry_cost(e) for e in entries[:2])
    ns.apply(RemoveLink(LINK))
    assert ns.staged_bytes == 0


def service_routes(service: NameserverService) -> RouteSession:
    """Open the link's route session, as ``NameserverService.serve`` does."""
    projector = service._projector
    assert projector is not None
    return projector.open(LINK)


def test_the_publisher_sees_the_refusal_and_the_root_does_not_crash() -> None:
    entries = [worker(n) for n in range(1, 40)]
    directory = Nameserver(ROOT, max_bytes=sum(entry_cost(e) for e in entries[:10]))
    pair = SessionPair(parent_pid=ROOT, child_pid=CHILD, link=LINK, nameserver=directory)
    pair.connect()
    pair.run()
    pair.publish(entries)
    pair.run()
    assert isinstance(pair.parent.failure, PublicationRejected)
    assert pair.parent.failure.cause.kind is ApplyErrorKind.CAPACITY_EXCEEDED
    assert pair.child.events[-1] == Rejected(RejectCode.UNAVAILABLE)
    assert len(directory) == 0
    assert directory.staged_bytes == 0
    assert directory.child_links() == {}


@pytest.mark.parametrize(("labels", "locators"), [(0, 1), (2, 1), (16, 1), (0, 8), (64, 1)])
def test_the_accounted_cost_covers_the_memory_an_entry_really_takes(
    labels: int, locators: int
) -> None:
    """tracemalloc over the root's commit path (decoded entries, directory, routes): the
    accounted cost is at least what the entries take, and not wildly more."""
    n = 400
    entries = tuple(
        ProcEntry(
            Pid(i.to_bytes(16, "big")),
            f"proc-{i}.example",
            Labels({f"key-{j:03d}": f"value-{i}-{j}" for j in range(labels)}),
            tuple(Locator(DatagramAddr.udp("10.0.0.2", 4433 + k), k) for k in range(locators)),
        )
        for i in range(1, n + 1)
    )
    frame = NsCodec.encode(SnapshotChunk(1, 0, entries))
    del entries
    service = NameserverService(ROOT, router=Router())
    service.apply(AdmitLink(LINK, CHILD))
    assert service.apply(BeginSnapshot(LINK, 1, 0)).is_empty
    route_session = service_routes(service)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        decoded = NsCodec.decode(frame)
        assert isinstance(decoded, SnapshotChunk)
        service.apply(AppendSnapshotChunk(LINK, 1, 0, decoded.entries))
        del decoded
        service.apply(CommitSnapshot(LINK, 1, 1))
        gc.collect()
        measured = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    accounted = service.directory.bytes_used / n
    assert len(route_session.installed) == (n if locators else 0)
    assert measured <= accounted <= 2.5 * measured, (measured, accounted)
