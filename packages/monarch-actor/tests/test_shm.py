"""Pooled, sealed memfd slots: one copy out, one copy in (or a mapping), bounded, reused,
refusals of bad input, and an unsealed descriptor read rather than mapped."""

from __future__ import annotations

import errno
import fcntl
import gc
import mmap
import os
import socket
import subprocess
import sys
import weakref

import pytest

from monarch.actor._transport import shm as _shm

pytestmark = pytest.mark.skipif(not _shm.available(), reason="needs memfd_create")


def test_a_buffer_round_trips_through_a_slot() -> None:
    pool = _shm.ShmPool(1 << 20)
    data = bytearray(os.urandom(300_000))
    taken = pool.put(memoryview(data))
    assert taken is not None
    slot, fd = taken
    data[0] ^= 0xFF  # the sender may reuse its memory at once: the slot holds a copy
    received = _shm.read_buffer(fd, len(data), writable=False)
    assert type(received) is bytes
    assert received[0] == data[0] ^ 0xFF
    assert received[1:] == data[1:]
    with pytest.raises(OSError):
        os.fstat(fd)  # read_buffer closed it
    assert pool.outstanding == 512 * 1024  # the slot size class
    assert pool.release(slot)
    assert pool.outstanding == 0
    pool.close()


def test_writable_buffers_come_back_as_bytearrays() -> None:
    pool = _shm.ShmPool(1 << 20)
    view = memoryview(bytearray(range(24))).cast("B", (4, 6))  # multidimensional: as bytes
    taken = pool.put(view)
    assert taken is not None
    received = _shm.read_buffer(taken[1], 24, writable=True)
    assert received == bytearray(range(24))
    assert type(received) is bytearray
    pool.close()


def _inode(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def test_slots_are_reused_after_acknowledgement_and_bounded_before() -> None:
    pool = _shm.ShmPool(256 * 1024)
    first = pool.put(memoryview(b"a" * 100_000))
    second = pool.put(memoryview(b"b" * 100_000))
    assert first is not None
    assert second is not None
    first_file = _inode(first[1])
    # over the bound of pooled slots: detached ones (bounded alike), then inline
    third = pool.put(memoryview(b"c" * 100_000))
    fourth = pool.put(memoryview(b"c" * 100_000))
    assert third is not None
    assert fourth is not None
    assert third[0] & _shm.DETACHED
    assert fourth[0] & _shm.DETACHED
    assert pool.detached_issued == 2
    assert pool.outstanding == 512 * 1024
    assert pool.put(memoryview(b"c" * 100_000)) is None
    assert _shm.read_buffer(third[1], 100_000, writable=False) == b"c" * 100_000
    for _slot, fd in (first, second, fourth):
        os.close(fd)
    assert pool.release(third[0])  # a detached slot: only the count goes down
    assert not pool.release(third[0])
    assert pool.outstanding == 384 * 1024
    assert pool.release(first[0])
    assert not pool.release(first[0])  # an acknowledgement for a slot not in flight
    again = pool.put(memoryview(b"d" * 90_000))
    assert again is not None
    assert not again[0] & _shm.DETACHED
    assert _inode(again[1]) == first_file  # the same slot, rewritten
    assert _shm.read_buffer(again[1], 90_000, writable=False) == b"d" * 90_000
    pool.close()


def test_slots_are_sealed_so_a_receiver_cannot_shrink_them() -> None:
    pool = _shm.ShmPool(1 << 20)
    for taken in (pool.put(memoryview(b"s" * 70_000)), pool.put(memoryview(b"t" * 600_000))):
        assert taken is not None  # the second over the bound: a detached slot, sealed too
        _slot, fd = taken
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK
        assert seals & fcntl.F_SEAL_GROW
        assert seals & fcntl.F_SEAL_SEAL  # nor add or remove seals
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 10)
        os.close(fd)
    pool.close()


def test_bytes_and_bytearrays_are_read_out_and_the_slot_freed_at_once() -> None:
    pool = _shm.ShmPool(1 << 20)
    for fill in (b"x", b"y"):
        taken = pool.put(memoryview(fill * 300_000))
        assert taken is not None
        slot, fd = taken
        received, held = _shm.receive_buffer(fd, 300_000, 0b11)  # read-only, persistent
        assert not held  # copied out: the slot may be reused at once
        assert type(received) is bytes
        assert received == fill * 300_000
        with pytest.raises(OSError):
            os.fstat(fd)  # closed
        assert pool.release(slot)
    taken = pool.put(memoryview(b"z" * 100_000))
    assert taken is not None
    received, held = _shm.receive_buffer(taken[1], 100_000, 0b10)  # writable, persistent
    assert (type(received), held) == (bytearray, False)
    assert received == b"z" * 100_000
    pool.close()


