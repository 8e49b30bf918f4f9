"""The ``ibverbs`` provider between real processes, over the pyverbs emulation of
``fake_pyverbs`` (no RDMA device exists here): the queue-pair handshake travels in actor
messages between two worker processes (and the client), the emulated device copies between the
processes' registered memory (``process_vm_readv``/``writev``) after checking keys, bounds and
access, and a dropped buffer is refused."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import monarch.actor
from monarch.actor import MeshFailure, ProcMesh, this_host
from monarch.rdma import RDMABuffer, _verbs

sys.path.insert(0, str(Path(__file__).parent))  # workers import these modules by name
from fake_pyverbs import Fabric
from rdma_actors import Holder, Peer
from verbs_actors import VerbsSetup

T = 60.0
_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
pytestmark = [
    pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning"),
    pytest.mark.skipif(
        _SCOPE.exists() and _SCOPE.read_text().strip() != "0",
        reason="the emulation copies with process_vm_readv, which Yama's ptrace_scope limits",
    ),
]


@pytest.fixture(scope="module")
def fabric_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("fabric"))


def _pattern(size: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(size))


@pytest.fixture(scope="module")
def actors(fabric_dir: str) -> Iterator[tuple[Any, Any, Any]]:
    directory = fabric_dir
    procs: ProcMesh = this_host().spawn_procs(per_host={"procs": 2})
    try:
        setup = procs.spawn("verbs_setup", VerbsSetup)
        setup.install.call(directory).get(timeout=T)
        _verbs.use_api(Fabric(directory).api, "fake0")
        holders = procs.spawn("holder", Holder)
        peers = procs.spawn("peer", Peer)
        yield holders.slice(procs=0), peers.slice(procs=1), setup
        setup.uninstall.call().get(timeout=T)
    finally:
        if _verbs._state is not None:
            _verbs._state.close()
        _verbs.use_api(None)
        procs.stop().get(timeout=T)


def test_a_peer_process_reads_and_writes_over_a_queue_pair_set_up_by_messages(
    actors: tuple[Any, Any, Any],
) -> None:
    holder, peer, setup = actors
    content = _pattern(3 << 20)
    buffer = holder.create.call_one(content).get(timeout=T)
    assert "ibverbs" in buffer._keys
    assert peer.transport.call_one(buffer).get(timeout=T) == ("ibverbs", "ibverbs")
    assert peer.read.call_one(buffer, len(content)).get(timeout=T) == content
    peer.write.call_one(buffer, b"written by the peer").get(timeout=T)
    assert holder.content.call_one().get(timeout=T)[:19] == b"written by the peer"
    owner_side = setup.slice(procs=0).queue_pairs.call_one().get(timeout=T)
    peer_side = setup.slice(procs=1).queue_pairs.call_one().get(timeout=T)
    assert owner_side["accepted"] == 1
    assert peer_side["connected"] == 1
    assert owner_side["transitions"] == [["RESET", "INIT", "RTR", "RTS"]]
    assert peer_side["transitions"] == [["RESET", "INIT", "RTR", "RTS"]]


def test_the_client_reads_a_worker_buffer_and_a_drop_is_refused_after(
    actors: tuple[Any, Any, Any],
) -> None:
    holder, peer, _ = actors
    content = _pattern(100_000, seed=3)
    buffer: RDMABuffer = holder.create.call_one(content).get(timeout=T)
    assert buffer.transport == "ibverbs"
    assert buffer.backend == "ibverbs"
    dst = bytearray(len(content))
    buffer.read_into(memoryview(dst)).get(timeout=T)
    assert dst == content
    holder.drop.call_one().get(timeout=T)
    outcome = peer.read_after_drop.call_one(buffer).get(timeout=T)
    assert outcome.startswith("error:"), outcome
    assert "dropped" in outcome, outcome
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.read_into(memoryview(dst)).get(timeout=T)


def test_a_dead_owner_fails_a_transfer_on_a_kept_queue_pair(
    actors: tuple[Any, Any, Any], fabric_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    died = threading.Event()

    def on_fault(failure: MeshFailure) -> None:  # not fatal
        died.set()

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", on_fault)
    victim = this_host().spawn_procs(per_host={"procs": 1})
    try:
        victim.spawn("verbs_setup", VerbsSetup).install.call(fabric_dir).get(timeout=T)
        holder = victim.spawn("holder", Holder)
        buffer: RDMABuffer = holder.create.call_one(b"owner dies").get(timeout=T)
        dst = bytearray(10)
        buffer.read_into(memoryview(dst)).get(timeout=T)  # connected
        assert dst == b"owner dies"
        holder.die.broadcast()
        assert died.wait(T), "the owner's death never reached the client"
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="exited or cannot be reached"):
            buffer.read_into(memoryview(dst), timeout=10).get(timeout=T)
        assert time.monotonic() - started < 15
    finally:
        with contextlib.suppress(Exception):
            victim.stop().get(timeout=T)
