"""The ``shm`` provider within one process (the client transfers its own buffers through the
same descriptor exchange and mapping other processes use): drops, forged handles, read-only
memory, the bound on cached mappings, ``shared_memory``'s checks."""

from __future__ import annotations

import dataclasses
import mmap
import os

import pytest

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
