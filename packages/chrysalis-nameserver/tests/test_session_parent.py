"""``ParentSession`` (spec 3.1, 1.5; inventory session.rs)."""

from __future__ import annotations

import pytest

from chrysalis.core import LinkId, Pid
from chrysalis.nameserver import (
    AdmitLink,
    ApplyDelta,
    ApplyEffects,
    ApplyError,
    ApplyErrorKind,
    BeginSnapshot,
    CommitCommand,
    CommitSnapshot,
    Consistency,
    Delta,
    DirectoryChange,
    Enumerate,
    EnumerateForChild,
    EnumerationStale,
    Found,
    Hello,
    LocalProtocolError,
    Nameserver,
    NotFound,
    ParentAction,
    ParentSession,
    ParentState,
    ProcEntry,
    PublicationAck,
    PublicationRejected,
    Reject,
    RejectCode,
    RemoteProtocolError,
    RemoveLink,
    ResnapshotRequired,
    Resolve,
    ResolveForChild,
    Revision,
    SendAndClose,
    SendMessage,
    SessionErrorKind,
    SnapshotBegin,
    SnapshotChunk,
    SnapshotEnd,
    VersionRange,
    Welcome,
)

PARENT = Pid(b"\xaa" * 16)
CHILD = Pid(b"\xc1" * 16)
STRANGER = Pid(b"\xc9" * 16)
LINK = LinkId(b"\x01" * 16)
OTHER_LINK = LinkId(b"\x02" * 16)
S = SessionErrorKind
ALL_VERSIONS = VersionRange(1, 3)


def entry(n: int, name: str = "n") -> ProcEntry:
    return ProcEntry(Pid(bytes([n]) * 16), name)


def state(session: ParentSession) -> ParentState:
    """The session's state, read without letting the type checker narrow the property."""
    return session.state


def commit(
    session: ParentSession, ns: Nameserver, action: ParentAction | None
) -> ParentAction | None:
    """Apply a CommitCommand and complete it (one step of the service's action chain)."""
    assert isinstance(action, CommitCommand)
    try:
        result: ApplyEffects | ApplyError = ns.apply(action.command)
    except ApplyError as exc:
        result = exc
    return session.complete_commit(result)


def active(
    versions: VersionRange = ALL_VERSIONS, ns: Nameserver | None = None
) -> tuple[ParentSession, Nameserver]:
    ns = ns if ns is not None else Nameserver(PARENT)
    session = ParentSession(PARENT, CHILD, LINK, versions)
    welcome = commit(session, ns, session.receive(Hello(VersionRange(1, 3), CHILD)))
    assert isinstance(welcome, SendMessage)
    assert isinstance(welcome.message, Welcome)
    return session, ns


def publish(session: ParentSession, ns: Nameserver, *entries: ProcEntry, base: int = 0) -> None:
    assert commit(session, ns, session.receive(SnapshotBegin(1, base))) is None
    assert commit(session, ns, session.receive(SnapshotChunk(1, 0, entries))) is None
    ack = commit(session, ns, session.receive(SnapshotEnd(1, 1)))
    assert ack == SendMessage(PublicationAck(base))


def test_handshake_negotiates_highest_version_after_committed_admission() -> None:
    ns = Nameserver(PARENT)
    session = ParentSession(PARENT, CHILD, LINK, VersionRange(1, 3))
    action = session.receive(Hello(VersionRange(2, 5), CHILD))
    assert action == CommitCommand(AdmitLink(LINK, CHILD))
    assert state(session) is ParentState.PENDING
    with pytest.raises(LocalProtocolError) as info:
        session.receive(SnapshotBegin(1, 0))
    assert info.value.kind is S.COMMIT_PENDING
    assert commit(session, ns, action) == SendMessage(Welcome(3, PARENT, LINK))
    assert state(session) is ParentState.ACTIVE
    assert session.version == 3
    assert ns.child_links() == {CHILD: LINK}


def test_version_is_the_lower_of_the_two_maxima() -> None:
    session = ParentSession(PARENT, CHILD, LINK, VersionRange(1, 2))
    action = commit(session, Nameserver(PARENT), session.receive(Hello(VersionRange(2, 7), CHILD)))
    assert action == SendMessage(Welcome(2, PARENT, LINK))


def test_handshake_rejects_identity_and_version_mismatches() -> None:
    session = ParentSession(PARENT, CHILD, LINK)
    assert session.receive(Hello(VersionRange(1, 3), STRANGER)) == SendAndClose(
        Reject(RejectCode.IDENTITY_MISMATCH)
    )
    assert session.is_closed
    session = ParentSession(PARENT, CHILD, LINK, VersionRange(1, 3))
    assert session.receive(Hello(VersionRange(4, 6), CHILD)) == SendAndClose(
        Reject(RejectCode.INCOMPATIBLE_VERSION)
    )
    assert session.is_closed


