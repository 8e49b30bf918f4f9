"""The Unix datagram carrier: ``AF_UNIX`` / ``SOCK_DGRAM`` between processes of one host.

Why: co-located processes (a task head and its local leaves) exchange datagrams without the
IP stack; a Unix datagram never fragments, never gets reordered, and a full receive queue
blocks the sender instead of dropping (spec 2.6). Addresses are socket paths: filesystem paths
(``unixgram:///run/x.sock``) or Linux abstract names (leading NUL, ``unixgram://@name``).

Facts this module relies on (measured, see python-notes): the largest datagram is the send
buffer minus 32 bytes, so the send buffer is raised (4 MiB requested, the kernel may grant
less); the receive queue holds only ``net.unix.max_dgram_qlen`` (10) datagrams, so "would
block" is common; and both ends must be bound for replies to work: a datagram from an unnamed
socket is consumed and reported as :class:`AddressNotAvailableError`.

Writability of an unconnected Unix datagram socket only reflects its own send buffer, not the
destination's queue (a full queue answers ``EAGAIN`` while ``poll`` on the sender still says
writable), so a "writable" wake can be followed by another would-block; the runtime adapters
back off briefly in that case, and the QUIC driver retries such a destination on a timer
(never on writability). ``ENOBUFS`` is reported as would-block too.

The socket file is removed when the socket shuts down (only if it is still the file this
socket created); the descriptor is closed by ``join``.

Per-datagram cost: a destination path is validated once and then cached, and received source
paths are converted once and cached (at most 4,096 entries each, emptied when full), so the
send and receive paths are a cache lookup around the system call. On Linux ``try_recv`` takes
a whole batch with one ``recvmmsg`` call straight into the caller's buffers
(:class:`~chrysalis.datagram._recvmmsg.BatchReceiver`: headers cached per buffer list, a
cached ``bytearray`` cannot be resized until ``release_buffers()`` or shutdown); after a
single-datagram batch, and where recvmmsg is missing, it is one ``recvfrom_into`` per datagram.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import tempfile
from collections.abc import Sequence
from typing import Any, Final

from chrysalis.core import UNIXGRAM_SCHEME, AddressError, DatagramAddr
from chrysalis.datagram._recvmmsg import BatchReceiver
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    AddressInUseError,
    AddressNotAvailableError,
    Buffer,
    ConnectionRefusedDatagramError,
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
)

__all__ = ["DEFAULT_UNIX_BUFFER_SIZE", "MAX_UNIX_PATH", "UnixDatagramSocket"]

#: Requested SO_SNDBUF / SO_RCVBUF for Unix datagram sockets.
DEFAULT_UNIX_BUFFER_SIZE: Final = 4 << 20
#: Size of ``sun_path``: a filesystem path needs at most 107 bytes (plus the terminator), an
#: abstract name at most 108 bytes including its leading NUL.
MAX_UNIX_PATH: Final = 108

_SCHEMES: Final = (UNIXGRAM_SCHEME,)
_SOURCE_CACHE_LIMIT: Final = 4096
_PATH_CACHE_LIMIT: Final = 4096
_MSG_TRUNC: Final = int(socket.MSG_TRUNC)  # an IntFlag operand would run enum code
_new_object: Final = object.__new__
_NOTHING: Final = object()  # a placeholder that is equal to nothing else
_UNIQUE_ATTEMPTS: Final = 8
#: ``sizeof(struct sockaddr_un)`` (110) rounded up to 8: one source slot of a batch.
_NAME_SLOT: Final = 112


def _unnamed_error() -> AddressNotAvailableError:
    return AddressNotAvailableError(
        "unix datagram from an unnamed socket (the sender must bind a path)"
    )


def _check_path(raw: bytes) -> bytes:
    """Validate a socket path for binding or sending (``AddressError`` if invalid)."""
    if not raw:
        raise AddressError("unix datagram path is empty")
    if raw[0] == 0:
        if len(raw) > MAX_UNIX_PATH:
            raise AddressError(
                f"abstract unix name is {len(raw)} bytes, at most {MAX_UNIX_PATH} fit sun_path"
            )
        if b"\0" in raw[1:]:
            raise AddressError("abstract unix name contains a NUL after the leading one")
        return raw
    if b"\0" in raw:
        raise AddressError("unix datagram path contains a NUL byte")
    if len(raw) >= MAX_UNIX_PATH:
        raise AddressError(
            f"unix datagram path is {len(raw)} bytes, at most {MAX_UNIX_PATH - 1} fit sun_path"
        )
    return raw


def _path_bytes(path: str | bytes | os.PathLike[str] | os.PathLike[bytes] | DatagramAddr) -> bytes:
    if isinstance(path, DatagramAddr):
        if path.scheme != UNIXGRAM_SCHEME:
            raise AddressError(f"UnixDatagramSocket needs a unixgram address, got {path}")
        return path.opaque
    if isinstance(path, str | bytes | os.PathLike):
        raw = os.fsencode(path)
        return raw
    raise TypeError(f"unix path must be str, bytes or DatagramAddr, not {type(path).__name__}")


class UnixDatagramSocket(BatchReceiver, DatagramSocket):
    """A bound Unix datagram socket implementing the :class:`DatagramSocket` contract.

    Build it with :meth:`bind` or :meth:`bind_unique`. Readiness comes from ``fileno()``; the
    wakers are called only on shutdown. ``may_fragment`` is ``False``,
    ``max_transmit_segments`` is 32 (a segmented send is a loop of non-blocking ``sendto``).
    """

    def __init__(self, sock: socket.socket, path: bytes, *, owns_file: bool) -> None:
        """Wrap an already bound ``AF_UNIX`` datagram socket bound to ``path``. When
        ``owns_file`` is true the socket file is removed on shutdown. Prefer :meth:`bind`."""
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_DGRAM:
            raise ValueError("UnixDatagramSocket needs an AF_UNIX SOCK_DGRAM socket")
        sock.setblocking(False)
        self._sock = sock
        # Bound methods of the kernel socket, looked up once for the per-datagram paths.
        self._sendto = sock.sendto
        self._recvfrom_into = sock.recvfrom_into
        self._fd = sock.fileno()
        self._path = path
        self._addr = DatagramAddr.unixgram(path)
        self._state = ShutdownState()
        self._deferred_error: OSError | None = None
        self._sources: dict[Any, DatagramAddr] = {}
        # try_recv's memo of the last datagram it delivered: (sockaddr, length, meta); the
        # placeholder's sockaddr equals no kernel sockaddr, so the first datagram replaces it.
        self._recv_memo: tuple[Any, int, DatagramRecvMeta] = (
            _NOTHING,
            -1,
            DatagramRecvMeta(self._addr, 0, 0),
        )
        self._source_lookup = self._sources.get  # the dict is cleared, never replaced
        # Batched receives (Linux): recvmmsg into the caller's buffers, see _recvmmsg.py.
        self._init_batches(_NAME_SLOT, enabled=True)
        # Destinations already validated by _check_path: address -> sun_path bytes.
        self._paths: dict[DatagramAddr, bytes] = {}
        # The destination of the previous send and its path, as one tuple so that threads
        # sharing the socket never see a torn pair.
        self._last_path: tuple[object, bytes] = (_NOTHING, b"")
        self._file_id: tuple[int, int] | None = None
        if owns_file and path[:1] != b"\0":
            with contextlib.suppress(OSError):
                st = os.stat(path)
                self._file_id = (st.st_dev, st.st_ino)

    @classmethod
    def bind(
        cls,
        path_or_addr: str | bytes | os.PathLike[str] | os.PathLike[bytes] | DatagramAddr,
        *,
        send_buffer: int = DEFAULT_UNIX_BUFFER_SIZE,
        recv_buffer: int = DEFAULT_UNIX_BUFFER_SIZE,
    ) -> UnixDatagramSocket:
        """Bind to a filesystem path or an abstract name (leading NUL byte).

        Raises ``AddressError`` for an empty path, a NUL inside it, or one that does not fit
        ``sun_path``; :class:`AddressInUseError` if the path exists (stale files are not
        removed); ``OSError`` for other failures.
        """
        raw = _check_path(_path_bytes(path_or_addr))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            for option, size in ((socket.SO_SNDBUF, send_buffer), (socket.SO_RCVBUF, recv_buffer)):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, option, size)
            try:
                sock.bind(raw)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise AddressInUseError(
                        f"unix datagram address {DatagramAddr.unixgram(raw)} is in use"
                    ) from error
                raise
            return cls(sock, raw, owns_file=True)
        except BaseException:
            sock.close()
            raise

    @classmethod
    def bind_unique(
        cls, dir: str | os.PathLike[str] | None = None, *, prefix: str = "chrysalis-"
    ) -> UnixDatagramSocket:
        """Bind to a fresh, unpredictable filesystem path in ``dir`` (default: the system
        temporary directory). The file is removed when the socket shuts down."""
        directory = os.fspath(dir) if dir is not None else tempfile.gettempdir()
        for _ in range(_UNIQUE_ATTEMPTS):
            name = f"{prefix}{os.getpid()}-{secrets.token_hex(8)}.sock"
            try:
                return cls.bind(os.path.join(directory, name))
            except AddressInUseError:
                continue
        raise AddressInUseError(f"no free unique socket path in {directory!r}")

    # -- identity ------------------------------------------------------------------------------

    @property
    def local_addr(self) -> DatagramAddr:
        """The bound path as a ``unixgram`` address."""
        return self._addr

    @property
    def path(self) -> bytes:
        """The bound path bytes (abstract names start with NUL)."""
        return self._path

    # -- sending -------------------------------------------------------------------------------

    def _send_error(self, error: OSError, destination: DatagramAddr, size: int) -> OSError:
        if self._state.closed:
            return SocketClosedError()
        code = error.errno
        if code == errno.EMSGSIZE:
            return DatagramTooLargeError(f"unix datagram of {size} bytes is too large")
        if code == errno.ENOENT:
            return HostUnreachableError(f"no unix socket at {destination}")
        if code in (errno.ECONNREFUSED, errno.EPIPE):
            return ConnectionRefusedDatagramError(f"{destination} refused the datagram")
        return error

    def _new_path(self, destination: DatagramAddr) -> bytes:
        """Validate ``destination`` and cache its path (the cache miss of every send)."""
        if destination.scheme != UNIXGRAM_SCHEME:
            raise UnsupportedSchemeError.for_scheme(destination.scheme, _SCHEMES)
        path = _check_path(destination.opaque)  # a NUL would silently truncate the path
        paths = self._paths
        if len(paths) >= _PATH_CACHE_LIMIT:
            paths.clear()
        paths[destination] = path
        return path

    def _memo_path(self, destination: DatagramAddr) -> bytes:
        """``try_send_to``'s memo miss: refuse after shutdown, look the destination up (or
        validate it), and remember it as the last destination."""
        if self._state.closed:
            raise SocketClosedError()
        path = self._paths.get(destination) or self._new_path(destination)
        self._last_path = (destination, path)
        return path

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        """Send one datagram; ``False`` if the destination's queue (or our buffer) is full."""
        # The per-datagram path, kept to a handful of bytecodes around the system call (issue
        # #3), as in UdpSocket.try_send_to: the destination memo is one tuple unpacked at once
        # and tested by identity, the bound ``sendto`` is read as a plain attribute, and there
        # is no shutdown test here (shutdown empties the memo, so the next send takes the miss
        # path, which tests; a send that raced shutdown gets EPIPE or EBADF from the kernel,
        # reported as SocketClosedError). The size test stays: the kernel would accept
        # datagrams up to the 4 MiB send buffer.
        last, path = self._last_path
        if last is not destination:
            path = self._memo_path(destination)
        if len(data) > MAX_DATAGRAM_SIZE:
            raise DatagramTooLargeError(
                f"datagram of {len(data)} bytes exceeds {MAX_DATAGRAM_SIZE}"
            )
        sendto = self._sendto
        try:
            sendto(data, path)
        except BlockingIOError:
            return False
        except OSError as error:
            if error.errno == errno.ENOBUFS:  # no memory for it now: would block, not an error
                return False
            raise self._send_error(error, destination, len(data)) from error
        return True

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        """Send up to 32 leading datagrams of ``transmit``, one non-blocking ``sendto`` each;
        return how many were accepted (``0``: would block before the first).

        The default implementation calls ``try_send_to`` per segment; here the destination
        and the segment size are checked once per call and the loop is the system call alone
        (half the Python per segment, see the README). An error is raised only if nothing was
        accepted. (``sendmmsg`` would not pay: a destination queues at most
        ``net.unix.max_dgram_qlen`` datagrams, 10 by default, so a batch mostly stops early
        and one ctypes call costs about half a microsecond.)
        """
        count = transmit.segment_count
        destination = transmit.destination
        if count == 1:
            return 1 if self.try_send_to(transmit.contents, destination) else 0
        last, path = self._last_path
        if last is not destination:
            path = self._memo_path(destination)
        size = transmit.segment_size
        assert size is not None  # segment_count > 1
        if size > MAX_DATAGRAM_SIZE:
            raise DatagramTooLargeError(f"segment of {size} bytes exceeds {MAX_DATAGRAM_SIZE}")
        if count > DATAGRAM_BATCH_SIZE:
            count = DATAGRAM_BATCH_SIZE
        view = memoryview(transmit.contents)
        sendto = self._sendto
        sent = 0
        try:
            for start in range(0, count * size, size):
                sendto(view[start : start + size], path)
                sent += 1
        except BlockingIOError:
            pass
        except OSError as error:
            if sent == 0 and error.errno != errno.ENOBUFS:  # ENOBUFS: would block
                raise self._send_error(error, destination, size) from error
        return sent

    # -- receiving -----------------------------------------------------------------------------

    def _source(self, sockaddr: Any) -> DatagramAddr:
        source = self._sources.get(sockaddr)
        if source is None:
            source = self._new_source(sockaddr)
        return source

    def _new_source(self, sockaddr: Any) -> DatagramAddr:
        """Convert and cache a received sockaddr (the cache miss of every receive);
        :class:`AddressNotAvailableError` for an unnamed sender."""
        if not sockaddr:
            raise AddressNotAvailableError(
                "unix datagram from an unnamed socket (the sender must bind a path)"
            )
        source = DatagramAddr.unixgram(sockaddr)
        if len(self._sources) >= _SOURCE_CACHE_LIMIT:
            self._sources.clear()
        self._sources[sockaddr] = source
        return source

    def _check_recv(self) -> None:
        if self._state.closed:
            raise SocketClosedError()
        error = self._deferred_error
        if error is not None:
            self._deferred_error = None
            raise error

    #: ``msg_namelen`` of an unnamed sender: the family alone, or nothing.
    _unnamed_len = 2
    #: Batches from four datagrams on (``recvfrom_into`` of a Unix datagram is cheap; see
    #: BatchReceiver).
    _batch_from = 10

    def _unnamed_error(self) -> OSError:
        return _unnamed_error()

    def _new_raw_source(self, sockaddr: bytes) -> DatagramAddr:
        """Convert and cache a source read from a kernel ``sun_path`` (``sockaddr``: the
        bytes after the family, ``msg_namelen - 2`` of them): an abstract name as is, a
        filesystem path up to its NUL terminator."""
        raw = sockaddr if sockaddr[:1] == b"\0" else sockaddr.partition(b"\0")[0]
        if not raw:
            raise _unnamed_error()
        source = DatagramAddr.unixgram(raw)
        if len(self._sources) >= _SOURCE_CACHE_LIMIT:
            self._sources.clear()
        self._sources[sockaddr] = source
        return source

    def _recv_each(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """``try_recv`` without ``recvmmsg``: one ``recvfrom_into`` per datagram."""
        # The per-datagram loop, kept short as in UdpSocket.try_recv: the first receive comes
        # before any set-up, the loop touches only locals, sources are cached by the kernel's
        # sockaddr (a str path or a bytes abstract name; the last one is reused without a
        # lookup), MSG_TRUNC is a plain int, and metas skip the Python-level __init__.
        # Consecutive datagrams of one length from one sender share one meta object, also
        # across calls (see DatagramRecvMeta: metas are read-only): a full-size stream from one
        # peer then costs a list append per datagram instead of an object with four fields.
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
        # The previous call's last datagram: its sockaddr, length and meta (one tuple, so a
        # thread never sees a torn triple). A batch that continues the same stream makes no
        # meta and looks nothing up.
        last_sockaddr, last_size, meta = self._recv_memo
        source = meta.source
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
                    last_size = -1
                if size != last_size:
                    meta = new(DatagramRecvMeta)
                    meta.source = source
                    meta.length = meta.stride = size
                    meta.ecn = None
                    last_size = size
                append(meta)
                filled += 1
                if filled == limit:
                    break
                buffer = buffers[filled]
                size, sockaddr = recv(buffer, 0, _MSG_TRUNC)
        except BlockingIOError:
            pass
        except OSError as error:
            self._recv_memo = (last_sockaddr, last_size, meta)
            return self._recv_error(error, filled)
        self._recv_memo = (last_sockaddr, last_size, meta)
        return filled

    def _recv_error(self, error: OSError, filled: int) -> int:
        """Deliver a receive error: raised at once if nothing was received in this call, else
        kept for the next call. A kernel error after shutdown becomes
        :class:`SocketClosedError`."""
        if isinstance(error, InvalidDataError | AddressNotAvailableError):
            if filled == 0:
                raise error
            self._deferred_error = error
            return filled
        failure: OSError = SocketClosedError() if self._state.closed else error
        if filled == 0:
            if failure is error:
                raise error
            raise failure from error
        self._deferred_error = failure
        return filled

    def try_recv_from(self) -> tuple[bytes, DatagramAddr] | None:
        """Receive one datagram (up to :data:`MAX_DATAGRAM_SIZE` bytes). A longer one is
        consumed and raises :class:`InvalidDataError`, as in ``try_recv``."""
        self._check_recv()
        if self._pending:
            return self._next_pending()
        try:
            # One byte more than the limit: a longer datagram arrives truncated to that size,
            # which tells it apart from one of exactly MAX_DATAGRAM_SIZE bytes.
            data, sockaddr = self._sock.recvfrom(MAX_DATAGRAM_SIZE + 1)
        except BlockingIOError:
            return None
        except OSError as error:
            if self._state.closed:
                raise SocketClosedError() from error
            raise
        if len(data) > MAX_DATAGRAM_SIZE:
            raise InvalidDataError(
                f"unix datagram exceeds {MAX_DATAGRAM_SIZE} bytes (it was consumed)"
            )
        return data, self._source(sockaddr)

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
    def may_fragment(self) -> bool:
        """``False``: Unix datagrams are delivered whole."""
        return False

    # -- lifecycle -----------------------------------------------------------------------------

    def _on_shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._last_path = (_NOTHING, b"")  # the next try_send_to tests for shutdown
        self._remove_file()
        self._drop_batches()

    def _remove_file(self) -> None:
        file_id, self._file_id = self._file_id, None
        if file_id is None:
            return
        with contextlib.suppress(OSError):
            st = os.stat(self._path)
            if (st.st_dev, st.st_ino) == file_id:
                os.unlink(self._path)

    def shutdown(self) -> None:
        """Stop: remove the socket file, wake pollers and wakers; later operations raise
        :class:`SocketClosedError`. The descriptor is closed by :meth:`join`."""
        self._state.shutdown(self._on_shutdown)

    @property
    def is_shutdown(self) -> bool:
        """Whether ``shutdown`` has been called."""
        return self._state.closed

    def join(self, timeout: float | None = None) -> bool:
        """Wait for shutdown, then close the kernel socket."""
        return self._state.join(timeout, self._release)

    def _release(self) -> None:
        with self._fd_lock:
            self._sock.close()
        self.release_buffers()  # a receive that raced shutdown may have put a batch back

    def __del__(self) -> None:
        # Spec: sockets shut themselves down when dropped (wakes wakers, removes the file);
        # the stdlib socket closes the descriptor when it is collected.
        with contextlib.suppress(Exception):
            self.shutdown()

    def __repr__(self) -> str:
        state = "shut down" if self._state.closed else "open"
        return f"UnixDatagramSocket({self._addr}, {state})"
