"""``QuicTransport``: authenticated process-to-process streams over one QUIC endpoint (spec 6).

Why a layer above the endpoint adapters: the layers above (the node, the nameserver, Monarch)
think in *processes*, not connections. They want "a stream to PID X at this address", "the next
stream some process opened to me, and who it was", and a few control protocols (the nameserver,
replication, user protocols) multiplexed on the same carrier without each inventing its own
framing. ``QuicTransport`` gives exactly that, over any datagram socket:

* **One stream API, three backends.** The socket below decides the backend: a routed
  ``DatagramSwitch`` binding for ``[own PID, PID 0]`` (the node's usual carrier: UDP, Unix
  datagram, in-process or a socket set, with forwarding through the switch), a plain
  ``UdpSocket`` (direct UDP: no switch, no forwarding), or any socket with the link-local PID
  as routing PID (a dedicated link-local transport, ``spawn(..., link_local=True)``). The
  endpoint never cares which.
* **One pooled connection per peer PID.** ``dial(pid, address)`` reuses the pooled connection
  to ``pid`` when it is alive (a new stream costs no handshake), shares one handshake between
  concurrent dials of the same PID, and otherwise connects with ``pid`` as both the route
  (the CID prefix the packets are delivered to) and the PID the peer's certificate must
  prove. Connections the peer dialled are adopted into the pool when none exists, so two
  processes that talk both ways use one connection. A connection that closes leaves the pool.
* **Accept yields the authenticated source.** ``accept()`` returns ``(peer PID, stream)`` for
  streams on connections that terminate at this process's PID; the PID is the hash of the
  peer's verified certificate, never a claim.
* **Link-local protocols.** Connections that terminate at PID 0 (dialled with PID 0 as route
  and source, pinned to the adjacent process's PID) carry control protocols. Every such
  stream starts with a 16-byte protocol id (``LinkProtocolId``) written by the dialler; the
  acceptor classifies each stream concurrently (at most ``max_classifiers`` at once, each
  within ``classify_timeout``) and queues it, with the peer's PID, on that protocol's bounded
  queue (``register_link_protocol``), or hands it to the protocol's handler. An unknown id, a
  short read, a timeout or a full queue closes only that stream (FIN and STOP_SENDING with
  ``LINK_REJECTED_CODE``); the connection and the other protocols are unaffected.

Everything here is runtime-neutral: it runs on whichever adapter endpoint it wraps
(``AsyncioEndpoint`` or ``TrioEndpoint``), through the adapter's ``Runtime`` services, and
returns that adapter's stream objects. ``QuicTransport.spawn`` picks the adapter of the
running event loop.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Generic, Protocol, TypeVar, final

from chrysalis.core import DatagramAddr, Pid
from chrysalis.core.completion import SubmissionLimits
from chrysalis.core.runtime import current_async_library
from chrysalis.datagram import DatagramSocket
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._driver import DEFAULT_DRIVER_MODE, DriverStatistics
from chrysalis.quic._endpoint_core import (
    AdapterOptions,
    AsyncEvent,
    ConnectionCore,
    EndpointCore,
    Runtime,
)
from chrysalis.quic._engines.base import EngineFactory
from chrysalis.quic._errors import (
    ConnectError,
    ConnectionLostError,
    EndpointClosedError,
    PeerAuthenticationError,
    QuicTransportError,
)
from chrysalis.quic._identity import Identity
from chrysalis.quic._stream_core import StreamCore

__all__ = [
    "DEFAULT_CLASSIFY_TIMEOUT",
    "DEFAULT_LINK_QUEUE_CAPACITY",
    "LINK_PROTOCOL_ID_LEN",
    "LINK_REJECTED_CODE",
    "DuplicateProtocolError",
    "LinkProtocol",
    "LinkProtocolId",
    "QuicTransport",
    "TransportEndpoint",
    "TransportStatistics",
    "current_async_library",
]

_log = logging.getLogger("chrysalis.quic")

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)

LINK_PROTOCOL_ID_LEN: Final = 16
"""Bytes of the selector that starts every link-local stream."""
LINK_REJECTED_CODE: Final = 0x3
"""Application error code of STOP_SENDING on a link-local stream that was not delivered."""
DEFAULT_LINK_QUEUE_CAPACITY: Final = 1024
"""Streams one link protocol's queue holds before new ones are rejected."""
DEFAULT_CLASSIFY_TIMEOUT: Final = 10.0
"""Seconds an incoming link-local stream may take to deliver its 16-byte protocol id."""
DEFAULT_MAX_CLASSIFIERS: Final = 256
"""Link-local streams being classified at once; beyond it new ones are rejected."""
DEFAULT_MAX_HANDLERS: Final = 64
"""Handler calls running at once per link protocol; beyond it streams wait in the queue."""
_MAX_PROTOCOLS: Final = 256


