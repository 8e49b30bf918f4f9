"""The datagram socket contract every carrier implements (spec sections 2.2 to 2.4).

Why this shape: the transport above a carrier (routing, the datagram switch, QUIC) must run under
asyncio, trio or a plain thread without knowing which. So a carrier exposes only *non-blocking*
operations (``try_send_to``, ``try_send_transmit``, ``try_recv``, ``try_recv_from``) plus
runtime-neutral readiness: a kernel file descriptor to watch (``fileno`` /
``readiness_fds`` / ``send_readiness_fd``) and one-shot wakers for carriers that have no
descriptor (the in-process carrier, the switch). Thin adapters (``AsyncDatagramSocket``,
``TrioDatagramSocket``) turn those into awaitables. Every adapter follows the same rule: *try
first, wait only after a would-block result*, then try again. Wakers may fire spuriously;
nothing relies on a wake meaning that an operation will succeed.

Waker rules, shared by every carrier:

* ``add_recv_waker(waker)`` keeps only the latest receive waker (one pending receive per socket).
  A waker is called at most once, from any thread. Carriers without a descriptor call it when a
  receive may succeed; *every* carrier calls it on shutdown. If a receive may already succeed (or
  the socket is already shut down) the waker is called at once, before ``add_recv_waker``
  returns, so registering and then waiting never loses a wakeup.
* ``add_send_waker(destination, waker)`` is the send-side twin: descriptor-less carriers call it
  when *that destination* may accept again (the in-process carrier keeps it on the destination's
  queue, so draining endpoint A never wakes a sender blocked on B); every carrier calls it on
  shutdown. Send wakers are *kept*, not replaced: any number of senders may wait at once, each
  with its own waker, and all of them are called (a waker registered twice is kept once). The
  collections are bounded (1,024 wakers): at the bound every parked waker is called early,
  which is a spurious wake, never a lost one.

Lifecycle: ``shutdown()`` is idempotent and non-blocking; it wakes every registered waker and
from then on every operation raises :class:`SocketClosedError` (errno ``EPIPE``). ``join()``
waits until ``shutdown`` has happened (by anyone) and then releases what the socket owns (closes
the kernel socket, removes a Unix socket file) before returning ``True``. Kernel descriptors are
closed by ``join`` rather than by ``shutdown`` on purpose: an event loop may still be watching
the descriptor when ``shutdown`` runs on another task or thread, and a closed-then-reused
descriptor number would corrupt that loop's registrations. ``shutdown`` instead shuts the kernel
socket down, which makes the descriptor readable and wakes such watchers.
"""

from __future__ import annotations

import abc
import errno
import mmap
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self

from chrysalis.core import DatagramAddr

__all__ = [
    "DATAGRAM_BATCH_SIZE",
    "MAX_DATAGRAM_SIZE",
    "AddressInUseError",
    "AddressNotAvailableError",
    "Buffer",
    "ConnectionRefusedDatagramError",
    "DatagramError",
    "DatagramRecvMeta",
    "DatagramSocket",
    "DatagramTooLargeError",
    "DatagramTransmit",
    "HostUnreachableError",
    "InvalidDataError",
    "ReceiveBuffer",
    "ShutdownState",
    "SocketClosedError",
    "UnsupportedSchemeError",
    "Waker",
    "mapped_buffers",
    "once",
]

#: Cap on datagrams per carrier batch: one ``try_recv`` call, one segmented send call.
DATAGRAM_BATCH_SIZE: Final = 32
#: Largest datagram any carrier accepts; larger sends raise :class:`DatagramTooLargeError`.
#: (A carrier may refuse smaller ones too: UDP over IPv4 carries at most 65,507 payload bytes.)
MAX_DATAGRAM_SIZE: Final = 65535

#: A receive buffer owned by the caller (written from offset 0).
Buffer = bytearray | memoryview | mmap.mmap
#: A receive buffer whose object a carrier may keep exported between calls (batched receives:
#: ``_recvmmsg.py``): a ``bytearray`` or a whole ``mmap`` (neither can be released early).
ReceiveBuffer = bytearray | mmap.mmap


