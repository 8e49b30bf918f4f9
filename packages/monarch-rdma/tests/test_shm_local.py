"""The ``shm`` provider within one process (the client transfers its own buffers through the
same descriptor exchange and mapping other processes use): drops, forged handles, read-only
memory, the bound on cached mappings, ``shared_memory``'s checks."""

from __future__ import annotations

import dataclasses
import mmap
import os

import pytest

from monarch.config import configured
from monarch.rdma import RDMABuffer, _shm
from monarch.rdma.providers import default_registry, shared_memory

T = 30.0
pytestmark = [
    pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning"),
    pytest.mark.skipif(not _shm.available(), reason="the shm provider needs Linux"),
]


def _provider() -> _shm.ShmProvider:
    provider = default_registry().provider("shm")
    assert isinstance(provider, _shm.ShmProvider)
    return provider


def test_a_buffer_of_this_process_is_read_written_and_dropped_through_shm() -> None:
    memory = shared_memory(100)
    memory[:] = bytes(range(100))
    buffer = RDMABuffer(memory)
    assert buffer.transport == "shm"
    dst = bytearray(100)
    buffer.read_into(memoryview(dst)).get(timeout=T)
    assert dst == bytes(range(100))
    buffer.write_from(memoryview(b"abc")).get(timeout=T)
    assert bytes(memory[:4]) == b"abc\x03"
    buffer.drop().get(timeout=T)
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.read_into(memoryview(dst)).get(timeout=T)
    buffer.drop().get(timeout=T)  # twice is not an error


def test_a_forged_handle_is_refused_by_the_owner() -> None:
    buffer = RDMABuffer(shared_memory(8))
    key = buffer._keys["shm"]
    forged = dataclasses.replace(key.detail, secret=os.urandom(16))
    buffer._keys["shm"] = dataclasses.replace(key, detail=forged)
    with pytest.raises(RuntimeError, match="refused"):
        buffer.read_into(memoryview(bytearray(8))).get(timeout=T)
    buffer._keys["shm"] = key
    buffer.read_into(memoryview(bytearray(8))).get(timeout=T)
    buffer.drop().get(timeout=T)


def test_read_only_shared_memory_is_read_but_never_written() -> None:
    fd = os.memfd_create("readonly-test", os.MFD_CLOEXEC)
    try:
        os.pwrite(fd, b"constant", 0)
        os.ftruncate(fd, 4096)
        mapping = mmap.mmap(fd, 4096, access=mmap.ACCESS_READ)
        buffer = RDMABuffer(memoryview(mapping)[:8])
        assert buffer.transport == "shm"
        dst = bytearray(8)
        buffer.read_into(memoryview(dst)).get(timeout=T)
        assert dst == b"constant"
        with pytest.raises(RuntimeError, match="read-only"):
            buffer.write_from(memoryview(b"x")).get(timeout=T)
        buffer.drop().get(timeout=T)
    finally:
        os.close(fd)


def test_cached_mappings_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_shm, "MAX_MAPPINGS", 2)
    buffers = [RDMABuffer(shared_memory(16)) for _ in range(3)]
    for buffer in buffers + buffers[:1]:
        buffer.read_into(memoryview(bytearray(16))).get(timeout=T)
        assert len(_provider()._mapped) <= 2
    for buffer in buffers:
        buffer.drop().get(timeout=T)


def test_private_memory_is_declined_and_shared_memory_checks_its_size() -> None:
    buffer = RDMABuffer(memoryview(bytearray(16)))
    assert sorted(buffer._keys) == ["net"]
    assert buffer.transport == "net"
    buffer.drop().get(timeout=T)
    with pytest.raises(ValueError, match="at least one byte"):
        shared_memory(0)


def test_a_large_copy_stops_when_its_transfer_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threaded copy that outlives its timeout stops at the next piece boundary, and the
    caller gets its ``TimeoutError`` only once the copy stopped: nothing is written after."""
    import ctypes
    import time

    def slow_memmove(target: int, source: int, n: int) -> None:
        ctypes.memmove(target, source, n)
        time.sleep(0.1)  # 64 pieces of 64 KiB: about 6.4 s in all, well past the 1 s timeout

    monkeypatch.setattr(_shm, "THREAD_COPY", 1 << 20)
    monkeypatch.setattr(_shm, "COPY_CHUNK", 64 << 10)
    monkeypatch.setattr(_shm, "_memmove", slow_memmove)
    size = 4 << 20
    memory = shared_memory(size)
    memory[:] = b"\x07" * size
    buffer = RDMABuffer(memory)
    dst = bytearray(size)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out"):
        buffer.read_into(memoryview(dst), timeout=1).get(timeout=T)
    # the timeout and one piece more (with room for a loaded machine), not the whole 6.4 s
    assert time.monotonic() - started < 4.0
    copied = dst.count(7)
    assert 0 < copied < size, copied  # it had started, and it did not finish
    time.sleep(0.2)
    assert dst.count(7) == copied  # nothing written after the error
    monkeypatch.setattr(_shm, "_memmove", ctypes.memmove)
    buffer.read_into(memoryview(dst), timeout=5).get(timeout=T)  # the buffer still works
    assert dst == b"\x07" * size
    buffer.drop().get(timeout=T)


def test_addresses_work_next_to_monarch_actors_shared_memory_and_change_no_shared_prototype() -> (
    None
):
    """monarch-actor's shared memory and this package both call CPython's buffer API through
    ctypes; each uses function objects of its own, so neither breaks the other (one setting the
    shared ``ctypes.pythonapi`` prototypes made the other's calls fail with ArgumentError)."""
    import ctypes

    from monarch.actor._transport import shm
    from monarch.rdma._memory import address_of

    data = bytearray(b"x" * 4096)
    target = shm._anonymous(4096)
    copy = shm._gil_free_copy()
    if copy is not None:
        copy(target, memoryview(data))
        assert target[:4096] == bytes(data)
    shm._bytes_copier()  # its function objects made, where it can
    assert address_of(memoryview(data)) != 0
    for name in ("PyObject_GetBuffer", "PyBuffer_Release", "PyBytes_FromStringAndSize"):
        assert getattr(ctypes.pythonapi, name).argtypes is None, name


def test_a_mapped_buffer_is_transferred_at_the_call_and_the_route_follows_the_settings() -> None:
    """``read_into``/``write_from`` through ``transfer_now``: once this process has mapped the
    owner's memory, a small transfer is done at the call (the reference submits eagerly) and
    its future is complete; the provider chosen for the buffer is kept per process and chosen
    again when a setting rules it out."""
    memory = shared_memory(64)
    memory[:] = bytes(range(64))
    buffer = RDMABuffer(memory)
    dst = bytearray(64)
    buffer.read_into(memoryview(dst)).get(timeout=T)  # the first one maps it (a body)
    dst[:] = bytes(64)
    future = buffer.read_into(memoryview(dst))
    assert future.done()
    assert dst == bytes(range(64))  # already there: done at the call
    future.get(timeout=T)
    assert buffer.write_from(memoryview(b"now")).done()
    assert bytes(memory[:3]) == b"now"
    assert buffer._route().name == "shm"
    with configured(rdma_disable_shm=True):
        assert buffer._route().name == "net"
        future = buffer.read_into(memoryview(dst))
        future.get(timeout=T)
        assert dst[:3] == b"now"
    assert buffer._route().name == "shm"
    buffer.drop().get(timeout=T)
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.read_into(memoryview(dst)).get(timeout=T)
