"""The provider interface: the pure choice of a provider, the chunk plan, the plugin registry
(conflicts, entry points of another distribution) and a third-party provider serving transfers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.rdma import RDMAAction, RDMABuffer, _net, _plugin, _registry
from monarch.rdma.hookspecs import hookimpl
from monarch.rdma.providers import (
    PeerInfo,
    ProviderConflictError,
    ProviderRegistry,
    ProviderSpec,
    RDMAProvider,
    Reach,
    RemoteKey,
    default_registry,
    select_provider,
)

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")
T = 30.0


def _spec(name: str, reach: Reach, priority: int, backend: str = "tcp") -> ProviderSpec:
    return ProviderSpec(name, backend, reach, priority, lambda: True, _net.NetProvider)


SPECS = [
    _spec("net", Reach.ANY, 0),
    _spec("shm", Reach.HOST, 10),
    _spec("ibverbs", Reach.ANY, 20, "ibverbs"),
    _spec("local", Reach.PROCESS, 30),
]
ALL = frozenset(s.name for s in SPECS)
KEYS = {s.name: RemoteKey(s.name, 1, 8) for s in SPECS}


@pytest.mark.parametrize(
    ("local", "owner", "chosen"),
    [
        (PeerInfo("h1", "p1", ALL), PeerInfo("h1", "p1", ALL), "local"),
        (PeerInfo("h1", "p2", ALL), PeerInfo("h1", "p1", ALL), "ibverbs"),
        (PeerInfo("h1", "p2", ALL - {"ibverbs"}), PeerInfo("h1", "p1", ALL), "shm"),
        (PeerInfo("h2", "p2", ALL - {"ibverbs"}), PeerInfo("h1", "p1", ALL), "net"),
        (PeerInfo("h2", "p1", ALL), PeerInfo("h1", "p1", ALL), "ibverbs"),  # same pid elsewhere
        (PeerInfo("h2", "p2", frozenset({"shm"})), PeerInfo("h1", "p1", ALL), None),
    ],
)
def test_the_provider_is_chosen_per_pair_by_reach_then_priority(
    local: PeerInfo, owner: PeerInfo, chosen: str | None
) -> None:
    assert select_provider(SPECS, local, owner, KEYS) == chosen
    assert select_provider(list(reversed(SPECS)), local, owner, KEYS) == chosen  # order-free


def test_only_providers_the_owner_registered_with_are_candidates() -> None:
    here = PeerInfo("h1", "p1", ALL)
    assert select_provider(SPECS, here, here, {"net": KEYS["net"]}) == "net"
    assert select_provider(SPECS, here, here, {}) is None


@given(
    total=st.integers(0, 1 << 30),
    max_chunk=st.integers(1 << 16, 1 << 28),  # at most 16 Ki chunks: the plan is a list
    window=st.integers(1, 64),
)
def test_chunks_cover_the_transfer_exactly_within_the_bounds(
    total: int, max_chunk: int, window: int
) -> None:
    chunks = _net.plan_chunks(total, max_chunk, window)
    assert sum(length for _, length in chunks) == total
    offset = 0
    for start, length in chunks:
        assert start == offset
        assert 0 < length <= min(max_chunk, _net.MAX_PIPELINE_CHUNK)
        offset += length
    if total >= _net.MIN_CHUNK * window and max_chunk >= _net.MIN_CHUNK:
        assert len(chunks) >= window  # enough chunks to fill the window


def test_a_bad_chunk_plan_is_refused() -> None:
    with pytest.raises(ValueError):
        _net.plan_chunks(10, 0, 1)


class _Plugin:
    def __init__(self, *specs: ProviderSpec) -> None:
        self.specs = specs

    @hookimpl
    def monarch_rdma_providers(self) -> Sequence[ProviderSpec]:
        return self.specs


def test_two_plugins_claiming_one_name_conflict() -> None:
    registry = ProviderRegistry()
    registry.register(_Plugin(_spec("net", Reach.ANY, 0)), name="first")
    registry.register(_Plugin(_spec("net", Reach.ANY, 5)), name="second")
    with pytest.raises(ProviderConflictError, match=r"first.*second|second.*first"):
        registry.specs()


def test_the_default_registry_has_the_net_provider() -> None:
    registry = default_registry()
    assert registry.is_registered(_plugin)
    assert set(registry.specs()) >= {"net"}
    assert isinstance(registry.provider("net"), RDMAProvider)


def test_a_plugin_of_another_distribution_is_found_by_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "thirdparty_rdma.py"
    package.write_text(
        "from monarch.rdma.hookspecs import hookimpl\n"
        "from monarch.rdma.providers import ProviderSpec, Reach\n"
        "from monarch.rdma._net import NetProvider\n"
        "@hookimpl\n"
        "def monarch_rdma_providers():\n"
        "    return [ProviderSpec('fabric', 'ibverbs', Reach.ANY, 7, lambda: True, NetProvider)]\n"
    )
    dist = tmp_path / "thirdparty_rdma-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-rdma\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[monarch.rdma]\nfabric = thirdparty_rdma\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = ProviderRegistry()
    assert registry.load_entry_points() >= 1
    assert registry.specs()["fabric"].priority == 7
    assert registry.load_entry_points() == 0  # loaded once


class _LoopProvider:
    """A third-party provider serving this process only: plain memcpy, or never completing."""

    name = "loop"

    def __init__(self, stall: bool = False) -> None:
        self.stall = stall
        self.regions: dict[int, memoryview] = {}
        self.transfers = 0

    def register(self, memory: memoryview, *, owner: str) -> RemoteKey:
        self.regions[len(self.regions)] = memory
        return RemoteKey("loop", len(self.regions) - 1, memory.nbytes)

    async def read(self, key: RemoteKey, offset: int, dst: memoryview) -> None:
        self.transfers += 1
        if self.stall:
            await asyncio.Event().wait()
        dst[:] = self.regions[key.region][offset : offset + dst.nbytes]

    async def write(self, key: RemoteKey, offset: int, src: memoryview) -> None:
        self.transfers += 1
        self.regions[key.region][offset : offset + src.nbytes] = src

    async def deregister(self, key: RemoteKey) -> None:
        self.regions.pop(key.region, None)


@pytest.fixture
def loop_provider(monkeypatch: pytest.MonkeyPatch) -> _LoopProvider:
    """A default registry with the built-in plugin and a ``loop`` provider above it."""
    provider = _LoopProvider()
    registry = ProviderRegistry()
    registry.register(_plugin)
    registry.register(
        _Plugin(ProviderSpec("loop", "tcp", Reach.PROCESS, 50, lambda: True, lambda: provider))
    )
    monkeypatch.setattr(_registry, "_default", registry)
    return provider


def test_a_third_party_provider_serves_the_pairs_it_reaches(loop_provider: _LoopProvider) -> None:
    memory = bytearray(b"served by loop")
    buffer = RDMABuffer(memoryview(memory))
    assert buffer.transport == "loop"
    assert buffer.backend == "tcp"
    dst = bytearray(len(memory))
    buffer.read_into(memoryview(dst)).get(timeout=T)
    buffer.write_from(memoryview(b"SERVED")).get(timeout=T)
    assert dst == b"served by loop"
    assert memory == b"SERVED by loop"
    assert loop_provider.transfers == 2
    buffer.drop().get(timeout=T)
    assert loop_provider.regions == {}


def test_a_transfer_that_never_completes_fails_at_its_timeout(
    loop_provider: _LoopProvider,
) -> None:
    loop_provider.stall = True
    buffer = RDMABuffer(memoryview(bytearray(4)))
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out: not complete within 1 s"):
        RDMAAction().read_remote(memoryview(bytearray(4)), buffer).submit(timeout=1).get(timeout=T)
    assert 1.0 <= time.monotonic() - started < 10
    buffer.drop().get(timeout=T)


def test_a_child_forked_while_this_package_holds_its_locks_starts_with_free_ones() -> None:
    """monarch's zygote forks workers from a copy of the client while the client's main thread
    may be inside ``get_rdma_backend()``: a lock held there at the fork stayed held in every
    worker, and the worker's first ``RDMABuffer`` hung (the README example, 4 runs in 6)."""
    import os
    import signal

    from monarch.rdma import _buffer, _net, _shm, get_rdma_backend

    registry = default_registry()
    locks: list[Any] = [
        _registry._default_lock,
        registry._lock,
        _buffer._fallback_lock,
        _net._manager_lock,
        _net._regions_lock,
        _shm._pool_lock,
    ]
    for lock in locks:
        lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # the child: every call below takes one of those locks
            signal.alarm(20)  # a hang kills the child, and the parent sees the signal
            try:
                default_registry().provider("net")
                get_rdma_backend()
                with _buffer._fallback_lock, _net._manager_lock, _net._regions_lock:
                    pass
                _shm._copier()
            except BaseException:
                os._exit(1)
            os._exit(0)
    finally:
        for lock in locks:
            lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
