"""The UDP carrier: a non-blocking kernel UDP socket with GSO sends and GRO receives.

Why it looks like this: in Python the per-datagram system-call cost dominates (about 4.6 us per
plain 1,200-byte send and 1.6 us per receive on the reference machine, against 0.3 / 0.23 us with
segmentation offload). So segmented transmits go out as *one* ``sendmsg`` carrying a
``UDP_SEGMENT`` control message (the kernel splits them; "GSO"), and the receive side turns on
``UDP_GRO`` so the kernel hands over up to 64 KiB of same-size datagrams in one ``recvmsg`` with
the segment size in a control message; that buffer becomes one :class:`DatagramRecvMeta` with
``stride < length``. Python 3.11 has no constants for these, hence the Linux numbers below.

Detection: GSO support is probed once per process and address family (``getsockopt
UDP_SEGMENT``); GRO is switched on per socket (``setsockopt UDP_GRO``) and used when that
succeeds. If a GSO send later fails with ``EIO`` / ``ENOPROTOOPT`` / ``EOPNOTSUPP`` (a device
without checksum offload, a kernel without support) the socket remembers and falls back to one
``sendto`` per datagram; ``EINVAL`` / ``EMSGSIZE`` (a segment too big for the path) fall back
for that call only. ``gso=`` / ``gro=`` force either way.

Batched receives: without GRO, ``try_recv`` takes a whole batch with one ``recvmmsg`` call
(through ctypes, Linux) straight into the caller's buffers
(:class:`~chrysalis.datagram._recvmmsg.BatchReceiver`: headers cached per buffer list, a cached
``bytearray`` cannot be resized until ``release_buffers()`` or shutdown); after a
single-datagram batch, with GRO, and where recvmmsg is missing, it receives one datagram (or
aggregate) per call as before. For the datagram switch :meth:`UdpSocket._recv_into_ring` fills
a :class:`~chrysalis.datagram._mmsg.RecvRing` (32 ring-owned buffers) with one call.

Bounds: a GSO call carries at most 32 datagrams (:data:`DATAGRAM_BATCH_SIZE`, below the kernel's
64) and at most 65,507 bytes; a ``try_recv`` call performs at most 32 receives; the source
address cache and the destination sockaddr cache hold at most 4,096 entries each (emptied when
full). Any receive error other than "would block" shuts the
socket down before it is raised. ECN codepoints are neither sent nor reported.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
from collections.abc import Sequence
from typing import Any, Final

from chrysalis.core import UDP_SCHEME, AddressError, DatagramAddr
from chrysalis.datagram._mmsg import RecvRing, _udp_source, recv_ring_supported
from chrysalis.datagram._recvmmsg import BatchReceiver
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    AddressInUseError,
    AddressNotAvailableError,
    Buffer,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InvalidDataError,
    ShutdownState,
    SocketClosedError,
    UnsupportedSchemeError,
    Waker,
    mapped_buffers,
)

__all__ = [
    "DEFAULT_UDP_BUFFER_SIZE",
    "GRO_MAX_RECEIVE_SEGMENTS",
    "UdpSocket",
    "udp_gso_supported",
]

SOL_UDP: Final = 17
UDP_SEGMENT: Final = 103
UDP_GRO: Final = 104

#: Requested SO_RCVBUF / SO_SNDBUF; the kernel may grant less (``net.core.rmem_max``).
DEFAULT_UDP_BUFFER_SIZE: Final = 8 << 20
#: ``max_receive_segments`` with GRO: a 64 KiB aggregate of 1,200-byte QUIC datagrams.
GRO_MAX_RECEIVE_SEGMENTS: Final = 65535 // 1200

_GSO_MAX_BYTES: Final = 65507  # largest UDP payload over IPv4 (IPv6 allows a little more)
_GRO_BUFFER_SIZE: Final = 65535
_CMSG_SPACE: Final = socket.CMSG_SPACE(4)
_MSG_TRUNC: Final = int(socket.MSG_TRUNC)
_new_object: Final = object.__new__
_NOTHING: Final = object()  # a placeholder that is equal to nothing else
_INT: Final = struct.Struct("@i")
_U16: Final = struct.Struct("@H")
_SOURCE_CACHE_LIMIT: Final = 4096
_SOCKADDR_CACHE_LIMIT: Final = 4096
_GSO_DISABLE_ERRNOS: Final = frozenset({errno.EIO, errno.ENOPROTOOPT, errno.EOPNOTSUPP})
_GSO_RETRY_PLAIN_ERRNOS: Final = frozenset({errno.EINVAL, errno.EMSGSIZE})
_SCHEMES: Final = (UDP_SCHEME,)
_TAG_BY_FAMILY: Final = {socket.AF_INET: 0x04, socket.AF_INET6: 0x06}
#: One source slot of a batched receive: ``sizeof(struct sockaddr_in6)`` (28) rounded up to 8.
_NAME_SLOT: Final = 32
#: ``sizeof(struct sockaddr_in)`` less the family: what a batch reports for an IPv4 sender.
_SOCKADDR_IN_TAIL: Final = 14

_gso_support: dict[int, bool] = {}


def udp_gso_supported(family: int = socket.AF_INET) -> bool:
    """Whether this kernel offers UDP GSO for ``family`` (probed once per process)."""
    supported = _gso_support.get(family)
    if supported is None:
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.getsockopt(SOL_UDP, UDP_SEGMENT)
            supported = True
        except OSError:
            supported = False
        _gso_support[family] = supported
    return supported


def _set_buffer(sock: socket.socket, option: int, size: int) -> None:
    with contextlib.suppress(OSError):  # accept whatever the kernel gives
        sock.setsockopt(socket.SOL_SOCKET, option, size)


class UdpSocket(BatchReceiver, DatagramSocket):
    """A bound UDP socket (IPv4 or IPv6) implementing the :class:`DatagramSocket` contract.

    Build it with :meth:`bind`. Readiness comes from the kernel descriptor (``fileno()``);
    the wakers are called only on shutdown. ``max_transmit_segments`` is 32;
    ``max_receive_segments`` is :data:`GRO_MAX_RECEIVE_SEGMENTS` with GRO, else 1.
    """

    def __init__(self, sock: socket.socket, *, gso: bool, gro: bool) -> None:
        """Wrap an already bound ``AF_INET``/``AF_INET6`` datagram socket (made non-blocking).

        ``gso`` / ``gro`` say whether to use segmentation offload (GRO must already be
        enabled on ``sock``). Prefer :meth:`bind`, which probes both.
        """
        tag = _TAG_BY_FAMILY.get(sock.family)
        if tag is None or sock.type != socket.SOCK_DGRAM:
            raise ValueError("UdpSocket needs an AF_INET or AF_INET6 SOCK_DGRAM socket")
        sock.setblocking(False)
        self._sock = sock
        # Bound methods of the kernel socket, looked up once for the per-datagram paths.
        self._sendto = sock.sendto
        self._recvfrom_into = sock.recvfrom_into
        self._recvmsg_into = sock.recvmsg_into
        self._fd = sock.fileno()
        self._tag = tag
        self._addr = DatagramAddr.from_sockaddr(sock.getsockname())
        self._gso = gso
        self._gro = gro
        self._state = ShutdownState()
        self._deferred_error: OSError | None = None
        self._sources: dict[Any, DatagramAddr] = {}
        self._source_lookup = self._sources.get  # the dict is cleared, never replaced
        self._sockaddrs: dict[DatagramAddr, Any] = {}
        # The destination of the previous send and its sockaddr, as one tuple so that threads
        # sharing the socket never see a torn pair.
        self._last_sockaddr: tuple[object, Any] = (_NOTHING, None)
        # Mapped, not zeroed: its pages are faulted in when the first aggregates land.
        self._scratch = mapped_buffers(1, _GRO_BUFFER_SIZE)[0] if gro else None
        # try_recv's memo of the last datagram it delivered: (sockaddr, length, meta); the
        # placeholder's sockaddr equals no kernel sockaddr, so the first datagram replaces it.
        self._recv_memo: tuple[Any, int, DatagramRecvMeta] = (
            _NOTHING,
            -1,
            DatagramRecvMeta(self._addr, 0, 0),
        )
        # Batched receives without GRO (Linux): recvmmsg into the caller's buffers, see
        # _recvmmsg.py. With GRO each receive may be an aggregate: recvmsg_into as before.
        self._init_batches(_NAME_SLOT, enabled=not gro)
        # The GSO control message of the last segment size, as one (size, message) tuple:
        # replaced whole and read once per send, so concurrent senders of different segment
        # sizes never pair one size with another size's message.
        self._seg: tuple[int, list[tuple[int, int, bytes]]] = (-1, [])

    @classmethod
    def bind(
        cls,
        addr: DatagramAddr | tuple[Any, ...],
        *,
        recv_buffer: int = DEFAULT_UDP_BUFFER_SIZE,
        send_buffer: int = DEFAULT_UDP_BUFFER_SIZE,
        gso: bool | None = None,
        gro: bool | None = None,
    ) -> UdpSocket:
        """Bind a UDP socket to ``addr`` (a ``udp`` :class:`DatagramAddr` or a sockaddr tuple
        of IP literals; port 0 picks a free port).

        ``recv_buffer`` / ``send_buffer`` are requested socket buffer sizes (the kernel may
        grant less). ``gso`` / ``gro``: ``None`` uses the offload when the kernel supports it,
        ``True`` requires it (``OSError`` ``ENOPROTOOPT`` if unsupported), ``False`` never uses
        it. Raises ``AddressError`` for a malformed address, :class:`AddressInUseError` if the
        address is taken, ``OSError`` if binding fails otherwise.
        """
        if isinstance(addr, tuple):
            addr = DatagramAddr.from_sockaddr(addr)
        if not isinstance(addr, DatagramAddr):
            raise TypeError(f"addr must be a DatagramAddr or tuple, not {type(addr).__name__}")
        if addr.scheme != UDP_SCHEME:
            raise AddressError(f"UdpSocket.bind needs a udp address, got {addr}")
        family = socket.AF_INET if addr.opaque[0] == 0x04 else socket.AF_INET6
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            _set_buffer(sock, socket.SO_RCVBUF, recv_buffer)
            _set_buffer(sock, socket.SO_SNDBUF, send_buffer)
            try:
                sock.bind(addr.to_sockaddr())
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise AddressInUseError(f"udp address {addr} is in use") from error
                raise
            use_gso = udp_gso_supported(family) if gso is None else gso
            if gso and not udp_gso_supported(family):
                raise OSError(errno.ENOPROTOOPT, "UDP GSO is not supported by this kernel")
            use_gro = False
            if gro is None or gro:
                try:
                    sock.setsockopt(SOL_UDP, UDP_GRO, 1)
                    use_gro = True
                except OSError:
                    if gro:
                        raise
            return cls(sock, gso=use_gso, gro=use_gro)
        except BaseException:
            sock.close()
            raise

    # -- identity and options ------------------------------------------------------------------

    @property
    def local_addr(self) -> DatagramAddr:
        """The bound address (ephemeral port resolved)."""
        return self._addr

    @property
    def gso_enabled(self) -> bool:
        """Whether segmented sends currently use UDP GSO."""
        return self._gso

    @property
    def gro_enabled(self) -> bool:
        """Whether receives use UDP GRO (aggregates with ``stride < length``)."""
        return self._gro

    @property
    def recv_buffer_size(self) -> int:
        """The granted SO_RCVBUF in bytes."""
        return self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)

    @property
    def send_buffer_size(self) -> int:
        """The granted SO_SNDBUF in bytes."""
        return self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)

    # -- sending -------------------------------------------------------------------------------

    def _sockaddr(self, destination: DatagramAddr) -> Any:
        sockaddr = self._sockaddrs.get(destination)
        if sockaddr is None:
            sockaddr = self._new_sockaddr(destination)
        return sockaddr

    def _new_sockaddr(self, destination: DatagramAddr) -> Any:
        """Validate ``destination`` and cache its sockaddr (the cache miss of every send)."""
        if destination.scheme != UDP_SCHEME:
            raise UnsupportedSchemeError.for_scheme(destination.scheme, _SCHEMES)
        if destination.opaque[0] != self._tag:
            version = 6 if self._tag == 0x06 else 4
            raise HostUnreachableError(
                f"{destination} is not reachable from an IPv{version} socket"
            )
        sockaddr = destination.to_sockaddr()
        if len(self._sockaddrs) >= _SOCKADDR_CACHE_LIMIT:
            self._sockaddrs.clear()
        self._sockaddrs[destination] = sockaddr
        return sockaddr

    def _memo_sockaddr(self, destination: DatagramAddr) -> Any:
        """``try_send_to``'s memo miss: refuse after shutdown, look the destination up (or
        validate it), and remember it as the last destination."""
        if self._state.closed:
            raise SocketClosedError()
        sockaddr = self._sockaddrs.get(destination) or self._new_sockaddr(destination)
        self._last_sockaddr = (destination, sockaddr)
        return sockaddr

    def _send_error(self, error: OSError, size: int) -> OSError:
        if self._state.closed:
            return SocketClosedError()
        if error.errno == errno.EMSGSIZE:
            return DatagramTooLargeError(f"UDP datagram of {size} bytes is too large")
        if error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return HostUnreachableError(str(error))
        return error

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        """Send one datagram; ``False`` if the kernel buffer is full."""
        # The per-datagram path, a handful of bytecodes around the system call (issue #3):
        # the destination memo is one tuple unpacked at once (threads sharing the socket never
        # see a torn pair) and tested by identity (no Python-level __hash__); the bound
        # ``sendto`` is read as a plain attribute (a method-style call of an instance
        # attribute takes CPython's unspecialised lookup). There is no shutdown test here:
        # shutdown empties the memo, so the first send after it takes the miss path, which
        # tests; and a send that still finds a memo (a thread that raced shutdown) reaches a
        # kernel socket that is shut down (EPIPE) or closed (EBADF), which ``_send_error``
        # reports as SocketClosedError.
        last, sockaddr = self._last_sockaddr
        if last is not destination:
            sockaddr = self._memo_sockaddr(destination)
        sendto = self._sendto
        try:
            sendto(data, sockaddr)
        except BlockingIOError:
            return False
        except OSError as error:
            raise self._send_error(error, len(data)) from error
        return True

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        """Send up to 32 leading datagrams, in one GSO ``sendmsg`` when possible."""
        count = transmit.segment_count
        if count == 1:
            return 1 if self.try_send_to(transmit.contents, transmit.destination) else 0
        if self._state.closed:
            raise SocketClosedError()
        size = transmit.segment_size
        assert size is not None
        if size > MAX_DATAGRAM_SIZE:
            raise DatagramTooLargeError(f"segment of {size} bytes exceeds {MAX_DATAGRAM_SIZE}")
        sockaddr = self._sockaddr(transmit.destination)
        view = memoryview(transmit.contents)
        count = min(count, DATAGRAM_BATCH_SIZE)
        sock = self._sock
        if self._gso:
            batch = min(count, _GSO_MAX_BYTES // size)
            if batch > 1:
                seg_size, cmsg = self._seg
                if seg_size != size:
                    cmsg = [(SOL_UDP, UDP_SEGMENT, _U16.pack(size))]
                    self._seg = (size, cmsg)
                try:
                    sock.sendmsg((view[: batch * size],), cmsg, 0, sockaddr)
                    return batch
                except BlockingIOError:
                    return 0
                except OSError as error:
                    if error.errno in _GSO_DISABLE_ERRNOS:
                        self._gso = False
                    elif error.errno not in _GSO_RETRY_PLAIN_ERRNOS:
                        raise self._send_error(error, size) from error
        sent = 0
        try:
            for start in range(0, count * size, size):
                sock.sendto(view[start : start + size], sockaddr)
                sent += 1
        except BlockingIOError:
            pass
        except OSError as error:
            if sent == 0:
                raise self._send_error(error, size) from error
        return sent

    # -- receiving -----------------------------------------------------------------------------

    def _source(self, sockaddr: Any) -> DatagramAddr:
        source = self._sources.get(sockaddr)
        if source is None:
            source = self._new_source(sockaddr)
        return source

    def _new_source(self, sockaddr: Any) -> DatagramAddr:
        """Convert and cache a sockaddr tuple (the cache miss of every receive)."""
        source = DatagramAddr.from_sockaddr(sockaddr)
        if len(self._sources) >= _SOURCE_CACHE_LIMIT:
            self._sources.clear()
        self._sources[sockaddr] = source
        return source

    def _recv_failed(self, error: OSError) -> OSError:
        if self._state.closed:
            return SocketClosedError()
        self.shutdown()
        return error

    def _check_recv(self) -> None:
        if self._state.closed:
            raise SocketClosedError()
        error = self._deferred_error
        if error is not None:
            self._deferred_error = None
            raise error

    def _recv_error(self, error: OSError, filled: int) -> int:
        """Deliver a receive error: raised at once if nothing was received in this call, else
        kept for the next call. A kernel error (anything but :class:`InvalidDataError`) shuts
        the socket down first."""
        if isinstance(error, InvalidDataError):
            if filled == 0:
                raise error
            self._deferred_error = error
            return filled
        failure = self._recv_failed(error)
        if filled == 0:
            if failure is error:
                raise error
            raise failure from error
        self._deferred_error = failure
        return filled

    def _new_raw_source(self, sockaddr: bytes) -> DatagramAddr:
        """Convert and cache a kernel ``sockaddr_in`` / ``sockaddr_in6`` from a batch, less
        its 2-byte family (the cache miss of a batched receive); the length tells the family
        (14 or 26 bytes)."""
        family = socket.AF_INET if len(sockaddr) == _SOCKADDR_IN_TAIL else socket.AF_INET6
        source = _udp_source(family, b"\0\0" + sockaddr)
        if len(self._sources) >= _SOURCE_CACHE_LIMIT:
            self._sources.clear()
        self._sources[sockaddr] = source
        return source

    def _unnamed_error(self) -> OSError:
        return AddressNotAvailableError("UDP datagram without a source address")

    def _recv_each(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """``try_recv`` without batches: with GRO each buffer of at least 64 KiB may receive
        an aggregate (smaller buffers get whole segments of one); without, one
        ``recvfrom_into`` per datagram."""
        if self._state.closed or self._deferred_error is not None:
            self._check_recv()  # raises
        if self._gro:
            return self._try_recv_gro(buffers, metas)
        # The per-datagram loop (no GRO, so never a split remainder). It runs once or twice
        # per readiness wake, so both the "nothing ready" call and each datagram are kept
        # short: the first receive comes before any set-up, everything the loop touches is a
        # local, sources are cached by the kernel's sockaddr tuple (and the last one is reused
        # without a lookup while the sender stays the same), MSG_TRUNC is a plain int
        # (an IntFlag operand would run Python-level enum code), and metas are built without
        # a Python-level __init__ call (see DatagramRecvMeta).
        limit = len(buffers)
        if limit == 0:
            return 0
        recv = self._recvfrom_into
        buffer = buffers[0]
        try:
            size, sockaddr = recv(buffer, 0, _MSG_TRUNC)
        except BlockingIOError:
            return 0
        except OSError as error:
            return self._recv_error(error, 0)
        if limit > DATAGRAM_BATCH_SIZE:
            limit = DATAGRAM_BATCH_SIZE
        lookup = self._source_lookup
        append = metas.append
        new = _new_object
        last_sockaddr: Any = _NOTHING  # consecutive datagrams mostly share a sender
        source = self._addr  # (never used: the first datagram always sets it)
        filled = 0
        try:
            while True:
                if size > len(buffer):
                    raise InvalidDataError(
                        f"datagram of {size} bytes exceeds the {len(buffer)}-byte buffer"
                    )
                if sockaddr != last_sockaddr:
                    source = lookup(sockaddr) or self._new_source(sockaddr)
                    last_sockaddr = sockaddr
                meta = new(DatagramRecvMeta)
                meta.source = source
                meta.length = meta.stride = size
                meta.ecn = None
                append(meta)
                filled += 1
                if filled == limit:
                    break
                buffer = buffers[filled]
                size, sockaddr = recv(buffer, 0, _MSG_TRUNC)
        except BlockingIOError:
            pass
        except OSError as error:
            return self._recv_error(error, filled)
        return filled

    def try_recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """Drain up to ``min(len(buffers), 32)`` datagrams or GRO aggregates, one per buffer.

        With GRO, the usual call (open socket, nothing kept from an earlier call, buffers of
        at least 64 KiB: the driver's) is served here in one frame: ``BatchReceiver.try_recv``,
        ``_recv_each`` and ``_try_recv_gro`` in a row were three, plus ``_source`` and the
        meta's ``__init__``, on every wake-up. Everything else takes the general path, which
        this method's loop mirrors (the same errors, metas and source cache); a small buffer
        after big ones ends the call (the rest stays queued in the kernel).
        """
        if (
            not self._gro
            or self._state.closed
            or self._deferred_error is not None
            or self._split_remainder is not None
            or self._pending
            or not buffers
            or len(buffers[0]) < _GRO_BUFFER_SIZE
        ):
            return BatchReceiver.try_recv(self, buffers, metas)
        limit = len(buffers)
        if limit > DATAGRAM_BATCH_SIZE:
            limit = DATAGRAM_BATCH_SIZE
        recvmsg_into = self._recvmsg_into
        lookup = self._source_lookup
        append = metas.append
        new = _new_object
        filled = 0
        buffer = buffers[0]
        try:
            while True:
                size, ancdata, flags, sockaddr = recvmsg_into((buffer,), _CMSG_SPACE)
                if flags & _MSG_TRUNC:
                    raise InvalidDataError(f"GRO aggregate exceeds the {len(buffer)}-byte buffer")
                stride = size
                for level, kind, data in ancdata:  # (none for a datagram that was not merged)
                    if level == SOL_UDP and kind == UDP_GRO:
                        stride = _INT.unpack_from(data)[0]
                meta = new(DatagramRecvMeta)
                meta.source = lookup(sockaddr) or self._new_source(sockaddr)
                meta.length = size
                meta.stride = stride
                meta.ecn = None
                append(meta)
                filled += 1
                if filled == limit:
                    break
                buffer = buffers[filled]
                if len(buffer) < _GRO_BUFFER_SIZE:
                    break
        except BlockingIOError:
            pass
        except OSError as error:
            return self._recv_error(error, filled)
        return filled

    def _try_recv_gro(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """``try_recv`` with GRO: serve the split remainder first, then receive aggregates
        (directly into buffers of at least 64 KiB, through the scratch buffer otherwise)."""
        limit = min(len(buffers), DATAGRAM_BATCH_SIZE)
        filled = 0
        if self._split_remainder is not None:
            filled = self._fill_from_remainder(buffers, limit, metas)
            if self._has_backlog():
                return filled  # keep order: the rest of the aggregate comes first
        recvmsg_into = self._sock.recvmsg_into
        try:
            while filled < limit:
                buffer = buffers[filled]
                if len(buffer) < _GRO_BUFFER_SIZE:
                    filled += self._recv_via_scratch(buffers[filled:limit], metas)
                    if self._has_backlog():
                        break
                    continue
                size, ancdata, flags, sockaddr = recvmsg_into((buffer,), _CMSG_SPACE)
                if flags & _MSG_TRUNC:
                    raise InvalidDataError(f"GRO aggregate exceeds the {len(buffer)}-byte buffer")
                stride = size
                for level, kind, data in ancdata:
                    if level == SOL_UDP and kind == UDP_GRO:
                        stride = _INT.unpack_from(data)[0]
                metas.append(DatagramRecvMeta(self._source(sockaddr), size, stride))
                filled += 1
        except BlockingIOError:
            pass
        except OSError as error:
            return self._recv_error(error, filled)
        return filled

    def _has_backlog(self) -> bool:
        """Whether a split remainder or a deferred error must be delivered before new data."""
        return self._split_remainder is not None or self._deferred_error is not None

    def _recv_via_scratch(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """GRO receive into the scratch buffer, then spread whole segments over the caller's
        (small) buffers; what does not fit stays as the split remainder. Returns the number
        of buffers filled; ``BlockingIOError`` if nothing was ready."""
        scratch = self._scratch
        assert scratch is not None
        size, ancdata, _flags, sockaddr = self._sock.recvmsg_into((scratch,), _CMSG_SPACE)
        stride = size
        for level, kind, data in ancdata:
            if level == SOL_UDP and kind == UDP_GRO:
                stride = _INT.unpack_from(data)[0]
        self._split_remainder = (
            bytes(memoryview(scratch)[:size]),
            0,
            stride,
            self._source(sockaddr),
        )
        return self._fill_from_remainder(buffers, len(buffers), metas)

    def _fill_from_remainder(
        self, buffers: Sequence[Buffer], limit: int, metas: list[DatagramRecvMeta]
    ) -> int:
        """Copy the split remainder into ``buffers``, as many whole segments per buffer as
        fit. Raises (or defers) :class:`InvalidDataError` for a segment larger than a buffer."""
        remainder = self._split_remainder
        assert remainder is not None
        blob, offset, stride, source = remainder
        end = len(blob)
        filled = 0
        while offset < end and filled < limit:
            buffer = buffers[filled]
            room = len(buffer)
            take = end - offset
            if take > room:
                take = (room // stride) * stride
                if take == 0:
                    offset = min(offset + stride, end)  # the segment is consumed (lost)
                    self._split_remainder = (blob, offset, stride, source) if offset < end else None
                    error = InvalidDataError(
                        f"datagram of {stride} bytes exceeds the {room}-byte buffer"
                    )
                    if filled == 0:
                        raise error
                    self._deferred_error = error
                    return filled
            buffer[:take] = blob[offset : offset + take]
            metas.append(DatagramRecvMeta(source, take, min(stride, take)))
            offset += take
            filled += 1
        self._split_remainder = (blob, offset, stride, source) if offset < end else None
        return filled

    def _new_recv_ring(self) -> RecvRing | None:
        """A :class:`RecvRing` of 32 x 65,535-byte slots for :meth:`_recv_into_ring`, or
        ``None`` where ``recvmmsg`` is unavailable (the datagram switch then uses
        :meth:`try_recv`)."""
        if not recv_ring_supported():
            return None
        return RecvRing(self._sock.family, DATAGRAM_BATCH_SIZE, _GRO_BUFFER_SIZE)

    def _recv_into_ring(self, ring: RecvRing) -> int:
        """``try_recv`` into ``ring`` with one system call: the number of slots filled (GRO
        aggregates keep their stride), ``0`` if nothing was ready, or ``-1`` when a split
        remainder or a deferred error must be delivered through :meth:`try_recv` first. Errors
        as in ``try_recv`` (a kernel error shuts the socket down first)."""
        if self._state.closed:
            raise SocketClosedError()
        if self._split_remainder is not None or self._deferred_error is not None:
            return -1
        try:
            return ring.receive(self._fd)
        except OSError as error:
            return self._recv_error(error, 0)

    def try_recv_from(self) -> tuple[bytes, DatagramAddr] | None:
        """Receive one datagram; a GRO aggregate is split and its rest kept for later calls."""
        remainder = self._split_remainder
        if remainder is not None:
            if self._state.closed:
                raise SocketClosedError()
            return self._next_from_remainder(remainder)
        self._check_recv()
        if self._pending:  # kept from a batch that held a datagram too long for its buffer
            return self._next_pending()
        try:
            if self._gro:
                scratch = self._scratch
                assert scratch is not None
                size, ancdata, _flags, sockaddr = self._sock.recvmsg_into((scratch,), _CMSG_SPACE)
                stride = size
                for level, kind, data in ancdata:
                    if level == SOL_UDP and kind == UDP_GRO:
                        stride = _INT.unpack_from(data)[0]
                source = self._source(sockaddr)
                data = bytes(memoryview(scratch)[:size])
                if stride < size:
                    self._split_remainder = (data, 0, stride, source)
                    return self._next_from_remainder(self._split_remainder)
                return data, source
            data, sockaddr = self._sock.recvfrom(_GRO_BUFFER_SIZE)
            return data, self._source(sockaddr)
        except BlockingIOError:
            return None
        except OSError as error:
            raise self._recv_failed(error) from error

    # -- readiness and limits ------------------------------------------------------------------

    def fileno(self) -> int:
        """The kernel descriptor (``SocketClosedError`` after shutdown)."""
        if self._state.closed:
            raise SocketClosedError()
        return self._fd

    def add_recv_waker(self, waker: Waker) -> None:
        """Kept until shutdown (readiness otherwise comes from ``fileno()``)."""
        self._state.set_recv_waker(waker)

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        """Kept until shutdown (readiness otherwise comes from ``fileno()``)."""
        self._state.set_send_waker(waker)

    @property
    def max_transmit_segments(self) -> int:
        """:data:`DATAGRAM_BATCH_SIZE`."""
        return DATAGRAM_BATCH_SIZE

    @property
    def max_receive_segments(self) -> int:
        """:data:`GRO_MAX_RECEIVE_SEGMENTS` with GRO, else 1."""
        return GRO_MAX_RECEIVE_SEGMENTS if self._gro else 1

    @property
    def may_fragment(self) -> bool:
        """``True``: IP may fragment large datagrams."""
        return True

    # -- lifecycle -----------------------------------------------------------------------------

    def _shut_kernel_socket(self) -> None:
        # ENOTCONN on an unconnected socket, yet the shutdown still wakes pollers.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._last_sockaddr = (_NOTHING, None)  # the next try_send_to tests for shutdown
        self._drop_batches()

    def shutdown(self) -> None:
        """Stop: later operations raise :class:`SocketClosedError`; pollers of the descriptor
        and the wakers are woken. The descriptor is closed by :meth:`join`."""
        self._state.shutdown(self._shut_kernel_socket)

    @property
    def is_shutdown(self) -> bool:
        """Whether ``shutdown`` has been called (by the caller or after a receive error)."""
        return self._state.closed

    def join(self, timeout: float | None = None) -> bool:
        """Wait for shutdown, then close the kernel socket."""
        return self._state.join(timeout, self._release)

    def _release(self) -> None:
        with self._fd_lock:  # never under a batched receive's recvmmsg call
            self._sock.close()
        self.release_buffers()  # a receive that raced shutdown may have cached a batch

    def __del__(self) -> None:
        # Spec: sockets shut themselves down when dropped (wakes wakers, removes the file);
        # the stdlib socket closes the descriptor when it is collected.
        with contextlib.suppress(Exception):
            self.shutdown()

    def __repr__(self) -> str:
        state = "shut down" if self._state.closed else "open"
        return f"UdpSocket({self._addr}, gso={self._gso}, gro={self._gro}, {state})"
