"""CPU tensors standing in for CUDA tensors (no GPU where the tests run), for
``test_staging.py``: ``StandIn`` is the ``DeviceOps`` of ``monarch.rdma._staging`` over CPU
tensors marked as device tensors, and ``StagedHolder`` owns such a tensor in a worker process
(imported there by module name)."""

from __future__ import annotations

from typing import Any

import torch

from monarch.actor import Actor, endpoint
from monarch.rdma import RDMABuffer, _staging


class StandIn:
    """``DeviceOps`` where the 'device' tensors are CPU tensors marked as such; every copy is
    logged with the stream it was queued on, and every wait with its token."""

    def __init__(self) -> None:
        self.devices: list[Any] = []
        self.current = "default"
        self.log: list[tuple[str, int, str]] = []

    def device(self, data: bytes) -> Any:
        tensor = torch.tensor(list(data), dtype=torch.uint8)
        self.devices.append(tensor)
        return tensor

    def is_device(self, data: object) -> bool:
        return any(data is tensor for tensor in self.devices)

    def staging(self, data: Any) -> Any:
        return torch.zeros(int(data.element_size()) * int(data.numel()), dtype=torch.uint8)

    def stream(self, data: Any) -> str:
        return self.current

    def to_host(self, device: Any, host: Any, nbytes: int, stream: str) -> Any:
        host[:nbytes].copy_(device.view(torch.uint8)[:nbytes])
        self.log.append(("to_host", nbytes, stream))
        return ("token", len(self.log))

    def to_device(self, host: Any, device: Any, nbytes: int, stream: str) -> Any:
        device.view(torch.uint8)[:nbytes].copy_(host[:nbytes])
        self.log.append(("to_device", nbytes, stream))
        return ("token", len(self.log))

    def wait(self, token: Any) -> None:
        self.log.append(("wait", token[1], ""))


class StagedHolder(Actor):
    """Owns a stand-in device tensor and an ``RDMABuffer`` over it, in its own process."""

    def __init__(self) -> None:
        self.ops = StandIn()
        _staging.set_device_ops(self.ops)
        self.tensor: Any = None
        self.buffer: RDMABuffer | None = None

    @endpoint
    def create(self, content: bytes) -> RDMABuffer:
        self.tensor = self.ops.device(content)
        self.buffer = RDMABuffer(self.tensor)
        return self.buffer

    @endpoint
    def set(self, content: bytes) -> None:
        self.tensor.copy_(torch.tensor(list(content), dtype=torch.uint8))

    @endpoint
    def content(self) -> bytes:
        return bytes(self.tensor.tolist())

    @endpoint
    def syncs(self) -> list[str]:
        """The copies between the tensor and its staging memory, in order."""
        return [entry[0] for entry in self.ops.log if entry[0] != "wait"]