def test_a_new_connection_of_the_same_child_supersedes_the_stale_one() -> None:
    """Issue 15, item 3: a child restarted with the same identity while its parent still
    holds the old link is admitted; the old link is fenced and its late messages refused."""
    ns = Nameserver(PARENT)
    old = ParentSession(PARENT, CHILD, OTHER_LINK)
    commit(old, ns, old.receive(Hello(VersionRange(2, 3), CHILD)))
    publish(old, ns, entry(1))
    session = ParentSession(PARENT, CHILD, LINK)
    admit = session.receive(Hello(VersionRange(2, 3), CHILD))
    assert isinstance(admit, CommitCommand)
    effects = ns.apply(admit.command)
    assert effects.superseded == OTHER_LINK
    assert effects.directory_change is not None
    assert effects.directory_change.link == OTHER_LINK
    assert effects.directory_change.removals == (entry(1).pid,)
    assert session.complete_commit(effects) == SendMessage(Welcome(3, PARENT, LINK))
    assert ns.child_links() == {CHILD: LINK}
    assert old.supersede() == SendAndClose(Reject(RejectCode.ALREADY_LINKED))
    assert old.is_closed
    with pytest.raises(LocalProtocolError) as info:
        old.receive(Delta(1, (entry(2),)))  # a late message of the old link
    assert info.value.kind is S.CLOSED
    publish(session, ns, entry(1), entry(3))
    assert ns.snapshot() == (entry(1), entry(3))
    assert ns.owner(entry(1).pid) == LINK


def test_a_late_publication_of_a_superseded_link_is_refused_by_the_directory() -> None:
    ns = Nameserver(PARENT)
    old = ParentSession(PARENT, CHILD, OTHER_LINK)
    commit(old, ns, old.receive(Hello(VersionRange(2, 3), CHILD)))
    publish(old, ns, entry(1))
    ns.apply(AdmitLink(LINK, CHILD))  # the new connection, before the old session heard
    with pytest.raises(PublicationRejected) as info:
        commit(old, ns, old.receive(Delta(1, (entry(2),))))
    assert info.value.cause.kind is ApplyErrorKind.UNKNOWN_LINK
    assert ns.snapshot() == ()


def test_version_one_supersedes_with_unavailable() -> None:
    ns = Nameserver(PARENT)
    old = ParentSession(PARENT, CHILD, OTHER_LINK, VersionRange(1, 1))
    commit(old, ns, old.receive(Hello(VersionRange(1, 3), CHILD)))
    assert old.supersede() == SendAndClose(Reject(RejectCode.UNAVAILABLE))


def test_a_duplicate_child_error_still_maps_to_the_reference_codes() -> None:
    for versions, code in (
        (VersionRange(2, 3), RejectCode.ALREADY_LINKED),
        (
            VersionRange(1, 1),
            RejectCode.UNAVAILABLE,
        ),
    ):
        session = ParentSession(PARENT, CHILD, LINK, versions)
        session.receive(Hello(VersionRange(1, 3), CHILD))
        action = session.complete_commit(ApplyError(ApplyErrorKind.CHILD_ALREADY_LINKED, pid=CHILD))
        assert action == SendAndClose(Reject(code))
        assert session.is_closed


def test_publication_messages_commit_before_acknowledgment() -> None:
    session, ns = active()
    begin = session.receive(SnapshotBegin(1, 0))
    assert begin == CommitCommand(BeginSnapshot(LINK, 1, 0))
    assert commit(session, ns, begin) is None
    assert commit(session, ns, session.receive(SnapshotChunk(1, 0, (entry(1),)))) is None
    end = session.receive(SnapshotEnd(1, 1))
    assert end == CommitCommand(CommitSnapshot(LINK, 1, 1))
    assert ns.snapshot() == ()  # nothing visible, nothing acknowledged before the commit
    assert commit(session, ns, end) == SendMessage(PublicationAck(0))
    assert ns.snapshot() == (entry(1),)
    delta = session.receive(Delta(1, (entry(2),)))
    assert delta == CommitCommand(ApplyDelta(LINK, 1, (entry(2),)))
    assert commit(session, ns, delta) == SendMessage(PublicationAck(1))
    assert ns.snapshot() == (entry(1), entry(2))


def test_delta_gap_becomes_resnapshot_request() -> None:
    session, ns = active()
    publish(session, ns, entry(1), base=1)
    assert commit(session, ns, session.receive(Delta(3, (entry(2),)))) == SendMessage(
        ResnapshotRequired(2)
    )
    assert state(session) is ParentState.ACTIVE


