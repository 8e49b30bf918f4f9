"""The adapters' runtime-neutral completion dispatch: the runtime seam (``Runtime``,
``AsyncEvent``, ``AdapterOptions``), ``ConnectionCore``, the views the asyncio and trio handles
share, the bounded accept queues and ``EndpointCore``, which routes completions (always on the
event loop's thread) to the connections and streams waiting for them.

The driver (``_driver.EndpointDriver``) is named for typing only: ``_driver`` builds it with the
endpoint (``EndpointSettings``) and imports this module, never the reverse at run time."""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, final

from chrysalis.core import DatagramAddr, Pid
from chrysalis.core.completion import (
    AuthenticationFailed,
    CommandCompletion,
    CommandError,
    CommandFailed,
    CommandResult,
    ConnectionClosed,
    ConnectionCreated,
    ConnectionEstablished,
    ConnectionRef,
    DiscardCompletion,
    DriverStopped,
    EndpointChannels,
    FinishCompletion,
    IncomingStream,
    ReceiveCompletion,
    ResetCompletion,
    SendCompletion,
    StopCompletion,
    StreamClosed,
    StreamOpened,
    StreamRef,
    SubmissionClosed,
    WouldBlock,
)
from chrysalis.core.runtime import Event
from chrysalis.quic._endpoint import (
    Abort,
    Close,
    Connect,
    EndpointStatistics,
    OpenBidi,
    QuicCommand,
    QuicEndpoint,
    Shutdown,
)
from chrysalis.quic._errors import (
    ConnectError,
    ConnectionLostError,
    EndpointClosedError,
    PeerAuthenticationError,
    QuicTransportError,
    StreamBrokenError,
)
from chrysalis.quic._identity import Identity
from chrysalis.quic._stream_core import (
    _CLOSED,
    _ESTABLISHED,
    _FAILED,
    _HANDSHAKING,
    StreamCore,
)

if TYPE_CHECKING:
    from chrysalis.quic._driver import DriverStatistics, EndpointDriver

__all__ = [
    "DEFAULT_ACCEPT_BACKLOG",
    "DEFAULT_PEER_ACCEPT_BACKLOG",
    "DEFAULT_READ_AHEAD",
    "DEFAULT_WRITE_BUFFER_LIMIT",
    "DEFAULT_WRITE_HIGH_WATER",
    "REFUSED_STREAM_CODE",
    "AdapterOptions",
    "AsyncEvent",
    "ConnectionCore",
    "ConnectionView",
    "EndpointCore",
    "EndpointFacade",
    "EndpointView",
    "Runtime",
]

T = TypeVar("T")
ConnT = TypeVar("ConnT")
StreamT = TypeVar("StreamT")

REFUSED_STREAM_CODE: Final = 0x2
"""Application error code of STOP_SENDING / RESET_STREAM for an incoming stream refused
because its accept queue (or its peer's share of it) was full."""
DEFAULT_ACCEPT_BACKLOG: Final = 1024
"""Incoming streams waiting for ``accept`` at once, per accept queue."""
DEFAULT_PEER_ACCEPT_BACKLOG: Final = 256
"""Incoming streams of one peer waiting for ``accept`` at once, per accept queue."""
DEFAULT_READ_AHEAD: Final = 64 * 1024
"""Capacity of each posted receive, and the most bytes a stream buffers unread."""
DEFAULT_WRITE_HIGH_WATER: Final = 1024 * 1024
"""Unacknowledged bytes one stream keeps in flight before writers wait."""
DEFAULT_WRITE_BUFFER_LIMIT: Final = 16 * 1024 * 1024
"""Bytes ``write`` may hold locally (not yet admitted) before it raises."""
_MAX_SEND_CHUNK: Final = 1024 * 1024
_DISPATCH_BATCH: Final = 256
_MAX_DEFERRED: Final = 4096


# --- the runtime seam --------------------------------------------------------------------------


# What the core needs of an event (``asyncio.Event``, ``trio.Event`` and the asyncio adapter's
# cheaper ``_Event``, whose ``wait`` returns a future, all fit): the shared runtime protocol.
AsyncEvent = Event


