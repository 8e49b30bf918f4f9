"""``Node``: one Chrysalis process, on asyncio or trio (upper spec 4, transport spec 6.3).

Why a facade: an application wants "my PID, streams to any PID, streams from anyone, names for
everything" without wiring a carrier, a switch, a QUIC endpoint, a nameserver, a parent link
and route projection by hand. ``Node`` composes them in the reference order and tears them
down in the reverse one:

startup (``async with Node(...)``): PID from the identity and an empty ``Router``; a
``DatagramSwitch`` over the carrier with one routed binding for ``[PID, PID 0]``; one
``QuicTransport`` on it; the nameserver link-local protocol (``chrysalis.ns.v3\\0``)
registered before any user protocol; the ``NameserverService`` (routes projected into the
router) with this node's entry; the ``ParentLinkManager`` when a parent is configured; the
``ChildLinkServer`` (upstream = the manager).

shutdown: user protocols, then the parent manager (its link is finished cleanly so the parent
withdraws this subtree at once), then the child server (every child link revoked), then the
transport (it drains while the switch still runs so close frames leave), then the switch and
the carrier.

Runtimes: the node runs under asyncio or trio, whichever runs ``async with``; the components
are the same (``chrysalis.nameserver``'s I/O layer and ``QuicTransport`` are runtime-neutral).
Under trio the node opens one nursery for its tasks inside the transport's and closes it before
the transport, so nothing it starts outlives the ``async with`` block. Streams are the
runtime's own (``AsyncioStream`` or ``TrioStream``).

Advertised locator: a joined node publishes the address of the carrier it reaches its parent
on (``advertised_addr``). Ancestors route this subtree to that address and the subtree's
replies leave through the parent's default route on the same carrier, so both directions of
a connection take one path. Advertising another member of a socket set (say Unix, when the
parent link is UDP) made the two directions differ: a process dialling into the subtree saw
the answers arrive from an address it never sent to and its QUIC handshake failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, final

from chrysalis.core import DatagramAddr, Pid, PidPrefix
from chrysalis.core.runtime import (
    AsyncioSpawner,
    Spawner,
    Task,
    TrioSpawner,
    current_async_library,
    join_shielded,
    run_in_thread,
)
from chrysalis.datagram import (
    AddressInUseError,
    DatagramSocket,
    DatagramSocketSet,
    DatagramSwitch,
    Router,
    UdpSocket,
    UnixDatagramSocket,
)
from chrysalis.nameserver import (
    DEFAULT_NEGATIVE_TTL_MS,
    DEFAULT_RETRY_DELAY,
    DEFAULT_VERSIONS,
    NS_PROTOCOL_SELECTOR,
    ChildLinkServer,
    Consistency,
    EnumerationPage,
    EnumerationStale,
    Found,
    Labels,
    Locator,
    NameserverService,
    NamespaceConfig,
    NotFound,
    ParentLinkManager,
    ParentStatus,
    ProcEntry,
    Resolution,
    VersionRange,
)
from chrysalis.node._advertise import advertised_address, is_wildcard, parse_advertise
from chrysalis.node._sessions import DEFAULT_HANDSHAKE_TIMEOUT, LinkSessionHandler, LinkSessions
from chrysalis.node._tempdirs import reclaim_stale_socket
from chrysalis.quic import ByteStream, Identity, LinkProtocolId, QuicConfig, QuicTransport

__all__ = [
    "DEFAULT_REJOIN_TIMEOUT",
    "ENUMERATION_ATTEMPTS",
    "ENUMERATION_PAGE",
    "JoinSettings",
    "Node",
    "NodeError",
    "NodeStatistics",
    "bind_carrier",
]

ENUMERATION_ATTEMPTS: Final = 8
"""Full enumeration passes before ``EnumerationChanged``."""
ENUMERATION_PAGE: Final = 256
"""Entries per enumeration page."""
DEFAULT_REJOIN_TIMEOUT: Final = 5.0
"""Seconds ``dial`` waits for a child that is joining again (``NameserverService.rejoining``),
beyond the node's QUIC idle timeout, before it reports ``NotFound`` (``Node.rejoin_timeout``).
The idle timeout is added because a child that was starved of CPU (or stopped) could notice its
lost link up to one idle timeout late: the keepalives its parent sent meanwhile waited in its
socket and restarted its own idle timer when it ran again (measured: 3.06 s of a 3 s idle
timeout after ``SIGCONT``, in 7 of 8 runs), and only then did it dial again. Both QUIC engines
now end a connection whose idle deadline passed before such datagrams were read (README, "A
hung head that resumes"); a child whose deadline falls after its parent's may still be one
idle timeout late."""
_SWITCH_JOIN: Final = 5.0
_CHILD_REJOIN_WAIT_MAX: Final = 8.0
"""At most this long a child's resolve of a PID that is joining again is held (the nameserver's
``rejoin_wait``): under the upstream timeout (``DEFAULT_UPSTREAM_TIMEOUT``, 10 s) after which
a middle node gives up on its parent, so the answer arrives before anyone stops waiting."""


class NodeError(Exception):
    """A ``Node`` operation failed; ``str`` says which (not found, no locators, prefix,
    enumeration changed, dial failed)."""


@final
@dataclass(frozen=True, slots=True)
class JoinSettings:
    """Where this node's parent is: its carrier ``address`` and optionally its pinned
    ``authority`` PID (without it the first authenticated parent is pinned)."""

    address: DatagramAddr
    authority: Pid | None = None
    retry_delay: float = DEFAULT_RETRY_DELAY

    def config(self) -> NamespaceConfig:
        """The manager configuration."""
        return NamespaceConfig((self.address,), self.authority, self.retry_delay)


@final
@dataclass(frozen=True, slots=True)
class NodeStatistics:
    """A snapshot of a node: directory size and revision, routes, parent status."""

    pid: Pid
    entries: int
    revision: int
    routes: int
    parent: ParentStatus | None


def bind_carrier(address: DatagramAddr | str) -> DatagramSocket:
    """A carrier socket for ``udp://ip:port`` or ``unix://path`` (``NodeError`` else).

    A Unix socket file that nobody is bound to any more (left by a process killed with -9) is
    removed and bound again; a path where a socket is alive, or that is not a socket, raises
    ``AddressInUseError``."""
    addr = DatagramAddr.parse(address) if isinstance(address, str) else address
    if addr.scheme == "udp":
        return UdpSocket.bind(addr)
    if addr.scheme == "unixgram":
        try:
            return UnixDatagramSocket.bind(addr)
        except AddressInUseError:
            if not reclaim_stale_socket(addr.opaque):
                raise
            return UnixDatagramSocket.bind(addr)
    raise NodeError(f"cannot bind a carrier for {addr}")


@final
class Node:
    """One Chrysalis process (see the module docstring); use ``async with``.

    Args:
        identity: this process's certificate identity (PID = hash of its leaf).
        carrier: the datagram socket to own, or ``listen`` to bind one
            (``udp://127.0.0.1:0`` by default).
        parent: where to join (``None``: a root).
        labels, versions, negative_ttl_ms: published labels and nameserver settings.
        quic_config: QUIC parameters (idle timeout, windows); the transport's default if
            ``None``.
    """

    __slots__ = (
        "_advertise",
        "_advertised",
        "_carrier",
        "_identity",
        "_labels",
        "_manager",
        "_negative_ttl",
        "_nursery_cm",
        "_parent",
        "_parent_error",
        "_pending_protocols",
        "_quic_config",
        "_router",
        "_server",
        "_service",
        "_session_tasks",
        "_sessions",
        "_spawner",
        "_switch",
        "_transport",
        "_transport_cm",
        "_versions",
    )

    def __init__(
        self,
        identity: Identity,
        *,
        carrier: DatagramSocket | None = None,
        listen: DatagramAddr | str | None = None,
        parent: JoinSettings | None = None,
        labels: Labels = Labels.EMPTY,
        versions: VersionRange = DEFAULT_VERSIONS,
        negative_ttl_ms: int = DEFAULT_NEGATIVE_TTL_MS,
        quic_config: QuicConfig | None = None,
        advertise: str | None = None,
    ) -> None:
        if carrier is not None and listen is not None:
            raise ValueError("pass carrier or listen, not both")
        # Checked now: a bad --advertise fails before anything binds.
        self._advertise = None if advertise is None else str(parse_advertise(advertise))
        self._advertised: dict[tuple[DatagramAddr, DatagramAddr | None], DatagramAddr] = {}
        self._identity = identity
        self._carrier = carrier
        if carrier is None:
            self._carrier = bind_carrier(listen if listen is not None else "udp://127.0.0.1:0")
        self._parent = parent
        self._parent_error: str | None = None
        self._labels = labels
        self._versions = versions
        self._negative_ttl = negative_ttl_ms
        self._quic_config = quic_config
        self._router = Router()
        self._switch: DatagramSwitch | None = None
        self._transport: QuicTransport[ByteStream] | None = None
        self._transport_cm: Any = None
        self._service: NameserverService | None = None
        self._manager: ParentLinkManager | None = None
        self._server: ChildLinkServer | None = None
        self._pending_protocols: dict[
            LinkProtocolId, Callable[[Pid, ByteStream], Awaitable[object]]
        ] = {}
        self._sessions: dict[LinkProtocolId, LinkSessions] = {}
        self._session_tasks: list[Task] = []
        self._spawner: Spawner | None = None
        self._nursery_cm: Any = None

    @classmethod
    def serve(cls, identity: Identity, address: DatagramAddr | str, **kwargs: Any) -> Node:
        """A root node listening on ``address``."""
        return cls(identity, listen=address, **kwargs)

    @classmethod
    def join(
        cls,
        identity: Identity,
        address: DatagramAddr | str,
        authority: Pid | None = None,
        **kwargs: Any,
    ) -> Node:
        """A node whose parent listens on ``address`` (pinned to ``authority`` if given)."""
        addr = DatagramAddr.parse(address) if isinstance(address, str) else address
        return cls(identity, parent=JoinSettings(addr, authority), **kwargs)

    # -- accessors --------------------------------------------------------------------------

    @property
    def pid(self) -> Pid:
        """This node's PID."""
        return self._identity.pid

    @property
    def quic_config(self) -> QuicConfig:
        """The QUIC parameters of this node's connections (``QuicConfig()`` unless given)."""
        return self._quic_config if self._quic_config is not None else QuicConfig()

    @property
    def rejoin_timeout(self) -> float:
        """Seconds ``dial`` waits by default for a child of this node that is joining again:
        the QUIC idle timeout plus ``DEFAULT_REJOIN_TIMEOUT``."""
        return self.quic_config.idle_timeout + DEFAULT_REJOIN_TIMEOUT

    @property
    def router(self) -> Router:
        """The routing table (projected from the nameserver)."""
        return self._router

    @property
    def local_addr(self) -> DatagramAddr:
        """The carrier address peers and children dial."""
        assert self._carrier is not None
        return self._carrier.local_addr

    @property
    def advertised_addr(self) -> DatagramAddr:
        """The address this node publishes as its locator: the carrier it reaches its parent
        on (a socket set's member for the parent's scheme), else ``local_addr``; a wildcard
        UDP bind is replaced by a routable address of this host, or by the ``advertise``
        address given (``chrysalis.node._advertise``: toward the parent, the default route's
        interface, another interface, loopback)."""
        carrier = self._carrier
        assert carrier is not None
        bound = carrier.local_addr
        parent = self._parent.address if self._parent is not None else None
        if parent is not None and isinstance(carrier, DatagramSocketSet):
            try:
                bound = carrier.member_for(parent).local_addr
            except Exception:
                bound = carrier.local_addr
        return self._routable(bound, parent)

    def _routable(self, bound: DatagramAddr, parent: DatagramAddr | None) -> DatagramAddr:
        if bound.scheme != "udp" or (self._advertise is None and not is_wildcard(bound)):
            return bound
        key = (bound, parent)
        found = self._advertised.get(key)
        if found is None:
            found = advertised_address(bound, override=self._advertise, parent=parent)
            if len(self._advertised) >= 8:  # bounded: one entry per (carrier, parent) seen
                self._advertised.clear()
            self._advertised[key] = found
        return found

    @property
    def join_token(self) -> str:
        """``<carrier address>?authority=<pid hex>``: how others join this node (a wildcard
        UDP bind replaced by a routable address, as in ``advertised_addr``)."""
        return f"{self._routable(self.local_addr, None)}?authority={self.pid.hex()}"

    @property
    def nameserver(self) -> NameserverService:
        """The local nameserver (``RuntimeError`` before startup)."""
        if self._service is None:
            raise RuntimeError("the node is not started")
        return self._service

    @property
    def transport(self) -> QuicTransport[ByteStream]:
        """The QUIC transport (``RuntimeError`` before startup)."""
        if self._transport is None:
            raise RuntimeError("the node is not started")
        return self._transport

    @property
    def parent_manager(self) -> ParentLinkManager | None:
        """The parent link manager (``None`` for a root)."""
        return self._manager

    def statistics(self) -> NodeStatistics:
        """An immutable snapshot."""
        service = self.nameserver
        return NodeStatistics(
            self.pid,
            len(service.directory),
            service.revision().value,
            len(self._router.routes()),
            None if self._manager is None else self._manager.status,
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> Node:
        try:
            await self._start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _start(self) -> None:
        assert self._carrier is not None
        self._switch = DatagramSwitch.spawn(self._carrier, self._router)
        binding = self._switch.bind_routed_many([self.pid, Pid.LINK_LOCAL])
        self._transport_cm = QuicTransport.spawn(self._identity, binding, config=self._quic_config)
        transport: QuicTransport[ByteStream] = await self._transport_cm.__aenter__()
        self._transport = transport
        spawner = await self._open_task_scope()
        ns_protocol = transport.register_link_protocol(NS_PROTOCOL_SELECTOR)
        for protocol_id, handler in self._pending_protocols.items():
            transport.register_link_protocol(protocol_id, handler)
        service = NameserverService(
            self.pid,
            rejoin_wait=min(self.rejoin_timeout, _CHILD_REJOIN_WAIT_MAX),
            router=self._router,
            versions=self._versions,
            negative_ttl_ms=self._negative_ttl,
        )
        service.set_local_entry(
            ProcEntry(
                self.pid,
                self._identity.server_name or "",
                self._labels,
                (Locator(self.advertised_addr, 0),),
            )
        )
        self._service = service
        if self._parent is not None:
            self._manager = ParentLinkManager.spawn(
                service,
                self._parent.config(),
                self._dial_parent,
                router=self._router,
                versions=self._versions,
                spawner=spawner,
            )
        self._server = ChildLinkServer.spawn(
            service, ns_protocol, upstream=self._manager, spawner=spawner
        )
        self._start_sessions(spawner, list(self._sessions.values()))

    async def _open_task_scope(self) -> Spawner:
        """The spawner of this node's tasks: the running loop under asyncio, a nursery this
        node owns under trio (opened inside the transport's, closed before it)."""
        if current_async_library() == "trio":
            import trio

            self._nursery_cm = trio.open_nursery()
            nursery = await self._nursery_cm.__aenter__()
            self._spawner = TrioSpawner(nursery)
        else:
            self._spawner = AsyncioSpawner()
        return self._spawner

    async def _dial_parent(
        self, address: DatagramAddr, pinned: Pid | None
    ) -> tuple[Pid, ByteStream]:
        transport = self.transport
        try:
            if pinned is None:
                return await transport.dial_link_local_unpinned(address, NS_PROTOCOL_SELECTOR)
            stream = await transport.dial_link_local(pinned, address, NS_PROTOCOL_SELECTOR)
        except Exception as exc:
            self._parent_error = f"dialling the parent at {address} failed: {exc}"
            raise
        self._parent_error = None
        return pinned, stream

    @property
    def last_parent_error(self) -> str | None:
        """Why the latest dial to the parent failed (the certificate or PID that did not
        match, a refusal, a handshake timeout), in one line; ``None`` after a successful dial
        or before any. What a caller that gives up waiting for the parent should report."""
        return self._parent_error

    async def wait_connected(self) -> ParentStatus | None:
        """Wait until the parent link is active (``None`` at once for a root)."""
        return None if self._manager is None else await self._manager.wait_connected()

    async def aclose(self) -> None:
        """Shut down in the reference order (idempotent)."""
        try:
            tasks, self._session_tasks = self._session_tasks, []
            for task in tasks:
                task.cancel()
            await join_shielded(tasks)
            if self._manager is not None:
                await self._manager.shutdown()
            if self._server is not None:
                await self._server.shutdown()
        finally:
            if self._nursery_cm is not None:
                cm, self._nursery_cm = self._nursery_cm, None
                assert isinstance(self._spawner, TrioSpawner)
                self._spawner.nursery.cancel_scope.cancel()
                await cm.__aexit__(None, None, None)
            if self._transport_cm is not None:
                cm, self._transport_cm = self._transport_cm, None
                await cm.__aexit__(None, None, None)
            if self._switch is not None:
                switch, self._switch = self._switch, None
                switch.shutdown()
                await run_in_thread(switch.join, _SWITCH_JOIN)
            elif self._carrier is not None and self._transport is None:
                self._carrier.shutdown()

    # -- link-local protocols ---------------------------------------------------------------

    def register_link_protocol(
        self,
        protocol_id: LinkProtocolId | bytes,
        handler: Callable[[Pid, ByteStream], Awaitable[object]],
    ) -> None:
        """Run ``await handler(peer_pid, stream)`` for every link-local stream of
        ``protocol_id`` (``ValueError`` for the nameserver id or a duplicate)."""
        key = _protocol_key(protocol_id)
        if key.raw == NS_PROTOCOL_SELECTOR or key in self._pending_protocols:
            raise ValueError(f"link protocol {key} is already registered")
        if self._transport is not None:
            self._transport.register_link_protocol(key, handler)
        self._pending_protocols[key] = handler

    async def dial_link_local(
        self, pid: Pid, address: DatagramAddr, protocol_id: LinkProtocolId | bytes
    ) -> ByteStream:
        """A stream of a link-local protocol to the adjacent node ``pid`` at ``address``."""
        return await self.transport.dial_link_local(pid, address, protocol_id)

    def register_link_session(
        self,
        protocol_id: LinkProtocolId | bytes,
        handler: LinkSessionHandler,
        *,
        retry_delay: float | None = None,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    ) -> None:
        """Run ``await handler(LinkContext, stream)`` once per parent<->child nameserver link
        (spec 4.4; see ``chrysalis.node._sessions``): this node dials its parent's session
        (link id, then the parent's version byte) and admits its children's. A session that
        ends is reopened on the same link after ``retry_delay`` (the parent link's retry
        delay by default); a lost link ends it. ``handshake_timeout`` bounds the link-id /
        version exchange. ``ValueError`` for the nameserver id or a duplicate. Before or after
        startup."""
        key = _protocol_key(protocol_id)
        if key.raw == NS_PROTOCOL_SELECTOR or key in self._pending_protocols:
            raise ValueError(f"link protocol {key} is already registered")
        delay = retry_delay
        if delay is None:
            delay = DEFAULT_RETRY_DELAY if self._parent is None else self._parent.retry_delay
        sessions = LinkSessions(
            key, handler, retry_delay=delay, handshake_timeout=handshake_timeout
        )
        self._sessions[key] = sessions

        async def serve(peer: Pid, stream: ByteStream) -> None:
            await sessions.serve_child(self.nameserver, peer, stream)

        self._pending_protocols[key] = serve
        if self._transport is not None and self._spawner is not None:  # already running
            self._transport.register_link_protocol(key, serve)
            self._start_sessions(self._spawner, [sessions])

    def link_sessions(self, protocol_id: LinkProtocolId | bytes) -> LinkSessions:
        """The sessions of a protocol registered with ``register_link_session`` (their
        counters, refused links and handshake ``failure``); ``KeyError`` otherwise."""
        key = _protocol_key(protocol_id)
        return self._sessions[key]

    def _start_sessions(self, spawner: Spawner, which: list[LinkSessions]) -> None:
        for sessions in which:
            sessions.start(spawner, self.transport.dial_link_local)
            if self._manager is not None:
                task = spawner.spawn(sessions.supervise_parent, self._manager)
                self._session_tasks.append(task)

    # -- names ------------------------------------------------------------------------------

    async def resolve(self, pid: Pid, consistency: Consistency = Consistency.CACHED) -> Resolution:
        """Local nameserver first; a miss asks the parent (blocking across reconnects)."""
        local = self.nameserver.resolve(pid)
        if isinstance(local, Found) or self._manager is None:
            return local
        return await self._manager.resolve(pid, consistency)

    async def enumerate(self, consistency: Consistency = Consistency.CACHED) -> list[ProcEntry]:
        """Every entry this node can see: local for ``CACHED`` (or a root), the root's view
        through the parent for ``REFRESH``. ``NodeError`` after 8 stale passes."""
        for _ in range(ENUMERATION_ATTEMPTS):
            entries: list[ProcEntry] = []
            cursor = None
            while True:
                if consistency is Consistency.REFRESH and self._manager is not None:
                    page = await self._manager.enumerate(cursor, ENUMERATION_PAGE, consistency)
                else:
                    page = self.nameserver.enumerate(cursor, ENUMERATION_PAGE)
                if isinstance(page, EnumerationStale):
                    break
                assert isinstance(page, EnumerationPage)
                entries.extend(page.entries)
                if page.next is None:
                    return entries
                cursor = page.next
        raise NodeError(f"enumeration changed {ENUMERATION_ATTEMPTS} times (EnumerationChanged)")

    async def expand_pid(
        self, prefix: PidPrefix | str, consistency: Consistency = Consistency.REFRESH
    ) -> Pid:
        """The one PID matching ``prefix`` (``NodeError`` for none or several)."""
        parsed = PidPrefix.parse(prefix) if isinstance(prefix, str) else prefix
        entries = await self.enumerate(consistency)
        try:
            return parsed.expand(entry.pid for entry in entries)
        except LookupError as exc:
            raise NodeError(str(exc)) from exc

    # -- streams ----------------------------------------------------------------------------

    async def dial(
        self,
        pid: Pid,
        consistency: Consistency = Consistency.CACHED,
        *,
        rejoin_timeout: float | None = None,
    ) -> ByteStream:
        """A new stream to ``pid`` (an ``AsyncioStream`` or ``TrioStream``, both ``ByteStream``):
        resolve, then try its locators by priority.

        A PID this node does not know is ``NotFound`` at once, except one of this node's
        subtree that is joining again (``NameserverService.rejoining``: its link was lost, for
        instance a QUIC connection that idled out while a process was starved of CPU, and
        the child is dialling again, or its new link's snapshot is not committed yet): that
        one is waited for, at most ``rejoin_timeout`` seconds (``0``: not at all; by default
        ``Node.rejoin_timeout``, the QUIC idle timeout plus ``DEFAULT_REJOIN_TIMEOUT``)."""
        if rejoin_timeout is None:
            rejoin_timeout = self.rejoin_timeout
        resolution = await self.resolve(pid, consistency)
        rejoin = rejoin_timeout > 0 and isinstance(resolution, NotFound)
        if rejoin and self.nameserver.rejoining(pid):
            resolution = await self._await_rejoin(pid, rejoin_timeout)
        if isinstance(resolution, NotFound):
            raise NodeError(f"PID {pid.hex()} is not found (NotFound)")
        entry = resolution.entry
        if not entry.locators:
            raise NodeError(f"PID {pid.hex()} has no locators (NoLocators)")
        last: Exception | None = None
        for locator in sorted(entry.locators, key=lambda item: item.priority):
            try:
                return await self.transport.dial(
                    pid, locator.address, server_name=entry.tls_server_name or None
                )
            except Exception as exc:
                last = exc
        raise NodeError(f"dialling {pid.hex()} failed: {last}") from last

    async def _await_rejoin(self, pid: Pid, timeout: float) -> Resolution:
        """The resolution of ``pid`` once its child published it again; ``NodeError`` after
        ``timeout`` seconds; ``NotFound`` once it no longer counts as rejoining."""
        resolution = await self.nameserver.await_rejoined(pid, timeout)
        if resolution is None:
            raise NodeError(
                f"PID {pid.hex()} is not found (NotFound): its link to this node was lost "
                f"and it did not join again within {timeout:g} s"
            )
        return resolution

    async def accept(self) -> tuple[Pid, ByteStream]:
        """The next stream another process opened to this node (a ``ByteStream``), with its
        PID."""
        return await self.transport.accept()


def _protocol_key(protocol_id: LinkProtocolId | bytes) -> LinkProtocolId:
    return protocol_id if isinstance(protocol_id, LinkProtocolId) else LinkProtocolId(protocol_id)


# Documented at ``chrysalis.node`` (which imports them on first use): named there, whichever
# module a process imported them from first.
for _public in (JoinSettings, Node, NodeError, NodeStatistics):
    _public.__module__ = "chrysalis.node"
del _public
