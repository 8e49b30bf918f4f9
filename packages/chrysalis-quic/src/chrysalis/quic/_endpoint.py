"""The sans-IO, PID-routed, multi-connection QUIC endpoint (spec sections 4 and 5).

Why this module exists: aioquic gives one connection state machine; Chrysalis needs an
*endpoint* that owns many of them behind one datagram socket and one completion model, and that
enforces the rules a plain QUIC server does not know:

* **Routing by PID.** Every connection ID is ``PID || u32``. Host CIDs carry this endpoint's
  routing PID and a connection key (a counter, top bit clear); a client's Initial DCID carries
  the dialled PID and a nonce (top bit set). So every datagram on the wire names, in its first
  16 DCID bytes, the process that terminates it. Demultiplexing is a dictionary lookup of the
  20-byte DCID (``routes``), with ``initial_routes`` absorbing a client's repeated Initials.
* **Stateless Retry before any state** (``_retry``): the first Initial of an unknown client
  gets a Retry; state is allocated only for a valid token, and only within the admission
  limits (connections, pending handshakes, connections per source).
* **Identity from certificates.** Both sides present certificates (the server requests the
  client's); when the handshake completes the endpoint verifies the peer chain with its
  identity's roots and derives the peer PID from the leaf. A connection dialled for PID X that
  does not prove X, or a peer without a trusted certificate, gets ``AuthenticationFailed`` and
  an application close with code 1. Stream data is never delivered before that verdict (events
  of the same datagram can follow the handshake's completion).
* **Ordered, owned stream operations** (the completion model of ``chrysalis.core.completion``):
  per stream and direction, operations run strictly in submission order; sends complete on
  acknowledgement and in submission order; every accepted operation gets exactly one terminal
  completion carrying its buffer back; a connection's ``ConnectionClosed`` follows every
  completion of its operations; ``DriverStopped`` is the endpoint's last completion.
* **Bounds everywhere.** Each stream keeps at most ``stream_send_buffer`` unacknowledged bytes
  inside the engine (aioquic has no send backpressure); received bytes waiting for a posted
  receive are bounded by the flow-control windows, which slide only as the application
  consumes; completions wait in a bounded staging queue when the application falls behind,
  and beyond it received datagrams are dropped (QUIC retransmits) so protocol progress pauses
  instead of memory growing.

Theory of operation (one owner, no locks: every method is called from the driver's loop)::

    receive_datagram(data, source, now)   # per datagram: demux, Retry/admission, feed engine,
                                          # drain engine events into stream state
    poll(now)                             # cancellations, then submissions (FIFO), stream
                                          # progress, reaping, shutdown, completion staging
    datagrams_to_send(now)                # one batch for the socket (Retry packets first)
    get_timer() / handle_timer(now)       # one timer: the earliest engine or shutdown deadline

``now`` is seconds on the caller's clock; ``now + wall_clock_offset`` must be POSIX time (it
dates Retry tokens and checks certificate validity). Nothing here imports a socket, an event
loop or a clock, so tests drive two endpoints with a virtual clock and a simulated network.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, TypeAlias, cast, final

from aioquic._buffer import Buffer
from aioquic.quic.packet import (
    QuicPacketType,
    QuicProtocolVersion,
    encode_quic_retry,
    pull_quic_header,
)

from chrysalis.core import CID_LEN, PID_LEN, UDP_SCHEME, ConnectionId, DatagramAddr, Pid
from chrysalis.core.completion import (
    AbortStarted,
    AuthenticationFailed,
    CloseQueued,
    CommandError,
    CommandFailed,
    CommandResult,
    CommandSubmission,
    Completion,
    CompletionQueueClosed,
    CompletionQueueFull,
    ConnectionClosed,
    ConnectionCreated,
    ConnectionEstablished,
    ConnectionRef,
    ConnectionRefAllocator,
    ControlOutcome,
    CreditPermit,
    DiscardSubmission,
    DriverStopped,
    EndpointChannels,
    EndpointSubmission,
    FinishSubmission,
    IncomingStream,
    ReceiveCompletion,
    ReceiveStatus,
    ReceiveSubmission,
    ResetSubmission,
    SendOutcome,
    SendSubmission,
    ShutdownStarted,
    StopSubmission,
    StreamClosed,
    StreamOpened,
    StreamRef,
)
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._engines import DEFAULT_ENGINE
from chrysalis.quic._engines.base import (
    AUTHENTICATION_FAILED_CODE,
    CidIssued,
    CidRetired,
    EngineConnection,
    EngineFactory,
    EngineHints,
    HandshakeCompleted,
    QuicEngine,
    StopSendingReceived,
    StreamDataReceived,
    StreamResetReceived,
    Terminated,
    TerminationKind,
)
from chrysalis.quic._identity import Identity, PeerVerificationError, describe_certificate
from chrysalis.quic._retry import InvalidRetryToken, RetryTokens

__all__ = [
    "AUTHENTICATION_FAILED_CODE",
    "Abort",
    "Close",
    "Connect",
    "ConnectionKeyExhausted",
    "ConnectionStatistics",
    "EndpointRole",
    "EndpointState",
    "EndpointStatistics",
    "OpenBidi",
    "QuicCommand",
    "QuicEndpoint",
    "Shutdown",
]

SHUTDOWN_CLOSE_CODE: Final = 0
"""Application close code used when the endpoint shuts down."""
_INTERNAL_ERROR: Final = 0x1
_KEY_LIMIT: Final = 1 << 31
_STREAM_ID_LIMIT: Final = 1 << 62
_VARINT_MAX: Final = (1 << 62) - 1
_MAX_REASON: Final = 1024
_MAX_OUTBOX: Final = 1024
_NO_TIMER: Final = float("inf")
_SHORT_HEADER_MIN: Final = 1 + CID_LEN
_AUTH_REASON: Final = "peer identity mismatch"
_SHUTDOWN_REASON: Final = "endpoint shutdown"


# --- commands ----------------------------------------------------------------------------------


def _check_code(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _VARINT_MAX:
        raise ValueError(f"{name} must be in 0..{_VARINT_MAX}, got {value}")


@dataclass(frozen=True, slots=True)
class Connect:
    """Dial ``peer``: Initial DCID prefix ``route`` (where the packets are delivered).

    ``expected`` is the PID the peer's certificate must hash to (None: accept any trusted
    peer, for discovery); ``source`` overrides the prefix of our own CIDs (default: the
    endpoint's routing PID); ``server_name`` is verified against the peer's certificate
    (an IP literal against an IP SAN) and sent as SNI when it is a DNS name (None: no name
    check, the PID is the identity). Result: ``ConnectionCreated``; the handshake's outcome
    arrives later as ``ConnectionEstablished`` or ``AuthenticationFailed``.
    """

    route: Pid
    peer: DatagramAddr
    expected: Pid | None = None
    source: Pid | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.route, Pid) or not isinstance(self.peer, DatagramAddr):
            raise TypeError("Connect needs a Pid route and a DatagramAddr peer")
        if self.server_name is not None and not 1 <= len(self.server_name) <= 253:
            raise ValueError("server_name must be 1 to 253 characters")


@dataclass(frozen=True, slots=True)
class OpenBidi:
    """Open a local bidirectional stream on ``connection``. Result: ``StreamOpened``.

    Only local state is created; nothing is sent until the first data or FIN.
    """

    connection: ConnectionRef


@dataclass(frozen=True, slots=True)
class Close:
    """Close ``connection`` with an application ``error_code``. Result: ``CloseQueued``."""

    connection: ConnectionRef
    error_code: int = 0
    reason: str = ""

    def __post_init__(self) -> None:
        _check_code("error_code", self.error_code)
        if len(self.reason) > _MAX_REASON:
            raise ValueError(f"reason longer than {_MAX_REASON} characters")


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Graceful shutdown (submit with ``submit_and_close``): stop admission, let queued work
    finish and every FIN already handed over be acknowledged (a finish completes earlier,
    once the engine has it), close every connection with code 0, abandon what remains after
    ``grace`` seconds, then ``DriverStopped``. Result: ``ShutdownStarted``."""

    grace: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.grace, bool) or not isinstance(self.grace, int | float):
            raise TypeError("grace must be a number of seconds")
        if not 0.0 <= float(self.grace) <= 3600.0:
            raise ValueError("grace must be in [0, 3600] seconds")


@dataclass(frozen=True, slots=True)
class Abort:
    """Immediate shutdown (submit with ``submit_and_close``): every connection is abandoned
    at once and every operation returned, then ``AbortStarted`` and ``DriverStopped``."""


QuicCommand: TypeAlias = Connect | OpenBidi | Close | Shutdown | Abort
"""The commands a ``QuicEndpoint`` executes."""


class EndpointRole(enum.Enum):
    """Which connections an endpoint makes: dial only, accept only, or both."""

    CLIENT = "client"
    SERVER = "server"
    DUPLEX = "duplex"


class EndpointState(enum.Enum):
    """Lifecycle of an endpoint."""

    RUNNING = "running"
    DRAINING = "draining"
    """Shutdown or abort began; admission is closed."""
    STOPPED = "stopped"
    """``DriverStopped`` and everything before it reached the application."""


