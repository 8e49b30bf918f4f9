"""The ``ibverbs`` provider's logic against the pyverbs emulation of ``fake_pyverbs`` (no RDMA
device exists where these tests run): queue-pair states, chunking, the bounds on outstanding
work requests, completions, error paths, deregistration, and the buffer API choosing it. The
test against a real device (pyverbs, loopback in one process) skips without one."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.config import configured
from monarch.rdma import RDMAAction, RDMABuffer, _ibverbs, _verbs, get_rdma_backend
from monarch.rdma._verbs_proto import QpInfo
from monarch.rdma.providers import RegistrationDeclined, RemoteKey

sys.path.insert(0, str(Path(__file__).parent))

from fake_pyverbs import Fabric, e

MIB = 1 << 20
T = 30.0


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[Fabric]:
    fab = Fabric(tmp_path / "fabric")
    _verbs.use_api(fab.api, "fake0")
    try:
        yield fab
    finally:
        fab.release()
        if _verbs._state is not None:
            _verbs._state.close()
        _verbs.use_api(None)


def _pattern(size: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(size))


def _provider() -> _verbs.VerbsProvider:
    return _verbs.VerbsProvider(manager=False)


def test_a_read_and_a_write_move_the_bytes_and_connect_through_init_rtr_rts(
    fabric: Fabric,
) -> None:
    provider = _provider()
    owner = bytearray(_pattern(4096))
    key = provider.register(memoryview(owner), owner="test")
    assert key.provider == "ibverbs"
    assert key.size == 4096
    dst = bytearray(1000)
    asyncio.run(provider.read(key, 100, memoryview(dst)))
    assert bytes(dst) == _pattern(4096)[100:1100]
    asyncio.run(provider.write(key, 4000, memoryview(b"x" * 96)))
    assert owner[4000:] == b"x" * 96
    assert owner[:4000] == _pattern(4096)[:4000]
    # two queue pairs (the requester's and the owner's loopback one), each RESET->INIT->RTR->RTS
    sequences = list(fabric.transitions.values())
    assert sequences == [["RESET", "INIT", "RTR", "RTS"]] * 2
    # the connection is kept: a second transfer makes no queue pair
    asyncio.run(provider.read(key, 0, memoryview(dst)))
    assert len(fabric.transitions) == 2
    assert any(t.name == "monarch-rdma-verbs-cq" for t in threading.enumerate())


def test_a_transfer_is_cut_into_chunks_of_the_configured_size(fabric: Fabric) -> None:
    provider = _provider()
    size = 5 * MIB + MIB // 2
    owner = bytearray(_pattern(size))
    key = provider.register(memoryview(owner), owner="test")
    dst = bytearray(size)
    with configured(rdma_max_chunk_size_mb=1):
        asyncio.run(provider.read(key, 0, memoryview(dst)))
    assert dst == owner
    assert fabric.wr_lengths == [MIB] * 5 + [MIB // 2]


@given(st.integers(1, 1 << 30), st.integers(0, 1000), st.integers(0, (1 << 30) - 1))
def test_chunk_plans_cover_the_transfer_exactly(max_chunk: int, whole: int, part: int) -> None:
    total = max_chunk * whole + part % max_chunk
    plan = _verbs.plan_chunks(total, max_chunk)
    assert sum(length for _, length in plan) == total
    assert all(0 < length <= max_chunk for _, length in plan)
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(plan))


async def _held(fabric: Fabric, transfers: list[Any]) -> int:
    """Start ``transfers`` with the device held; return how many were outstanding then."""
    tasks = [asyncio.ensure_future(t) for t in transfers]
    for _ in range(5):
        await asyncio.sleep(0)  # each task posts its window, then waits for completions
    outstanding = fabric.max_outstanding
    fabric.release()
    await asyncio.gather(*tasks)
    return outstanding


def test_outstanding_work_requests_are_bounded_per_transfer(fabric: Fabric) -> None:
    provider = _provider()
    owner = bytearray(_pattern(8 * MIB))
    key = provider.register(memoryview(owner), owner="test")
    dst = bytearray(8 * MIB)
    asyncio.run(provider.read(key, 0, memoryview(dst[:1])))  # connect first
    fabric.max_outstanding = 0
    fabric.hold()
    with configured(rdma_max_chunk_size_mb=1, rdma_net_chunks_in_flight=3):
        held = asyncio.run(_held(fabric, [provider.read(key, 0, memoryview(dst))]))
    assert held == 3  # the window was posted, no more
    assert fabric.max_outstanding == 3  # and never more than the window afterwards
    assert dst == owner


def test_the_send_queue_bounds_concurrent_transfers_with_a_backlog(
    fabric: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_verbs, "SEND_QUEUE_DEPTH", 4)
    provider = _provider()
    owner = bytearray(_pattern(3 * MIB))
    key = provider.register(memoryview(owner), owner="test")
    dsts = [bytearray(3 * MIB) for _ in range(3)]
    asyncio.run(provider.read(key, 0, memoryview(dsts[0][:1])))
    fabric.max_outstanding = 0
    fabric.hold()
    with configured(rdma_max_chunk_size_mb=1, rdma_net_chunks_in_flight=3):
        reads = [provider.read(key, 0, memoryview(d)) for d in dsts]
        held = asyncio.run(_held(fabric, reads))
    assert held == 4  # 9 requests wanted; the queue pair's depth holds 4, the rest waited
    assert fabric.max_outstanding == 4
    assert all(d == owner for d in dsts)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (e.IBV_WC_REM_ACCESS_ERR, "refused the access"),
        (e.IBV_WC_RETRY_EXC_ERR, "exited or cannot be reached"),
        (e.IBV_WC_LOC_PROT_ERR, "local memory registration"),
    ],
)
def test_a_failed_completion_fails_the_transfer_and_the_next_one_reconnects(
    fabric: Fabric, status: int, message: str
) -> None:
    provider = _provider()
    owner = bytearray(_pattern(4 * MIB))
    key = provider.register(memoryview(owner), owner="test")
    dst = bytearray(4 * MIB)
    fabric.fail_next(status)
    with configured(rdma_max_chunk_size_mb=1), pytest.raises(RuntimeError, match=message):
        asyncio.run(provider.read(key, 0, memoryview(dst)))
    # the failed queue pair went to the error state and, drained, was destroyed; the next
    # transfer connects afresh
    failed = [qp for qp, seq in fabric.transitions.items() if seq[-1] == "ERR"]
    assert len(failed) == 1
    assert not (fabric.dir / f"qp-{failed[0]}").exists()
    asyncio.run(provider.read(key, 0, memoryview(dst)))
    assert dst == owner
    assert len(fabric.transitions) == 4


class _Messages:
    """Stands in for an owner's ``VerbsManager`` in another process: the handshake is awaited
    (as an actor message is), then answered by this process's state."""

    def __init__(self) -> None:
        self.calls = 0
        self.connect = self

    async def call_one(self, rkey: int, request: bytes) -> bytes:
        self.calls += 1
        await asyncio.sleep(0.01)
        return _verbs._provider_state().accept(rkey, request)


