"""The ``shm`` provider with real worker processes of one host: reads, writes and actions are
memcpys through the owner's shared memory, with no part taken by the owner's process (busy, or
even stopped); a dropped buffer and a dead owner are clear errors; torch CPU tensors and
memoryviews; private memory and ``rdma_disable_shm`` fall back to the ``net`` provider."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import monarch.actor
from monarch.actor import MeshFailure, ProcMesh, this_host
from monarch.config import configured
from monarch.rdma import RDMAAction, RDMABuffer, _shm
from monarch.rdma.providers import shared_memory

sys.path.insert(0, str(Path(__file__).parent))  # workers import rdma_actors by name
from rdma_actors import Holder, Peer, Releaser

T = 60.0
pytestmark = [
    pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning"),
    pytest.mark.skipif(not _shm.available(), reason="the shm provider needs Linux"),
]
KINDS = ["memoryview", "tensor"]


def _pattern(size: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(size))


@pytest.fixture(scope="module")
def mesh() -> Iterator[ProcMesh]:
    """Two worker processes (``procs`` 0 and 1), shared by the tests of this module."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        yield procs
    finally:
        procs.stop().get(timeout=T)


@pytest.fixture(scope="module")
def actors(mesh: ProcMesh) -> tuple[Any, Any, Any]:
    holders = mesh.spawn("holder", Holder)
    peers = mesh.spawn("peer", Peer)
    releasers = mesh.spawn("releaser", Releaser)
    return holders.slice(procs=0), peers.slice(procs=1), releasers.slice(procs=0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_client_reads_and_writes_shared_memory_of_another_process(
    actors: Any, kind: str
) -> None:
    holder, _, _ = actors
    torch = pytest.importorskip("torch") if kind == "tensor" else None
    content = _pattern(5 * (1 << 20) + 5, seed=1)  # large enough for the threaded copy
    buffer = holder.create_shared.call_one(content, kind).get(timeout=T)
    assert (buffer.transport, buffer.backend) == ("shm", "tcp")
    assert sorted(buffer._keys) == ["net", "shm"]
    dst = bytearray(len(content) + 10)
    dst[-10:] = b"\xee" * 10
    buffer.read_into(memoryview(dst)).get(timeout=T)
    assert bytes(dst[: len(content)]) == content
    assert bytes(dst[-10:]) == b"\xee" * 10  # the tail is untouched
    buffer.write_from(memoryview(b"written by the client")).get(timeout=T)
    changed = holder.content.call_one().get(timeout=T)  # the owner's own object sees it
    assert changed == b"written by the client" + content[21:]
    if torch is not None:  # and a torch tensor as the local side
        out = torch.zeros(len(content), dtype=torch.uint8)
        buffer.read_into(out).get(timeout=T)
        assert ctypes.string_at(out.data_ptr(), out.numel()) == changed  # no numpy needed
        buffer.write_from(torch.full((4,), 9, dtype=torch.uint8)).get(timeout=T)
        assert holder.content.call_one().get(timeout=T)[:5] == b"\t\t\t\t" + changed[4:5]


def test_transfers_need_nothing_of_the_owner_busy_or_even_stopped(actors: Any) -> None:
    holder, peer, releaser = actors
    content = _pattern(1 << 20, seed=2)
    buffer = holder.create_shared.call_one(content, "memoryview").get(timeout=T)
    pid = holder.pid.call_one().get(timeout=T)
    assert pid != os.getpid()
    busy = holder.spin.call_one(T)  # the owner's actor computes throughout
    try:
        assert peer.read.call_one(buffer, 1 << 20).get(timeout=T) == content
        assert peer.transport.call_one(buffer).get(timeout=T) == ("shm", "tcp")
        dst = bytearray(1 << 20)
        buffer.read_into(memoryview(dst)).get(timeout=T)  # the client maps it too
        assert not busy.done()
        os.kill(pid, signal.SIGSTOP)  # no thread of the owner's process runs now
        try:
            buffer.write_from(memoryview(b"while stopped")).get(timeout=T)
            buffer.read_into(memoryview(dst)).get(timeout=T)
            assert dst[:13] == b"while stopped"
            assert dst[13:] == content[13:]
        finally:
            os.kill(pid, signal.SIGCONT)
        assert peer.read.call_one(buffer, 1 << 20).get(timeout=T)[:13] == b"while stopped"
    finally:
        releaser.release.call_one().get(timeout=T)
    assert busy.get(timeout=T) > 0
    assert holder.content.call_one().get(timeout=T)[:13] == b"while stopped"


def test_an_action_batches_shm_reads_and_writes_over_two_owners(actors: Any) -> None:
    holder, peer, _ = actors
    first_memory = shared_memory(4096)
    first_memory[:] = _pattern(4096, seed=3)
    first = RDMABuffer(first_memory)  # owned by the client, read by process 1
    kind = "tensor" if importlib.util.find_spec("torch") else "memoryview"
    second = holder.create_shared.call_one(_pattern(4096, seed=4), kind).get(timeout=T)
    assert peer.transport.call_one(first).get(timeout=T) == ("shm", "tcp")
    a, b = peer.swap.call_one(first, second, 4096).get(timeout=T)
    assert (a, b) == (_pattern(4096, seed=3), _pattern(4096, seed=4))
    assert bytes(first_memory) == _pattern(4096, seed=4)  # written crossed
    assert holder.content.call_one().get(timeout=T) == _pattern(4096, seed=3)
    halves = memoryview(bytearray(8192))
    action = RDMAAction().read_remote(halves[:4096], first).read_remote(halves[4096:], second)
    action.submit(timeout=30).get(timeout=T)
    assert bytes(halves) == _pattern(4096, seed=4) + _pattern(4096, seed=3)
    first.drop().get(timeout=T)


def test_a_dropped_buffer_is_a_clear_error_everywhere(actors: Any) -> None:
    holder, peer, _ = actors
    buffer = holder.create_shared.call_one(b"soon gone" * 100, "memoryview").get(timeout=T)
    assert peer.read.call_one(buffer, 900).get(timeout=T) == b"soon gone" * 100  # mapped there
    buffer.read_into(memoryview(bytearray(900))).get(timeout=T)  # and here
    holder.drop.call_one().get(timeout=T)
    answer = peer.read_error.call_one(buffer).get(timeout=T)
    assert answer.startswith("RuntimeError: "), answer
    assert "dropped" in answer, answer
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.read_into(memoryview(bytearray(900))).get(timeout=T)
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.write_from(memoryview(b"x")).get(timeout=T)


def test_a_buffer_dropped_by_another_process_is_released_in_its_owner(actors: Any) -> None:
    holder, peer, _ = actors
    buffer = holder.create_shared.call_one(b"drop me", "memoryview").get(timeout=T)
    assert peer.read.call_one(buffer, 7).get(timeout=T) == b"drop me"
    buffer.drop().get(timeout=T)  # the client drops a worker's buffer
    answer = peer.read_error.call_one(buffer).get(timeout=T)
    assert "dropped" in answer, answer


def test_private_memory_and_the_setting_fall_back_to_the_net_provider(actors: Any) -> None:
    holder, peer, _ = actors
    private = holder.create.call_one(b"private pages").get(timeout=T)
    assert sorted(private._keys) == ["net"]  # declined by shm: the owner's bytearray stays
    assert peer.transport.call_one(private).get(timeout=T) == ("net", "tcp")
    shared = shared_memory(16)
    with configured(rdma_disable_shm=True):
        off = RDMABuffer(shared)
        assert sorted(off._keys) == ["net"]
    on = RDMABuffer(shared)
    assert on.transport == "shm"
    with configured(rdma_disable_shm=True):
        assert on.transport == "net"  # this process may not use shm: net serves the transfer
        dst = bytearray(16)
        shared[:5] = b"fresh"
        on.read_into(memoryview(dst)).get(timeout=T)
        assert dst[:5] == b"fresh"
    off.drop().get(timeout=T)
    on.drop().get(timeout=T)


def test_a_dead_owner_is_a_clear_error_mapped_or_not(monkeypatch: pytest.MonkeyPatch) -> None:
    died = threading.Event()

    def on_fault(failure: MeshFailure) -> None:  # not fatal
        died.set()

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", on_fault)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        holder = procs.spawn("holder", Holder)
        mapped = holder.create_shared.call_one(b"mapped here", "memoryview").get(timeout=T)
        mapped.read_into(memoryview(bytearray(11))).get(timeout=T)  # maps it in the client
        unmapped = holder.create_shared.call_one(b"never read", "memoryview").get(timeout=T)
        holder.die.broadcast()
        assert died.wait(T), "the owner's death never reached the client"
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="exited"):
            mapped.read_into(memoryview(bytearray(11)), timeout=10).get(timeout=T)
        with pytest.raises(RuntimeError, match="unreachable or exited"):
            unmapped.write_from(memoryview(b"x"), timeout=10).get(timeout=T)
        assert time.monotonic() - started < 15
        survivor_memory = shared_memory(10)
        survivor = RDMABuffer(survivor_memory)  # nothing else is lost
        survivor.write_from(memoryview(b"still here")).get(timeout=T)
        assert bytes(survivor_memory) == b"still here"
        survivor.drop().get(timeout=T)
    finally:
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=T)