class DuplicateProtocolError(QuicTransportError, ValueError):
    """The link protocol id is already registered."""


@final
class LinkProtocolId:
    """A 16-byte link-local protocol selector (for example ``b"chrysalis.ns.v2\\0"``).

    Immutable and hashable; ``repr`` shows the 32 lowercase hex digits. Construct it from 16
    bytes or with ``from_hex`` (32 hex digits); ``ValueError`` otherwise.
    """

    __slots__ = ("_raw",)
    _raw: bytes

    def __init__(self, raw: bytes | bytearray | memoryview) -> None:
        value = bytes(raw)
        if len(value) != LINK_PROTOCOL_ID_LEN:
            raise ValueError(f"a link protocol id is 16 bytes, got {len(value)}")
        object.__setattr__(self, "_raw", value)

    @classmethod
    def from_hex(cls, text: str) -> LinkProtocolId:
        """Parse 32 hexadecimal digits (either case)."""
        if len(text) != 2 * LINK_PROTOCOL_ID_LEN:
            raise ValueError("a link protocol id is 32 hex digits")
        return cls(bytes.fromhex(text))

    @property
    def raw(self) -> bytes:
        """The 16 bytes written at the start of the stream."""
        return self._raw

    def hex(self) -> str:
        """32 lowercase hexadecimal digits."""
        return self._raw.hex()

    def __bytes__(self) -> bytes:
        return self._raw

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LinkProtocolId) and other._raw == self._raw

    def __hash__(self) -> int:
        return hash((LinkProtocolId, self._raw))

    def __repr__(self) -> str:
        return f"LinkProtocolId({self._raw.hex()})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("LinkProtocolId is immutable")


def _protocol_id(value: LinkProtocolId | bytes | bytearray | memoryview) -> LinkProtocolId:
    return value if isinstance(value, LinkProtocolId) else LinkProtocolId(value)


class TransportEndpoint(Protocol[S_co]):
    """What ``QuicTransport`` needs of an adapter endpoint (``AsyncioEndpoint`` and
    ``TrioEndpoint`` provide it); ``S_co`` is the adapter's stream type."""

    @property
    def core(self) -> EndpointCore: ...

    @property
    def runtime(self) -> Runtime: ...

    @property
    def pid(self) -> Pid: ...

    @property
    def routing_pid(self) -> Pid: ...

    @property
    def local_addr(self) -> DatagramAddr: ...

    def wrap_stream(self, stream: StreamCore) -> S_co: ...

    def driver_statistics(self) -> DriverStatistics: ...

    async def aclose(self, *, abort: bool = False, grace: float = 1.0) -> None: ...


@dataclass(frozen=True, slots=True)
class TransportStatistics:
    """A snapshot of a ``QuicTransport``.

    ``pooled`` / ``link_pooled``: live pooled connections; ``dials``: handshakes started by
    ``dial*``; ``reused``: dials served by a pooled connection; ``adopted``: peer-dialled
    connections taken into a pool; ``link_delivered`` / ``link_rejected``: classified
    link-local streams delivered / closed (unknown id, short read, timeout, full queue);
    ``refused_streams``: incoming streams the endpoint adapter refused (accept queues full).
    """

    pooled: int
    link_pooled: int
    dials: int
    reused: int
    adopted: int
    link_delivered: int
    link_rejected: int
    refused_streams: int