def test_concurrent_transfers_towards_one_owner_share_one_handshake(fabric: Fabric) -> None:
    provider = _provider()
    owner = bytearray(_pattern(2 * MIB))
    key = provider.register(memoryview(owner), owner="test")
    messages = _Messages()
    remote = dataclasses.replace(
        key, detail=dataclasses.replace(key.detail, process="elsewhere/1", manager=messages)
    )
    dsts = [bytearray(2 * MIB) for _ in range(4)]

    async def together() -> None:
        await asyncio.gather(*(provider.read(remote, 0, memoryview(d)) for d in dsts))

    asyncio.run(together())
    assert all(d == owner for d in dsts)
    assert messages.calls == 1
    assert len(fabric.transitions) == 2  # one queue pair each side


def test_a_dropped_region_is_refused_on_a_kept_and_on_a_new_connection(fabric: Fabric) -> None:
    provider = _provider()
    owner = bytearray(_pattern(1024))
    key = provider.register(memoryview(owner), owner="test")
    other = provider.register(memoryview(bytearray(16)), owner="test")
    asyncio.run(provider.read(key, 0, memoryview(bytearray(1024))))
    asyncio.run(provider.deregister(key))
    asyncio.run(provider.deregister(key))  # twice is not an error
    with pytest.raises(RuntimeError, match="dropped"):
        asyncio.run(provider.read(key, 0, memoryview(bytearray(1024))))
    assert not (fabric.dir / f"mr-{key.region}").exists()  # the memory region is gone
    # a fresh connection: the handshake itself refuses the dropped region
    _verbs._provider_state().connections.clear()
    with pytest.raises(RuntimeError, match="not registered in this process"):
        asyncio.run(provider.write(key, 0, memoryview(b"x")))
    asyncio.run(provider.write(other, 0, memoryview(b"still fine")))


