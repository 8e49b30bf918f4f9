"""``NodeProcessTransport``: the ``ProcessTransport`` seam over a Chrysalis ``Node``.

Why this shape: every Monarch process is one Chrysalis Node, so an actor process's identity is
its Node's PID and "send an envelope to (PID, actor path)" becomes "write a frame on a stream
to PID". Streams are long-lived and one-directional in use: the first envelope from process A
to process B dials B (``Node.dial``: resolve, then an authenticated QUIC stream through the
tree's gateways) and every later A-to-B envelope follows on the same stream, so per-sender
order is the stream's order. Between a parent and its child (a client and the workers it
spawned) the stream opens instead on the link connection the child's join already
authenticated (link protocol ``LINK_PROTOCOL``, ``QuicTransport.dial_link_pooled``) whenever
lanes are on, so that neither side pays a QUIC handshake of its own: the stream then carries
only the lane's negotiation and the envelopes before the ``Switch``. Under ``force_quic``
(everything on QUIC) each pair keeps a connection of its own, apart from the link.
B reads envelopes only from streams it *accepted*, so the
authenticated peer PID of a stream is the PID every envelope on it must name as its sender
(an envelope that claims another sender ends that stream with ``FrameError``). Each stream
starts with an 8-byte magic so a stray stream from another protocol is refused at once.

Threads: ``send`` runs on any thread. It checks the bounds, copies the out-of-band buffers
once (they may alias the caller's memory only until ``send`` returns), encodes the frame and
hands it to the runtime loop with ``call_soon`` (FIFO per calling thread). Everything else,
the per-peer queues, the writer task per peer, the accept loop and the reader task per
inbound stream, lives on that loop, which is also the Node's loop and the loop on which the
``deliver`` and ``undeliverable`` callbacks run.

Bounds: queued bytes (all peers together) and queued frames are bounded in ``send``
(``NodeTransportSettings``; a frame over the bound is bounced to the sender as undeliverable,
never dropped silently); inbound frames are bounded by ``FrameDecoder`` (``FrameLimits``);
peers, inbound streams and remembered outstanding calls per peer are bounded too.

Failure: a peer that cannot be dialled within ``dial_timeout`` (unknown PID, no route, dead
process), or whose stream breaks, makes every envelope queued for it, and every call still
waiting for its reply from it, bounce to ``undeliverable`` with the reason. The runtime turns
those bounces into ``SupervisionError`` for callers. ``mark_unreachable(pid, reason)`` (used
by the process layer when it learns a process died) does the same at once and makes every
later envelope to that PID bounce immediately. With ``fence=True`` (a process declared dead for
not answering heartbeats, which may still run) envelopes that still arrive from it, on a stream
or lane that is still open, are refused too: counted in ``statistics().refused``, never
delivered. (An exited process is not fenced: what it sent before its exit is still delivered.)

Direct lanes (``lane``, ``lane_proto``): when the transport has its process's identity, each
outbound stream starts with a ``Hello`` and the receiver answers with an ``Offer`` on the
stream's reverse direction; once the offered lane (Unix socket on one host, TLS over TCP across
hosts) is authenticated, the writer puts a ``Switch`` marker on the stream after the last
envelope it wrote there and sends every later envelope on the lane. The receiver starts reading
the lane only when its stream reader reached the marker, so per-sender order holds across the
change of path. An accepted lane waits for its ``Switch`` as long as the stream that offered it
is read (one offer per stream; a ``Switch`` naming another stream's token is refused), also
while this transport shuts down: its streams are still read then, so a ``Switch`` already on its
way finds its lane and nothing sent after it is lost. After the switch the (now idle) stream
may end without consequence; the lane's end is what fails the peer then, exactly as a broken
stream does. ``force_quic`` (setting ``MONARCH_FORCE_QUIC``) keeps everything on the QUIC
path. On a Unix lane, buffers of at least ``LaneSettings.shm_threshold`` bytes travel as memfd
slots (``shm``): the sender copies them once, straight from the caller's memory into a pooled
memfd slot, and the receiver copies a ``bytes`` out once or rebuilds an array or tensor over a
private mapping of the slot (no copy). A ``bytes`` is lent instead where the receiver can read
this process (``shm.ShmPool.lend``; negotiated: the ``Hello`` names ``FEATURE_LEND`` where
lending is on here): no copy here, one read into the receiver's ``bytes`` there.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import msgspec

from chrysalis.core import Pid
from monarch.actor._base.codec import ReceivedBuffer, detach_buffers
from monarch.actor._base.envelope import (
    FRAME_PREFIX,
    Envelope,
    FrameDecoder,
    FrameLimits,
    MessageKind,
    check_size,
    encode_frame,
)
from monarch.actor._base.errors import FrameError
from monarch.actor._base.loop import (
    RuntimeLoop,
    RuntimeLoopClosedError,
    RuntimeLoopOverloadedError,
)
from monarch.actor._transport import shm as _shm
from monarch.actor._transport.lane import ZERO_SHM_HEAD, Lane, LaneManager, LaneSettings, UnixLane
from monarch.actor._transport.lane_proto import (
    ControlSplitter,
    Hello,
    Offer,
    Switch,
    encode_control,
    lane_prefix,
    lent_prefix,
)
from monarch.actor._transport.seam import DeliverCallback, UndeliverableCallback
from monarch.config import _registry as _config
from monarch.config._registry import ChannelTransport

__all__ = [
    "STREAM_MAGIC",
    "LaneSettings",
    "NodeProcessTransport",
    "NodeTransportSettings",
    "NodeTransportStatistics",
]

#: First bytes of every envelope stream (protocol name and version).
STREAM_MAGIC: Final = b"MONARCH1"
#: The link protocol (16 bytes) of envelope streams opened on an adjacent node's link-local
#: connection (a parent's or a child's, already authenticated): no handshake of their own.
LINK_PROTOCOL: Final = b"monarch.envelope"
_WRITE_CHUNK: Final = 256 * 1024
_TRACKED_KINDS: Final = frozenset(
    {MessageKind.CALL, MessageKind.SPAWN, MessageKind.STOP, MessageKind.STOP_PROC}
)
_PREFIX_BYTES: Final = FRAME_PREFIX.size
_KEEP_PAYLOAD: Final = 256
#: A header-only frame up to this size goes on a lane as one piece (lane head, prefix and
#: header joined: a copy of at most this much, against two more entries in the lane's queue
#: and two more iovecs in its ``sendmsg``, which carries at most 1,024).
_JOIN_MAX: Final = 4096


def _lane_pieces(pieces: list[Any]) -> list[Any]:
    """The lane frame for ``encode_frame``'s ``pieces`` (no shared-memory slots)."""
    if len(pieces) == 2:
        prefix, header = pieces
        if type(header) is bytes and len(header) <= _JOIN_MAX:
            return [ZERO_SHM_HEAD + prefix + header]
    return [ZERO_SHM_HEAD, *pieces]


