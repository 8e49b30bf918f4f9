"""Large out-of-band buffers through shared memory on one host: pooled, sealed ``memfd`` slots.

Why: on a Unix lane a 1 MiB buffer sent inline crosses the kernel twice, in socket-buffer sized
pieces, each a loop wake-up on both sides. A memfd lets the sender copy the buffer once into an
anonymous file and pass only a descriptor (``SCM_RIGHTS``). Nothing is named in any file system,
so nothing can leak: the memory lives exactly as long as a descriptor or a mapping refers to it.

Sender (``ShmPool``): touching fresh pages costs several times a copy into warm ones, so each
lane's sender keeps its slots and reuses one once the receiver said it is done with it. Each
slot is sealed at birth against shrinking and growing (``F_SEAL_SHRINK | F_SEAL_GROW |
F_SEAL_SEAL``: nobody, the receiver included, can change its size again, so a mapping of it can
never fault past its end) and mapped once by the sender (``MAP_POPULATE``), which copies into
that mapping (a ``memcpy``, about twice as fast as ``pwrite`` into the page cache; by
``ctypes.memmove`` with the GIL released, so that the runtime loop's thread sends the frames
queued before and reads replies meanwhile; where ``ctypes`` cannot, a slice assignment in
4 MiB pieces, so other threads get the GIL between them). At most ``max_bytes`` of its own slots are
in flight (sent, not yet acknowledged), and its own slots, in flight and free, hold at most
twice that; a slot of the size in use that would not fit closes free slots of other sizes first.
Over the in-flight bound (the receiver still holds a tensor, say) the buffer goes in a
*detached* slot, a free slot given away or a fresh one (its slot number has ``DETACHED`` set):
the receiver acknowledges it on receipt (detached bytes not yet received have the same bound)
and gives its descriptor back when done with it, and ``adopt`` keeps it as a free slot when it
is a sealed memfd of a slot size within the bound. Over both bounds ``put`` returns ``None`` and
the buffer goes inline.

Receiver (``receive_buffer``): it checks that the descriptor is a regular file holding at least
the announced size. Then, by what the codec rebuilds from the buffer:

- a writable buffer rebuilt in place by a protocol-5 reconstructor (numpy arrays, the codec's
  tensors) in a size-sealed slot is handed over as a private mapping of the slot
  (``MAP_PRIVATE``: the receiver's writes copy the page and never reach the slot, and a fork
  gets a copy-on-write view like any memory; page tables filled at once with
  ``MADV_POPULATE_READ``): no copy at all. The slot is then the object's: the lane
  acknowledges it when the mapping is freed (``weakref.finalize``), and the sender reuses it
  only then;
- a ``bytes`` is copied out of a mapping of the slot that the lane keeps (``SlotViews``: the
  sender reuses its slots, so after the first call of a size the mapping exists and its page
  tables are filled) straight into a new ``bytes`` object, with ``ctypes.memmove`` (the GIL
  released during the copy), and the slot acknowledged at once. Before, a ``pread``: 65 against
  39 us of CPU for 1 MiB here, the kernel looking every page up in the page cache (in a
  profile of pipelined 1 MiB calls the ``pread`` was about 60 % of the worker's CPU time, a
  third of that the page lookups). (A copy out of a kept mapping was tried before with
  ``bytes(mapping[...])``: it holds the GIL, and with calls pipelined the worker's actor thread
  then waited for the loop thread's copies.) The views are bounded (``max_bytes`` of mappings
  per lane, least recently used dropped first); a slot that is not size-sealed, larger than
  that bound, or a Python without ``ctypes.pythonapi`` (not CPython) is read with ``pread``.
  A view keeps its slot's memory alive until it is dropped, also after the sender closed the
  slot: so the bound is also the most memory a receiver keeps that way, per lane;
- a ``bytearray`` is read out (``read_buffer``: ``pread``, one copy, the GIL released
  meanwhile) and the slot acknowledged at once.

The ``bytes`` a receiver reads out are fresh heap memory on every call, and glibc's malloc gave
their pages back to the kernel when they were freed (an allocation of 1 MiB or more is
``mmap``'d, or the top of the heap trimmed, once a few of them were freed together): each read
then faulted in and zeroed every page again (about 220 faults per MiB, half of the worker's CPU
time for a pipelined 1 MiB call went into the ``pread``, 40 % of that in those faults).
``retain_heap`` (called by the lane once it read a buffer into the process's own memory) sets
malloc's thresholds once per process so that freed buffers stay in the heap, warm, for the
next ones: bounded by the trim threshold it sets (the lane passes ``heap_retain``, 16 MiB).

Lent ``bytes`` (``ShmPool.lend``, ``PeerReader``): a ``bytes`` cannot change, so the sender need
not copy it at all. Where the receiver can read the sender's memory (``process_vm_readv``: the
same user, and no ptrace restriction such as Yama's ``ptrace_scope`` >= 1 in the way; probed once
per lane) and the sender named lending in its ``Hello`` (``lane_proto.FEATURE_LEND``), it says
so once, and from then on the sender lends such a buffer: the frame carries
its address, the sender keeps a reference to the object (counted against ``max_bytes`` like a
slot in flight), and the receiver reads it with one ``process_vm_readv`` straight into the new
``bytes`` it hands to the codec (the GIL released meanwhile), then acknowledges the loan like a
slot, which drops the sender's reference. One copy end to end instead of two. The receiver
reads only the process that connected the lane (``SO_PEERCRED``), and checks after each read,
through a pidfd opened when the lane started, that this process is still alive, so a PID reused
after the sender died can never be read. Nothing new is exposed: a process that may
``process_vm_readv`` another may read all of its memory anyway. A sender that closes a lane
with loans not yet acknowledged (its own shutdown, after the transport waited for them within
its flush bound, or a fault) keeps those objects for the rest of its life (``close(park=True)``):
frames already in the socket may still be read, and must never find the memory reused. A lane
closed because the receiver's end went away drops them.

An unsealed descriptor (nothing this package sends) is never mapped: it is read like a
``bytes``, so a file that shrinks under the read is a ``ShmError``, never a fault.

Only Linux has ``memfd_create``; ``available()`` says whether this process can use it, and the
lanes send buffers inline where it cannot.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import itertools
import mmap
import os
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any, Final

__all__ = [
    "DETACHED",
    "LENT",
    "RING_BYTES",
    "AckRing",
    "PeerReader",
    "ShmError",
    "ShmPool",
    "SlotViews",
    "available",
    "lendable",
    "read_buffer",
    "receive_buffer",
    "retain_heap",
]

_WRITE_CHUNK: Final = 64 * 1024 * 1024
_COPY_PIECE: Final = 4 * 1024 * 1024
_PREAD_MAX: Final = 0x7FFFF000  # the most one read(2) returns on Linux
_MIN_SLOT: Final = 64 * 1024
_SIZE_SEALS: Final = getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4)
_F_ADD_SEALS: Final = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_GET_SEALS: Final = getattr(fcntl, "F_GET_SEALS", 1034)
_F_SEAL_SEAL: Final = getattr(fcntl, "F_SEAL_SEAL", 1)
_MADV_POPULATE_READ: Final = 22
_M_TRIM_THRESHOLD: Final = -1  # mallopt parameters (glibc's malloc.h)
_M_MMAP_THRESHOLD: Final = -3
_MMAP_THRESHOLD_MAX: Final = 32 * 1024 * 1024  # the most glibc accepts on 64-bit
DETACHED: Final = 0x8000_0000
"""Slot-number bit of a detached slot: the sender keeps nothing of it; acknowledged on receipt."""
LENT: Final = 0x4000_0000
"""Slot-number bit of a lent buffer: the receiver reads it out of the sender's memory (module
docstring); acknowledged once read."""
RING_BYTES: Final = 16 * 1024
"""Size of an acknowledgement ring (``AckRing``): 4,096 slot numbers."""


class ShmError(ValueError):
    """A descriptor received as a shared-memory buffer is not acceptable."""


def available() -> bool:
    """True when memfds can be created here (Linux)."""
    return hasattr(os, "memfd_create")


_heap_lock = threading.Lock()
_heap_retained: int | None = None


def retain_heap(nbytes: int) -> int:
    """Keep up to ``nbytes`` of freed memory in this process's heap instead of giving it back to
    the kernel at every ``free`` (module docstring): glibc's ``M_TRIM_THRESHOLD`` set to
    ``nbytes`` and ``M_MMAP_THRESHOLD`` to ``min(nbytes, 32 MiB)``, so that buffers up to that
    size come from the heap and their pages stay mapped between calls. Once per process (a
    forked child inherits it); the bytes retained as set by the first call, 0 when nothing was
    changed (``nbytes`` 0, another C library than glibc, or ``mallopt`` refused)."""
    global _heap_retained
    with _heap_lock:
        if _heap_retained is not None:
            return _heap_retained
        _heap_retained = 0
        if nbytes <= 0:
            return 0
        try:
            os.confstr("CS_GNU_LIBC_VERSION")  # ValueError elsewhere (musl, macOS)
            import ctypes  # only here: most processes never receive a large buffer

            mallopt = ctypes.CDLL(None).mallopt
        except (ValueError, OSError, AttributeError):
            return 0
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        limit = min(nbytes, 0x7FFFFFFF)
        if mallopt(_M_MMAP_THRESHOLD, min(limit, _MMAP_THRESHOLD_MAX)) != 1:
            return 0
        if mallopt(_M_TRIM_THRESHOLD, limit) != 1:
            return 0
        _heap_retained = limit
        return limit


def _slot_size(nbytes: int) -> int:
    """Slots come in powers of two (at least 64 KiB), so that they are reused across sizes."""
    return max(_MIN_SLOT, 1 << (nbytes - 1).bit_length())


def _sealed_memfd(size: int) -> int:
    """A fresh memfd of ``size`` bytes whose size nobody can change any more."""
    fd = os.memfd_create("monarch-buffer", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, _F_ADD_SEALS, _SIZE_SEALS | _F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _writable_map(fd: int, size: int) -> mmap.mmap:
    """The sender's mapping of a slot, its page tables filled at once (``MAP_POPULATE``: about
    3 ms for 64 MiB here, where faulting them in page by page during the first copy took
    15 to 30 ms)."""
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))


_RawCopy = Callable[[mmap.mmap, memoryview], None]
_raw_copy: _RawCopy | None = None
_raw_copy_checked = False
_RAW_COPY_MIN: Final = 64 * 1024
_buffer_api: tuple[Any, Any, Any] | None = None  # PyObject_GetBuffer, PyBuffer_Release, Py_buffer


def _gil_free_copy() -> _RawCopy | None:
    """``copy(target, data)``: ``data`` (contiguous, at most ``len(target)`` bytes) copied to
    the start of ``target`` by ``ctypes.memmove``, the GIL released during the copy (CPython);
    ``None`` where that is not possible."""
    global _raw_copy, _raw_copy_checked
    if not _raw_copy_checked:
        _raw_copy_checked = True
        if sys.implementation.name != "cpython":
            return None
        try:
            import ctypes

            # Indexing makes function objects of our own: attributes of ``ctypes.pythonapi``
            # are shared by every module of the process, so their prototypes must stay unset.
            api = ctypes.pythonapi
            get_buffer, release_buffer = api["PyObject_GetBuffer"], api["PyBuffer_Release"]
        except (ImportError, AttributeError, OSError):
            return None

        class PyBuffer(ctypes.Structure):
            _fields_ = [
                ("buf", ctypes.c_void_p),
                ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int),
                ("format", ctypes.c_void_p),
                ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p),
            ]

        get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(PyBuffer), ctypes.c_int]
        get_buffer.restype = ctypes.c_int
        release_buffer.argtypes = [ctypes.POINTER(PyBuffer)]
        release_buffer.restype = None
        memmove, addressof, char = ctypes.memmove, ctypes.addressof, ctypes.c_char

        def copy(target: mmap.mmap, data: memoryview) -> None:
            view = PyBuffer()
            get_buffer(data, view, 0)  # PyBUF_SIMPLE: contiguous bytes, or an exception
            try:
                if view.len > len(target):
                    raise ValueError("a buffer larger than its slot")
                destination = char.from_buffer(target)  # an export: the slot stays mapped
                memmove(addressof(destination), view.buf, view.len)
                del destination
            finally:
                release_buffer(view)

        global _buffer_api
        _buffer_api = (get_buffer, release_buffer, PyBuffer)
        _raw_copy = copy
    return _raw_copy


def _copy_into(target: mmap.mmap, data: memoryview) -> None:
    total = data.nbytes
    # Without the GIL where possible: the runtime loop then writes the frames queued before
    # this one (and reads replies) during the copy, instead of waiting for it.
    if total >= _RAW_COPY_MIN and (copy := _gil_free_copy()) is not None:
        copy(target, data)
        return
    if total <= _COPY_PIECE:
        target[:total] = data
        return
    for offset in range(0, total, _COPY_PIECE):
        end = min(total, offset + _COPY_PIECE)
        target[offset:end] = data[offset:end]


_Slot = tuple[int, int, "mmap.mmap | None"]  # (fd, size, the sender's mapping)
# Loans of pools closed while a receiver could still read them (``ShmPool.close``): kept for
# the life of the process, at most ``max_bytes`` per such pool. Once they hold
# ``PARKED_LIMIT`` bytes, no pool of this process lends any more (its large ``bytes`` take
# slots), so a peer fenced and reconnected again and again cannot pin memory without bound.
_parked: list[memoryview] = []
_parked_bytes = 0
_parked_lock = threading.Lock()
PARKED_LIMIT: Final = 256 * 1024 * 1024


class AckRing:
    """Slot acknowledgements through shared memory, without a socket write or a wake-up.

    Why: a receiver that acknowledged each slot on the lane's socket cost a ``send`` on its side
    and a loop wake-up, ``recvmsg`` and parse on the sender's, per pipelined 1 MiB call (the
    sender needs to know only when it next takes a slot). The receiver creates the ring (a
    sealed memfd of ``RING_BYTES``), passes it once on the socket, and writes the numbers of
    the slots it is done with into it; the sender reads them when it next needs a slot (or
    asks how much is in flight) and never waits for them.

    Layout: ``RING_BYTES // 4`` native ``uint32`` entries, 0 meaning empty (slot numbers are
    never 0). Each side keeps its own position: the receiver (one thread) writes the entry at
    its position when that entry is 0 (else the ring is full and the acknowledgement takes the
    socket), the sender reads entries from its position while they are not 0 and zeroes each
    one it took. No counter is shared, so neither side trusts a number the other wrote except
    slot numbers, which the sender checks (``ShmPool.release``) like those from the socket.
    """

    def __init__(self, mapping: mmap.mmap) -> None:
        if len(mapping) != RING_BYTES:
            raise ShmError(f"an acknowledgement ring has {len(mapping)} bytes, not {RING_BYTES}")
        self._mapping = mapping
        self._entries = memoryview(mapping).cast("I")
        self._size = len(self._entries)
        self._position = 0
        self.pushed = 0
        """Acknowledgements written so far (statistics)."""

    @classmethod
    def create(cls) -> tuple[AckRing, int]:
        """A fresh ring and a descriptor of it to pass to the sender (the caller closes it)."""
        fd = _sealed_memfd(RING_BYTES)
        try:
            return cls(mmap.mmap(fd, RING_BYTES, flags=mmap.MAP_SHARED)), fd
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def adopt(cls, fd: int) -> AckRing:
        """Map a ring a receiver passed (``fd`` not closed here). ``ShmError`` unless it is a
        size-sealed regular file of exactly ``RING_BYTES``: a file that could shrink would
        fault the sender that reads it."""
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != RING_BYTES or not _size_sealed(fd):
            raise ShmError("an acknowledgement ring is not a size-sealed file of its size")
        return cls(mmap.mmap(fd, RING_BYTES, flags=mmap.MAP_SHARED))

    def push(self, slot: int) -> bool:
        """(receiver, one thread) Write ``slot`` (not 0); False when the ring is full."""
        entries, position = self._entries, self._position % self._size
        if entries[position]:
            return False
        entries[position] = slot
        self._position += 1
        self.pushed += 1
        return True

    def take(self) -> list[int]:
        """(sender, under its pool's lock) The slot numbers written since the last take (at
        most one ring's worth)."""
        entries, size = self._entries, self._size
        taken: list[int] = []
        position = self._position % size
        while len(taken) < size and (slot := entries[position]):
            entries[position] = 0
            taken.append(slot)
            position = (position + 1) % size
        self._position += len(taken)
        return taken

    def close(self) -> None:
        self._entries.release()
        with contextlib.suppress(BufferError, ValueError):
            self._mapping.close()


class ShmPool:
    """One lane's sender-side slots (any thread; module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._lock = threading.Lock()
        self._ring: AckRing | None = None
        self.fault: str | None = None
        """Why the receiver's acknowledgements were refused (``None``: never); the pool is
        closed then."""
        self.on_fault: Callable[[str], None] = lambda _reason: None
        self._free: dict[int, list[_Slot]] = {}
        self._busy: dict[int, _Slot] = {}
        self._lent: dict[int, memoryview] = {}  # slot -> the lent buffer, kept alive till acked
        self._ids = itertools.count(1)
        self._outstanding = 0
        self._detached = 0
        self._retained = 0
        self._closed = False
        self.issued = 0
        """Buffers put in slots so far (statistics)."""
        self.detached_issued = 0
        """Of those, buffers put in detached slots (statistics)."""
        self.adopted = 0
        """Slots the receiver gave back and that were kept (statistics)."""
        self.lent = 0
        """Buffers lent so far (statistics)."""

    @property
    def outstanding(self) -> int:
        """Bytes in slots sent (or being sent) and not yet acknowledged, detached ones too."""
        if self._ring is not None:
            with self._lock:
                self._reap()
        return self._outstanding + self._detached

    def attach_ring(self, ring: AckRing) -> None:
        """Read acknowledgements from ``ring`` from now on (the socket's still count too);
        a second ring replaces the first."""
        with self._lock:
            if self._closed:
                ring.close()
                return
            old, self._ring = self._ring, ring
            if old is not None:
                self._reap_from(old)
                old.close()

    def _reap(self) -> None:
        """(lock held) Take the acknowledgements in the ring."""
        if self._ring is not None:
            self._reap_from(self._ring)

    def _reap_from(self, ring: AckRing) -> None:
        victims: list[_Slot] = []
        for slot in ring.take():
            if not self._release_locked(slot, victims):
                self._fault(f"acknowledged shared memory never sent (slot {slot})")
                break
        for victim in victims:
            _close_slot(victim)

    def _fault(self, reason: str) -> None:
        """(lock held) Hostile acknowledgements: refuse every later buffer (they go inline) and
        report once."""
        if self.fault is None:
            self.fault = reason
            self._closed = True
            self.on_fault(reason)

    def _next_slot(self) -> int:
        """(lock held) A slot number in 1 .. ``LENT`` - 1 (``DETACHED`` and ``LENT`` are
        flags), never one still in flight (after a wrap, a slot or loan held that long keeps
        its number)."""
        while True:
            number = (next(self._ids) - 1) % (LENT - 1) + 1
            if not any((number | flag) in self._busy for flag in (0, DETACHED, LENT)):
                return number

    def put(self, view: memoryview) -> tuple[int, int] | None:
        """Copy ``view`` into a slot; ``(slot number, a descriptor of it)`` for the frame (the
        caller closes the descriptor once sent), or ``None`` over both bounds or when the
        kernel refuses."""
        size = _slot_size(view.nbytes)
        data = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        with self._lock:
            if self._ring is not None:
                self._reap()
            if self._closed:
                return None
            detached = self._outstanding + size > self._max
            if detached:
                if self._detached + size > self._max:
                    return None
                self._detached += size
                slot = self._next_slot() | DETACHED
                self.detached_issued += 1
            else:
                self._outstanding += size
                slot = self._next_slot()
            free = self._free.get(size)
            entry: _Slot | None = free.pop() if free else None
            if entry is not None:
                self._retained -= size
            self.issued += 1
            self._busy[slot] = (-1, size, None) if detached or entry is None else entry
        fd = -1
        try:
            if detached:  # the receiver owns it: a free slot given away (warm) or a fresh one
                if entry is not None:
                    _copy_into(entry[2], data)  # type: ignore[arg-type]
                    fd = entry[0]
                    with contextlib.suppress(BufferError, ValueError):
                        entry[2].close()  # type: ignore[union-attr]
                    entry = None
                    return slot, fd
                fd = _sealed_memfd(size)
                offset, total = 0, data.nbytes
                while offset < total:
                    offset += os.pwrite(fd, data[offset : offset + _WRITE_CHUNK], offset)
                return slot, fd
            if entry is None:
                fd = _sealed_memfd(size)
                entry = (fd, size, _writable_map(fd, size))
                with self._lock:
                    if slot not in self._busy:  # closed meanwhile
                        _close_slot(entry)
                        return None
                    self._busy[slot] = entry
            _copy_into(entry[2], data)  # type: ignore[arg-type]
            return slot, os.dup(entry[0])
        except (OSError, ValueError):
            if entry is not None and detached:
                _close_slot(entry)
            elif fd >= 0 and (entry is None or entry[0] != fd):
                os.close(fd)
            self.release(slot)
            return None

    def lend(self, view: memoryview) -> tuple[int, int] | None:
        """Lend ``view`` (``lendable``) to the receiver: ``(slot number with LENT, its address
        in this process)`` for the frame, the view kept until the slot is acknowledged; ``None``
        over the in-flight bound, or when closed."""
        address = _address_of(view)
        if address is None:
            return None
        size = view.nbytes
        with self._lock:
            if self._ring is not None:
                self._reap()
            if (
                self._closed
                or self._outstanding + size > self._max
                or _parked_bytes >= PARKED_LIMIT
            ):
                return None
            self._outstanding += size
            slot = self._next_slot() | LENT
            self._busy[slot] = (-1, size, None)
            self._lent[slot] = view
            self.lent += 1
        return slot, address

    def adopt(self, fd: int) -> bool:
        """A slot the receiver gives back (a detached one it no longer uses): kept as a free
        slot when it is a sealed memfd of a slot size and the retention bound allows, else
        closed. Takes ``fd`` in every case; False when it was not kept."""
        try:
            info = os.fstat(fd)
            size = info.st_size
            if (
                stat.S_ISREG(info.st_mode)
                and size >= _MIN_SLOT
                and size & (size - 1) == 0
                and _size_sealed(fd)
            ):
                with self._lock:
                    self._reap()
                    victims = self._make_room(size)
                    keep = (
                        not self._closed
                        and self._retained + self._outstanding + size <= 2 * self._max
                    )
                    if keep:
                        self._retained += size
                for victim in victims:
                    _close_slot(victim)
                if keep:
                    try:
                        mapping = _writable_map(fd, size)
                    except (OSError, ValueError):
                        with self._lock:
                            self._retained -= size
                        raise
                    with self._lock:
                        if not self._closed:
                            self._free.setdefault(size, []).append((fd, size, mapping))
                            self.adopted += 1
                            return True
                        self._retained -= size
                    mapping.close()
        except (OSError, ValueError):
            pass
        with contextlib.suppress(OSError):
            os.close(fd)
        return False

    def release(self, slot: int) -> bool:
        """The receiver is done with ``slot`` (or it was never sent): reuse it. False for a
        slot that is not in flight."""
        victims: list[_Slot] = []
        with self._lock:
            known = self._release_locked(slot, victims)
        for victim in victims:
            _close_slot(victim)
        return known

    def _release_locked(self, slot: int, victims: list[_Slot]) -> bool:
        """(lock held) ``release``; slots to close (outside the lock) added to ``victims``."""
        entry = self._busy.pop(slot, None)
        if entry is None:
            return False
        fd, size, _mapping = entry
        if slot & DETACHED:
            self._detached -= size
            return True
        self._outstanding -= size
        if slot & LENT:
            del self._lent[slot]  # the receiver has read it: the sender's object is free again
            return True
        if fd >= 0 and not self._closed:
            victims.extend(self._make_room(size))
        keep = (
            fd >= 0
            and not self._closed
            and self._retained + self._outstanding + size <= 2 * self._max
        )
        if keep:
            self._free.setdefault(size, []).append(entry)
            self._retained += size
        else:
            victims.append(entry)
        return True

    def _make_room(self, size: int) -> list[_Slot]:
        """(lock held) Free slots of other sizes, largest and oldest first, taken out of the
        pool until a slot of ``size`` fits the bound: the sizes in use now win over those
        used before. The caller closes them (outside the lock)."""
        victims: list[_Slot] = []
        if size > 2 * self._max:
            return victims
        for other in sorted(self._free, reverse=True):
            entries = self._free[other]
            while (
                other != size
                and entries
                and self._retained + self._outstanding + size > 2 * self._max
            ):
                victims.append(entries.pop(0))
                self._retained -= other
        return victims

    @property
    def lending(self) -> bool:
        """Whether lent buffers are not yet acknowledged."""
        with self._lock:
            self._reap()
            return bool(self._lent)

    def close(self, park: bool = True) -> None:
        """Close every descriptor and mapping (idempotent); slots in flight are closed too (a
        receiver's own mapping of one keeps its memory until freed). Loans not yet
        acknowledged are kept for the life of the process with ``park`` (the receiver may
        still read them), else dropped (it never will: its end is gone)."""
        global _parked_bytes
        with self._lock:
            if park and self._lent:
                with _parked_lock:
                    _parked.extend(self._lent.values())
                    _parked_bytes += sum(view.nbytes for view in self._lent.values())
            self._closed = True
            ring, self._ring = self._ring, None
            entries = [entry for entries in self._free.values() for entry in entries]
            entries += list(self._busy.values())
            self._free.clear()
            self._busy.clear()
            self._lent.clear()
            self._outstanding = self._retained = self._detached = 0
        if ring is not None:
            ring.close()
        for entry in entries:
            _close_slot(entry)


def _close_slot(entry: _Slot) -> None:
    fd, _size, mapping = entry
    if mapping is not None:
        with contextlib.suppress(BufferError, ValueError):
            mapping.close()
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def _size_sealed(fd: int) -> bool:
    try:
        return fcntl.fcntl(fd, _F_GET_SEALS) & _SIZE_SEALS == _SIZE_SEALS
    except OSError:  # not a memfd (no seals at all)
        return False


_Copier = Callable[[int, int], bytes]
_BYTES_OFFSET: Final = bytes.__basicsize__ - 1  # where a ``bytes`` object's ``ob_sval`` begins
# An uninitialised ``bytes`` of a size (``PyBytes_FromStringAndSize``) once ``_bytes_copier`` ran.
_new_bytes: Callable[[None, int], bytes] | None = None
_copier: _Copier | None = None
_copier_checked = False


def _bytes_copier() -> _Copier | None:
    """``copy(address, size)``: a new ``bytes`` of ``size`` (> 0) bytes copied from ``address``
    with the GIL released during the copy (CPython: the object is allocated uninitialised, as
    ``os.pread`` does, and filled by ``ctypes.memmove`` before anything else can see it);
    ``None`` where that is not possible."""
    global _copier, _copier_checked
    if not _copier_checked:
        _copier_checked = True
        if sys.implementation.name == "cpython":
            try:
                import ctypes  # only here: most processes never receive a large buffer

                new = ctypes.pythonapi["PyBytes_FromStringAndSize"]  # our own (see above)
            except (ImportError, AttributeError, OSError):
                return None
            new.restype = ctypes.py_object
            new.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
            memmove = ctypes.memmove
            offset = _BYTES_OFFSET

            def copy(address: int, size: int) -> bytes:
                out: bytes = new(None, size)  # size > 0: never the shared empty bytes
                memmove(id(out) + offset, address, size)
                return out

            global _new_bytes
            _new_bytes = new
            _copier = copy
    return _copier


class SlotViews:
    """One lane's receiver-side read-only views of the sender's slots, to copy ``bytes`` out of
    (loop thread; module docstring). At most ``max_bytes`` of mappings, least recently used
    dropped first."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        # (st_dev, st_ino) -> (mapping, its ctypes export, the export's address, mapped size)
        self._views: collections.OrderedDict[tuple[int, int], tuple[mmap.mmap, Any, int, int]]
        self._views = collections.OrderedDict()
        self._bytes = 0
        self.mapped = 0
        """Slots mapped so far (statistics)."""
        self.copies = 0
        """Buffers copied out of a view so far (statistics)."""

    @property
    def nbytes(self) -> int:
        """Bytes of the views kept now."""
        return self._bytes

    def read(self, fd: int, size: int) -> bytes | None:
        """The first ``size`` bytes of the slot ``fd`` (not closed here) as a new ``bytes``, copied
        out of a kept view of it; ``None`` when it is not to be mapped (not size-sealed, over
        the bound, no copier here): the caller reads it. ``ShmError`` when ``fd`` is not a
        regular file of at least ``size`` bytes."""
        copier = _bytes_copier()
        if copier is None or size <= 0 or size > self._max:
            return None
        info = _checked_stat(fd, size)
        key = (info.st_dev, info.st_ino)  # unique while the view keeps the file alive
        entry = self._views.get(key)
        if entry is None:
            length = info.st_size
            # Only a size-sealed file is mapped: nobody can shrink it under the copy (no fault).
            if length > self._max or not _size_sealed(fd):
                return None
            import ctypes

            prot = mmap.PROT_READ | mmap.PROT_WRITE  # private: a write would never reach the slot
            try:
                mapping = mmap.mmap(fd, length, flags=mmap.MAP_PRIVATE, prot=prot)
            except (OSError, ValueError):  # out of mappings or address space: read it instead
                return None
            export = ctypes.c_char.from_buffer(mapping)
            entry = (mapping, export, ctypes.addressof(export), length)
            self._views[key] = entry
            self._bytes += length
            self.mapped += 1
            while self._bytes > self._max:
                self._drop(self._views.popitem(last=False)[1])
        else:
            self._views.move_to_end(key)
        self.copies += 1
        return copier(entry[2], size)

    def _drop(self, entry: tuple[mmap.mmap, Any, int, int]) -> None:
        mapping, export, _address, length = entry
        self._bytes -= length
        del export  # the mapping can be closed only once no export of it is left
        with contextlib.suppress(BufferError, ValueError):
            mapping.close()

    def close(self) -> None:
        """Drop every view (idempotent)."""
        while self._views:
            self._drop(self._views.popitem()[1])


def _anonymous(size: int) -> mmap.mmap:
    """Fresh private anonymous memory, its pages faulted in at once (``MAP_POPULATE``)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(-1, size, flags=flags)


def _checked_stat(fd: int, size: int) -> os.stat_result:
    """``fd``'s status, checked: a regular file of at least ``size`` bytes (``ShmError``)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ShmError("a shared-memory buffer descriptor is not a regular file")
    if info.st_size < size:
        raise ShmError(
            f"a shared-memory buffer has {info.st_size} bytes where {size} were announced"
        )
    return info


def read_buffer(
    fd: int, size: int, writable: bool, mapped: bool = False
) -> bytes | bytearray | mmap.mmap:
    """Read a received slot's first ``size`` bytes and close ``fd``: a ``bytes`` (one copy,
    straight into the object the codec hands to the user) or, when ``writable``, a
    ``bytearray``, or with ``mapped`` too a private anonymous ``mmap`` (the receiver's own
    memory, like the ``bytearray``, without its zero-filling pass over every page: for buffers
    that protocol-5 reconstructors such as numpy's and the codec's tensors rebuild over in
    place). ``ShmError`` when the descriptor is not a regular file of at least ``size`` bytes
    or the read falls short."""
    try:
        _checked_stat(fd, size)
        if not writable and size <= _PREAD_MAX:
            data = os.pread(fd, size, 0)
            if len(data) != size:
                raise ShmError("a shared-memory buffer shrank while it was read")
            return data
        out: bytearray | mmap.mmap = _anonymous(size) if mapped and size else bytearray(size)
        view = memoryview(out)
        offset = 0
        with view:
            while offset < size:
                n = os.preadv(fd, [view[offset : offset + _PREAD_MAX]], offset)
                if n <= 0:
                    raise ShmError("a shared-memory buffer shrank while it was read")
                offset += n
        return out
    finally:
        os.close(fd)


def receive_buffer(
    fd: int, size: int, kind: int, views: SlotViews | None = None
) -> tuple[bytes | bytearray | mmap.mmap, bool]:
    """The object a received slot's buffer of codec ``kind`` is rebuilt from, and whether it
    still uses the slot (a private mapping of it: the slot may be reused only once that object
    is freed); ``fd`` is closed. A ``bytes`` is copied out of ``views`` where it can be.
    ``ShmError`` when the descriptor is not a regular file of at least ``size`` bytes or a read
    falls short (module docstring)."""
    writable = not kind & 1  # KIND_READONLY
    if views is not None and not writable:
        try:
            data = views.read(fd, size)
        except BaseException:
            os.close(fd)
            raise
        if data is not None:
            os.close(fd)
            return data, False
    # A protocol-5 buffer (numpy, tensors) is rebuilt over whatever memory it arrives in; a
    # persistent one becomes a bytes or bytearray: read into one.
    in_place = writable and not kind & 2  # KIND_PERSISTENT
    if in_place and size:
        try:
            _checked_stat(fd, size)
            if _size_sealed(fd):
                flags, prot = mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE
                mapping = mmap.mmap(fd, size, flags=flags, prot=prot)
                with contextlib.suppress(OSError, ValueError):
                    mapping.madvise(_MADV_POPULATE_READ)  # page tables now, not a fault a page
                os.close(fd)
                return mapping, True
        except BaseException:
            os.close(fd)
            raise
    return read_buffer(fd, size, writable, in_place), False


def lendable(view: memoryview) -> bool:
    """Whether ``view`` may be lent (``ShmPool.lend``): a contiguous view of a ``bytes``,
    which nothing can change while the pool holds it, on CPython (``_address_of``)."""
    return type(view.obj) is bytes and view.c_contiguous and _gil_free_copy() is not None


def _address_of(view: memoryview) -> int | None:
    """Where ``view``'s bytes begin in this process (valid while ``view`` is alive: a ``bytes``
    never moves); ``None`` where that cannot be known (not CPython)."""
    if _gil_free_copy() is None or _buffer_api is None:
        return None
    get_buffer, release_buffer, struct_type = _buffer_api
    raw = struct_type()
    get_buffer(view, raw, 0)  # PyBUF_SIMPLE: contiguous bytes, or an exception
    try:
        return int(raw.buf or 0) or None
    finally:
        release_buffer(raw)


_Reader = Callable[[int, int, int, int], int]  # (pid, local address, remote address, size)
_reader: _Reader | None = None
_reader_checked = False


def _vm_reader() -> _Reader | None:
    """``read(pid, local, remote, size)``: one ``process_vm_readv`` (the GIL released), the
    bytes read or ``-errno``; ``None`` where the C library has no such call."""
    global _reader, _reader_checked
    if not _reader_checked:
        _reader_checked = True
        if sys.implementation.name != "cpython" or not sys.platform.startswith("linux"):
            return None
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)  # our own instance: prototypes stay ours
            call = libc.process_vm_readv
        except (ImportError, AttributeError, OSError):
            return None

        class IoVec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

        vec = ctypes.POINTER(IoVec)
        call.argtypes = [ctypes.c_int, vec, ctypes.c_ulong, vec, ctypes.c_ulong, ctypes.c_ulong]
        call.restype = ctypes.c_ssize_t
        get_errno, byref = ctypes.get_errno, ctypes.byref

        def read(pid: int, local: int, remote: int, size: int) -> int:
            mine, theirs = IoVec(local, size), IoVec(remote, size)
            n = int(call(pid, byref(mine), 1, byref(theirs), 1, 0))
            return n if n >= 0 else -get_errno()

        _reader = read
    return _reader


def _may_read(read: _Reader, pid: int) -> bool:
    """Whether this process may read process ``pid``'s memory: one byte at address 0, which
    the kernel refuses with ``EFAULT`` (nothing is mapped there) only once the process was
    found (``ESRCH`` before) and the ptrace access check passed (``EPERM`` before: another
    user, Yama's ``ptrace_scope``, a process that is not dumpable). A read of nothing would
    not do: the kernel returns 0 for it before either check."""
    import ctypes
    import errno

    probe = bytearray(1)
    local = ctypes.addressof(ctypes.c_char.from_buffer(probe))
    return read(pid, local, 0, 1) == -errno.EFAULT


class PeerReader:
    """Reads buffers lent by the process at the other end of a Unix socket out of its memory
    (module docstring). Loop thread of the receiving lane."""

    def __init__(self, pid: int, pidfd: int, read: _Reader) -> None:
        self._pid = pid
        self._pidfd = pidfd
        self._read = read
        self.reads = 0
        """Buffers read so far (statistics)."""

    @classmethod
    def open(cls, sock: Any) -> PeerReader | None:
        """A reader of ``sock``'s peer (the process that connected it), or ``None`` when this
        process may not read that one's memory (another user, a ptrace restriction, another
        PID namespace, no ``process_vm_readv`` or pidfds here)."""
        import signal
        import socket
        import struct

        read, copier = _vm_reader(), _bytes_copier()
        if read is None or copier is None or not hasattr(os, "pidfd_open"):
            return None
        if not hasattr(signal, "pidfd_send_signal"):
            return None
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", raw)[0]
            if pid <= 0:  # the peer is not in this PID namespace
                return None
            pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError, struct.error):
            return None
        if not _may_read(read, pid):
            os.close(pidfd)
            return None
        return cls(pid, pidfd, read)

    def read(self, address: int, size: int) -> bytes:
        """``size`` (> 0) bytes at ``address`` in the peer as a new ``bytes``. ``ShmError`` when
        the peer's memory is not there, or the peer exited (its PID may name another process)."""
        new = _new_bytes
        assert new is not None  # set with the copier, which ``open`` checked
        out = new(None, size)  # size > 0: never the shared empty bytes
        local = id(out) + _BYTES_OFFSET
        done = 0
        while done < size:
            n = self._read(self._pid, local + done, address + done, size - done)
            if n <= 0:
                raise ShmError(
                    f"cannot read a lent buffer of {size} bytes at {address:#x} in process "
                    f"{self._pid}: {os.strerror(-n) if n else 'nothing read'}"
                )
            done += n
        import signal

        try:
            signal.pidfd_send_signal(self._pidfd, 0)  # still that process: the PID is its own
        except ProcessLookupError:
            raise ShmError(f"process {self._pid} exited while its buffer was read") from None
        except OSError:
            pass  # EPERM and the like: it exists
        self.reads += 1
        return out

    def close(self) -> None:
        """Close the pidfd (idempotent)."""
        if self._pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = -1