def test_read_only_memory_may_be_read_but_not_written(fabric: Fabric) -> None:
    provider = _provider()
    key = provider.register(memoryview(b"constant"), owner="test")
    dst = bytearray(8)
    asyncio.run(provider.read(key, 0, memoryview(dst)))
    assert dst == b"constant"
    with pytest.raises(RuntimeError, match="refused the access"):
        asyncio.run(provider.write(key, 0, memoryview(bytearray(b"x"))))
    with pytest.raises(RuntimeError, match="outside its 8 bytes"):
        asyncio.run(provider.read(key, 4, memoryview(dst)))


def test_a_cancelled_transfer_flushes_before_the_caller_has_the_error(fabric: Fabric) -> None:
    provider = _provider()
    owner = bytearray(_pattern(4 * MIB))
    key = provider.register(memoryview(owner), owner="test")
    dst = bytearray(4 * MIB)
    asyncio.run(provider.read(key, 0, memoryview(dst[:1])))
    dst[:1] = b"\0"
    fabric.hold()

    async def timed() -> None:
        async with asyncio.timeout(0.2):
            await provider.read(key, 0, memoryview(dst))

    with configured(rdma_max_chunk_size_mb=1), pytest.raises(TimeoutError):
        asyncio.run(timed())
    state = _verbs._provider_state()
    assert not state.connections  # the queue pair was retired (moved to the error state)
    assert not state.pending  # every posted request completed (flushed) before the error
    assert list(state.pd.mrs) == [key.region]  # the destination's registration is gone
    fabric.release()
    assert dst == bytearray(4 * MIB)  # and the device wrote nothing into it


def test_the_buffer_api_takes_ibverbs_when_it_is_available(fabric: Fabric) -> None:
    owner = bytearray(_pattern(2048))
    assert get_rdma_backend() == "ibverbs"
    buffer = RDMABuffer(memoryview(owner))
    assert buffer.backend == "ibverbs"
    assert buffer.transport == "ibverbs"
    assert set(buffer._keys) >= {"ibverbs", "net"}
    dst = bytearray(2048)
    buffer.read_into(memoryview(dst)).get(timeout=T)
    assert dst == owner
    halves = bytearray(4096)
    RDMAAction().read_remote(memoryview(halves)[:2048], buffer).read_remote(
        memoryview(halves)[2048:], buffer
    ).submit(timeout=30).get(timeout=T)
    assert halves == owner * 2
    with configured(rdma_disable_ibverbs=True):
        assert get_rdma_backend() == "tcp"
        assert buffer.transport in ("shm", "net")
    buffer.drop().get(timeout=T)
    with pytest.raises(RuntimeError):
        buffer.read_into(memoryview(dst)).get(timeout=T)


def test_a_device_that_cannot_be_opened_declines_and_net_serves(tmp_path: Path) -> None:
    def broken() -> Any:
        raise OSError("device busy (emulated)")

    _verbs.use_api(broken, "fake0")
    try:
        with pytest.raises(RegistrationDeclined, match="device busy"):
            _provider().register(memoryview(bytearray(8)), owner="test")
        buffer = RDMABuffer(memoryview(bytearray(b"net only")))
        assert "ibverbs" not in buffer._keys
        assert buffer.transport in ("shm", "net")
        dst = bytearray(8)
        buffer.read_into(memoryview(dst)).get(timeout=T)
        assert dst == b"net only"
        buffer.drop().get(timeout=T)
    finally:
        _verbs.use_api(None)


