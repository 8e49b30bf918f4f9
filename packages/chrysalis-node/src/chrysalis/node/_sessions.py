"""Per-link sessions of link-local protocols (upper spec 4.4), on asyncio or trio.

Why: a protocol that runs along the tree (replication, for instance) wants one session per
parent<->child nameserver link, tied to that link's incarnation, not one handler call per
stream. ``LinkSessions`` is the reference's ``LinkProtocolManager`` for one protocol:

Wire (after the mux's 16-byte protocol selector): the *child* writes the 16-byte ``LinkId`` of
its current nameserver link; the *parent* admits the stream only if its nameserver maps (child
PID -> that link) and no session runs on that link, and then writes one byte,
``SESSION_VERSION`` (1, the reference's ``SESSION_ACK``); otherwise it closes the stream
without a byte. The byte doubles as the handshake version: a child that reads another value
stops with ``LinkSessionVersionError`` (stored in ``failure`` and logged) instead of running a
protocol it cannot speak.

Supervision:

- child side: the parent manager's status is watched. ``CONNECTED`` with a new link id
  cancels the old session and starts a new one; a lost link cancels it. If the handshake fails
  before the first success on a link, the parent does not run the protocol and the link is
  given up (``refused_links``); after a success, a session that ends is reopened on the same
  link after ``retry_delay``.
- parent side: a session whose link leaves the nameserver's child-link map is cancelled.

The pure parts (``decode_ack``) carry the decisions; the rest only moves bytes and tasks.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Final, final

from chrysalis.core import DatagramAddr, LinkContext, LinkId, LinkSide, Pid
from chrysalis.core.runtime import (
    Spawner,
    Task,
    fail_after,
    join_shielded,
    race,
    sleep,
)
from chrysalis.nameserver import (
    NameserverError,
    NameserverService,
    ParentLinkManager,
    ParentStatusKind,
)
from chrysalis.quic import ByteStream, LinkProtocolId

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "LINK_ID_BYTES",
    "SESSION_VERSION",
    "LinkSessionError",
    "LinkSessionHandler",
    "LinkSessionVersionError",
    "LinkSessions",
    "decode_ack",
]

_log = logging.getLogger("chrysalis.node")

SESSION_VERSION: Final = 1
"""The byte a parent writes to admit a session: the handshake version (the reference's
``SESSION_ACK``)."""
LINK_ID_BYTES: Final = 16
"""Bytes of the link id the child writes after the protocol selector."""
DEFAULT_HANDSHAKE_TIMEOUT: Final = 10.0
"""Seconds the link-id / version exchange may take."""
_ABORT_CODE: Final = 0x3

LinkSessionHandler = Callable[[LinkContext, ByteStream], Awaitable[object]]
"""``await handler(context, stream)``: one session of a link protocol on one link."""
Dialer = Callable[[Pid, DatagramAddr, LinkProtocolId], Awaitable[ByteStream]]
"""``await dial(parent_pid, parent_address, protocol_id)``: a link-local stream."""


class LinkSessionError(NameserverError):
    """A link-protocol session could not be set up."""


class LinkSessionVersionError(LinkSessionError):
    """The parent answered the session handshake with a version this node does not speak."""

    def __init__(self, protocol: LinkProtocolId, peer: Pid, version: int) -> None:
        super().__init__(
            f"link protocol {protocol} on parent {peer.hex()}: session handshake version "
            f"{version}, this node speaks {SESSION_VERSION}"
        )
        self.version = version


def decode_ack(data: bytes) -> int | None:
    """The handshake version in the parent's answer; ``None`` when it refused (no byte)."""
    if not data:
        return None
    return data[0]


