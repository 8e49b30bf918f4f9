"""``recvmmsg`` straight into the caller's buffers, with the kernel headers cached per buffer list.

Why: a receive loop that calls ``recvfrom_into`` once per datagram pays a system call, a result
tuple and a source-address object per datagram; for small datagrams that is most of a
carrier's receive cost. One ``recvmmsg`` call (through :mod:`ctypes`, as the switch's
:class:`~chrysalis.datagram._mmsg.RecvRing` does) fills up to 32 buffers and reports every
length and source in kernel-written headers that Python reads a column at a time. Copying out
of a ring of our own buffers was measured slower than the per-datagram loop, so the headers
point at the *caller's* buffers instead; building them costs far more than a receive, so they
are cached per buffer list and a caller that reuses its buffers (every receive loop in this
repository does) pays one system call per batch and no per-buffer work.

Memory safety: a :class:`RecvBatch` holds a strong reference to each of its buffers and a ctypes
export of each (``from_buffer``), so while it is cached a buffer can be neither freed nor
resized and its address stays what the iovec says; every call checks, by identity, that the
buffers it offers to the kernel are the very objects of the batch. Only plain ``bytearray``
buffers and whole ``mmap`` objects (``_socket.mapped_buffers``: a datagram switch's, faulted in
only where datagrams land) are cached: a ``memoryview`` with an export cannot be
``release()``-d, which callers do (``with memoryview(...)``); anything else takes the carrier's
per-datagram loop. The export is visible to a caller in one way: a cached ``bytearray`` cannot
be resized, nor a cached ``mmap`` closed, until the batch is dropped (at most four are kept,
the oldest dropped first; carriers drop them on shutdown and offer ``release_buffers()``). A
buffer list is cached only when it is seen a second time, so one-off buffers never get an
export.

Every header the kernel rewrites (``msg_namelen``, ``msg_len``, ``msg_flags``) is restored from
a template after each call; callers hold a lock from the call until they have read the
headers, so two threads never share one set of headers. Calls pass ``MSG_TRUNC``, so
``msg_len`` is a datagram's full length and truncation shows as a length above the buffer's
size.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import operator
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from chrysalis.core import DatagramAddr
from chrysalis.datagram._mmsg import _HDR_SIZE, _Iovec, _Mmsghdr, _recvmmsg
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    Buffer,
    DatagramRecvMeta,
    InvalidDataError,
    ReceiveBuffer,
    ShutdownState,
    SocketClosedError,
)

__all__ = [
    "RECVMMSG_FLAGS",
    "BatchCache",
    "BatchReceiver",
    "RecvBatch",
    "recvmmsg_function",
]

_MSG_TRUNC: Final = 0x20
_MSG_DONTWAIT: Final = 0x40
#: Flags of every call: non-blocking, and ``msg_len`` is the full datagram length.
RECVMMSG_FLAGS: Final = _MSG_DONTWAIT | _MSG_TRUNC
#: Buffer lists a cache keeps (the oldest built is dropped first).
BATCH_CACHE_LIMIT: Final = 4
_is: Final = operator.is_
_EXPECTED_LIMIT: Final = 64
#: Keys of buffer lists seen once, remembered so that the second sighting builds a batch.
_SEEN_LIMIT: Final = 64


def recvmmsg_function() -> Callable[..., int] | None:
    """The C library's ``recvmmsg`` (called as ``f(fd, c_void_p headers, vlen, flags, None)``,
    errno through ``ctypes.get_errno``), or ``None`` where it is unavailable."""
    return _recvmmsg


def _no_recvmmsg(*args: object) -> int:
    raise OSError(errno.ENOSYS, "recvmmsg is not available on this platform")


#: What :class:`BatchReceiver` calls: the C library's recvmmsg, or ``_no_recvmmsg`` (then
#: receivers built afterwards take their per-datagram loop; tests swap it too).
_recvmmsg_call: Callable[..., int] = _recvmmsg or _no_recvmmsg
_new_object: Final = object.__new__
#: Buffers offered to the next recvmmsg after a batch of ``i`` datagrams: ``2 * i + 2``,
#: within 4..32 (a full batch doubles the offer; a short one shrinks it).
_WANT: Final = tuple(min(DATAGRAM_BATCH_SIZE, max(4, 2 * i + 2)) for i in range(1025))
#: Whether the call after a batch that emptied the queue takes the per-datagram loop (tests
#: switch it off to reach the batch path every time).
_PROBE_AFTER_DRAIN = True
#: A datagram kept from a batch for a later call: its copy and source, or its error.
_Pending = tuple[bytes, DatagramAddr] | OSError
#: The buffer types a batch may cache (see the module docstring).
_CACHEABLE: Final = frozenset((bytearray, mmap.mmap))


class RecvBatch:
    """The ``mmsghdr`` array, iovecs and source-address slots for one list of buffers.

    ``hdr_addr`` is what ``recvmmsg`` gets, ``count`` the number of buffers (its ``vlen``).
    After a call that returned ``n``: ``words[14 : n << 4 : 16]`` are the datagram lengths,
    ``words[2 : n << 4 : 16]`` the source-address lengths, and slot ``i`` of ``names``
    (``name_slot`` bytes each, from ``i * name_slot``) holds source ``i``; :meth:`restore`
    resets the headers for the next call.
    """

    __slots__ = (
        "_expected",
        "_keepalive",
        "block",
        "buffers",
        "count",
        "expected_get",
        "hdr_addr",
        "headers",
        "headers_view",
        "min_size",
        "name_slot",
        "names",
        "names_view",
        "prefixes",
        "sizes",
        "template",
        "words",
    )

    def __init__(self, buffers: Sequence[ReceiveBuffer], name_slot: int) -> None:
        count = len(buffers)
        if not 1 <= count <= 1024:
            raise ValueError(f"a batch holds 1 to 1024 buffers, not {count}")
        if name_slot <= 0 or name_slot % 8:
            raise ValueError("name slots are a positive multiple of 8 bytes")
        self.buffers = tuple(buffers)
        self.count = count
        # prefixes[k]: the first k buffers, for an identity test of only the offered ones.
        self.prefixes = [self.buffers[:k] for k in range(count + 1)]
        self.name_slot = name_slot
        self.sizes = [len(buffer) for buffer in self.buffers]
        self.min_size = min(self.sizes)
        # Exports: each keeps its buffer from being resized (a bytearray), closed (an mmap)
        # or freed while the batch lives.
        data = [(ctypes.c_char * len(buffer)).from_buffer(buffer) for buffer in self.buffers]
        iovecs = (_Iovec * count)()
        self.names = bytearray(name_slot * count)
        names = (ctypes.c_char * len(self.names)).from_buffer(self.names)
        headers_buffer = bytearray(_HDR_SIZE * count)
        headers = (_Mmsghdr * count).from_buffer(headers_buffer)
        iovec_size = ctypes.sizeof(_Iovec)
        for i in range(count):
            iovecs[i].base = ctypes.addressof(data[i])
            iovecs[i].len = self.sizes[i]
            hdr = headers[i].hdr
            hdr.name = ctypes.addressof(names) + i * name_slot
            hdr.namelen = name_slot
            hdr.iov = ctypes.addressof(iovecs) + i * iovec_size
            hdr.iovlen = 1
        self._keepalive = (data, iovecs, names, headers, headers_buffer)
        self.hdr_addr = ctypes.c_void_p(ctypes.addressof(headers))
        self.template = memoryview(bytes(headers_buffer))
        self.headers = headers_buffer
        self.headers_view = memoryview(headers_buffer)
        self.words = memoryview(headers_buffer).cast("I")
        self.names_view = memoryview(self.names)
        # (namelen, length, count) -> the first count headers as a call leaves them when
        # every datagram has that length and a source of that namelen (see uniform()).
        self._expected: dict[tuple[int, int, int], bytes] = {}
        self.expected_get = self._expected.get
        # The source slots of the last uniform batch, for the same test: (namelen, the
        # source's bytes after the family, every slot as it was); namelen 0 matches nothing.
        self.block: tuple[int, bytes, bytes] = (0, b"", b"")

    def uniform(self, namelen: int, length: int, count: int) -> bytes:
        """The first ``count`` headers as a call leaves them when every datagram is
        ``length`` bytes (not truncated) from a source of ``namelen`` bytes: a caller
        recognises such a batch with one ``headers.startswith`` (a ``memcmp``) and finds it
        again with ``expected_get((namelen, length, count))``. At most 64 are kept."""
        words = memoryview(bytearray(self.template[: count * _HDR_SIZE])).cast("I")
        for i in range(2, count << 4, 16):
            words[i] = namelen
            words[i + 12] = length
        expected = words.tobytes()
        if len(self._expected) >= _EXPECTED_LIMIT:
            self._expected.clear()
        self._expected[namelen, length, count] = expected
        return expected

    def restore(self, filled: int) -> None:
        """Reset the headers of the first ``filled`` messages (what the kernel rewrote)."""
        end = filled * _HDR_SIZE
        self.headers_view[:end] = self.template[:end]


class BatchCache:
    """The :class:`RecvBatch` objects of the last few buffer lists (at most
    :data:`BATCH_CACHE_LIMIT`; the oldest is dropped first).

    ``batches`` is a tuple, replaced whole, so a reader never sees it half-changed. A
    receiver scans it for a batch whose first ``want`` buffers are the very objects it is
    about to offer (``operator.is_`` at C speed over ``batch.prefixes[want]``, which also
    rejects another list at its first buffer). On a miss, ``build(buffers)`` makes one on the
    list's second sighting (remembered by its length and its end buffers' ids, which only
    matters for speed: a reused id at worst builds a batch early).
    """

    __slots__ = ("_name_slot", "_seen", "batches")

    def __init__(self, name_slot: int) -> None:
        self._name_slot = name_slot
        self.batches: tuple[RecvBatch, ...] = ()
        self._seen: dict[tuple[int, int, int], None] = {}

    def build(self, buffers: Sequence[object]) -> RecvBatch | None:
        """A new cached batch for ``buffers``, or ``None`` when they are seen for the first
        time or are not all plain ``bytearray`` or ``mmap`` objects (receive without one)."""
        if type(buffers[0]) not in _CACHEABLE:  # memoryviews: never, and cheaply so
            return None
        # A sighting is recognised by the list's length and its end buffers: only a hint
        # (the batch is built from, and checked against, the objects themselves).
        key = (len(buffers), id(buffers[0]), id(buffers[-1]))
        seen = self._seen
        if key not in seen:
            if len(seen) >= _SEEN_LIMIT:
                seen.clear()
            seen[key] = None
            return None
        arrays = [cast("ReceiveBuffer", buffer) for buffer in buffers if type(buffer) in _CACHEABLE]
        if len(arrays) != len(buffers):
            return None
        del seen[key]
        batch = RecvBatch(arrays, self._name_slot)
        # Oldest last: the dropped batch releases its exports when collected.
        self.batches = (batch, *self.batches[: BATCH_CACHE_LIMIT - 1])
        return batch

    def clear(self) -> None:
        """Drop every batch (releasing the buffer exports) and every sighting."""
        self.batches = ()
        self._seen.clear()

    def __len__(self) -> int:
        return len(self.batches)


class BatchReceiver:
    """``try_recv`` through cached batches, for a kernel carrier (mixed in before
    :class:`~chrysalis.datagram._socket.DatagramSocket`).

    The carrier calls :meth:`_init_batches` in its constructor and provides the state and
    hooks declared below: its per-datagram loop (``_recv_each``, also the fallback), its
    error rules (``_check_recv``, ``_recv_error``), the conversion of a kernel source address
    (``_new_raw_source``: the ``msg_name`` bytes after the 2-byte family for Unix, the whole
    ``sockaddr`` for UDP, cached in ``_sources`` through ``_source_lookup``), and
    ``_unnamed_len`` / ``_unnamed_error`` for sources without an address. It must close its
    descriptor under ``_fd_lock``, call :meth:`_drop_batches` on shutdown, and serve
    ``_pending`` first in ``try_recv_from`` (see :meth:`_next_pending`).
    """

    _state: ShutdownState
    _fd: int
    _deferred_error: OSError | None
    _recv_memo: tuple[Any, int, DatagramRecvMeta]
    _source_lookup: Callable[[Any], DatagramAddr | None]
    #: A ``msg_namelen`` of at most this means a sender without an address.
    _unnamed_len: int = -1
    #: Receive with recvmmsg when the next offer (``_WANT`` of the last batch) reaches this:
    #: 8 means from batches of three datagrams on. Below it the per-datagram loop is cheaper.
    _batch_from: int = 8
    _batches: BatchCache | None
    _fd_lock: threading.Lock
    _pending: deque[_Pending]
    _recv_want: int
    _recv_plain: bool

    def _init_batches(self, name_slot: int, *, enabled: bool) -> None:
        """Set up batched receives (when ``enabled`` and the platform has recvmmsg)."""
        on = enabled and _recvmmsg_call is not _no_recvmmsg
        self._batches = BatchCache(name_slot) if on else None
        # Buffers the next recvmmsg offers, and whether the next call takes the per-datagram
        # loop instead (hints, read and written without a lock).
        self._recv_want = DATAGRAM_BATCH_SIZE if on else 0
        self._recv_plain = not on
        # Held around each recvmmsg call and around closing the socket, so that a call never
        # reaches a descriptor number that join closed (and the kernel may have reused).
        self._fd_lock = threading.Lock()
        # Datagrams after an unusable one in a batch, served (in order) before new ones; at
        # most 31 (one batch), only ever filled when empty.
        self._pending = deque()

    def _recv_each(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        raise NotImplementedError

    def _check_recv(self) -> None:
        raise NotImplementedError

    def _recv_error(self, error: OSError, filled: int) -> int:
        raise NotImplementedError

    def _new_raw_source(self, sockaddr: bytes) -> DatagramAddr:
        raise NotImplementedError

    def _unnamed_error(self) -> OSError:
        raise NotImplementedError

    def _drop_batches(self) -> None:
        """On shutdown: release the buffer exports and forget kept datagrams."""
        self.release_buffers()
        self._pending.clear()

    def _next_pending(self) -> tuple[bytes, DatagramAddr]:
        """``try_recv_from``'s share of ``_pending`` (non-empty): the next datagram or error."""
        item = self._pending.popleft()
        if isinstance(item, OSError):
            raise item
        return item

    def try_recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """Drain up to ``min(len(buffers), 32)`` datagrams, one per buffer (the carrier's
        per-datagram loop when batches are off or the buffers are not cached)."""
        if self._state.closed or self._deferred_error is not None or self._pending:
            return self._recv_backlog(buffers, metas)
        if self._recv_plain or not buffers:
            # The per-datagram loop: always without batches; otherwise for a few datagrams
            # (up to about three; the carrier sets the bound) and for the "nothing yet"
            # answer, which it gives for about half a recvmmsg call and its set-up. It
            # serves the call right after one that emptied the queue (mostly nothing, or
            # what arrived since) and every call while batches stay small.
            filled = self._recv_each(buffers, metas)
            if filled:
                if self._batches is not None:
                    want = self._recv_want = _WANT[filled]
                    self._recv_plain = want < self._batch_from or (
                        _PROBE_AFTER_DRAIN and filled < len(buffers)
                    )
            elif self._recv_want >= self._batch_from:  # (0 without batches: never true)
                self._recv_plain = False  # after "nothing yet" comes a wake: batch again
            return filled
        batches = self._batches
        assert batches is not None  # _recv_plain is set for good without batches
        # One recvmmsg call into the caller's buffers through headers cached for these buffer
        # objects (_recvmmsg.py); the first sighting of a list, and buffers that are not
        # bytearrays or whole mmaps, take the per-datagram loop. The call offers only the
        # first ``want`` buffers (about twice the last batch, 4 to 32), and only those are
        # checked: the identity test costs about as much per buffer as the kernel's work per
        # datagram.
        want = self._recv_want
        if len(buffers) < want:
            want = len(buffers)
        for batch in batches.batches:
            if batch.count >= want and all(map(_is, buffers, batch.prefixes[want])):
                break
        else:
            if len(buffers) > DATAGRAM_BATCH_SIZE:
                buffers = buffers[:DATAGRAM_BATCH_SIZE]
            built = batches.build(buffers)
            if built is None:
                return self._recv_each(buffers, metas)
            batch = built
        # The lock covers the call and every read of the batch's headers (threads never
        # share them) and keeps join from closing the descriptor under the call (a closed
        # number may be reused by another socket at once).
        state = self._state
        with self._fd_lock:
            if state.closed:
                raise SocketClosedError()
            count = _recvmmsg_call(self._fd, batch.hdr_addr, want, RECVMMSG_FLAGS, None)
            if count <= 0:
                return self._recvmmsg_failed()
            if state.is_shutdown:  # shut down during the call: what it took is dropped
                batch.restore(count)
                raise SocketClosedError()
            next_want = self._recv_want = _WANT[count]
            if count < want or next_want < self._batch_from:
                # The kernel found the queue empty before the offer was filled (the next
                # call mostly finds nothing), or the batch was small.
                self._recv_plain = _PROBE_AFTER_DRAIN or next_want < self._batch_from
            # The common batch: one sender, one length, nothing truncated. Its headers are
            # exactly a cached expectation and its source slots exactly the last uniform
            # batch's (two memcmp calls); anything else is read datagram by datagram.
            words = batch.words
            namelen = words[2]
            size = words[14]
            expected = batch.expected_get((namelen, size, count))
            block_namelen, sockaddr, block = batch.block
            if (
                expected is None
                or block_namelen != namelen
                or not batch.headers.startswith(expected)
                or not block.startswith(batch.names_view[: batch.name_slot * count])
            ):
                return self._deliver_each(batch, count, metas)
            end = count * _HDR_SIZE  # restore what the kernel rewrote (batch.restore)
            batch.headers_view[:end] = batch.template[:end]
        last_sockaddr, last_size, meta = self._recv_memo
        if sockaddr != last_sockaddr or size != last_size:
            meta = self._new_meta(sockaddr, size, last_sockaddr, meta)
        if count == 1:
            metas.append(meta)
        else:
            metas += [meta] * count
        return count

    def _new_meta(
        self, sockaddr: bytes, size: int, last_sockaddr: object, last: DatagramRecvMeta
    ) -> DatagramRecvMeta:
        """The meta of a uniform batch that does not continue the previous one (kept as the
        memo for the next batch)."""
        source = last.source
        if sockaddr != last_sockaddr:
            source = self._source_lookup(sockaddr) or self._new_raw_source(sockaddr)
        meta = _new_object(DatagramRecvMeta)
        meta.source = source
        meta.length = meta.stride = size
        meta.ecn = None
        self._recv_memo = (sockaddr, size, meta)
        return meta

    def _deliver_each(self, batch: RecvBatch, count: int, metas: list[DatagramRecvMeta]) -> int:
        """Report the ``count`` datagrams of a batch one by one (the caller holds the lock):
        senders or lengths differ, or a datagram is unusable (too long for its buffer, or
        from an unnamed socket). The datagrams before an unusable one are returned now; the
        error and everything after it (copied out of the caller's buffers) are kept, in
        order, for the next calls. A batch that turns out uniform teaches ``batch`` its
        expected headers, so that the next one like it takes the fast path."""
        words = batch.words
        stop = count << 4
        lengths: list[int] = words[14:stop:16].tolist()
        namelens: list[int] = words[2:stop:16].tolist()
        size = lengths[0]
        namelen = namelens[0]
        view = batch.names_view
        slot = batch.name_slot
        if (
            namelen > self._unnamed_len
            and size <= batch.min_size
            and not any(words[12:stop:16])
            and lengths.count(size) == count
            and namelens.count(namelen) == count
        ):
            # Uniform after all (a new sender or length): teach the batch, so that the next
            # such batch takes try_recv's fast path.
            names = batch.names
            if names[: slot * count] == names[:slot] * count:
                if batch.expected_get((namelen, size, count)) is None:
                    batch.uniform(namelen, size, count)
                block = bytes(names[:slot]) * batch.count
                batch.block = (namelen, view[2:namelen].tobytes(), block)
        batch.restore(count)
        sizes = batch.sizes
        last_sockaddr, last_size, meta = self._recv_memo
        source = meta.source
        for i in range(count):
            size = lengths[i]
            namelen = namelens[i]
            if size > sizes[i] or namelen <= self._unnamed_len:
                self._recv_memo = (last_sockaddr, last_size, meta)
                return self._stash(batch, i, count, lengths, namelens)
            start = i * slot
            sockaddr = view[start + 2 : start + namelen].tobytes()
            if sockaddr != last_sockaddr:
                source = self._source_lookup(sockaddr) or self._new_raw_source(sockaddr)
                last_sockaddr = sockaddr
                last_size = -1
            if size != last_size:
                meta = _new_object(DatagramRecvMeta)
                meta.source = source
                meta.length = meta.stride = size
                meta.ecn = None
                last_size = size
            metas.append(meta)
        self._recv_memo = (last_sockaddr, last_size, meta)
        return count

    def _stash(
        self, batch: RecvBatch, first: int, count: int, lengths: list[int], namelens: list[int]
    ) -> int:
        """Keep datagrams ``first..count-1`` of a batch, the first of which is unusable, as
        errors and copies for the next calls (at most 31 entries, since a batch holds at most
        32); return ``first`` (raising the first error when it is 0)."""
        pending = self._pending
        view = batch.names_view
        slot = batch.name_slot
        for i in range(first, count):
            size = lengths[i]
            namelen = namelens[i]
            if size > batch.sizes[i]:
                pending.append(
                    InvalidDataError(
                        f"datagram of {size} bytes exceeds the {batch.sizes[i]}-byte buffer"
                    )
                )
            elif namelen <= self._unnamed_len:
                pending.append(self._unnamed_error())
            else:
                start = i * slot
                sockaddr = view[start + 2 : start + namelen].tobytes()
                source = self._source_lookup(sockaddr) or self._new_raw_source(sockaddr)
                pending.append((bytes(batch.buffers[i][:size]), source))
        if first == 0:
            error = pending.popleft()
            assert isinstance(error, OSError)  # the first kept datagram is the unusable one
            raise error
        return first

    def _recv_backlog(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """The slow entry of ``try_recv``: raise after shutdown or a kept error, and serve
        datagrams kept from an earlier batch (in order, errors included) before any more
        are received."""
        self._check_recv()
        pending = self._pending
        limit = min(len(buffers), DATAGRAM_BATCH_SIZE)
        filled = 0
        while pending:
            item = pending[0]
            if isinstance(item, OSError):
                if filled:
                    return filled
                pending.popleft()
                raise item
            if filled == limit:
                return filled
            data, source = item
            pending.popleft()
            buffer = memoryview(buffers[filled]).cast("B")
            if len(data) > len(buffer):
                error = InvalidDataError(
                    f"datagram of {len(data)} bytes exceeds the {len(buffer)}-byte buffer"
                )
                if filled:
                    pending.appendleft(error)
                    return filled
                raise error
            buffer[: len(data)] = data
            metas.append(DatagramRecvMeta(source, len(data), len(data)))
            filled += 1
        return filled  # (0 only if another thread took what was kept: "nothing yet")

    def _recvmmsg_failed(self) -> int:
        """``recvmmsg`` returned -1 (or 0): would block, or a kernel error to raise."""
        code = ctypes.get_errno()
        if self._state.closed:
            raise SocketClosedError()
        if code in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR, 0):
            return 0  # an interrupted call reads as "nothing yet": the caller polls again
        return self._recv_error(OSError(code, os.strerror(code)), 0)

    def release_buffers(self) -> None:
        """Forget the receive buffers cached for batched receives, releasing their exports
        (a cached ``bytearray`` cannot be resized; see the module docstring)."""
        if self._batches is not None:
            self._batches.clear()