class ConnectionKeyExhausted(RuntimeError):
    """The endpoint issued 2**31 - 1 connection keys (or initial nonces); keys are never
    reused, so no further connection ID can be issued."""


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    """A snapshot of one connection (spec 5.11).

    ``datagrams_*`` and ``bytes_*`` count what crossed the carrier (QUIC overhead
    included); ``stream_bytes_sent`` counts application bytes handed to QUIC and
    ``stream_bytes_received`` application bytes received on streams. RTT, congestion window,
    bytes in flight and PTO count come from the engine's recovery state.
    """

    connection: ConnectionRef
    local_pid: Pid
    peer: Pid | None
    established: bool
    datagrams_sent: int
    bytes_sent: int
    datagrams_received: int
    bytes_received: int
    stream_bytes_sent: int
    stream_bytes_received: int
    smoothed_rtt: float
    congestion_window: int
    bytes_in_flight: int
    pto_count: int
    active_streams: int
    reclaimed_streams: int


@dataclass(frozen=True, slots=True)
class EndpointStatistics:
    """A snapshot of the endpoint's state and error counters (spec 5.11).

    Counters: ``parse_errors`` (undecodable long headers), ``routing_errors`` (datagrams with
    no route: empty, short, unknown CID, wrong CID length, non-Initial miss),
    ``cid_collisions``, ``authentication_failures``, ``engine_errors`` (the QUIC engine raised;
    its connection was dropped), ``admission_rejections``, ``invalid_retry_tokens``,
    ``retries_sent``, ``backpressure_drops`` (datagrams dropped while completions were staged
    beyond the bound), ``refused_streams`` (peer streams over the per-connection limit),
    ``keepalive_pings`` (PINGs sent because a connection was silent for
    ``QuicConfig.keepalive_interval``).
    """

    state: EndpointState
    active_connections: int
    pending_handshakes: int
    active_streams: int
    reclaimed_streams: int
    staged_completions: int
    datagrams_received: int
    datagrams_sent: int
    parse_errors: int
    routing_errors: int
    cid_collisions: int
    authentication_failures: int
    engine_errors: int
    admission_rejections: int
    invalid_retry_tokens: int
    retries_sent: int
    backpressure_drops: int
    refused_streams: int
    keepalive_pings: int = 0


# --- internal state ----------------------------------------------------------------------------


class _Send(enum.Enum):
    OPEN = 0
    FIN_QUEUED = 1
    RESET_QUEUED = 2
    FINISHED = 3


class _Recv(enum.Enum):
    OPEN = 0
    FIN = 1
    RESET = 2
    STOPPED = 3
    CLOSED = 4


class _Conn(enum.Enum):
    HANDSHAKING = 0
    ESTABLISHED = 1
    FAILED = 2  # authentication rejected: closing, no stream delivery


_SendOp: TypeAlias = SendSubmission | FinishSubmission | ResetSubmission
_RecvOp: TypeAlias = ReceiveSubmission | DiscardSubmission | StopSubmission
_StreamOp: TypeAlias = _SendOp | _RecvOp
_Staged: TypeAlias = tuple[Completion, CreditPermit | None]


@final
class _SendRecord:
    """One send waiting for its terminal completion, in submission order."""

    __slots__ = ("end", "rejected", "submission")

    def __init__(self, submission: SendSubmission, end: int, rejected: bool) -> None:
        self.submission = submission
        self.end = end
        self.rejected = rejected


@final
class _Stream:
    """Per-stream state: both halves, the ordered operation queues, received bytes."""

    __slots__ = (
        "ack_check",
        "announced",
        "buffered",
        "chunks",
        "consumed",
        "discarded",
        "fin_received",
        "head_pos",
        "local",
        "queued",
        "queued_end",
        "recv_code",
        "recv_ops",
        "recv_state",
        "ref",
        "send_ops",
        "send_order",
        "send_pos",
        "send_state",
        "sid",
    )

    def __init__(self, ref: StreamRef, local: bool) -> None:
        self.ref = ref
        self.sid = ref.stream
        self.local = local
        self.announced = local
        self.queued = False
        self.send_state = _Send.OPEN
        self.send_ops: deque[_SendOp] = deque()
        self.send_order: deque[_SendRecord] = deque()
        # Whether ``send_order`` may hold records that can complete now: set where the engine
        # may have learned of acknowledgements (a datagram received, a timer) and when a
        # rejected record is queued; a progress pass that only submitted data skips the
        # check (nothing it does acknowledges anything).
        self.ack_check = False
        self.send_pos = 0  # bytes of the head data op already handed to the engine
        self.queued_end = 0  # stream offset after every accepted send
        self.recv_state = _Recv.OPEN
        self.recv_code: int | None = None
        self.recv_ops: deque[_RecvOp] = deque()
        self.chunks: deque[bytes] = deque()
        self.head_pos = 0  # bytes of chunks[0] already consumed
        self.buffered = 0  # received bytes waiting in chunks
        self.consumed = 0  # stream offset consumed by receives or dropped
        self.fin_received = False
        self.discarded = 0  # progress of the head discard op


@final
class _Connection:
    """Per-connection state around one engine connection."""

    __slots__ = (
        "announced",
        "buffered",
        "bytes_received",
        "bytes_sent",
        "cids",
        "close_code",
        "consumed_noop",
        "datagrams_received",
        "datagrams_sent",
        "engine",
        "expected",
        "hints",
        "initial_key",
        "is_client",
        "last_heard",
        "local_pid",
        "next_local_sid",
        "peer",
        "peer_next_sid",
        "pending",
        "reclaimed",
        "ref",
        "runnable",
        "sending",
        "server_name",
        "source_key",
        "state",
        "stream_bytes_received",
        "stream_bytes_sent",
        "streams",
        "terminated",
    )

    def __init__(
        self,
        ref: ConnectionRef,
        engine: EngineConnection,
        *,
        is_client: bool,
        local_pid: Pid,
        expected: Pid | None,
        server_name: str | None,
    ) -> None:
        self.ref = ref
        self.engine = engine
        # ``EngineHints``, looked for once (an engine without them is driven as before):
        # the engine itself when it has an event container, and whether its
        # ``stream_consumed`` does nothing.
        self.hints: EngineHints | None = (
            None if getattr(engine, "event_queue", None) is None else cast(EngineHints, engine)
        )
        self.consumed_noop = bool(getattr(engine, "stream_consumed_noop", False))
        self.is_client = is_client
        self.announced = is_client  # the application knows a server connection at its verdict
        self.local_pid = local_pid
        self.expected = expected
        self.server_name = server_name
        self.peer: Pid | None = None
        self.state = _Conn.HANDSHAKING
        self.pending = False
        self.last_heard = 0.0  # when the last datagram of this connection arrived (keepalive)
        self.source_key: object | None = None
        self.initial_key: tuple[bytes, bytes, DatagramAddr] | None = None
        self.cids: set[bytes] = set()
        self.streams: dict[int, _Stream] = {}
        self.runnable: deque[_Stream] = deque()
        self.sending: set[_Stream] = set()
        self.next_local_sid = 0 if is_client else 1
        self.peer_next_sid = 1 if is_client else 0
        self.buffered = 0
        self.reclaimed = 0
        self.datagrams_sent = 0
        self.bytes_sent = 0
        self.datagrams_received = 0
        self.bytes_received = 0
        self.stream_bytes_sent = 0
        self.stream_bytes_received = 0
        self.terminated: Terminated | None = None
        self.close_code: int | None = None

    def is_peer_stream(self, sid: int) -> bool:
        """Peer-initiated: the initiator bit differs from ours."""
        return (sid & 1) != (0 if self.is_client else 1)


def _source_key(address: DatagramAddr) -> object:
    """Per-source admission key: the IP for UDP (port ignored), else the whole address."""
    if address.scheme == UDP_SCHEME:
        return address.ip
    return address


class PollHint(Protocol):
    """What ``QuicEndpoint.poll_hint`` needs: a driver notifier (the channels'
    ``driver_notifier``) that sets ``unpolled`` on every notification (a submission into an
    empty queue, a cancellation, a released event credit, completion-queue space, the queue
    closing); ``poll`` clears it. Only for a notifier that is notified on the driver's own
    thread, or before the driver is woken (a notification must lead to another poll)."""

    unpolled: bool


# --- the endpoint -------------------------------------------------------------------------------


