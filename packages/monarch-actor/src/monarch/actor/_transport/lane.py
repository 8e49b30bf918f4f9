"""Direct lanes, the I/O part: listeners, authenticated handshakes, and the lane sockets.

Why (see ``lane_proto`` for the protocol): a lane carries one sender's envelopes to one
receiving process outside QUIC. ``LaneManager`` is one process's side of it: it answers
``Hello`` with an ``Offer`` (opening its listener lazily), dials offered lanes, and runs both
halves of the handshake. Everything runs on the runtime loop.

- Unix lanes (same host key: boot id and network namespace) use an abstract socket name
  (nothing in the file system; it disappears with the process) and raw non-blocking sockets
  driven by ``add_reader``/``add_writer``: a frame is written with one ``sendmsg`` when the socket
  accepts it, so the hot path has no task switch. Buffers of at least ``shm_threshold`` bytes go
  through pooled, sealed memfd slots passed with ``SCM_RIGHTS`` (``shm``); the receiver copies
  a ``bytes`` out of a view of the slot it keeps (``shm.SlotViews``, bounded by
  ``shm_views``) or reads a ``bytearray`` out, and acknowledges the slot at once, or hands an
  array or tensor a private mapping of it and acknowledges the slot when that mapping is
  freed. The acknowledgements (on the same socket) bound the shared bytes a sender has
  outstanding (``max_shm_bytes``) and let it reuse the slot; over the bound a buffer goes in a
  detached slot (the receiver's, acknowledged on receipt and given back, descriptor and all,
  when it is done with it, so that its pages are reused warm), over both bounds inline. A
  receiver that can read its sender's memory asks it once to lend its large ``bytes``
  (``LaneSettings.lend``, ``shm.PeerReader``), only when the sender's ``Hello`` named
  ``FEATURE_LEND`` (a sender of a release without it takes the request for a stray
  acknowledgement): those are read straight into the receiver's ``bytes``, one copy end to end,
  and acknowledged like slots.
- TCP lanes (another host) use ``ssl`` through asyncio streams: TLS 1.3, certificates required
  both ways and verified against the cluster roots, and the peer PID taken from the TLS leaf and
  compared with the PID the negotiation named.

Failure: a handshake that fails or times out leaves the sender on the QUIC path. An established
lane that fails (reset, end of file, hostile bytes) calls its ``on_failed``; the transport then
fails the peer exactly as a broken QUIC stream does.
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
import datetime
import errno
import itertools
import logging
import os
import socket
import ssl
import struct
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509

from chrysalis.core import Pid
from chrysalis.quic import verify_peer_chain
from monarch.actor._base.envelope import Envelope, FrameLimits
from monarch.actor._base.errors import FrameError
from monarch.actor._transport import shm as _shm
from monarch.actor._transport.lane_proto import (
    CONTEXT_ACCEPTOR,
    CONTEXT_DIALER,
    FEATURE_LEND,
    Auth,
    Hello,
    LaneDecoder,
    Offer,
    Refuse,
    decode_control,
    encode_handshake,
    handshake_length,
    host_key,
    proof_bytes,
    sign,
    verify_signature,
)

__all__ = ["LaneManager", "LaneSettings", "TcpLane", "UnixLane"]

_log = logging.getLogger("monarch.actor.lane")
_ACK = struct.Struct(">I")
_IOV_MAX: Final = 512
_FDS_PER_RECV: Final = 64
#: Room for the descriptors of one ``recvmsg`` (asked on every read: computed once).
_ANCSIZE: Final = socket.CMSG_SPACE(_FDS_PER_RECV * 4)
_FDS_PER_SEND: Final = 32  # well under what one receive takes (no truncated descriptors)
_MSG_CTRUNC: Final = int(socket.MSG_CTRUNC)  # a plain int: an enum flag test costs 1 to 2 us
ZERO_SHM_HEAD: Final = b"E\x00\x00"
_GIVE_BACK: Final = _ACK.pack(0)  # slot 0 is never sent: a detached slot given back
# Never a slot number either (they run 1 .. 2**30 - 1, with DETACHED or LENT or neither, never
# both): the receiver's
# acknowledgement ring, its descriptor beside it (``shm.AckRing``).
_RING: Final = _ACK.pack(0xFFFF_FFFF)
# Nor this (LENT and DETACHED together): the receiver reads lent buffers (``shm.PeerReader``);
# sent only to a sender whose ``Hello`` named ``FEATURE_LEND``.
_LEND_VALUE: Final = 0xFFFF_FFFE
_LEND: Final = _ACK.pack(_LEND_VALUE)
_PEER_GONE: Final = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN})
_MAX_KEPT: Final = 64  # detached slots a receiver keeps open to give back, per lane

MessageCallback = Callable[[Envelope, list[Any]], None]
EndCallback = Callable[[str | None], None]


@dataclass(frozen=True, slots=True)
class LaneSettings:
    """Bounds and choices of the lanes of one transport.

    Attributes:
        kinds: lane kinds this process offers and accepts (``"unix"``, ``"tcp"``).
        handshake_timeout: seconds a lane handshake may take.
        max_pending: offers and handshaken lanes waiting for their ``Switch``.
        shm_threshold: buffers of at least this many bytes travel as shared memory on Unix
            lanes (0: never).
        max_shm_bytes: shared bytes a sender may have in flight on one lane in its own slots
            (sent and not yet acknowledged: read, or a mapping of them freed, by the receiver)
            and, as much again, in detached slots not yet received; its own slots, in flight
            and free, hold at most twice this.
        max_fds: descriptors received and not yet claimed by a frame.
        shm_views: bytes of read-only mappings of a sender's slots that a Unix lane's
            receiver keeps, to copy the ``bytes`` it receives out of them (``shm.SlotViews``;
            they keep those slots' memory alive until dropped; 0: ``pread`` instead).
        heap_retain: freed memory this process's malloc keeps in its heap once a Unix lane
            read a shared-memory buffer into the process's own memory (``shm.retain_heap``:
            without it every 1 MiB ``bytes`` received faulted its pages in again; 0: leave
            malloc as it is).
        lend: a Unix lane's receiver that can read its sender's memory (``shm.PeerReader``)
            asks it to lend its large ``bytes`` instead of copying them into slots: one copy
            end to end. A sender names ``FEATURE_LEND`` in its ``Hello`` only where this is on
            (and shared memory is), and a receiver asks only a sender that named it (``False``
            on either side: every large buffer goes through a slot; the ``lane_lend_bytes``
            setting, ``MONARCH_LANE_LEND_BYTES``).
        tcp_host: address the TCP listener binds and offers (``None``: no TCP lanes offered).
        force_tcp: offer TCP even to processes on this host (tests).
    """

    kinds: tuple[str, ...] = ("unix", "tcp")
    handshake_timeout: float = 5.0
    max_pending: int = 1024
    shm_threshold: int = 256 * 1024
    max_shm_bytes: int = 64 * 1024 * 1024
    max_fds: int = 1024
    shm_views: int = 32 * 1024 * 1024
    heap_retain: int = 16 * 1024 * 1024
    lend: bool = True
    tcp_host: str | None = None
    force_tcp: bool = False

    def __post_init__(self) -> None:
        if (
            self.handshake_timeout <= 0
            or min(self.max_pending, self.max_fds, self.max_shm_bytes) < 1
            or self.shm_threshold < 0
            or self.heap_retain < 0
            or self.shm_views < 0
            or not set(self.kinds) <= {"unix", "tcp"}
        ):
            raise ValueError(f"invalid lane settings {self!r}")


def _uses_shm(settings: LaneSettings) -> bool:
    """Whether a Unix lane of this process moves large buffers as shared memory (slots or
    loans): a threshold set and memfd shared memory available here."""
    return settings.shm_threshold > 0 and _shm.available()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _check_auth(
    auth: Auth, roots: Sequence[x509.Certificate], expected: bytes, data: bytes
) -> None:
    """Chain to the roots, PID equal to ``expected``, signature over ``data``."""
    try:
        pid = verify_peer_chain(list(auth.chain), roots, now=_now())
    except ValueError as exc:
        raise FrameError(f"lane peer certificate refused: {exc}") from None
    if pid.raw != expected:
        raise FrameError(f"lane peer is {pid.hex()}, expected {expected.hex()}")
    leaf = x509.load_der_x509_certificate(auth.chain[0])
    verify_signature(leaf.public_key(), auth.signature, data)


async def _read_message(reader: Callable[[int], Any]) -> Any:
    length = handshake_length(await reader(4))
    return decode_control(await reader(length))


def _sock_reader(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> Callable[[int], Any]:
    async def read(n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = await loop.sock_recv(sock, n - len(data))
            if not chunk:
                raise ConnectionError("the lane closed during its handshake")
            data += chunk
        return bytes(data)

    return read


@dataclass
class _Pending:
    peer: bytes
    dialer_nonce: bytes
    nonce: bytes
    kind: str
    deadline: float
    lends: bool = False  # the dialer's Hello named FEATURE_LEND


class UnixLane:
    """One established Unix lane (either end). Loop thread only.

    Outbound: ``send_frame(pieces, fds, nbytes)`` writes at once when the socket accepts it and
    buffers the rest (the transport bounds what it hands over); ``on_written(nbytes)`` reports
    each frame handed to the kernel, ``on_failed(reason)`` the end of the lane. Inbound:
    ``start(on_message, on_end)`` begins reading; ``peer_lends`` (the sender's ``Hello`` named
    ``FEATURE_LEND``) allows it to ask the sender to lend.
    """

    shm: bool = True
    direct = True

    def __init__(
        self,
        sock: socket.socket,
        loop: asyncio.AbstractEventLoop,
        peer: bytes,
        settings: LaneSettings,
        limits: FrameLimits | None = None,
        *,
        peer_lends: bool = False,
    ) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = loop
        self.peer = peer
        self._settings = settings
        self._limits = limits
        self._out: collections.deque[list[Any]] = collections.deque()
        self._writing = False
        self._corked = False
        self._closed = False
        self.on_written: Callable[[int], None] = lambda _n: None
        self.on_failed: Callable[[str], None] = lambda _r: None
        self._ack_buf = bytearray()
        self._pending_acks: list[int] = []
        self._returned: collections.deque[int] = collections.deque()  # given-back descriptors
        self._kept = 0  # detached slots held by received objects, to be given back
        self._heap_ready = False  # shm.retain_heap called (once a buffer was read out)
        self.views = _shm.SlotViews(settings.shm_views) if settings.shm_views else None
        self._decoder: LaneDecoder | None = None
        self._on_message: MessageCallback | None = None
        self._on_end: EndCallback | None = None
        self.shm = _uses_shm(settings)
        self.pool = _shm.ShmPool(settings.max_shm_bytes)
        self.pool.on_fault = self._pool_fault
        self._ring: _shm.AckRing | None = None  # receiver: acknowledgements without a write
        self._ring_failed = False  # receiver: no ring here (acknowledgements on the socket)
        self._reader: _shm.PeerReader | None = None  # receiver: reads lent buffers
        self._peer_lends = peer_lends  # receiver: the sender understands a request to lend
        self.lend = False
        """(sender) The receiver reads lent ``bytes`` (``shm.PeerReader``): lend them."""
        self._peer_gone = False  # (sender) the receiver's end closed: it reads nothing more

    @property
    def closed(self) -> bool:
        return self._closed

    # -- outbound -----------------------------------------------------------------------------
    def start_sender(self) -> None:
        """Watch the socket for acknowledgements and its end (the receiver writes nothing
        else)."""
        self._loop.add_reader(self._fd, self._on_acks)

    @property
    def shm_outstanding(self) -> int:
        """Shared bytes sent on this lane and not yet acknowledged."""
        return self.pool.outstanding

    @property
    def lending(self) -> bool:
        """(sender) Lent buffers the receiver has not yet read."""
        return self.pool.lending

    def send_direct(self, pieces: Sequence[Any], fds: Sequence[int] | None) -> None:
        """Write a frame from any thread while nothing else is queued (the caller serialises
        callers and guarantees ``idle``): one ``sendmsg``; a remainder is queued and the loop
        is asked to finish it. Errors are reported on the loop."""
        try:
            if fds:
                ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                sent = self._sock.sendmsg(pieces, ancillary)
            else:
                sent = self._sock.sendmsg(pieces)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            for fd in fds or ():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._loop.call_soon_threadsafe(
                self._fail, f"the lane to {self.peer.hex()} broke: {exc}"
            )
            return
        if sent and fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            fds = None
        for piece in pieces:
            size = len(piece) if type(piece) is bytes else memoryview(piece).nbytes
            if sent >= size:
                sent -= size
                continue
            rest = memoryview(piece).cast("B")[sent:] if sent else piece
            sent = 0
            self._out.append([rest, fds, 0])
            fds = None
        if self._out:
            self._loop.call_soon_threadsafe(self._arm_writer)

    def _arm_writer(self) -> None:
        if self._out and not self._writing and not self._closed:
            self._writing = True
            self._loop.add_writer(self._fd, self._flush)

    def send_frame(self, pieces: Sequence[Any], fds: Sequence[int] | None, nbytes: int) -> None:
        if self._closed:
            raise ConnectionError("the lane is closed")
        out = self._out
        last = len(pieces) - 1
        for i, piece in enumerate(pieces):
            out.append([piece, fds if i == 0 else None, nbytes if i == last else 0])
        if not self._writing and not self._corked:
            self._flush()

    def cork(self) -> None:
        """Hold frames handed over until ``uncork`` (loop thread): a batch of frames then goes
        out in as few ``sendmsg`` calls as the iovec limit allows."""
        self._corked = True

    def uncork(self) -> None:
        """Write what ``cork`` held (loop thread)."""
        self._corked = False
        if self._out and not self._writing and not self._closed:
            self._flush()

    def _flush(self) -> None:
        out = self._out
        sock = self._sock
        while out:
            first = out[0]
            fds = list(first[1]) if first[1] else []
            carriers = [first] if fds else []
            batch = [first[0]]
            # Frames with descriptors share one sendmsg too: the descriptors of every frame of
            # the batch travel with its first byte (so they arrive before or with their frames,
            # and the receiver claims them in order), at most _FDS_PER_SEND of them.
            for entry in itertools.islice(out, 1, _IOV_MAX):
                if entry[1] is not None:
                    if len(fds) + len(entry[1]) > _FDS_PER_SEND:
                        break
                    fds.extend(entry[1])
                    carriers.append(entry)
                batch.append(entry[0])
            try:
                if fds:
                    sent = sock.sendmsg(
                        batch, [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    )
                else:
                    sent = sock.sendmsg(batch)
            except (BlockingIOError, InterruptedError):
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(self._fd, self._flush)
                return
            except OSError as exc:
                self._fail(f"the lane to {self.peer.hex()} broke: {exc}")
                return
            if fds:  # passed, whatever part of the bytes was written
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                for entry in carriers:
                    entry[1] = None
            while sent:
                entry = out[0]
                piece = entry[0]
                size = len(piece) if type(piece) is bytes else memoryview(piece).nbytes
                if sent >= size:
                    sent -= size
                    out.popleft()
                    if entry[2]:
                        self.on_written(entry[2])
                else:
                    entry[0] = memoryview(entry[0]).cast("B")[sent:]
                    sent = 0
            # Empty pieces are popped without being written.
            while out and memoryview(out[0][0]).nbytes == 0 and out[0][1] is None:
                entry = out.popleft()
                if entry[2]:
                    self.on_written(entry[2])
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)

    def _on_acks(self) -> None:
        try:
            data, ancdata, _flags, _addr = self._sock.recvmsg(
                4096, socket.CMSG_SPACE(_FDS_PER_RECV * 4), socket.MSG_CMSG_CLOEXEC
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            # only a reset or closed end says the receiver reads nothing more (its loans may
            # be dropped); any other error (ENOMEM, ENOBUFS) fails the lane with them parked
            self._peer_gone = exc.errno in _PEER_GONE
            self._fail(f"the lane to {self.peer.hex()} broke: {exc}")
            return
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
                self._returned.extend(fds)
        if not data:
            self._peer_gone = True
            self._fail(f"process {self.peer.hex()} closed its lane")
            return
        self._ack_buf += data
        while len(self._ack_buf) >= _ACK.size:
            (slot,) = _ACK.unpack_from(self._ack_buf)
            del self._ack_buf[: _ACK.size]
            if slot == 0:  # a detached slot given back, its descriptor beside it
                if not self._returned:
                    self._fail(f"process {self.peer.hex()} gave back a slot without its descriptor")
                    return
                self.pool.adopt(self._returned.popleft())
            elif slot == _LEND_VALUE:  # the receiver reads lent buffers from now on
                self.lend = self.shm and self._settings.lend  # unless lending is off here
            elif slot == 0xFFFF_FFFF:  # the receiver's acknowledgement ring
                if not self._returned:
                    self._fail(f"process {self.peer.hex()} sent a ring without its descriptor")
                    return
                fd = self._returned.popleft()
                try:
                    ring = _shm.AckRing.adopt(fd)
                except (_shm.ShmError, OSError, ValueError) as exc:
                    self._fail(f"process {self.peer.hex()} sent a bad acknowledgement ring: {exc}")
                    return
                finally:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self.pool.attach_ring(ring)
            elif not self.pool.release(slot):
                self._fail(f"process {self.peer.hex()} acknowledged shared memory never sent")
                return
        if len(self._returned) > _FDS_PER_RECV:
            self._fail(f"process {self.peer.hex()} sent descriptors without acknowledgements")

    # -- inbound ------------------------------------------------------------------------------
    def start(self, on_message: MessageCallback, on_end: EndCallback) -> None:
        """Begin reading frames (after the ``Switch`` was seen on the old path)."""
        assert self._limits is not None
        self._decoder = LaneDecoder(self._limits, self._settings.max_fds)
        self._on_message = on_message
        self._on_end = on_end
        if self._settings.lend and self.shm and self._peer_lends:
            self._offer_reads(self._decoder)
        self._loop.add_reader(self._fd, self._on_readable)
        self._on_readable()

    def _offer_reads(self, decoder: LaneDecoder) -> None:
        """Ask the sender to lend its large ``bytes`` when this process can read its memory
        (once, before any frame is read; kept to ourselves when the socket refuses it now).
        Only for a sender that named ``FEATURE_LEND`` (``peer_lends``): one of an earlier
        release would end the lane on this acknowledgement of a slot it never sent."""
        reader = _shm.PeerReader.open(self._sock)
        if reader is None:
            return
        try:
            sent = self._sock.send(_LEND)
            if not sent:
                raise BlockingIOError
            self._finish_ack(_LEND, sent)
        except OSError:
            reader.close()
            return
        self._reader = reader
        decoder.accept_lent()

    def _on_readable(self) -> None:
        decoder = self._decoder
        if decoder is None or self._closed:
            return
        sock = self._sock
        ancsize = _ANCSIZE
        try:
            for _ in range(16):
                view = decoder.get_buffer()
                room = view.nbytes
                try:
                    n, ancdata, flags, _addr = sock.recvmsg_into(
                        [view], ancsize, socket.MSG_CMSG_CLOEXEC
                    )
                except (BlockingIOError, InterruptedError):
                    break
                finally:
                    view.release()
                for level, kind, data in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds = array.array("i")
                        fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                        decoder.add_fds(list(fds))
                if flags & _MSG_CTRUNC:
                    raise FrameError("descriptors were truncated on the lane")
                if n == 0:
                    self._end(None)
                    return
                decoder.buffer_updated(n)
                self._drain(decoder)
                if n < room:
                    break
        except FrameError as exc:
            _log.warning("closing the lane from %s: %s", self.peer.hex(), exc)
            self._end(f"process {self.peer.hex()} sent bad bytes on its lane: {exc}")
            return
        except OSError as exc:
            self._end(f"the lane from {self.peer.hex()} broke: {exc}")
            return
        if self._pending_acks:
            self._send_acks()

    def _drain(self, decoder: LaneDecoder) -> None:
        assert self._on_message is not None
        while (message := decoder.next_message()) is not None:
            envelope, buffers, shm = message
            for position, (index, fd, size, slot) in enumerate(shm):
                if slot & _shm.LENT:  # every buffer of this frame was lent: ``fd`` is an address
                    self._read_lent(envelope, buffers, index, fd, size, slot)
                    continue
                # A detached slot is ours: given back to the sender when we are done with it,
                # so that its pages are reused warm (a bounded number kept open meanwhile).
                keep = -1
                if slot & _shm.DETACHED and self._kept < _MAX_KEPT:
                    with contextlib.suppress(OSError):
                        keep = os.dup(fd)
                try:
                    buffer, held = _shm.receive_buffer(
                        fd, size, envelope.buffer_kinds[index], self.views
                    )
                except (_shm.ShmError, OSError, ValueError) as exc:
                    for other in [keep] + [other for _i, other, _s, _n in shm[position + 1 :]]:
                        with contextlib.suppress(OSError):
                            if other >= 0:
                                os.close(other)
                    raise FrameError(str(exc)) from None
                buffers[index] = buffer
                if not held and not self._heap_ready:
                    self._heap_ready = True
                    _shm.retain_heap(self._settings.heap_retain)
                if slot & _shm.DETACHED:
                    self._pending_acks.append(slot)  # taken: the sender's count goes down
                    if keep >= 0:
                        if held:
                            self._kept += 1
                            weakref.finalize(buffer, self._give_back_later, keep).atexit = False
                        else:
                            self._give_back(keep)
                elif held:
                    # The object rebuilt over this mapping owns the slot: acknowledged when the
                    # mapping is freed (any thread), so the sender reuses it only then.
                    weakref.finalize(buffer, self._release_later, slot).atexit = False
                else:
                    self._pending_acks.append(slot)
            self._on_message(envelope, buffers)

    def _read_lent(
        self, envelope: Envelope, buffers: list[Any], index: int, address: int, size: int, slot: int
    ) -> None:
        """Read a lent buffer out of the sender's memory and acknowledge the loan."""
        reader = self._reader
        assert reader is not None  # the decoder accepts lent frames only with a reader
        if not envelope.buffer_kinds[index] & 1:  # KIND_READONLY: only ``bytes`` are lent
            raise FrameError("a lent buffer that is not read-only")
        try:
            buffers[index] = reader.read(address, size)
        except _shm.ShmError as exc:
            raise FrameError(str(exc)) from None
        self._pending_acks.append(slot)
        if not self._heap_ready:
            self._heap_ready = True
            _shm.retain_heap(self._settings.heap_retain)

    def _pool_fault(self, reason: str) -> None:
        """The pool refused an acknowledgement read from the ring (any thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the lane is gone too
            self._loop.call_soon_threadsafe(self._fail, f"process {self.peer.hex()} {reason}")

    def _release_later(self, slot: int) -> None:
        """A mapping that held ``slot`` was freed (any thread): acknowledge it on the loop."""
        if self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the lane is gone too
            self._loop.call_soon_threadsafe(self._ack_now, slot)

    def _give_back_later(self, fd: int) -> None:
        """A mapping of a detached slot was freed (any thread): give the slot back on the
        loop (or close it when the lane is gone)."""
        if not self._closed:
            try:
                self._loop.call_soon_threadsafe(self._give_back, fd, True)
                return
            except RuntimeError:  # the loop is closed: the lane is gone too
                pass
        with contextlib.suppress(OSError):
            os.close(fd)

    def _give_back(self, fd: int, kept: bool = False) -> None:
        """Send ``fd`` back to the sender (a ``GIVE_BACK`` acknowledgement carrying it)."""
        if kept:
            self._kept -= 1
        try:
            if not self._closed:
                self._send_acks()  # keep acknowledgements in order before it
                if not self._pending_acks:
                    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
                    sent = self._sock.sendmsg([_GIVE_BACK], ancillary)
                    self._finish_ack(_GIVE_BACK, sent)
        except OSError:
            pass  # not sent (a full socket, or its end): the memory goes with the descriptor
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _finish_ack(self, ack: bytes, sent: int) -> None:
        """Write the rest of ``ack`` when a send took only part of it: an acknowledgement is
        never split (as ``_send_acks``; 4 bytes, blocking briefly)."""
        if 0 < sent < len(ack):
            self._sock.setblocking(True)
            try:
                self._sock.sendall(ack[sent:])
            finally:
                self._sock.setblocking(False)

    def _ack_now(self, slot: int) -> None:
        if not self._closed:
            self._pending_acks.append(slot)
            self._send_acks()

    def _offer_ring(self) -> None:
        """Create the acknowledgement ring and pass it to the sender (once; a lane whose ring
        cannot be made or sent acknowledges on the socket)."""
        try:
            ring, fd = _shm.AckRing.create()
        except (OSError, ValueError):
            self._ring_failed = True
            return
        try:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            sent = self._sock.sendmsg([_RING], ancillary)
            self._finish_ack(_RING, sent)
        except (BlockingIOError, InterruptedError):
            ring.close()  # tried again with the next acknowledgements
            return
        except OSError:
            ring.close()
            self._ring_failed = True
            return
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ring = ring

    def _send_acks(self) -> None:
        acks = self._pending_acks
        if self._ring is None and not self._ring_failed and not self._closed:
            self._offer_ring()
        ring = self._ring
        if ring is not None:
            pushed = 0
            for slot in acks:
                if not ring.push(slot):
                    break  # full: the rest take the socket
                pushed += 1
            del acks[:pushed]
            if not acks:
                return
        data = b"".join(_ACK.pack(slot) for slot in acks)
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            return  # retried after the next read
        except OSError:
            return  # the read side reports the end
        whole, part = divmod(sent, _ACK.size)
        if part:  # never split an acknowledgement: finish it now (4 bytes, blocking briefly)
            with contextlib.suppress(OSError):
                self._sock.setblocking(True)
                self._sock.sendall(data[sent : (whole + 1) * _ACK.size])
                self._sock.setblocking(False)
            whole += 1
        del acks[:whole]

    # -- both ---------------------------------------------------------------------------------
    def _fail(self, reason: str) -> None:
        if self._closed:
            return
        self.close()
        self.on_failed(reason)

    def _end(self, reason: str | None) -> None:
        if self._closed:
            return
        self.close()
        if self._on_end is not None:
            self._on_end(reason)

    def close(self) -> None:
        """Close the socket and release queued descriptors (idempotent, no callbacks)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
        with contextlib.suppress(Exception):
            self._loop.remove_writer(self._fd)
        for entry in self._out:
            for fd in entry[1] or ():
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._out.clear()
        if self._decoder is not None:
            self._decoder.close()
        if self.views is not None:
            self.views.close()
        self.pool.close(park=not self._peer_gone)
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self._reader is not None:
            self._reader.close()
        while self._returned:
            with contextlib.suppress(OSError):
                os.close(self._returned.popleft())
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    @property
    def idle(self) -> bool:
        """Nothing left to write."""
        return not self._out


