"""A scale node's side of persistent experiments: replicate the experiment tables along the
node tree, record the node, claim the work addressed to its PID and run it (issue 22).

``node_experiments(node, database, node_record)`` is an async context manager that a scale
process (the root or a worker) enters inside its running ``Node``: it opens the replica file
``database`` with the experiment tables (``chrysalis.node._experiment_store``), runs a
``chrysalis.sqlite.topology.ReplicationTopology`` on the node's links, records the node row
(a new incarnation if the PID was there before), then runs ``ExperimentRunner`` until the
block ends, when the node is marked ``stopped`` (its unfinished work fails with that reason).
With ``baselines`` (the default) each measured pair then gets its direct network baselines
(``node_baselines``: ``chrysalis.node._baselines``), stored with its result row.

``ExperimentRunner`` polls the ledger (on every replica change, and every
``poll_interval`` for writes by other connections), claims the first open work addressed to
the node, runs it (``warmup`` untimed operations to every destination, then ``start``, then
``count`` timed operations per destination with at most ``concurrency`` in flight, each
echo bounded by ``ECHO_TIMEOUT``, the whole by the experiment's ``timeout``) and publishes
one result row per destination: ``ok`` with latency percentiles and payload MiB/s, or
``failed`` with the first error and how many operations completed. A pair's MiB/s is its
payload bytes over its own busy time, the sum of its operations' times: the destinations of
a source share its ``concurrency`` slots, and a pair's wall-clock span also holds the time
it waited for a slot while the source served other destinations (with two destinations and
one slot, that span made each pair look about half as fast as its transfers were). The
row's ``seconds`` stays the pair's wall-clock span (the aggregate rate uses it). The operations:
``echo_once`` (kind ``echo``: ``[1][len][payload]`` on a fresh stream, the reply checked)
and ``transfer_once`` (kind ``stream-transfer``: ``[2]``, the payload in 64 KiB writes, FIN;
the destination answers the byte count). A claim that ends meanwhile (cancelled, or the node
declared lost) stops the run; its late results are refused by the ledger, never written
(and what the node wrote before it learnt of its loss yields to the loss's verdict:
``chrysalis.node._claims.LossVerdict``).

Imports chrysalis-sqlite: imported only where persistence is asked for (see
``_experiment_store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final

from chrysalis.core import Pid
from chrysalis.nameserver import Consistency
from chrysalis.node._baselines import (
    MAX_BASELINES_JSON,
    FrameReader,
    MethodResult,
    encode_baselines,
    frame,
    measure_baselines,
)
from chrysalis.node._claims import (
    TERMINAL,
    ClaimRecord,
    ClaimState,
    ExperimentSpec,
    LedgerError,
    NodeRecord,
    ResultRecord,
    StaleClaimError,
    Work,
)
from chrysalis.node._experiment_store import ExperimentStore, open_replica
from chrysalis.node._node import Node
from chrysalis.node._scale import (
    BASELINES_OP,
    DELIVERY_OP,
    POOLED_ECHO_OP,
    decode_echo_reply,
    encode_echo_request,
)
from chrysalis.sqlite.topology import ReplicationTopology

__all__ = [
    "BASELINE_TIMEOUT",
    "ECHO_TIMEOUT",
    "POLL_INTERVAL",
    "ExperimentRunner",
    "Operation",
    "echo_once",
    "node_baselines",
    "node_experiments",
    "pair_rate",
    "percentiles",
    "pooled_echo",
    "transfer_once",
]

_log = logging.getLogger("chrysalis.scale.experiments")

PROGRESS_EVERY: Final = 1.0
"""Seconds between two progress rows of one running source (``scale_progress``)."""
POLL_INTERVAL: Final = 0.25
"""Seconds between ledger polls when nothing woke the runner (the replica's poll period)."""

ECHO_TIMEOUT: Final = 10.0
"""Seconds one echo may take; a slower one fails its pair (so a dead destination cannot hold
a concurrency slot until the run's timeout)."""

BASELINE_TIMEOUT: Final = 60.0
"""Seconds each baseline method may take for one pair (its experiment's timeout if lower)."""

Baselines = Callable[[Pid, ExperimentSpec], Awaitable[str]]
"""Measures the direct baselines against ``pid`` for an experiment; their JSON."""

Operation = Callable[[Pid, int], Awaitable[None]]
"""One measured operation of ``size`` payload bytes with ``pid``; raises when it fails."""

_CHUNK: Final = 64 * 1024
_FILL: Final = b"\x2a" * _CHUNK


async def echo_once(node: Node, pid: Pid, size: int) -> None:
    """One scale echo on a fresh stream (``[1][len][payload]``, checked reply)."""
    payload = _FILL[:size] if size <= _CHUNK else b"\x2a" * size
    stream = await node.dial(pid, Consistency.CACHED)
    try:
        stream.write(encode_echo_request(payload))
        stream.write_eof()
        decode_echo_reply(await stream.read(-1), payload)
    finally:
        stream.close()


async def transfer_once(node: Node, pid: Pid, size: int) -> None:
    """One stream transfer: ``[2]``, ``size`` bytes in 64 KiB writes (each drained), FIN;
    the destination answers the count it received as u64 BE, which must be ``size``."""
    stream = await node.dial(pid, Consistency.CACHED)
    try:
        stream.write(bytes([DELIVERY_OP]))
        left = size
        while left:
            chunk = min(left, _CHUNK)
            stream.write(_FILL[:chunk])
            await stream.drain()
            left -= chunk
        stream.write_eof()
        answer = await stream.read_exactly(8)
        received = int.from_bytes(answer, "big")
        if received != size:
            raise ValueError(f"the destination received {received} of {size} bytes")
    finally:
        stream.close()


async def pooled_echo(node: Node, pid: Pid, size: int, count: int) -> MethodResult:
    """``count`` echoes of ``size`` bytes on one Chrysalis stream (``POOLED_ECHO_OP``), after
    one untimed echo on it."""
    payload = _FILL[:size] if size <= _CHUNK else b"\x2a" * size
    loop = asyncio.get_running_loop()
    stream = await node.dial(pid, Consistency.CACHED)
    reader = FrameReader()
    latencies: list[float] = []
    error = ""
    started = 0.0

    async def once() -> None:
        stream.write(frame(payload))
        await stream.drain()
        while True:
            chunk = await stream.read(_CHUNK)
            if not chunk:
                raise ConnectionError("the destination ended the pooled stream")
            frames = reader.feed(chunk)
            if frames:
                if frames != [payload] or reader.pending:
                    raise ValueError("the pooled echo differs")
                return

    try:
        stream.write(bytes([POOLED_ECHO_OP]))
        await asyncio.wait_for(once(), ECHO_TIMEOUT)
        started = loop.time()
        for _ in range(count):
            t0 = loop.time()
            await asyncio.wait_for(once(), ECHO_TIMEOUT)
            latencies.append(loop.time() - t0)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        stream.close()
    seconds = loop.time() - started if started else 0.0
    return MethodResult.measured(latencies, seconds, 2 * size * len(latencies), error)


async def node_baselines(node: Node, pid: Pid, spec: ExperimentSpec) -> str:
    """The baselines JSON for one pair: asks ``pid`` for its baseline servers' addresses over
    Chrysalis (``BASELINES_OP``), then measures each method (``measure_baselines``), with
    the Chrysalis pooled-stream echo for an echo experiment."""
    stream = await node.dial(pid, Consistency.CACHED)
    try:
        stream.write(bytes([BASELINES_OP]))
        stream.write_eof()
        answer = b""
        while chunk := await asyncio.wait_for(stream.read(MAX_BASELINES_JSON), ECHO_TIMEOUT):
            answer += chunk
            if len(answer) > MAX_BASELINES_JSON:
                raise ValueError("the destination's baseline addresses are too long")
    finally:
        stream.close()
    raw = json.loads(answer or b"{}")
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise ValueError(f"the destination answered {answer[:80]!r} for its baselines")

    async def pooled(size: int, count: int) -> MethodResult:
        return await pooled_echo(node, pid, size, count)

    found = await measure_baselines(
        raw,
        spec.kind,
        spec.payload,
        spec.count,
        pooled=pooled,
        timeout=min(spec.timeout, BASELINE_TIMEOUT),
        datagram_size=node.quic_config.max_udp_payload,
    )
    return encode_baselines(found)


def pair_rate(latencies: Sequence[float], payload: int, kind: str) -> float:
    """A pair's payload MiB/s over its busy time: the bytes its completed operations moved
    (both directions for an echo) over the sum of their times (0 for none)."""
    busy = sum(latencies)
    moved = len(latencies) * payload * (2 if kind == "echo" else 1)
    return moved / (1024 * 1024) / busy if busy > 0 else 0.0


def percentiles(seconds: Sequence[float]) -> tuple[float, float, float, float, float]:
    """Nearest-rank p50, p90, p99, mean and max in milliseconds (zeros for none)."""
    if not seconds:
        return (0.0, 0.0, 0.0, 0.0, 0.0)
    ordered = sorted(s * 1000 for s in seconds)

    def rank(fraction: float) -> float:
        return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]

    return (rank(0.5), rank(0.9), rank(0.99), sum(ordered) / len(ordered), ordered[-1])