@final
class LinkProtocol(Generic[S]):
    """One registered link-local protocol: a bounded queue of ``(peer PID, stream)``.

    Streams arrive after their 16-byte selector was consumed. ``accept()`` takes the next one
    (``EndpointClosedError`` once the protocol or the transport closed). With a handler, the
    transport calls it for every stream instead (at most ``max_handlers`` at once).
    """

    __slots__ = (
        "_closed",
        "_event",
        "_items",
        "_transport",
        "capacity",
        "delivered",
        "protocol_id",
        "rejected",
    )

    def __init__(
        self, transport: QuicTransport[S], protocol_id: LinkProtocolId, capacity: int
    ) -> None:
        self._transport = transport
        self.protocol_id = protocol_id
        self.capacity = capacity
        self._items: deque[StreamCore] = deque()
        self._event: AsyncEvent | None = None
        self._closed = False
        self.delivered = 0
        self.rejected = 0

    def __len__(self) -> int:
        return len(self._items)

    def _offer(self, stream: StreamCore) -> bool:
        if self._closed or len(self._items) >= self.capacity:
            self.rejected += 1
            return False
        self._items.append(stream)
        self.delivered += 1
        event = self._event
        if event is not None:
            self._event = None
            event.set()
        return True

    async def accept(self) -> tuple[Pid, S]:
        """The next stream of this protocol and its peer's authenticated PID."""
        while True:
            if self._items:
                stream = self._items.popleft()
                peer = stream.conn.peer
                assert peer is not None
                return peer, self._transport._wrap(stream)
            if self._closed:
                raise EndpointClosedError(f"link protocol {self.protocol_id} is closed")
            event = self._event
            if event is None:
                event = self._event = self._transport._runtime.event()
            await event.wait()

    def close(self) -> None:
        """Stop delivering: queued streams are rejected, ``accept`` raises (idempotent)."""
        if self._closed:
            return
        self._closed = True
        while self._items:
            self._items.popleft().close(LINK_REJECTED_CODE)
        event = self._event
        if event is not None:
            self._event = None
            event.set()


@final
class _Dial:
    """A handshake in progress that concurrent dials of the same PID share."""

    __slots__ = ("conn", "error", "event")

    def __init__(self, event: AsyncEvent) -> None:
        self.event = event
        self.conn: ConnectionCore | None = None
        self.error: BaseException | None = None


Handler = Callable[[Pid, Any], Awaitable[object]]
"""A link protocol handler: ``await handler(peer_pid, stream)``."""