_REPLY_KINDS: Final = frozenset({MessageKind.PORT_VALUE, MessageKind.PORT_ERROR})
_log = logging.getLogger("monarch.actor.transport")
_HEADER_ENCODER = msgspec.msgpack.Encoder()
_TCP_TRANSPORTS: Final = (ChannelTransport.TcpWithHostname, ChannelTransport.TcpWithLocalhost)
_UDP_HOST = re.compile(r"^udp://\[?([0-9a-fA-F.:]+)\]?:\d+$")


def _tcp_host(node: Any) -> str | None:
    """The address a TCP lane listener should bind and offer: the node's own UDP address,
    unless it is a wildcard or loopback (processes that share a loopback share a host, and
    reach each other over Unix lanes)."""
    match = _UDP_HOST.match(str(getattr(node, "local_addr", "")))
    if match is None:
        return None
    host = match.group(1)
    if host in ("0.0.0.0", "::") or host.startswith("127.") or host == "::1":
        return None
    return host


def default_lane_settings(node: Any) -> LaneSettings:
    """The lanes the ``default_transport`` setting asks for (``enable_transport``): a TCP
    transport makes every lane TLS over TCP, between processes of one host too (over loopback
    when the node has no routable address); otherwise Unix lanes within a host, TCP across."""
    host = _tcp_host(node)
    if _config.get("default_transport") in _TCP_TRANSPORTS:
        return LaneSettings(kinds=("tcp",), tcp_host=host or "127.0.0.1", force_tcp=True)
    return LaneSettings(tcp_host=host, lend=bool(_config.get("lane_lend_bytes")))


@dataclass(frozen=True, slots=True)
class NodeTransportSettings:
    """Bounds and timeouts of a ``NodeProcessTransport``.

    Attributes:
        dial_timeout: seconds to resolve and dial a peer before its envelopes bounce.
        max_queued_bytes: encoded bytes waiting to be written, all peers together (a single
            frame larger than this is still accepted when nothing else is queued).
        max_queued_frames: frames waiting to be written, all peers together.
        max_peers: peers with an outbound stream or queue.
        max_inbound_streams: accepted streams read at the same time.
        max_outstanding: calls per peer remembered until their reply arrives (the oldest are
            forgotten: they can then no longer be failed when the peer dies).
        read_chunk: bytes asked for per stream read.
        flush_timeout: seconds ``aclose`` waits for queued frames to be written.
        lane_grace: seconds between a lane's end and failing its peer, so that the process
            layer, which learns of a process's death at the same moment, can name the cause
            (``mark_unreachable``: "killed by SIGKILL") before a vaguer "closed its lane".
    """

    dial_timeout: float = 10.0
    max_queued_bytes: int = 256 * 1024 * 1024
    max_queued_frames: int = 100_000
    max_peers: int = 4096
    max_inbound_streams: int = 4096
    max_outstanding: int = 65_536
    read_chunk: int = 256 * 1024
    flush_timeout: float = 5.0
    lane_grace: float = 0.2

    def __post_init__(self) -> None:
        if (
            min(self.dial_timeout, self.flush_timeout) <= 0
            or self.lane_grace < 0
            or min(
                self.max_queued_bytes,
                self.max_queued_frames,
                self.max_peers,
                self.max_inbound_streams,
                self.max_outstanding,
                self.read_chunk,
            )
            < 1
        ):
            raise ValueError(f"invalid node transport settings {self!r}")


@dataclass(frozen=True, slots=True)
class NodeTransportStatistics:
    """A snapshot: peers with outbound state, inbound streams, queued frames and bytes,
    envelopes bounced so far, PIDs marked unreachable, outbound and inbound lanes in use, and
    envelopes refused because their sender was fenced."""

    peers: int
    inbound_streams: int
    queued_frames: int
    queued_bytes: int
    bounced: int
    unreachable: int
    outbound_lanes: int = 0
    inbound_lanes: int = 0
    refused: int = 0


_OutstandingKey = tuple[bytes, int, int]