def test_an_in_place_buffer_is_a_private_mapping_of_the_slot() -> None:
    pool = _shm.ShmPool(1 << 20)
    data = os.urandom(300_000)
    taken = pool.put(memoryview(data))
    assert taken is not None
    slot_fd = os.dup(taken[1])
    try:
        received, held = _shm.receive_buffer(taken[1], len(data), 0)  # protocol 5, writable
        assert held  # the slot is the object's until it is freed
        assert isinstance(received, mmap.mmap)
        assert received[:] == data
        received[0] ^= 0xFF  # copy on write: never reaches the slot
        assert os.pread(slot_fd, len(data), 0) == data
        freed: list[int] = []
        weakref.finalize(received, freed.append, 1)
        del received
        gc.collect()
        assert freed == [1]
    finally:
        os.close(slot_fd)
    pool.close()


def test_an_unsealed_descriptor_is_read_not_mapped() -> None:
    fd = os.memfd_create("hostile")  # no seals: it could shrink under a mapping
    os.write(fd, b"h" * 100_000)
    theirs = os.dup(fd)  # the sender keeps a descriptor
    received, held = _shm.receive_buffer(fd, 100_000, 0)
    assert not held  # read into the receiver's own memory
    os.ftruncate(theirs, 10)  # a mapping of the file would now fault past its end
    os.pwrite(theirs, b"changed", 0)
    os.close(theirs)
    assert bytes(received) == b"h" * 100_000
    with pytest.raises(OSError):
        os.fstat(fd)
    short = os.memfd_create("short")
    os.write(short, b"abc")
    with pytest.raises(_shm.ShmError, match="3 bytes where 4 were announced"):
        _shm.receive_buffer(short, 4, 0)
    with pytest.raises(OSError):
        os.fstat(short)  # closed on refusal too


def test_a_size_beyond_the_file_is_refused() -> None:
    fd = os.memfd_create("short")
    os.write(fd, b"abc")
    with pytest.raises(_shm.ShmError, match="3 bytes where 4 were announced"):
        _shm.read_buffer(fd, 4, writable=False)


def test_a_pipe_is_not_a_buffer() -> None:
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(_shm.ShmError, match="not a regular file"):
        _shm.read_buffer(r, 3, writable=True)


def test_mapped_writable_buffers_come_back_as_private_writable_mappings() -> None:
    pool = _shm.ShmPool(1 << 20)
    data = os.urandom(300_000)
    taken = pool.put(memoryview(data))
    assert taken is not None
    slot_fd = os.dup(taken[1])
    try:
        received = _shm.read_buffer(taken[1], len(data), writable=True, mapped=True)
        assert isinstance(received, mmap.mmap)
        assert received[:] == data
        received[0] = received[0] ^ 0xFF  # the receiver's own memory, not the slot's
        assert os.pread(slot_fd, len(data), 0) == data
    finally:
        os.close(slot_fd)
    pool.close()


def test_free_slots_of_other_sizes_make_room_for_the_size_in_use() -> None:
    pool = _shm.ShmPool(512 * 1024)
    big = pool.put(memoryview(b"B" * 400_000))  # a 512 KiB slot: the whole in-flight bound
    other = pool.put(memoryview(b"b" * 400_000))  # over it: a detached one
    assert big is not None
    assert other is not None
    assert other[0] & _shm.DETACHED
    os.close(big[1])
    assert pool.release(big[0])
    assert pool.release(other[0])
    assert pool.adopt(other[1])  # given back: two free 512 KiB slots, twice the bound
    small = pool.put(memoryview(b"s" * 100_000))  # a 128 KiB slot
    assert small is not None
    small_file = _inode(small[1])
    os.close(small[1])
    assert pool.release(small[0])  # kept: a free 512 KiB slot is closed to make room
    again = pool.put(memoryview(b"t" * 100_000))
    assert again is not None
    assert _inode(again[1]) == small_file  # the small slot reused, not a fresh memfd
    os.close(again[1])
    pool.close()


