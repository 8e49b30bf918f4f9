"""``ReplicationTopology``: replicate one ``Replica`` along every adjacent link of a ``Node``.

Why a topology adapter: the namespace tree already says who is adjacent to whom, so the
replicas of a cluster follow it. Every parent<->child link of the node carries one
``chrysalis.sql.v5`` link-local stream and one ``ReplicaSession`` on it; together the sessions
spread every change to every replica exactly along the tree (upper spec 5.5-5.7, 4.4).

Scopes (split horizon). Toward its parent a node advertises an explicit scope: its own site
plus every site its children advertised (``SubtreeScopeAggregator``; each change bumps the
generation and is sent as a ``Scope`` message, so subtree membership propagates up the tree).
Toward each child it advertises ``ComplementOfPeer``. A link therefore carries only the child
subtree's origins upward and everything else downward; no change travels back toward its
origin subtree.

Per-link sessions (spec 4.4, the handshake the reference's ``LinkProtocolManager`` runs): after
the 16-byte protocol selector the *child* node writes the 16-byte ``LinkId`` of its current
nameserver link to the parent and reads one byte, which must be ``SESSION_ACK`` (1). The
*parent* node admits the stream only if its nameserver maps (child PID -> that link id) and no
session runs on that link; otherwise it drops the stream without a byte. So a replication
session is always tied to one nameserver link incarnation:

- child side (this node's parent link): the supervisor watches the parent manager's status. A
  ``CONNECTED`` status with a new link id aborts the old session and starts a new one; a lost
  link aborts it. If the ack fails before the first success on a link, the parent does not run
  the protocol and the link is given up; after a success, a session that ends (cleanly or not)
  is reopened on the same link after ``retry_delay``.
- parent side (our children's links): a session whose link leaves the nameserver's child-link
  map is aborted; a new session of the same child PID replaces a stale one.

The session itself is the pure ``ReplicaSession``; ``pump_session`` is the thin asyncio pump
that moves bytes between it and a stream, wakes it on local commits (the replica's change
listener) and scope changes, and polls it every ``POLL_INTERVAL`` (commits by other processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol, final

from chrysalis.core import LinkContext, LinkId, LinkSide, Pid
from chrysalis.nameserver import ParentLinkManager, ParentStatusKind
from chrysalis.node import Node
from chrysalis.quic import LinkProtocolId
from chrysalis.sqlite._protocol import PROTOCOL_ID
from chrysalis.sqlite._replica import Replica
from chrysalis.sqlite._scope import SitePublisher, SiteScope, SubtreeScopeAggregator
from chrysalis.sqlite._session import (
    POLL_INTERVAL,
    ReplicaSession,
    SessionState,
    SessionStatistics,
)

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_RETRY_DELAY",
    "LINK_ID_BYTES",
    "READ_SIZE",
    "SESSION_ACK",
    "SQLITE_LINK_PROTOCOL",
    "LinkReplicationStatus",
    "ReplicaStream",
    "ReplicationTopology",
    "pump_session",
]

_log = logging.getLogger("chrysalis.sqlite")

SQLITE_LINK_PROTOCOL: Final = LinkProtocolId(PROTOCOL_ID)
"""The link-local protocol selector ``chrysalis.sql.v5`` (16 ASCII bytes)."""
SESSION_ACK: Final = 1
"""The byte a parent writes to admit a per-link session."""
LINK_ID_BYTES: Final = 16
"""Bytes of the link id the child writes after the selector."""
DEFAULT_RETRY_DELAY: Final = 1.0
"""Seconds between a parent-link session's end (or a failed dial) and the next attempt."""
DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0
"""Seconds the link-id/ack exchange may take on either side."""
READ_SIZE: Final = 256 * 1024
"""Most bytes one stream read hands to the session."""
_ABORT_CODE: Final = 0x3


class ReplicaStream(Protocol):
    """The stream vocabulary ``pump_session`` needs (``chrysalis.quic``'s asyncio stream)."""

    async def read(self, n: int = -1) -> bytes: ...

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def write_eof(self) -> None: ...

    def abort(self, error_code: int = 0) -> None: ...