class Runtime(Protocol):
    """The few runtime services the core and ``QuicTransport`` need from an adapter.

    Every method is called on the event loop's thread. ``spawn`` starts a task owned by the
    endpoint (it is cancelled, at the latest, when the endpoint closes); ``call_soon`` runs a
    plain callback on the loop soon; ``with_timeout`` raises ``TimeoutError`` after
    ``seconds``.
    """

    def event(self) -> AsyncEvent: ...

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...

    def call_soon(self, fn: Callable[[], object]) -> None: ...

    async def with_timeout(self, seconds: float, fn: Callable[[], Awaitable[T]]) -> T: ...


@dataclass(frozen=True, slots=True)
class AdapterOptions:
    """Bounds of an adapter endpoint (all positive).

    Attributes:
        accept_backlog: incoming streams waiting for ``accept`` (per accept queue: the
            application one and the link-local one).
        peer_accept_backlog: of those, how many one peer may occupy.
        read_ahead: capacity of each posted receive; a stream buffers at most this many
            unread bytes before it stops posting receives.
        write_high_water: unacknowledged bytes one stream keeps in flight before writers wait.
        write_buffer_limit: bytes a synchronous asyncio ``write`` may hold locally before it
            raises ``WriteBufferFullError``.
    """

    accept_backlog: int = DEFAULT_ACCEPT_BACKLOG
    peer_accept_backlog: int = DEFAULT_PEER_ACCEPT_BACKLOG
    read_ahead: int = DEFAULT_READ_AHEAD
    write_high_water: int = DEFAULT_WRITE_HIGH_WATER
    write_buffer_limit: int = DEFAULT_WRITE_BUFFER_LIMIT

    def __post_init__(self) -> None:
        for name in (
            "accept_backlog",
            "peer_accept_backlog",
            "read_ahead",
            "write_high_water",
            "write_buffer_limit",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"AdapterOptions.{name} must be an int")
            if not 1 <= value <= 1 << 40:
                raise ValueError(f"AdapterOptions.{name} must be in 1..2**40, got {value}")


# --- completion dispatch and stream state ------------------------------------------------------


@final
class _Request:
    """A command waiting for its completion."""

    __slots__ = ("abandoned", "context", "event", "result")

    def __init__(self, event: AsyncEvent, context: tuple[Pid | None, Pid] | None) -> None:
        self.event = event
        self.context = context
        self.result: CommandResult | None = None
        self.abandoned = False


@final
class ConnectionCore:
    """The adapter-side state of one connection (runtime-neutral)."""

    __slots__ = (
        "__weakref__",
        "actual",
        "application_code",
        "auth_reason",
        "core",
        "dialed",
        "event",
        "expected",
        "facade",
        "local_pid",
        "peer",
        "ref",
        "state",
        "streams",
        "transport_code",
    )

    def __init__(
        self,
        core: EndpointCore,
        ref: ConnectionRef,
        *,
        dialed: bool,
        local_pid: Pid,
        expected: Pid | None,
    ) -> None:
        self.core = core
        self.ref = ref
        self.dialed = dialed
        self.local_pid = local_pid
        self.expected = expected
        self.peer: Pid | None = None
        self.actual: Pid | None = None
        self.auth_reason = ""
        self.state = _HANDSHAKING
        self.application_code: int | None = None
        self.transport_code: int | None = None
        self.event: AsyncEvent | None = None
        self.streams: dict[StreamRef, StreamCore] = {}
        self.facade: object | None = None

    @property
    def is_established(self) -> bool:
        """The handshake completed and the peer was authenticated (and it is not closed)."""
        return self.state == _ESTABLISHED

    @property
    def is_closed(self) -> bool:
        """The connection is gone (closed, or its authentication failed)."""
        return self.state >= _FAILED

    def _signal(self) -> None:
        event = self.event
        if event is not None:
            self.event = None
            event.set()

    async def wait_changed(self) -> None:
        """Wait for the next state change."""
        event = self.event
        if event is None:
            event = self.event = self.core.runtime.event()
        await event.wait()

    async def wait_settled(self) -> None:
        """Wait until the handshake's verdict (established, failed or closed)."""
        while self.state == _HANDSHAKING:
            await self.wait_changed()

    async def wait_closed(self) -> None:
        """Wait until the connection is gone."""
        while self.state < _FAILED:
            await self.wait_changed()

    def lost_error(self) -> ConnectionLostError:
        """The error that operations on this closed connection raise."""
        return ConnectionLostError(
            f"connection to {self.peer} closed",
            application_code=self.application_code,
            transport_code=self.transport_code,
        )

    def broken_error(self) -> StreamBrokenError:
        """What a writer of this closed connection raises: the close codes are its cause."""
        error = StreamBrokenError("the connection closed")
        error.__cause__ = self.lost_error()
        return error

    def close_nowait(self, error_code: int = 0, reason: str = "") -> None:
        """Queue an application close with ``error_code`` (best effort, idempotent)."""
        if self.state < _FAILED:
            self.core.command_nowait(Close(self.ref, error_code, reason[:256]))

    async def open_stream(self) -> StreamCore:
        """Open a bidirectional stream (nothing is sent before the first write)."""
        if self.state != _ESTABLISHED:
            if self.state == _HANDSHAKING:
                await self.wait_settled()
            if self.state != _ESTABLISHED:
                raise self.lost_error()
        result = await self.core.command(OpenBidi(self.ref))
        if isinstance(result, StreamOpened):
            stream = self.core.streams.get(result.stream)
            if stream is not None:
                return stream
            raise self.lost_error()
        if isinstance(result, CommandFailed):
            if (
                self.state >= _FAILED
                or result.error is CommandError.UNKNOWN_CONNECTION
                or result.detail.startswith("connection")
            ):
                raise self.lost_error()
            raise QuicTransportError(f"cannot open a stream: {result.error.value} {result.detail}")
        raise QuicTransportError(f"unexpected result {result!r}")