def mapped_buffers(count: int, size: int) -> list[ReceiveBuffer]:
    """``count`` receive buffers of ``size`` bytes, each a private anonymous mapping.

    Why: ``bytearray(size)`` zeroes every byte at once, so 32 buffers of 64 KiB (a datagram
    switch's, a receive ring's) cost 512 page faults when they are made, although a process
    that forwards little only ever writes a few of those pages (issue 22: a forked scale
    worker paid about 2.5 ms of CPU for them). The kernel maps a private anonymous mapping's
    pages on first write, already zeroed, so only the pages datagrams land in are faulted in.
    Each buffer is a whole ``mmap`` (not a slice of one), so batched receives can cache it
    like a ``bytearray`` (a cached one cannot be closed, as a cached ``bytearray`` cannot be
    resized). Where private mappings are unavailable: ``bytearray`` objects.
    """
    if count < 0 or size <= 0:
        raise ValueError(f"bad receive buffers: {count} of {size} bytes")
    flags = getattr(mmap, "MAP_PRIVATE", None)
    if flags is None:
        return [bytearray(size) for _ in range(count)]
    return [mmap.mmap(-1, size, flags=flags) for _ in range(count)]


#: A one-shot wake-up callback; may be called from any thread, must not block.
Waker = Callable[[], None]


# --------------------------------------------------------------------------------------------
# Errors


class DatagramError(OSError):
    """Base class of the errors raised by datagram carriers.

    An ``OSError`` so that callers that already handle socket errors keep working; each
    subclass sets ``errno`` to the closest POSIX code and has a default message. Errors from
    the kernel that have no better mapping propagate as plain ``OSError``.
    """

    default_errno: int = errno.EIO
    default_message: str = "datagram carrier error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(self.default_errno, message or self.default_message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.strerror,))


class SocketClosedError(DatagramError, BrokenPipeError):
    """The socket was shut down: raised by every operation afterwards, including a receive
    that was already waiting (spec: ``BrokenPipe``)."""

    default_errno = errno.EPIPE
    default_message = "broken pipe: the datagram socket is shut down"


class DatagramTooLargeError(DatagramError):
    """A datagram is larger than the carrier (or :data:`MAX_DATAGRAM_SIZE`) allows."""

    default_errno = errno.EMSGSIZE
    default_message = "datagram too large for this carrier"


class UnsupportedSchemeError(DatagramError):
    """A destination address has a scheme this socket cannot send to; the message names the
    scheme and the schemes that are available."""

    default_errno = errno.EAFNOSUPPORT
    default_message = "destination address scheme not supported by this socket"

    @classmethod
    def for_scheme(cls, scheme: str, available: Sequence[str]) -> UnsupportedSchemeError:
        """Build the error for ``scheme`` listing the ``available`` schemes."""
        listing = ", ".join(repr(s) for s in available) or "none"
        return cls(f"cannot send to scheme {scheme[:40]!r}; available: {listing}")


class AddressInUseError(DatagramError):
    """The requested local address is held by a live socket."""

    default_errno = errno.EADDRINUSE
    default_message = "address already in use"


class AddressNotAvailableError(DatagramError):
    """A received datagram has no usable source address (for example a Unix datagram from an
    unnamed socket). The datagram is consumed."""

    default_errno = errno.EADDRNOTAVAIL
    default_message = "datagram source has no address"


class HostUnreachableError(DatagramError):
    """The destination does not exist on this carrier (unknown endpoint, another network, a
    Unix path with no socket file, an address family the socket cannot reach)."""

    default_errno = errno.EHOSTUNREACH
    default_message = "destination unreachable"


class ConnectionRefusedDatagramError(DatagramError, ConnectionRefusedError):
    """The destination exists but refuses datagrams (it was shut down)."""

    default_errno = errno.ECONNREFUSED
    default_message = "destination refused the datagram (shut down)"


class InvalidDataError(DatagramError):
    """Received data is unusable, typically a datagram longer than the caller's buffer. The
    offending datagram has been consumed (it is lost)."""

    default_errno = errno.EBADMSG
    default_message = "invalid datagram"


# --------------------------------------------------------------------------------------------
# Transmissions and receive metadata