async def pump_session(
    session: ReplicaSession,
    stream: ReplicaStream,
    *,
    wake: asyncio.Event | None = None,
    poll_interval: float = POLL_INTERVAL,
    on_event: Callable[[], None] | None = None,
    read_size: int = READ_SIZE,
) -> None:
    """Run ``session`` over ``stream`` until it ends; the thin asyncio adapter of the session.

    Received bytes go to ``receive_data`` (``receive_eof`` at the end of the stream); the
    session is polled whenever ``wake`` is set (set it from the replica's change listener and
    on scope changes) and every ``poll_interval`` seconds; after each call its output is
    written and drained (the session keeps at most one batch in flight, so the stream's
    buffer stays bounded). ``on_event()`` runs after every session call (the topology uses it
    to notice peer scope changes).

    Returns when the peer ended the stream cleanly (our side is then finished too). A session
    error, a stream error or cancellation aborts the stream and propagates. The session is
    always closed on the way out, so the replica accepts a new session for the peer.
    """
    if poll_interval <= 0 or read_size < 1:
        raise ValueError("poll_interval and read_size must be positive")
    kick = wake if wake is not None else asyncio.Event()

    async def flush() -> None:
        if on_event is not None:
            on_event()
        data = session.data_to_send()
        if data:
            stream.write(data)
            await stream.drain()

    async def reader() -> None:
        while session.is_live:
            data = await stream.read(read_size)
            if data:
                session.receive_data(data)
            else:
                session.receive_eof()
            await flush()

    async def ticker() -> None:
        while session.is_live:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_interval):
                    await kick.wait()
            kick.clear()
            if session.is_live:
                session.poll()
                await flush()

    tasks: list[asyncio.Task[None]] = []
    clean = False
    try:
        await flush()  # our Hello
        tasks = [asyncio.ensure_future(reader()), asyncio.ensure_future(ticker())]
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a session or stream error propagates
        clean = session.state is SessionState.CLOSED and session.error is None
    finally:
        # Nothing here may be skipped by a second cancellation: close first, await last.
        for task in tasks:
            task.cancel()
        if session.is_live:
            session.close()
        with contextlib.suppress(Exception):  # the stream may already be gone
            if clean:
                stream.write_eof()
            else:
                stream.abort(_ABORT_CODE)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


@final
@dataclass(frozen=True, slots=True)
class LinkReplicationStatus:
    """A snapshot of one live replication session of a topology.

    ``link``/``peer``/``side`` identify the link (``side``: where the peer sits);
    ``peer_site_id`` is ``None`` before the peer's Hello; ``peer_synchronized`` says the peer
    reported having nothing more to send; ``batch_in_flight`` is our unacknowledged batch.
    """

    link: LinkId
    peer: Pid
    side: LinkSide
    state: SessionState
    peer_site_id: bytes | None
    peer_scope: SiteScope | None
    local_scope: SiteScope
    peer_synchronized: bool
    batch_in_flight: int | None
    statistics: SessionStatistics


@dataclass(eq=False, slots=True)
class _Live:
    context: LinkContext
    session: ReplicaSession
    wake: asyncio.Event


@dataclass(eq=False, slots=True)
class _ChildEntry:
    peer: Pid
    task: asyncio.Task[Any] | None


