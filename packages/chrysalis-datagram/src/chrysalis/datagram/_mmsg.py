"""Batched UDP receives: up to 32 datagrams per ``recvmmsg`` system call (Linux, via ctypes).

Why: a forwarder written in Python spends most of its time per datagram in the receive system
call and the Python code around it (``recvmsg_into`` builds a result tuple, an ancillary-data
list and an address tuple per datagram). The standard library has no ``recvmmsg``, so
:class:`RecvRing` calls the C library's through :mod:`ctypes`: one call fills up to 32
*ring-owned* buffers, and the lengths, segment sizes (``UDP_GRO``) and source addresses are
read straight from the kernel-filled headers, without a Python object per datagram unless the
caller asks for one. The datagram switch uses it on the forward path (spec 3.4: "32 buffers x
65,535 bytes").

Memory safety: everything the kernel writes to is allocated once, by the ring, and never
resized: the 32 data buffers (private anonymous mappings, ``_socket.mapped_buffers``, faulted
in only where datagrams land; their ctypes views keep a buffer export, so they *cannot* be
closed while the ring lives), the iovecs, the source-address slots, the control
slots and the ``mmsghdr`` array. After each call the headers the kernel modified
(``msg_namelen``, ``msg_controllen``, ``msg_flags``, ``msg_len``) are restored from a template
copy in one slice assignment. The C function runs with the interpreter lock held
(``ctypes.PyDLL``): it is a non-blocking call (``MSG_DONTWAIT``), and no other thread can close
the descriptor in the middle of it.

Availability: Linux, 64-bit little-endian (the glibc ``struct msghdr`` layout, which musl
shares on such machines), a C library exporting ``recvmmsg``. Elsewhere :func:`recv_ring_supported`
is ``False`` and callers keep their per-datagram receive loop.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import sys
from collections.abc import Callable
from typing import Final

from chrysalis.core import UDP_SCHEME, DatagramAddr
from chrysalis.datagram._socket import mapped_buffers

__all__ = ["RecvRing", "recv_ring_supported"]

_SLOT_NAME: Final = 32  # >= sizeof(struct sockaddr_in6) (28), a multiple of 8
_SLOT_CONTROL: Final = 32  # >= CMSG_SPACE(sizeof(int)) (24 on 64-bit Linux)
_SOL_UDP: Final = 17
_UDP_GRO: Final = 104
_MSG_DONTWAIT: Final = 0x40
_MSG_TRUNC: Final = 0x20
_SOURCE_CACHE_LIMIT: Final = 4096


class _Iovec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


class _Msghdr(ctypes.Structure):
    _fields_ = (
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.c_void_p),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    )


class _Mmsghdr(ctypes.Structure):
    _fields_ = (("hdr", _Msghdr), ("len", ctypes.c_uint))


class _Cmsghdr(ctypes.Structure):
    _fields_ = (("len", ctypes.c_size_t), ("level", ctypes.c_int), ("type", ctypes.c_int))


_HDR_SIZE: Final = ctypes.sizeof(_Mmsghdr)
_CMSG_DATA: Final = ctypes.sizeof(_Cmsghdr)


def _load_recvmmsg() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux") or sys.byteorder != "little":
        return None
    layout = (
        ctypes.sizeof(ctypes.c_void_p),
        _HDR_SIZE,
        _CMSG_DATA,
        _Msghdr.controllen.offset,
        _Msghdr.flags.offset,
        _Mmsghdr.len.offset,
    )
    if layout != (8, 64, 16, 40, 48, 56):  # the word offsets RecvRing.receive reads
        return None
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        function = libc.recvmmsg
    except (OSError, AttributeError):
        return None
    # No ``argtypes``: ctypes then runs no ``from_param`` conversion per argument, which was
    # most of a call's cost (about 2 of 3 us measured on the EAGAIN path). RecvRing.receive
    # passes exactly ``(int fd, c_void_p headers, int vlen, int flags, None)``: Python ints
    # become C ``int`` (each value fits), the pointer travels as a ``c_void_p`` object and
    # ``None`` as a NULL timeout.
    function.restype = ctypes.c_int
    return function


_recvmmsg: Final = _load_recvmmsg()


def recv_ring_supported() -> bool:
    """Whether :class:`RecvRing` can be used on this platform."""
    return _recvmmsg is not None


def _udp_source(family: int, name: bytes) -> DatagramAddr:
    """The ``udp`` address of a kernel ``sockaddr_in`` / ``sockaddr_in6``."""
    if family == socket.AF_INET:
        # sin_family (2, native), sin_port (2, BE), sin_addr (4) -> tag, IP, port.
        return DatagramAddr(UDP_SCHEME, b"\x04" + name[4:8] + name[2:4])
    # sin6_family, sin6_port (BE), sin6_flowinfo (BE), sin6_addr, sin6_scope_id (native).
    scope = int.from_bytes(name[24:28], sys.byteorder).to_bytes(4, "big")
    return DatagramAddr(UDP_SCHEME, b"\x06" + name[8:24] + name[2:4] + name[4:8] + scope)


class RecvRing:
    """``slots`` receive buffers of ``size`` bytes filled by one ``recvmmsg`` call.

    After ``receive(fd)`` returned ``n``, the lists ``lengths``, ``strides`` and
    ``source_keys`` have ``n`` items (each call replaces them; ``strides`` may be the very
    ``lengths`` list): slot ``i`` holds ``lengths[i]`` bytes in ``buffers[i]`` (``-1``: the
    datagram did not fit and was lost; the kernel consumed it), split into datagrams of
    ``strides[i]`` bytes (``== lengths[i]`` unless the socket has ``UDP_GRO`` on and the
    kernel coalesced several), from the sender whose ``source_keys[i]`` (an ``int`` for IPv4,
    ``bytes`` for IPv6; equal keys, equal senders) ``source(i)`` converts into a
    :class:`DatagramAddr`. Not thread-safe: one receiving thread at a time.
    """

    __slots__ = (
        "_control_words",
        "_controllen",
        "_family",
        "_hdr_addr",
        "_headers",
        "_headers_view",
        "_keepalive",
        "_names",
        "_names_q",
        "_slots",
        "_sources",
        "_template",
        "_words",
        "buffers",
        "lengths",
        "source_keys",
        "strides",
        "views",
    )

    def __init__(self, family: int, slots: int, size: int) -> None:
        if _recvmmsg is None:
            raise OSError(errno.ENOSYS, "recvmmsg is not available on this platform")
        if family not in (socket.AF_INET, socket.AF_INET6):
            raise ValueError("RecvRing needs AF_INET or AF_INET6")
        if not 1 <= slots <= 1024 or not 1 <= size <= 1 << 20:
            raise ValueError(f"bad ring shape: {slots} slots of {size} bytes")
        self._family = family
        self._slots = slots
        self.buffers = mapped_buffers(slots, size)
        self.views = [memoryview(buffer) for buffer in self.buffers]
        data = [(ctypes.c_char * size).from_buffer(buffer) for buffer in self.buffers]
        iovecs = (_Iovec * slots)()
        self._names = bytearray(_SLOT_NAME * slots)
        names = (ctypes.c_char * len(self._names)).from_buffer(self._names)
        control = bytearray(_SLOT_CONTROL * slots)
        controls = (ctypes.c_char * len(control)).from_buffer(control)
        self._headers = bytearray(_HDR_SIZE * slots)
        headers = (_Mmsghdr * slots).from_buffer(self._headers)
        self._controllen = socket.CMSG_SPACE(4)
        for i in range(slots):
            iovecs[i].base = ctypes.addressof(data[i])
            iovecs[i].len = size
            hdr = headers[i].hdr
            hdr.name = ctypes.addressof(names) + i * _SLOT_NAME
            hdr.namelen = _SLOT_NAME
            hdr.iov = ctypes.addressof(iovecs) + i * ctypes.sizeof(_Iovec)
            hdr.iovlen = 1
            hdr.control = ctypes.addressof(controls) + i * _SLOT_CONTROL
            hdr.controllen = self._controllen
        # Every ctypes object whose address the kernel gets stays alive with the ring.
        self._keepalive = (data, iovecs, names, controls, headers, control)
        self._hdr_addr = ctypes.c_void_p(ctypes.addressof(headers))
        self._template = memoryview(bytes(self._headers))
        self._headers_view = memoryview(self._headers)  # a memoryview copy is the cheapest
        # Word views: msg_len / msg_flags / msg_controllen of slot i, the cmsg of slot i.
        self._words = memoryview(self._headers).cast("I")
        self._control_words = memoryview(control).cast("i")
        self._names_q = memoryview(self._names).cast("Q")
        self._sources: dict[int | bytes, DatagramAddr] = {}
        self.lengths: list[int] = []
        self.strides: list[int] = []
        self.source_keys: list[int] | list[bytes] = []

    @property
    def slots(self) -> int:
        """The number of buffers (the most datagrams or aggregates one call returns)."""
        return self._slots

    def receive(self, fd: int) -> int:
        """One non-blocking ``recvmmsg`` on ``fd``: the number of slots filled (0: nothing
        was ready). Raises ``OSError`` for any other error (``EINTR`` is retried)."""
        function = _recvmmsg
        assert function is not None
        while True:
            count: int = function(fd, self._hdr_addr, self._slots, _MSG_DONTWAIT, None)
            if count >= 0:
                break
            code = ctypes.get_errno()
            if code == errno.EAGAIN or code == errno.EWOULDBLOCK:
                return 0
            if code != errno.EINTR:
                raise OSError(code, os.strerror(code))
        # Read the kernel's results a column at a time (strided memoryview slices, converted
        # at C speed): word offsets inside one 64-byte mmsghdr (16 words) are msg_controllen
        # at byte 40, msg_flags at 48 and msg_len at 56; a control slot (8 words) holds
        # cmsg_level at byte 8, cmsg_type at 12 and the data at 16.
        words = self._words
        if count == 1 and not words[12] and not words[10]:
            # One plain datagram (the common case on a lightly loaded link): index directly,
            # which is cheaper than the column slices below for a single slot.
            self.lengths = self.strides = [words[14]]
            if self._family == socket.AF_INET:
                self.source_keys = [self._names_q[0]]
            else:
                self.source_keys = [bytes(self._names[:28])]
            self._headers_view[:_HDR_SIZE] = self._template[:_HDR_SIZE]
            return 1
        stop = count << 4
        lengths: list[int] = words[14:stop:16].tolist()
        if any(words[12:stop:16]):
            flags = words[12:stop:16].tolist()
            for i in range(count):
                if flags[i] & _MSG_TRUNC:
                    lengths[i] = -1
        strides = lengths
        if any(words[10:stop:16]):  # control messages: GRO segment sizes
            strides = lengths[:]
            control = self._control_words
            has_control = words[10:stop:16].tolist()
            for i in range(count):
                c = i << 3
                if (
                    has_control[i]
                    and control[c + 2] == _SOL_UDP
                    and control[c + 3] == _UDP_GRO
                    and lengths[i] >= 0
                ):
                    strides[i] = control[c + 4]
        self.lengths = lengths
        self.strides = strides
        if self._family == socket.AF_INET:
            # sin_family, sin_port and sin_addr: one 64-bit word per 32-byte name slot.
            self.source_keys = self._names_q[0 : count << 2 : 4].tolist()
        else:
            names = self._names
            self.source_keys = [
                bytes(names[start : start + 28])
                for start in range(0, count * _SLOT_NAME, _SLOT_NAME)
            ]
        # Restore what the kernel rewrote (name and control lengths, flags, msg_len).
        end = count * _HDR_SIZE
        self._headers_view[:end] = self._template[:end]
        return count

    def source(self, i: int) -> DatagramAddr:
        """The source address of filled slot ``i`` (cached per sender)."""
        key = self.source_keys[i]
        source = self._sources.get(key)
        if source is None:
            start = i * _SLOT_NAME
            source = _udp_source(self._family, bytes(self._names[start : start + 28]))
            if len(self._sources) >= _SOURCE_CACHE_LIMIT:
                self._sources.clear()
            self._sources[key] = source
        return source
