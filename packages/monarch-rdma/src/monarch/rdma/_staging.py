"""CUDA tensors through pinned host memory: the staging of ``RDMABuffer`` and ``RDMAAction``.

Why: no provider here reaches GPU memory directly (no GPUDirect: the ``ibverbs`` provider
registers host memory, ``shm`` and ``net`` copy host memory), so a CUDA tensor is served through
a pinned CPU *staging* tensor of the same byte size, and the bytes are copied between the device
and the staging tensor around each transfer.

* **Local side** (a CUDA tensor as ``read_into``'s destination or ``write_from``'s source, or in
  ``RDMAAction``): the transfer moves the bytes between the staging tensor and the remote
  buffer. A write's device-to-host copy is queued in ``submit()`` itself, on the CUDA stream
  current in the caller's thread, so it sends the tensor as it is once the work queued before
  ``submit()`` on that stream has run. A read's host-to-device copy is queued on that same
  stream after the transfer and waited for before the Future resolves: once it has resolved,
  the bytes are in the tensor for work on any stream.
* **Owner side** (``RDMABuffer(cuda_tensor)``): the buffer registers a pinned staging copy of
  the tensor (filled at registration) with the providers. Before a read through the buffer, the
  owner's process copies the tensor into the staging memory; after a write, it copies the
  staging memory into the tensor; each on the device's current stream of the thread that runs
  it (the default stream), waited for. These two steps are not one-sided: they are a call to the
  owner process's ``StagingManager`` actor (never one of the user's actors; a direct call in the
  owner's process).

The device operations are behind ``DeviceOps`` (``set_device_ops`` replaces them) so that the
staging logic is tested without a GPU, with CPU tensors standing in for device ones.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
from dataclasses import dataclass
from typing import Any, Final, Protocol

from monarch.actor import Actor, ActorError, endpoint
from monarch.rdma._host import HOST
from monarch.rdma._memory import LocalMemory, _torch_tensor_type, local_memory
from monarch.rdma._owned import spawn_process_actor

__all__ = [
    "MAX_STAGED",
    "DeviceOps",
    "LocalStage",
    "StageRef",
    "StagingManager",
    "TorchCuda",
    "device_ops",
    "release",
    "set_device_ops",
    "stage_local",
    "stage_owner",
    "sync_owner",
]

#: Buffers over device memory one process may hold at once.
MAX_STAGED: Final = 4096


class DeviceOps(Protocol):
    """What staging needs from a device runtime. A *token* is what ``wait`` waits for."""

    def is_device(self, data: object) -> bool:
        """Whether ``data`` is a tensor in device memory that staging serves."""
        ...

    def staging(self, data: Any) -> Any:
        """A pinned host tensor (1-D, uint8) of ``data``'s byte size."""
        ...

    def stream(self, data: Any) -> Any:
        """The stream current in this thread for ``data``'s device."""
        ...

    def to_host(self, device: Any, host: Any, nbytes: int, stream: Any) -> Any:
        """Queue a copy of the leading ``nbytes`` of ``device`` into ``host`` on ``stream``."""
        ...

    def to_device(self, host: Any, device: Any, nbytes: int, stream: Any) -> Any:
        """Queue a copy of the leading ``nbytes`` of ``host`` into ``device`` on ``stream``."""
        ...

    def wait(self, token: Any) -> None:
        """Block until the copy of ``token`` has completed."""
        ...