def test_bytes_are_copied_out_of_a_kept_view_of_the_slot() -> None:
    pool = _shm.ShmPool(1 << 20)
    views = _shm.SlotViews(1 << 20)
    files = set()
    for fill in (b"p", b"q", b"r"):
        taken = pool.put(memoryview(fill * 300_000))
        assert taken is not None
        slot, fd = taken
        files.add(_inode(fd))
        received, held = _shm.receive_buffer(fd, 300_000, 0b11, views)  # read-only, persistent
        assert (type(received), held) == (bytes, False)
        assert received == fill * 300_000  # what the sender wrote into the reused slot now
        with pytest.raises(OSError):
            os.fstat(fd)  # closed
        assert pool.release(slot)
    assert len(files) == 1  # one slot, reused
    assert (views.mapped, views.copies, views.nbytes) == (1, 3, 512 * 1024)
    # A bytearray is the receiver's to write to: read out, never through a view.
    taken = pool.put(memoryview(b"s" * 300_000))
    assert taken is not None
    received, held = _shm.receive_buffer(taken[1], 300_000, 0b10, views)
    assert (type(received), held, views.copies) == (bytearray, False, 3)
    views.close()
    assert views.nbytes == 0
    pool.close()


def test_slot_views_are_bounded_least_recently_used_first_out() -> None:
    pool = _shm.ShmPool(4 << 20)
    views = _shm.SlotViews(1 << 20)
    taken = [pool.put(memoryview(bytes([i]) * 300_000)) for i in range(3)]  # 3 slots of 512 KiB
    for i, entry in enumerate(taken):
        assert entry is not None
        assert views.read(entry[1], 300_000) == bytes([i]) * 300_000
        os.close(entry[1])
        assert views.nbytes <= 1 << 20
    assert (views.mapped, views.nbytes) == (3, 1 << 20)
    big = pool.put(memoryview(b"b" * 1_500_000))  # a 2 MiB slot: over the bound, not mapped
    assert big is not None
    assert views.read(big[1], 1_500_000) is None
    assert _shm.receive_buffer(big[1], 1_500_000, 0b11, views) == (b"b" * 1_500_000, False)
    assert views.mapped == 3
    views.close()
    pool.close()


def test_an_unsealed_or_bad_descriptor_is_not_viewed() -> None:
    views = _shm.SlotViews(1 << 20)
    fd = os.memfd_create("hostile")  # no seals: it could shrink under a mapping
    os.write(fd, b"h" * 100_000)
    theirs = os.dup(fd)
    assert views.read(fd, 100_000) is None
    received, held = _shm.receive_buffer(fd, 100_000, 0b11, views)  # read out instead
    assert (received, held, views.mapped) == (b"h" * 100_000, False, 0)
    os.ftruncate(theirs, 10)
    os.close(theirs)
    with pytest.raises(OSError):
        os.fstat(fd)
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(_shm.ShmError, match="not a regular file"):
        _shm.receive_buffer(r, 3, 0b11, views)
    with pytest.raises(OSError):
        os.fstat(r)  # closed on refusal
    short = _shm.ShmPool(1 << 20)
    taken = short.put(memoryview(b"abc" * 30_000))
    assert taken is not None
    with pytest.raises(_shm.ShmError, match="where 200000 were announced"):
        _shm.receive_buffer(taken[1], 200_000, 0b11, views)
    with pytest.raises(OSError):
        os.fstat(taken[1])
    assert views.mapped == 0
    short.close()


_HEAP_PROBE = """
import os, resource, sys, threading
from monarch.actor._transport import shm
fd = os.memfd_create("probe")
os.ftruncate(fd, 1 << 20)

def faults_per_mib():
    held = []
    def body():  # as a lane's loop thread: 8 buffers in flight, then all freed
        for _ in range(20):
            held.extend(os.pread(fd, 1 << 20, 0) for _ in range(8))
            held.clear()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 160

faults_per_mib()
retained = shm.retain_heap(64 << 20)
again = shm.retain_heap(1)
faults_per_mib()
print(retained, again, faults_per_mib())
"""


