"""Pure nameserver sessions: ``ParentSession`` and ``ChildSession`` (spec 3.1, 3.2).

Theory of operation
-------------------
One ordered stream joins a child to its parent; each end runs one session object. Sessions
never touch the stream, the directory or a clock: they turn received messages into *actions*
(parent) or *events* (child), and the driver does the I/O and the directory commits.

Parent side. ``ParentSession.receive(message)`` returns one action:

* ``CommitCommand``: apply the command to the directory (the commit point), then report the
  outcome with ``complete_commit(effects_or_error)``, which returns the next action. While a
  commit is pending, ``receive`` refuses (``COMMIT_PENDING``): the driver must finish the
  commit first, which guarantees that a ``Welcome`` or an acknowledgement is only ever sent
  *after* its commit;
* ``SendMessage`` / ``SendAndClose``: write one frame (and, for the latter, end the stream);
* ``ResolveForChild`` / ``EnumerateForChild``: answer the request (locally or upstream) and
  hand the answer to ``resolved`` / ``enumerated``, which return the ``SendMessage``.

The handshake admits the link only through a commit (``AdmitLink``), and ``Welcome`` follows
that commit. ``close()`` revokes the link with a ``RemoveLink`` commit; a close requested while
a commit is pending suppresses the acknowledgement and removes the link right after the commit,
so an admitted link is never stranded. Any rejected publication surfaces as
``PublicationRejected``; the driver then closes, which revokes all of the link's entries (and
should first send ``publication_refused()``, a ``Reject(UNAVAILABLE)``, so the child learns
why its link ends).

Superseding: the admission of a child that already has a link replaces the old link (a node
restarted with the same identity; see ``_state``). The admission's effects name the old link
(``ApplyEffects.superseded``); the driver calls ``supersede()`` on the old link's session,
which closes it without another commit (the directory already dropped that link) and returns
the ``Reject(ALREADY_LINKED)`` to send on the old stream. Every later message of the old link
is refused (the session is closed; publications would fail with ``UNKNOWN_LINK`` anyway).

Child side. ``ChildSession`` builds the child's messages (``hello``, the publication and request
builders, all refused before the link is established) and turns the parent's messages into
events (``Established``, ``Rejected``, ``PublicationAcked``, ``ResnapshotRequested``,
``ResolveCompleted``, ``EnumerateCompleted``, ``CacheUpdated``). A ``Reject`` after the link
was established ends it too (``Rejected``): ``ALREADY_LINKED`` means a newer connection with
the same identity superseded this one, ``UNAVAILABLE`` that the parent refused a publication
(its namespace is full, for instance). Requests are correlated by id
(one namespace for resolves and enumerations) and answers are checked against the request.

Errors: ``LocalProtocolError`` for a driver bug, ``RemoteProtocolError`` for a misbehaving
peer. A failed call leaves the session unchanged unless documented otherwise, so the driver
can decide (normally: close). Pending requests are bounded by ``max_pending_requests``.
The transition tables are ``_PARENT_ACCEPTS`` and ``_PUBLICATIONS`` below.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, final

from chrysalis.core import LinkId, Pid
from chrysalis.nameserver._errors import (
    ApplyError,
    ApplyErrorKind,
    LocalProtocolError,
    PublicationRejected,
    RemoteProtocolError,
    SessionErrorKind,
)
from chrysalis.nameserver._protocol import (
    DEFAULT_VERSIONS,
    U64_MAX,
    VERSION_2,
    CacheUpdate,
    Consistency,
    Delta,
    Enumerate,
    EnumerateResult,
    EnumerationCursor,
    EnumerationPage,
    EnumerationResult,
    EnumerationStale,
    Found,
    Hello,
    NotFound,
    NsMessage,
    ProcEntry,
    PublicationAck,
    Reject,
    RejectCode,
    ResnapshotRequired,
    Resolution,
    Resolve,
    ResolveResult,
    SnapshotBegin,
    SnapshotChunk,
    SnapshotEnd,
    VersionRange,
    Welcome,
    _uint,
)
from chrysalis.nameserver._state import (
    AdmitLink as _AdmitLink,
)
from chrysalis.nameserver._state import (
    AppendSnapshotChunk,
    ApplyDelta,
    ApplyEffects,
    BeginSnapshot,
    CommitSnapshot,
    DirectoryCommand,
    RemoveLink,
)

__all__ = [
    "DEFAULT_MAX_PENDING_REQUESTS",
    "CacheUpdated",
    "ChildEvent",
    "ChildSession",
    "ChildState",
    "CommitCommand",
    "EnumerateCompleted",
    "EnumerateForChild",
    "Established",
    "ParentAction",
    "ParentSession",
    "ParentState",
    "PublicationAcked",
    "Rejected",
    "ResnapshotRequested",
    "ResolveCompleted",
    "ResolveForChild",
    "SendAndClose",
    "SendMessage",
]

DEFAULT_MAX_PENDING_REQUESTS: Final = 1024
"""Default bound on outstanding resolve/enumerate requests per session."""

_S = SessionErrorKind


def _check_party(pid: object, what: str) -> Pid:
    if not isinstance(pid, Pid):
        raise TypeError(f"{what} must be a Pid, not {type(pid).__name__}")
    if pid.is_link_local:
        raise LocalProtocolError(_S.RESERVED_PID, f"{what} cannot be the link-local PID")
    return pid


def _kind(message: object) -> str:
    return type(message).__name__


# --------------------------------------------------------------------------------------------
# Parent-side actions


@final
@dataclass(frozen=True, slots=True)
class SendMessage:
    """Write ``message`` to the child and continue."""

    message: NsMessage


@final
@dataclass(frozen=True, slots=True)
class SendAndClose:
    """Write ``message`` (a ``Reject``) to the child, then end the stream. The session is
    closed and no link was admitted."""

    message: Reject


@final
@dataclass(frozen=True, slots=True)
class CommitCommand:
    """Apply ``command`` to the directory, then call ``complete_commit`` with the outcome."""

    command: DirectoryCommand


@final
@dataclass(frozen=True, slots=True)
class ResolveForChild:
    """Resolve ``pid`` for the child (locally, else upstream with ``consistency``), then call
    ``resolved(request, answer)``."""

    request: int
    pid: Pid
    consistency: Consistency


@final
@dataclass(frozen=True, slots=True)
class EnumerateForChild:
    """Enumerate for the child, then call ``enumerated(request, result)``."""

    request: int
    consistency: Consistency
    cursor: EnumerationCursor | None
    limit: int


ParentAction = SendMessage | SendAndClose | CommitCommand | ResolveForChild | EnumerateForChild
"""What the parent driver must do next."""


class ParentState(enum.Enum):
    """Where a ``ParentSession`` stands."""

    AWAITING_HELLO = "awaiting hello"
    PENDING = "commit pending"
    ACTIVE = "active"
    CLOSED = "closed"


class _Pending(enum.Enum):
    ADMIT = "admit"
    PUBLICATION = "publication"
    REMOVE = "remove"


class _Reply(enum.Enum):
    """What a publication commit must answer with."""

    NONE = "none"  # staging: no visible change, no response
    SNAPSHOT = "snapshot"  # PublicationAck
    DELTA = "delta"  # PublicationAck or ResnapshotRequired


# Transition table: child messages a parent accepts while ACTIVE that become directory commits,
# with the reply their commit must produce.
_PUBLICATIONS: Final[dict[type, _Reply]] = {
    SnapshotBegin: _Reply.NONE,
    SnapshotChunk: _Reply.NONE,
    SnapshotEnd: _Reply.SNAPSHOT,
    Delta: _Reply.DELTA,
}


def _publication_command(link: LinkId, message: NsMessage) -> DirectoryCommand:
    """The directory command a publication message of ``_PUBLICATIONS`` becomes."""
    if isinstance(message, SnapshotBegin):
        return BeginSnapshot(link, message.snapshot, message.base_sequence)
    if isinstance(message, SnapshotChunk):
        return AppendSnapshotChunk(link, message.snapshot, message.chunk, message.entries)
    if isinstance(message, SnapshotEnd):
        return CommitSnapshot(link, message.snapshot, message.chunks)
    assert isinstance(message, Delta)
    return ApplyDelta(link, message.sequence, message.upserts, message.removals)


# Transition table: every message kind a parent accepts, per state.
_PARENT_ACCEPTS: Final[dict[ParentState, frozenset[type]]] = {
    ParentState.AWAITING_HELLO: frozenset({Hello}),
    ParentState.ACTIVE: frozenset({*_PUBLICATIONS, Resolve, Enumerate}),
}

_RESOLVE: Final = "resolve"
_ENUMERATE: Final = "enumerate"


# --------------------------------------------------------------------------------------------
# ParentSession


@final
class ParentSession:
    """The parent's side of one child link (see the module docstring).

    ``ParentSession(parent, peer, link, versions)``: ``peer`` is the TLS-authenticated child
    PID, ``link`` the parent-allocated link id of this incarnation. The link-local PID for
    either party raises ``LocalProtocolError`` (``RESERVED_PID``).
    """

    __slots__ = (
        "_close_requested",
        "_link",
        "_max_requests",
        "_parent",
        "_peer",
        "_pending",
        "_reply",
        "_requests",
        "_state",
        "_version",
        "_versions",
    )

    def __init__(
        self,
        parent: Pid,
        peer: Pid,
        link: LinkId,
        versions: VersionRange = DEFAULT_VERSIONS,
        *,
        max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
    ) -> None:
        self._parent = _check_party(parent, "parent")
        self._peer = _check_party(peer, "peer")
        if not isinstance(link, LinkId):
            raise TypeError(f"link must be a LinkId, not {type(link).__name__}")
        if not isinstance(versions, VersionRange):
            raise TypeError(f"versions must be a VersionRange, not {type(versions).__name__}")
        _uint(max_pending_requests, U64_MAX, "max_pending_requests", minimum=1)
        self._link = link
        self._versions = versions
        self._max_requests = max_pending_requests
        self._state = ParentState.AWAITING_HELLO
        self._version: int | None = None
        self._pending: _Pending | None = None
        self._reply = _Reply.NONE
        self._close_requested = False
        self._requests: dict[int, Pid | None] = {}

    # -- observers --------------------------------------------------------------------------

    @property
    def state(self) -> ParentState:
        """The current state."""
        return self._state

    @property
    def version(self) -> int | None:
        """The negotiated protocol version, once a ``Hello`` was accepted."""
        return self._version

    @property
    def link(self) -> LinkId:
        """The link id of this incarnation."""
        return self._link

    @property
    def peer(self) -> Pid:
        """The authenticated child PID."""
        return self._peer

    @property
    def is_closed(self) -> bool:
        """True once the session ended."""
        return self._state is ParentState.CLOSED

    @property
    def pending_requests(self) -> int:
        """Resolve and enumerate requests awaiting an answer."""
        return len(self._requests)

    # -- inbound ----------------------------------------------------------------------------

    def receive(self, message: NsMessage) -> ParentAction:
        """Handle one message from the child and return the action the driver must take."""
        self._check_receivable()
        kind = type(message)
        state = self._state
        if kind not in _PARENT_ACCEPTS.get(state, frozenset()):
            raise RemoteProtocolError(
                _S.UNEXPECTED_MESSAGE, f"{_kind(message)} while {state.value}"
            )
        if isinstance(message, Hello):
            return self._hello(message)
        reply = _PUBLICATIONS.get(kind)
        if reply is not None:
            self._state = ParentState.PENDING
            self._pending = _Pending.PUBLICATION
            self._reply = reply
            return CommitCommand(_publication_command(self._link, message))
        if isinstance(message, Resolve):
            self._record(message.request, message.pid)
            return ResolveForChild(message.request, message.pid, message.consistency)
        assert isinstance(message, Enumerate)
        self._record(message.request, None)
        return EnumerateForChild(
            message.request, message.consistency, message.cursor, message.limit
        )

    def _check_receivable(self) -> None:
        if self._state is ParentState.CLOSED:
            raise LocalProtocolError(_S.CLOSED)
        if self._state is ParentState.PENDING:
            raise LocalProtocolError(_S.COMMIT_PENDING, "finish the commit before receiving")

    def _hello(self, hello: Hello) -> ParentAction:
        if hello.child != self._peer:
            self._close_now()
            return SendAndClose(Reject(RejectCode.IDENTITY_MISMATCH))
        common = self._versions.intersect(hello.versions)
        if common is None:
            self._close_now()
            return SendAndClose(Reject(RejectCode.INCOMPATIBLE_VERSION))
        self._version = common.max
        self._state = ParentState.PENDING
        self._pending = _Pending.ADMIT
        return CommitCommand(_AdmitLink(self._link, self._peer))

    def _record(self, request: int, pid: Pid | None) -> None:
        if request in self._requests:
            raise RemoteProtocolError(_S.DUPLICATE_REQUEST, f"request {request} is pending")
        if len(self._requests) >= self._max_requests:
            raise RemoteProtocolError(_S.TOO_MANY_REQUESTS, f"at most {self._max_requests}")
        self._requests[request] = pid

    # -- commits ----------------------------------------------------------------------------

    def complete_commit(self, result: ApplyEffects | ApplyError) -> ParentAction | None:
        """Report the outcome of the pending ``CommitCommand``; return the next action.

        Raises ``LocalProtocolError`` (``NO_PENDING_COMMIT``, ``UNEXPECTED_EFFECTS`` — the
        session is then unchanged and the call may be retried — or ``REMOVAL_FAILED``) and
        ``PublicationRejected`` when the directory refused a publication (the session is back
        to active; the driver should close it).
        """
        if self._state is not ParentState.PENDING or self._pending is None:
            raise LocalProtocolError(_S.NO_PENDING_COMMIT)
        if not isinstance(result, ApplyEffects | ApplyError):
            raise TypeError(f"result must be ApplyEffects or ApplyError, not {_kind(result)}")
        pending = self._pending
        if pending is _Pending.ADMIT:
            return self._complete_admit(result)
        if pending is _Pending.PUBLICATION:
            return self._complete_publication(result)
        self._complete_remove(result)
        return None

    def _complete_admit(self, result: ApplyEffects | ApplyError) -> ParentAction | None:
        if isinstance(result, ApplyError):
            if self._close_requested:
                self._close_now()
                return None
            version = self._version or 0
            code = (
                RejectCode.ALREADY_LINKED
                if result.kind is ApplyErrorKind.CHILD_ALREADY_LINKED and version >= VERSION_2
                else RejectCode.UNAVAILABLE
            )
            self._close_now()
            return SendAndClose(Reject(code))
        if result.link_response is not None:
            raise LocalProtocolError(_S.UNEXPECTED_EFFECTS, "admission owes no response")
        change = result.directory_change
        if change is not None and change.link != result.superseded:
            raise LocalProtocolError(
                _S.UNEXPECTED_EFFECTS, "an admission may only revoke the link it superseded"
            )
        if self._close_requested:
            return self._start_removal()
        self._state = ParentState.ACTIVE
        self._pending = None
        assert self._version is not None
        return SendMessage(Welcome(self._version, self._parent, self._link))

    def _complete_publication(self, result: ApplyEffects | ApplyError) -> ParentAction | None:
        if isinstance(result, ApplyError):
            if self._close_requested:
                return self._start_removal()
            self._state = ParentState.ACTIVE
            self._pending = None
            raise PublicationRejected(result)
        self._check_change_owner(result)
        response = result.link_response
        reply = self._reply
        if reply is _Reply.NONE:
            if not result.is_empty:
                raise LocalProtocolError(
                    _S.UNEXPECTED_EFFECTS, "a staging command must have no effects"
                )
        elif reply is _Reply.SNAPSHOT:
            if not isinstance(response, PublicationAck):
                raise LocalProtocolError(
                    _S.UNEXPECTED_EFFECTS, "a snapshot commit must answer PublicationAck"
                )
        elif not isinstance(response, PublicationAck | ResnapshotRequired):
            raise LocalProtocolError(
                _S.UNEXPECTED_EFFECTS, "a delta must answer PublicationAck or ResnapshotRequired"
            )
        if self._close_requested:
            return self._start_removal()
        self._state = ParentState.ACTIVE
        self._pending = None
        return None if response is None else SendMessage(response)

    def _complete_remove(self, result: ApplyEffects | ApplyError) -> None:
        if isinstance(result, ApplyError):
            raise LocalProtocolError(_S.REMOVAL_FAILED, str(result)) from result
        self._check_change_owner(result)
        if result.link_response is not None:
            raise LocalProtocolError(_S.UNEXPECTED_EFFECTS, "link removal owes no response")
        self._close_now()

    def _check_change_owner(self, result: ApplyEffects) -> None:
        change = result.directory_change
        if change is not None and change.link != self._link:
            raise LocalProtocolError(
                _S.UNEXPECTED_EFFECTS, f"change of link {change.link}, session of {self._link}"
            )

    def _start_removal(self) -> CommitCommand:
        self._state = ParentState.PENDING
        self._pending = _Pending.REMOVE
        self._requests.clear()
        return CommitCommand(RemoveLink(self._link))

    def _close_now(self) -> None:
        self._state = ParentState.CLOSED
        self._pending = None
        self._requests.clear()

    # -- answers ----------------------------------------------------------------------------

    def resolved(self, request: int, result: Resolution) -> SendMessage:
        """Answer resolve ``request``; ``result.pid`` must be the PID that was asked for."""
        self._check_answerable()
        if request not in self._requests or self._requests[request] is None:
            raise LocalProtocolError(_S.UNKNOWN_REQUEST, f"no resolve request {request}")
        if not isinstance(result, Found | NotFound):
            raise TypeError(f"result must be Found or NotFound, not {_kind(result)}")
        if result.pid != self._requests[request]:
            raise LocalProtocolError(
                _S.RESOLUTION_PID_MISMATCH, f"request {request} asked for another PID"
            )
        del self._requests[request]
        return SendMessage(ResolveResult(request, result))

    def enumerated(self, request: int, result: EnumerationResult) -> SendMessage:
        """Answer enumeration ``request``."""
        self._check_answerable()
        if request not in self._requests or self._requests[request] is not None:
            raise LocalProtocolError(
                _S.UNKNOWN_ENUMERATION_REQUEST, f"no enumeration request {request}"
            )
        if not isinstance(result, EnumerationPage | EnumerationStale):
            raise TypeError(f"result must be an EnumerationResult, not {_kind(result)}")
        del self._requests[request]
        return SendMessage(EnumerateResult(request, result))

    def push_cache(self, result: Resolution) -> SendMessage:
        """An unsolicited ``CacheUpdate`` for the child; only once the link is admitted."""
        self._check_answerable()
        if not isinstance(result, Found | NotFound):
            raise TypeError(f"result must be Found or NotFound, not {_kind(result)}")
        return SendMessage(CacheUpdate(result))

    def _check_answerable(self) -> None:
        if self._state is ParentState.CLOSED:
            raise LocalProtocolError(_S.CLOSED)
        admitted = self._state is ParentState.ACTIVE or (
            self._state is ParentState.PENDING and self._pending is _Pending.PUBLICATION
        )
        if not admitted:
            raise LocalProtocolError(_S.NOT_ACTIVE, f"session is {self._state.value}")

    def publication_refused(self) -> Reject:
        """The ``Reject(UNAVAILABLE)`` that tells the child why its link ends after a
        ``PublicationRejected`` (send it, then ``close()``)."""
        return Reject(RejectCode.UNAVAILABLE)

    # -- close ------------------------------------------------------------------------------

    def supersede(self) -> SendAndClose | None:
        """A newer link of the same child replaced this one in the directory: close without
        revoking (the directory already did). Returns the ``Reject(ALREADY_LINKED)`` (or
        ``UNAVAILABLE`` below version 2) to send on this link's stream, or ``None`` when
        nothing was admitted or a commit is pending (its completion then ends the session)."""
        state = self._state
        if state is ParentState.PENDING:
            self._close_requested = True
            self._requests.clear()
            return None
        if state is not ParentState.ACTIVE:
            self._close_now()
            return None
        self._close_now()
        code = (
            RejectCode.ALREADY_LINKED
            if (self._version or 0) >= VERSION_2
            else RejectCode.UNAVAILABLE
        )
        return SendAndClose(Reject(code))

    def close(self) -> CommitCommand | None:
        """End the session. Returns ``CommitCommand(RemoveLink)`` when the link must be
        revoked now; ``None`` when nothing is admitted, when removal will follow the pending
        commit, or when already closing or closed. Pending requests are dropped."""
        self._requests.clear()
        state = self._state
        if state is ParentState.AWAITING_HELLO:
            self._close_now()
            return None
        if state is ParentState.PENDING:
            if self._pending is not _Pending.REMOVE:
                self._close_requested = True
            return None
        if state is ParentState.ACTIVE:
            return self._start_removal()
        return None


# --------------------------------------------------------------------------------------------
# Child-side events


@final
@dataclass(frozen=True, slots=True)
class Established:
    """The parent admitted the link: ``version`` negotiated, ``link`` its id."""

    version: int
    link: LinkId


@final
@dataclass(frozen=True, slots=True)
class Rejected:
    """The parent refused the link with ``code``; the session is closed. Received after the
    link was established, ``ALREADY_LINKED`` means a newer connection with this PID
    superseded the link, and ``UNAVAILABLE`` that the parent refused a publication."""

    code: RejectCode


@final
@dataclass(frozen=True, slots=True)
class PublicationAcked:
    """Every publication up to ``sequence`` is committed at the parent."""

    sequence: int


@final
@dataclass(frozen=True, slots=True)
class ResnapshotRequested:
    """The parent needs a complete snapshot; it expected ``expected_sequence``."""

    expected_sequence: int


@final
@dataclass(frozen=True, slots=True)
class ResolveCompleted:
    """The answer to resolve ``request``."""

    request: int
    resolution: Resolution


@final
@dataclass(frozen=True, slots=True)
class EnumerateCompleted:
    """The answer to enumeration ``request``."""

    request: int
    result: EnumerationResult


@final
@dataclass(frozen=True, slots=True)
class CacheUpdated:
    """An unsolicited answer for the resolver cache."""

    resolution: Resolution


ChildEvent = (
    Established
    | Rejected
    | PublicationAcked
    | ResnapshotRequested
    | ResolveCompleted
    | EnumerateCompleted
    | CacheUpdated
)
"""What a message from the parent means to the child."""


class ChildState(enum.Enum):
    """Where a ``ChildSession`` stands."""

    AWAITING_WELCOME = "awaiting welcome"
    ACTIVE = "active"
    CLOSED = "closed"


# --------------------------------------------------------------------------------------------
# ChildSession


@final
class ChildSession:
    """The child's side of its parent link (see the module docstring).

    ``ChildSession(child, parent, versions)``: ``parent`` is the TLS-authenticated parent
    PID. The link-local PID for either party raises ``LocalProtocolError``.
    """

    __slots__ = (
        "_child",
        "_hello_sent",
        "_link",
        "_max_requests",
        "_parent",
        "_requests",
        "_state",
        "_version",
        "_versions",
    )

    def __init__(
        self,
        child: Pid,
        parent: Pid,
        versions: VersionRange = DEFAULT_VERSIONS,
        *,
        max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS,
    ) -> None:
        self._child = _check_party(child, "child")
        self._parent = _check_party(parent, "parent")
        if not isinstance(versions, VersionRange):
            raise TypeError(f"versions must be a VersionRange, not {type(versions).__name__}")
        _uint(max_pending_requests, U64_MAX, "max_pending_requests", minimum=1)
        self._versions = versions
        self._max_requests = max_pending_requests
        self._state = ChildState.AWAITING_WELCOME
        self._hello_sent = False
        self._version: int | None = None
        self._link: LinkId | None = None
        self._requests: dict[int, Pid | None] = {}

    # -- observers --------------------------------------------------------------------------

    @property
    def state(self) -> ChildState:
        """The current state."""
        return self._state

    @property
    def version(self) -> int | None:
        """The negotiated version, once established."""
        return self._version

    @property
    def link(self) -> LinkId | None:
        """The link id the parent allocated, once established."""
        return self._link

    @property
    def child(self) -> Pid:
        """This child's PID."""
        return self._child

    @property
    def parent(self) -> Pid:
        """The authenticated parent PID."""
        return self._parent

    @property
    def is_active(self) -> bool:
        """True while the link is established."""
        return self._state is ChildState.ACTIVE

    @property
    def pending_requests(self) -> int:
        """Requests awaiting an answer."""
        return len(self._requests)

    # -- handshake --------------------------------------------------------------------------

    def hello(self) -> Hello:
        """The opening message; valid once, before the link is established."""
        if self._state is ChildState.CLOSED:
            raise LocalProtocolError(_S.CLOSED)
        if self._state is not ChildState.AWAITING_WELCOME or self._hello_sent:
            raise LocalProtocolError(_S.HELLO_ALREADY_SENT)
        self._hello_sent = True
        return Hello(self._versions, self._child)

    # -- inbound ----------------------------------------------------------------------------

    def receive(self, message: NsMessage) -> ChildEvent:
        """Handle one message from the parent and return what it means."""
        state = self._state
        if state is ChildState.CLOSED:
            raise LocalProtocolError(_S.CLOSED)
        if state is ChildState.AWAITING_WELCOME:
            return self._handshake(message)
        if isinstance(message, PublicationAck):
            return PublicationAcked(message.sequence)
        if isinstance(message, ResnapshotRequired):
            return ResnapshotRequested(message.expected_sequence)
        if isinstance(message, ResolveResult):
            return self._resolve_result(message)
        if isinstance(message, EnumerateResult):
            if message.request not in self._requests or self._requests[message.request] is not None:
                raise RemoteProtocolError(
                    _S.UNKNOWN_ENUMERATION_REQUEST, f"no enumeration request {message.request}"
                )
            del self._requests[message.request]
            return EnumerateCompleted(message.request, message.result)
        if isinstance(message, CacheUpdate):
            return CacheUpdated(message.resolution)
        if isinstance(message, Reject):
            # The parent ended an established link: superseded by a newer connection of this
            # PID (ALREADY_LINKED) or a refused publication (UNAVAILABLE).
            self._close_now()
            return Rejected(message.code)
        raise RemoteProtocolError(_S.UNEXPECTED_MESSAGE, f"{_kind(message)} while active")

    def _handshake(self, message: NsMessage) -> ChildEvent:
        if not self._hello_sent or not isinstance(message, Welcome | Reject):
            raise RemoteProtocolError(
                _S.UNEXPECTED_MESSAGE, f"{_kind(message)} while awaiting welcome"
            )
        if isinstance(message, Reject):
            self._close_now()
            return Rejected(message.code)
        if message.version not in self._versions:
            self._close_now()
            raise RemoteProtocolError(
                _S.UNSUPPORTED_VERSION, f"welcome version {message.version} outside our range"
            )
        if message.parent != self._parent:
            self._close_now()
            raise RemoteProtocolError(
                _S.PARENT_MISMATCH, f"welcome from {message.parent}, authenticated {self._parent}"
            )
        self._state = ChildState.ACTIVE
        self._version = message.version
        self._link = message.link
        return Established(message.version, message.link)

    def _resolve_result(self, message: ResolveResult) -> ChildEvent:
        request = message.request
        if request not in self._requests or self._requests[request] is None:
            raise RemoteProtocolError(_S.UNKNOWN_REQUEST, f"no resolve request {request}")
        if message.resolution.pid != self._requests[request]:
            raise RemoteProtocolError(
                _S.RESOLUTION_PID_MISMATCH, f"answer to request {request} is for another PID"
            )
        del self._requests[request]
        return ResolveCompleted(request, message.resolution)

    # -- outbound builders ------------------------------------------------------------------

    def _check_active(self) -> None:
        if self._state is ChildState.CLOSED:
            raise LocalProtocolError(_S.CLOSED)
        if self._state is not ChildState.ACTIVE:
            raise LocalProtocolError(_S.NOT_ACTIVE, "the link is not established")

    def snapshot_begin(self, snapshot: int, base_sequence: int) -> SnapshotBegin:
        """Open snapshot ``snapshot`` at ``base_sequence``."""
        self._check_active()
        return SnapshotBegin(snapshot, base_sequence)

    def snapshot_chunk(
        self, snapshot: int, chunk: int, entries: tuple[ProcEntry, ...]
    ) -> SnapshotChunk:
        """Chunk ``chunk`` of snapshot ``snapshot``."""
        self._check_active()
        return SnapshotChunk(snapshot, chunk, entries)

    def snapshot_end(self, snapshot: int, chunks: int) -> SnapshotEnd:
        """Commit snapshot ``snapshot`` of ``chunks`` chunks."""
        self._check_active()
        return SnapshotEnd(snapshot, chunks)

    def delta(
        self, sequence: int, upserts: tuple[ProcEntry, ...] = (), removals: tuple[Pid, ...] = ()
    ) -> Delta:
        """Publication ``sequence``."""
        self._check_active()
        return Delta(sequence, upserts, removals)

    def resolve(
        self, request: int, pid: Pid, consistency: Consistency = Consistency.CACHED
    ) -> Resolve:
        """Ask the parent to resolve ``pid``; ``request`` must not be pending."""
        self._check_active()
        message = Resolve(request, pid, consistency)
        self._record(request, pid)
        return message

    def enumerate(
        self,
        request: int,
        consistency: Consistency = Consistency.CACHED,
        cursor: EnumerationCursor | None = None,
        limit: int = 0,
    ) -> Enumerate:
        """Ask the parent for a page of entries; ``request`` must not be pending."""
        self._check_active()
        message = Enumerate(request, consistency, cursor, limit)
        self._record(request, None)
        return message

    def _record(self, request: int, pid: Pid | None) -> None:
        if request in self._requests:
            raise LocalProtocolError(_S.DUPLICATE_REQUEST, f"request {request} is pending")
        if len(self._requests) >= self._max_requests:
            raise LocalProtocolError(_S.TOO_MANY_REQUESTS, f"at most {self._max_requests}")
        self._requests[request] = pid

    # -- close ------------------------------------------------------------------------------

    def close(self) -> tuple[int, ...]:
        """End the session; return the ids of requests that will never be answered."""
        abandoned = tuple(self._requests)
        self._close_now()
        return abandoned

    def _close_now(self) -> None:
        self._state = ChildState.CLOSED
        self._requests.clear()