class EndpointView:
    """What the asyncio and trio endpoints share: read-only views of their identity, sans-IO
    endpoint, driver and core (the adapters set these attributes and add their runtime)."""

    __slots__ = ("_core", "_driver", "_endpoint", "_identity", "_mode")

    _core: EndpointCore
    _driver: EndpointDriver
    _endpoint: QuicEndpoint
    _identity: Identity
    _mode: str

    @property
    def identity(self) -> Identity:
        """This endpoint's identity."""
        return self._identity

    @property
    def pid(self) -> Pid:
        """This process's PID (``identity.pid``)."""
        return self._identity.pid

    @property
    def routing_pid(self) -> Pid:
        """The prefix of the CIDs of connections this endpoint dials."""
        return self._endpoint.routing_pid

    @property
    def local_addr(self) -> DatagramAddr:
        """The carrier's address."""
        return self._driver.socket.local_addr

    @property
    def driver_mode(self) -> str:
        """``"inline"`` or ``"thread"``."""
        return self._mode

    @property
    def is_closed(self) -> bool:
        """True once the driver stopped."""
        return self._core.stopped

    @property
    def core(self) -> EndpointCore:
        """The runtime-neutral state behind this endpoint (for ``QuicTransport``)."""
        return self._core

    def statistics(self) -> EndpointStatistics:
        """The endpoint's statistics snapshot."""
        return self._driver.endpoint_statistics()

    def driver_statistics(self) -> DriverStatistics:
        """The I/O step's counters: datagrams sent, held for a destination that would block
        (``pending_datagrams``, ``datagrams_held``, ``held_destinations``), dropped..."""
        return self._driver.statistics()