def test_close_commits_link_wide_revocation() -> None:
    session, ns = active()
    publish(session, ns, entry(1), entry(2))
    action = session.close()
    assert action == CommitCommand(RemoveLink(LINK))
    assert commit(session, ns, action) is None
    assert session.is_closed
    assert ns.snapshot() == ()
    assert ns.child_links() == {}
    assert session.close() is None


def test_close_during_admission_removes_committed_link_without_welcome() -> None:
    ns = Nameserver(PARENT)
    session = ParentSession(PARENT, CHILD, LINK)
    admit = session.receive(Hello(VersionRange(1, 3), CHILD))
    assert session.close() is None
    removal = commit(session, ns, admit)
    assert removal == CommitCommand(RemoveLink(LINK))
    assert commit(session, ns, removal) is None
    assert session.is_closed
    assert ns.child_links() == {}


def test_close_during_failed_admission_closes_without_reject() -> None:
    ns = Nameserver(PARENT, max_links=1)
    ns.apply(AdmitLink(OTHER_LINK, STRANGER))
    session = ParentSession(PARENT, CHILD, LINK)
    admit = session.receive(Hello(VersionRange(1, 3), CHILD))
    session.close()
    assert commit(session, ns, admit) is None
    assert session.is_closed


def test_close_during_publication_suppresses_ack_and_removes_link() -> None:
    session, ns = active()
    commit(session, ns, session.receive(SnapshotBegin(1, 0)))
    commit(session, ns, session.receive(SnapshotChunk(1, 0, (entry(1),))))
    end = session.receive(SnapshotEnd(1, 1))
    assert session.close() is None
    removal = commit(session, ns, end)
    assert removal == CommitCommand(RemoveLink(LINK))
    assert commit(session, ns, removal) is None
    assert session.is_closed
    assert ns.snapshot() == ()


def test_resolution_requests_are_correlated_and_pid_checked() -> None:
    session, ns = active()
    target = Pid(b"\x07" * 16)
    assert session.receive(Resolve(5, target, Consistency.REFRESH)) == ResolveForChild(
        5, target, Consistency.REFRESH
    )
    with pytest.raises(RemoteProtocolError) as duplicate:
        session.receive(Enumerate(5))
    assert duplicate.value.kind is S.DUPLICATE_REQUEST
    wrong = NotFound(Pid(b"\x08" * 16), ns.revision, 1000)
    with pytest.raises(LocalProtocolError) as mismatch:
        session.resolved(5, wrong)
    assert mismatch.value.kind is S.RESOLUTION_PID_MISMATCH
    right = NotFound(target, ns.revision, 1000)
    answer = session.resolved(5, right)
    assert answer.message.request == 5  # type: ignore[union-attr]
    with pytest.raises(LocalProtocolError) as unknown:
        session.resolved(5, right)
    assert unknown.value.kind is S.UNKNOWN_REQUEST
    assert session.receive(Enumerate(6)) == EnumerateForChild(6, Consistency.CACHED, None, 0)
    with pytest.raises(LocalProtocolError) as not_resolve:
        session.resolved(6, right)
    assert not_resolve.value.kind is S.UNKNOWN_REQUEST
    stale = EnumerationStale(ns.revision)
    assert session.enumerated(6, stale).message.result == stale  # type: ignore[union-attr]
    with pytest.raises(LocalProtocolError) as unknown_enum:
        session.enumerated(6, stale)
    assert unknown_enum.value.kind is S.UNKNOWN_ENUMERATION_REQUEST


def test_pending_requests_are_bounded() -> None:
    ns = Nameserver(PARENT)
    session = ParentSession(PARENT, CHILD, LINK, max_pending_requests=2)
    commit(session, ns, session.receive(Hello(VersionRange(1, 3), CHILD)))
    session.receive(Resolve(1, CHILD))
    session.receive(Enumerate(2))
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(Resolve(3, CHILD))
    assert info.value.kind is S.TOO_MANY_REQUESTS
    assert session.pending_requests == 2


def test_cache_updates_require_an_admitted_link() -> None:
    session = ParentSession(PARENT, CHILD, LINK)
    update = Found(entry(1), Revision(PARENT, 1))
    with pytest.raises(LocalProtocolError) as info:
        session.push_cache(update)
    assert info.value.kind is S.NOT_ACTIVE
    session, _ = active()
    assert session.push_cache(update).message.resolution == update  # type: ignore[union-attr]


