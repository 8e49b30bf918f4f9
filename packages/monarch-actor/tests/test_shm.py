"""Pooled memfd slots: one copy out, one copy in, bounded, reused, and refusals of bad input."""

from __future__ import annotations

import mmap
import os

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


def test_slots_are_reused_after_acknowledgement_and_bounded_before() -> None:
    pool = _shm.ShmPool(256 * 1024)
    first = pool.put(memoryview(b"a" * 100_000))
    second = pool.put(memoryview(b"b" * 100_000))
    assert first is not None
    assert second is not None
    assert pool.put(memoryview(b"c" * 100_000)) is None  # over the bound: inline instead
    for _slot, fd in (first, second):
        os.close(fd)
    assert pool.release(first[0])
    assert not pool.release(first[0])  # an acknowledgement for a slot not in flight
    third = pool.put(memoryview(b"d" * 90_000))
    assert third is not None
    assert _shm.read_buffer(third[1], 90_000, writable=False) == b"d" * 90_000
    pool.close()


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