class EndpointFacade(EndpointView, Generic[ConnT, StreamT]):
    """The facade code the asyncio and trio endpoints share over ``EndpointCore``: dialling,
    accepting and waiting for the driver to stop. Each adapter supplies its connection and
    stream facades (``wrap_connection``, ``wrap_stream``) and how it waits for its driver task
    (``_wait_stopped``); shutdown and closing stay in the adapters (their deadlines and task
    handling are the runtime's own)."""

    __slots__ = ()

    async def connect(
        self,
        pid: Pid | None,
        address: DatagramAddr,
        *,
        route: Pid | None = None,
        source: Pid | None = None,
        server_name: str | None = None,
    ) -> ConnT:
        """Dial the process ``pid`` at ``address`` and wait for its authenticated connection.

        ``pid`` is the PID the peer's certificate must prove (None: any trusted peer, whose
        PID becomes ``connection.peer``); ``route`` is the PID the packets are addressed to
        (default ``pid``, or ``Pid.LINK_LOCAL`` when ``pid`` is None); ``source`` overrides
        the prefix of our CIDs (``Pid.LINK_LOCAL`` for a link-local connection);
        ``server_name`` is also verified against the certificate when given.

        Raises ``PeerAuthenticationError``, ``ConnectError`` or ``EndpointClosedError``.
        """
        target = route if route is not None else (pid if pid is not None else Pid.LINK_LOCAL)
        conn = await self._core.connect(
            target, address, expected=pid, source=source, server_name=server_name
        )
        return self.wrap_connection(conn)

    async def accept(self) -> tuple[Pid, StreamT]:
        """The next incoming stream on a connection that terminates at this endpoint's PID,
        with the peer's authenticated PID. ``EndpointClosedError`` once stopped."""
        stream = await self._core.accepts.take()
        peer = stream.conn.peer
        assert peer is not None
        return peer, self.wrap_stream(stream)

    async def accept_link_local(self) -> tuple[Pid, StreamT]:
        """The next incoming stream on a connection that terminates at the link-local PID 0."""
        stream = await self._core.link_accepts.take()
        peer = stream.conn.peer
        assert peer is not None
        return peer, self.wrap_stream(stream)

    def wrap_connection(self, conn: ConnectionCore) -> ConnT:
        """The facade of ``conn`` (one per connection)."""
        raise NotImplementedError

    def wrap_stream(self, stream: StreamCore) -> StreamT:
        """The facade of ``stream`` (one per stream)."""
        raise NotImplementedError

    async def wait_stopped(self) -> None:
        """Wait until the driver stopped: after ``shutdown`` or ``abort``, or on its own when
        the carrier failed (then every connection was abandoned)."""
        await self._wait_stopped()

    async def _wait_stopped(self) -> None:
        raise NotImplementedError


class ConnectionView:
    """What the asyncio and trio connection handles share: read-only views of one
    ``ConnectionCore`` (the adapters add their runtime's ``open_stream`` and waits)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: ConnectionCore) -> None:
        self._conn = conn

    @property
    def ref(self) -> ConnectionRef:
        """The endpoint-local handle of this connection."""
        return self._conn.ref

    @property
    def peer(self) -> Pid:
        """The peer's authenticated PID."""
        peer = self._conn.peer
        if peer is None:
            raise QuicTransportError("the connection is not established")
        return peer

    @property
    def local_pid(self) -> Pid:
        """The routing PID of this side of the connection."""
        return self._conn.local_pid

    @property
    def dialed(self) -> bool:
        """True for a connection this side dialled."""
        return self._conn.dialed

    @property
    def is_closed(self) -> bool:
        """True once the connection is gone."""
        return self._conn.is_closed

    @property
    def close_codes(self) -> tuple[int | None, int | None]:
        """``(application_code, transport_code)`` of a closed connection."""
        return self._conn.application_code, self._conn.transport_code

    @property
    def core(self) -> ConnectionCore:
        """The runtime-neutral state behind this connection."""
        return self._conn


@final
class _AcceptQueue:
    """Incoming streams waiting for ``accept``: bounded in total and per peer."""

    __slots__ = ("capacity", "closed", "core", "event", "items", "peer_limit", "per_peer")

    def __init__(self, core: EndpointCore, capacity: int, peer_limit: int) -> None:
        self.core = core
        self.capacity = capacity
        self.peer_limit = peer_limit
        self.items: deque[StreamCore] = deque()
        self.per_peer: dict[Pid, int] = {}
        self.event: AsyncEvent | None = None
        self.closed: QuicTransportError | None = None

    def offer(self, stream: StreamCore) -> bool:
        peer = stream.conn.peer
        assert peer is not None
        count = self.per_peer.get(peer, 0)
        if self.closed is not None or len(self.items) >= self.capacity or count >= self.peer_limit:
            return False
        self.per_peer[peer] = count + 1
        self.items.append(stream)
        event = self.event
        if event is not None:
            self.event = None
            event.set()
        return True

    def take_nowait(self) -> StreamCore | None:
        if not self.items:
            return None
        stream = self.items.popleft()
        peer = stream.conn.peer
        assert peer is not None
        left = self.per_peer[peer] - 1
        if left:
            self.per_peer[peer] = left
        else:
            del self.per_peer[peer]
        return stream

    async def take(self) -> StreamCore:
        while True:
            stream = self.take_nowait()
            if stream is not None:
                return stream
            if self.closed is not None:
                raise self.closed
            event = self.event
            if event is None:
                event = self.event = self.core.runtime.event()
            await event.wait()

    def close(self, error: QuicTransportError) -> list[StreamCore]:
        self.closed = error
        left = list(self.items)
        self.items.clear()
        self.per_peer.clear()
        event = self.event
        if event is not None:
            self.event = None
            event.set()
        return left


