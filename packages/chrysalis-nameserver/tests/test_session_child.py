"""``ChildSession`` (spec 3.2, 1.5; inventory child.rs)."""

from __future__ import annotations

import pytest

from chrysalis.core import LinkId, Pid
from chrysalis.nameserver import (
    CacheUpdate,
    CacheUpdated,
    ChildSession,
    ChildState,
    Consistency,
    EnumerateCompleted,
    EnumerateResult,
    EnumerationStale,
    Established,
    Found,
    Hello,
    LocalProtocolError,
    NotFound,
    ProcEntry,
    PublicationAck,
    PublicationAcked,
    Reject,
    RejectCode,
    Rejected,
    RemoteProtocolError,
    ResnapshotRequested,
    ResnapshotRequired,
    ResolveCompleted,
    ResolveResult,
    Revision,
    SessionErrorKind,
    SnapshotEnd,
    VersionRange,
    Welcome,
)

CHILD = Pid(b"\xc1" * 16)
PARENT = Pid(b"\xaa" * 16)
IMPOSTOR = Pid(b"\xee" * 16)
LINK = LinkId(b"\x01" * 16)
TARGET = Pid(b"\x07" * 16)
S = SessionErrorKind
ALL_VERSIONS = VersionRange(1, 3)


def established(versions: VersionRange = ALL_VERSIONS) -> ChildSession:
    session = ChildSession(CHILD, PARENT, versions)
    session.hello()
    session.receive(Welcome(versions.max, PARENT, LINK))
    return session


def test_handshake_binds_authenticated_parent_and_version() -> None:
    session = ChildSession(CHILD, PARENT, VersionRange(1, 3))
    assert session.hello() == Hello(VersionRange(1, 3), CHILD)
    assert session.receive(Welcome(2, PARENT, LINK)) == Established(2, LINK)
    assert session.state is ChildState.ACTIVE
    assert (session.version, session.link) == (2, LINK)
    with pytest.raises(LocalProtocolError) as info:
        session.hello()
    assert info.value.kind is S.HELLO_ALREADY_SENT


def test_hello_is_sent_once() -> None:
    session = ChildSession(CHILD, PARENT)
    session.hello()
    with pytest.raises(LocalProtocolError):
        session.hello()


def test_handshake_rejects_parent_and_version_mismatches() -> None:
    session = ChildSession(CHILD, PARENT, VersionRange(1, 3))
    session.hello()
    with pytest.raises(RemoteProtocolError) as mismatch:
        session.receive(Welcome(3, IMPOSTOR, LINK))
    assert mismatch.value.kind is S.PARENT_MISMATCH
    assert session.state is ChildState.CLOSED
    session = ChildSession(CHILD, PARENT, VersionRange(1, 3))
    session.hello()
    with pytest.raises(RemoteProtocolError) as version:
        session.receive(Welcome(4, PARENT, LINK))
    assert version.value.kind is S.UNSUPPORTED_VERSION
    assert "4" in str(version.value)


def test_welcome_before_hello_is_unexpected() -> None:
    session = ChildSession(CHILD, PARENT)
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(Welcome(3, PARENT, LINK))
    assert info.value.kind is S.UNEXPECTED_MESSAGE


def test_rejection_is_terminal() -> None:
    session = ChildSession(CHILD, PARENT)
    session.hello()
    assert session.receive(Reject(RejectCode.ALREADY_LINKED)) == Rejected(RejectCode.ALREADY_LINKED)
    assert session.state is ChildState.CLOSED
    with pytest.raises(LocalProtocolError) as info:
        session.receive(Welcome(3, PARENT, LINK))
    assert info.value.kind is S.CLOSED


