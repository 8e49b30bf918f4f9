"""Spec section 3 against the ``net`` provider with real worker processes: the client and actors
in other processes read and write each other's buffers one-sidedly."""

from __future__ import annotations

import contextlib
import os
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
from monarch.rdma import RDMAAction, RDMABuffer

sys.path.insert(0, str(Path(__file__).parent))  # workers import rdma_actors by name
from rdma_actors import Holder, Peer, Releaser

T = 60.0
pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")


def _pattern(size: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(size))


@pytest.fixture(scope="module", params=["lanes", "force-quic"])
def mesh(request: pytest.FixtureRequest) -> Iterator[ProcMesh]:
    """Two worker processes (``procs`` 0 and 1), shared by the tests of this module; once over
    direct lanes, once with every message on QUIC (``force_quic`` reaches the workers).

    The client registers a buffer first, so its manager exists before the workers are forked
    from a copy of the client: each worker must still spawn a manager of its own (it used to
    inherit the client's, and reads of worker buffers failed with "not registered")."""
    RDMABuffer(memoryview(bytearray(1))).drop().get(timeout=T)
    with configured(force_quic=request.param == "force-quic"):
        procs = this_host().spawn_procs(per_host={"procs": 2})
        try:
            yield procs
        finally:
            procs.stop().get(timeout=T)


@pytest.fixture(scope="module")
def actors(mesh: ProcMesh) -> tuple[Any, Any, Any, Any]:
    holders = mesh.spawn("holder", Holder)
    peers = mesh.spawn("peer", Peer)
    releasers = mesh.spawn("releaser", Releaser)
    return holders.slice(procs=0), peers.slice(procs=1), releasers.slice(procs=0), peers


def test_the_client_reads_and_writes_a_buffer_of_another_process(actors: Any) -> None:
    holder, _, _, _ = actors
    content = _pattern(256)
    buffer = holder.create.call_one(content).get(timeout=T)
    assert buffer.size() == 256
    assert buffer.backend == "tcp"
    assert buffer.transport == "net"
    assert "holder" in buffer.owner
    dst = bytearray(300)  # larger is fine: the tail stays untouched
    dst[256:] = b"\xff" * 44
    buffer.read_into(memoryview(dst)).get(timeout=T)
    assert bytes(dst[:256]) == content
    assert bytes(dst[256:]) == b"\xff" * 44
    buffer.write_from(memoryview(bytearray(b"new!"))).get(timeout=T)  # smaller is fine
    assert holder.content.call_one().get(timeout=T) == b"new!" + content[4:]