@pytest.mark.skipif(
    not hasattr(os, "confstr") or "CS_GNU_LIBC_VERSION" not in os.confstr_names,
    reason="needs glibc",
)
def test_retain_heap_keeps_freed_buffers_warm() -> None:
    import subprocess
    import sys

    try:
        os.confstr("CS_GNU_LIBC_VERSION")
    except ValueError:
        pytest.skip("needs glibc")
    out = subprocess.run(
        [sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    retained, again, faults = int(out[0]), int(out[1]), float(out[2])
    assert (retained, again) == (64 << 20, 64 << 20)  # once per process: the first call wins
    # Without it glibc unmaps or trims those buffers: about 220 page faults per MiB here.
    assert faults < 16, faults


def test_the_copy_into_a_slot_takes_any_contiguous_view_without_the_gil(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copy = _shm._gil_free_copy()
    if copy is None:
        pytest.skip("needs CPython's ctypes.pythonapi")
    used: list[int] = []

    def recording(target: mmap.mmap, data: memoryview) -> None:
        used.append(data.nbytes)
        copy(target, data)

    monkeypatch.setattr(_shm, "_raw_copy", recording)
    pool = _shm.ShmPool(64 << 20)
    source = os.urandom(3 << 20)
    views = [
        memoryview(source),
        memoryview(source)[12_345 : 12_345 + 700_000],  # an offset into the object
        memoryview(bytearray(source)).cast("B", (3, 1 << 20)),  # multidimensional
        memoryview(source)[:1000],  # small: a slice assignment
    ]
    for view in views:
        taken = pool.put(view)
        assert taken is not None
        assert _shm.read_buffer(taken[1], view.nbytes, writable=False) == view.tobytes()
        assert pool.release(taken[0])
    assert used == [3 << 20, 700_000, 3 << 20]
    with pytest.raises(ValueError, match="larger than its slot"):
        copy(mmap.mmap(-1, 4096), memoryview(source))
    pool.close()


def test_a_slot_that_cannot_be_mapped_is_read_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = _shm.ShmPool(1 << 20)
    views = _shm.SlotViews(1 << 20)
    taken = pool.put(memoryview(b"m" * 300_000))
    assert taken is not None

    def refused(*_args: object, **_kwargs: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refused)  # the module shm maps with
    assert _shm.receive_buffer(taken[1], 300_000, 0b11, views) == (b"m" * 300_000, False)
    assert (views.mapped, views.copies) == (0, 0)
    pool.close()


def test_an_ack_ring_carries_slot_numbers_in_order_and_refuses_when_full() -> None:
    ring, fd = _shm.AckRing.create()
    try:
        reader = _shm.AckRing.adopt(fd)  # the sender's own mapping of the same memory
    finally:
        os.close(fd)
    size = _shm.RING_BYTES // 4
    assert reader.take() == []
    assert all(ring.push(slot) for slot in (5, 6, 7))
    assert reader.take() == [5, 6, 7]
    assert reader.take() == []  # taken entries are zeroed
    for slot in range(1, size + 1):  # round the ring: the positions wrap
        assert ring.push(slot)
    assert not ring.push(99)  # full until the reader takes
    assert reader.take() == list(range(1, size + 1))
    assert ring.push(99)
    assert reader.take() == [99]
    assert ring.pushed == 3 + size + 1
    ring.close()
    reader.close()
    assert ring._mapping.closed  # unmapped: no view of it was left behind
    assert reader._mapping.closed


def test_a_ring_that_is_not_a_sealed_file_of_its_size_is_refused() -> None:
    unsealed = os.memfd_create("unsealed")
    os.ftruncate(unsealed, _shm.RING_BYTES)
    wrong = os.memfd_create("wrong", os.MFD_ALLOW_SEALING)
    os.ftruncate(wrong, 2 * _shm.RING_BYTES)
    fcntl.fcntl(wrong, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    read_end, write_end = os.pipe()
    try:
        for fd in (unsealed, wrong, read_end):
            with pytest.raises(_shm.ShmError):
                _shm.AckRing.adopt(fd)
    finally:
        for fd in (unsealed, wrong, read_end, write_end):
            os.close(fd)


def test_a_pool_reads_acknowledgements_from_its_ring_when_it_needs_a_slot() -> None:
    pool = _shm.ShmPool(1 << 20)
    faults: list[str] = []
    pool.on_fault = faults.append
    ring, fd = _shm.AckRing.create()
    try:
        pool.attach_ring(_shm.AckRing.adopt(fd))
    finally:
        os.close(fd)
    data = memoryview(b"r" * 300_000)  # a 512 KiB slot: two fit the bound
    first = pool.put(data)
    second = pool.put(data)
    assert first is not None
    assert second is not None
    os.close(first[1])
    os.close(second[1])
    assert pool.put(data) is not None  # over the bound: detached
    assert pool.detached_issued == 1
    ring.push(first[0])
    ring.push(second[0])
    third = pool.put(data)  # took the acknowledgements first: a pooled slot again
    assert third is not None
    os.close(third[1])
    assert pool.detached_issued == 1
    assert pool.outstanding == 512 * 1024 + 512 * 1024  # the new one and the detached one
    assert faults == []
    ring.push(12345)  # never sent: the pool refuses every later buffer and says so once
    assert pool.put(data) is None
    assert pool.put(data) is None
    assert len(faults) == 1
    assert "never sent" in faults[0]
    assert pool.fault == faults[0]
    pool.close()
    ring.close()


def test_a_lent_bytes_is_read_out_of_the_lender_and_held_until_acknowledged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``lend`` keeps the sender's ``bytes`` (counted as in flight) and gives its address; the
    reader (here this very process, the peer of a socket pair) copies it into a new ``bytes``;
    the acknowledgement drops the sender's reference. Over the bound nothing is lent."""
    one, two = socket.socketpair()
    reader = _shm.PeerReader.open(two)
    if reader is None:
        one.close()
        two.close()
        pytest.skip("this process cannot read itself with process_vm_readv")
    pool = _shm.ShmPool(2 << 20)
    data = os.urandom(1 << 20)
    view = memoryview(data)
    assert _shm.lendable(view)
    assert not _shm.lendable(memoryview(bytearray(data)))  # it could change under the reader
    taken = pool.lend(view)
    assert taken is not None
    slot, address = taken
    assert slot & _shm.LENT
    assert not slot & _shm.DETACHED
    assert pool.outstanding == 1 << 20
    assert pool.lend(memoryview(os.urandom(1 << 20) + b"x")) is None  # over the bound
    out = reader.read(address, len(data))
    assert out == data
    assert out is not data
    assert type(out) is bytes
    assert reader.read(address + 10, 5) == data[10:15]
    assert pool.release(slot)
    assert pool.outstanding == 0
    assert not pool._lent
    assert not pool.release(slot)  # acknowledged twice: not in flight
    with pytest.raises(_shm.ShmError, match="cannot read a lent buffer"):
        reader.read(8, 100)  # nothing mapped there
    again = pool.lend(view)
    assert again is not None
    assert pool.lending
    pool.close()  # closed by the sender: the receiver may still read the loan, which stays
    assert not pool._lent
    assert [p for p in _shm._parked if p is view] == [view]
    _shm._parked[:] = [p for p in _shm._parked if p is not view]
    # Once parked loans reach the process's limit, no pool lends any more (slots instead).
    monkeypatch.setattr(_shm, "_parked_bytes", _shm.PARKED_LIMIT)
    full = _shm.ShmPool(2 << 20)
    assert full.lend(view) is None
    full.close()
    monkeypatch.undo()
    other = _shm.ShmPool(2 << 20)
    assert other.lend(view) is not None
    other.close(park=False)  # the receiver's end is gone: nothing will read it
    assert not [p for p in _shm._parked if p is view]
    reader.close()
    reader.close()
    one.close()
    two.close()


def test_no_reader_where_the_kernel_refuses_to_read_the_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The probe (one byte at address 0: EFAULT only once the kernel found the process and
    its permission check passed) decides: refused (another user, Yama's ptrace_scope) means
    no reader, so the lane never asks for loans."""
    one, two = socket.socketpair()
    try:
        read = _shm._vm_reader()
        if read is None:
            pytest.skip("no process_vm_readv here")
        assert _shm.PeerReader.open(two) is not None
        # A process that is gone is refused by the kernel's own checks (ESRCH), which a read of
        # nothing (the first probe, which returned 0 before any check) never reached.
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        assert read(gone.pid, 0, 0, 0) == 0  # why a read of nothing cannot probe
        assert not _shm._may_read(read, gone.pid)
        assert _shm._may_read(read, os.getpid())
        monkeypatch.setattr(_shm, "_reader", lambda *_args: -errno.EPERM)
        assert _shm.PeerReader.open(two) is None
    finally:
        one.close()
        two.close()


def test_slot_numbers_wrap_around_the_ones_still_in_flight() -> None:
    """After 2**30 - 1 numbers the count wraps; a number whose slot or loan is still in flight
    (held that long) is skipped, so its acknowledgement can never free a newer one."""
    import itertools

    pool = _shm.ShmPool(2 << 20)
    try:
        pool._busy[1 | _shm.LENT] = (-1, 1, None)  # a loan numbered 1, never acknowledged
        pool._busy[2] = (-1, 1, None)  # and a slot numbered 2
        pool._ids = itertools.count(_shm.LENT - 1)
        assert pool._next_slot() == _shm.LENT - 1
        assert pool._next_slot() == 3  # 1 and 2 are still in flight
    finally:
        pool._busy.clear()
        pool.close()