class TcpLane:
    """One established TLS-over-TCP lane (either end), same interface as ``UnixLane``
    (no shared memory). Writes go through a writer task that waits for ``drain``."""

    shm = False
    direct = False
    lend = False
    lending = False

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: bytes,
        settings: LaneSettings,
        limits: FrameLimits | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.peer = peer
        self._settings = settings
        self._limits = limits
        self._out: collections.deque[tuple[Sequence[Any], int]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._read_task: asyncio.Task[None] | None = None
        self._closed = False
        self.on_written: Callable[[int], None] = lambda _n: None
        self.on_failed: Callable[[str], None] = lambda _r: None
        self.pool = _shm.ShmPool(1)

    @property
    def shm_outstanding(self) -> int:
        return 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def idle(self) -> bool:
        return not self._out and self._task is None

    def start_sender(self) -> None:
        self._read_task = asyncio.get_running_loop().create_task(self._watch())

    def send_direct(self, pieces: Sequence[Any], fds: Sequence[int] | None) -> None:
        raise NotImplementedError("TCP lanes are written by their writer task only")

    def send_frame(self, pieces: Sequence[Any], fds: Sequence[int] | None, nbytes: int) -> None:
        if self._closed:
            raise ConnectionError("the lane is closed")
        if fds:
            raise ValueError("a TCP lane cannot carry descriptors")
        self._out.append((pieces, nbytes))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write_loop())

    async def _write_loop(self) -> None:
        try:
            while self._out:
                pieces, nbytes = self._out.popleft()
                self._writer.writelines(pieces)
                await self._writer.drain()
                self.on_written(nbytes)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(f"the lane to {self.peer.hex()} broke: {exc}")
        finally:
            self._task = None

    async def _watch(self) -> None:
        try:
            data = await self._reader.read(1)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(f"the lane to {self.peer.hex()} broke: {exc}")
            return
        self._fail(
            f"process {self.peer.hex()} closed its lane"
            if not data
            else f"process {self.peer.hex()} wrote on the receive side of its lane"
        )

    def start(self, on_message: MessageCallback, on_end: EndCallback) -> None:
        assert self._limits is not None
        self._read_task = asyncio.get_running_loop().create_task(
            self._read_loop(LaneDecoder(self._limits, 0), on_message, on_end)
        )

    async def _read_loop(
        self, decoder: LaneDecoder, on_message: MessageCallback, on_end: EndCallback
    ) -> None:
        reason: str | None = None
        try:
            while True:
                view = decoder.get_buffer()
                data = await self._reader.read(view.nbytes)
                if not data:
                    view.release()
                    break
                n = len(data)
                view[:n] = data
                view.release()
                decoder.buffer_updated(n)
                while (message := decoder.next_message()) is not None:
                    envelope, buffers, _shm_list = message
                    on_message(envelope, buffers)
        except asyncio.CancelledError:
            raise
        except FrameError as exc:
            _log.warning("closing the lane from %s: %s", self.peer.hex(), exc)
            reason = f"process {self.peer.hex()} sent bad bytes on its lane: {exc}"
        except Exception as exc:
            reason = f"the lane from {self.peer.hex()} broke: {exc}"
        if not self._closed:
            self.close()
            on_end(reason)

    def _fail(self, reason: str) -> None:
        if self._closed:
            return
        self.close()
        self.on_failed(reason)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            current = asyncio.current_task()
        except RuntimeError:
            current = None
        for task in (self._task, self._read_task):
            if task is not None and task is not current:
                task.cancel()
        self._out.clear()
        with contextlib.suppress(Exception):
            self._writer.close()