@final
class QuicEndpoint:
    """A PID-routed QUIC endpoint over any datagram carrier, driven without I/O.

    Args:
        identity: this process's certificate chain, key and trust roots; the peer chain of
            every connection is verified against ``identity.roots``.
        role: dial, accept, or both (``EndpointRole``).
        routing_pid: the prefix of our CIDs on dialled connections (default
            ``identity.pid``; ``Pid.LINK_LOCAL`` for a link-local endpoint). Accepted
            connections use whatever prefix the client's packets carried.
        limits: admission limits (``EndpointLimits``).
        config: QUIC parameters and endpoint bounds (``QuicConfig``).
        channels: the completion model this endpoint serves: it drains
            ``channels.submissions`` (``QuicCommand`` commands and stream operations) and
            emits into ``channels.completion_sender``; lifecycle events take
            ``channels.event_credits``.
        now: the creation time on the caller's clock (dates the first Retry secret).
        wall_clock_offset: seconds to add to ``now`` to get POSIX time.
        engine: builds the QUIC engine (default: the engines package's ``DEFAULT_ENGINE``, aioquic).
        random_bytes: entropy for Retry secrets (tests pass a seeded source).

    Drive it from one thread or task: after a batch of ``receive_datagram`` calls, call
    ``poll``, send ``datagrams_to_send``, then wait for the socket, the channels' driver
    notifier or ``get_timer`` and call ``handle_timer`` when it is due. The endpoint never
    raises for hostile or malformed datagrams; it counts them (``statistics``).
    """

    __slots__ = (
        "_acks_held",
        "_active",
        "_backlogged",
        "_channels",
        "_config",
        "_conn_refs",
        "_conns",
        "_counters",
        "_deadline",
        "_dirty",
        "_engine",
        "_identity",
        "_initial_routes",
        "_limits",
        "_next_key",
        "_next_nonce",
        "_outbox",
        "_pending",
        "_per_source",
        "_ping_uid",
        "_reap",
        "_retry",
        "_role",
        "_routes",
        "_routing_pid",
        "_shutdown_closed",
        "_staged",
        "_stale",
        "_state",
        "_stopped_staged",
        "_timer_min",
        "_timers",
        "_wall_offset",
        "emitted",
        "hold_ack_checks",
        "poll_hint",
    )

    def __init__(
        self,
        identity: Identity,
        *,
        role: EndpointRole,
        routing_pid: Pid | None = None,
        limits: EndpointLimits | None = None,
        config: QuicConfig | None = None,
        channels: EndpointChannels[QuicCommand],
        now: float = 0.0,
        wall_clock_offset: float = 0.0,
        engine: EngineFactory | None = None,
        random_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        if not isinstance(role, EndpointRole):
            raise TypeError(f"role must be an EndpointRole, not {type(role).__name__}")
        self._identity = identity
        self._role = role
        self._routing_pid = identity.pid if routing_pid is None else routing_pid
        self._limits = EndpointLimits() if limits is None else limits
        self._config = QuicConfig() if config is None else config
        self._channels = channels
        self._wall_offset = float(wall_clock_offset)
        factory: EngineFactory = DEFAULT_ENGINE if engine is None else engine
        entropy = secrets.token_bytes if random_bytes is None else random_bytes
        self._engine: QuicEngine = factory(self._config, identity)
        self._retry = RetryTokens(
            now=now + self._wall_offset,
            token_lifetime=self._config.retry_token_lifetime,
            secret_lifetime=self._config.retry_secret_lifetime,
            random_bytes=entropy,
        )
        self._conn_refs = ConnectionRefAllocator(channels.driver)
        self._conns: dict[ConnectionRef, _Connection] = {}
        self._routes: dict[bytes, _Connection] = {}
        self._initial_routes: dict[tuple[bytes, bytes, DatagramAddr], _Connection] = {}
        self._per_source: dict[object, int] = {}
        self._pending = 0
        self._next_key = 1
        # Initial nonces count up from a random start below 2^30 (at least 2^30 dials before
        # ``ConnectionKeyExhausted``): unique within this endpoint's life, as the contract asks,
        # and unlike a count from 1, a process restarted with the same identity on the same
        # address does not repeat its last incarnation's first Initial (DCID, SCID, source),
        # which a peer would still route to the old connection until it idled out.
        self._next_nonce = 1 + int.from_bytes(entropy(4), "big") % (1 << 30)
        self._dirty: dict[_Connection, None] = {}
        # Engine timers are cached per connection: asking an engine scans its loss-detection
        # state, so only connections touched since the last look (``_dirty`` and ``_stale``)
        # are asked again. Every engine call that can move a timer marks its connection.
        self._timers: dict[_Connection, float] = {}
        # ``min(_timers.values())`` (or ``_NO_TIMER``), kept with every change of ``_timers``:
        # ``timer_due`` runs on every step, ``get_timer`` on every flush.
        self._timer_min = _NO_TIMER
        self._stale: dict[_Connection, None] = {}
        self._backlogged = False
        # Completions handed to the completion queue so far (and one more when it closes):
        # a driver that saw it unchanged since its last dispatch has nothing to dispatch.
        # Read-only for callers.
        self.emitted = 0
        # While a driver sets ``hold_ack_checks``, a datagram that may acknowledge stream data
        # only records its connection here; the first ``poll`` without the hold checks its
        # sending streams. Why: the inline driver holds them from a datagram's arrival until
        # the reply it causes has left, so that completing the sends it acknowledged is no
        # longer on the path from request to reply (both peers wait on that path).
        self.hold_ack_checks = False
        self._acks_held: dict[_Connection, None] = {}
        # An inline driver's notifier (see ``PollHint``): while it says that nothing was
        # submitted, cancelled or released since the last ``poll`` and the endpoint has no
        # work of its own queued, ``poll`` returns at once. None (every other driver): every
        # ``poll`` looks at the submission queue.
        self.poll_hint: PollHint | None = None
        self._active: dict[_Connection, None] = {}
        self._reap: list[_Connection] = []
        self._outbox: list[tuple[bytes, DatagramAddr]] = []
        self._staged: deque[_Staged] = deque()
        self._state = EndpointState.RUNNING
        self._deadline: float | None = None
        self._shutdown_closed = False
        self._stopped_staged = False
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "datagrams_received",
                "datagrams_sent",
                "parse_errors",
                "routing_errors",
                "cid_collisions",
                "authentication_failures",
                "engine_errors",
                "admission_rejections",
                "invalid_retry_tokens",
                "retries_sent",
                "backpressure_drops",
                "refused_streams",
                "reclaimed_streams",
                "keepalive_pings",
            ),
            0,
        )
        self._ping_uid = 0

    # -- public properties ----------------------------------------------------------------------

    @property
    def routing_pid(self) -> Pid:
        """The prefix of this endpoint's CIDs on dialled connections."""
        return self._routing_pid

    @property
    def role(self) -> EndpointRole:
        """What this endpoint dials and accepts."""
        return self._role

    @property
    def state(self) -> EndpointState:
        """RUNNING, DRAINING (shutdown or abort began) or STOPPED."""
        return self._state

    @property
    def backlogged(self) -> bool:
        """True when the last ``poll`` stopped at ``max_submissions_per_poll`` and may have
        left submissions or cancellations behind: the caller must poll again rather than
        wait for a new notification. (Work held back by the staged-completion bound is not
        counted: it waits for the application to consume completions.)"""
        return self._backlogged

    @property
    def is_stopped(self) -> bool:
        """True once ``DriverStopped`` (the last completion) reached the completion queue."""
        return self._state is EndpointState.STOPPED

    # -- I/O boundary ---------------------------------------------------------------------------

    def receive_datagram(self, data: bytes, source: DatagramAddr, now: float) -> None:
        """Handle one received datagram from ``source`` at ``now``.

        Never raises for any ``bytes`` content: undecodable or unroutable datagrams are
        counted and dropped, a Retry is queued for ``datagrams_to_send``, and an engine
        failure drops only its own connection.
        """
        counters = self._counters
        counters["datagrams_received"] += 1
        if len(self._staged) >= self._config.max_staged_completions:
            counters["backpressure_drops"] += 1
            return
        n = len(data)
        if n == 0:
            counters["routing_errors"] += 1
            return
        if not data[0] & 0x80:
            if n < _SHORT_HEADER_MIN:
                counters["routing_errors"] += 1
                return
            conn = self._routes.get(data[1:_SHORT_HEADER_MIN])
            if conn is None:
                counters["routing_errors"] += 1
                return
            self._feed(conn, data, source, now)
        else:
            self._receive_long(data, source, now)
        if self._reap:
            self._reap_terminated(now)

    def _receive_long(self, data: bytes, source: DatagramAddr, now: float) -> None:
        counters = self._counters
        if len(data) > 6 + CID_LEN and data[5] == CID_LEN:
            conn = self._routes.get(data[6 : 6 + CID_LEN])
            if conn is not None:
                self._feed(conn, data, source, now)
                return
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=CID_LEN)
        except (ValueError, KeyError):  # BufferReadError is a ValueError
            counters["parse_errors"] += 1
            return
        dcid, scid = header.destination_cid, header.source_cid
        if len(dcid) != CID_LEN or len(scid) != CID_LEN:
            counters["routing_errors"] += 1
            return
        conn = self._routes.get(dcid)
        if conn is None and header.packet_type is QuicPacketType.INITIAL:
            conn = self._initial_routes.get((dcid, scid, source))
        if conn is not None:
            self._feed(conn, data, source, now)
            return
        if (
            header.packet_type is not QuicPacketType.INITIAL
            or header.version != QuicProtocolVersion.VERSION_1
            or self._role is EndpointRole.CLIENT
            or len(data) < 1200
        ):
            counters["routing_errors"] += 1
            return
        if self._state is not EndpointState.RUNNING:
            counters["admission_rejections"] += 1
            return
        self._accept(data, source, now, dcid, scid, header.token, header.version)

    def _accept(
        self,
        data: bytes,
        source: DatagramAddr,
        now: float,
        dcid: bytes,
        scid: bytes,
        token: bytes,
        version: int,
    ) -> None:
        counters = self._counters
        local_pid = Pid(dcid[:PID_LEN])
        retry_scid: bytes | None
        if self._config.retry:
            wall = now + self._wall_offset
            if not token:
                if len(self._outbox) >= _MAX_OUTBOX:
                    counters["admission_rejections"] += 1
                    return
                try:
                    retry_cid = self._issue_cid(local_pid)
                except ConnectionKeyExhausted:
                    counters["admission_rejections"] += 1
                    return
                packet = encode_quic_retry(
                    version=version,
                    source_cid=retry_cid,
                    destination_cid=scid,
                    original_destination_cid=dcid,
                    retry_token=self._retry.mint(source, dcid, wall),
                )
                self._outbox.append((packet, source))
                counters["retries_sent"] += 1
                return
            try:
                original_dcid = self._retry.validate(token, source, wall)
            except InvalidRetryToken:
                counters["invalid_retry_tokens"] += 1
                return
            host_cid = dcid
            retry_scid = dcid
        else:
            original_dcid = dcid
            retry_scid = None
            try:
                host_cid = self._issue_cid(local_pid)
            except ConnectionKeyExhausted:
                counters["admission_rejections"] += 1
                return
        key = _source_key(source)
        if (
            len(self._conns) >= self._limits.max_connections
            or self._pending >= self._limits.max_pending_handshakes
            or self._per_source.get(key, 0) >= self._limits.max_connections_per_source
        ):
            counters["admission_rejections"] += 1
            return
        if host_cid in self._routes:
            counters["cid_collisions"] += 1
            return
        try:
            engine = self._engine.accept(
                host_cid=host_cid,
                original_dcid=original_dcid,
                retry_scid=retry_scid,
                issue_cid=lambda: self._issue_cid(local_pid),
            )
        except Exception:  # an engine bug must not take the endpoint down
            counters["engine_errors"] += 1
            return
        conn = _Connection(
            self._conn_refs.allocate(),
            engine,
            is_client=False,
            local_pid=local_pid,
            expected=None,
            server_name=None,
        )
        self._conns[conn.ref] = conn
        self._routes[host_cid] = conn
        conn.cids.add(host_cid)
        conn.initial_key = (dcid, scid, source)
        self._initial_routes[conn.initial_key] = conn
        conn.pending = True
        self._pending += 1
        conn.source_key = key
        self._per_source[key] = self._per_source.get(key, 0) + 1
        self._feed(conn, data, source, now)
        if conn.terminated is None and not conn.engine.peer_packet_seen:
            # Nothing in the datagram authenticated (for example a valid token replayed in a
            # corrupted packet): keep no state for it.
            counters["admission_rejections"] += 1
            self._remove(conn)

    def _feed(self, conn: _Connection, data: bytes, source: DatagramAddr, now: float) -> None:
        conn.datagrams_received += 1
        conn.last_heard = now
        conn.bytes_received += len(data)
        try:
            conn.engine.receive_datagram(data, source, now)
        except Exception:  # an engine bug must not take the endpoint down
            self._engine_failed(conn)
            return
        self._dirty[conn] = None
        self._drain_events(conn, now)
        if conn.sending and conn.state is _Conn.ESTABLISHED:
            # Acknowledgements may have arrived: completions and room for more data.
            if self.hold_ack_checks:
                self._acks_held[conn] = None
                return
            for stream in conn.sending:
                stream.ack_check = True
                self._mark(conn, stream)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, DatagramAddr]]:
        """The datagrams to transmit now, with their destinations (Retry packets first).

        Only connections with new activity are asked (the engine's pacing and loss timers
        come back through ``handle_timer``).
        """
        out = self._outbox
        self._outbox = []
        if self._dirty:
            dirty = self._dirty
            self._dirty = {}
            for conn in dirty:
                if conn.terminated is not None and conn.engine.is_terminated:
                    continue
                self._stale[conn] = None
                try:
                    batch = conn.engine.datagrams_to_send(now)
                except Exception:
                    self._engine_failed(conn)
                    continue
                if batch:
                    count = len(batch)
                    conn.datagrams_sent += count
                    if count == 1:
                        conn.bytes_sent += len(batch[0][0])
                    else:
                        conn.bytes_sent += sum(len(datagram) for datagram, _ in batch)
                    out.extend(batch)
                # Writing can queue events too (a NEW_CONNECTION_ID announces a CID): route it
                # before the peer can use it. An engine whose ``EngineHints`` say nothing is
                # queued (the common case after a send) costs no drain call.
                hints = conn.hints
                if hints is None or hints.event_queue or hints.events_withheld:
                    self._drain_events(conn, now)
            if self._reap:
                self._reap_terminated(now)
        self._counters["datagrams_sent"] += len(out)
        return out

    def get_timer(self) -> float | None:
        """The earliest time ``handle_timer`` must run (engine timers, shutdown deadline).

        Only the engines of connections touched since the previous call are asked; the
        others' timers come from the cache."""
        if self._dirty or self._stale:
            self._refresh_timers()
        timer = self._deadline
        at = self._timer_min
        if at != _NO_TIMER and (timer is None or at < timer):
            timer = at
        return timer

    def timer_due(self, now: float) -> bool:
        """Whether ``handle_timer`` has work at ``now`` by the cached deadlines, without asking
        any engine: a cheap check for a driver that just fed datagrams. A deadline those
        datagrams moved earlier is not seen here; the next ``get_timer`` reports it."""
        deadline = self._deadline
        if deadline is not None and deadline <= now:
            return True
        return self._timer_min <= now

    def _refresh_timers(self) -> None:
        timers = self._timers
        conns = self._conns
        keepalive = self._config.keepalive_interval
        for pending in (self._dirty, self._stale):
            for conn in pending:
                if conns.get(conn.ref) is not conn:
                    continue
                at = conn.engine.get_timer()
                if (
                    keepalive is not None
                    and conn.state is _Conn.ESTABLISHED
                    and conn.close_code is None
                ):
                    # The keepalive shares the connection's one timer slot.
                    ping_at = conn.last_heard + keepalive
                    if at is None or ping_at < at:
                        at = ping_at
                if at is None:
                    timers.pop(conn, None)
                else:
                    timers[conn] = at
        self._stale.clear()
        self._timer_min = min(timers.values()) if timers else _NO_TIMER

    def handle_timer(self, now: float) -> None:
        """Fire every engine timer that is due and the shutdown deadline."""
        if self._dirty or self._stale:
            self._refresh_timers()
        keepalive = self._config.keepalive_interval
        for conn in [conn for conn, at in self._timers.items() if at <= now]:
            self._stale[conn] = None
            try:
                if (
                    keepalive is not None
                    and conn.state is _Conn.ESTABLISHED
                    and conn.terminated is None
                    and conn.close_code is None
                    and now >= conn.last_heard + keepalive
                ):
                    # Silent for a whole interval: a PING makes a live peer answer (its ACK
                    # restarts both idle timers). The next one follows an interval later
                    # unless the peer is heard from before.
                    conn.last_heard = now
                    self._ping_uid += 1
                    conn.engine.send_ping(self._ping_uid)
                    self._counters["keepalive_pings"] += 1
                conn.engine.handle_timer(now)
            except Exception:
                self._engine_failed(conn)
                continue
            self._dirty[conn] = None
            self._drain_events(conn, now)
            if conn.sending and conn.state is _Conn.ESTABLISHED:
                # An engine may learn on a timer that bytes were acknowledged (qh3 does).
                if self.hold_ack_checks:
                    self._acks_held[conn] = None
                    continue
                for stream in conn.sending:
                    stream.ack_check = True
                    self._mark(conn, stream)
        if self._reap:
            self._reap_terminated(now)
        if self._state is EndpointState.DRAINING:
            self._advance_shutdown(now)

    # -- engine events ------------------------------------------------------------------------

    def _drain_events(self, conn: _Connection, now: float) -> None:
        engine = conn.engine
        # ``EngineHints``: with an ``event_queue``, ``next_event`` is asked only while the
        # queue holds events or the engine withholds some (plain attribute reads, no call
        # that finds nothing after the last event); events still come one by one, in the
        # engine's order, and each is handled before the next is asked for.
        hints = conn.hints
        while (hints is None or hints.event_queue or hints.events_withheld) and (
            event := engine.next_event()
        ) is not None:
            # The exact type first (engines build exactly this class; no isinstance call
            # for the common event), any subclass still through ``isinstance``.
            if type(event) is StreamDataReceived or isinstance(event, StreamDataReceived):
                self._on_stream_data(conn, event)
            elif isinstance(event, HandshakeCompleted):
                self._authenticate(conn, now)
            elif isinstance(event, StreamResetReceived):
                self._on_stream_reset(conn, event.stream_id, event.error_code)
            elif isinstance(event, StopSendingReceived):
                self._on_stop_sending(conn, event.stream_id)
            elif isinstance(event, CidIssued):
                if event.cid in self._routes and self._routes[event.cid] is not conn:
                    self._counters["cid_collisions"] += 1
                else:
                    self._routes[event.cid] = conn
                    conn.cids.add(event.cid)
            elif isinstance(event, CidRetired):
                if self._routes.get(event.cid) is conn:
                    del self._routes[event.cid]
                conn.cids.discard(event.cid)
            elif isinstance(event, Terminated) and conn.terminated is None:
                conn.terminated = event
                self._reap.append(conn)

    def _authenticate(self, conn: _Connection, now: float) -> None:
        if conn.state is not _Conn.HANDSHAKING:
            return
        chain = conn.engine.peer_certificate_chain()
        actual: Pid | None = None
        trusted = False
        refusal = "the peer presented no certificate"
        if chain:
            when = datetime.datetime.fromtimestamp(now + self._wall_offset, datetime.UTC)
            try:
                actual = self._identity.verify_peer(
                    chain, now=when, server_name=conn.server_name if conn.is_client else None
                )
                trusted = True
            except (PeerVerificationError, ValueError) as exc:  # any rejection: unauthenticated
                actual = None
                refusal = (
                    f"its certificate ({describe_certificate(chain[0])}) is not trusted: {exc}"
                )
        self._leave_pending(conn)
        conn.announced = True
        if not trusted or (conn.expected is not None and actual != conn.expected):
            conn.state = _Conn.FAILED
            self._counters["authentication_failures"] += 1
            if trusted:
                refusal = (
                    f"its certificate ({describe_certificate(chain[0])}) proves a PID other than "
                    f"the expected {conn.expected}"
                )
            self._event(AuthenticationFailed(conn.ref, conn.expected, actual, refusal))
            conn.close_code = AUTHENTICATION_FAILED_CODE
            conn.engine.close(AUTHENTICATION_FAILED_CODE, _AUTH_REASON)
            self._dirty[conn] = None
            return
        assert actual is not None
        conn.peer = actual
        conn.state = _Conn.ESTABLISHED
        self._event(ConnectionEstablished(conn.ref, conn.local_pid, actual))
        for stream in conn.streams.values():
            if not stream.announced and (
                stream.buffered or stream.fin_received or (stream.recv_state is _Recv.RESET)
            ):
                stream.announced = True
                self._event(IncomingStream(stream.ref))
            self._mark(conn, stream)

    def _leave_pending(self, conn: _Connection) -> None:
        if conn.pending:
            conn.pending = False
            self._pending -= 1

    def _peer_stream(self, conn: _Connection, sid: int) -> _Stream | None:
        """The record of a stream the peer touched; opens peer streams on first sight."""
        stream = conn.streams.get(sid)
        if stream is not None:
            return stream
        if not conn.is_peer_stream(sid) or sid & 2 or sid < conn.peer_next_sid:
            return None  # ours and reclaimed, unidirectional, or a peer stream already gone
        limit = self._limits.max_streams_per_connection
        for opened in range(conn.peer_next_sid, sid + 1, 4):
            if len(conn.streams) >= limit:
                self._counters["refused_streams"] += 1
                try:
                    conn.engine.stop_stream(opened, 0)
                    conn.engine.reset_stream(opened, 0)
                except ValueError:
                    pass
                self._dirty[conn] = None
            else:
                conn.streams[opened] = _Stream(StreamRef(conn.ref, opened), local=False)
        conn.peer_next_sid = sid + 4
        return conn.streams.get(sid)

    def _on_stream_data(self, conn: _Connection, event: StreamDataReceived) -> None:
        if conn.state is _Conn.FAILED:
            return  # never delivered: the peer was not authenticated
        stream = conn.streams.get(event.stream_id)  # a known stream: no ``_peer_stream`` call
        if stream is None:
            stream = self._peer_stream(conn, event.stream_id)
        data = event.data
        if stream is None or stream.recv_state is not _Recv.OPEN or stream.fin_received:
            return  # nobody will read it: it never counts as buffered
        ops = stream.recv_ops
        if (
            data
            and not stream.buffered
            and not event.fin
            and ops
            and stream.announced
            and conn.state is _Conn.ESTABLISHED
            and conn.terminated is None
            and not self._staged  # held-back completions: the progress pass decides
            and type(op := ops[0]) is ReceiveSubmission
        ):
            # Direct delivery. Why: in a request/response exchange the reader's next receive
            # is already posted when the bytes arrive (the driver reads ahead), nothing is
            # buffered and the bytes fit. Then buffering them and completing the receive in
            # the progress pass (mark, progress, consume) only moves the same bytes twice;
            # completing here has the same outcome: the same bytes in the same order, the
            # same flow-control credit returned to the engine, and ``DATA`` once the buffer
            # holds ``min_bytes``. The append, the completion and its lease are one call of
            # the completion model (``CompletionSender.deliver_nowait``), which declines with
            # nothing changed (cancelled, too large, short of ``min_bytes``) exactly where
            # the general path below must decide.
            try:
                delivered = self._channels.completion_sender.deliver_nowait(op, data)
            except CompletionQueueFull as full:  # completed but held back: staged in order
                self._staged.append((cast(ReceiveCompletion, full.completion), full.permit))
                delivered = True
            except CompletionQueueClosed as closed:
                _release(cast(ReceiveCompletion, closed.completion), closed.permit)
                delivered = True
            else:
                if delivered:
                    self.emitted += 1
            if delivered:
                ops.popleft()
                size = len(data)
                conn.stream_bytes_received += size
                stream.consumed += size
                if not conn.consumed_noop:  # ``EngineHints``: the engine credits by itself
                    conn.engine.stream_consumed(stream.sid, stream.consumed)
                self._dirty[conn] = None
                if ops:  # further receives (and stops) go through the progress pass
                    self._mark(conn, stream)
                return
        if data:
            conn.stream_bytes_received += len(data)
            stream.chunks.append(data)
            stream.buffered += len(data)
            conn.buffered += len(data)
            conn.engine.set_buffered(conn.buffered)
        if event.fin:
            stream.fin_received = True
        if conn.state is _Conn.ESTABLISHED:
            if not stream.announced:
                stream.announced = True
                self._event(IncomingStream(stream.ref))
            if ops:
                self._mark(conn, stream)

    def _on_stream_reset(self, conn: _Connection, sid: int, code: int) -> None:
        stream = self._peer_stream(conn, sid)
        if stream is None or stream.recv_state is not _Recv.OPEN:
            return
        self._drop_received(conn, stream)
        stream.recv_state = _Recv.RESET
        stream.recv_code = code
        if conn.state is _Conn.ESTABLISHED:
            if not stream.announced:
                stream.announced = True
                self._event(IncomingStream(stream.ref))
            self._mark(conn, stream)

    def _on_stop_sending(self, conn: _Connection, sid: int) -> None:
        stream = self._peer_stream(conn, sid)
        if stream is None:
            return
        # The engine already reset our send half: acknowledged sends complete, the rest
        # (and every queued send-side operation) is abandoned, in order. This also covers a
        # half that already queued its FIN but still waits for acknowledgements.
        self._complete_acked(conn, stream)
        self._abandon_send_half(stream)
        self._mark(conn, stream)

    def _engine_failed(self, conn: _Connection) -> None:
        self._counters["engine_errors"] += 1
        if conn.terminated is None:
            conn.terminated = Terminated(TerminationKind.TRANSPORT, _INTERNAL_ERROR, "engine error")
            self._reap.append(conn)

    # -- submissions --------------------------------------------------------------------------

    def poll(self, now: float) -> None:
        """Run the endpoint: flush staged completions, drain cancellations and then
        submissions (in FIFO order), progress runnable streams, reap closed connections and
        advance shutdown. While completions are staged beyond ``max_staged_completions`` no
        new work is taken (the application must consume completions first)."""
        state = self._state
        if state is EndpointState.STOPPED:
            return
        hint = self.poll_hint
        if hint is not None:
            if not (
                hint.unpolled
                or self._active
                or self._staged
                or self._reap
                or self._backlogged
                or (self._acks_held and not self.hold_ack_checks)
                or state is not EndpointState.RUNNING
            ):
                # Nothing reached the queues since the last poll (the driver's notifier
                # would have said so) and nothing of the endpoint's own waits: the same
                # poll would find nothing to do. (The usual case for the poll of a step
                # that only received datagrams: their data went straight to the posted
                # receive, their acknowledgements are held.)
                return
            hint.unpolled = False
        if self._acks_held and not self.hold_ack_checks:
            self._check_held_acks()
        if self._staged:
            self._flush_staged()
        submissions = self._channels.submissions
        bound = self._config.max_submissions_per_poll
        if len(self._staged) < self._config.max_staged_completions:
            cancels = submissions.drain_cancellations(bound)
            for cancel in cancels:
                conn = self._conns.get(cancel.stream.connection)
                if conn is not None:
                    stream = conn.streams.get(cancel.stream.stream)
                    if stream is not None:
                        self._mark(conn, stream)
            items = submissions.drain(bound)
            for item in items:
                self._submit(item, now)
            if self._active:
                self._progress()
            self._backlogged = len(cancels) >= bound or len(items) >= bound
        else:
            # Held back by staged completions: consuming them notifies; no busy polling.
            self._backlogged = False
            if hint is not None:
                # The queues may still hold work that no new notification will announce
                # (a push notifies only an empty queue): the next poll must look.
                hint.unpolled = True
        if self._reap:
            self._reap_terminated(now)
        if self._state is EndpointState.RUNNING and submissions.is_closed():
            self._begin_shutdown(now, float(self._config.shutdown_grace))
        if self._state is EndpointState.DRAINING:
            self._advance_shutdown(now)
        if self._staged:
            self._flush_staged()
        if self._stopped_staged and not self._staged:
            self._state = EndpointState.STOPPED
            self.emitted += 1
            self._channels.completion_sender.close()

    @property
    def acks_held(self) -> bool:
        """Whether datagrams arrived under ``hold_ack_checks`` whose acknowledgements the
        next poll without the hold must check."""
        return bool(self._acks_held)

    @property
    def has_output(self) -> bool:
        """Whether ``datagrams_to_send`` may return anything (a connection was touched
        since the last call, or a Retry or stateless packet is queued)."""
        return bool(self._dirty or self._outbox)

    def _check_held_acks(self) -> None:
        held = self._acks_held
        self._acks_held = {}
        conns = self._conns
        for conn in held:
            if conns.get(conn.ref) is not conn or conn.state is not _Conn.ESTABLISHED:
                continue
            engine = conn.engine
            for stream in conn.sending:
                order = stream.send_order
                if order and not stream.send_ops:
                    head = order[0]
                    if not head.rejected:
                        state = engine.stream_send_state(stream.sid)
                        if state is not None and head.end > state[0]:
                            # The oldest send is not acknowledged yet, so no later one is
                            # (they complete in order), and no data waits for the room an
                            # acknowledgement frees: a progress pass would do nothing
                            # (qh3 acknowledges every second packet, so about every other
                            # datagram of a request/response exchange).
                            continue
                stream.ack_check = True
                self._mark(conn, stream)

    def _submit(self, item: EndpointSubmission[QuicCommand], now: float) -> None:
        if isinstance(item, CommandSubmission):
            self._complete(item.complete(self._command(item.command, now)), item.permit)
            return
        ref = item.stream
        conn = self._conns.get(ref.connection)
        stream = None if conn is None else conn.streams.get(ref.stream)
        if conn is None or stream is None:
            self._complete_unknown(item)
            return
        if type(item) is ReceiveSubmission:  # the most common operation: a read
            ops = stream.recv_ops
            ops.append(item)
            if (
                len(ops) == 1
                and not stream.buffered
                and stream.recv_state is _Recv.OPEN
                and not stream.fin_received
                and conn.state is _Conn.ESTABLISHED
                and conn.terminated is None
                and not item.cancellation.cancelled
            ):
                # Nothing to progress: it waits for data, and whatever can complete it (data,
                # FIN, reset, a cancellation, the connection's end) marks the stream itself.
                return
            if not stream.queued:
                stream.queued = True
                conn.runnable.append(stream)
            self._active[conn] = None
            return
        if isinstance(item, SendSubmission):
            nbytes = len(item.payload)
            if stream.send_state is not _Send.OPEN:
                stream.send_order.append(_SendRecord(item, stream.queued_end, rejected=True))
                stream.ack_check = True
            else:
                stream.queued_end += nbytes
                stream.send_order.append(_SendRecord(item, stream.queued_end, rejected=False))
                if nbytes:
                    stream.send_ops.append(item)
                    if (
                        len(stream.send_ops) == 1
                        and conn.state is _Conn.ESTABLISHED
                        and conn.terminated is None
                    ):
                        # Nothing queued before it on this stream: hand it to the engine now,
                        # as the progress pass would (same order, same bounds), without
                        # marking the stream. Anything else left to do marks it as usual.
                        conn.sending.add(stream)
                        self._progress_send(conn, stream)
                        if not stream.send_order:  # the engine refused: the half was abandoned
                            self._mark(conn, stream)
                        return
            conn.sending.add(stream)
        elif isinstance(item, FinishSubmission | ResetSubmission):
            if stream.send_state is not _Send.OPEN:
                self._complete(item.complete(ControlOutcome.REJECTED), item.permit)
                return
            stream.send_state = (
                _Send.FIN_QUEUED if isinstance(item, FinishSubmission) else _Send.RESET_QUEUED
            )
            stream.send_ops.append(item)
            conn.sending.add(stream)
        else:
            stream.recv_ops.append(item)
        self._mark(conn, stream)

    def send_direct(
        self,
        ref: StreamRef,
        payload: bytes,
        admit: Callable[[StreamRef, bytes], SendSubmission | None],
    ) -> bool:
        """Admit a send with ``admit`` (``StreamSubmitter.send_direct_nowait``) and hand it
        to the stream's engine now, as ``poll`` would hand it over if it were queued: the
        send lane of a driver that runs on the submitter's thread.

        Why: a small reply written while nothing else is pending would otherwise be pushed
        into the submission queue only for the next ``poll`` to pop it and do exactly this.
        Only when that poll would do nothing else, so that the outcome, the order of
        operations and every bound are the same: the endpoint running, not backlogged, with
        nothing staged, no stream runnable, no connection to reap and no held acknowledgement
        check due; the connection established and not terminating; the stream's send half
        open with no send, finish or reset queued before it; a non-empty payload; and
        ``admit`` finding nothing queued ahead and every bound open. Returns False with
        nothing changed (the caller submits through the queue) otherwise. The send then
        completes like a queued one (in submission order, acknowledged or abandoned,
        releasing its bytes and credit); the caller must still flush (``datagrams_to_send``)
        to send it.
        """
        if (
            self._state is not EndpointState.RUNNING
            or self._backlogged
            or self._staged
            or self._active
            or self._reap
            or (self._acks_held and not self.hold_ack_checks)
        ):
            return False
        conn = self._conns.get(ref.connection)
        if conn is None or conn.state is not _Conn.ESTABLISHED or conn.terminated is not None:
            return False
        stream = conn.streams.get(ref.stream)
        if stream is None or stream.send_ops or stream.send_state is not _Send.OPEN:
            return False
        nbytes = len(payload)
        if not nbytes:
            return False
        item = admit(ref, payload)
        if item is None:
            return False
        # ``_submit``'s path for a send on an idle stream of an established connection.
        stream.queued_end += nbytes
        stream.send_order.append(_SendRecord(item, stream.queued_end, rejected=False))
        stream.send_ops.append(item)
        conn.sending.add(stream)
        self._progress_send(conn, stream)
        if not stream.send_order:  # the engine refused: the half was abandoned
            self._mark(conn, stream)
            self._progress()  # as the poll that popped it would, before its flush
        return True

    def _command(self, command: object, now: float) -> CommandResult:
        if isinstance(command, Connect):
            return self._connect(command, now)
        if isinstance(command, OpenBidi):
            return self._open_bidi(command)
        if isinstance(command, Close):
            conn = self._conns.get(command.connection)
            if conn is None:
                return CommandFailed(CommandError.UNKNOWN_CONNECTION)
            if conn.close_code is None:
                conn.close_code = command.error_code
            conn.engine.close(command.error_code, command.reason)
            self._dirty[conn] = None
            return CloseQueued(conn.ref)
        if isinstance(command, Shutdown):
            self._begin_shutdown(now, float(command.grace))
            return ShutdownStarted()
        if isinstance(command, Abort):
            self._begin_shutdown(now, 0.0)
            self._abandon_all(now)
            return AbortStarted()
        return CommandFailed(CommandError.INVALID_ARGUMENT, "unknown command")

    def _connect(self, command: Connect, now: float) -> CommandResult:
        if self._role is EndpointRole.SERVER:
            return CommandFailed(CommandError.WRONG_ROLE, "a server-only endpoint cannot dial")
        if self._state is not EndpointState.RUNNING:
            return CommandFailed(CommandError.DRIVER_STOPPED)
        if len(self._conns) >= self._limits.max_connections:
            self._counters["admission_rejections"] += 1
            return CommandFailed(CommandError.TRANSPORT, "admission limited: too many connections")
        local_pid = self._routing_pid if command.source is None else command.source
        try:
            host_cid = self._issue_cid(local_pid)
            nonce = self._next_nonce
            if nonce >= _KEY_LIMIT:
                raise ConnectionKeyExhausted("initial nonces exhausted")
            self._next_nonce = nonce + 1
        except ConnectionKeyExhausted as exc:
            return CommandFailed(CommandError.INVALID_ARGUMENT, str(exc))
        if host_cid in self._routes:
            self._counters["cid_collisions"] += 1
            return CommandFailed(CommandError.TRANSPORT, "connection ID collision")
        try:
            engine = self._engine.connect(
                host_cid=host_cid,
                initial_dcid=ConnectionId.initial(command.route, nonce).raw,
                addr=command.peer,
                server_name=command.server_name,
                issue_cid=lambda: self._issue_cid(local_pid),
                now=now,
            )
        except Exception as exc:
            self._counters["engine_errors"] += 1
            return CommandFailed(CommandError.TRANSPORT, f"engine refused: {exc}"[:200])
        conn = _Connection(
            self._conn_refs.allocate(),
            engine,
            is_client=True,
            local_pid=local_pid,
            expected=command.expected,
            server_name=command.server_name,
        )
        self._conns[conn.ref] = conn
        self._routes[host_cid] = conn
        conn.cids.add(host_cid)
        self._dirty[conn] = None
        return ConnectionCreated(conn.ref)

    def _open_bidi(self, command: OpenBidi) -> CommandResult:
        conn = self._conns.get(command.connection)
        if conn is None:
            return CommandFailed(CommandError.UNKNOWN_CONNECTION)
        if conn.terminated is not None or conn.state is _Conn.FAILED:
            return CommandFailed(CommandError.TRANSPORT, "connection is closing")
        if len(conn.streams) >= self._limits.max_streams_per_connection:
            return CommandFailed(CommandError.INVALID_ARGUMENT, "stream limit reached")
        sid = conn.next_local_sid
        if sid >= _STREAM_ID_LIMIT:
            return CommandFailed(CommandError.INVALID_ARGUMENT, "stream IDs exhausted")
        self._stale[conn] = None
        try:
            conn.engine.open_stream(sid)
        except ValueError as exc:
            return CommandFailed(CommandError.TRANSPORT, str(exc)[:200])
        conn.next_local_sid = sid + 4
        ref = StreamRef(conn.ref, sid)
        conn.streams[sid] = _Stream(ref, local=True)
        return StreamOpened(ref)

    def _issue_cid(self, pid: Pid) -> bytes:
        key = self._next_key
        if key >= _KEY_LIMIT:
            raise ConnectionKeyExhausted("connection keys exhausted")
        self._next_key = key + 1
        return ConnectionId.issued(pid, key).raw

    # -- stream progress ----------------------------------------------------------------------

    def _mark(self, conn: _Connection, stream: _Stream) -> None:
        if not stream.queued:
            stream.queued = True
            conn.runnable.append(stream)
        # Always: a connection skipped while its handshake was pending keeps its runnable
        # streams and must be revisited once it is established.
        self._active[conn] = None

    def _progress(self) -> None:
        while self._active:
            active = self._active
            self._active = {}
            for conn in active:
                if conn.state is not _Conn.ESTABLISHED or conn.terminated is not None:
                    continue  # gated until verified; reaping returns the operations
                runnable = conn.runnable
                while runnable:
                    stream = runnable.popleft()
                    stream.queued = False
                    if conn.streams.get(stream.sid) is stream:
                        self._progress_stream(conn, stream)

    def _progress_stream(self, conn: _Connection, stream: _Stream) -> None:
        if stream.recv_ops:
            self._progress_receive(conn, stream)
        if stream.send_ops:
            self._progress_send(conn, stream)
        if stream.send_order and stream.ack_check:
            stream.ack_check = False
            self._complete_acked(conn, stream)
        if not stream.send_ops and not stream.send_order:
            conn.sending.discard(stream)
        if (
            stream.send_state is _Send.FINISHED
            and stream.recv_state is not _Recv.OPEN
            and not stream.send_ops
            and not stream.recv_ops
            and not stream.send_order
        ):
            del conn.streams[stream.sid]
            conn.sending.discard(stream)
            conn.reclaimed += 1
            self._counters["reclaimed_streams"] += 1
            reset_code = stream.recv_code if stream.recv_state is _Recv.RESET else None
            self._event(StreamClosed(stream.ref, reset_code))

    def _progress_send(self, conn: _Connection, stream: _Stream) -> None:
        engine = conn.engine
        ops = stream.send_ops
        limit = self._config.stream_send_buffer
        while ops:
            op = ops[0]
            if isinstance(op, SendSubmission):
                state = engine.stream_send_state(stream.sid)
                if state is None:
                    self._abandon_send_half(stream)
                    return
                room = limit - state[1]
                if room <= 0:
                    return
                view = op.payload.data
                start = stream.send_pos
                end = min(len(view), start + room)
                try:
                    engine.send_stream_data(stream.sid, view[start:end], False)
                except (ValueError, RuntimeError):
                    self._abandon_send_half(stream)
                    return
                self._dirty[conn] = None
                conn.stream_bytes_sent += end - start
                if end < len(view):
                    stream.send_pos = end
                    return
                stream.send_pos = 0
                ops.popleft()
            elif isinstance(op, FinishSubmission):
                ops.popleft()
                stream.send_state = _Send.FINISHED
                try:
                    engine.send_stream_data(stream.sid, b"", True)
                except (ValueError, RuntimeError):
                    self._complete(op.complete(ControlOutcome.ABANDONED), op.permit)
                    self._abandon_send_half(stream)
                    return
                self._dirty[conn] = None
                self._complete(op.complete(ControlOutcome.COMPLETE), op.permit)
            else:
                ops.popleft()
                try:
                    engine.reset_stream(stream.sid, op.error_code)
                    outcome = ControlOutcome.COMPLETE
                except ValueError:
                    outcome = ControlOutcome.ABANDONED
                self._dirty[conn] = None
                self._complete_acked(conn, stream)
                self._abandon_send_half(stream)
                self._complete(op.complete(outcome), op.permit)

    def _complete_acked(self, conn: _Connection, stream: _Stream) -> None:
        order = stream.send_order
        if not order:
            return
        state = conn.engine.stream_send_state(stream.sid)
        acked = None if state is None else state[0]
        while order:
            record = order[0]
            if record.rejected:
                outcome, through = SendOutcome.REJECTED, None
            elif acked is None or record.end <= acked:
                outcome, through = SendOutcome.ACKNOWLEDGED, record.end
            else:
                return
            order.popleft()
            submission = record.submission
            submission.payload.release()
            self._complete(submission.complete(outcome, through), submission.permit)

    def _abandon_send_half(self, stream: _Stream) -> None:
        """Abandon every pending send-side operation and record, in order."""
        stream.send_state = _Send.FINISHED
        stream.send_pos = 0
        while stream.send_order:
            record = stream.send_order.popleft()
            submission = record.submission
            submission.payload.release()
            outcome = SendOutcome.REJECTED if record.rejected else SendOutcome.ABANDONED
            self._complete(submission.complete(outcome), submission.permit)
        while stream.send_ops:
            op = stream.send_ops.popleft()
            if not isinstance(op, SendSubmission):  # data ops completed through their records
                self._complete(op.complete(ControlOutcome.ABANDONED), op.permit)

    def _progress_receive(self, conn: _Connection, stream: _Stream) -> None:
        ops = stream.recv_ops
        while ops:
            op = ops[0]
            state = stream.recv_state
            if (
                type(op) is ReceiveSubmission
                and state is _Recv.OPEN
                and not stream.fin_received
                and not op.cancellation.cancelled
            ):
                # The common case, a read on an open stream, without the general checks
                # below (same outcome: it completes once it holds ``min_bytes`` or is full).
                posted = op.posted
                spare = posted.spare
                if stream.buffered and spare:
                    self._consume(conn, stream, spare, posted.append)
                    spare = posted.spare
                if posted.appended >= op.options.min_bytes or not spare:
                    ops.popleft()
                    self._complete(op.complete(ReceiveStatus.DATA), op.permit)
                    continue
                return
            if isinstance(op, StopSubmission):
                ops.popleft()
                if state is not _Recv.OPEN:
                    self._complete(op.complete(ControlOutcome.REJECTED), op.permit)
                    continue
                with contextlib.suppress(ValueError):  # the engine dropped it: stopping is moot
                    conn.engine.stop_stream(stream.sid, op.error_code)
                self._dirty[conn] = None
                self._drop_received(conn, stream)
                stream.recv_state = _Recv.STOPPED
                stream.recv_code = op.error_code
                self._complete(op.complete(ControlOutcome.COMPLETE), op.permit)
                continue
            if state is not _Recv.OPEN:
                ops.popleft()
                self._complete_terminal(op, stream)
                continue
            if isinstance(op, ReceiveSubmission):
                if op.cancellation.cancelled:
                    ops.popleft()
                    self._complete(op.complete(ReceiveStatus.CANCELLED), op.permit)
                    continue
                posted = op.posted
                if stream.buffered and posted.spare:
                    self._consume(conn, stream, posted.spare, posted.append)
                if not stream.buffered and stream.fin_received:
                    ops.popleft()
                    stream.recv_state = _Recv.FIN
                    self._complete(op.complete(ReceiveStatus.FIN), op.permit)
                elif posted.appended >= op.options.min_bytes or not posted.spare:
                    ops.popleft()
                    self._complete(op.complete(ReceiveStatus.DATA), op.permit)
                else:
                    return
            else:
                want = op.max_bytes - stream.discarded
                if stream.buffered and want:
                    stream.discarded += self._consume(conn, stream, want, None)
                if not stream.buffered and stream.fin_received:
                    ops.popleft()
                    stream.recv_state = _Recv.FIN
                    done, stream.discarded = stream.discarded, 0
                    self._complete(op.complete(done, ReceiveStatus.FIN), op.permit)
                elif stream.discarded >= op.max_bytes:
                    ops.popleft()
                    done, stream.discarded = stream.discarded, 0
                    self._complete(op.complete(done, ReceiveStatus.DATA), op.permit)
                else:
                    return

    def _consume(
        self,
        conn: _Connection,
        stream: _Stream,
        limit: int,
        sink: Callable[[memoryview], None] | None,
    ) -> int:
        """Move up to ``limit`` buffered bytes into ``sink`` (None: drop); slide windows."""
        chunks = stream.chunks
        taken = 0
        while chunks and taken < limit:
            chunk = chunks[0]
            pos = stream.head_pos
            size = min(len(chunk) - pos, limit - taken)
            if sink is not None:
                sink(memoryview(chunk)[pos : pos + size])
            taken += size
            if pos + size == len(chunk):
                chunks.popleft()
                stream.head_pos = 0
            else:
                stream.head_pos = pos + size
        if taken:
            stream.buffered -= taken
            stream.consumed += taken
            conn.buffered -= taken
            conn.engine.set_buffered(conn.buffered)
            conn.engine.stream_consumed(stream.sid, stream.consumed)
            self._dirty[conn] = None
        return taken

    def _drop_received(self, conn: _Connection, stream: _Stream) -> None:
        if stream.buffered:
            self._consume(conn, stream, stream.buffered, None)

    def _complete_terminal(
        self, op: ReceiveSubmission | DiscardSubmission, stream: _Stream
    ) -> None:
        state = stream.recv_state
        if state is _Recv.RESET:
            status, code = ReceiveStatus.RESET, stream.recv_code
        elif state is _Recv.STOPPED:
            status, code = ReceiveStatus.STOPPED, stream.recv_code
        elif state is _Recv.FIN:
            status, code = ReceiveStatus.FIN, None
        else:
            status, code = ReceiveStatus.CLOSED, None
        if isinstance(op, ReceiveSubmission):
            self._complete(op.complete(status, code), op.permit)
        else:
            done, stream.discarded = stream.discarded, 0
            self._complete(op.complete(done, status, code), op.permit)

    def _complete_unknown(self, item: _StreamOp) -> None:
        """Operations on a stream or connection that no longer exists complete at once."""
        if isinstance(item, SendSubmission):
            item.payload.release()
            self._complete(item.complete(SendOutcome.ABANDONED), item.permit)
        elif isinstance(item, ReceiveSubmission):
            self._complete(item.complete(ReceiveStatus.CLOSED), item.permit)
        elif isinstance(item, DiscardSubmission):
            self._complete(item.complete(0, ReceiveStatus.CLOSED), item.permit)
        else:
            self._complete(item.complete(ControlOutcome.ABANDONED), item.permit)

    # -- reaping and shutdown -----------------------------------------------------------------

    def _reap_terminated(self, now: float) -> None:
        reap, self._reap = self._reap, []
        for conn in reap:
            if self._conns.get(conn.ref) is conn:
                self._remove(conn)

    def _remove(self, conn: _Connection) -> None:
        """Forget ``conn``: routes, accounting, then every operation, then its close event
        (only for a connection the application knows: dialled, or accepted and judged)."""
        del self._conns[conn.ref]
        self._dirty.pop(conn, None)
        self._stale.pop(conn, None)
        timers = self._timers
        if timers.pop(conn, None) is not None:
            self._timer_min = min(timers.values()) if timers else _NO_TIMER
        self._active.pop(conn, None)
        self._acks_held.pop(conn, None)
        for cid in conn.cids:
            if self._routes.get(cid) is conn:
                del self._routes[cid]
        if conn.initial_key is not None and self._initial_routes.get(conn.initial_key) is conn:
            del self._initial_routes[conn.initial_key]
        self._leave_pending(conn)
        if conn.source_key is not None:
            left = self._per_source[conn.source_key] - 1
            if left:
                self._per_source[conn.source_key] = left
            else:
                del self._per_source[conn.source_key]
        for stream in conn.streams.values():
            self._abandon_send_half(stream)
            while stream.recv_ops:
                op = stream.recv_ops.popleft()
                if isinstance(op, StopSubmission):
                    self._complete(op.complete(ControlOutcome.ABANDONED), op.permit)
                else:
                    if stream.recv_state is _Recv.OPEN:
                        stream.recv_state = _Recv.CLOSED
                    self._complete_terminal(op, stream)
        conn.streams.clear()
        conn.sending.clear()
        conn.runnable.clear()
        terminated = conn.terminated
        application: int | None = None
        transport: int | None = None
        if terminated is None:
            application = conn.close_code
        elif terminated.kind is TerminationKind.APPLICATION:
            application = terminated.error_code
        elif terminated.kind is TerminationKind.TRANSPORT:
            transport = terminated.error_code
        if conn.announced:
            self._event(ConnectionClosed(conn.ref, application, transport))

    def _begin_shutdown(self, now: float, grace: float) -> None:
        if self._state is not EndpointState.RUNNING:
            return
        self._state = EndpointState.DRAINING
        self._deadline = now + grace
        self._channels.submissions.close()

    def _abandon_all(self, now: float) -> None:
        """Close every connection (one courtesy datagram batch) and forget it at once."""
        for conn in list(self._conns.values()):
            if conn.terminated is None:
                if conn.close_code is None:
                    conn.close_code = SHUTDOWN_CLOSE_CODE
                try:
                    conn.engine.close(SHUTDOWN_CLOSE_CODE, _SHUTDOWN_REASON)
                    batch = conn.engine.datagrams_to_send(now)
                except Exception:
                    batch = []
                if len(self._outbox) + len(batch) <= _MAX_OUTBOX:
                    self._outbox.extend(batch)
            self._remove(conn)

    def _sends_settled(self, conn: _Connection) -> bool:
        """Whether ``conn`` has nothing left to deliver: no byte or FIN awaits acknowledgement,
        or nothing more can be delivered (the connection is closing or closed)."""
        if conn.terminated is not None or conn.close_code is not None:
            return True
        try:
            return conn.engine.sends_settled()
        except Exception:  # an engine bug must not hold shutdown until the deadline
            return True

    def _advance_shutdown(self, now: float) -> None:
        submissions = self._channels.submissions
        if (
            not self._shutdown_closed
            and len(submissions) == 0
            and not any(
                stream.send_ops or stream.recv_ops or stream.send_order
                for conn in self._conns.values()
                for stream in conn.streams.values()
            )
            and all(self._sends_settled(conn) for conn in self._conns.values())
        ):
            self._shutdown_closed = True
            # Every operation is done (writes complete once acknowledged) and every FIN was
            # acknowledged too (a finish completes once the engine has it: a CONNECTION_CLOSE
            # sent before it went out, or while it could still need retransmitting, would
            # lose it): close each connection and forget it at once, its CONNECTION_CLOSE
            # sent in this poll's batch. The closing state (3 PTO) would only repeat that
            # frame to late packets of a peer, for an endpoint that is going away: it cost
            # every shutdown about 90 ms (a `chrysalis ls` spent a third of its time in it).
            self._abandon_all(now)
        if self._deadline is not None and now >= self._deadline and self._conns:
            self._abandon_all(now)
        if not self._conns and submissions.is_closed() and not self._stopped_staged:
            self._stopped_staged = True
            self._deadline = None
            self._event(DriverStopped(self._channels.driver))

    # -- completions --------------------------------------------------------------------------

    def _complete(self, completion: Completion, permit: CreditPermit | None) -> None:
        """Hand ``completion`` to the application, or stage it (order is always kept)."""
        if self._staged:
            self._staged.append((completion, permit))
            return
        if permit is None:
            permit = self._channels.event_credits.try_acquire()
            if permit is None:
                self._staged.append((completion, None))
                return
        try:
            self._channels.completion_sender.complete_nowait(completion, permit)
        except CompletionQueueFull:
            self._staged.append((completion, permit))
        except CompletionQueueClosed:
            _release(completion, permit)
        else:
            self.emitted += 1

    def _event(self, completion: Completion) -> None:
        """Emit an unsolicited lifecycle event (it takes an event credit)."""
        self._complete(completion, None)

    def _flush_staged(self) -> None:
        staged = self._staged
        sender = self._channels.completion_sender
        credits = self._channels.event_credits
        while staged:
            completion, permit = staged[0]
            if permit is None:
                permit = credits.try_acquire()
                if permit is None:
                    return
                staged[0] = (completion, permit)
            try:
                sender.complete_nowait(completion, permit)
            except CompletionQueueFull:
                return
            except CompletionQueueClosed:
                for item, held in staged:
                    _release(item, held)
                staged.clear()
                return
            self.emitted += 1
            staged.popleft()

    # -- statistics ---------------------------------------------------------------------------

    def statistics(self) -> EndpointStatistics:
        """An immutable snapshot of the endpoint (counters and current sizes)."""
        c = self._counters
        return EndpointStatistics(
            state=self._state,
            active_connections=len(self._conns),
            pending_handshakes=self._pending,
            active_streams=sum(len(conn.streams) for conn in self._conns.values()),
            reclaimed_streams=c["reclaimed_streams"],
            staged_completions=len(self._staged),
            datagrams_received=c["datagrams_received"],
            datagrams_sent=c["datagrams_sent"],
            parse_errors=c["parse_errors"],
            routing_errors=c["routing_errors"],
            cid_collisions=c["cid_collisions"],
            authentication_failures=c["authentication_failures"],
            engine_errors=c["engine_errors"],
            admission_rejections=c["admission_rejections"],
            invalid_retry_tokens=c["invalid_retry_tokens"],
            retries_sent=c["retries_sent"],
            backpressure_drops=c["backpressure_drops"],
            refused_streams=c["refused_streams"],
            keepalive_pings=c["keepalive_pings"],
        )

    def knows_connection(self, connection: ConnectionRef) -> bool:
        """Whether ``connection`` is live here. Once it is not, every operation of it has
        completed and its ``ConnectionClosed`` was emitted or staged behind them."""
        return connection in self._conns

    def connection_statistics(self, connection: ConnectionRef) -> ConnectionStatistics | None:
        """A snapshot of one live connection, or None when it is unknown or gone."""
        conn = self._conns.get(connection)
        if conn is None:
            return None
        engine = conn.engine.statistics()
        return ConnectionStatistics(
            connection=conn.ref,
            local_pid=conn.local_pid,
            peer=conn.peer,
            established=conn.state is _Conn.ESTABLISHED,
            datagrams_sent=conn.datagrams_sent,
            bytes_sent=conn.bytes_sent,
            datagrams_received=conn.datagrams_received,
            bytes_received=conn.bytes_received,
            stream_bytes_sent=conn.stream_bytes_sent,
            stream_bytes_received=conn.stream_bytes_received,
            smoothed_rtt=engine.smoothed_rtt,
            congestion_window=engine.congestion_window,
            bytes_in_flight=engine.bytes_in_flight,
            pto_count=engine.pto_count,
            active_streams=len(conn.streams),
            reclaimed_streams=conn.reclaimed,
        )

    def connections(self) -> list[ConnectionRef]:
        """The live connections, oldest first."""
        return list(self._conns)

    def aggregate_peer(self, peer: Pid) -> ConnectionStatistics | None:
        """Sums over every established connection to ``peer`` (maximum for RTT), or None."""
        stats = [
            s
            for ref, conn in self._conns.items()
            if conn.peer == peer and (s := self.connection_statistics(ref)) is not None
        ]
        if not stats:
            return None
        first = stats[0]
        return ConnectionStatistics(
            connection=first.connection,
            local_pid=first.local_pid,
            peer=peer,
            established=True,
            datagrams_sent=sum(s.datagrams_sent for s in stats),
            bytes_sent=sum(s.bytes_sent for s in stats),
            datagrams_received=sum(s.datagrams_received for s in stats),
            bytes_received=sum(s.bytes_received for s in stats),
            stream_bytes_sent=sum(s.stream_bytes_sent for s in stats),
            stream_bytes_received=sum(s.stream_bytes_received for s in stats),
            smoothed_rtt=max(s.smoothed_rtt for s in stats),
            congestion_window=sum(s.congestion_window for s in stats),
            bytes_in_flight=sum(s.bytes_in_flight for s in stats),
            pto_count=sum(s.pto_count for s in stats),
            active_streams=sum(s.active_streams for s in stats),
            reclaimed_streams=sum(s.reclaimed_streams for s in stats),
        )


def _release(completion: Completion, permit: CreditPermit | None) -> None:
    """Release what an undeliverable completion owns (the application dropped the queue)."""
    if isinstance(completion, ReceiveCompletion):
        completion.posted.release()
    if permit is not None:
        permit.release()