@pytest.mark.parametrize("lane", ["unix", "tls", "messages"])
def test_large_transfers_are_chunked_with_several_chunks_in_flight(
    actors: Any, lane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every lane moves a chunked transfer intact; the data lanes without the owner's managers
    (no actor of the owner's process runs), the message lane through them."""
    monkeypatch.setenv("MONARCH_RDMA_NET_LANE", lane)
    holder, _, _, _ = actors
    content = _pattern(5 * (1 << 20) + 3, seed=1)
    buffer = holder.create.call_one(content).get(timeout=T)
    manager = buffer._keys["net"].detail.managers[0]
    before = manager.served.call_one().get(timeout=T)
    dst = bytearray(len(content))
    with configured(rdma_max_chunk_size_mb=1, rdma_net_chunks_in_flight=3):
        buffer.read_into(memoryview(dst)).get(timeout=T)  # six chunks, three in flight
        assert dst == content
        changed = _pattern(len(content), seed=2)
        buffer.write_from(memoryview(bytearray(changed))).get(timeout=T)
    assert holder.content.call_one().get(timeout=T) == changed
    served = manager.served.call_one().get(timeout=T) - before
    assert served == (12 if lane == "messages" else 0)


def test_the_fallback_parallelism_spreads_chunks_over_that_many_managers(
    actors: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the message lane, ``rdma_tcp_fallback_parallelism`` in the owner's process: the
    buffer is served by that many managers (each its own actor thread), and a transfer's chunks
    go round-robin."""
    monkeypatch.setenv("MONARCH_RDMA_NET_LANE", "messages")  # this (transferring) process
    holder, _, _, _ = actors
    content = _pattern(6 * (1 << 20), seed=7)
    single = holder.create_with.call_one(content[:10], {}).get(timeout=T)
    assert len(single._keys["net"].detail.managers) == 1  # the default: one stream
    buffer = holder.create_with.call_one(content, {"rdma_tcp_fallback_parallelism": 3}).get(
        timeout=T
    )
    managers = buffer._keys["net"].detail.managers
    assert len(managers) == 3
    before = [m.served.call_one().get(timeout=T) for m in managers]
    dst = bytearray(len(content))
    with configured(rdma_max_chunk_size_mb=1, rdma_net_chunks_in_flight=3):
        buffer.read_into(memoryview(dst)).get(timeout=T)  # six chunks over three managers
        assert dst == content
        buffer.write_from(memoryview(bytearray(content[::-1]))).get(timeout=T)
    after = [m.served.call_one().get(timeout=T) for m in managers]
    assert [b - a for a, b in zip(before, after, strict=True)] == [4, 4, 4]
    assert holder.content.call_one().get(timeout=T) == content[::-1]


def test_two_actors_of_other_processes_transfer_without_the_owner(actors: Any) -> None:
    holder, peer, releaser, _ = actors
    content = _pattern(4096, seed=3)
    buffer = holder.create.call_one(content).get(timeout=T)
    busy = holder.block.call_one(T)  # the owner's actor is busy throughout
    try:
        assert peer.read.call_one(buffer, 4096).get(timeout=T) == content
        peer.write.call_one(buffer, b"peer wrote").get(timeout=T)
        assert peer.transport.call_one(buffer).get(timeout=T) == ("net", "tcp")
        assert not busy.done()
    finally:
        releaser.release.call_one().get(timeout=T)
    assert busy.get(timeout=T) is True
    assert holder.content.call_one().get(timeout=T)[:10] == b"peer wrote"


def test_a_worker_reads_and_writes_a_buffer_of_the_client(actors: Any) -> None:
    _, peer, _, _ = actors
    memory = bytearray(_pattern(1000, seed=4))
    buffer = RDMABuffer(memoryview(memory))
    assert peer.read.call_one(buffer, 1000).get(timeout=T) == bytes(memory)
    peer.write.call_one(buffer, b"from the worker").get(timeout=T)
    assert memory.startswith(b"from the worker")
    buffer.drop().get(timeout=T)


def test_an_action_batches_reads_and_writes_over_two_owners(actors: Any) -> None:
    _, _, _, peers = actors
    holders_first = peers.slice(procs=0)  # a Peer in process 0 transfers
    first_memory = bytearray(_pattern(512, seed=5))
    first = RDMABuffer(memoryview(first_memory))  # owned by the client
    holder = actors[0]
    second_content = _pattern(512, seed=6)
    second = holder.create.call_one(second_content).get(timeout=T)  # owned by process 0
    a, b = holders_first.swap.call_one(first, second, 512).get(timeout=T)
    assert a == _pattern(512, seed=5)
    assert b == second_content
    assert bytes(first_memory) == second_content  # written crossed
    assert holder.content.call_one().get(timeout=T) == _pattern(512, seed=5)
    RDMAAction().submit().get(timeout=T)  # empty: a no-op


def test_an_action_of_many_operations_reports_a_dropped_buffer_and_moves_the_rest(
    actors: Any,
) -> None:
    """The operations an owner's data lane serves are pipelined (``transfer_many``): one
    refused by the owner fails the action with its message, the others land all the same."""
    holder, _, _, _ = actors
    content = _pattern(3 << 20, seed=9)
    kept = holder.create.call_one(content).get(timeout=T)
    gone = RDMABuffer(memoryview(bytearray(64)))  # the client's own, dropped
    gone.drop().get(timeout=T)
    dsts = [bytearray(len(content)) for _ in range(6)]
    action = RDMAAction()
    for dst in dsts[:3]:
        action.read_remote(memoryview(dst), kept)
    action.read_remote(memoryview(bytearray(64)), gone)
    for dst in dsts[3:]:
        action.read_remote(memoryview(dst), kept)
    with pytest.raises(RuntimeError, match="not registered"):
        action.submit(timeout=int(T)).get(timeout=T)
    assert all(dst == content for dst in dsts)
    dsts = [bytearray(len(content)) for _ in range(6)]
    action = RDMAAction()
    for dst in dsts:
        action.read_remote(memoryview(dst), kept)
    action.submit(timeout=int(T)).get(timeout=T)  # again, with nothing refused
    assert all(dst == content for dst in dsts)


def test_drop_then_use_fails(actors: Any) -> None:
    holder, peer, _, _ = actors
    buffer = holder.create.call_one(b"soon gone").get(timeout=T)
    assert peer.read.call_one(buffer, 9).get(timeout=T) == b"soon gone"
    holder.drop.call_one().get(timeout=T)
    answer = peer.read_after_drop.call_one(buffer).get(timeout=T)
    assert answer.startswith("error: ")
    assert "not registered" in answer
    with pytest.raises(RuntimeError, match="not registered"):
        buffer.read_into(memoryview(bytearray(9))).get(timeout=T)


def test_a_dead_owner_fails_the_future_within_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[MeshFailure] = []
    died = threading.Event()

    def on_fault(failure: MeshFailure) -> None:  # not fatal
        failures.append(failure)
        died.set()

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", on_fault)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        holder = procs.spawn("holder", Holder)
        buffer = holder.create.call_one(b"owner dies").get(timeout=T)
        pid = os.getpid()
        holder.die.broadcast()
        # The broadcast returns at once: read only once the owner's death reached the client
        # (a read racing the exit may still be served, and then nothing fails).
        assert died.wait(T), "the owner's death never reached the client"
        started = time.monotonic()
        with pytest.raises(Exception) as failure:
            buffer.read_into(memoryview(bytearray(10)), timeout=10).get(timeout=T)
        assert time.monotonic() - started < 15
        assert isinstance(failure.value, RuntimeError), failure.value
        survivor = RDMABuffer(memoryview(bytearray(b"still here")))  # nothing else is lost
        dst = bytearray(10)
        survivor.read_into(memoryview(dst)).get(timeout=T)
        assert dst == b"still here"
        survivor.drop().get(timeout=T)
        assert os.getpid() == pid  # the client lives on
    finally:
        with contextlib.suppress(Exception):
            procs.stop().get(timeout=T)