def test_publication_messages_require_established_link() -> None:
    session = ChildSession(CHILD, PARENT)
    for build in (
        lambda: session.snapshot_begin(1, 0),
        lambda: session.snapshot_chunk(1, 0, ()),
        lambda: session.snapshot_end(1, 0),
        lambda: session.delta(1),
        lambda: session.resolve(1, TARGET),
        lambda: session.enumerate(2),
    ):
        with pytest.raises(LocalProtocolError) as info:
            build()
        assert info.value.kind is S.NOT_ACTIVE
    session.hello()
    session.receive(Welcome(3, PARENT, LINK))
    assert session.snapshot_end(1, 0) == SnapshotEnd(1, 0)


def test_parent_publication_responses_become_events() -> None:
    session = established()
    assert session.receive(PublicationAck(4)) == PublicationAcked(4)
    assert session.receive(ResnapshotRequired(5)) == ResnapshotRequested(5)


def test_resolution_results_are_correlated_without_overwrite() -> None:
    session = established()
    session.resolve(1, TARGET, Consistency.REFRESH)
    with pytest.raises(LocalProtocolError) as duplicate:
        session.resolve(1, PARENT)
    assert duplicate.value.kind is S.DUPLICATE_REQUEST
    with pytest.raises(LocalProtocolError):
        session.enumerate(1)
    wrong = NotFound(PARENT, Revision(PARENT, 0), 10)
    with pytest.raises(RemoteProtocolError) as mismatch:
        session.receive(ResolveResult(1, wrong))
    assert mismatch.value.kind is S.RESOLUTION_PID_MISMATCH
    assert session.pending_requests == 1  # the pending request was not overwritten
    right = Found(ProcEntry(TARGET, "t"), Revision(PARENT, 3))
    assert session.receive(ResolveResult(1, right)) == ResolveCompleted(1, right)
    with pytest.raises(RemoteProtocolError) as unknown:
        session.receive(ResolveResult(1, right))
    assert unknown.value.kind is S.UNKNOWN_REQUEST
    session.enumerate(2)
    stale = EnumerationStale(Revision(PARENT, 3))
    with pytest.raises(RemoteProtocolError) as not_resolve:
        session.receive(ResolveResult(2, right))
    assert not_resolve.value.kind is S.UNKNOWN_REQUEST
    assert session.receive(EnumerateResult(2, stale)) == EnumerateCompleted(2, stale)
    with pytest.raises(RemoteProtocolError) as unknown_enum:
        session.receive(EnumerateResult(2, stale))
    assert unknown_enum.value.kind is S.UNKNOWN_ENUMERATION_REQUEST


def test_cache_update_and_invalid_direction_are_distinct() -> None:
    session = established()
    update = NotFound(TARGET, Revision(PARENT, 1), 100)
    assert session.receive(CacheUpdate(update)) == CacheUpdated(update)
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(SnapshotEnd(1, 0))
    assert info.value.kind is S.UNEXPECTED_MESSAGE
    with pytest.raises(RemoteProtocolError):
        session.receive(Welcome(3, PARENT, LINK))  # a second welcome


def test_pending_requests_are_bounded() -> None:
    session = ChildSession(CHILD, PARENT, max_pending_requests=1)
    session.hello()
    session.receive(Welcome(3, PARENT, LINK))
    session.resolve(1, TARGET)
    with pytest.raises(LocalProtocolError) as info:
        session.enumerate(2)
    assert info.value.kind is S.TOO_MANY_REQUESTS


def test_reserved_pid_and_close_contracts() -> None:
    with pytest.raises(LocalProtocolError) as info:
        ChildSession(Pid.LINK_LOCAL, PARENT)
    assert info.value.kind is S.RESERVED_PID
    with pytest.raises(LocalProtocolError):
        ChildSession(CHILD, Pid.LINK_LOCAL)
    session = established()
    session.resolve(7, TARGET)
    session.enumerate(8)
    assert session.close() == (7, 8)
    with pytest.raises(LocalProtocolError) as closed:
        session.receive(PublicationAck(1))
    assert closed.value.kind is S.CLOSED
    with pytest.raises(LocalProtocolError):
        session.delta(1)
    with pytest.raises(LocalProtocolError):
        session.hello()