@final
class ReplicationTopology:
    """Replicates ``replica`` on every adjacent link of ``node`` (see the module docstring).

    Construct it before or after the node starts (it registers the ``chrysalis.sql.v5``
    link protocol on the node at once; ``ValueError`` if that protocol is already
    registered), then run it inside the node's lifetime::

        async with node, ReplicationTopology(node, replica) as topology:
            ...

    Children are admitted only while the topology runs; register it before children join
    (a child that is refused before its first session gives the link up, per spec 4.4).
    ``retry_delay`` separates reconnect attempts of the parent-link session,
    ``handshake_timeout`` bounds the link-id/ack exchange and ``max_children`` the tracked
    child links. The replica is not closed by ``aclose``.
    """

    __slots__ = (
        "_aggregator",
        "_children",
        "_closed",
        "_errors",
        "_handshake_timeout",
        "_live",
        "_node",
        "_poll_interval",
        "_remove_listener",
        "_replica",
        "_retry_delay",
        "_sessions_started",
        "_started",
        "_tasks",
    )

    def __init__(
        self,
        node: Node,
        replica: Replica,
        *,
        retry_delay: float = DEFAULT_RETRY_DELAY,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        poll_interval: float = POLL_INTERVAL,
        max_children: int = 4096,
    ) -> None:
        if retry_delay <= 0 or handshake_timeout <= 0 or poll_interval <= 0:
            raise ValueError("retry_delay, handshake_timeout and poll_interval must be positive")
        self._node = node
        self._replica = replica
        self._retry_delay = retry_delay
        self._handshake_timeout = handshake_timeout
        self._poll_interval = poll_interval
        self._aggregator = SubtreeScopeAggregator(replica.site_id, max_children=max_children)
        self._live: dict[LinkId, _Live] = {}
        self._children: dict[LinkId, _ChildEntry] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._remove_listener: Callable[[], None] | None = None
        self._started = False
        self._closed = False
        self._sessions_started = 0
        self._errors = 0
        node.register_link_protocol(SQLITE_LINK_PROTOCOL, self._serve_child)

    # -- inspection -------------------------------------------------------------------------

    @property
    def replica(self) -> Replica:
        """The replicated database."""
        return self._replica

    @property
    def upstream_scope(self) -> SiteScope:
        """The scope advertised to the parent: own site plus every child subtree's sites."""
        return self._aggregator.upstream.scope

    @property
    def sessions_started(self) -> int:
        """Sessions started so far, on every link, restarts included."""
        return self._sessions_started

    @property
    def session_errors(self) -> int:
        """Sessions that ended with an error (logged; the link is retried as spec 4.4 says)."""
        return self._errors

    def links(self) -> tuple[LinkReplicationStatus, ...]:
        """A snapshot of every live session (parent link first, then children by link id)."""
        snapshot = [
            LinkReplicationStatus(
                link=live.context.link,
                peer=live.context.peer,
                side=live.context.side,
                state=live.session.state,
                peer_site_id=live.session.peer_site_id,
                peer_scope=live.session.peer_scope,
                local_scope=live.session.local_scope,
                peer_synchronized=live.session.peer_synchronized,
                batch_in_flight=live.session.batch_in_flight,
                statistics=live.session.statistics(),
            )
            for live in self._live.values()
        ]
        snapshot.sort(key=lambda s: (s.side is not LinkSide.PARENT, s.link.raw))
        return tuple(snapshot)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start supervising the node's links (the node must be running)."""
        if self._started or self._closed:
            raise RuntimeError("the topology was already started")
        nameserver = self._node.nameserver  # RuntimeError before the node starts
        del nameserver
        self._started = True
        self._remove_listener = self._replica.add_change_listener(self._wake_all)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch_children()))
        manager = self._node.parent_manager
        if manager is not None:
            self._tasks.append(loop.create_task(self._supervise_parent(manager)))

    async def aclose(self) -> None:
        """Stop every session and supervisor and wait for them (idempotent)."""
        self._closed = True
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        tasks = list(self._tasks)
        tasks.extend(e.task for e in self._children.values() if e.task is not None)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self._handshake_timeout)
        self._tasks.clear()

    async def __aenter__(self) -> ReplicationTopology:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- sessions ---------------------------------------------------------------------------

    def _wake_all(self) -> None:
        for live in self._live.values():
            live.wake.set()

    async def _run_session(
        self, context: LinkContext, stream: Any, publisher: SitePublisher
    ) -> bool:
        """One session on an admitted stream; returns whether it ended cleanly."""
        session = ReplicaSession(self._replica, context.peer, publisher)
        live = _Live(context, session, asyncio.Event())
        self._live[context.link] = live
        self._sessions_started += 1
        on_event = None
        if context.side is LinkSide.CHILD:
            on_event = self._child_scope_watcher(context.link, session)
        try:
            await pump_session(
                session,
                stream,
                wake=live.wake,
                poll_interval=self._poll_interval,
                on_event=on_event,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._errors += 1
            _log.warning(
                "replication session with %s (%s link) ended: %r",
                context.peer.hex(),
                context.side.value,
                exc,
            )
            return False
        finally:
            if self._live.get(context.link) is live:
                del self._live[context.link]
        return True

    def _child_scope_watcher(self, link: LinkId, session: ReplicaSession) -> Callable[[], None]:
        def changed() -> None:
            scope = session.peer_scope
            if scope is not None and self._aggregator.update_child(link, scope):
                self._wake_all()  # the parent-link session sends the new upstream scope

        return changed

    # -- parent side of our children's links ------------------------------------------------

    async def _serve_child(self, peer: Pid, stream: Any) -> None:
        """The link-protocol handler: admit a child's session stream (spec 4.4) and run it."""
        if not self._started or self._closed:
            return
        try:
            async with asyncio.timeout(self._handshake_timeout):
                raw = await stream.readexactly(LINK_ID_BYTES)
        except (TimeoutError, asyncio.IncompleteReadError):
            return
        link = LinkId(raw)
        if self._node.nameserver.child_links().get(peer) != link or link in self._children:
            return  # not the child's current link, or a session already runs on it
        entry = _ChildEntry(peer, asyncio.current_task())
        self._children[link] = entry
        try:
            stale = [e.task for k, e in self._children.items() if e.peer == peer and k != link]
            for task in stale:
                if task is not None:
                    task.cancel()
            if stale:
                await asyncio.wait([t for t in stale if t is not None])
            stream.write(bytes([SESSION_ACK]))
            self._aggregator.update_child(link, None)
            context = LinkContext(link, peer, LinkSide.CHILD)
            await self._run_session(context, stream, SitePublisher.complement(self._site))
        finally:
            if self._children.get(link) is entry:
                del self._children[link]
            if self._aggregator.remove_child(link):
                self._wake_all()

    @property
    def _site(self) -> bytes:
        return self._replica.site_id

    async def _watch_children(self) -> None:
        nameserver = self._node.nameserver
        watch = nameserver.child_links_watch
        while True:
            seen = watch.version
            current = nameserver.child_links()
            for link, entry in list(self._children.items()):
                if current.get(entry.peer) != link and entry.task is not None:
                    entry.task.cancel()  # the link is gone: its session ends with it
            await watch.wait_change(seen)

    # -- child side: our parent link --------------------------------------------------------

    async def _supervise_parent(self, manager: ParentLinkManager) -> None:
        watch = manager.status_watch
        current: tuple[LinkId, asyncio.Task[None]] | None = None
        try:
            while True:
                seen = watch.version
                status = manager.status
                link = status.link if status.kind is ParentStatusKind.CONNECTED else None
                if current is not None and current[0] != link:
                    current[1].cancel()
                    await asyncio.gather(current[1], return_exceptions=True)
                    current = None
                if link is not None and current is None:
                    assert status.peer is not None
                    assert status.address is not None
                    task = asyncio.ensure_future(
                        self._run_parent_link(status.peer, status.address, link)
                    )
                    current = (link, task)
                if status.kind in (ParentStatusKind.FAILED, ParentStatusKind.STOPPED):
                    return
                await watch.wait_change(seen)
        finally:
            if current is not None:
                current[1].cancel()
                await asyncio.gather(current[1], return_exceptions=True)

    async def _run_parent_link(self, peer: Pid, address: Any, link: LinkId) -> None:
        succeeded = False
        context = LinkContext(link, peer, LinkSide.PARENT)
        while not self._closed:
            try:
                stream = await self._node.dial_link_local(peer, address, SQLITE_LINK_PROTOCOL)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.info("dialling %s for replication failed: %r", peer.hex(), exc)
                await asyncio.sleep(self._retry_delay)
                continue
            try:
                stream.write(link.raw)
                async with asyncio.timeout(self._handshake_timeout):
                    ack = await stream.readexactly(1)
                admitted = ack == bytes([SESSION_ACK])
            except asyncio.CancelledError:
                stream.abort(_ABORT_CODE)
                raise
            except Exception:
                admitted = False
            if not admitted:
                with contextlib.suppress(Exception):
                    stream.abort(_ABORT_CODE)
                if not succeeded:
                    _log.info("%s refused chrysalis.sql.v5 on link %s", peer.hex(), link.hex())
                    return
                await asyncio.sleep(self._retry_delay)
                continue
            succeeded = True
            await self._run_session(context, stream, self._aggregator.upstream)
            await asyncio.sleep(self._retry_delay)