Lane = UnixLane | TcpLane


class LaneManager:
    """One process's lanes: offers, listeners and handshakes (loop thread only).

    ``identity`` is the process's ``chrysalis.quic.Identity`` (its chain and key prove the
    process on a lane; its roots judge the peer). ``on_accepted(token, lane)`` receives each
    inbound lane whose handshake succeeded; the transport holds it until the ``Switch``.
    """

    def __init__(
        self,
        identity: Any,
        settings: LaneSettings,
        limits: Callable[[], FrameLimits],
        on_accepted: Callable[[bytes, Lane], None],
    ) -> None:
        self._identity = identity
        self._pid: bytes = identity.pid.raw
        self.settings = settings
        self._limits = limits
        self._on_accepted = on_accepted
        self.host = host_key()
        self._pending: collections.OrderedDict[bytes, _Pending] = collections.OrderedDict()
        self._unix: socket.socket | None = None
        self._unix_name = ""
        self._tcp: asyncio.Server | None = None
        self._tcp_port = 0
        self._handshakes: set[asyncio.Task[None]] = set()
        self._ssl_server: ssl.SSLContext | None = None
        self._ssl_client: ssl.SSLContext | None = None
        self._chain = tuple(c.public_bytes(_der()) for c in identity.chain)
        self._closed = False

    # -- dialer side ----------------------------------------------------------------------------
    def hello(self) -> tuple[Hello, bytes]:
        """The ``Hello`` to send, and its nonce (kept by the caller for the proof)."""
        nonce = os.urandom(32)
        settings = self.settings
        # Named only where this process would lend when asked (``UnixLane._on_acks``).
        lends = settings.lend and _uses_shm(settings)
        features = (FEATURE_LEND,) if lends and "unix" in settings.kinds else ()
        return Hello(1, self.host, nonce, settings.kinds, features), nonce

    async def dial(self, peer: bytes, offer: Offer, nonce: bytes) -> Lane:
        """Connect and authenticate the offered lane (bounded by ``handshake_timeout``)."""
        return await asyncio.wait_for(
            self._dial(peer, offer, nonce), self.settings.handshake_timeout
        )

    async def _dial(self, peer: bytes, offer: Offer, nonce: bytes) -> Lane:
        loop = asyncio.get_running_loop()
        proof = Auth(
            offer.token,
            self._chain,
            sign(
                self._identity.private_key,
                proof_bytes(CONTEXT_DIALER, nonce, offer.nonce, self._pid, peer, offer.token),
            ),
        )
        expected = proof_bytes(CONTEXT_ACCEPTOR, nonce, offer.nonce, self._pid, peer, offer.token)
        if offer.kind == "unix" and "unix" in self.settings.kinds:
            if not offer.address.startswith("@"):
                raise FrameError("a Unix lane offer must name an abstract socket")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, "\0" + offer.address[1:])
                await loop.sock_sendall(sock, encode_handshake(proof))
                answer = await _read_message(_sock_reader(loop, sock))
                self._check_answer(answer, peer, expected)
            except BaseException:
                sock.close()
                raise
            lane: Lane = UnixLane(sock, loop, peer, self.settings)
            return lane
        if offer.kind == "tcp" and "tcp" in self.settings.kinds:
            reader, writer = await asyncio.open_connection(
                offer.address, offer.port, ssl=self._client_context(),
                server_hostname=offer.address,
            )  # fmt: skip
            try:
                _check_tls_peer(writer, peer)
                writer.write(encode_handshake(proof))
                answer = await _read_message(reader.readexactly)
                self._check_answer(answer, peer, expected)
            except BaseException:
                writer.close()
                raise
            return TcpLane(reader, writer, peer, self.settings)
        raise FrameError(f"lane kind {offer.kind!r} is not accepted here")

    def _check_answer(self, answer: Any, peer: bytes, expected: bytes) -> None:
        if isinstance(answer, Refuse):
            raise FrameError(f"process {peer.hex()} refused the lane: {answer.reason}")
        if not isinstance(answer, Auth):
            raise FrameError("unexpected lane handshake message")
        _check_auth(answer, self._identity.roots, peer, expected)

    # -- acceptor side --------------------------------------------------------------------------
    def offer(self, peer: bytes, hello: Hello, now: float) -> Offer:
        """The answer to ``hello`` from ``peer`` (a no-lane offer when none fits)."""
        token = os.urandom(16)
        nonce = os.urandom(32)
        none = Offer("", "", 0, nonce, token)
        if self._closed or hello.version != 1:
            return none
        self._expire(now)
        if len(self._pending) >= self.settings.max_pending:
            return none
        kind = ""
        same_host = bool(self.host) and hello.host == self.host and not self.settings.force_tcp
        if same_host and "unix" in hello.kinds and "unix" in self.settings.kinds:
            try:
                self._ensure_unix()
            except OSError as exc:
                _log.debug("no Unix lane listener: %s", exc)
            else:
                kind = "unix"
        if (
            not kind
            and "tcp" in hello.kinds
            and "tcp" in self.settings.kinds
            and self.settings.tcp_host is not None
            and self._tcp is not None
        ):
            kind = "tcp"
        if not kind:
            return none
        self._pending[token] = _Pending(
            peer, hello.nonce, nonce, kind, now + self.settings.handshake_timeout,
            FEATURE_LEND in hello.features,
        )  # fmt: skip
        if kind == "unix":
            return Offer("unix", "@" + self._unix_name, 0, nonce, token)
        assert self.settings.tcp_host is not None
        return Offer("tcp", self.settings.tcp_host, self._tcp_port, nonce, token)

    def forget(self, token: bytes) -> None:
        """Refuse a later handshake for ``token`` (the stream that negotiated it ended)."""
        self._pending.pop(token, None)

    def _expire(self, now: float) -> None:
        while self._pending:
            token, pending = next(iter(self._pending.items()))
            if pending.deadline > now:
                break
            del self._pending[token]

    def _ensure_unix(self) -> None:
        if self._unix is not None:
            return
        name = f"monarch-lane/{self._pid.hex()}/{os.urandom(8).hex()}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("\0" + name)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._unix, self._unix_name = sock, name
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept_unix)

    async def start_tcp(self) -> None:
        """Open the TLS listener on ``tcp_host`` (call once on the loop when TCP lanes are on)."""
        if self.settings.tcp_host is None or "tcp" not in self.settings.kinds or self._tcp:
            return
        self._tcp = await asyncio.start_server(
            self._accept_tcp, self.settings.tcp_host, 0, ssl=self._server_context(),
            ssl_handshake_timeout=self.settings.handshake_timeout, limit=256 * 1024,
        )  # fmt: skip
        self._tcp_port = self._tcp.sockets[0].getsockname()[1]

    def _accept_unix(self) -> None:
        assert self._unix is not None
        for _ in range(16):
            try:
                conn, _addr = self._unix.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                _log.warning("Unix lane listener: %s", exc)
                return
            if len(self._handshakes) >= self.settings.max_pending:
                conn.close()
                continue
            self._track(self._handshake_unix(conn))

    def _track(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake_unix(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        try:
            async with asyncio.timeout(self.settings.handshake_timeout):
                auth = await _read_message(_sock_reader(loop, conn))
                answer, token, peer, lends = self._judge(auth, "unix")
                await loop.sock_sendall(conn, encode_handshake(answer))
        except (Exception, asyncio.CancelledError) as exc:
            _log.debug("Unix lane handshake failed: %r", exc)
            conn.close()
            return
        if token is None:
            conn.close()
            return
        lane = UnixLane(conn, loop, peer, self.settings, self._limits(), peer_lends=lends)
        self._on_accepted(token, lane)

    async def _accept_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.settings.handshake_timeout):
                tls_peer = _tls_peer(writer)
                auth = await _read_message(reader.readexactly)
                answer, token, peer, _lends = self._judge(auth, "tcp", tls_peer)
                writer.write(encode_handshake(answer))
                await writer.drain()
        except (Exception, asyncio.CancelledError) as exc:
            _log.debug("TCP lane handshake failed: %r", exc)
            writer.close()
            return
        if token is None:
            writer.close()
            return
        self._on_accepted(token, TcpLane(reader, writer, peer, self.settings, self._limits()))

    def _judge(
        self, auth: Any, kind: str, tls_peer: bytes | None = None
    ) -> tuple[Auth | Refuse, bytes | None, bytes, bool]:
        """Check a dialer's ``Auth``; the answer to send, and the token, the peer and whether
        its ``Hello`` named ``FEATURE_LEND`` when accepted."""
        if not isinstance(auth, Auth):
            return Refuse("expected an Auth message"), None, b"", False
        pending = self._pending.pop(auth.token, None)
        if pending is None or pending.kind != kind:
            return Refuse("unknown or expired lane token"), None, b"", False
        if tls_peer is not None and tls_peer != pending.peer:
            refusal = Refuse("the TLS peer is not the process that negotiated this lane")
            return refusal, None, b"", False
        try:
            _check_auth(
                auth, self._identity.roots, pending.peer,
                proof_bytes(CONTEXT_DIALER, pending.dialer_nonce, pending.nonce, pending.peer,
                            self._pid, auth.token),
            )  # fmt: skip
        except FrameError as exc:
            return Refuse(str(exc)), None, b"", False
        signature = sign(
            self._identity.private_key,
            proof_bytes(CONTEXT_ACCEPTOR, pending.dialer_nonce, pending.nonce, pending.peer,
                        self._pid, auth.token),
        )  # fmt: skip
        return Auth(auth.token, self._chain, signature), auth.token, pending.peer, pending.lends

    # -- TLS ------------------------------------------------------------------------------------
    def _load_chain(self, context: ssl.SSLContext) -> None:
        fd = os.memfd_create("monarch-lane-identity", os.MFD_CLOEXEC)
        try:
            os.write(fd, self._identity.chain_pem() + self._identity.key_pem())
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        context.load_verify_locations(cadata=self._identity.roots_pem().decode("ascii"))
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.verify_mode = ssl.CERT_REQUIRED

    def _server_context(self) -> ssl.SSLContext:
        if self._ssl_server is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._load_chain(context)
            self._ssl_server = context
        return self._ssl_server

    def _client_context(self) -> ssl.SSLContext:
        if self._ssl_client is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False  # the peer PID (hash of its leaf) is checked instead
            self._load_chain(context)
            self._ssl_client = context
        return self._ssl_client

    def close(self) -> None:
        """Stop listening and abandon handshakes in progress (idempotent)."""
        self._closed = True
        self._pending.clear()
        if self._unix is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._unix.fileno())
            self._unix.close()
            self._unix = None
        if self._tcp is not None:
            self._tcp.close()
            self._tcp = None
        for task in list(self._handshakes):
            task.cancel()


def _der() -> Any:
    from cryptography.hazmat.primitives import serialization

    return serialization.Encoding.DER


def _tls_peer(writer: asyncio.StreamWriter) -> bytes:
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        raise FrameError("the TLS peer presented no certificate")
    return Pid.from_certificate(der).raw


def _check_tls_peer(writer: asyncio.StreamWriter, expected: bytes) -> None:
    got = _tls_peer(writer)
    if got != expected:
        raise FrameError(f"the TLS peer is {got.hex()}, expected {expected.hex()}")
