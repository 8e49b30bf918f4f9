"""CUDA tensors staged through pinned host memory (``monarch.rdma._staging``).

There is no GPU where these tests run, so the staging logic is tested with CPU tensors standing
in for device tensors (``StandIn``: the device check and the copies injected through
``set_device_ops``; its copies run at once, like a stream that is idle). The test on a real GPU
skips without ``torch.cuda.is_available()``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import this_host
from monarch.rdma import RDMAAction, RDMABuffer, _staging

sys.path.insert(0, str(Path(__file__).parent))  # workers import cuda_standin by name
from cuda_standin import StagedHolder, StandIn

torch: Any = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore::monarch.rdma.RDMATcpFallbackWarning")
T = 30.0


@pytest.fixture
def ops() -> Iterator[StandIn]:
    stand_in = StandIn()
    _staging.set_device_ops(stand_in)
    try:
        yield stand_in
    finally:
        _staging.set_device_ops(None)


def _bytes(tensor: Any) -> bytes:
    return bytes(tensor.tolist())


def test_a_write_from_a_device_tensor_sends_it_as_it_was_at_submit(ops: StandIn) -> None:
    owner = bytearray(8)
    buffer = RDMABuffer(memoryview(owner))
    source = ops.device(b"at-submt")
    ops.current = "user-stream"
    future = buffer.write_from(source)
    source.fill_(0)  # changed after submit(): the copy queued there is what is sent
    future.get(timeout=T)
    assert owner == b"at-submt"
    assert ("to_host", 8, "user-stream") in ops.log
    assert ("wait", ops.log.index(("to_host", 8, "user-stream")) + 1, "") in ops.log
    buffer.drop().get(timeout=T)


def test_a_read_into_a_device_tensor_lands_there_on_the_submit_stream(ops: StandIn) -> None:
    owner = bytearray(b"remote bytes")
    buffer = RDMABuffer(memoryview(owner))
    dst = ops.device(b"\xff" * 16)
    ops.current = "user-stream"
    future = buffer.read_into(dst)
    ops.current = "another-stream"
    future.get(timeout=T)
    assert _bytes(dst) == b"remote bytes" + b"\xff" * 4  # the leading bytes, the tail kept
    copies = [entry for entry in ops.log if entry[0] == "to_device"]
    assert copies == [("to_device", 12, "user-stream")]
    assert ops.log[-1] == ("wait", len(ops.log) - 1, "")  # waited for before the Future resolved
    buffer.drop().get(timeout=T)


def test_a_buffer_over_a_device_tensor_is_synced_around_each_transfer(ops: StandIn) -> None:
    tensor = ops.device(b"first...")
    buffer = RDMABuffer(tensor)
    assert buffer.size() == 8
    tensor.copy_(torch.tensor(list(b"changed!"), dtype=torch.uint8))  # after registration
    dst = bytearray(8)
    buffer.read_into(memoryview(dst)).get(timeout=T)
    assert dst == b"changed!"  # copied to the staging memory before the read
    tensor[7] = ord("?")  # on the device, after the read's copy to the staging memory
    buffer.write_from(memoryview(b"written")).get(timeout=T)
    assert _bytes(tensor) == b"written?"  # the 7 written bytes copied back, the rest kept
    both = ops.device(b"\0" * 8)
    RDMAAction().read_remote(both, buffer).submit(timeout=30).get(timeout=T)
    assert _bytes(both) == b"written?"  # device to device, staged at both ends
    buffer.drop().get(timeout=T)
    assert not _staging._owned
    with pytest.raises(RuntimeError, match="dropped"):
        buffer.read_into(memoryview(dst)).get(timeout=T)


def test_device_tensors_are_validated_like_others(ops: StandIn) -> None:
    buffer = RDMABuffer(memoryview(bytearray(8)))
    small = ops.device(b"1234")
    with pytest.raises(ValueError, match="must be >= RDMA buffer size"):
        buffer.read_into(small)
    square = torch.zeros((2, 2), dtype=torch.uint8)
    ops.devices.append(square)
    with pytest.raises(ValueError, match="only supports 1d contiguous"):
        RDMABuffer(square)
    empty = torch.zeros(0, dtype=torch.uint8)
    ops.devices.append(empty)
    with pytest.raises(ValueError, match="size 0"):
        RDMABuffer(empty)
    dst = ops.device(b"\0" * 8)
    action = RDMAAction().read_remote(dst, buffer)
    with pytest.raises(ValueError, match="overlaps"):
        action.read_remote(dst, buffer)  # the device range is claimed, not the staging one
    buffer.drop().get(timeout=T)


def test_the_owner_process_syncs_its_staging_when_another_process_transfers(
    ops: StandIn,
) -> None:
    """The owner in a worker process: a read from the client has the worker copy the tensor to
    its staging memory first, a write has it copy the staging memory back (its
    ``StagingManager``, in actor messages)."""
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        holder = procs.spawn("staged", StagedHolder)
        buffer: RDMABuffer = holder.create.call_one(b"in the gpu").get(timeout=T)
        holder.set.call_one(b"changed!!!").get(timeout=T)  # on the device, after registration
        dst = bytearray(10)
        buffer.read_into(memoryview(dst)).get(timeout=T)
        assert dst == b"changed!!!"
        buffer.write_from(memoryview(b"from host")).get(timeout=T)
        assert holder.content.call_one().get(timeout=T) == b"from host!"
        assert holder.syncs.call_one().get(timeout=T) == ["to_host", "to_host", "to_device"]
        buffer.drop().get(timeout=T)
        with pytest.raises(RuntimeError, match="dropped"):
            buffer.read_into(memoryview(dst)).get(timeout=T)
    finally:
        procs.stop().get(timeout=T)


def test_tensors_of_other_devices_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="meta tensor is not supported"):
        RDMABuffer(torch.empty(4, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_a_cuda_tensor_moves_both_ways() -> None:
    device = torch.arange(256, dtype=torch.uint8, device="cuda")
    buffer = RDMABuffer(device)
    dst = torch.zeros(256, dtype=torch.uint8, device="cuda")
    buffer.read_into(dst).get(timeout=T)
    assert torch.equal(dst, device)
    src = torch.full((128,), 7, dtype=torch.uint8, device="cuda")
    buffer.write_from(src).get(timeout=T)
    assert device[:128].eq(7).all().item()
    assert torch.equal(device[128:], dst[128:])
    buffer.drop().get(timeout=T)