@dataclass(slots=True)
class _Progress:
    latencies: list[float] = field(default_factory=list)
    error: str = ""
    started: float = 0.0
    seconds: float = 0.0
    baselines: str = ""


@final
class ExperimentRunner:
    """Claims and runs this node's work, one experiment at a time (see the module doc)."""

    __slots__ = (
        "_baselines", "_clock", "_operations", "_pid", "_poll_interval", "_store", "_wake", "runs",
    )  # fmt: skip

    def __init__(
        self,
        store: ExperimentStore,
        pid: str,
        operations: Mapping[str, Operation],
        *,
        poll_interval: float = POLL_INTERVAL,
        clock: Callable[[], float] = time.time,
        baselines: Baselines | None = None,
    ) -> None:
        self._store = store
        self._baselines = baselines
        self._pid = pid
        self._operations = dict(operations)
        self._poll_interval = poll_interval
        self._clock = clock
        self._wake = asyncio.Event()
        self.runs = 0
        """Experiments this runner finished (results written)."""

    def wake(self) -> None:
        """Look at the ledger now (a replica change listener)."""
        self._wake.set()

    async def run(self) -> None:
        """Poll, claim and run until cancelled."""
        while True:
            self._wake.clear()
            try:
                work = None
                if self._store.has_open_work(self._pid):
                    work = self._store.decide(
                        lambda ledger: ledger.next_work(self._pid, self._clock())
                    )
            except LedgerError as exc:  # e.g. declared lost: nothing is addressed to us now
                _log.warning("cannot claim work: %s", exc)
                work = None
            if work is not None:
                try:
                    if work.claim.state is ClaimState.RUNNING:  # this incarnation broke off
                        raise RuntimeError("an earlier run of this claim broke off")
                    await self._run(work)
                except Exception as exc:  # never leave a claim open behind us
                    _log.warning("experiment %s failed: %s", work.experiment.name, exc)
                    self._give_up(work.claim, f"{type(exc).__name__}: {exc}")
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_interval)

    async def _bounded(self, op: Operation, pid: Pid, size: int, limit: float) -> None:
        try:
            await asyncio.wait_for(op(pid, size), limit)
        except TimeoutError:
            raise TimeoutError(f"no answer within {limit:g} s") from None

    def _give_up(self, claim: ClaimRecord, error: str) -> None:
        with contextlib.suppress(LedgerError):
            self._store.apply(lambda ledger: ledger.fail(claim, error, self._clock()))

    def _still_mine(self, claim: ClaimRecord) -> bool:
        ledger = self._store.ledger()
        current = ledger.claims.get((claim.experiment, claim.source))
        experiment = ledger.experiments.get(claim.experiment)
        return (
            current is not None
            and experiment is not None
            and not experiment.cancelled
            and current.state not in TERMINAL
            and (current.incarnation, current.attempt) == (claim.incarnation, claim.attempt)
        )

    async def _run(self, work: Work) -> None:
        spec = work.experiment.spec
        claim = work.claim
        op = self._operations.get(spec.kind)
        if op is None:
            raise LedgerError(f"this node does not run {spec.kind!r} experiments")
        # an echo is bounded by ECHO_TIMEOUT; a transfer (any size) only by the run's timeout
        limit = min(ECHO_TIMEOUT, spec.timeout) if spec.kind == "echo" else spec.timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.timeout
        progress = {pid: _Progress() for pid in work.destinations}
        slots = asyncio.Semaphore(spec.concurrency)

        async def warm(pid: str) -> None:
            try:
                for _ in range(spec.warmup):
                    async with slots:
                        await self._bounded(op, Pid.parse(pid), spec.payload, limit)
            except Exception as exc:
                progress[pid].error = f"warm-up: {exc or type(exc).__name__}"

        async def measure(pid: str) -> None:
            record = progress[pid]
            if record.error:
                return
            target = Pid.parse(pid)
            record.started = loop.time()
            try:
                for _ in range(spec.count):
                    async with slots:
                        t0 = loop.time()
                        await self._bounded(op, target, spec.payload, limit)
                        record.latencies.append(loop.time() - t0)
            except Exception as exc:
                record.error = str(exc) or type(exc).__name__
            finally:
                record.seconds = loop.time() - record.started

        def operations_done() -> int:
            return sum(len(record.latencies) for record in progress.values())

        async def phase(make: Callable[[str], Awaitable[None]]) -> bool:
            """Run ``make`` for every destination until all end or the deadline passes;
            ``False`` if the claim stopped being ours meanwhile."""
            if not work.destinations:
                return True
            tasks = [asyncio.ensure_future(make(pid)) for pid in work.destinations]
            remaining = max(0.0, deadline - loop.time())
            everything = asyncio.ensure_future(asyncio.wait(tasks, timeout=remaining))
            planned = spec.count * len(work.destinations) if make is measure else 0
            watcher = asyncio.ensure_future(self._watch(claim, operations_done, planned))
            try:
                await asyncio.wait([everything, watcher], return_when=asyncio.FIRST_COMPLETED)
                ours = everything.done()
            finally:
                for task in [*tasks, everything, watcher]:
                    task.cancel()
                await asyncio.gather(*tasks, everything, watcher, return_exceptions=True)
            for pid, task in zip(work.destinations, tasks, strict=True):
                if task.cancelled() and not progress[pid].error:
                    progress[pid].error = f"timed out after {spec.timeout:g} s"
            return ours

        try:
            if not await phase(warm):
                return
            self._store.apply(lambda ledger: ledger.start(claim, self._clock()))
            if not await phase(measure):
                return
            if not await self._measure_baselines(work, progress):
                return
            results = [self._result(spec, pid, progress[pid]) for pid in work.destinations]
            self._store.apply(lambda ledger: ledger.finish(claim, results, self._clock()))
            self.runs += 1
        except StaleClaimError as exc:  # cancelled or declared lost meanwhile
            _log.info("experiment %s ended elsewhere: %s", spec.name, exc)

    async def _measure_baselines(self, work: Work, progress: Mapping[str, _Progress]) -> bool:
        """After the Chrysalis figures, each measured pair's direct baselines, one pair at a
        time (so they do not load each other); ``False`` if the claim ended meanwhile. A
        pair whose baselines fail keeps its Chrysalis result, without baselines. None for an
        experiment submitted without them (``ExperimentSpec.baselines``)."""
        if self._baselines is None or not work.experiment.spec.baselines:
            return True
        for pid in work.destinations:
            record = progress[pid]
            if record.error or not record.latencies:
                continue
            if not self._still_mine(work.claim):
                return False
            try:
                record.baselines = await self._baselines(Pid.parse(pid), work.experiment.spec)
            except Exception as exc:
                _log.warning("baselines against %s failed: %s", pid[:8], exc)
        return True

    def _result(self, spec: ExperimentSpec, pid: str, record: _Progress) -> ResultRecord:
        p50, p90, p99, mean, worst = percentiles(record.latencies)
        completed = len(record.latencies)
        rate = pair_rate(record.latencies, spec.payload, spec.kind)
        return ResultRecord(
            spec.name,
            self._pid,
            pid,
            "failed" if record.error else "ok",
            spec.count,
            completed,
            record.seconds,
            p50_ms=p50,
            p90_ms=p90,
            p99_ms=p99,
            mean_ms=mean,
            max_ms=worst,
            mib_per_second=rate,
            error=record.error,
            baselines=record.baselines,
        )

    async def _watch(self, claim: ClaimRecord, done: Callable[[], int], planned: int) -> None:
        """Returns once the claim is no longer this run's (cancelled, lost, taken over);
        meanwhile publishes ``done()`` timed operations when it changed, at most every
        ``PROGRESS_EVERY`` seconds (``ExperimentStore.publish_progress``)."""
        published, at = -1, -math.inf
        loop = asyncio.get_running_loop()
        while self._still_mine(claim):
            now = loop.time()
            if planned and done() != published and now - at >= PROGRESS_EVERY:
                published, at = done(), now
                with contextlib.suppress(Exception):  # informational: never fails a run
                    self._store.publish_progress(
                        claim.experiment, claim.source, published, planned, self._clock()
                    )
            await asyncio.sleep(self._poll_interval)


