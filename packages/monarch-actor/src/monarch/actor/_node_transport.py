"""``NodeProcessTransport``: the ``ProcessTransport`` seam over a Chrysalis ``Node``.

Why this shape: every Monarch process is one Chrysalis Node, so an actor process's identity is
its Node's PID and "send an envelope to (PID, actor path)" becomes "write a frame on a stream
to PID". Streams are long-lived and one-directional in use: the first envelope from process A
to process B dials B (``Node.dial``: resolve, then an authenticated QUIC stream through the
tree's gateways) and every later A-to-B envelope follows on the same stream, so per-sender
order is the stream's order. B reads envelopes only from streams it *accepted*, so the
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
later envelope to that PID bounce immediately.

Only the QUIC path through the Node exists; direct lanes (Unix stream sockets between
processes on one host) are not implemented.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from chrysalis.core import Pid
from monarch.actor._codec import detach_buffers
from monarch.actor._envelope import (
    Envelope,
    FrameDecoder,
    FrameLimits,
    MessageKind,
    check_size,
    encode_frame,
)
from monarch.actor._errors import FrameError
from monarch.actor._loop import RuntimeLoop, RuntimeLoopClosedError
from monarch.actor._transport import DeliverCallback, UndeliverableCallback

__all__ = [
    "STREAM_MAGIC",
    "NodeProcessTransport",
    "NodeTransportSettings",
    "NodeTransportStatistics",
]

#: First bytes of every envelope stream (protocol name and version).
STREAM_MAGIC: Final = b"MONARCH1"
_WRITE_CHUNK: Final = 256 * 1024
_TRACKED_KINDS: Final = frozenset(
    {MessageKind.CALL, MessageKind.SPAWN, MessageKind.STOP, MessageKind.STOP_PROC}
)
_log = logging.getLogger("monarch.actor.transport")


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
    """

    dial_timeout: float = 10.0
    max_queued_bytes: int = 256 * 1024 * 1024
    max_queued_frames: int = 100_000
    max_peers: int = 4096
    max_inbound_streams: int = 4096
    max_outstanding: int = 65_536
    read_chunk: int = 256 * 1024
    flush_timeout: float = 5.0

    def __post_init__(self) -> None:
        if (
            min(self.dial_timeout, self.flush_timeout) <= 0
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
    envelopes bounced so far, and PIDs marked unreachable."""

    peers: int
    inbound_streams: int
    queued_frames: int
    queued_bytes: int
    bounced: int
    unreachable: int


_OutstandingKey = tuple[bytes, int, int]


class _Peer:
    """Outbound state for one destination PID (runtime loop thread only)."""

    __slots__ = ("outstanding", "pid", "queue", "stream", "task", "watch")

    def __init__(self, pid: Pid) -> None:
        self.pid = pid
        self.queue: collections.deque[tuple[Envelope, list[Any], int]] = collections.deque()
        self.stream: Any = None
        self.task: asyncio.Task[None] | None = None
        self.watch: asyncio.Task[None] | None = None
        self.outstanding: collections.OrderedDict[_OutstandingKey, Envelope] = (
            collections.OrderedDict()
        )


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
    ``await aclose()`` to stop.
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
    ) -> None:
        self._node = node
        self._pid: Pid = node.pid
        self._loop = loop
        self._deliver: DeliverCallback = deliver or _ignore_envelope
        self._undeliverable: UndeliverableCallback = undeliverable or _ignore_envelope
        self._limits = limits or FrameLimits()
        self._settings = settings or NodeTransportSettings()
        self._hosts = hosts
        self._peers: dict[bytes, _Peer] = {}
        self._inbound: set[asyncio.Task[None]] = set()
        self._accept_task: asyncio.Task[None] | None = None
        self._unreachable: dict[bytes, str] = {}
        self._lock = threading.Lock()
        self._queued_bytes = 0
        self._queued_frames = 0
        self._bounced = 0
        self._closed = False
        self._shut = False
        self._closed_event = threading.Event()

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
            self._accept_task = asyncio.get_running_loop().create_task(self._accept_loop())

    def send(self, envelope: Envelope, buffers: Sequence[memoryview]) -> None:
        """Queue ``envelope`` for its target (any thread; never blocks on the network).

        ``MessageTooLargeError`` over the frame bound; other failures (closed transport,
        queues full, unreachable PID) bounce the envelope to ``undeliverable``.
        """
        limits = self.limits
        check_size(len(envelope.payload), sum(b.nbytes for b in buffers), len(buffers), limits)
        owned = detach_buffers(buffers, envelope.buffer_kinds)
        target = envelope.target.pid
        if self._closed:
            self._bounce_soon(envelope, "the sending process's transport is closed")
            return
        if target == self._pid.raw or (self._hosts is not None and self._hosts(target)):
            self._call_soon(self._deliver, envelope, owned)
            return
        pieces: list[Any] = encode_frame(envelope, owned, limits)
        nbytes = sum(memoryview(p).nbytes for p in pieces)
        with self._lock:
            full = self._queued_frames >= self._settings.max_queued_frames or (
                self._queued_bytes > 0
                and self._queued_bytes + nbytes > self._settings.max_queued_bytes
            )
            if not full:
                self._queued_bytes += nbytes
                self._queued_frames += 1
        if full:
            self._bounce_soon(
                envelope,
                f"the outbound queue is full ({self._settings.max_queued_frames} frames, "
                f"{self._settings.max_queued_bytes} bytes)",
            )
            return
        if not self._call_soon(self._enqueue, envelope, pieces, nbytes):
            self._release(nbytes)

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

    def mark_unreachable(self, pid: Pid | bytes, reason: str) -> None:
        """``pid`` is gone for good (any thread): its queued envelopes and outstanding calls
        bounce with ``reason`` now, later envelopes to it bounce at once."""
        raw = pid.raw if isinstance(pid, Pid) else bytes(pid)
        self._call_soon(self._kill_peer, raw, reason)

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
            )

    # -- helpers --------------------------------------------------------------------------------
    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            self._loop.call_soon(fn, *args)
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
    def _enqueue(self, envelope: Envelope, pieces: list[Any], nbytes: int) -> None:
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
            self._bounce(envelope, reason or "unreachable")
            return
        if envelope.kind in _TRACKED_KINDS and envelope.reply_port is not None:
            rank = envelope.cast.rank if envelope.cast is not None else 0
            key = (envelope.reply_port.pid, envelope.reply_port.index, rank)
            peer.outstanding[key] = _stripped(envelope)
            if len(peer.outstanding) > self._settings.max_outstanding:
                peer.outstanding.popitem(last=False)
        peer.queue.append((envelope, pieces, nbytes))
        if peer.task is None:
            peer.task = asyncio.get_running_loop().create_task(self._write_loop(peer))

    async def _write_loop(self, peer: _Peer) -> None:
        try:
            if peer.stream is None:
                peer.stream = await asyncio.wait_for(
                    self._node.dial(peer.pid), self._settings.dial_timeout
                )
                peer.stream.write(STREAM_MAGIC)
                peer.watch = asyncio.get_running_loop().create_task(self._watch(peer))
            stream = peer.stream
            while peer.queue:
                _envelope, pieces, nbytes = peer.queue.popleft()
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
        if peer.queue and not self._closed:  # arrived while the last write drained
            peer.task = asyncio.get_running_loop().create_task(self._write_loop(peer))

    async def _watch(self, peer: _Peer) -> None:
        """Read the (otherwise silent) dialled stream: its end means the peer is gone."""
        stream = peer.stream
        reason = f"process {peer.pid.hex()} closed its stream"
        try:
            while await stream.read(4096):
                pass  # the receiver never writes; ignore anything it might send
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = f"process {peer.pid.hex()} is unreachable: {exc}"
        if peer.stream is stream:
            self._fail_peer(peer, reason)

    def _fail_peer(self, peer: _Peer, reason: str) -> None:
        """Bounce what is queued for ``peer`` and its outstanding calls; forget the stream."""
        stream, peer.stream = peer.stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.abort()
        if peer.watch is not None and peer.watch is not asyncio.current_task():
            peer.watch.cancel()
        peer.watch = None
        queued, peer.queue = list(peer.queue), collections.deque()
        outstanding = list(peer.outstanding.values())
        peer.outstanding.clear()
        for envelope, _pieces, nbytes in queued:
            self._release(nbytes)
            if not (envelope.kind in _TRACKED_KINDS and envelope.reply_port is not None):
                self._bounce(envelope, reason)
        for envelope in outstanding:
            self._bounce(envelope, reason)
        if self._peers.get(peer.pid.raw) is peer:
            del self._peers[peer.pid.raw]

    def _kill_peer(self, raw: bytes, reason: str) -> None:
        self._unreachable[raw] = reason
        while len(self._unreachable) > self._settings.max_peers:
            del self._unreachable[next(iter(self._unreachable))]
        peer = self._peers.pop(raw, None)
        if peer is None:
            return
        if peer.task is not None and peer.task is not asyncio.current_task():
            peer.task.cancel()
            peer.task = None
        self._fail_peer(peer, reason)

    # -- inbound (loop thread) ------------------------------------------------------------------
    async def _accept_loop(self) -> None:
        while True:
            try:
                peer, stream = await self._node.accept()
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
        decoder = FrameDecoder(self.limits)
        try:
            magic = await stream.readexactly(len(STREAM_MAGIC))
            if magic != STREAM_MAGIC:
                raise FrameError(f"stream from {peer.hex()} is not a Monarch envelope stream")
            while True:
                data = await stream.read(self._settings.read_chunk)
                if not data:
                    break
                decoder.receive_data(data)
                while (message := decoder.next_message()) is not None:
                    envelope, buffers = message
                    if envelope.sender.pid != peer.raw:
                        raise FrameError(
                            f"process {peer.hex()} sent an envelope claiming sender "
                            f"{envelope.sender.pid.hex()}"
                        )
                    self._on_inbound(peer, envelope, buffers)
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
                stream.write_eof()  # finish our (unused) half so the stream is reclaimed
        outbound = self._peers.get(peer.raw)
        if outbound is not None and outbound.outstanding:
            # No reply can come from that process any more on this stream.
            queued = list(outbound.outstanding.values())
            outbound.outstanding.clear()
            for envelope in queued:
                self._bounce(envelope, f"process {peer.hex()} closed its stream to this one")

    def _on_inbound(self, peer: Pid, envelope: Envelope, buffers: list[bytes | bytearray]) -> None:
        target = envelope.target.pid
        if target != self._pid.raw and not (self._hosts is not None and self._hosts(target)):
            _log.warning("dropping an envelope for %s (not hosted here)", target.hex())
            return
        if envelope.kind in (MessageKind.PORT_VALUE, MessageKind.PORT_ERROR):
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
            writers = [p.task for p in self._peers.values() if p.task is not None]
            if writers:
                await asyncio.wait(writers, timeout=self._settings.flush_timeout)
            self._shut = True
            accept, self._accept_task = self._accept_task, None
            if accept is not None:
                accept.cancel()
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
            for task in list(self._inbound):
                task.cancel()
        finally:
            self._closed_event.set()