@final
class EndpointCore:
    """Completion dispatch and connection/stream state of one adapter endpoint.

    The adapter calls ``dispatch_ready()`` on its event loop whenever completions may have
    arrived (after each inline driver step, or from its pump task in thread mode). Everything
    else is called by the adapter's facades on the same thread.
    """

    __slots__ = (
        "__weakref__",
        "_blocked",
        "_handlers",
        "accepts",
        "channels",
        "commands",
        "connection_gone",
        "conns",
        "deferred",
        "draining",
        "link_accepts",
        "max_send_piece",
        "on_connection_closed",
        "on_established",
        "options",
        "posted_receives",
        "read_ahead_due",
        "read_ahead_slots",
        "refused_streams",
        "routing_pid",
        "runtime",
        "stopped",
        "stopped_event",
        "streams",
        "submitter",
        "unknown_completions",
        "write_through",
    )

    def __init__(
        self,
        channels: EndpointChannels[QuicCommand],
        runtime: Runtime,
        options: AdapterOptions,
        routing_pid: Pid,
    ) -> None:
        self.channels = channels
        self.runtime = runtime
        self.options = options
        self.routing_pid = routing_pid
        self.submitter = channels.streams
        self.max_send_piece = min(_MAX_SEND_CHUNK, channels.submissions.retained_budget.capacity)
        self.draining = False
        self.commands: dict[Any, _Request] = {}
        self.conns: dict[ConnectionRef, ConnectionCore] = {}
        self.streams: dict[StreamRef, StreamCore] = {}
        self.accepts = _AcceptQueue(self, options.accept_backlog, options.peer_accept_backlog)
        self.link_accepts = _AcceptQueue(self, options.accept_backlog, options.peer_accept_backlog)
        self.posted_receives = 0
        self.read_ahead_slots = max(1, channels.credits.capacity // 2)
        # Two hooks of the asyncio inline driver (None elsewhere), both to shorten the path
        # from a datagram to the reply it causes. ``read_ahead_due`` (a list only from a
        # step's dispatch to the end of its flush): streams whose read-ahead receive would
        # be posted now (by the dispatch, or by a read that took buffered bytes); the
        # driver posts them with ``post_read_aheads_from`` once its flush sent the reply, before
        # the next datagram can arrive. ``write_through``: offered each small write (its
        # stream and bytes); True: the driver admitted it and flushed at once, through its
        # send lane when nothing is queued ahead; False: not taken (the driver is on the
        # stack, or already wrote this cycle), the stream submits it as usual.
        self.read_ahead_due: list[StreamCore] | None = None
        self.write_through: Callable[[StreamRef, bytes], bool] | None = None
        self.deferred: deque[tuple[str, Any, int]] = deque()
        self.refused_streams = 0
        self.unknown_completions = 0
        self.stopped = False
        self.stopped_event: AsyncEvent = runtime.event()
        self.on_connection_closed: list[Callable[[ConnectionCore], None]] = []
        # ``EndpointDriver.connection_gone``, set by the adapter (None: unknown, a send that
        # did not complete fails its writer at once).
        self.connection_gone: Callable[[ConnectionRef], bool] | None = None
        self.on_established: list[Callable[[ConnectionCore], None]] = []
        self._blocked: dict[StreamCore, None] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            SendCompletion: self._on_send,
            ReceiveCompletion: self._on_receive,
            FinishCompletion: self._on_control,
            StopCompletion: self._on_control,
            ResetCompletion: self._on_control,
            DiscardCompletion: self._on_discard,
            CommandCompletion: self._on_command,
            ConnectionEstablished: self._on_established,
            AuthenticationFailed: self._on_auth_failed,
            IncomingStream: self._on_incoming,
            StreamClosed: self._on_stream_closed,
            ConnectionClosed: self._on_connection_closed,
            DriverStopped: self._on_driver_stopped,
        }

    # -- dispatch -----------------------------------------------------------------------------

    def dispatch_ready(self) -> int:
        """Dispatch every queued completion (in batches); return how many.

        Each batch's leases are released before its first handler runs (a handler's new
        receive or send then finds the credit and the posted bytes back, as before), and a
        ``ReceiveCompletion``, the one a request/response exchange dispatches on the path to
        the woken reader, goes to its stream without the handler table's extra call."""
        receiver = self.channels.completions
        handlers = self._handlers
        streams = self.streams
        total = 0
        while True:
            completions = receiver.drain_released(_DISPATCH_BATCH)
            if not completions:
                if not self.stopped and receiver.is_closed():
                    self._on_driver_stopped(None)
                break
            total += len(completions)
            for completion in completions:
                if type(completion) is ReceiveCompletion:  # ``_on_receive``, inline
                    stream = streams.get(completion.stream)
                    if stream is not None:
                        stream.on_receive(completion)
                        if stream.reclaimed and stream.settled:
                            self._forget(stream)
                else:
                    handlers[type(completion)](completion)
            if len(completions) < _DISPATCH_BATCH:
                break
        if total and (self.deferred or self._blocked):
            self._retry()
        return total

    def post_read_aheads_from(self, due: list[StreamCore]) -> bool:
        """Post the read-aheads deferred to ``due`` (a ``read_ahead_due`` list) and empty
        it; True if any receive was submitted."""
        if not due:
            return False
        before = self.posted_receives
        for stream in due:
            stream.ahead_due = False
            if not stream.posted:
                stream._maybe_read_ahead()
        due.clear()
        return self.posted_receives != before

    def _retry(self) -> None:
        deferred = self.deferred
        for _ in range(len(deferred)):
            kind, target, code = deferred.popleft()
            self._submit_deferred(kind, target, code)
        blocked = self._blocked
        if blocked:
            self._blocked = {}
            for stream in blocked:
                stream.blocked = False
                stream.flush()

    def mark_blocked(self, stream: StreamCore) -> None:
        """Remember a stream whose flush was refused, to retry after completions."""
        if not stream.blocked:
            stream.blocked = True
            self._blocked[stream] = None

    def _on_send(self, completion: SendCompletion) -> None:
        stream = self.streams.get(completion.stream)
        if stream is not None:
            stream.on_send(completion)
            if stream.reclaimed and stream.settled:
                self._forget(stream)

    def _on_receive(self, completion: ReceiveCompletion) -> None:
        stream = self.streams.get(completion.stream)
        if stream is not None:
            stream.on_receive(completion)
            if stream.reclaimed and stream.settled:
                self._forget(stream)

    def _forget(self, stream: StreamCore) -> None:
        self.streams.pop(stream.ref, None)
        stream.conn.streams.pop(stream.ref, None)

    def _on_control(self, completion: FinishCompletion | StopCompletion | ResetCompletion) -> None:
        stream = self.streams.get(completion.stream)
        if stream is not None:
            stream.on_control(completion.outcome)

    def _on_discard(self, completion: DiscardCompletion) -> None:
        self.unknown_completions += 1  # the adapters never discard

    def _on_command(self, completion: CommandCompletion) -> None:
        request = self.commands.pop(completion.request, None)
        result = completion.result
        if isinstance(result, ConnectionCreated):
            expected, local = (None, self.routing_pid)
            if request is not None and request.context is not None:
                expected, local = request.context
            conn = ConnectionCore(
                self, result.connection, dialed=True, local_pid=local, expected=expected
            )
            self.conns[result.connection] = conn
            if request is None or request.abandoned:
                conn.close_nowait(0, "dial abandoned")
        elif isinstance(result, StreamOpened):
            owner = self.conns.get(result.stream.connection)
            if owner is not None:
                stream = StreamCore(self, owner, result.stream, local=True)
                self.streams[result.stream] = stream
                owner.streams[result.stream] = stream
                if request is None or request.abandoned:
                    stream.abort(0)
                else:
                    stream._maybe_read_ahead()
        if request is not None:
            request.result = result
            request.event.set()

    def _on_established(self, completion: ConnectionEstablished) -> None:
        conn = self.conns.get(completion.connection)
        if conn is None:
            conn = ConnectionCore(
                self,
                completion.connection,
                dialed=False,
                local_pid=completion.local_pid,
                expected=None,
            )
            self.conns[completion.connection] = conn
        conn.local_pid = completion.local_pid
        conn.peer = completion.peer_pid
        conn.actual = completion.peer_pid
        conn.state = _ESTABLISHED
        conn._signal()
        for hook in self.on_established:
            hook(conn)

    def _on_auth_failed(self, completion: AuthenticationFailed) -> None:
        conn = self.conns.get(completion.connection)
        if conn is None:  # an accepted connection whose peer was rejected: nobody waits
            return
        conn.actual = completion.actual
        conn.auth_reason = completion.reason
        conn.state = _FAILED
        conn._signal()

    def _on_incoming(self, completion: IncomingStream) -> None:
        conn = self.conns.get(completion.stream.connection)
        if conn is None or conn.state != _ESTABLISHED or conn.peer is None:
            self._refuse(completion.stream)
            return
        stream = StreamCore(self, conn, completion.stream, local=False)
        queue = self.link_accepts if conn.local_pid.is_link_local else self.accepts
        if not queue.offer(stream):
            self._refuse(completion.stream)
            return
        self.streams[completion.stream] = stream
        conn.streams[completion.stream] = stream
        stream._maybe_read_ahead()

    def _refuse(self, ref: StreamRef) -> None:
        self.refused_streams += 1
        self._submit_deferred("stop", ref, REFUSED_STREAM_CODE)
        self._submit_deferred("reset", ref, REFUSED_STREAM_CODE)

    def _on_stream_closed(self, completion: StreamClosed) -> None:
        stream = self.streams.get(completion.stream)
        if stream is not None:
            stream.on_closed(completion)
            if stream.settled:  # else kept until its late completions arrived
                self._forget(stream)

    def _on_connection_closed(self, completion: ConnectionClosed) -> None:
        conn = self.conns.pop(completion.connection, None)
        if conn is None:
            return
        conn.application_code = completion.application_code
        conn.transport_code = completion.transport_code
        conn.state = _CLOSED if conn.state != _FAILED else _FAILED
        for ref, stream in list(conn.streams.items()):
            self.streams.pop(ref, None)
            stream.on_connection_lost()
        conn.streams.clear()
        conn._signal()
        for hook in self.on_connection_closed:
            hook(conn)

    def _on_driver_stopped(self, completion: DriverStopped | None) -> None:
        if self.stopped:
            return
        self.stopped = True
        for request in self.commands.values():
            request.event.set()
        self.commands.clear()
        error = EndpointClosedError("the endpoint stopped")
        for queue in (self.accepts, self.link_accepts):
            for stream in queue.close(error):
                stream.on_connection_lost()
        for conn in list(self.conns.values()):
            conn.state = _CLOSED if conn.state != _FAILED else _FAILED
            for stream in list(conn.streams.values()):
                stream.on_connection_lost()
            conn._signal()
            for hook in self.on_connection_closed:
                hook(conn)
        self.conns.clear()
        self.streams.clear()
        self._blocked.clear()
        self.deferred.clear()
        self.stopped_event.set()

    # -- submissions ----------------------------------------------------------------------------

    def check_open(self) -> None:
        """Raise ``EndpointClosedError`` once the endpoint stopped."""
        if self.stopped:
            raise EndpointClosedError("the endpoint stopped")

    async def command(
        self, command: QuicCommand, context: tuple[Pid | None, Pid] | None = None
    ) -> CommandResult:
        """Submit ``command`` (waiting for admission) and wait for its result."""
        self.check_open()
        try:
            receipt = await self.channels.commands.submit(command)
        except SubmissionClosed:
            raise EndpointClosedError("the endpoint no longer admits commands") from None
        request = _Request(self.runtime.event(), context)
        self.commands[receipt.request] = request
        try:
            await request.event.wait()
        except BaseException:
            request.abandoned = True
            raise
        if request.result is None:
            raise EndpointClosedError("the endpoint stopped before the command completed")
        return request.result

    def command_nowait(self, command: QuicCommand) -> None:
        """Submit a command whose result nobody waits for (deferred when refused)."""
        self._submit_deferred("command", command, 0)

    def stream_op_nowait(self, stream: StreamCore, kind: str, code: int) -> None:
        """Submit a stop or reset on ``stream`` (deferred when refused)."""
        self._submit_deferred(kind, stream.ref, code)

    def _submit_deferred(self, kind: str, target: Any, code: int) -> None:
        if self.stopped:
            return
        try:
            if kind == "command":
                self.channels.commands.submit_nowait(target)
            elif kind == "stop":
                self.submitter.stop_nowait(target, code)
            else:
                self.submitter.reset_nowait(target, code)
        except WouldBlock:
            if len(self.deferred) < _MAX_DEFERRED:
                self.deferred.append((kind, target, code))
        except SubmissionClosed:
            pass

    async def connect(
        self,
        route: Pid,
        address: DatagramAddr,
        *,
        expected: Pid | None,
        source: Pid | None = None,
        server_name: str | None = None,
    ) -> ConnectionCore:
        """Dial and wait for the authenticated connection.

        Raises ``PeerAuthenticationError`` (identity mismatch), ``ConnectError`` (refused or
        closed during the handshake) or ``EndpointClosedError``.
        """
        local = self.routing_pid if source is None else source
        result = await self.command(
            Connect(
                route=route,
                peer=address,
                expected=expected,
                source=source,
                server_name=server_name,
            ),
            (expected, local),
        )
        if isinstance(result, CommandFailed):
            raise ConnectError(f"connect refused: {result.error.value} {result.detail}".strip())
        if not isinstance(result, ConnectionCreated):
            raise ConnectError(f"unexpected connect result {result!r}")
        conn = self.conns.get(result.connection)
        if conn is None:
            raise ConnectError("the connection closed before its handshake")
        try:
            await conn.wait_settled()
        except BaseException:
            if conn.state == _HANDSHAKING:
                conn.close_nowait(0, "dial abandoned")
            raise
        if conn.state == _ESTABLISHED:
            return conn
        if conn.state == _FAILED:
            raise PeerAuthenticationError(expected, conn.actual, conn.auth_reason)
        raise ConnectError(
            "the connection closed during its handshake",
            application_code=conn.application_code,
            transport_code=conn.transport_code,
        )

    def begin_shutdown(self) -> None:
        """Before a graceful shutdown: cancel every posted receive and post no new one, so
        idle reads do not hold the endpoint's drain for its whole grace period (blocked
        readers then see the connection close)."""
        self.draining = True
        for stream in list(self.streams.values()):
            cancellation = stream.cancellation
            if cancellation is not None:
                stream.cancellation = None
                cancellation.cancel()

    def shutdown_nowait(self, grace: float) -> None:
        """Ask the driver for a graceful shutdown within ``grace`` seconds (idempotent)."""
        if self.stopped:
            return
        self.begin_shutdown()
        try:
            self.channels.commands.submit_and_close_nowait(Shutdown(grace))
        except SubmissionClosed:
            pass
        except WouldBlock:
            # Full: close admission; the endpoint shuts down with its configured grace.
            self.channels.submissions.close()

    def abort_nowait(self) -> None:
        """Ask the driver to abort (idempotent; everything is returned at once)."""
        try:
            self.channels.commands.submit_and_close_nowait(Abort())
        except (WouldBlock, SubmissionClosed):
            # Full: close admission; the endpoint then shuts down with its default grace.
            self.channels.submissions.close()

    def statistics_counts(self) -> tuple[int, int, int]:
        """(live connections, live streams, refused streams)."""
        return len(self.conns), len(self.streams), self.refused_streams
