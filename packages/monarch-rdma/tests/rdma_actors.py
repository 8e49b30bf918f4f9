"""Actor classes for the multi-process tests (imported by the worker processes by module name)."""

from __future__ import annotations

import ctypes
import importlib
import os
import threading
import time
from typing import Any

from monarch.actor import Actor, endpoint
from monarch.config import configured
from monarch.rdma import RDMAAction, RDMABuffer
from monarch.rdma.providers import shared_memory

_release = threading.Event()


class Holder(Actor):
    """Owns memory and an RDMABuffer over it."""

    def __init__(self) -> None:
        self.memory: Any = bytearray()
        self.buffer: RDMABuffer | None = None

    @endpoint
    def create(self, content: bytes) -> RDMABuffer:
        self.memory = bytearray(content)
        self.buffer = RDMABuffer(memoryview(self.memory))
        return self.buffer

    @endpoint
    def create_with(self, content: bytes, settings: dict[str, Any]) -> RDMABuffer:
        """A buffer registered under ``settings`` (``monarch.config`` keys) in this process."""
        self.memory = bytearray(content)
        with configured(**settings):
            self.buffer = RDMABuffer(memoryview(self.memory))
        return self.buffer

    @endpoint
    def create_shared(self, content: bytes, kind: str) -> RDMABuffer:
        """A buffer over memory the shm provider shares: a memfd memoryview or a CPU tensor
        (moved into shared memory on registration)."""
        if kind == "tensor":
            torch: Any = importlib.import_module("torch")
            tensor = torch.frombuffer(bytearray(content), dtype=torch.uint8)
            self.memory = tensor
            self.buffer = RDMABuffer(tensor)
            return self.buffer
        view = shared_memory(len(content))
        view[:] = content
        self.memory = view
        self.buffer = RDMABuffer(view)
        return self.buffer

    @endpoint
    def content(self) -> bytes:
        if hasattr(self.memory, "data_ptr"):  # a uint8 tensor (torch needs no numpy)
            return ctypes.string_at(self.memory.data_ptr(), self.memory.numel())
        return bytes(self.memory)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def spin(self, seconds: float) -> int:
        """Stay busy in Python (holding the GIL most of the time) for ``seconds``."""
        deadline = time.monotonic() + seconds
        rounds = 0
        while time.monotonic() < deadline and not _release.is_set():
            sum(range(1000))
            rounds += 1
        _release.clear()
        return rounds

    @endpoint
    def drop(self) -> None:
        assert self.buffer is not None
        self.buffer.drop().get(timeout=30)

    @endpoint
    def block(self, seconds: float) -> bool:
        """Keep this actor busy until released (or ``seconds`` passed): transfers must not
        need it."""
        released = _release.wait(seconds)
        _release.clear()
        return released

    @endpoint
    def die(self) -> None:
        os._exit(17)


class Releaser(Actor):
    @endpoint
    def release(self) -> None:
        _release.set()


class Peer(Actor):
    """Transfers through handles it is given."""

    @endpoint
    async def read(self, buffer: RDMABuffer, length: int) -> bytes:
        dst = bytearray(length)
        await buffer.read_into(memoryview(dst), timeout=30)
        return bytes(dst)

    @endpoint
    async def write(self, buffer: RDMABuffer, content: bytes) -> None:
        await buffer.write_from(memoryview(bytearray(content)), timeout=30)

    @endpoint
    async def read_after_drop(self, buffer: RDMABuffer) -> str:
        try:
            await buffer.read_into(memoryview(bytearray(buffer.size())), timeout=30)
        except RuntimeError as exc:
            return f"error: {exc}"
        return "read"

    @endpoint
    async def swap(self, first: RDMABuffer, second: RDMABuffer, size: int) -> tuple[bytes, bytes]:
        """One action reading both buffers, submitted twice, then one writing them crossed."""
        a, b = bytearray(size), bytearray(size)
        reads = RDMAAction().read_remote(memoryview(a), first).read_remote(memoryview(b), second)
        await reads.submit(timeout=30)
        a[:], b[:] = bytes(size), bytes(size)
        await reads.submit(timeout=30)  # resubmittable
        await (
            RDMAAction()
            .write_remote(first, memoryview(b))
            .write_remote(second, memoryview(a))
            .submit(timeout=30)
        )
        return bytes(a), bytes(b)

    @endpoint
    async def read_error(self, buffer: RDMABuffer) -> str:
        """The error a read ends with (or "read")."""
        try:
            await buffer.read_into(memoryview(bytearray(buffer.size())), timeout=30)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "read"

    @endpoint
    async def transport(self, buffer: RDMABuffer) -> tuple[str, str]:
        return buffer.transport, buffer.backend