class QuicTransport(Generic[S]):
    """Authenticated streams between processes over one adapter endpoint (module docstring).

    Build one with ``QuicTransport.spawn(identity, socket)`` (``async with``; it starts the
    endpoint on the running loop's adapter) or wrap an endpoint you started:
    ``QuicTransport(endpoint)`` (the transport then owns it: ``aclose`` closes it).

    Args:
        endpoint: an ``AsyncioEndpoint`` or ``TrioEndpoint`` (duplex).
        server_name: also verify the peer's certificate against this name when dialling
            (None: the PID alone is the identity); a callable maps the dialled address to a
            name (for example the literal IP of a UDP address).
        classify_timeout: seconds an incoming link-local stream may take to send its id.
        max_classifiers: link-local streams classified at once (more are rejected).
    """

    __slots__ = (
        "_adopted",
        "_classifying",
        "_closed",
        "_core",
        "_dialing",
        "_dials",
        "_endpoint",
        "_handlers_running",
        "_link_pool",
        "_link_rejected",
        "_max_classifiers",
        "_pool",
        "_protocols",
        "_reused",
        "_runtime",
        "_server_name",
        "_slot_events",
        "classify_timeout",
    )

    def __init__(
        self,
        endpoint: TransportEndpoint[S],
        *,
        server_name: str | Callable[[DatagramAddr], str | None] | None = None,
        classify_timeout: float = DEFAULT_CLASSIFY_TIMEOUT,
        max_classifiers: int = DEFAULT_MAX_CLASSIFIERS,
    ) -> None:
        if classify_timeout <= 0 or max_classifiers < 1:
            raise ValueError("classify_timeout and max_classifiers must be positive")
        self._endpoint = endpoint
        self._core = endpoint.core
        self._runtime = endpoint.runtime
        self._server_name = server_name
        self.classify_timeout = float(classify_timeout)
        self._max_classifiers = max_classifiers
        self._pool: dict[Pid, ConnectionCore] = {}
        self._link_pool: dict[Pid, ConnectionCore] = {}
        self._dialing: dict[tuple[bool, Pid], _Dial] = {}
        self._protocols: dict[LinkProtocolId, LinkProtocol[S]] = {}
        self._handlers_running: dict[LinkProtocolId, int] = {}
        self._slot_events: dict[LinkProtocolId, AsyncEvent] = {}
        self._classifying = 0
        self._closed = False
        self._dials = 0
        self._reused = 0
        self._adopted = 0
        self._link_rejected = 0
        self._core.on_connection_closed.append(self._on_connection_closed)
        self._core.on_established.append(self._on_established)
        for conn in list(self._core.conns.values()):
            if conn.is_established:
                self._on_established(conn)
        self._runtime.spawn(self._accept_link_streams)

    # -- construction ---------------------------------------------------------------------------

    @staticmethod
    def spawn(
        identity: Identity,
        socket: DatagramSocket,
        *,
        link_local: bool = False,
        server_name: str | Callable[[DatagramAddr], str | None] | None = None,
        config: QuicConfig | None = None,
        limits: EndpointLimits | None = None,
        options: AdapterOptions | None = None,
        submission_limits: SubmissionLimits | None = None,
        driver: str = DEFAULT_DRIVER_MODE,
        close_socket: bool = True,
        engine: EngineFactory | None = None,
        classify_timeout: float = DEFAULT_CLASSIFY_TIMEOUT,
        max_classifiers: int = DEFAULT_MAX_CLASSIFIERS,
    ) -> _TransportSpawn:
        """Start a duplex endpoint over ``socket`` on the running loop's adapter (asyncio or
        trio) and wrap it (``async with QuicTransport.spawn(...) as transport``).

        ``link_local=True`` makes a dedicated link-local transport (routing PID 0: every
        connection it dials terminates at the peer's link-local mux). Other arguments go to
        the adapter's ``spawn_duplex`` / ``spawn_duplex_routed`` and to ``QuicTransport``.
        """
        endpoint_args: dict[str, Any] = {
            "config": config,
            "limits": limits,
            "options": options,
            "submission_limits": submission_limits,
            "driver": driver,
            "close_socket": close_socket,
            "engine": engine,
        }
        transport_args: dict[str, Any] = {
            "server_name": server_name,
            "classify_timeout": classify_timeout,
            "max_classifiers": max_classifiers,
        }
        return _TransportSpawn(identity, socket, link_local, endpoint_args, transport_args)

    # -- properties -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> TransportEndpoint[S]:
        """The adapter endpoint below."""
        return self._endpoint

    @property
    def pid(self) -> Pid:
        """This process's PID."""
        return self._endpoint.pid

    @property
    def local_addr(self) -> DatagramAddr:
        """The carrier address peers dial."""
        return self._endpoint.local_addr

    @property
    def is_link_local(self) -> bool:
        """True for a dedicated link-local transport (routing PID 0)."""
        return self._endpoint.routing_pid.is_link_local

    @property
    def is_closed(self) -> bool:
        """True after ``aclose`` (or once the endpoint stopped)."""
        return self._closed or self._core.stopped

    def statistics(self) -> TransportStatistics:
        """An immutable snapshot of the transport's pools and counters."""
        delivered = sum(p.delivered for p in self._protocols.values())
        rejected = self._link_rejected + sum(p.rejected for p in self._protocols.values())
        return TransportStatistics(
            pooled=len(self._pool),
            link_pooled=len(self._link_pool),
            dials=self._dials,
            reused=self._reused,
            adopted=self._adopted,
            link_delivered=delivered,
            link_rejected=rejected,
            refused_streams=self._core.refused_streams,
        )

    def pooled_peers(self) -> list[Pid]:
        """The PIDs with a pooled application connection."""
        return list(self._pool)

    def _wrap(self, stream: StreamCore) -> S:
        return self._endpoint.wrap_stream(stream)

    def _check_open(self) -> None:
        if self._closed:
            raise EndpointClosedError("the transport is closed")
        self._core.check_open()

    # -- pools ----------------------------------------------------------------------------------

    def _on_established(self, conn: ConnectionCore) -> None:
        peer = conn.peer
        if conn.dialed or peer is None or self._closed:
            return
        pool = self._link_pool if conn.local_pid.is_link_local else self._pool
        current = pool.get(peer)
        if current is None or current.is_closed:
            pool[peer] = conn
            self._adopted += 1

    def _on_connection_closed(self, conn: ConnectionCore) -> None:
        peer = conn.peer
        if peer is None:
            return
        for pool in (self._pool, self._link_pool):
            if pool.get(peer) is conn:
                del pool[peer]

    def _name_for(self, address: DatagramAddr, server_name: str | None) -> str | None:
        if server_name is not None:
            return server_name
        policy = self._server_name
        if policy is None or isinstance(policy, str):
            return policy
        return policy(address)

    async def _connection(
        self, pid: Pid, address: DatagramAddr, link: bool, server_name: str | None
    ) -> ConnectionCore:
        pool = self._link_pool if link else self._pool
        key = (link, pid)
        while True:
            self._check_open()
            conn = pool.get(pid)
            if conn is not None:
                if conn.is_established:
                    self._reused += 1
                    return conn
                del pool[pid]
            pending = self._dialing.get(key)
            if pending is None:
                break
            await pending.event.wait()
            if pending.conn is not None and pending.conn.is_established:
                self._reused += 1
                return pending.conn
            error = pending.error
            if isinstance(error, PeerAuthenticationError):
                raise PeerAuthenticationError(error.expected, error.actual, error.reason) from error
            if isinstance(error, Exception):
                raise ConnectError(f"dialling {pid} failed: {error}") from error
            # The shared dial was cancelled (or closed again at once): try ourselves.
        pending = _Dial(self._runtime.event())
        self._dialing[key] = pending
        self._dials += 1
        try:
            route = Pid.LINK_LOCAL if link else pid
            source = Pid.LINK_LOCAL if link else None
            conn = await self._core.connect(
                route,
                address,
                expected=pid,
                source=source,
                server_name=self._name_for(address, server_name),
            )
            if not self._closed:
                pool[pid] = conn
            pending.conn = conn
            return conn
        except BaseException as exc:
            pending.error = exc
            raise
        finally:
            del self._dialing[key]
            pending.event.set()

    async def _open(
        self, pid: Pid, address: DatagramAddr, link: bool, server_name: str | None
    ) -> StreamCore:
        conn = await self._connection(pid, address, link, server_name)
        try:
            return await conn.open_stream()
        except ConnectionLostError:
            # The pooled connection died between the lookup and the open: dial afresh once.
            pool = self._link_pool if link else self._pool
            if pool.get(pid) is conn:
                del pool[pid]
            conn = await self._connection(pid, address, link, server_name)
            return await conn.open_stream()

    # -- application streams --------------------------------------------------------------------

    async def dial(self, pid: Pid, address: DatagramAddr, *, server_name: str | None = None) -> S:
        """A new stream to the process ``pid`` reachable at ``address``.

        Reuses the pooled connection to ``pid`` when it is alive; otherwise connects and
        authenticates (the peer's certificate must hash to ``pid``). On a link-local
        transport the connection terminates at the peer's link-local PID. The peer sees the
        stream with the first bytes written.

        Raises ``PeerAuthenticationError``, ``ConnectError``, ``ConnectionLostError`` or
        ``EndpointClosedError``; ``ValueError`` for the link-local PID.
        """
        if not isinstance(pid, Pid) or pid.is_link_local:
            raise ValueError("dial needs a process PID (not the link-local PID)")
        stream = await self._open(pid, address, self.is_link_local, server_name)
        return self._wrap(stream)

    async def accept(self) -> tuple[Pid, S]:
        """The next stream another process opened to this process, with its authenticated
        PID (``EndpointClosedError`` once closed)."""
        self._check_open()
        stream = await self._core.accepts.take()
        peer = stream.conn.peer
        assert peer is not None
        return peer, self._wrap(stream)

    # -- link-local protocols -------------------------------------------------------------------

    def register_link_protocol(
        self,
        protocol_id: LinkProtocolId | bytes,
        handler: Handler | None = None,
        *,
        queue_capacity: int = DEFAULT_LINK_QUEUE_CAPACITY,
        max_handlers: int = DEFAULT_MAX_HANDLERS,
    ) -> LinkProtocol[S]:
        """Register a link-local protocol; incoming streams with this 16-byte id are queued
        on the returned ``LinkProtocol`` (at most ``queue_capacity``; more are rejected).

        With ``handler``, the transport calls ``await handler(peer_pid, stream)`` for each
        stream (at most ``max_handlers`` at once; the stream is closed when the handler
        returns, and aborted if it raises). ``DuplicateProtocolError`` if the id is taken.
        """
        self._check_open()
        key = _protocol_id(protocol_id)
        if key in self._protocols:
            raise DuplicateProtocolError(f"link protocol {key} is already registered")
        if len(self._protocols) >= _MAX_PROTOCOLS:
            raise QuicTransportError(f"at most {_MAX_PROTOCOLS} link protocols")
        if queue_capacity < 1 or max_handlers < 1:
            raise ValueError("queue_capacity and max_handlers must be positive")
        protocol: LinkProtocol[S] = LinkProtocol(self, key, queue_capacity)
        self._protocols[key] = protocol
        if handler is not None:
            self._handlers_running[key] = 0
            self._runtime.spawn(self._run_handlers, protocol, handler, max_handlers)
        return protocol

    def unregister_link_protocol(self, protocol_id: LinkProtocolId | bytes) -> None:
        """Remove a protocol: its queued streams are rejected, new ones too (idempotent)."""
        protocol = self._protocols.pop(_protocol_id(protocol_id), None)
        if protocol is not None:
            protocol.close()

    def link_protocols(self) -> list[LinkProtocolId]:
        """The registered protocol ids."""
        return list(self._protocols)

    async def dial_link_local(
        self, pid: Pid, address: DatagramAddr, protocol_id: LinkProtocolId | bytes
    ) -> S:
        """A new stream of link protocol ``protocol_id`` to the adjacent process ``pid`` at
        ``address`` (over the pooled link-local connection; the id is written first)."""
        if not isinstance(pid, Pid) or pid.is_link_local:
            raise ValueError("dial_link_local needs the peer's process PID")
        key = _protocol_id(protocol_id)
        stream = await self._open(pid, address, True, None)
        stream.write(key.raw)
        return self._wrap(stream)

    async def dial_link_pooled(self, pid: Pid, protocol_id: LinkProtocolId | bytes) -> S | None:
        """A stream of link protocol ``protocol_id`` on the established link-local connection
        to the adjacent process ``pid`` (a parent or a child whose link is up), or None when
        there is none: this never dials, so it costs no handshake. The id is written first,
        as ``dial_link_local`` does; the peer's handler sees ``pid`` authenticated by that
        connection's handshake."""
        if not isinstance(pid, Pid) or pid.is_link_local:
            raise ValueError("dial_link_pooled needs the peer's process PID")
        self._check_open()
        key = _protocol_id(protocol_id)
        conn = self._link_pool.get(pid)
        if conn is None or not conn.is_established:
            return None
        try:
            stream = await conn.open_stream()
        except ConnectionLostError:
            return None
        self._reused += 1
        stream.write(key.raw)
        return self._wrap(stream)

    async def dial_link_local_unpinned(
        self, address: DatagramAddr, protocol_id: LinkProtocolId | bytes
    ) -> tuple[Pid, S]:
        """Like ``dial_link_local`` for a peer whose PID is not known yet (parent
        discovery): any peer with a trusted certificate is accepted; its PID is returned
        and the connection is pooled under it."""
        self._check_open()
        key = _protocol_id(protocol_id)
        self._dials += 1
        conn = await self._core.connect(
            Pid.LINK_LOCAL,
            address,
            expected=None,
            source=Pid.LINK_LOCAL,
            server_name=self._name_for(address, None),
        )
        peer = conn.peer
        assert peer is not None
        current = self._link_pool.get(peer)
        if current is None or current.is_closed:
            self._link_pool[peer] = conn
        stream = await conn.open_stream()
        stream.write(key.raw)
        return peer, self._wrap(stream)

    async def _accept_link_streams(self) -> None:
        queue = self._core.link_accepts
        while True:
            stream = await queue.take()
            if self._closed or self._classifying >= self._max_classifiers:
                self._reject(stream)
                continue
            self._classifying += 1
            self._runtime.spawn(self._classify, stream)

    async def _classify(self, stream: StreamCore) -> None:
        try:
            try:
                selector = await self._runtime.with_timeout(
                    self.classify_timeout, lambda: stream.read_exactly(LINK_PROTOCOL_ID_LEN)
                )
            except (TimeoutError, QuicTransportError):
                self._reject(stream)
                return
            protocol = self._protocols.get(LinkProtocolId(selector))
            if protocol is None or not protocol._offer(stream):
                if protocol is None:
                    self._link_rejected += 1
                stream.close(LINK_REJECTED_CODE)
                return
            if protocol.protocol_id in self._handlers_running:
                self._wake_handlers(protocol.protocol_id)
        finally:
            self._classifying -= 1

    def _reject(self, stream: StreamCore) -> None:
        self._link_rejected += 1
        stream.close(LINK_REJECTED_CODE)

    def _wake_handlers(self, key: LinkProtocolId) -> None:
        event = self._slot_events.pop(key, None)
        if event is not None:
            event.set()

    async def _run_handlers(
        self, protocol: LinkProtocol[S], handler: Handler, max_handlers: int
    ) -> None:
        key = protocol.protocol_id
        while True:
            while self._handlers_running[key] >= max_handlers:
                event = self._slot_events.get(key)
                if event is None:
                    event = self._slot_events[key] = self._runtime.event()
                await event.wait()
            peer, stream = await protocol.accept()
            self._handlers_running[key] += 1
            self._runtime.spawn(self._run_handler, key, handler, peer, stream)

    async def _run_handler(
        self, key: LinkProtocolId, handler: Handler, peer: Pid, stream: S
    ) -> None:
        core = getattr(stream, "core", None)
        try:
            await handler(peer, stream)
        except Exception:
            _log.exception("link protocol %s handler failed for %s", key, peer)
            if isinstance(core, StreamCore):
                core.abort(LINK_REJECTED_CODE)
        except BaseException:
            if isinstance(core, StreamCore):
                core.abort(LINK_REJECTED_CODE)
            raise
        else:
            if isinstance(core, StreamCore):
                core.close()
        finally:
            self._handlers_running[key] -= 1
            self._wake_handlers(key)

    # -- shutdown -------------------------------------------------------------------------------

    async def shutdown(self, grace: float = 1.0) -> None:
        """Stop the link protocols and shut the endpoint down gracefully (see ``aclose``)."""
        await self.aclose(grace=grace)

    async def aclose(self, *, abort: bool = False, grace: float = 1.0) -> None:
        """Close the link protocols (queued streams are rejected), then shut the endpoint
        down (gracefully within ``grace`` seconds, or at once with ``abort=True``); every
        task the transport started ends before this returns. Idempotent."""
        if not self._closed:
            self._closed = True
            for protocol in list(self._protocols.values()):
                protocol.close()
            self._pool.clear()
            self._link_pool.clear()
        await self._endpoint.aclose(abort=abort, grace=grace)

    async def __aenter__(self) -> QuicTransport[S]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose(abort=exc_type is not None)


