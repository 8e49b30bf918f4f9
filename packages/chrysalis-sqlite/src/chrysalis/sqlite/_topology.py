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

Per-link sessions (spec 4.4) are the node's: the topology registers ``chrysalis.sql.v5`` with
``Node.register_link_session``, which runs the handshake (the child writes the 16-byte
``LinkId`` of its current nameserver link, ``chrysalis.node.LINK_ID_BYTES``; the parent admits
it only for the child's current link with no session on it and answers the version byte
``chrysalis.node.SESSION_VERSION``) and the supervision, so a replication session is always
tied to one nameserver link incarnation:

- child side (this node's parent link, ``LinkSide.PARENT``): a new link id cancels the old
  session and starts a new one; a lost link cancels it; a session that ends is reopened on the
  same link after ``retry_delay``. A parent that refuses the first handshake on a link does
  not run the protocol: the link is given up (``node.link_sessions(SQLITE_LINK_PROTOCOL)``
  keeps ``refused_links`` and a version mismatch in ``failure``).
- parent side (our children's links, ``LinkSide.CHILD``): a session is cancelled when its link
  leaves the nameserver's child-link map. A child that reconnects may be admitted on its new
  link just before the session of its old link is dropped; its new session waits for the old
  one to end (the replica runs one session per peer).

The topology adds only what is replication's: one ``ReplicaSession`` per admitted link, the
child's subtree scope while its session runs, and the start/close of the whole.

The session itself is the pure ``ReplicaSession``; ``pump_session`` is the thin asyncio pump
that moves bytes between it and a stream, wakes it on local commits (the replica's change
listener) and scope changes, and polls it every ``POLL_INTERVAL`` (commits by other processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Protocol, final

from chrysalis.core import LinkContext, LinkId, LinkSide, Pid
from chrysalis.node import DEFAULT_HANDSHAKE_TIMEOUT, LinkSessions, Node
from chrysalis.quic import ByteStream, LinkProtocolId
from chrysalis.sqlite._errors import ReplicaBusyError
from chrysalis.sqlite._protocol import PROTOCOL_ID
from chrysalis.sqlite._replica import GC_BUDGET, Replica
from chrysalis.sqlite._scope import SitePublisher, SiteScope, SubtreeScopeAggregator
from chrysalis.sqlite._session import (
    POLL_INTERVAL,
    ReplicaSession,
    SessionState,
    SessionStatistics,
)

__all__ = [
    "DEFAULT_GC_INTERVAL",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_RETRY_DELAY",
    "READ_SIZE",
    "SQLITE_LINK_PROTOCOL",
    "LinkReplicationStatus",
    "ReplicaStream",
    "ReplicationTopology",
    "pump_session",
    "run_collector",
]

_log = logging.getLogger("chrysalis.sqlite")

SQLITE_LINK_PROTOCOL: Final = LinkProtocolId(PROTOCOL_ID)
"""The link-local protocol selector ``chrysalis.sql.v5`` (16 ASCII bytes)."""
DEFAULT_RETRY_DELAY: Final = 1.0
"""Seconds between a parent-link session's end (or a failed dial) and the next attempt."""
READ_SIZE: Final = 256 * 1024
"""Most bytes one stream read hands to the session."""
_ABORT_CODE: Final = 0x3
DEFAULT_GC_INTERVAL: Final = 10.0
"""Seconds between the garbage collector's bounded passes (``run_collector``)."""


async def run_collector(
    replica: Replica,
    *,
    retention: float,
    interval: float = DEFAULT_GC_INTERVAL,
    budget: int = GC_BUDGET,
    clock: Callable[[], float] = time.time,
) -> None:
    """Run ``replica.collect_garbage`` until cancelled (or the replica closes): one bounded
    pass (``budget`` keys) every ``interval`` seconds, back to back (yielding in between)
    while a scan has not reached the end of the version rows. ``clock`` supplies the wall
    time the replica's horizon marks record (it must survive restarts: ``time.time``).

    Why here and not in the session: the replication core is sans-IO and takes the time as
    an argument; the adapter owns the clock. A pass that finds the replica busy (an
    application transaction open) or its file locked by another process is skipped."""
    if not math.isfinite(retention) or retention < 0:
        raise ValueError("retention must be finite and not negative")
    if not math.isfinite(interval) or interval <= 0:
        raise ValueError("interval must be positive")
    delay = interval
    while True:
        await asyncio.sleep(delay)
        if replica.closed:
            return
        delay = interval
        try:
            result = replica.collect_garbage(now=clock(), retention=retention, budget=budget)
        except ReplicaBusyError:
            continue
        except sqlite3.OperationalError as exc:  # the file locked by another process
            _log.debug("garbage collection skipped: %s", exc)
            continue
        if not result.wrapped:
            delay = 0.0


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
    ended: asyncio.Event


@final
class ReplicationTopology:
    """Replicates ``replica`` on every adjacent link of ``node`` (see the module docstring).

    Construct it before or after the node starts (it registers the ``chrysalis.sql.v5``
    link protocol on the node at once; ``ValueError`` if that protocol is already
    registered), then run it inside the node's lifetime::

        async with node, ReplicationTopology(node, replica) as topology:
            ...

    The node admits and supervises the sessions (``Node.register_link_session``); they
    replicate only while the topology runs (one the node opens earlier waits for ``start``).
    Construct it before children join: a child that is refused before its first session gives
    the link up (spec 4.4). ``retry_delay`` separates the node's reopening of a link's session,
    ``handshake_timeout`` bounds the link-id/version exchange and ``max_children`` the tracked
    child links. The replica is not closed by ``aclose``.
    ``gc_retention`` (seconds, ``None``: off) runs ``run_collector`` while the topology runs:
    a bounded garbage-collection pass every ``gc_interval`` seconds (see
    ``Replica.collect_garbage``).
    """

    __slots__ = (
        "_aggregator",
        "_closed",
        "_collector",
        "_errors",
        "_gc_interval",
        "_gc_retention",
        "_handshake_timeout",
        "_live",
        "_node",
        "_poll_interval",
        "_pumps",
        "_remove_listener",
        "_replica",
        "_running",
        "_sessions_started",
        "_started",
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
        gc_retention: float | None = None,
        gc_interval: float = DEFAULT_GC_INTERVAL,
    ) -> None:
        if retry_delay <= 0 or handshake_timeout <= 0 or poll_interval <= 0:
            raise ValueError("retry_delay, handshake_timeout and poll_interval must be positive")
        if gc_retention is not None and (not math.isfinite(gc_retention) or gc_retention < 0):
            raise ValueError("gc_retention must be finite and not negative")
        if not math.isfinite(gc_interval) or gc_interval <= 0:
            raise ValueError("gc_interval must be positive")
        self._gc_retention = gc_retention
        self._gc_interval = gc_interval
        self._collector: asyncio.Task[None] | None = None
        self._node = node
        self._replica = replica
        self._handshake_timeout = handshake_timeout
        self._poll_interval = poll_interval
        self._aggregator = SubtreeScopeAggregator(replica.site_id, max_children=max_children)
        self._live: dict[LinkId, _Live] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self._running = asyncio.Event()
        self._remove_listener: Callable[[], None] | None = None
        self._started = False
        self._closed = False
        self._sessions_started = 0
        self._errors = 0
        node.register_link_session(
            SQLITE_LINK_PROTOCOL,
            self._session,
            retry_delay=retry_delay,
            handshake_timeout=handshake_timeout,
        )

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
    def link_sessions(self) -> LinkSessions:
        """The node's sessions of ``chrysalis.sql.v5``: handshake refusals (``refused_links``)
        and a version mismatch (``failure``) are reported there."""
        return self._node.link_sessions(SQLITE_LINK_PROTOCOL)

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
        """Start running the node's link sessions (the node must be running)."""
        if self._started or self._closed:
            raise RuntimeError("the topology was already started")
        nameserver = self._node.nameserver  # RuntimeError before the node starts
        del nameserver
        self._started = True
        self._remove_listener = self._replica.add_change_listener(self._wake_all)
        if self._gc_retention is not None:
            self._collector = asyncio.create_task(
                run_collector(
                    self._replica, retention=self._gc_retention, interval=self._gc_interval
                )
            )
        self._running.set()

    async def aclose(self) -> None:
        """Stop every session and wait for them (idempotent). The node keeps its links: a
        session the node opens afterwards is ended at once (and retried by the node)."""
        self._closed = True
        self._running.set()  # sessions still waiting for the start end instead
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        tasks = list(self._pumps)
        if self._collector is not None:
            tasks.append(self._collector)
            self._collector = None
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self._handshake_timeout)

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

    async def _session(self, context: LinkContext, stream: ByteStream) -> None:
        """The node's per-link session handler (spec 4.4, ``Node.register_link_session``).

        The node has already admitted the link (link id and version byte), cancels this call
        when the link ends and reopens the session after ``retry_delay`` when it returns. The
        replication itself runs in a task of its own, so that ``aclose`` can stop it without
        cancelling the node's supervisor of the parent link (which calls this directly): a
        session stopped that way returns normally. Sessions the node opens before ``start``
        wait for it; after ``aclose`` they end at once.
        """
        await self._running.wait()
        if self._closed:
            with contextlib.suppress(Exception):  # the stream may already be gone
                stream.abort(_ABORT_CODE)
            return
        pump = asyncio.ensure_future(self._run_link(context, stream))
        self._pumps.add(pump)
        try:
            await asyncio.wait([pump])
        finally:
            # Cancelled by the node (link gone, node stopping): stop the pump and join it.
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            self._pumps.discard(pump)

    async def _run_link(self, context: LinkContext, stream: ByteStream) -> None:
        if context.side is LinkSide.PARENT:
            await self._run_session(context, stream, self._aggregator.upstream)
            return
        # A child that reconnected can be admitted on its new link before the node has
        # cancelled the session of its old one (the node drops a stale session when its
        # link leaves the child-link map); the replica allows one session per peer, so wait
        # for the stale one to end.
        stale = [
            live.ended
            for live in self._live.values()
            if live.context.peer == context.peer and live.context.link != context.link
        ]
        if stale:
            try:
                async with asyncio.timeout(self._handshake_timeout):
                    await asyncio.gather(*(event.wait() for event in stale))
            except TimeoutError:
                self._errors += 1
                _log.warning("a stale session with %s did not end", context.peer.hex())
                with contextlib.suppress(Exception):
                    stream.abort(_ABORT_CODE)
                return
        self._aggregator.update_child(context.link, None)
        try:
            await self._run_session(context, stream, SitePublisher.complement(self._site))
        finally:
            if self._aggregator.remove_child(context.link):
                self._wake_all()

    async def _run_session(
        self, context: LinkContext, stream: ByteStream, publisher: SitePublisher
    ) -> bool:
        """One session on an admitted stream; returns whether it ended cleanly."""
        session = ReplicaSession(self._replica, context.peer, publisher)
        live = _Live(context, session, asyncio.Event(), asyncio.Event())
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
                "replication session with %s (%s link) ended: %s: %s",
                context.peer.hex(),
                context.side.value,
                type(exc).__name__,
                exc,
            )
            return False
        finally:
            if self._live.get(context.link) is live:
                del self._live[context.link]
            live.ended.set()
        return True

    def _child_scope_watcher(self, link: LinkId, session: ReplicaSession) -> Callable[[], None]:
        def changed() -> None:
            scope = session.peer_scope
            if scope is not None and self._aggregator.update_child(link, scope):
                self._wake_all()  # the parent-link session sends the new upstream scope

        return changed

    @property
    def _site(self) -> bytes:
        return self._replica.site_id