def test_invalid_direction_and_effects_are_rejected() -> None:
    session, _ = active()
    with pytest.raises(RemoteProtocolError) as info:
        session.receive(Welcome(3, PARENT, LINK))
    assert info.value.kind is S.UNEXPECTED_MESSAGE
    fresh = ParentSession(PARENT, CHILD, LINK)
    with pytest.raises(RemoteProtocolError):
        fresh.receive(SnapshotBegin(1, 0))
    session.receive(SnapshotBegin(1, 0))
    with pytest.raises(LocalProtocolError) as effects:
        session.complete_commit(ApplyEffects(None, PublicationAck(0)))
    assert effects.value.kind is S.UNEXPECTED_EFFECTS
    assert state(session) is ParentState.PENDING  # unchanged: the driver may retry
    assert session.complete_commit(ApplyEffects()) is None


def test_staging_command_rejects_visible_directory_effects() -> None:
    session, _ = active()
    session.receive(SnapshotChunk(1, 0, (entry(1),)))
    change = DirectoryChange(LINK, Revision(PARENT, 1), (entry(1),), ())
    with pytest.raises(LocalProtocolError) as info:
        session.complete_commit(ApplyEffects(change, None))
    assert info.value.kind is S.UNEXPECTED_EFFECTS


def test_commit_replies_must_match_the_message_kind() -> None:
    session, _ = active()
    session.receive(SnapshotEnd(1, 0))
    with pytest.raises(LocalProtocolError):
        session.complete_commit(ApplyEffects(None, ResnapshotRequired(0)))
    session.complete_commit(ApplyEffects(None, PublicationAck(0)))
    session.receive(Delta(1))
    with pytest.raises(LocalProtocolError):
        session.complete_commit(ApplyEffects())
    assert session.complete_commit(ApplyEffects(None, ResnapshotRequired(0))) == SendMessage(
        ResnapshotRequired(0)
    )
    with pytest.raises(LocalProtocolError):
        ParentSession(PARENT, CHILD, LINK).complete_commit(ApplyEffects())
    admitting = ParentSession(PARENT, CHILD, LINK)
    admitting.receive(Hello(VersionRange(1, 3), CHILD))
    with pytest.raises(LocalProtocolError) as info:
        admitting.complete_commit(ApplyEffects(None, PublicationAck(0)))
    assert info.value.kind is S.UNEXPECTED_EFFECTS


def test_rejected_publication_never_produces_an_acknowledgment() -> None:
    session, ns = active()
    chunk = session.receive(SnapshotChunk(1, 0, (entry(1),)))
    with pytest.raises(PublicationRejected) as info:
        commit(session, ns, chunk)
    assert info.value.cause.kind is ApplyErrorKind.WRONG_SNAPSHOT
    assert info.value.kind is S.PUBLICATION_REJECTED
    assert state(session) is ParentState.ACTIVE
    removal = session.close()
    assert commit(session, ns, removal) is None
    assert ns.child_links() == {}


def test_link_removal_validates_committed_effect_ownership() -> None:
    session, ns = active()
    publish(session, ns, entry(1))
    removal = session.close()
    foreign = ApplyEffects(DirectoryChange(OTHER_LINK, Revision(PARENT, 2), (), (entry(1).pid,)))
    with pytest.raises(LocalProtocolError) as info:
        session.complete_commit(foreign)
    assert info.value.kind is S.UNEXPECTED_EFFECTS
    assert not session.is_closed
    assert commit(session, ns, removal) is None
    assert session.is_closed


def test_removal_failure_is_reported() -> None:
    session, _ = active()
    session.close()
    with pytest.raises(LocalProtocolError) as info:
        session.complete_commit(ApplyError(ApplyErrorKind.COUNTER_EXHAUSTED))
    assert info.value.kind is S.REMOVAL_FAILED


def test_constructor_and_commit_completion_enforce_session_contract() -> None:
    with pytest.raises(LocalProtocolError) as reserved:
        ParentSession(Pid.LINK_LOCAL, CHILD, LINK)
    assert reserved.value.kind is S.RESERVED_PID
    with pytest.raises(LocalProtocolError):
        ParentSession(PARENT, Pid.LINK_LOCAL, LINK)
    session, ns = active()
    with pytest.raises(LocalProtocolError) as none_pending:
        session.complete_commit(ApplyEffects())
    assert none_pending.value.kind is S.NO_PENDING_COMMIT
    commit(session, ns, session.close())
    with pytest.raises(LocalProtocolError) as closed:
        session.receive(Resolve(1, CHILD))
    assert closed.value.kind is S.CLOSED
    with pytest.raises(LocalProtocolError):
        session.push_cache(NotFound(CHILD, ns.revision, 0))


def test_closing_before_hello_admits_nothing() -> None:
    session = ParentSession(PARENT, CHILD, LINK)
    assert session.close() is None
    assert session.is_closed