@dataclass(frozen=True, slots=True)
class DatagramTransmit:
    """One send request: ``contents`` to ``destination``, as one datagram or several.

    ``segment_size`` ``None`` means ``contents`` is one datagram. Otherwise ``contents`` are
    consecutive datagrams of ``segment_size`` bytes, the last possibly shorter; a
    ``segment_size`` of zero or less raises ``ValueError``. ``ecn`` is the 2-bit ECN codepoint
    (0 to 3) or ``None``; carriers that cannot express it ignore it. The transmit does not copy
    ``contents``: the caller must not mutate it until the send call returns.
    """

    destination: DatagramAddr
    contents: bytes | bytearray | memoryview
    segment_size: int | None = None
    ecn: int | None = None

    def __post_init__(self) -> None:
        if self.segment_size is not None and self.segment_size <= 0:
            raise ValueError(f"segment_size must be positive, got {self.segment_size}")
        if self.ecn is not None and not 0 <= self.ecn <= 3:
            raise ValueError(f"ecn must be 0..3, got {self.ecn}")

    @property
    def segment_count(self) -> int:
        """Datagrams in this transmit: ``ceil(len/segment_size)`` if ``segment_size < len``,
        else 1."""
        size = self.segment_size
        length = len(self.contents)
        if size is None or size >= length:
            return 1
        return -(-length // size)

    def segment(self, index: int) -> memoryview:
        """Datagram ``index`` (0-based) as a view of ``contents``; ``IndexError`` if out of
        range."""
        count = self.segment_count
        if not 0 <= index < count:
            raise IndexError(f"segment {index} out of range for {count} segments")
        view = memoryview(self.contents)
        if count == 1:
            return view
        size = self.segment_size
        assert size is not None
        return view[index * size : (index + 1) * size]

    def suffix(self, first: int) -> DatagramTransmit:
        """A transmit of the datagrams from ``first`` on (after a partial send accepted
        ``first`` leading datagrams). ``first`` must be in ``1..segment_count - 1``."""
        count = self.segment_count
        if not 0 < first < count:
            raise IndexError(f"suffix start {first} out of range for {count} segments")
        size = self.segment_size
        assert size is not None
        rest = memoryview(self.contents)[first * size :]
        return DatagramTransmit(self.destination, rest, size, self.ecn)


@dataclass(slots=True)
class DatagramRecvMeta:
    """What one filled receive buffer holds: ``length`` bytes from ``source`` that split into
    datagrams of ``stride`` bytes (the last may be shorter). A plain receive has
    ``stride == length``; ``ecn`` is the received ECN codepoint when the carrier reports it.

    Treat received metas as read-only: a carrier may hand out one object for several datagrams
    that share every field, within one receive call or across calls (the Unix carrier does, so
    a stream of equal-size datagrams from one sender costs no object per datagram).

    Maintenance note: the kernel and in-process carriers build one of these per received
    datagram, so their receive loops skip the Python-level ``__init__`` call (most of the
    construction cost on Python 3.11): ``object.__new__(DatagramRecvMeta)`` followed by one
    assignment per field (``_udp.py``, ``_unix.py``, ``_inproc.py``). A field added here must
    be assigned there too.
    """

    source: DatagramAddr
    length: int
    stride: int
    ecn: int | None = None

    @property
    def segment_count(self) -> int:
        """Number of datagrams in the buffer."""
        if self.stride <= 0 or self.stride >= self.length:
            return 1
        return -(-self.length // self.stride)

    def segments(self, buffer: Buffer) -> list[memoryview]:
        """Split the filled prefix of ``buffer`` into its datagrams (views, no copies)."""
        view = memoryview(buffer)[: self.length]
        stride = self.stride
        if stride <= 0 or stride >= self.length:
            return [view]
        return [view[i : i + stride] for i in range(0, self.length, stride)]


# --------------------------------------------------------------------------------------------
# Shared lifecycle helper


class _Once:
    """Wraps a waker so it runs at most once even when several parties may fire it."""

    __slots__ = ("_lock", "_waker")

    def __init__(self, waker: Waker) -> None:
        self._waker: Waker | None = waker
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            waker, self._waker = self._waker, None
        if waker is not None:
            waker()

    @property
    def fired(self) -> bool:
        """Whether the wrapped waker was called (a fired wrapper can be forgotten)."""
        return self._waker is None


#: Most wakers one waker collection holds (see :func:`_park_waker`).
_MAX_PARKED: Final = 1024


def _park_waker(wakers: dict[Waker, None], waker: Waker) -> list[Waker] | None:
    """Add ``waker`` to a bounded waker collection (an insertion-ordered set; the caller holds
    the lock that guards it). A waker already present is kept once.

    Returns ``None``, or, when the collection is full, every waker in it plus ``waker``, with
    the collection emptied: the caller calls them outside its lock. Such a wake is spurious
    (each waiter re-checks and registers again), so the collection stays bounded while any
    number of parties wait, and no waiter is ever forgotten.
    """
    if len(wakers) < _MAX_PARKED or waker in wakers:
        wakers[waker] = None
        return None
    flushed = [*wakers, waker]
    wakers.clear()
    return flushed


def once(waker: Waker) -> Waker:
    """Return ``waker`` wrapped so that calling the result more than once runs it once."""
    if isinstance(waker, _Once):
        return waker
    return _Once(waker)


#: A table of a socket's own waiting sends reaches this size before fired entries are pruned.
_OWN_WAKER_PRUNE: Final = 256


def _remember_waker(table: dict[Waker, _Once], waker: Waker) -> tuple[_Once, list[_Once]]:
    """Record ``waker`` in ``table``, a socket's own waiting sends (the caller holds the lock
    that guards it), wrapped to run once: the destination and the socket's shutdown may both
    call it. A waker registered again while its wrapper has not fired reuses it.

    Returns the wrapper and a list of evicted wrappers for the caller to call outside its lock:
    fired entries are pruned once the table reaches 256 entries, and if it still holds
    :data:`_MAX_PARKED` the rest are evicted and called early (a spurious wake).
    """
    wrapped = table.get(waker)
    if wrapped is not None and not wrapped.fired:
        return wrapped, []
    evicted: list[_Once] = []
    if len(table) >= _OWN_WAKER_PRUNE:
        for key in [key for key, entry in table.items() if entry.fired]:
            del table[key]
        if len(table) >= _MAX_PARKED:
            evicted = list(table.values())
            table.clear()
    wrapped = table[waker] = _Once(waker)
    return wrapped, evicted


class ShutdownState:
    """Thread-safe lifecycle of one socket: running, shut down, released (spec 2.4).

    Holds the latest receive waker and every send waker (at most 1,024: at the bound the
    parked ones are called early, a spurious wake) so that ``shutdown`` can wake them all;
    carriers without a descriptor keep their own per-destination send wakers and use
    ``on_shutdown`` hooks. ``shutdown()`` returns ``True`` only for the call that performed it.
    ``join(timeout, release)`` waits for the shutdown and then runs ``release`` until it
    succeeds once: the first joiner runs it and later joiners wait for it; if it raises, that
    joiner gets the exception and a joiner that was waiting (or comes later) runs it again, so
    no joiner reports a release that failed.
    """

    __slots__ = ("_lock", "_recv_waker", "_released", "_send_wakers", "_shut", "closed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.closed = False  # read without the lock on hot paths; only ever goes False->True
        self._recv_waker: Waker | None = None
        self._send_wakers: dict[Waker, None] = {}
        self._shut = threading.Event()
        # The release in progress or done: (finished, succeeded); None when none is.
        self._released: tuple[threading.Event, list[bool]] | None = None

    def check(self) -> None:
        """Raise :class:`SocketClosedError` if shut down."""
        if self.closed:
            raise SocketClosedError()

    def set_recv_waker(self, waker: Waker) -> None:
        """Keep ``waker`` as the receive waker; call it now if already shut down."""
        with self._lock:
            if not self.closed:
                self._recv_waker = waker
                return
        waker()

    def take_recv_waker(self) -> Waker | None:
        """Remove and return the receive waker (to call it outside any lock)."""
        with self._lock:
            waker, self._recv_waker = self._recv_waker, None
        return waker

    def set_send_waker(self, waker: Waker) -> None:
        """Add ``waker`` to the socket-wide send wakers (all are called on shutdown); call it
        now if shut down."""
        with self._lock:
            closed = self.closed
            flushed = None if closed else _park_waker(self._send_wakers, waker)
        if closed:
            waker()
        elif flushed:
            for parked in flushed:
                parked()

    def shutdown(self, on_shutdown: Callable[[], None] | None = None) -> bool:
        """Move to shut down, run ``on_shutdown`` (first call only), then wake the receive
        waker and every send waker. ``True`` only for the first call."""
        with self._lock:
            if self.closed:
                return False
            self.closed = True
            wakers = [*self._send_wakers]
            if self._recv_waker is not None:
                wakers.append(self._recv_waker)
            self._recv_waker = None
            self._send_wakers.clear()
        try:
            if on_shutdown is not None:
                on_shutdown()
        finally:
            self._shut.set()
            for waker in wakers:
                waker()
        return True

    @property
    def is_shutdown(self) -> bool:
        """Whether ``shutdown`` has been called."""
        return self.closed

    def join(self, timeout: float | None, release: Callable[[], None]) -> bool:
        """Wait up to ``timeout`` seconds for shutdown, then for ``release`` to have run
        successfully once (running it if no other joiner is); return whether everything is
        released. An exception from ``release`` propagates to the joiner that ran it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._shut.wait(timeout):
            return False
        while True:
            with self._lock:
                attempt = self._released
                runner = attempt is None
                if attempt is None:
                    attempt = self._released = (threading.Event(), [])
            finished, succeeded = attempt
            if runner:
                try:
                    release()
                except BaseException:
                    with self._lock:
                        self._released = None  # the next joiner tries again
                    finished.set()
                    raise
                succeeded.append(True)
                finished.set()
                return True
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not finished.wait(remaining):
                return False
            if succeeded:
                return True
            # The release failed in another joiner: try it ourselves (within our timeout).
            if deadline is not None and time.monotonic() >= deadline:
                return False


# --------------------------------------------------------------------------------------------
# The contract


class DatagramSocket(abc.ABC):
    """A bound, non-blocking datagram socket of one carrier (spec 2.3).

    Subclasses implement the abstract methods; ``try_send_transmit``, ``try_recv_from``,
    the readiness helpers, the segment limits and the context manager have defaults.
    Sockets are safe to use from several threads, but at most one receive may be pending at a
    time (only the latest receive waker is kept).
    """

    # Remainder of a split aggregate left by the default try_recv_from: (blob, offset,
    # stride, source). Class-level default so subclasses need not call __init__.
    _split_remainder: tuple[bytes, int, int, DatagramAddr] | None = None

    # -- identity -------------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def local_addr(self) -> DatagramAddr:
        """The stable address of this binding (what peers see as the source)."""

    # -- sending --------------------------------------------------------------------------

    @abc.abstractmethod
    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        """Send ``data`` as one datagram now. ``False`` if the carrier would block.

        Raises :class:`SocketClosedError` after shutdown, :class:`DatagramTooLargeError`,
        :class:`UnsupportedSchemeError` for a destination of another scheme, and the
        carrier's delivery errors (:class:`HostUnreachableError`,
        :class:`ConnectionRefusedDatagramError`, ...).
        """

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        """Send the leading datagrams of ``transmit``; return how many were accepted.

        ``0`` means the carrier would block before accepting anything. An error is raised only
        if nothing was accepted; after partial progress the caller retries the unsent suffix
        (``transmit.suffix(k)``) and sees any persistent error there. At most
        :data:`DATAGRAM_BATCH_SIZE` datagrams are accepted per call by the default
        implementation, which loops ``try_send_to`` over the segments.
        """
        count = min(transmit.segment_count, DATAGRAM_BATCH_SIZE)
        destination = transmit.destination
        if count == 1:
            return 1 if self.try_send_to(transmit.contents, destination) else 0
        view = memoryview(transmit.contents)
        size = transmit.segment_size
        assert size is not None
        sent = 0
        try:
            for start in range(0, count * size, size):
                if not self.try_send_to(view[start : start + size], destination):
                    break
                sent += 1
        except OSError:
            if sent == 0:
                raise
        return sent

    # -- receiving ------------------------------------------------------------------------

    @abc.abstractmethod
    def try_recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """Fill a prefix of ``buffers`` with received data; return how many were filled.

        Each filled buffer holds one datagram, or an aggregate of equal-size datagrams
        (``stride < length``), written from offset 0; one :class:`DatagramRecvMeta` per filled
        buffer is appended to ``metas``. At most ``min(len(buffers), DATAGRAM_BATCH_SIZE)``
        buffers are filled; ``0`` means nothing is ready. A datagram longer than its buffer
        raises :class:`InvalidDataError` (the datagram is consumed); when that happens after
        other buffers were filled in the same call, those are returned first and the error is
        raised by the next call. Data is only written during the call; a carrier may keep a
        ``bytearray`` exported between calls (the Unix and UDP carriers cache the kernel headers
        of a reused buffer list, so such a buffer cannot be resized until ``release_buffers()``
        or shutdown).
        """

    def try_recv_from(self) -> tuple[bytes, DatagramAddr] | None:
        """Receive one whole datagram and its source, or ``None`` if nothing is ready.

        Aggregates are split: the first datagram is returned and the rest are returned by the
        following calls, in order. The default implementation receives through ``try_recv``
        into a scratch buffer; carriers whose ``try_recv`` can return aggregates must also
        serve ``_split_remainder`` first in their ``try_recv`` (or override this method).
        """
        remainder = self._split_remainder
        if remainder is not None:
            return self._next_from_remainder(remainder)
        metas: list[DatagramRecvMeta] = []
        scratch = bytearray(MAX_DATAGRAM_SIZE)
        if self.try_recv((scratch,), metas) == 0:
            return None
        meta = metas[0]
        if meta.stride <= 0 or meta.stride >= meta.length:
            return bytes(scratch[: meta.length]), meta.source
        return self._next_from_remainder(
            (bytes(scratch[: meta.length]), 0, meta.stride, meta.source)
        )

    def _next_from_remainder(
        self, remainder: tuple[bytes, int, int, DatagramAddr]
    ) -> tuple[bytes, DatagramAddr]:
        blob, offset, stride, source = remainder
        end = offset + stride
        self._split_remainder = (blob, end, stride, source) if end < len(blob) else None
        return blob[offset:end], source

    # -- readiness ------------------------------------------------------------------------

    @abc.abstractmethod
    def fileno(self) -> int | None:
        """A kernel descriptor that becomes readable when a receive may succeed and writable
        when a send may, or ``None`` for carriers without one (then use the wakers)."""

    def readiness_fds(self) -> list[int]:
        """Every descriptor whose readability means a receive may succeed.

        ``[fileno()]`` or ``[]`` for a single carrier; a :class:`DatagramSocketSet` lists the
        descriptors of all its members (and relies on the receive waker for the rest). Adapters
        wait for "any of these readable, or the receive waker called".
        """
        fd = self.fileno()
        return [] if fd is None else [fd]

    def send_readiness_fd(self, destination: DatagramAddr) -> int | None:
        """The descriptor whose writability means a send to ``destination`` may succeed, or
        ``None`` (then wait for the send waker)."""
        return self.fileno()

    @abc.abstractmethod
    def add_recv_waker(self, waker: Waker) -> None:
        """Register the one-shot receive waker (replacing any earlier one); see the module
        docstring for when it is called."""

    @abc.abstractmethod
    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        """Register a one-shot waker for sends to ``destination``; see the module docstring."""

    # -- limits ---------------------------------------------------------------------------

    @property
    def max_transmit_segments(self) -> int:
        """Preferred maximum datagrams per :class:`DatagramTransmit`."""
        return 1

    @property
    def max_receive_segments(self) -> int:
        """Most datagrams one receive buffer may hold (aggregates)."""
        return 1

    @property
    def may_fragment(self) -> bool:
        """Whether the carrier may fragment below the transport (IP fragmentation)."""
        return True

    # -- lifecycle ------------------------------------------------------------------------

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Idempotent, non-blocking: stop the socket, wake every waker; afterwards every
        operation raises :class:`SocketClosedError`."""

    @property
    @abc.abstractmethod
    def is_shutdown(self) -> bool:
        """Whether ``shutdown`` has been called."""

    @abc.abstractmethod
    def join(self, timeout: float | None = None) -> bool:
        """Block until the socket is shut down and every resource it owns is released
        (kernel socket closed, socket file removed). ``False`` if ``timeout`` seconds passed
        first."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
        self.join()