def test_without_a_device_the_provider_is_not_offered() -> None:
    assert _verbs._api_factory is None
    if _ibverbs.usable_devices():
        pytest.skip("an RDMA device exists here")
    assert _verbs.SPEC.available() is False
    assert get_rdma_backend() == "tcp"


def _keyed(size: int) -> RemoteKey:
    return RemoteKey("net", 1, size)


def test_a_key_of_another_provider_is_refused(fabric: Fabric) -> None:
    with pytest.raises(RuntimeError, match="not an ibverbs key"):
        asyncio.run(_provider().read(_keyed(4), 0, memoryview(bytearray(4))))


@pytest.mark.skipif(
    not _ibverbs.usable_devices() or not _ibverbs.pyverbs_importable(),
    reason=f"no RDMA device with pyverbs here: {_ibverbs.unavailable_reason() or 'no active port'}",
)
def test_a_real_device_reads_and_writes_over_a_loopback_queue_pair() -> None:
    provider = _provider()
    owner = bytearray(_pattern(3 * MIB))
    key = provider.register(memoryview(owner), owner="test")
    dst = bytearray(3 * MIB)
    with configured(rdma_max_chunk_size_mb=1):
        asyncio.run(provider.read(key, 0, memoryview(dst)))
        asyncio.run(provider.write(key, 0, memoryview(b"z" * MIB)))
    assert dst == _pattern(3 * MIB)
    assert owner[:MIB] == b"z" * MIB
    asyncio.run(provider.deregister(key))
    with pytest.raises(RuntimeError):
        asyncio.run(provider.read(key, 0, memoryview(dst)))


def _real_pyverbs() -> Any:
    try:
        return _verbs.load_pyverbs()
    except ImportError:
        return None


@pytest.mark.skipif(not _ibverbs.pyverbs_importable(), reason="pyverbs is not installed")
def test_the_attributes_and_work_requests_are_built_with_pyverbs_own_classes() -> None:
    """Device-free: pyverbs builds these structures without opening a device, so the calls
    (keyword names, attribute names, enum names) are checked against the real library."""
    api = _real_pyverbs()
    assert api is not None
    e_ = api.e
    gid = bytes(range(16))
    local = QpInfo(lid=1, gid=gid, qp_num=0x11, psn=0x22, mtu=5, port=1, gid_index=0)
    remote = QpInfo(lid=2, gid=gid[::-1], qp_num=0x33, psn=0x44, mtu=3, port=1, gid_index=0)
    init = _verbs.qp_init_attr(api, None)
    assert init.qp_type == e_.IBV_QPT_RC
    assert init.cap.max_send_wr == _verbs.SEND_QUEUE_DEPTH
    attr = _verbs.init_attr(api)
    assert attr.qp_access_flags & e_.IBV_ACCESS_REMOTE_READ
    for is_global in (False, True):
        rtr = _verbs.rtr_attr(api, local, remote, 16, is_global)
        assert (rtr.dest_qp_num, rtr.rq_psn, rtr.path_mtu) == (0x33, 0x44, 3)
        assert rtr.ah_attr.dlid == 2
        assert bool(rtr.ah_attr.is_global) is is_global
        rts = _verbs.rts_attr(rtr, local, 16)
        assert (rts.sq_psn, rts.timeout, rts.retry_cnt) == (0x22, 14, 7)
    wr = _verbs.work_request(api, 9, e_.IBV_WR_RDMA_READ, 0x1000, 4096, 5, 6, 0x2000)
    assert (wr.wr_id, wr.opcode, wr.num_sge) == (9, e_.IBV_WR_RDMA_READ, 1)
    for name in ("IBV_QP_STATE", "IBV_QPS_ERR", "IBV_PORT_ACTIVE", "IBV_LINK_LAYER_ETHERNET",
                 "IBV_WC_SUCCESS", "IBV_WC_REM_ACCESS_ERR", "IBV_WC_RETRY_EXC_ERR",
                 "IBV_WC_WR_FLUSH_ERR", "IBV_WC_LOC_PROT_ERR"):  # fmt: skip
        assert isinstance(getattr(e_, name), int), name