class TorchCuda:
    """``DeviceOps`` over torch's CUDA runtime (torch imported by whoever made the tensor)."""

    def is_device(self, data: object) -> bool:
        tensor_type = _torch_tensor_type()
        if tensor_type is None or not isinstance(data, tensor_type):
            return False
        tensor: Any = data
        return bool(tensor.is_cuda)  # no ``torch.device`` object: on every transfer's path

    @staticmethod
    def _torch() -> Any:
        import torch

        return torch

    def staging(self, data: Any) -> Any:
        torch = self._torch()
        nbytes = int(data.element_size()) * int(data.numel())
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def stream(self, data: Any) -> Any:
        return self._torch().cuda.current_stream(data.device)

    def to_host(self, device: Any, host: Any, nbytes: int, stream: Any) -> Any:
        torch = self._torch()
        with torch.cuda.stream(stream):
            host[:nbytes].copy_(device.view(torch.uint8)[:nbytes], non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def to_device(self, host: Any, device: Any, nbytes: int, stream: Any) -> Any:
        torch = self._torch()
        with torch.cuda.stream(stream):
            device.view(torch.uint8)[:nbytes].copy_(host[:nbytes], non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def wait(self, token: Any) -> None:
        token.synchronize()


_ops: DeviceOps = TorchCuda()


def device_ops() -> DeviceOps:
    """The device operations in use."""
    return _ops


def set_device_ops(ops: DeviceOps | None) -> None:
    """Replace the device operations (tests: CPU tensors standing in); ``None`` restores
    ``TorchCuda``."""
    global _ops
    _ops = TorchCuda() if ops is None else ops


def _checked(data: Any) -> None:
    if data.dim() != 1 or not data.is_contiguous():
        raise ValueError(
            "RDMABuffer only supports 1d contiguous torch.Tensor or 1d c-contiguous memoryview. "
            f"Got: {type(data).__name__}"
        )


@dataclass(slots=True)
class LocalStage:
    """A device tensor of the process that transfers and its pinned staging tensor."""

    device: Any
    host: Any
    memory: LocalMemory

    def begin(self, kind: str, nbytes: int) -> tuple[Any, Any]:
        """At ``submit()``: the caller's stream, and for a write the queued device-to-host
        copy's token (``None`` for a read)."""
        stream = _ops.stream(self.device)
        if kind == "write":
            return stream, _ops.to_host(self.device, self.host, nbytes, stream)
        return stream, None

    async def before(self, token: Any) -> None:
        if token is not None:
            await asyncio.to_thread(_ops.wait, token)

    async def after_read(self, stream: Any, nbytes: int) -> None:
        await asyncio.to_thread(self._copy_back, stream, nbytes)

    def _copy_back(self, stream: Any, nbytes: int) -> None:
        _ops.wait(_ops.to_device(self.host, self.device, nbytes, stream))


def stage_local(data: Any) -> LocalStage:
    """A device tensor as local memory of a transfer: its staging tensor's bytes, with the
    device tensor's address (for ``RDMAAction``'s overlap check)."""
    _checked(data)
    host = _ops.staging(data)
    staged = local_memory(host)
    memory = LocalMemory(staged.view, int(data.data_ptr()), False, data)
    return LocalStage(data, host, memory)


@dataclass(frozen=True, slots=True)
class StageRef:
    """What a buffer's handle carries about the owner's staging: the owner's ``process``, its
    ``manager`` (actor reference, ``None`` before a manager was needed) and the stage's
    ``number``."""

    process: str
    manager: Any
    number: int


@dataclass(slots=True)
class _Owned:
    device: Any
    host: Any
    nbytes: int


_owned: dict[int, _Owned] = {}
_owned_lock = threading.Lock()
_numbers = itertools.count(1)


def _process_id() -> str:
    return f"{HOST}/{os.getpid()}"


def stage_owner(data: Any, *, manager: bool = True) -> tuple[Any, StageRef]:
    """Register a device tensor's staging in this process: the pinned host tensor (filled
    with the tensor's bytes now) that providers register, and its ``StageRef``."""
    _checked(data)
    host = _ops.staging(data)
    nbytes = int(data.element_size()) * int(data.numel())
    _ops.wait(_ops.to_host(data, host, nbytes, _ops.stream(data)))
    with _owned_lock:
        if len(_owned) >= MAX_STAGED:
            raise RuntimeError(f"at most {MAX_STAGED} RDMA buffers over device memory per process")
        number = next(_numbers)
        _owned[number] = _Owned(data, host, nbytes)
    return host, StageRef(_process_id(), _manager() if manager else None, number)


def _sync_here(number: int, direction: str, nbytes: int) -> None:
    with _owned_lock:
        owned = _owned.get(number)
    if owned is None:
        raise RuntimeError(f"RDMA buffer over device memory {number} was dropped")
    nbytes = max(0, min(nbytes, owned.nbytes))
    stream = _ops.stream(owned.device)
    if direction == "to_host":
        _ops.wait(_ops.to_host(owned.device, owned.host, nbytes, stream))
    elif direction == "to_device":
        _ops.wait(_ops.to_device(owned.host, owned.device, nbytes, stream))
    else:
        raise ValueError(f"unknown staging direction {direction!r}")


async def sync_owner(ref: StageRef, direction: str, nbytes: int) -> None:
    """Before a read (``"to_host"``) or after a write (``"to_device"``) of the leading
    ``nbytes`` of a buffer over device memory: the owner's process copies them between the
    tensor and its staging memory (only those: a short write leaves the rest of the tensor)."""
    try:
        if ref.process == _process_id() or ref.manager is None:
            await asyncio.to_thread(_sync_here, ref.number, direction, nbytes)
        else:
            await ref.manager.sync.call_one(ref.number, direction, nbytes)
    except ActorError as exc:
        raise RuntimeError(f"RDMA staging of a device buffer in its owner failed: {exc}") from exc


async def release(ref: StageRef) -> None:
    """Forget the owner's staging of ``ref`` (the buffer was dropped)."""
    if ref.process == _process_id() or ref.manager is None:
        _release_here(ref.number)
    else:
        try:
            await ref.manager.release.call_one(ref.number)
        except ActorError as exc:
            raise RuntimeError(f"RDMA drop of a device buffer's staging failed: {exc}") from exc


def _release_here(number: int) -> None:
    with _owned_lock:
        _owned.pop(number, None)


class StagingManager(Actor):
    """Copies between the device tensors of this process's buffers and their staging memory,
    for transfers of other processes. Not for direct use."""

    @endpoint
    def sync(self, number: int, direction: str, nbytes: int) -> None:
        _sync_here(number, direction, nbytes)

    @endpoint
    def release(self, number: int) -> None:
        _release_here(number)


_managers: list[Any] = []
_managers_lock = threading.Lock()


def _manager() -> Any:
    with _managers_lock:
        if _managers:
            return _managers[0]
        spawned = spawn_process_actor("rdma_staging_manager", StagingManager, "the staging manager")
        _managers.append(spawned)
        return spawned


def _forget_after_fork() -> None:
    global _owned_lock, _managers_lock
    _owned_lock = threading.Lock()
    _managers_lock = threading.Lock()
    _managers.clear()
    _owned.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