class _TransportSpawn:
    """The async context manager ``QuicTransport.spawn`` returns."""

    __slots__ = (
        "_cm",
        "_endpoint_args",
        "_identity",
        "_link_local",
        "_socket",
        "_transport",
        "_transport_args",
    )

    def __init__(
        self,
        identity: Identity,
        socket: DatagramSocket,
        link_local: bool,
        endpoint_args: dict[str, Any],
        transport_args: dict[str, Any],
    ) -> None:
        self._identity = identity
        self._socket = socket
        self._link_local = link_local
        self._endpoint_args = endpoint_args
        self._transport_args = transport_args
        self._cm: Any = None
        self._transport: QuicTransport[Any] | None = None

    async def __aenter__(self) -> QuicTransport[Any]:
        adapter: Any
        if current_async_library("QuicTransport.spawn") == "trio":
            from chrysalis.quic._trio import TrioEndpoint

            adapter = TrioEndpoint
        else:
            from chrysalis.quic._asyncio import AsyncioEndpoint

            adapter = AsyncioEndpoint
        if self._link_local:
            cm = adapter.spawn_duplex_routed(
                self._identity, self._socket, routing_pid=Pid.LINK_LOCAL, **self._endpoint_args
            )
        else:
            cm = adapter.spawn_duplex(self._identity, self._socket, **self._endpoint_args)
        endpoint = await cm.__aenter__()
        self._cm = cm
        try:
            transport: QuicTransport[Any] = QuicTransport(endpoint, **self._transport_args)
        except BaseException:
            await cm.__aexit__(*sys.exc_info())
            raise
        self._transport = transport
        return transport

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        transport = self._transport
        assert transport is not None
        if not transport._closed:
            transport._closed = True
            for protocol in list(transport._protocols.values()):
                protocol.close()
        result: bool | None = await self._cm.__aexit__(exc_type, exc, tb)
        return result
