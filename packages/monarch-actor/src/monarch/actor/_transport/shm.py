"""Large out-of-band buffers through shared memory on one host: pooled ``memfd`` slots.

Why: on a Unix lane a 1 MiB buffer sent inline crosses the kernel twice, in socket-buffer sized
pieces, each a loop wake-up on both sides. A memfd lets the sender copy the buffer once into an
anonymous file and pass only a descriptor (``SCM_RIGHTS``); the receiver reads it once, straight
into the object the value is rebuilt from (a ``bytes`` for read-only buffers, so the codec does
not copy it again). Nothing is named in any file system, so nothing can leak: the memory lives
exactly as long as a descriptor refers to it.

Why a pool, and a read rather than a mapping: on the machines measured, touching fresh pages
costs several times a copy into warm ones (a new 1 MiB memfd: about 1.8 ms; rewriting a used
one: about 0.3 ms), so each lane's sender keeps its slots (``ShmPool``) and reuses one as soon as
the receiver acknowledged that it has read it. A slot may only be rewritten once the receiver is
done with it, which a mapping handed to user code would never tell; the receiver therefore
copies out at once (``read_buffer``) and acknowledges the slot. A writable buffer that a
protocol-5 reconstructor rebuilds in place (numpy arrays, torch tensors) is read into fresh
private anonymous memory (an ``mmap``, its pages populated by the kernel) rather than a
``bytearray``, whose allocation zero-fills every page in a pass of its own before the read.

Bounds and hostile input: a sender has at most ``max_bytes`` in slots that are in flight
(``put`` returns ``None`` over it: the buffer then goes inline), keeps at most as much in free
slots, and refuses an acknowledgement for a slot it did not send. The receiver checks that a
descriptor is a regular file holding at least the announced size and that the read returned all
of it; a shrunk or truncated file is a ``ShmError``, never a fault (nothing is mapped).

Only Linux has ``memfd_create``; ``available()`` says whether this process can use it, and the
lanes send buffers inline where it cannot.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import stat
import threading
from typing import Final

__all__ = ["ShmError", "ShmPool", "available", "read_buffer"]

_WRITE_CHUNK: Final = 64 * 1024 * 1024
_PREAD_MAX: Final = 0x7FFFF000  # the most one read(2) returns on Linux
_MIN_SLOT: Final = 64 * 1024


class ShmError(ValueError):
    """A descriptor received as a shared-memory buffer is not acceptable."""


def available() -> bool:
    """True when memfds can be created here (Linux)."""
    return hasattr(os, "memfd_create")


def _slot_size(nbytes: int) -> int:
    """Slots come in powers of two (at least 64 KiB), so that they are reused across sizes."""
    return max(_MIN_SLOT, 1 << (nbytes - 1).bit_length())


class ShmPool:
    """One lane's sender-side slots (any thread; module docstring)."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[int]] = {}
        self._busy: dict[int, tuple[int, int]] = {}
        self._ids = itertools.count(1)
        self._outstanding = 0
        self._retained = 0
        self._closed = False
        self.issued = 0
        """Buffers put in slots so far (statistics)."""

    @property
    def outstanding(self) -> int:
        """Bytes in slots sent (or being sent) and not yet acknowledged."""
        return self._outstanding

    def put(self, view: memoryview) -> tuple[int, int] | None:
        """Copy ``view`` into a slot; ``(slot id, a new descriptor of it)`` for the frame (the
        caller closes the descriptor once sent), or ``None`` over the bound or when the kernel
        refuses."""
        size = _slot_size(view.nbytes)
        with self._lock:
            if self._closed or self._outstanding + size > self._max:
                return None
            free = self._free.get(size)
            fd = free.pop() if free else -1
            if fd >= 0:
                self._retained -= size
            slot = next(self._ids)
            self.issued += 1
            self._outstanding += size
            self._busy[slot] = (fd, size)
        try:
            if fd < 0:
                fd = os.memfd_create("monarch-buffer", os.MFD_CLOEXEC)
                with self._lock:
                    self._busy[slot] = (fd, size)
                os.ftruncate(fd, size)
            data = view.cast("B") if view.format != "B" or view.ndim != 1 else view
            offset, total = 0, data.nbytes
            while offset < total:
                offset += os.pwrite(fd, data[offset : offset + _WRITE_CHUNK], offset)
            return slot, os.dup(fd)
        except OSError:
            self.release(slot)
            return None

    def release(self, slot: int) -> bool:
        """The receiver is done with ``slot`` (or it was never sent): reuse it. False for a
        slot that is not in flight."""
        with self._lock:
            entry = self._busy.pop(slot, None)
            if entry is None:
                return False
            fd, size = entry
            self._outstanding -= size
            if fd >= 0 and not self._closed and self._retained + size <= self._max:
                self._free.setdefault(size, []).append(fd)
                self._retained += size
                return True
        if fd >= 0:
            os.close(fd)
        return True

    def close(self) -> None:
        """Close every descriptor (idempotent); slots in flight are closed as well."""
        with self._lock:
            self._closed = True
            fds = [fd for fds in self._free.values() for fd in fds]
            fds += [fd for fd, _size in self._busy.values() if fd >= 0]
            self._free.clear()
            self._busy.clear()
            self._outstanding = self._retained = 0
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _anonymous(size: int) -> mmap.mmap:
    """Fresh private anonymous memory, its pages faulted in at once (``MAP_POPULATE``)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(-1, size, flags=flags)


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
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ShmError("a shared-memory buffer descriptor is not a regular file")
        if info.st_size < size:
            raise ShmError(
                f"a shared-memory buffer has {info.st_size} bytes where {size} were announced"
            )
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