@contextlib.asynccontextmanager
async def node_experiments(
    node: Node,
    database: Path | str,
    record: NodeRecord,
    *,
    poll_interval: float = POLL_INTERVAL,
    operations: Mapping[str, Operation] | None = None,
    baselines: bool = True,
) -> AsyncIterator[ExperimentStore]:
    """Replicate, register and run experiments on ``node`` while the block runs (see the
    module docstring). ``record`` is this node's row (its ``incarnation`` is decided by the
    ledger). Enter it inside ``async with node`` and before children join."""
    replica = open_replica(str(database))
    try:
        topology = ReplicationTopology(node, replica, poll_interval=poll_interval)
        store = ExperimentStore(replica)
        pid = node.pid.hex()

        async def echo(target: Pid, size: int) -> None:
            await echo_once(node, target, size)

        async def transfer(target: Pid, size: int) -> None:
            await transfer_once(node, target, size)

        if operations is None:
            operations = {"echo": echo, "stream-transfer": transfer}

        async def measure(target: Pid, spec: ExperimentSpec) -> str:
            return await node_baselines(node, target, spec)

        runner = ExperimentRunner(
            store,
            pid,
            operations,
            poll_interval=poll_interval,
            baselines=measure if baselines else None,
        )
        async with topology:
            store.apply(lambda ledger: ledger.register(record, time.time()))
            remove = replica.add_change_listener(runner.wake)
            task = asyncio.create_task(runner.run())
            try:
                yield store
            finally:
                remove()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                with contextlib.suppress(LedgerError):
                    store.apply(lambda ledger: ledger.node_stopped(pid, time.time()))
    finally:
        replica.close()