async def _read_exactly(stream: ByteStream, count: int) -> bytes:
    """``count`` bytes from a ``ByteStream``, or fewer at its end."""
    data = b""
    while len(data) < count:
        chunk = await stream.read(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _abort(stream: ByteStream) -> None:
    with contextlib.suppress(Exception):  # nothing more to do with a dead session stream
        stream.abort(_ABORT_CODE)


@final
class LinkSessions:
    """The per-link sessions of one link-local protocol on one node (module docstring).

    Built by ``Node.register_link_session`` and bound to the node's tasks and dialer at
    startup (``start``); ``serve_child`` is the transport handler for the protocol's incoming
    streams and ``supervise_parent`` runs while the node has a parent.
    """

    __slots__ = (
        "_active",
        "_dial",
        "_handler",
        "_retry_delay",
        "_spawner",
        "_timeout",
        "failure",
        "protocol_id",
        "refused_links",
        "sessions_started",
    )

    def __init__(
        self,
        protocol_id: LinkProtocolId,
        handler: LinkSessionHandler,
        *,
        retry_delay: float,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
    ) -> None:
        if retry_delay <= 0 or handshake_timeout <= 0:
            raise ValueError("retry_delay and handshake_timeout must be positive")
        self.protocol_id = protocol_id
        self._handler = handler
        self._dial: Dialer | None = None
        self._spawner: Spawner | None = None
        self._retry_delay = retry_delay
        self._timeout = handshake_timeout
        self._active: set[LinkId] = set()
        self.failure: LinkSessionError | None = None
        self.refused_links: set[LinkId] = set()
        self.sessions_started = 0

    def start(self, spawner: Spawner, dial: Dialer) -> None:
        """Bind to the node's task spawner and link-local dialer."""
        self._spawner = spawner
        self._dial = dial

    @property
    def active_links(self) -> frozenset[LinkId]:
        """Links with a running session on this node's parent side."""
        return frozenset(self._active)

    # -- parent side (our children's links) -------------------------------------------------

    async def serve_child(self, service: NameserverService, peer: Pid, stream: ByteStream) -> None:
        """Admit a child's session stream (link id check, version byte) and run it until its
        link leaves the child-link map."""
        spawner = self._spawner
        if spawner is None:
            return
        try:
            raw = await fail_after(self._timeout, lambda: _read_exactly(stream, LINK_ID_BYTES))
        except Exception:  # a slow, short or broken stream is refused: it closes unanswered
            return
        if len(raw) != LINK_ID_BYTES:
            return
        link = LinkId(raw)
        if service.child_links().get(peer) != link or link in self._active:
            return  # not the child's current link, or a session already runs on it
        self._active.add(link)
        try:
            stream.write(bytes([SESSION_VERSION]))
            self.sessions_started += 1
            context = LinkContext(link, peer, LinkSide.CHILD)
            await race(
                spawner,
                lambda: self._handler(context, stream),
                lambda: _wait_link_gone(service, peer, link),
            )
        finally:
            self._active.discard(link)

    # -- child side (our parent link) -------------------------------------------------------

    async def supervise_parent(self, manager: ParentLinkManager) -> None:
        """Follow the parent manager: one session task per connected link id."""
        spawner = self._spawner
        assert spawner is not None, "start() the sessions first"
        watch = manager.status_watch
        current: tuple[LinkId, Task] | None = None
        try:
            while True:
                seen = watch.version
                status = manager.status
                link = status.link if status.kind is ParentStatusKind.CONNECTED else None
                if current is not None and current[0] != link:
                    current[1].cancel()
                    await join_shielded([current[1]])
                    current = None
                if link is not None and current is None:
                    assert status.peer is not None
                    assert status.address is not None
                    task = spawner.spawn(self._run_parent, status.peer, status.address, link)
                    current = (link, task)
                if status.kind in (ParentStatusKind.FAILED, ParentStatusKind.STOPPED):
                    return
                await watch.wait_change(seen)
        finally:
            if current is not None:
                current[1].cancel()
                await join_shielded([current[1]])

    async def _run_parent(self, peer: Pid, address: DatagramAddr, link: LinkId) -> None:
        dial = self._dial
        assert dial is not None
        succeeded = False
        context = LinkContext(link, peer, LinkSide.PARENT)
        while True:
            try:
                stream = await dial(peer, address, self.protocol_id)
            except Exception as exc:
                _log.info("dialling %s for %s failed: %r", peer.hex(), self.protocol_id, exc)
                await sleep(self._retry_delay)
                continue
            try:
                stream.write(link.raw)
                ack = await fail_after(self._timeout, partial(_read_exactly, stream, 1))
            except Exception:
                ack = b""
            except BaseException:
                _abort(stream)
                raise
            version = decode_ack(ack)
            if version != SESSION_VERSION:
                _abort(stream)
                if version is not None:
                    self.failure = LinkSessionVersionError(self.protocol_id, peer, version)
                    _log.error("%s", self.failure)
                    return
                if not succeeded:
                    _log.info("%s refused %s on link %s", peer.hex(), self.protocol_id, link)
                    self.refused_links.add(link)
                    return
                await sleep(self._retry_delay)
                continue
            succeeded = True
            self.sessions_started += 1
            try:
                await self._handler(context, stream)
            except Exception:
                _log.exception("link session %s on %s failed", self.protocol_id, link)
                _abort(stream)
            else:
                with contextlib.suppress(Exception):  # the peer may have gone already
                    stream.close()
            await sleep(self._retry_delay)


async def _wait_link_gone(service: NameserverService, peer: Pid, link: LinkId) -> None:
    watch = service.child_links_watch
    while True:
        seen = watch.version
        if service.child_links().get(peer) != link:
            return
        await watch.wait_change(seen)


# Documented at ``chrysalis.node`` (which imports them on first use): named there, whichever
# module a process imported them from first.
for _public in (LinkSessionError, LinkSessions, LinkSessionVersionError):
    _public.__module__ = "chrysalis.node"
del _public
