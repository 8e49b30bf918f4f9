"""The ``net`` provider: one-sided transfers served by a per-process RDMA manager actor.

Theory of operation. Registering memory puts a flat byte ``memoryview`` into this Python
process's region table under a random 63-bit number and returns a ``RemoteKey`` that carries
that number and the process's *manager*: an ``RDMAManager`` actor spawned once per process on
``this_proc()`` (from a short-lived thread, so that it belongs to the process and not to the
actor that happened to register first; a forked child forgets its parent's manager and
regions). The manager runs on its own actor thread, so the owner's user actors never take part
in a transfer: they may be busy or blocked meanwhile.

A registration is served by ``rdma_tcp_fallback_parallelism`` managers of its process (each an
actor of its own, so each its own thread; the key names them all). A transfer is cut into chunks
(``plan_chunks``, pure) of at most ``rdma_max_chunk_size_mb`` MiB, sent to the managers
round-robin, and at most ``rdma_net_chunks_in_flight`` of them (at least one per manager) are
outstanding at once: a read asks the
manager for ``(region, offset, length)`` and copies the answer into the destination; a write
sends ``(region, offset, bytes)``. The bytes travel out of band in the actor messages (direct
lanes: shared memory within a host, TLS over TCP across hosts; or QUIC), copied once on each
side. Memory in flight is bounded by window x chunk on both sides.

Everything here uses monarch-actor's public API only (``Actor``, ``endpoint``, ``this_proc``),
and settings through ``_config`` (``monarch.config``'s one-key getter).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from monarch.actor import Actor, ActorError, endpoint, this_proc
from monarch.rdma._config import setting
from monarch.rdma._provider import ProviderSpec, RDMAProvider, Reach, RemoteKey

__all__ = [
    "MAX_PIPELINE_CHUNK",
    "MAX_STREAMS",
    "MIN_CHUNK",
    "NAME",
    "NetProvider",
    "SPEC",
    "RDMAManager",
    "managers",
    "plan_chunks",
]

NAME: Final = "net"
#: The smallest chunk a transfer is cut into (unless the transfer itself is smaller).
MIN_CHUNK: Final = 1 << 20
#: The largest chunk a transfer is cut into even where ``rdma_max_chunk_size_mb`` allows more:
#: a window of such chunks stays well within a direct lane's shared-memory slots (64 MiB per
#: lane), whose slots are then reused warm. Measured on the 2-core box, 64 MiB transfers
#: between two processes: 16 MiB chunks (4 in flight) 0.17-0.29 GB/s, 4 MiB chunks 0.55-1.2.
MAX_PIPELINE_CHUNK: Final = 4 << 20
_MIB: Final = 1 << 20


def plan_chunks(total: int, max_chunk: int, window: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the chunks of a ``total``-byte transfer: at least as many as the
    ``window`` of chunks in flight so that they overlap, each at least ``MIN_CHUNK`` and at
    most ``max_chunk`` and ``MAX_PIPELINE_CHUNK`` bytes (the last one may be shorter); none for
    ``total == 0``."""
    if total < 0 or max_chunk < 1 or window < 1:
        raise ValueError(f"bad chunk plan ({total=}, {max_chunk=}, {window=})")
    if total == 0:
        return []
    size = min(max_chunk, MAX_PIPELINE_CHUNK, max(MIN_CHUNK, -(-total // window)))
    return [(offset, min(size, total - offset)) for offset in range(0, total, size)]


@dataclass(slots=True)
class _Region:
    view: memoryview
    owner: str


_regions: dict[int, _Region] = {}
_regions_lock = threading.Lock()


def _region(number: int) -> _Region:
    with _regions_lock:
        region = _regions.get(number)
    if region is None:
        raise RuntimeError(
            f"RDMA region {number} is not registered in this process: the buffer was dropped, "
            "or its owner's process restarted"
        )
    return region


def _check_range(region: _Region, number: int, offset: int, length: int) -> None:
    if offset < 0 or length < 0 or offset + length > region.view.nbytes:
        raise RuntimeError(
            f"RDMA region {number}: bytes [{offset}, {offset + length}) are outside its "
            f"{region.view.nbytes} bytes"
        )


class RDMAManager(Actor):
    """One of the per-process RDMA managers: serves reads, writes and drops of the regions
    registered in its process. Not for direct use."""

    def __init__(self) -> None:
        self._served = 0

    @endpoint
    def served(self) -> int:
        """How many chunks this manager served (reads and writes; for tests and statistics)."""
        return self._served

    @endpoint
    def read(self, number: int, offset: int, length: int) -> memoryview:
        self._served += 1
        region = _region(number)
        _check_range(region, number, offset, length)
        return region.view[offset : offset + length]  # copied once, out of band, on sending

    @endpoint
    def write(self, number: int, offset: int, data: Any) -> None:
        self._served += 1
        region = _region(number)
        incoming = memoryview(data).cast("B")
        _check_range(region, number, offset, incoming.nbytes)
        if region.view.readonly:
            raise RuntimeError(f"RDMA region {number} is read-only memory: it cannot be written")
        region.view[offset : offset + incoming.nbytes] = incoming

    @endpoint
    def drop(self, number: int) -> None:
        with _regions_lock:
            _regions.pop(number, None)


_managers: list[Any] = []
_manager_lock = threading.Lock()
#: The most managers (parallel streams) a process spawns, whatever the setting.
MAX_STREAMS: Final = 16


def _spawn_manager(index: int) -> Any:
    """Spawn one of this process's managers from a thread that runs no actor, so the process
    (not the actor registering first) owns it and it outlives that actor."""
    result: list[Any] = []
    failure: list[BaseException] = []
    name = "rdma_manager" if index == 0 else f"rdma_manager_{index}"

    def spawn() -> None:
        try:
            result.append(this_proc().spawn(name, RDMAManager))
        except BaseException as exc:  # reported to the caller below
            failure.append(exc)

    thread = threading.Thread(target=spawn, name="monarch-rdma-manager-spawn", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise RuntimeError(f"cannot start this process's RDMA manager: {failure[0]!r}") from (
            failure[0]
        )
    return result[0]


def managers(count: int = 1) -> tuple[Any, ...]:
    """This process's first ``count`` RDMA managers (spawned on first use; at most
    ``MAX_STREAMS``): each serves on its own actor thread, one stream of chunks."""
    count = max(1, min(count, MAX_STREAMS))
    with _manager_lock:
        while len(_managers) < count:
            _managers.append(_spawn_manager(len(_managers)))
        return tuple(_managers[:count])


def manager() -> Any:
    """This process's first RDMA manager (spawned on first use)."""
    return managers(1)[0]


def _forget_after_fork() -> None:
    """A forked child (monarch's zygote forks workers from a copy of the client) has its own
    memory and must spawn its own manager: it drops the parent's manager and regions."""
    global _manager_lock, _regions_lock
    _manager_lock = threading.Lock()  # a fork while another thread held them left them held
    _regions_lock = threading.Lock()
    _managers.clear()
    _regions.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _settings() -> tuple[int, int]:
    max_chunk = max(1, int(setting("rdma_max_chunk_size_mb"))) * _MIB
    window = max(1, int(setting("rdma_net_chunks_in_flight")))
    return max_chunk, window


def _streams() -> int:
    """``rdma_tcp_fallback_parallelism``: managers a registration is served by."""
    return max(1, min(int(setting("rdma_tcp_fallback_parallelism")), MAX_STREAMS))


async def _bounded(jobs: list[Callable[[], Awaitable[None]]], window: int) -> None:
    """Run ``jobs`` with at most ``window`` outstanding; the first failure cancels the rest."""
    pending: set[asyncio.Task[None]] = set()
    queue = iter(jobs)
    try:
        while True:
            while len(pending) < window:
                job = next(queue, None)
                if job is None:
                    break
                pending.add(asyncio.ensure_future(job()))
            if not pending:
                return
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            errors = [exc for exc in (task.exception() for task in done) if exc is not None]
            if errors:
                raise errors[0]
    finally:
        for task in pending:
            task.cancel()
            task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a cancelled chunk's outcome as seen (no "exception never retrieved" noise)."""
    if not task.cancelled():
        task.exception()


def _managers_of(key: RemoteKey) -> tuple[Any, ...]:
    detail = key.detail
    mgrs = tuple(detail) if isinstance(detail, tuple | list) else (detail,)
    if not mgrs:
        raise RuntimeError(f"RDMA region {key.region}: its key names no manager")
    return mgrs


def _failed(what: str, key: RemoteKey, exc: BaseException) -> RuntimeError:
    return RuntimeError(f"RDMA {what} of region {key.region} ({NAME} provider) failed: {exc}")


class NetProvider:
    """The ``net`` provider (see the module docstring). Implements ``RDMAProvider``."""

    name = NAME

    def register(self, memory: memoryview, *, owner: str) -> RemoteKey:
        mgrs = managers(_streams())
        with _regions_lock:
            number = secrets.randbits(63)
            while number in _regions:
                number = secrets.randbits(63)
            _regions[number] = _Region(memory, owner)
        return RemoteKey(NAME, number, memory.nbytes, mgrs)

    async def read(self, key: RemoteKey, offset: int, dst: memoryview) -> None:
        max_chunk, window = _settings()
        mgrs = _managers_of(key)
        window = max(window, len(mgrs))

        def job(index: int, start: int, length: int) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                mgr = mgrs[index % len(mgrs)]
                data = await mgr.read.call_one(key.region, offset + start, length)
                got = memoryview(data).cast("B")
                if got.nbytes != length:
                    raise RuntimeError(f"asked for {length} bytes, got {got.nbytes}")
                dst[start : start + length] = got

            return run

        try:
            await _bounded(
                [
                    job(i, s, n)
                    for i, (s, n) in enumerate(plan_chunks(dst.nbytes, max_chunk, window))
                ],
                window,
            )
        except (ActorError, RuntimeError) as exc:
            raise _failed("read", key, exc) from exc

    async def write(self, key: RemoteKey, offset: int, src: memoryview) -> None:
        max_chunk, window = _settings()
        mgrs = _managers_of(key)
        window = max(window, len(mgrs))

        def job(index: int, start: int, length: int) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                mgr = mgrs[index % len(mgrs)]
                await mgr.write.call_one(key.region, offset + start, src[start : start + length])

            return run

        try:
            await _bounded(
                [
                    job(i, s, n)
                    for i, (s, n) in enumerate(plan_chunks(src.nbytes, max_chunk, window))
                ],
                window,
            )
        except (ActorError, RuntimeError) as exc:
            raise _failed("write", key, exc) from exc

    async def deregister(self, key: RemoteKey) -> None:
        try:
            await _managers_of(key)[0].drop.call_one(key.region)
        except (ActorError, RuntimeError) as exc:
            raise _failed("drop", key, exc) from exc


def _always() -> bool:
    return True


def _create() -> RDMAProvider:
    return NetProvider()


#: The ``net`` provider's record, as ``monarch.rdma._plugin`` offers it.
SPEC: Final = ProviderSpec(NAME, "tcp", Reach.ANY, 0, _always, _create)
