"""The ``net`` provider: one-sided transfers over data lanes served by threads of the owner's
process, or over actor messages to its RDMA managers.

Theory of operation. Registering memory puts a flat byte ``memoryview`` into this Python
process's region table under a random 63-bit number and a 128-bit secret and returns a
``RemoteKey`` whose detail (``NetDetail``) names the process's data-lane server (``_netlane``:
an abstract Unix socket and a TLS port, with its certificate's fingerprint) and its RDMA
*managers* (``RDMAManager`` actors spawned once per process on ``this_proc()``, from a
short-lived thread so that they belong to the process; a forked child forgets its parent's
server, managers and regions).

A transfer takes a *lane* (``lane_kind``): ``unix`` when both processes are on one host (same
boot id and network namespace), ``tls`` across hosts, ``messages`` when the transferring
process has ``force_quic`` set (every message on QUIC). ``MONARCH_RDMA_NET_LANE`` (``auto``,
``unix``, ``tls``, ``messages``; for tests and benchmarks) chooses one explicitly.

On a data lane the bytes move straight between the two memories (the owner's server thread
sends a slice of the registered memory, the reader receives into the destination; a write goes
the other way), chunked (``plan_lane_chunks``) over up to ``rdma_net_chunks_in_flight``
connections at once, each chunk blocking socket I/O in a thread of the transferring process. On
the message lane a chunk is one actor call to a manager (the bytes out of band in the message:
a direct lane's memfd slot within a host, TLS across hosts, or QUIC), at most
``rdma_max_chunk_size_mb`` and ``MAX_PIPELINE_CHUNK`` bytes, round-robin over
``rdma_tcp_fallback_parallelism`` managers. Either way the owner's user actors never run: lane
threads and manager actors serve.

Everything here uses monarch-actor's public API only (``Actor``, ``endpoint``, ``this_proc``),
and settings through ``_config`` (``monarch.config``'s one-key getter).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import secrets
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from monarch.actor import Actor, ActorError, endpoint
from monarch.rdma._config import setting
from monarch.rdma._host import HOST
from monarch.rdma._netlane import (
    MAX_IDLE,
    Endpoint,
    LanePool,
    LaneRequest,
    LaneServer,
    OwnerGone,
    Unreachable,
)
from monarch.rdma._netwire import SECRET_SIZE, Op
from monarch.rdma._owned import spawn_process_actor
from monarch.rdma._provider import ProviderSpec, RDMAProvider, Reach, RemoteKey

__all__ = [
    "LANE_CHUNK",
    "MAX_PIPELINE_CHUNK",
    "MAX_STREAMS",
    "MIN_CHUNK",
    "NAME",
    "NetDetail",
    "NetProvider",
    "SPEC",
    "RDMAManager",
    "lane_kind",
    "managers",
    "plan_chunks",
    "plan_lane_chunks",
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
_log = logging.getLogger("monarch.rdma.net")
#: The largest chunk of a data-lane transfer: no copy is made of it (it is a slice of the
#: source or destination), so a chunk is only the unit of load balancing over connections.
LANE_CHUNK: Final = 16 << 20
_LANES: Final = ("auto", "unix", "tls", "messages")


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


def plan_lane_chunks(total: int, max_chunk: int, window: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of the chunks of a ``total``-byte data-lane transfer: one chunk up
    to ``2 * MIN_CHUNK`` bytes (the latency case: one request, one reply); above, at least
    ``window`` chunks (so that ``window`` connections share the work) of at least ``MIN_CHUNK``
    bytes; every chunk at most ``max_chunk`` (``rdma_max_chunk_size_mb``) and ``LANE_CHUNK``
    bytes; none for ``total == 0``."""
    if total < 0 or max_chunk < 1 or window < 1:
        raise ValueError(f"bad chunk plan ({total=}, {max_chunk=}, {window=})")
    if total == 0:
        return []
    limit = min(max_chunk, LANE_CHUNK)
    if total <= min(2 * MIN_CHUNK, limit):
        return [(0, total)]
    size = min(limit, max(MIN_CHUNK, -(-total // window)))
    return [(offset, min(size, total - offset)) for offset in range(0, total, size)]


@dataclass(frozen=True, slots=True)
class NetDetail:
    """The ``net`` part of a ``RemoteKey``: the owner's ``managers`` (actor references, the
    message lane), its data-lane ``endpoint`` (``None`` where its server could not start), its
    ``host`` identity and the registration's ``secret``."""

    managers: tuple[Any, ...]
    endpoint: Endpoint | None
    host: str
    secret: bytes


@dataclass(slots=True)
class _Region:
    view: memoryview
    owner: str
    secret: bytes = b""


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


def _lookup(number: int, secret: bytes) -> memoryview | str:
    """The lane server's view of the region table: the memory, or why not."""
    with _regions_lock:
        region = _regions.get(number)
    if region is None or not hmac.compare_digest(region.secret, secret):
        return (
            f"RDMA region {number} is not registered in this process: the buffer was dropped, "
            "or its owner's process restarted"
        )
    return region.view


def _drop_region(number: int, secret: bytes) -> None:
    with _regions_lock:
        region = _regions.get(number)
        if region is not None and hmac.compare_digest(region.secret, secret):
            del _regions[number]


_server: LaneServer | None = None
_server_failed = False
_server_lock = threading.Lock()
_lanes = LanePool()


def _endpoint() -> Endpoint | None:
    """This process's data-lane server's endpoint (started on first use; ``None`` where it
    cannot start: transfers then take the message lane)."""
    global _server, _server_failed
    with _server_lock:
        if _server is None and not _server_failed:
            try:
                _server = LaneServer(_lookup, _drop_region)
            except (OSError, ImportError) as exc:
                _server_failed = True
                _log.warning("RDMA net: no data lanes in this process (%s); messages serve", exc)
        return None if _server is None else _server.endpoint


#: Owners whose TLS lane did not answer (a firewall, no common address family): the message
#: lane serves them (bounded: forgotten, and tried again, when full).
_unreachable: set[Endpoint] = set()
_MAX_UNREACHABLE: Final = 1024


def lane_kind(detail: NetDetail) -> str:
    """The lane a transfer through ``detail`` takes from this process (module docstring)."""
    chosen = os.environ.get("MONARCH_RDMA_NET_LANE", "auto").strip().lower() or "auto"
    if chosen not in _LANES:
        raise RuntimeError(f"MONARCH_RDMA_NET_LANE={chosen!r}: expected one of {_LANES}")
    if detail.endpoint is None or chosen == "messages":
        return "messages"
    if chosen in ("unix", "tls"):
        return chosen  # asked for explicitly: even under force_quic
    if setting("force_quic"):
        return "messages"
    if detail.host == HOST:
        return "unix"
    return "messages" if detail.endpoint in _unreachable else "tls"


def _lane_endpoint(kind: str, detail: NetDetail) -> Endpoint:
    """The owner's endpoint as this process dials it: the TLS lane asked for between processes
    of one host goes over loopback."""
    assert detail.endpoint is not None
    if kind == "tls" and detail.host == HOST:
        return dataclasses.replace(detail.endpoint, addresses=("127.0.0.1",))
    return detail.endpoint


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
    name = "rdma_manager" if index == 0 else f"rdma_manager_{index}"
    return spawn_process_actor(name, RDMAManager, "this process's RDMA manager")


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
    global _manager_lock, _regions_lock, _server, _server_failed, _server_lock, _lanes
    _manager_lock = threading.Lock()  # a fork while another thread held them left them held
    _regions_lock = threading.Lock()
    _server_lock = threading.Lock()
    _server, _server_failed = None, False  # its threads do not exist in the child
    _lanes = LanePool()  # nor its threads and connections
    _managers.clear()
    _regions.clear()
    _unreachable.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _settings() -> tuple[int, int]:
    max_chunk = max(1, int(setting("rdma_max_chunk_size_mb"))) * _MIB
    window = max(1, int(setting("rdma_net_chunks_in_flight")))
    return max_chunk, window


def _streams() -> int:
    """``rdma_tcp_fallback_parallelism``: managers a registration is served by."""
    return max(1, min(int(setting("rdma_tcp_fallback_parallelism")), MAX_STREAMS))


async def _bounded(jobs: list[Callable[[], Awaitable[None]]], window: int) -> None:
    """Run ``jobs`` with at most ``window`` outstanding; the first failure (or a cancellation:
    the transfer's timeout) cancels the rest and waits until they have stopped. One job (a
    data-lane transfer of up to two chunks' worth: 1 MiB) is awaited in place, without a task."""
    if len(jobs) == 1:
        await jobs[0]()
        return
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
        if pending:  # each stops its I/O first: nothing is written once the caller has the error
            await asyncio.wait(pending)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a cancelled chunk's outcome as seen (no "exception never retrieved" noise)."""
    if not task.cancelled():
        task.exception()


def _detail(key: RemoteKey) -> NetDetail:
    detail = key.detail
    if not isinstance(detail, NetDetail) or not detail.managers:
        raise RuntimeError(f"RDMA region {key.region}: not a {NAME} key ({detail!r})")
    return detail


def _managers_of(key: RemoteKey) -> tuple[Any, ...]:
    return _detail(key).managers


def _failed(what: str, key: RemoteKey, exc: BaseException) -> RuntimeError:
    return RuntimeError(f"RDMA {what} of region {key.region} ({NAME} provider) failed: {exc}")


class NetProvider:
    """The ``net`` provider (see the module docstring). Implements ``RDMAProvider``."""

    name = NAME

    def register(self, memory: memoryview, *, owner: str) -> RemoteKey:
        mgrs = managers(_streams())
        endpoint = _endpoint()
        secret = secrets.token_bytes(SECRET_SIZE)
        with _regions_lock:
            number = secrets.randbits(63)
            while number in _regions:
                number = secrets.randbits(63)
            _regions[number] = _Region(memory, owner, secret)
        return RemoteKey(NAME, number, memory.nbytes, NetDetail(mgrs, endpoint, HOST, secret))

    async def read(self, key: RemoteKey, offset: int, dst: memoryview) -> None:
        detail = _detail(key)
        kind = lane_kind(detail)
        if kind != "messages" and await self._on_lane(
            kind, "read", Op.READ, key, detail, offset, dst
        ):
            return
        max_chunk, window = _settings()
        mgrs = detail.managers
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
        detail = _detail(key)
        kind = lane_kind(detail)
        if kind != "messages" and await self._on_lane(
            kind, "write", Op.WRITE, key, detail, offset, src
        ):
            return
        max_chunk, window = _settings()
        mgrs = detail.managers
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

    async def _on_lane(
        self, kind: str, what: str, op: Op, key: RemoteKey, detail: NetDetail, offset: int,
        view: memoryview,
    ) -> bool:  # fmt: skip
        """A read or write over data lanes: its chunks on up to ``window`` connections. False
        when the owner's TLS lane does not answer (the caller then takes the message lane)."""
        endpoint = _lane_endpoint(kind, detail)
        max_chunk, window = _settings()

        def job(start: int, length: int) -> Callable[[], Awaitable[None]]:
            def run() -> Awaitable[None]:
                return _lanes.transfer(
                    kind, endpoint, op, key.region, detail.secret, offset + start,
                    view[start : start + length],
                )  # fmt: skip

            return run

        try:
            await _bounded(
                [job(s, n) for s, n in plan_lane_chunks(view.nbytes, max_chunk, window)], window
            )
        except Unreachable as exc:
            if len(_unreachable) >= _MAX_UNREACHABLE:
                _unreachable.clear()
            _unreachable.add(endpoint)
            _log.warning("RDMA net: %s; the message lane serves this owner from now on", exc)
            return False
        except OwnerGone as exc:
            raise RuntimeError(
                f"RDMA {what} of region {key.region} ({NAME} provider, {kind} lane) failed: the "
                f"owner's process has exited or cannot be reached ({exc})"
            ) from exc
        except RuntimeError as exc:
            raise _failed(what, key, exc) from exc
        return True

    async def transfer_many(
        self, ops: Sequence[tuple[str, RemoteKey, int, memoryview]]
    ) -> list[BaseException | None]:
        """Several transfers at once (an ``RDMAAction``'s operations that this provider serves:
        ``(kind, key, offset, memory)``), each one's outcome in order. On the data lanes their
        chunks are pipelined (``LanePool.pipeline``): per owner, lane and direction, over up
        to ``MAX_IDLE`` connections (as many as the pool keeps per owner and has threads: on a
        busy machine fewer connections got fewer time slices, and a 32-operation action over 4
        was slower than one request per connection) that take them from one queue, several in
        flight on each, so an action of many small operations pays no round trip per
        operation and a connection that falls behind leaves the rest to the others. The
        message lane serves its operations one by one (``read``/``write``), as does the message
        lane of an owner whose TLS lane does not answer."""
        outcomes: list[BaseException | None] = [None] * len(ops)
        max_chunk, window = _settings()
        groups: dict[tuple[str, Endpoint, Op], list[tuple[int, LaneRequest]]] = {}
        singles: list[int] = []
        for index, (kind, key, offset, view) in enumerate(ops):
            try:
                detail = _detail(key)
                lane = lane_kind(detail)
                if lane == "messages":
                    singles.append(index)
                    continue
                where = _lane_endpoint(lane, detail)
            except Exception as exc:  # an operation's own failure
                outcomes[index] = exc
                continue
            op = Op.READ if kind == "read" else Op.WRITE
            pieces = groups.setdefault((lane, where, op), [])
            for start, length in plan_lane_chunks(view.nbytes, max_chunk, window):
                request = LaneRequest(
                    op, key.region, detail.secret, offset + start, view[start : start + length]
                )
                pieces.append((index, request))

        async def pipelined(
            lane: str, where: Endpoint, pieces: list[tuple[int, LaneRequest]]
        ) -> None:
            results = await _lanes.pipeline(lane, where, [r for _, r in pieces], MAX_IDLE)
            fallback = set()
            for (index, _), result in zip(pieces, results, strict=True):
                if result is None or outcomes[index] is not None:
                    continue
                kind, key = ops[index][0], ops[index][1]
                if isinstance(result, Unreachable):
                    fallback.add(index)
                elif isinstance(result, OwnerGone):
                    outcomes[index] = RuntimeError(
                        f"RDMA {kind} of region {key.region} ({NAME} provider, {lane} lane) "
                        f"failed: the owner's process has exited or cannot be reached ({result})"
                    )
                else:
                    outcomes[index] = _failed(kind, key, RuntimeError(result))
            if fallback:  # its TLS lane does not answer: the message lane, from now on
                if len(_unreachable) >= _MAX_UNREACHABLE:
                    _unreachable.clear()
                _unreachable.add(where)
                _log.warning(
                    "RDMA net: the owner's TLS lane does not answer; the message lane serves "
                    "this owner from now on"
                )
                singles.extend(sorted(fallback - set(singles)))

        # return_exceptions: every pipeline has stopped before this returns or raises (a
        # cancellation, too, waits for them all)
        jobs = [pipelined(lane, where, pieces) for (lane, where, _op), pieces in groups.items()]
        for result in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
        if singles:
            for index in singles:  # a fallen-back operation is done anew: its chunks' outcomes
                outcomes[index] = None  # on the data lane (a refusal among them) are moot
            results = await asyncio.gather(
                *(self._one(*ops[index]) for index in singles), return_exceptions=True
            )
            for index, result in zip(singles, results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result
                    outcomes[index] = result
        return outcomes

    def _one(self, kind: str, key: RemoteKey, offset: int, view: memoryview) -> Awaitable[None]:
        return self.read(key, offset, view) if kind == "read" else self.write(key, offset, view)

    async def deregister(self, key: RemoteKey) -> None:
        detail = _detail(key)
        kind = lane_kind(detail)
        try:
            if kind != "messages":
                try:
                    await _lanes.transfer(
                        kind, _lane_endpoint(kind, detail), Op.DROP, key.region, detail.secret, 0,
                        memoryview(b""),
                    )  # fmt: skip
                    return
                except Unreachable:
                    pass  # the message lane below
            await detail.managers[0].drop.call_one(key.region)
        except (ActorError, RuntimeError) as exc:
            raise _failed("drop", key, exc) from exc


def _always() -> bool:
    return True


def _create() -> RDMAProvider:
    return NetProvider()


#: The ``net`` provider's record, as ``monarch.rdma._plugin`` offers it.
SPEC: Final = ProviderSpec(NAME, "tcp", Reach.ANY, 0, _always, _create)