@dataclass(slots=True)
class _Shared:
    """A frame whose large buffers were put in ``lane``'s shared-memory slots: ``slots`` pairs
    each such buffer's index with its slot, ``fds`` holds the descriptors to pass (taken by the
    writer), ``inline`` the other buffers (``None`` at shared positions). A frame whose buffers
    were lent instead (``shm.ShmPool.lend``) has no descriptors: ``lent`` holds those buffers,
    in the order of ``slots``, until the writer takes the frame."""

    lane: Lane
    slots: list[tuple[int, int]]
    fds: list[int]
    inline: list[ReceivedBuffer | None]
    lent: list[memoryview] | None = None

    def take(self) -> list[int]:
        """The frame leaves on ``lane`` now: the descriptors to pass (the writer owns them);
        the slots are the receiver's to acknowledge from here on."""
        fds, self.fds = self.fds, []
        self.lent = None
        return fds

    def close(self) -> None:
        """The frame will not leave with its descriptors: free the slots (the receiver will
        never acknowledge them) and close the descriptors."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.fds or self.lent is not None:
            for _index, slot in self.slots:
                self.lane.pool.release(slot)
        self.fds = []
        self.lent = None


_Queued = tuple[Envelope, list[Any], int, _Shared | None]
#: A frame made by ``_prepare``: its peer and lane (as found), lane pieces and shared slots.
_Frame = tuple["_Peer | None", "Lane | None", list[Any], _Shared | None]


class _Peer:
    """Outbound state for one destination PID (runtime loop thread only)."""

    __slots__ = (
        "failing",
        "lane",
        "negotiation",
        "nonce",
        "outstanding",
        "pending_lane",
        "pid",
        "queue",
        "stream",
        "task",
        "watch",
    )

    def __init__(self, pid: Pid) -> None:
        self.pid = pid
        self.queue: collections.deque[_Queued] = collections.deque()
        self.stream: Any = None
        self.task: asyncio.Task[None] | None = None
        self.watch: asyncio.Task[None] | None = None
        self.outstanding: collections.OrderedDict[_OutstandingKey, Envelope] = (
            collections.OrderedDict()
        )
        self.lane: Lane | None = None
        self.pending_lane: tuple[Lane, bytes] | None = None
        self.nonce = b""
        self.negotiation: asyncio.Task[None] | None = None
        self.failing: str | None = None


def _stripped(envelope: Envelope) -> Envelope:
    """The envelope without its payload (what a bounce needs)."""
    return Envelope(
        envelope.kind,
        envelope.sender,
        envelope.target,
        envelope.port,
        envelope.endpoint,
        envelope.sequence,
        envelope.reply_port,
        envelope.cast,
        b"",
        (),
        b"",
        envelope.flags,
    )


def _ignore_envelope(envelope: Envelope, *_: object) -> None:
    _log.debug("envelope %s dropped: the transport is not attached", envelope.kind.name)


class NodeProcessTransport:
    """One process's attachment to the Chrysalis mesh through its ``Node`` (module docstring).

    ``node`` must run on ``loop``'s event loop. ``deliver(envelope, buffers)`` receives every
    envelope addressed to a PID this transport hosts (by default only the node's PID; see
    ``hosts``) and ``undeliverable(envelope, reason)`` every envelope that bounced; both run on
    the loop. Call ``start()`` on the loop before use, ``close()`` (any thread) or
    ``await aclose()`` to stop. With ``identity`` (the node's ``chrysalis.quic.Identity``) the
    transport negotiates direct lanes (``lanes`` bounds them); without it, or with the
    ``force_quic`` setting, every envelope stays on the QUIC path.
    """

    def __init__(
        self,
        node: Any,
        loop: RuntimeLoop,
        *,
        deliver: DeliverCallback | None = None,
        undeliverable: UndeliverableCallback | None = None,
        limits: FrameLimits | Callable[[], FrameLimits] | None = None,
        settings: NodeTransportSettings | None = None,
        hosts: Callable[[bytes], bool] | None = None,
        identity: Any = None,
        lanes: LaneSettings | None = None,
    ) -> None:
        self._node = node
        self._pid: Pid = node.pid
        self._pid_raw = self._pid.raw  # compared with every envelope's target (no call)
        self._loop = loop
        self._deliver: DeliverCallback = deliver or _ignore_envelope
        self._undeliverable: UndeliverableCallback = undeliverable or _ignore_envelope
        self._limits = limits or FrameLimits()
        self._settings = settings or NodeTransportSettings()
        self._hosts = hosts
        self._peers: dict[bytes, _Peer] = {}
        self._inbound: set[asyncio.Task[None]] = set()
        self._accept_task: asyncio.Task[None] | None = None
        self._link_accept_task: asyncio.Task[None] | None = None
        self._link_protocol: Any = None  # the node transport's ``LinkProtocol``, once started
        self._link_transport: Any = None  # the node's ``QuicTransport``, where it serves it
        self._unreachable: dict[bytes, str] = {}
        self._fenced: dict[bytes, str] = {}  # declared dead while perhaps alive: refuse its input
        self._lock = threading.Lock()
        self._queued_bytes = 0
        self._queued_frames = 0
        self._bounced = 0
        self._refused = 0
        self._closed = False
        self._shut = False
        self._closed_event = threading.Event()
        self._identity = identity
        self._lane_settings = lanes or default_lane_settings(node)
        self._lanes: LaneManager | None = None
        # Inbound lanes whose handshake succeeded, held until their ``Switch`` (oldest first).
        self._accepted: collections.OrderedDict[bytes, Lane] = collections.OrderedDict()
        # Tokens offered on inbound streams that are still read and have not switched yet: an
        # accepted lane lives as long as the stream that offered it, not by a clock.
        self._offered: set[bytes] = set()
        self._finished = False  # the inbound streams are no longer read
        self._inbound_lanes: set[Lane] = set()
        self._outbox: collections.deque[_Queued] = collections.deque()
        # Guards the outbox, and orders the direct lane path against the loop's own writes.
        self._outbox_lock = threading.RLock()
        self._outbox_scheduled = False
        self._draining = False
        self._corked: list[UnixLane] | None = None  # lanes corked while the outbox drains

    # -- seam ---------------------------------------------------------------------------------
    @property
    def pid(self) -> Pid:
        """This process's PID (the node's)."""
        return self._pid

    @property
    def closed(self) -> bool:
        """True once ``close``/``aclose`` was called."""
        return self._closed

    @property
    def limits(self) -> FrameLimits:
        """Bounds of one frame (asked again each time when given as a callable)."""
        return self._limits if isinstance(self._limits, FrameLimits) else self._limits()

    def attach(
        self,
        loop: RuntimeLoop,
        deliver: DeliverCallback,
        undeliverable: UndeliverableCallback,
        pid: Pid | None = None,
    ) -> NodeProcessTransport:
        """Install the runtime's callbacks and return ``self`` (the fabric-style ``attach``
        that ``ProcRuntime`` uses). ``ValueError`` for another loop or another PID."""
        if loop is not self._loop or (pid is not None and pid != self._pid):
            raise ValueError("a NodeProcessTransport serves its node's PID on its own loop")
        self._deliver = deliver
        self._undeliverable = undeliverable
        return self

    def start(self) -> None:
        """Start accepting streams (call on the loop thread, once the node runs)."""
        if self._accept_task is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._accept_task = loop.create_task(self._accept_loop(self._node.accept))
            self._link_protocol = self._register_link_protocol()
            if self._link_protocol is not None:
                self._link_accept_task = loop.create_task(
                    self._accept_loop(self._link_protocol.accept)
                )
            if self._identity is not None and self._lane_settings.kinds:
                self._lanes = LaneManager(
                    self._identity, self._lane_settings, lambda: self.limits, self._on_accepted
                )
                if self._lane_settings.tcp_host is not None:
                    task = loop.create_task(self._lanes.start_tcp())
                    task.add_done_callback(_log_failure)

    def _register_link_protocol(self) -> Any:
        """Accept envelope streams on adjacent nodes' link-local connections too (a node
        without a QUIC transport, as in tests, has none)."""
        try:
            transport = self._node.transport
            register = transport.register_link_protocol
            protocol = register(LINK_PROTOCOL, queue_capacity=self._settings.max_inbound_streams)
        except Exception as exc:  # no such transport, or another one on this node serves it
            _log.info("envelope streams on link connections not accepted: %r", exc)
            return None
        self._link_transport = transport
        return protocol

    async def _dial(self, pid: Pid) -> Any:
        """A new stream to ``pid``: on the link-local connection of an adjacent node (a
        parent or child: it is authenticated and up, so no handshake is needed) when lanes
        will carry the traffic, otherwise ``Node.dial`` (resolve, connect)."""
        if self._lanes is not None and not self._lanes_forced_off():
            # Only lanes' negotiation and the envelopes before the ``Switch`` use the stream,
            # so the link's connection (the nameserver's too) never carries the bulk of it.
            link = self._link_transport
            if link is not None:
                stream = await link.dial_link_pooled(pid, LINK_PROTOCOL)
                if stream is not None:
                    return stream
        return await self._node.dial(pid)

    @staticmethod
    def _lanes_forced_off() -> bool:
        return bool(_config.get("force_quic"))

    def send(self, envelope: Envelope, buffers: Sequence[memoryview], more: bool = False) -> None:
        """Queue ``envelope`` for its target (any thread; never blocks on the network).

        ``MessageTooLargeError`` over the frame bound; other failures (closed transport,
        queues full, unreachable PID) bounce the envelope to ``undeliverable``. ``more``: the
        caller sends again at once (an actor thread working through queued calls), so the frame
        takes the outbox instead of a ``sendmsg`` of its own: the loop's drain writes it with
        the ones that follow in one ``sendmsg``.
        """
        prepared = self._prepare(envelope, buffers)
        if prepared is not None:
            self._submit(envelope, *prepared, more)

    def send_each(self, envelopes: Sequence[Envelope], buffers: Sequence[memoryview]) -> None:
        """``send`` of several envelopes carrying the same payload and ``buffers`` (a
        broadcast), in order: every frame is encoded first, then they are written one right
        after the other, so the last destination does not wait for the encoding of the frames
        before its own (its worker starts as soon after the first one's as the writes allow).
        An envelope that fails (``MessageTooLargeError``, a local target's full queue) raises
        once the envelopes before it are sent, as one ``send`` after the other would."""
        prepared: list[tuple[Envelope, _Frame | None]] = []
        try:
            for envelope in envelopes:
                prepared.append((envelope, self._prepare(envelope, buffers)))
        finally:  # on a failure too: the ones before it go (a local one was delivered already)
            for envelope, frame in prepared:
                if frame is not None:
                    peer, lane, pieces, shared = frame
                    self._submit(envelope, peer, lane, pieces, shared, False)

    def _prepare(self, envelope: Envelope, buffers: Sequence[memoryview]) -> _Frame | None:
        """The frame for ``envelope`` (size checked), or ``None`` once it was handled here (a
        local delivery, a bounce)."""
        limits = self.limits
        if buffers:
            check_size(len(envelope.payload), sum(b.nbytes for b in buffers), len(buffers), limits)
        elif _PREFIX_BYTES + len(envelope.payload) > limits.max_frame_bytes:
            check_size(len(envelope.payload), 0, 0, limits)  # raises MessageTooLargeError
        target = envelope.target.pid
        if self._closed:
            self._bounce_soon(envelope, "the sending process's transport is closed")
            return None
        if target == self._pid_raw or (self._hosts is not None and self._hosts(target)):
            owned = detach_buffers(buffers, envelope.buffer_kinds)
            try:
                self._loop.call_soon(self._deliver, envelope, owned)
            except RuntimeLoopOverloadedError:
                raise  # to the sender: the loop would refuse the bounce as well
            except RuntimeLoopClosedError:
                pass  # closed under us: nobody is left to tell
            return None
        shared: _Shared | None = None
        pieces: list[Any] | None = None
        peer = self._peers.get(target)
        lane = peer.lane if peer is not None else None
        if buffers and lane is not None and lane.shm:
            threshold = self._lane_settings.shm_threshold
            if any(b.nbytes >= threshold for b in buffers):
                pieces, shared = self._share(envelope, buffers, lane, threshold)
        if pieces is None:
            pieces = encode_frame(
                envelope, detach_buffers(buffers, envelope.buffer_kinds) if buffers else [], limits
            )
        return peer, lane, pieces, shared

    def _submit(
        self,
        envelope: Envelope,
        peer: _Peer | None,
        lane: Lane | None,
        pieces: list[Any],
        shared: _Shared | None,
        more: bool,
    ) -> None:
        """Write ``envelope``'s frame at once (``_send_direct``) or queue it for the loop."""
        if (
            peer is not None
            and lane is not None
            and lane.direct
            and not more
            # Calls to this peer in flight (a pipelining sender): the outbox, without taking
            # the lock just to find that out (a stale read only picks the outbox, always safe).
            # Not for a frame whose buffers went into shared memory: copying them took long
            # enough that the outbox rarely batches it with another, and the loop's wake-up
            # would cost more than the sendmsg.
            and (shared is not None or not peer.outstanding)
            and self._send_direct(envelope, peer, lane, pieces, shared)
        ):
            return
        nbytes = 0
        for p in pieces:
            nbytes += len(p) if type(p) is bytes else memoryview(p).nbytes
        with self._lock:
            full = self._queued_frames >= self._settings.max_queued_frames or (
                self._queued_bytes > 0
                and self._queued_bytes + nbytes > self._settings.max_queued_bytes
            )
            if not full:
                self._queued_bytes += nbytes
                self._queued_frames += 1
        if full:
            if shared is not None:
                shared.close()
            self._bounce_soon(
                envelope,
                f"the outbound queue is full ({self._settings.max_queued_frames} frames, "
                f"{self._settings.max_queued_bytes} bytes)",
            )
            return
        with self._outbox_lock:
            self._outbox.append((envelope, pieces, nbytes, shared))
            if self._outbox_scheduled:
                return  # the loop drains the outbox soon: no second wake-up
            self._outbox_scheduled = True
        if not self._call_soon(self._drain_outbox):
            with self._outbox_lock:
                items, self._outbox = list(self._outbox), collections.deque()
            for _envelope, _pieces, size, frame_shared in items:
                self._release(size)
                if frame_shared is not None:
                    frame_shared.close()

    def _drain_outbox(self) -> None:
        """Enqueue everything ``send`` put in the outbox, in order (loop thread).

        Why an outbox: ``call_soon_threadsafe`` writes to the loop's wake-up pipe on every call,
        which dominated the per-message cost of pipelined sends; one wake-up now serves every
        envelope sent before the loop got to run."""
        corked: list[UnixLane] = []
        with self._outbox_lock:
            self._draining = True
            self._corked = corked
            try:
                while self._outbox:
                    items, self._outbox = self._outbox, collections.deque()
                    for item in items:
                        self._enqueue(*item)
            finally:
                self._corked = None
                self._draining = False
                self._outbox_scheduled = False
        for lane in corked:  # one sendmsg per lane for the whole batch
            lane.uncork()

    def _send_direct(
        self,
        envelope: Envelope,
        peer: _Peer,
        lane: Lane,
        pieces: list[Any],
        shared: _Shared | None,
    ) -> bool:
        """Write a frame on ``peer``'s Unix lane from the calling thread, when nothing sent
        earlier can still be on its way (empty outbox, no backlog): the hot path of a call
        skips the hop to the runtime loop. False when the frame must take the loop's path."""
        with self._outbox_lock:
            if (
                self._outbox
                or self._draining
                or self._shut
                or peer.lane is not lane
                or peer.queue
                or peer.task is not None
                or peer.failing is not None
                or not lane.idle
                or lane.closed
                # Calls to this peer are in flight (a pipelining sender): take the outbox, whose
                # drain writes the whole batch in one sendmsg, instead of one syscall per call
                # (but a frame with shared memory goes now: see ``send``).
                or (peer.outstanding and shared is None)
                or (shared is not None and shared.lane is not lane)
                or self._peers.get(envelope.target.pid) is not peer
            ):
                return False
            self._track(peer, envelope)
            fds: list[int] | None = None
            if shared is not None:
                fds = shared.take()
            else:
                pieces = _lane_pieces(pieces)
            lane.send_direct(pieces, fds)
        return True

    def _track(self, peer: _Peer, envelope: Envelope) -> None:
        """Remember a call until its reply arrives, to bounce it if ``peer`` fails (bounded:
        the oldest is forgotten)."""
        if envelope.kind in _TRACKED_KINDS and envelope.reply_port is not None:
            rank = envelope.cast.rank if envelope.cast is not None else 0
            key = (envelope.reply_port.pid, envelope.reply_port.index, rank)
            # A small payload is kept rather than copying the envelope without it (a bounce
            # does not read it): at most _KEEP_PAYLOAD bytes per remembered call.
            peer.outstanding[key] = (
                envelope if len(envelope.payload) <= _KEEP_PAYLOAD else _stripped(envelope)
            )
            if len(peer.outstanding) > self._settings.max_outstanding:
                peer.outstanding.popitem(last=False)

    def _share(
        self, envelope: Envelope, buffers: Sequence[memoryview], lane: Lane, threshold: int
    ) -> tuple[list[Any] | None, _Shared | None]:
        """Lane pieces with the buffers over ``threshold`` in shared-memory slots (one copy,
        from the caller's memory) or lent (``_lend``), or ``(None, None)`` when the shared-bytes
        bound or the kernel says no."""
        if lane.lend:
            lent = self._lend(envelope, buffers, lane, threshold)
            if lent is not None:
                return lent
        slots: list[tuple[int, int]] = []
        fds: list[int] = []
        for index, buffer in enumerate(buffers):
            if buffer.nbytes < threshold:
                continue
            taken = lane.pool.put(buffer)
            if taken is None:
                _Shared(lane, slots, fds, []).close()
                return None, None
            slots.append((index, taken[0]))
            fds.append(taken[1])
        shared = _Shared(lane, slots, fds, [])
        return self._shared_pieces(envelope, buffers, lane_prefix(slots), shared)

    def _lend(
        self, envelope: Envelope, buffers: Sequence[memoryview], lane: Lane, threshold: int
    ) -> tuple[list[Any], _Shared] | None:
        """Lane pieces with every buffer over ``threshold`` lent (no copy: the receiver reads
        it out of this process, ``shm.PeerReader``), or ``None`` when one of them cannot be
        (not a ``bytes``, or over the in-flight bound): the caller puts them in slots."""
        large = [(i, b) for i, b in enumerate(buffers) if b.nbytes >= threshold]
        if not all(_shm.lendable(b) for _i, b in large):
            return None
        slots: list[tuple[int, int]] = []
        entries: list[tuple[int, int, int]] = []
        for index, buffer in large:
            taken = lane.pool.lend(buffer)
            if taken is None:
                for _index, slot in slots:
                    lane.pool.release(slot)
                return None
            slots.append((index, taken[0]))
            entries.append((index, *taken))
        shared = _Shared(lane, slots, [], [], [b for _i, b in large])
        return self._shared_pieces(envelope, buffers, lent_prefix(entries), shared)

    @staticmethod
    def _shared_pieces(
        envelope: Envelope, buffers: Sequence[memoryview], prefix: bytes, shared: _Shared
    ) -> tuple[list[Any], _Shared]:
        """A shared frame's pieces: ``prefix``, the envelope and the buffers not in
        ``shared.slots`` (copied into ``shared.inline``)."""
        shared_indexes = {index for index, _slot in shared.slots}
        kinds = envelope.buffer_kinds
        inline: list[ReceivedBuffer | None] = [
            None if i in shared_indexes else detach_buffers([b], kinds[i : i + 1])[0]
            for i, b in enumerate(buffers)
        ]
        shared.inline = inline
        header = _HEADER_ENCODER.encode(envelope)
        body = [b for b in inline if b is not None]
        pieces: list[Any] = [
            prefix,
            FRAME_PREFIX.pack(len(header), sum(len(b) for b in body)),
            header,
            *body,
        ]
        return pieces, shared

    def _unshare(self, envelope: Envelope, shared: _Shared) -> list[Any]:
        """Stream pieces for a frame prepared for a lane that is no longer the way out."""
        owned: list[Any] = list(shared.inline)
        if shared.lent is not None:  # the caller's own ``bytes``, still held
            for (index, _slot), view in zip(shared.slots, shared.lent, strict=True):
                owned[index] = bytes(view)
        else:
            for (index, _slot), fd in zip(shared.slots, shared.fds, strict=True):
                data = os.pread(fd, envelope.buffer_sizes[index], 0)  # our own descriptor of it
                owned[index] = data if envelope.buffer_kinds[index] & 1 else bytearray(data)
        shared.close()
        return encode_frame(envelope, owned, self.limits)

    def close(self) -> None:
        """Stop (any thread, idempotent): queued frames are flushed within ``flush_timeout``
        when the loop still runs; later sends bounce."""
        if self._closed:
            return
        self._closed = True
        if not self._call_soon(self._start_close):
            self._closed_event.set()

    async def aclose(self) -> None:
        """Stop and wait (on the loop): flush queued frames (bounded), end the streams, stop
        accepting. Idempotent."""
        self._closed = True
        await self._shutdown()

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Block (not on the loop) until the transport finished closing; False on timeout."""
        return self._closed_event.wait(timeout)

    def mark_unreachable(self, pid: Pid | bytes, reason: str, *, fence: bool = False) -> None:
        """``pid`` is gone for good (any thread): its queued envelopes and outstanding calls
        bounce with ``reason`` now, later envelopes to it bounce at once. ``fence``: it was
        declared dead but may still run; envelopes from it are refused from now on."""
        raw = pid.raw if isinstance(pid, Pid) else bytes(pid)
        self._call_soon(self._kill_peer, raw, reason, fence)

    def statistics(self) -> NodeTransportStatistics:
        """An immutable snapshot (any thread)."""
        with self._lock:
            return NodeTransportStatistics(
                len(self._peers),
                len(self._inbound),
                self._queued_frames,
                self._queued_bytes,
                self._bounced,
                len(self._unreachable),
                sum(1 for p in list(self._peers.values()) if p.lane is not None),
                len(self._inbound_lanes),
                self._refused,
            )

    # -- helpers --------------------------------------------------------------------------------
    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            self._loop.call_soon(fn, *args)
        except RuntimeLoopOverloadedError as exc:
            _log.error("the node transport could not hand %r to its loop: %s", fn, exc)
            return False
        except RuntimeLoopClosedError:
            return False
        return True

    def _bounce_soon(self, envelope: Envelope, reason: str) -> None:
        self._call_soon(self._bounce, envelope, reason)

    def _bounce(self, envelope: Envelope, reason: str) -> None:
        with self._lock:
            self._bounced += 1
        try:
            self._undeliverable(envelope, reason)
        except Exception:
            _log.exception("the undeliverable callback failed")

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self._queued_bytes -= nbytes
            self._queued_frames -= 1

    # -- outbound (loop thread) -----------------------------------------------------------------
    def _enqueue(
        self, envelope: Envelope, pieces: list[Any], nbytes: int, shared: _Shared | None = None
    ) -> None:
        target = envelope.target.pid
        reason = self._unreachable.get(target)
        if reason is None and self._shut:
            reason = "the sending process's transport is closed"
        peer = self._peers.get(target)
        if reason is None and peer is None:
            if len(self._peers) >= self._settings.max_peers:
                reason = f"this process already talks to {self._settings.max_peers} peers"
            else:
                peer = self._peers[target] = _Peer(Pid(target))
        if reason is not None or peer is None:
            self._release(nbytes)
            if shared is not None:
                shared.close()
            self._bounce(envelope, reason or "unreachable")
            return
        self._track(peer, envelope)
        lane = peer.lane
        if lane is not None and peer.task is None and not peer.queue:
            self._lane_write(peer, lane, envelope, pieces, nbytes, shared)  # the hot path
            return
        peer.queue.append((envelope, pieces, nbytes, shared))
        if peer.task is None and peer.failing is None:
            peer.task = asyncio.get_running_loop().create_task(self._write_loop(peer))

    def _lane_write(
        self,
        peer: _Peer,
        lane: Lane,
        envelope: Envelope,
        pieces: list[Any],
        nbytes: int,
        shared: _Shared | None,
    ) -> None:
        fds: list[int] | None = None
        if shared is not None:
            if shared.lane is lane:
                fds = shared.take()
            else:
                pieces = [ZERO_SHM_HEAD, *self._unshare(envelope, shared)]
        else:
            pieces = _lane_pieces(pieces)
        corked = self._corked
        if corked is not None and isinstance(lane, UnixLane) and not lane._corked:
            lane.cork()
            corked.append(lane)
        try:
            lane.send_frame(pieces, fds, nbytes)
        except Exception as exc:
            for fd in fds or ():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._release(nbytes)
            self._fail_peer(peer, f"process {peer.pid.hex()} is unreachable: {exc}")

    async def _write_loop(self, peer: _Peer) -> None:
        try:
            if peer.stream is None:
                peer.stream = await asyncio.wait_for(
                    self._dial(peer.pid), self._settings.dial_timeout
                )
                peer.stream.write(STREAM_MAGIC)
                if self._lanes is not None and not self._shut and not self._lanes_forced_off():
                    hello, peer.nonce = self._lanes.hello()
                    peer.stream.write(encode_control(hello))
                peer.watch = asyncio.get_running_loop().create_task(self._watch(peer))
            stream = peer.stream
            while peer.queue:
                if peer.pending_lane is not None:
                    self._switch(peer)
                envelope, pieces, nbytes, shared = peer.queue.popleft()
                lane = peer.lane
                if lane is not None:
                    self._lane_write(peer, lane, envelope, pieces, nbytes, shared)
                    continue
                if shared is not None:
                    pieces = self._unshare(envelope, shared)
                try:
                    for piece in pieces:
                        view = memoryview(piece).cast("B")
                        for start in range(0, view.nbytes, _WRITE_CHUNK):
                            stream.write(view[start : start + _WRITE_CHUNK])
                            await stream.drain()
                finally:
                    self._release(nbytes)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self._fail_peer(
                peer,
                f"process {peer.pid.hex()} is unreachable: no stream within "
                f"{self._settings.dial_timeout:g} s",
            )
        except Exception as exc:
            self._fail_peer(peer, f"process {peer.pid.hex()} is unreachable: {exc}")
        finally:
            if peer.task is asyncio.current_task():
                peer.task = None
        if peer.task is None and peer.pending_lane is not None and peer.stream is not None:
            self._switch(peer)
        if peer.queue and not self._closed and peer.task is None:
            # arrived while the last write drained
            peer.task = asyncio.get_running_loop().create_task(self._write_loop(peer))

    def _switch(self, peer: _Peer) -> None:
        """Between two frames: mark the end of the stream path and continue on the lane."""
        assert peer.pending_lane is not None
        lane, token = peer.pending_lane
        peer.pending_lane = None
        if lane.closed or peer.stream is None:
            return
        peer.stream.write(encode_control(Switch(token)))
        peer.lane = lane

    async def _watch(self, peer: _Peer) -> None:
        """Read the dialled stream's reverse direction: the receiver's lane ``Offer``, then its
        end (which means the peer is gone, unless a lane carries the traffic by then)."""
        stream = peer.stream
        reason = f"process {peer.pid.hex()} closed its stream"
        splitter = ControlSplitter()
        try:
            while data := await stream.read(4096):
                for message in splitter.feed(data):
                    if isinstance(message, Offer):
                        self._on_offer(peer, stream, message)
                    else:
                        raise FrameError(f"unexpected {type(message).__name__} from the receiver")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = f"process {peer.pid.hex()} is unreachable: {exc}"
        if peer.stream is stream and peer.lane is None:
            self._fail_peer(peer, reason)

    def _on_offer(self, peer: _Peer, stream: Any, offer: Offer) -> None:
        if (
            not offer.kind
            or self._lanes is None
            or peer.negotiation is not None
            or peer.lane is not None
            or self._shut
        ):
            return
        task = asyncio.get_running_loop().create_task(self._negotiate(peer, stream, offer))
        peer.negotiation = task

    async def _negotiate(self, peer: _Peer, stream: Any, offer: Offer) -> None:
        assert self._lanes is not None
        try:
            lane = await self._lanes.dial(peer.pid.raw, offer, peer.nonce)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _log.info("no %s lane to %s, staying on QUIC: %r", offer.kind, peer.pid.hex(), exc)
            return
        finally:
            peer.negotiation = None
        if self._peers.get(peer.pid.raw) is not peer or peer.stream is not stream or self._shut:
            lane.close()
            return
        lane.on_written = self._release_lane
        lane.on_failed = partial(self._lane_failed, peer, lane)
        lane.start_sender()
        peer.pending_lane = (lane, offer.token)
        if peer.task is None:
            self._switch(peer)

    def _release_lane(self, nbytes: int) -> None:
        self._release(nbytes)

    def _lane_failed(self, peer: _Peer, lane: Lane, reason: str) -> None:
        if peer.lane is lane:
            # Nothing more leaves for this peer (envelopes wait in its queue); the peer fails
            # after the grace period unless ``mark_unreachable`` names the cause first.
            peer.lane = None
            peer.failing = f"process {peer.pid.hex()} is unreachable: {reason}"
            asyncio.get_running_loop().call_later(
                self._settings.lane_grace, self._finish_failing, peer
            )
        elif peer.pending_lane is not None and peer.pending_lane[0] is lane:
            peer.pending_lane = None

    def _finish_failing(self, peer: _Peer) -> None:
        if self._peers.get(peer.pid.raw) is peer and peer.failing is not None:
            self._fail_peer(peer, peer.failing)

    def _fail_peer(self, peer: _Peer, reason: str) -> None:
        """Bounce what is queued for ``peer`` and its outstanding calls; forget the stream and
        the lane."""
        with self._outbox_lock:  # no direct write may slip in between
            self._fail_peer_locked(peer, reason)

    def _fail_peer_locked(self, peer: _Peer, reason: str) -> None:
        stream, peer.stream = peer.stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.abort()
        if peer.watch is not None and peer.watch is not asyncio.current_task():
            peer.watch.cancel()
        peer.watch = None
        if peer.negotiation is not None and peer.negotiation is not asyncio.current_task():
            peer.negotiation.cancel()
        peer.negotiation = None
        lane, peer.lane = peer.lane, None
        if lane is not None:
            lane.close()
        if peer.pending_lane is not None:
            peer.pending_lane[0].close()
            peer.pending_lane = None
        queued, peer.queue = list(peer.queue), collections.deque()
        outstanding = list(peer.outstanding.values())
        peer.outstanding.clear()
        for envelope, _pieces, nbytes, shared in queued:
            self._release(nbytes)
            if shared is not None:
                shared.close()
            if not (envelope.kind in _TRACKED_KINDS and envelope.reply_port is not None):
                self._bounce(envelope, reason)
        for envelope in outstanding:
            self._bounce(envelope, reason)
        if self._peers.get(peer.pid.raw) is peer:
            del self._peers[peer.pid.raw]

    def _kill_peer(self, raw: bytes, reason: str, fence: bool = False) -> None:
        self._unreachable[raw] = reason
        while len(self._unreachable) > self._settings.max_peers:
            del self._unreachable[next(iter(self._unreachable))]
        if fence:
            self._fenced[raw] = reason
            while len(self._fenced) > self._settings.max_peers:
                del self._fenced[next(iter(self._fenced))]
        peer = self._peers.pop(raw, None)
        if peer is None:
            return
        if peer.task is not None and peer.task is not asyncio.current_task():
            peer.task.cancel()
            peer.task = None
        self._fail_peer(peer, reason)

    # -- inbound (loop thread) ------------------------------------------------------------------
    async def _accept_loop(self, accept: Callable[[], Any]) -> None:
        while True:
            try:
                peer, stream = await accept()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                _log.debug("accept loop ended: %s", exc)
                return
            if len(self._inbound) >= self._settings.max_inbound_streams:
                _log.warning("refusing a stream from %s: too many inbound streams", peer.hex())
                with contextlib.suppress(Exception):
                    stream.abort()
                continue
            task = asyncio.get_running_loop().create_task(self._read_loop(peer, stream))
            self._inbound.add(task)
            task.add_done_callback(self._inbound.discard)

    async def _read_loop(self, peer: Pid, stream: Any) -> None:
        splitter = ControlSplitter(FrameDecoder(self.limits))
        switched = False
        offered: bytes | None = None  # the lane token offered on this stream
        try:
            magic = await stream.readexactly(len(STREAM_MAGIC))
            if magic != STREAM_MAGIC:
                raise FrameError(f"stream from {peer.hex()} is not a Monarch envelope stream")
            while True:
                data = await stream.read(self._settings.read_chunk)
                if not data:
                    break
                for item in splitter.feed(data):
                    if type(item) is tuple:
                        if switched:
                            raise FrameError(
                                f"process {peer.hex()} sent an envelope after its switch"
                            )
                        envelope, buffers = item
                        if envelope.sender.pid != peer.raw:
                            raise FrameError(
                                f"process {peer.hex()} sent an envelope claiming sender "
                                f"{envelope.sender.pid.hex()}"
                            )
                        self._on_inbound(peer, envelope, buffers)
                    elif isinstance(item, Hello) and offered is None and not switched:
                        offer = self._offer(peer, item)
                        if offer.kind:
                            offered = offer.token
                            self._offered.add(offered)
                        else:
                            offered = b""  # answered: one Hello per stream
                        stream.write(encode_control(offer))
                    elif isinstance(item, Switch) and not switched:
                        self._switch_inbound(peer, item.token, offered)
                        switched = True
                    else:
                        raise FrameError(
                            f"process {peer.hex()} sent an unexpected {type(item).__name__}"
                        )
        except asyncio.CancelledError:
            raise
        except FrameError as exc:
            _log.warning("closing the stream from %s: %s", peer.hex(), exc)
            with contextlib.suppress(Exception):
                stream.abort()
        except Exception as exc:
            _log.debug("stream from %s ended: %s", peer.hex(), exc)
        else:
            with contextlib.suppress(Exception):
                stream.write_eof()  # finish our half so the stream is reclaimed
        finally:
            if offered and not switched:
                self._drop_offer(offered)
        if not switched:  # after a switch the lane's end is what counts
            self._peer_closed(peer)

    def _peer_closed(self, peer: Pid) -> None:
        outbound = self._peers.get(peer.raw)
        if outbound is not None and outbound.outstanding:
            # No reply can come from that process any more on this path.
            queued = list(outbound.outstanding.values())
            outbound.outstanding.clear()
            for envelope in queued:
                self._bounce(envelope, f"process {peer.hex()} closed its stream to this one")

    def _offer(self, peer: Pid, hello: Hello) -> Offer:
        if self._lanes is None or self._shut or self._lanes_forced_off():
            return Offer("", "", 0, os.urandom(32), os.urandom(16))
        return self._lanes.offer(peer.raw, hello, asyncio.get_running_loop().time())

    def _drop_offer(self, token: bytes) -> None:
        """The stream that offered ``token`` ended before its ``Switch``: the lane, accepted or
        still to be, can never carry anything."""
        self._offered.discard(token)
        lane = self._accepted.pop(token, None)
        if lane is not None:
            lane.close()
        if self._lanes is not None:
            self._lanes.forget(token)

    def _on_accepted(self, token: bytes, lane: Lane) -> None:
        """An inbound lane passed its handshake: hold it until its ``Switch`` (bounded).

        Why not while shutting down too: the inbound streams are still read until the end of
        ``_shutdown`` (queued envelopes still arrive on them), so a ``Switch`` already on its
        way must find its lane, or the sender's envelopes after it would be lost and the
        stream refused with a spurious "switched to a lane it did not open"."""
        if self._finished or token not in self._offered:
            lane.close()
            return
        while len(self._accepted) >= self._lane_settings.max_pending:
            _oldest_token, oldest = self._accepted.popitem(last=False)
            oldest.close()
        self._accepted[token] = lane

    def _switch_inbound(self, peer: Pid, token: bytes, offered: bytes | None) -> None:
        if token != offered:
            raise FrameError(f"process {peer.hex()} switched to a lane not offered on its stream")
        self._offered.discard(token)
        lane = self._accepted.pop(token, None)
        if lane is None or lane.peer != peer.raw:
            if lane is not None:
                lane.close()
            raise FrameError(f"process {peer.hex()} switched to a lane it did not open")
        self._inbound_lanes.add(lane)
        lane.start(partial(self._on_lane_message, peer), partial(self._on_lane_end, peer, lane))

    def _on_lane_message(
        self, peer: Pid, envelope: Envelope, buffers: list[ReceivedBuffer]
    ) -> None:
        if envelope.sender.pid != peer.raw:
            raise FrameError(
                f"process {peer.hex()} sent an envelope claiming sender {envelope.sender.pid.hex()}"
            )
        self._on_inbound(peer, envelope, buffers)

    def _on_lane_end(self, peer: Pid, lane: Lane, reason: str | None) -> None:
        self._inbound_lanes.discard(lane)
        if reason is not None:
            _log.debug("lane from %s ended: %s", peer.hex(), reason)
        self._peer_closed(peer)

    def _on_inbound(self, peer: Pid, envelope: Envelope, buffers: list[ReceivedBuffer]) -> None:
        if self._fenced and peer.raw in self._fenced:
            # Declared dead: whatever it still sends (it ran again) is refused.
            with self._lock:
                self._refused += 1
            _log.info(
                "refused a %s envelope from fenced process %s (%s)",
                envelope.kind.name,
                peer.hex(),
                self._fenced[peer.raw],
            )
            return
        target = envelope.target.pid
        if target != self._pid_raw and not (self._hosts is not None and self._hosts(target)):
            _log.warning("dropping an envelope for %s (not hosted here)", target.hex())
            return
        if envelope.kind in _REPLY_KINDS:
            outbound = self._peers.get(peer.raw)
            if outbound is not None:
                rank = envelope.cast.rank if envelope.cast is not None else 0
                outbound.outstanding.pop((target, envelope.port, rank), None)
        try:
            self._deliver(envelope, buffers)
        except Exception:
            _log.exception("the deliver callback failed")

    # -- shutdown ---------------------------------------------------------------------------------
    def _start_close(self) -> None:
        task = asyncio.get_running_loop().create_task(self._shutdown())
        task.add_done_callback(lambda _: None)

    async def _shutdown(self) -> None:
        try:
            loop = asyncio.get_running_loop()
            writers = [p.task for p in self._peers.values() if p.task is not None]
            if writers:
                await asyncio.wait(writers, timeout=self._settings.flush_timeout)
            deadline = loop.time() + self._settings.flush_timeout
            # ... and until the receivers read what was lent to them (``shm.ShmPool.lend``)
            while loop.time() < deadline and any(
                p.lane is not None and (not p.lane.idle or p.lane.lending)
                for p in self._peers.values()
            ):
                await asyncio.sleep(0.005)
            self._shut = True
            if self._lanes is not None:
                self._lanes.close()
            # Accepted lanes stay until the inbound streams are no longer read (below): a
            # ``Switch`` read meanwhile still finds its lane.
            accept, self._accept_task = self._accept_task, None
            if accept is not None:
                accept.cancel()
            link_accept, self._link_accept_task = self._link_accept_task, None
            if link_accept is not None:
                link_accept.cancel()
            protocol, self._link_protocol = self._link_protocol, None
            if protocol is not None:
                with contextlib.suppress(Exception):
                    self._link_transport.unregister_link_protocol(LINK_PROTOCOL)
            streams = []
            for peer in list(self._peers.values()):
                if peer.task is not None:
                    peer.task.cancel()
                if peer.watch is not None:
                    peer.watch.cancel()
                    peer.watch = None
                stream, peer.stream = peer.stream, None
                if stream is not None:
                    with contextlib.suppress(Exception):
                        stream.write_eof()
                        streams.append(stream)
                self._fail_peer(peer, "the sending process's transport is closed")
            if streams:  # every written byte acknowledged, within the flush bound
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        asyncio.gather(*(s.wait_closed() for s in streams), return_exceptions=True),
                        self._settings.flush_timeout,
                    )
            self._finished = True
            for task in list(self._inbound):
                task.cancel()
            for lane in list(self._inbound_lanes) + list(self._accepted.values()):
                lane.close()
            self._inbound_lanes.clear()
            self._accepted.clear()
            self._offered.clear()
        finally:
            self._closed_event.set()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        _log.warning("TCP lane listener not started: %r", task.exception())
