"""The scale tool (upper spec 7.1-7.3): launch many Chrysalis processes, measure how long the
root takes to resolve all of them and how fast a fresh stream echoes through the tree.

Why a separate tool: the process tests prove that a handful of nodes form a tree; only a run
with many processes shows what joining costs when dozens of children publish at once and the
root's namespace grows entry by entry. ``python -m chrysalis.node._scale run --nodes N`` is the
whole experiment on one host:

placement (``plan_placement``, pure): ``flat`` puts every worker under the root; the
default ``task-head`` groups ranks into tasks of ``nodes_per_task``; each task's first rank is
a *head* (UDP plus a Unix socket ``task-<t>/head.sock``), task 0's head is the root itself,
other heads join the root over UDP, and the remaining ranks of a task are *leaves* bound to a
Unix socket only, joined to their head's ``head.sock`` and pinned to the head's PID (with
``flat``, every worker is a leaf of the root's ``task-0/head.sock``).

launch: the supervisor (this process) is rank 0, the root. By default (``start="fork"``) it
first forks a fork server (``chrysalis.node._forkserver``), which loads the CA, issues one
identity to initialise the crypto libraries and then forks every worker: a worker starts with
every module imported, so its start-up is protocol work (issue 22 item 4). ``start="exec"``
runs ``python -m chrysalis.node._scale worker ...`` instead, a fresh interpreter per worker
(for comparison). At most ``launch_concurrency`` workers start at once (heads first, then
leaves); a worker is *ready* when it printed its join token, which it does after its parent
acknowledged its snapshot. Every worker keeps its stdin open as a lifeline: when the
supervisor exits for any reason the pipe closes and the worker shuts down, so a run never
leaves processes behind; forked workers also die with the fork server, and it with the
supervisor (``PR_SET_PDEATHSIG``), so even ``kill -9`` of the supervisor leaves none.
``ProcessGroup.stop`` also terminates, then kills. A worker that exits before the tree
converged fails the run at once, naming it and its exit status.

convergence (spec 7.3): the root waits on nameserver revision changes until its directory
holds ``nodes`` entries, then confirms with a ``CACHED`` enumeration and resolves every
worker's PID. ``join_seconds`` runs from just before the root node starts.

echo: for every worker, one fresh stream per round (``dial`` with ``CACHED``), the request
``[op u8 = 1][len u32 BE][payload]`` then FIN; the worker answers ``[len][payload]`` then FIN.
The first round also sets up the QUIC connection to each worker (``first_echo``); later rounds
open a fresh stream on the pooled connection (``echo``). Any other first byte makes the worker
echo the raw stream, so ``chrysalis ping`` works against scale workers too (its payload starts
with ``_cli.PING_TAG``, 0, which is no op).

Output: ``[root] RESULT {json}`` on stdout (``ScaleResult.to_json``), progress on stderr.

persistent mode (``run --persist``, ``serve_persistent``; issue 22): the same launch, then
no sweep: every process (root included) keeps a replicated experiment database
(``chrysalis.node._experiments.node_experiments``, imported only in this mode since it needs
chrysalis-sqlite), records its node row, and claims and runs the experiments that
``chrysalis admin`` submits; the root prints ``[root] READY {json}`` with every rank's token
once every node row reached it, declares exited workers and nodes out of view lost (and
records a lost node back in view live again), and serves until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import json
import math
import os
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TextIO, final

from chrysalis.core import DatagramAddr, Pid
from chrysalis.datagram import DatagramSocket, DatagramSocketSet, UdpSocket
from chrysalis.nameserver import Consistency, Found, Labels
from chrysalis.node._address import format_address
from chrysalis.node._claims import LedgerError, Liveness, NodeRecord
from chrysalis.node._echo import echo_raw, serve_streams
from chrysalis.node._forkserver import ForkedProcess, ForkServer, ForkServerError
from chrysalis.node._node import JoinSettings, Node, bind_carrier
from chrysalis.node._scale_quic import scale_quic_config
from chrysalis.quic import ByteStream, DevelopmentCA, DevelopmentIdentityProvider, Identity

__all__ = [
    "BASELINES_OP",
    "DELIVERY_OP",
    "ECHO_OP",
    "POOLED_ECHO_OP",
    "MAX_ECHO_PAYLOAD",
    "MAX_NODES",
    "LatencySummary",
    "Placement",
    "ProcessGroup",
    "RESTART_BACKOFF_MAX",
    "RestartPolicy",
    "ScaleError",
    "ScaleResult",
    "ScaleSettings",
    "StartMode",
    "decode_echo_reply",
    "encode_echo_request",
    "main",
    "plan_placement",
    "run_scale",
    "serve_persistent",
    "process_cpu_ms",
    "summarize_latencies",
    "tree_cpu",
    "worker_memory",
]

DELIVERY_OP: Final = 2
"""First byte of a stream transfer: the payload follows until FIN; the worker answers the
byte count it received as u64 BE (spec 7.4's delivery op)."""
ECHO_OP: Final = 1
"""First byte of a scale echo request; any other first byte asks for a raw echo."""
BASELINES_OP: Final = 3
"""A stream holding only this byte asks for the node's baseline servers' addresses (JSON,
``chrysalis.node._baselines``; ``{}`` where it runs none)."""
POOLED_ECHO_OP: Final = 4
"""First byte of a pooled echo stream: ``[len u32 BE][payload]`` frames until FIN, each
answered with the same frame (echo on one stream against a fresh stream per echo)."""
MAX_ECHO_PAYLOAD: Final = 1024 * 1024
"""Largest echo payload a worker accepts (a longer announced length ends the stream)."""
MAX_NODES: Final = 4096
"""Most processes one run may launch on one host."""
_HEADER: Final = struct.Struct(">BI")
_LENGTH: Final = struct.Struct(">I")
_COUNT: Final = struct.Struct(">Q")
_STOP_GRACE: Final = 5.0
_TRANSFER_CHUNK: Final = 256 * 1024
_LINE_LIMIT: Final = 4096
_MODULE: Final = "chrysalis.node._scale"
_FORK_TARGET: Final = f"{__name__}:main"
"""What a forked worker runs: this very module object (``__main__`` under ``python -m``),
whose caches the fork server warmed; importing ``chrysalis.node._scale`` anew there would
run the module again (about 20 ms of CPU per worker) with cold caches."""
_STARTED_AT: Final = time.time()
"""When this process started (close enough: when this module was imported)."""
_REAP_INTERVAL: Final = 0.5
MAX_RESTARTS: Final = 1000
"""Most restarts ``--restart`` may allow per worker."""
RESTART_BACKOFF_MAX: Final = 30.0
"""Longest wait before restarting a worker (the back-off doubles up to it)."""
_MAX_IDENTITY_FILE: Final = 64 * 1024

Topology = Literal["flat", "task-head"]
StartMode = Literal["fork", "exec"]
Role = Literal["root", "head", "leaf"]


class ScaleError(Exception):
    """A scale run failed: a worker exited or stayed silent, convergence or an echo timed out,
    or an echo came back wrong. ``str`` says which (with the worker's stderr tail)."""


# -- placement (pure) ---------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Placement:
    """Where one rank runs: its ``task``, its ``role`` and tree ``level``, and the rank of its
    parent (``None`` for the root)."""

    rank: int
    task: int
    role: Role
    level: int
    parent: int | None


def plan_placement(nodes: int, nodes_per_task: int, topology: Topology) -> tuple[Placement, ...]:
    """The placement of ranks ``0 .. nodes - 1`` (spec 7.2).

    ``flat``: rank 0 is the root, every other rank a level-1 leaf under it. ``task-head``:
    task ``i`` holds ranks ``[i * npt, min((i + 1) * npt, nodes))``; its first rank is the head
    (the root for task 0, a level-1 head under the root otherwise) and the others are leaves
    under their task's head. ``ValueError`` for ``nodes`` outside ``2 .. MAX_NODES``, a
    ``nodes_per_task`` below 1 or an unknown topology.
    """
    if not 2 <= nodes <= MAX_NODES:
        raise ValueError(f"nodes must be in 2..{MAX_NODES}, got {nodes}")
    if nodes_per_task < 1:
        raise ValueError(f"nodes_per_task must be at least 1, got {nodes_per_task}")
    if topology not in ("flat", "task-head"):
        raise ValueError(f"unknown topology {topology!r} (flat or task-head)")
    placements = []
    for rank in range(nodes):
        task = rank // nodes_per_task
        if rank == 0:
            placements.append(Placement(0, 0, "root", 0, None))
        elif topology == "flat":
            placements.append(Placement(rank, task, "leaf", 1, 0))
        elif rank % nodes_per_task == 0:
            placements.append(Placement(rank, task, "head", 1, 0))
        else:
            head = task * nodes_per_task
            placements.append(Placement(rank, task, "leaf", 1 if head == 0 else 2, head))
    return tuple(placements)


# -- echo codec (pure) --------------------------------------------------------------------------


def encode_echo_request(payload: bytes) -> bytes:
    """``[ECHO_OP][len u32 BE][payload]`` (``ValueError`` above ``MAX_ECHO_PAYLOAD``)."""
    if len(payload) > MAX_ECHO_PAYLOAD:
        raise ValueError(f"echo payload of {len(payload)} bytes exceeds {MAX_ECHO_PAYLOAD}")
    return _HEADER.pack(ECHO_OP, len(payload)) + payload


def decode_echo_reply(reply: bytes, expected: bytes) -> None:
    """Check a reply ``[len u32 BE][payload]`` against ``expected`` (``ScaleError`` if not)."""
    if len(reply) < _LENGTH.size:
        raise ScaleError(f"echo reply of {len(reply)} bytes has no length prefix")
    (length,) = _LENGTH.unpack_from(reply)
    body = reply[_LENGTH.size :]
    if length != len(expected) or body != expected:
        raise ScaleError(
            f"echo mismatch: announced {length}, got {len(body)} bytes, expected {len(expected)}"
        )


# -- results ------------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Milliseconds of ``count`` operations: nearest-rank p50 and p90, mean and maximum."""

    count: int
    p50_ms: float
    p90_ms: float
    mean_ms: float
    max_ms: float

    def to_json(self) -> dict[str, float | int]:
        """A JSON-ready record."""
        return {
            "count": self.count,
            "p50_ms": self.p50_ms,
            "p90_ms": self.p90_ms,
            "mean_ms": self.mean_ms,
            "max_ms": self.max_ms,
        }


def _nearest_rank(ordered: Sequence[float], fraction: float) -> float:
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def summarize_latencies(seconds: Sequence[float]) -> LatencySummary:
    """Summarise latencies given in seconds (``ValueError`` for none, or a negative or
    non-finite one)."""
    if not seconds:
        raise ValueError("no latencies to summarise")
    if any(not math.isfinite(s) or s < 0 for s in seconds):
        raise ValueError("latencies must be finite and non-negative")
    ordered = sorted(s * 1000 for s in seconds)
    return LatencySummary(
        len(ordered),
        _nearest_rank(ordered, 0.5),
        _nearest_rank(ordered, 0.9),
        sum(ordered) / len(ordered),
        ordered[-1],
    )


@final
@dataclass(frozen=True, slots=True)
class ScaleSettings:
    """One run (spec 7.1): ``nodes`` processes including the root, ``nodes_per_task`` and
    ``topology`` for placement, at most ``launch_concurrency`` workers starting at once,
    ``echo_concurrency`` echoes in flight, ``echo_rounds`` fresh streams per worker (the first
    also connects), bounded by ``join_timeout`` and ``echo_timeout`` seconds. Workers use the
    QUIC ``idle_timeout`` and keep their parent link alive every quarter of it. ``host`` is the
    IPv4 address UDP carriers bind. ``persist``: every process keeps a replicated experiment
    database and serves experiments until stopped (``serve_persistent``) instead of one echo
    sweep. ``start``: ``fork`` (default) forks every worker from a warm fork server
    (``chrysalis.node._forkserver``), ``exec`` starts each as a fresh interpreter
    (``python -m chrysalis.node._scale worker``: for comparison). ``netns``: every task but
    the root's runs in a network namespace of its own (``chrysalis.node.netns``: needs root
    and iproute2, and the ``task-head`` topology with at least two tasks); ``host`` is then
    replaced by each namespace's address on the bridge joining them. ``restart``
    (persistent mode only): a worker that exits abnormally (any status but 0) is started
    again with its identity, at most ``restart`` times per rank, after ``restart_backoff``
    seconds, doubled for each further restart of that rank up to ``RESTART_BACKOFF_MAX``
    (``RestartPolicy``); past that it is given up on and declared lost."""

    nodes: int
    nodes_per_task: int = 100
    topology: Topology = "task-head"
    launch_concurrency: int = 8
    echo_concurrency: int = 1
    echo_rounds: int = 3
    echo_payload: int = 1
    join_timeout: float = 300.0
    echo_timeout: float = 120.0
    idle_timeout: float = 60.0
    host: str = "127.0.0.1"
    persist: bool = False
    start: StartMode = "fork"
    netns: bool = False
    restart: int = 0
    restart_backoff: float = 0.5

    def __post_init__(self) -> None:
        placements = plan_placement(self.nodes, self.nodes_per_task, self.topology)
        if self.netns and (self.topology != "task-head" or placements[-1].task == 0):
            raise ValueError(
                "--netns puts each task head's subtree in a namespace: it needs the task-head "
                "topology and at least two tasks (nodes > nodes_per_task)"
            )
        if self.start not in ("fork", "exec"):
            raise ValueError(f"unknown start mode {self.start!r} (fork or exec)")
        if not 0 <= self.restart <= MAX_RESTARTS:
            raise ValueError(f"restart must be in 0..{MAX_RESTARTS}, got {self.restart}")
        if self.restart and not self.persist:
            raise ValueError("--restart needs --persist: a sweep fails at once when a worker exits")
        if not 0 <= self.restart_backoff <= RESTART_BACKOFF_MAX:
            raise ValueError(
                f"restart_backoff must be in 0..{RESTART_BACKOFF_MAX:g} seconds, got "
                f"{self.restart_backoff}"
            )
        if self.launch_concurrency < 1 or self.echo_concurrency < 1 or self.echo_rounds < 1:
            raise ValueError("concurrencies and echo_rounds must be at least 1")
        if not 0 <= self.echo_payload <= MAX_ECHO_PAYLOAD:
            raise ValueError(f"echo_payload must be in 0..{MAX_ECHO_PAYLOAD}")
        for name in ("join_timeout", "echo_timeout", "idle_timeout"):
            value = getattr(self, name)
            if not 0.1 <= value <= 7200:
                raise ValueError(f"{name} must be in 0.1..7200 seconds, got {value}")


@final
@dataclass(frozen=True, slots=True)
class ScaleResult:
    """What a run measured (spec 7.3's RESULT line plus percentiles).

    ``launch_seconds``: from the root's start until the last worker was ready;
    ``join_seconds``: until every process was resolvable at the root; ``first_echo``: fresh
    stream plus a new QUIC connection per worker; ``echo``: fresh streams on pooled
    connections (``None`` with one round); ``echo_seconds`` and ``echoes_per_second`` cover
    every echo of every round. ``memory``: the workers' resident and proportional set sizes
    once all were resolvable (``worker_memory``; ``None`` where ``/proc`` has no
    ``smaps_rollup``). ``cpu``: the CPU every process of the tree had used once all were
    resolvable (``tree_cpu``; ``None`` where ``/proc`` has no such figures).
    """

    settings: ScaleSettings
    tasks: int
    children: int
    launch_seconds: float
    join_seconds: float
    echo_seconds: float
    first_echo: LatencySummary
    echo: LatencySummary | None
    memory: dict[str, float] | None = None
    cpu: dict[str, float] | None = None

    @property
    def echoes_per_second(self) -> float:
        """Echo operations per second over the whole echo phase."""
        total = self.first_echo.count + (0 if self.echo is None else self.echo.count)
        return total / self.echo_seconds if self.echo_seconds > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        """The ``chrysalis_scale_result`` record."""
        s = self.settings
        return {
            "event": "chrysalis_scale_result",
            "nodes": s.nodes,
            "tasks": self.tasks,
            "nodes_per_task": s.nodes_per_task,
            "topology": s.topology,
            "identity_concurrency": s.launch_concurrency,
            "children": self.children,
            "launch_seconds": self.launch_seconds,
            "join_seconds": self.join_seconds,
            "echo_seconds": self.echo_seconds,
            "echoes_per_second": self.echoes_per_second,
            "echo_rounds": s.echo_rounds,
            "concurrency": s.echo_concurrency,
            "first_echo": self.first_echo.to_json(),
            "echo": None if self.echo is None else self.echo.to_json(),
            "mean_echo_millis": (self.echo or self.first_echo).mean_ms,
            "max_echo_millis": (self.echo or self.first_echo).max_ms,
            "start": s.start,
            "netns": s.netns,
            "memory": self.memory,
            "cpu": self.cpu,
        }


def process_cpu_ms(pid: int) -> float | None:
    """The CPU time (user and system, milliseconds) process ``pid`` has used, from ``/proc``
    (Linux); ``None`` when it cannot be read.

    ``/proc/PID/stat`` counts every thread, dead ones too, but in clock ticks (10 ms), each
    of its two figures rounded down: about 10 ms too low for a forked scale worker's 30.
    ``/proc/PID/task/*/sched`` (scheduler statistics) counts each live thread to the
    nanosecond. Both are lower bounds, so this is the larger of the two."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        ticks = (int(fields[11]) + int(fields[12])) * 1000 / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None
    precise = 0.0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                text = Path(f"/proc/{pid}/task/{task}/sched").read_text()
                start = text.find("se.sum_exec_runtime")
                if start >= 0:
                    line = text[start : text.find("\n", start)]
                    precise += float(line.rpartition(":")[2])
    except (OSError, ValueError):
        precise = 0.0
    return max(ticks, precise)


_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu(
    leaves: Sequence[int], heads: Sequence[int], forkserver: int | None, root_ms: float
) -> dict[str, float] | None:
    """The CPU a tree's processes used (``process_cpu_ms``): the leaves' and heads' medians
    and sums, the fork server's, ``root_ms`` (the root and launcher's, since the launch
    began) and ``ms_per_worker``, all of it divided by the number of workers: issue 22's
    start-up cost, the root's and the fork server's shares included. ``None`` where no
    worker could be read."""
    leaf = [ms for ms in map(process_cpu_ms, leaves) if ms is not None]
    head = [ms for ms in map(process_cpu_ms, heads) if ms is not None]
    workers = len(leaf) + len(head)
    if not workers:
        return None
    fork = None if forkserver is None else process_cpu_ms(forkserver)
    root = root_ms
    total = sum(leaf) + sum(head) + (fork or 0.0) + root
    return {
        "workers": workers,
        "leaf_ms_median": statistics.median(leaf) if leaf else 0.0,
        "leaf_ms_total": sum(leaf),
        "head_ms_median": statistics.median(head) if head else 0.0,
        "head_ms_total": sum(head),
        "forkserver_ms": fork if fork is not None else 0.0,
        "root_ms": root,
        "ms_per_worker": total / workers,
    }


def worker_memory(pids: Sequence[int]) -> dict[str, float] | None:
    """Resident (RSS) and proportional (PSS: shared pages divided among their sharers) set
    sizes of the processes ``pids``, in MiB, from ``/proc/PID/smaps_rollup`` (Linux):
    ``processes`` measured, ``rss_mib_mean``, ``pss_mib_mean``, ``pss_mib_total``.
    ``None`` where nothing could be read (not Linux, or every process gone)."""
    rss: list[float] = []
    pss: list[float] = []
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        fields = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                fields[key] = int(parts[0]) / 1024
        if "Rss" in fields and "Pss" in fields:
            rss.append(fields["Rss"])
            pss.append(fields["Pss"])
    if not rss:
        return None
    return {
        "processes": len(rss),
        "rss_mib_mean": sum(rss) / len(rss),
        "pss_mib_mean": sum(pss) / len(pss),
        "pss_mib_total": sum(pss),
    }


@final
class RestartPolicy:
    """Which exited workers to start again, and when (pure: no processes, no clock).

    ``exited(rank, status)`` counts an abnormal exit (any ``status`` but 0) of ``rank`` and
    returns the seconds to wait before its restart: ``backoff`` for its first restart,
    doubled for each further one, at most ``cap``; ``None`` when the worker is not to be
    restarted (a clean exit, or ``limit`` restarts of that rank used up: given up on).
    A failed restart (the new process died or stayed silent) is one more abnormal exit."""

    __slots__ = ("_backoff", "_cap", "_limit", "_used")

    def __init__(self, limit: int, backoff: float, cap: float = RESTART_BACKOFF_MAX) -> None:
        if not 0 <= limit <= MAX_RESTARTS:
            raise ValueError(f"restart limit must be in 0..{MAX_RESTARTS}, got {limit}")
        if not (math.isfinite(backoff) and math.isfinite(cap) and 0 <= backoff <= cap):
            raise ValueError(f"need 0 <= backoff <= cap, got {backoff} and {cap}")
        self._limit = limit
        self._backoff = backoff
        self._cap = cap
        self._used: dict[int, int] = {}

    @property
    def limit(self) -> int:
        """Restarts allowed per rank."""
        return self._limit

    def used(self, rank: int) -> int:
        """Restarts of ``rank`` so far."""
        return self._used.get(rank, 0)

    @property
    def total(self) -> int:
        """Restarts of every rank so far."""
        return sum(self._used.values())

    def exited(self, rank: int, status: int) -> float | None:
        """Seconds until ``rank`` restarts after exiting with ``status``; ``None``: not."""
        used = self._used.get(rank, 0)
        if status == 0 or used >= self._limit:
            return None
        self._used[rank] = used + 1
        return min(self._cap, self._backoff * 2.0 ** min(used, 64))


# -- process launching --------------------------------------------------------------------------


@final
class _Lifeline:
    """The launcher's write end of a forked worker's stdin: closing it tells the worker to
    stop (like closing an exec'd process's stdin pipe)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


@final
class _Child:
    """One launched process, exec'd or forked: what ``ProcessGroup`` needs of it."""

    __slots__ = ("name", "proc", "stdin", "stdout", "transport")

    def __init__(
        self,
        name: str,
        proc: asyncio.subprocess.Process | ForkedProcess,
        stdin: asyncio.StreamWriter | _Lifeline | None,
        stdout: asyncio.StreamReader | None,
        transport: asyncio.BaseTransport | None = None,
    ) -> None:
        self.name = name
        self.proc = proc
        self.stdin = stdin
        self.stdout = stdout
        self.transport = transport

    def close_pipes(self) -> None:
        if self.stdin is not None:
            self.stdin.close()
        if self.transport is not None:
            self.transport.close()


@final
class ProcessGroup:
    """Child processes that each print one ready line on stdout, then run until their stdin
    closes. ``launch`` starts commands with bounded concurrency and returns their first lines;
    ``stop`` closes every stdin, waits ``grace`` seconds, then terminates and kills. Every
    process ever started is stopped, also after a failed launch.

    Two ways to start: each command exec'd as a fresh process (the default), or, after
    ``start_forkserver``, each forked from a warm fork server (``chrysalis.node._forkserver``),
    a command then being ``["module:function", *argv]`` (the worker runs ``function(argv)``).
    ``wait_exit`` wakes as soon as any started process ends (a crash is reported, not lost);
    ``relaunch`` starts an exited process's command again under its name."""

    __slots__ = (
        "_at_stop",
        "_children",
        "_env",
        "_exit_event",
        "_fork",
        "_logs",
        "_quiet",
        "_reported",
        "_watchers",
    )

    def __init__(self, logs: Path, env: dict[str, str] | None = None) -> None:
        self._logs = logs
        self._env = env
        self._children: list[_Child] = []
        self._reported: set[int] = set()
        self._quiet: set[str] = set()  # names being relaunched: their exits are relaunch's
        self._fork: ForkServer | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._exit_event: asyncio.Event | None = None
        self._at_stop: list[Callable[[], None]] = []

    def at_stop(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` at the end of ``stop``, once every process has ended (last
        registered first): what the processes ran in, such as their network namespaces."""
        self._at_stop.append(cleanup)

    @property
    def forked(self) -> bool:
        """Whether processes are forked from a fork server."""
        return self._fork is not None

    def start_forkserver(
        self,
        warm: Callable[[], None] | None = None,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        """Fork the fork server now (before this process runs sockets or threads a worker
        must not inherit); every later ``launch`` forks from it. ``warm`` runs once in it,
        ``prepare`` before each fork (``ForkServer.start``)."""
        if self._fork is not None:
            raise ScaleError("this group has a fork server already")
        self._fork = ForkServer.start(warm, prepare=prepare)
        self._fork.on_exit = lambda _process: self._exited_now()

    def _exited_now(self) -> None:
        if self._exit_event is not None:
            self._exit_event.set()

    def exited(self) -> list[tuple[str, int]]:
        """``(name, exit status)`` of every process that exited since the last call."""
        found = []
        for child in self._children:
            code = child.proc.returncode
            if (
                code is not None
                and id(child) not in self._reported
                and child.name not in self._quiet
            ):
                self._reported.add(id(child))
                found.append((child.name, code))
        return found

    async def wait_exit(self) -> list[tuple[str, int]]:
        """Wait until a process exits that ``exited`` has not reported yet; those processes."""
        if self._exit_event is None:
            self._exit_event = asyncio.Event()
        while not (found := self.exited()):
            self._exit_event.clear()
            if found := self.exited():
                break
            await self._exit_event.wait()
        return found

    @property
    def forkserver_pid(self) -> int | None:
        """The fork server's process ID (``None`` before ``start_forkserver``)."""
        return None if self._fork is None else self._fork.pid

    def pids(self) -> list[int]:
        """Process IDs of every process started and not yet stopped."""
        return [child.proc.pid for child in self._children]

    def named_pids(self) -> dict[str, int]:
        """``{name: process ID}`` of every process started and not yet stopped."""
        return {child.name: child.proc.pid for child in self._children}

    def __len__(self) -> int:
        return len(self._children)

    async def _exec(
        self, command: Sequence[str], name: str, log: int, netns: str | None = None
    ) -> _Child:
        if netns is not None:  # ``ip netns exec`` execs the command: the same process
            command = ["ip", "netns", "exec", Path(netns).name, *command]
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=log,
            env=self._env,
            limit=_LINE_LIMIT,
        )

        async def watch() -> None:
            await proc.wait()
            self._exited_now()

        self._watchers.append(asyncio.create_task(watch()))
        return _Child(name, proc, proc.stdin, proc.stdout)

    async def _forked(
        self, command: Sequence[str], name: str, log: int, netns: str | None = None
    ) -> _Child:
        assert self._fork is not None
        if not command:
            raise ValueError("a forked command needs its target")
        loop = asyncio.get_running_loop()
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            proc = await self._fork.spawn(
                command[0], command[1:], stdin=stdin_r, stdout=out_w, stderr=log, netns=netns
            )
        except BaseException:
            for fd in (stdin_w, out_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, out_w):
                os.close(fd)
        os.set_inheritable(stdin_w, False)
        reader = asyncio.StreamReader(limit=_LINE_LIMIT, loop=loop)
        pipe = os.fdopen(out_r, "rb", buffering=0)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe
        )
        return _Child(name, proc, _Lifeline(stdin_w), reader, transport)

    async def launch(
        self,
        commands: Sequence[Sequence[str]],
        *,
        names: Sequence[str],
        concurrency: int,
        timeout: float,
        netns: Sequence[str | None] | None = None,
        append_logs: bool = False,
    ) -> list[str]:
        """Start every command (at most ``concurrency`` not yet ready at once) and return
        each one's first stdout line; ``ScaleError`` if one exits or stays silent for
        ``timeout`` seconds (with the tail of its stderr, kept in ``logs/NAME.log``, which
        ``append_logs`` extends instead of starting anew). ``netns``: per command, the file
        naming the network namespace it runs in (``None``: this process's)."""
        if len(names) != len(commands):
            raise ValueError("one name per command")
        spaces = [None] * len(commands) if netns is None else list(netns)
        if len(spaces) != len(commands):
            raise ValueError("one namespace (or None) per command")
        slots = asyncio.Semaphore(concurrency)
        self._logs.mkdir(parents=True, exist_ok=True)
        if self._exit_event is None:
            self._exit_event = asyncio.Event()

        async def start(command: Sequence[str], name: str, space: str | None) -> str:
            async with slots:
                log_path = self._logs / f"{name}.log"
                with open(log_path, "ab" if append_logs else "wb") as log:
                    if self._fork is not None:
                        child = await self._forked(command, name, log.fileno(), space)
                    else:
                        child = await self._exec(command, name, log.fileno(), space)
                self._children.append(child)
                assert child.stdout is not None
                try:
                    line = await asyncio.wait_for(child.stdout.readline(), timeout)
                except (TimeoutError, ValueError):
                    line = b""
                if not line.endswith(b"\n"):
                    if child.proc.returncode is None:  # EOF first, the exit report follows
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(child.proc.wait(), 1.0)
                    status = child.proc.returncode
                    how = "was not ready" if status is None else f"exited with status {status}"
                    tail = log_path.read_bytes()[-1500:].decode(errors="replace")
                    raise ScaleError(f"{name} {how} within {timeout:g} s: {tail}")
                return line.decode(errors="replace").strip()

        tasks = [
            asyncio.ensure_future(start(c, n, ns))
            for c, n, ns in zip(commands, names, spaces, strict=True)
        ]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def relaunch(
        self,
        name: str,
        command: Sequence[str],
        *,
        timeout: float,
        netns: str | None = None,
        check: Callable[[str], None] | None = None,
    ) -> tuple[str, int]:
        """Start ``command`` as ``name`` again, in place of that name's exited process (whose
        pipes are closed and which is forgotten), its output appended to ``logs/NAME.log``;
        its ready line (``check`` raises if it is not acceptable) and its OS process ID.
        On any failure (``ScaleError``: it exited or stayed silent; ``check``'s error; the
        fork server gone) the new process is killed and forgotten too, so no exit of
        ``name`` is reported by ``exited`` for this attempt: the caller decides what next."""
        if name in self._quiet:
            raise ScaleError(f"{name} is being relaunched already")
        old = [child for child in self._children if child.name == name]
        if any(child.proc.returncode is None for child in old):
            raise ScaleError(f"{name} is still running")
        for child in old:
            self._forget(child)
        self._quiet.add(name)
        try:
            try:
                (line,) = await self.launch(
                    [command],
                    names=[name],
                    concurrency=1,
                    timeout=timeout,
                    netns=[netns],
                    append_logs=True,
                )
                if check is not None:
                    check(line)
            except Exception:
                for child in [child for child in self._children if child.name == name]:
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.send_signal(signal.SIGKILL)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(child.proc.wait(), _STOP_GRACE)
                    if child.proc.returncode is not None:  # else ``stop`` ends it
                        self._forget(child)
                raise
        finally:
            self._quiet.discard(name)
        (child,) = [child for child in self._children if child.name == name]
        return line, child.proc.pid

    def _forget(self, child: _Child) -> None:
        self._children.remove(child)
        self._reported.discard(id(child))  # an id may be reused by a later child
        child.close_pipes()

    async def stop(self, grace: float = _STOP_GRACE) -> None:
        """Close every lifeline, then terminate and kill what is still running (bounded);
        then end the fork server, if any, and run the ``at_stop`` clean-ups."""
        children, self._children = self._children, []
        self._reported.clear()
        try:
            for child in children:
                if child.stdin is not None:
                    child.stdin.close()
            waits = [asyncio.ensure_future(child.proc.wait()) for child in children]
            if waits:
                _done, pending = await asyncio.wait(waits, timeout=grace)
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    if not pending:
                        break
                    for child in children:
                        if child.proc.returncode is None:
                            with contextlib.suppress(ProcessLookupError):
                                child.proc.send_signal(sig)
                    _done, pending = await asyncio.wait(pending, timeout=grace)
                for wait in pending:
                    wait.cancel()
        finally:
            for child in children:
                child.close_pipes()
            watchers, self._watchers = self._watchers, []
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            fork, self._fork = self._fork, None
            try:
                if fork is not None:
                    fork.close()
            finally:
                cleanups, self._at_stop = self._at_stop, []
                errors = []
                for cleanup in reversed(cleanups):
                    try:
                        cleanup()
                    except Exception as exc:  # every clean-up runs; the first error is raised
                        errors.append(exc)
                if errors:
                    raise errors[0]


# -- worker -------------------------------------------------------------------------------------


def _labels(placement: Placement, topology: str) -> Labels:
    return Labels(
        [
            ("client", "chrysalis-scale"),
            ("level", str(placement.level)),
            ("rank", str(placement.rank)),
            ("role", placement.role),
            ("task", str(placement.task)),
            ("topology", topology),
        ]
    )


def _carrier(udp: DatagramAddr | None, unix: str | None) -> DatagramSocket:
    members: list[DatagramSocket] = []
    try:
        if udp is not None:
            members.append(UdpSocket.bind(udp))
        if unix is not None:  # a socket file left by a killed worker is reclaimed
            members.append(bind_carrier(DatagramAddr.unixgram(unix)))
    except BaseException:
        for member in members:
            member.shutdown()
        raise
    if not members:
        raise ValueError("a node needs a UDP or a Unix carrier")
    return members[0] if len(members) == 1 else DatagramSocketSet(members[0], *members[1:])


def _scale_handler(baselines: bytes = b"{}") -> Callable[[ByteStream], Awaitable[None]]:
    """A worker's echo: a scale request (``[ECHO_OP][len][payload]``) is answered with
    ``[len][payload]``, a transfer (``[DELIVERY_OP]`` then bytes until FIN) with the byte
    count as u64 BE, a pooled echo (``[POOLED_ECHO_OP]`` then frames) frame by frame,
    ``[BASELINES_OP]`` with ``baselines`` (the JSON addresses of this process's baseline
    servers); any other first byte gets the raw echo (``chrysalis ping``). Errors end the
    stream in ``chrysalis.node._echo.serve_stream``, never the worker."""

    async def handle(stream: ByteStream) -> None:
        first = await stream.read(1)
        if first == bytes([DELIVERY_OP]):
            received = 0
            while chunk := await stream.read(_TRANSFER_CHUNK):
                received += len(chunk)
            stream.write(_COUNT.pack(received))
        elif first == bytes([ECHO_OP]):
            (length,) = _LENGTH.unpack(await stream.read_exactly(_LENGTH.size))
            if length > MAX_ECHO_PAYLOAD:
                raise ScaleError(f"echo of {length} bytes refused")
            stream.write(_LENGTH.pack(length) + await stream.read_exactly(length))
        elif first == bytes([POOLED_ECHO_OP]):
            while header := await stream.read(_LENGTH.size):
                if len(header) < _LENGTH.size:
                    header += await stream.read_exactly(_LENGTH.size - len(header))
                (length,) = _LENGTH.unpack(header)
                if length > MAX_ECHO_PAYLOAD:
                    raise ScaleError(f"echo of {length} bytes refused")
                stream.write(_LENGTH.pack(length) + await stream.read_exactly(length))
                await stream.drain()
        elif first == bytes([BASELINES_OP]):
            stream.write(baselines)
        else:
            await echo_raw(stream, first)

    return handle


_serve_echo = _scale_handler()


def _node_record(
    node: Node, placement: Placement, topology: str, parent: str, carrier: DatagramSocket
) -> NodeRecord:
    """This process's row of the ``scale_node`` table."""
    labels = ",".join(f"{k}={v}" for k, v in sorted(_labels(placement, topology).items()))
    address = carrier.local_addr
    return NodeRecord(
        node.pid.hex(), 0, placement.rank, parent, placement.level, placement.task,
        placement.role, address.scheme, format_address(address), labels, _STARTED_AT,
    )  # fmt: skip


_PROVIDERS: dict[str, DevelopmentIdentityProvider] = {}
"""Identity providers by CA directory: loaded once in the fork server (``_warm``), so forked
workers neither read the CA nor initialise its key again."""


def _provider(ca_dir: Path) -> DevelopmentIdentityProvider:
    key = str(ca_dir)
    provider = _PROVIDERS.get(key)
    if provider is None:
        provider = _PROVIDERS[key] = DevelopmentIdentityProvider(ca_dir)
    return provider


def _warm(ca_dir: Path, persist: bool) -> None:
    """Run once in the fork server before it forks workers: load the CA, issue one identity
    (which loads what key generation and signing load lazily) and import what a worker
    imports only when it runs (persistent mode's modules, the worker's event loop and QUIC
    engine), so every forked worker starts with all of it."""
    _provider(ca_dir).issue_identity()
    # Parsed once, not only built: parsing compiles (and caches) argparse's regular
    # expressions, about 1.5 ms of every worker's CPU otherwise.
    warm_argv = [
        "worker", "--rank", "1", "--task", "0", "--role", "leaf", "--level", "1",
        "--topology", "task-head", "--parent", "unixgram:///warm", "--ca-dir", str(ca_dir),
        "--idle-timeout", "60", "--lifeline", "--authority", "0" * 32, "--unix", "/warm",
    ]  # fmt: skip
    _parser().parse_args(warm_argv)
    _parse_worker(warm_argv)  # the worker's own parse: its option table built once, here
    # Found with ``PYTHONPROFILEIMPORTTIME=1`` on an exec'd worker: what it imports after
    # ``chrysalis.node._scale`` (its event loop's default executor).
    modules = ["concurrent.futures.thread", "queue"]
    if persist:
        modules += ["chrysalis.node._experiments", "chrysalis.node._baselines"]
    for name in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _warm_join(ca_dir)


def _warm_join(ca_dir: Path) -> None:
    """Run one join in this process (the fork server, before it forks anything): a parent
    and a child node over Unix datagram sockets in a temporary directory, until the child is
    connected, then both stop. What a process's first join initialises lazily (caches of
    ``abc``, ``typing``, ``re`` and ``enum`` lookups, the TLS and QUIC engines' tables) is then
    ready in every forked worker. Must leave no thread running (forks copy only the calling
    thread); a failure is reported on stderr and leaves the workers to warm themselves."""
    import threading

    async def join(directory: Path) -> None:
        provider = _provider(ca_dir)
        parent_sock = str(directory / "p.sock")
        parent_addr = DatagramAddr.unixgram(parent_sock)
        parent = Node(
            provider.issue_identity(),
            carrier=_carrier(None, parent_sock),
            quic_config=scale_quic_config(5.0, parent_addr),
        )
        async with parent:
            child = Node(
                provider.issue_identity(),
                carrier=_carrier(None, str(directory / "c.sock")),
                parent=JoinSettings(parent_addr, parent.pid),
                quic_config=scale_quic_config(5.0, parent_addr),
            )
            async with child:
                await asyncio.wait_for(child.wait_connected(), 10.0)

    before = threading.active_count()
    try:
        with tempfile.TemporaryDirectory(prefix="chrysalis-warm-") as directory:
            asyncio.run(join(Path(directory)))
    except Exception as exc:  # only an optimisation: the workers still start without it
        print(f"[fork server] warm-up join failed: {exc!r}", file=sys.stderr)
    if (left := threading.active_count() - before) > 0:
        raise ScaleError(f"{left} threads left running after the warm-up join")


_IDENTITY_BATCH: Final = 16
"""Identities the fork server issues in one go, ahead of the workers that take them."""
_ISSUED: list[tuple[str, Identity]] = []
"""The fork server's identities issued ahead (CA directory, identity), at most
``_IDENTITY_BATCH``; each is handed to exactly one worker (``_hand_identity``)."""
_HANDED: list[tuple[str, Identity]] = []
"""At most one: the identity of the worker about to be forked (set in the fork server right
before the fork, so the worker finds it here; the next fork replaces it)."""


def _hand_identity(ca_dir: Path) -> None:
    """Run in the fork server before each fork (``ForkServer.start(prepare=...)``): take the
    next identity issued ahead, issuing ``_IDENTITY_BATCH`` at once when none is left, and
    leave it in ``_HANDED`` for the worker (``_worker_identity``).

    Why in batches, in the fork server: a forked worker pays a copy-on-write page fault for
    every page of the fork server it writes, and a reference count is a write. Issuing one
    identity touches about 500 such pages (key generation and the certificate builder's
    objects, 3 ms of a worker's CPU, where a warm process issues one in 0.2 to 0.3 ms); the
    fork server issuing 16 in a row pays those faults once per batch. The identity contract
    is unchanged: every worker gets a key and certificate of its own (popped here, never
    handed twice), its PID derived from that leaf. A worker's memory holds the identities
    issued ahead for later workers, as it holds the CA's key (the fork server loaded it):
    workers of one scale run share one trust domain."""
    if not _ISSUED:
        provider = _provider(ca_dir)
        _ISSUED.extend((str(ca_dir), provider.issue_identity()) for _ in range(_IDENTITY_BATCH))
    _HANDED[:] = [_ISSUED.pop()]


def _handed_identity(ca_dir: Path) -> Identity | None:
    """The identity the fork server handed this worker (``_hand_identity``), once; ``None``
    if none was handed (an exec'd worker) or it is another CA's."""
    if not _HANDED:
        return None
    directory, identity = _HANDED.pop()
    return identity if directory == str(ca_dir) else None


def _worker_identity(ca_dir: Path, path: Path | None) -> Identity:
    """A new identity from the CA (in a forked worker the one the fork server issued ahead
    and handed it: ``_hand_identity``), or (``path`` given, ``--restart``) the one kept in the file
    ``path``: read when it exists (a restarted worker: same key and certificate, so the same
    PID), else issued and written there first (JSON of the three PEM blobs, mode 0600,
    replaced atomically), before the worker binds or joins anything."""
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            with open(path, "rb") as file:
                data = file.read(_MAX_IDENTITY_FILE + 1)
            if len(data) > _MAX_IDENTITY_FILE:
                raise ScaleError(f"identity file {path} exceeds {_MAX_IDENTITY_FILE} bytes")
            try:
                kept = json.loads(data)
                return Identity.from_pem(
                    kept["chain"].encode(), kept["key"].encode(), kept["roots"].encode()
                )
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ScaleError(f"identity file {path} is not usable: {exc}") from None
    identity = _handed_identity(ca_dir) or _provider(ca_dir).issue_identity()
    if path is not None:
        record = {
            "chain": identity.chain_pem().decode(),
            "key": identity.key_pem().decode(),
            "roots": identity.roots_pem().decode(),
        }
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="ascii") as file:
            json.dump(record, file)
        os.replace(partial, path)
    return identity


def _stop_on_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM set ``stop`` (in ``loop``), until ``_default_signals``.

    Plain ``signal.signal`` handlers that hand over to the loop, not
    ``loop.add_signal_handler``: that checks each signal against ``signal.valid_signals()``,
    which builds a set of 64 enum members per call, about 0.5 ms of a forked worker's CPU (60
    page faults: their pages are the fork server's until written). A signal interrupts the
    loop's wait as asyncio's wake-up descriptor would: ``call_soon_threadsafe`` writes to the
    loop's own."""

    def handler(signum: int, frame: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: exiting anyway
            loop.call_soon_threadsafe(stop.set)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)


def _default_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


async def _worker(args: argparse.Namespace, out: TextIO) -> int:
    try:
        return await _worker_run(args, out)
    finally:
        _default_signals()


async def _worker_run(args: argparse.Namespace, out: TextIO) -> int:
    placement = Placement(args.rank, args.task, args.role, args.level, None)
    identity = _worker_identity(args.ca_dir, args.identity_file)
    udp = None if args.udp is None else DatagramAddr.parse(args.udp)
    carrier = _carrier(udp, args.unix)
    parent = JoinSettings(
        DatagramAddr.parse(args.parent),
        None if args.authority is None else Pid.parse(args.authority),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    _stop_on_signals(loop, stop)
    if args.lifeline:

        def on_stdin() -> None:
            try:
                data = os.read(sys.stdin.fileno(), 4096)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(sys.stdin.fileno())
                stop.set()

        loop.add_reader(sys.stdin.fileno(), on_stdin)
    node = Node(
        identity,
        carrier=carrier,
        parent=parent,
        labels=_labels(placement, args.topology),
        quic_config=scale_quic_config(args.idle_timeout, udp, parent.address),
    )
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(node)
        handler = _serve_echo
        if args.database is not None:  # before children join: the replication link protocol
            from chrysalis.node._baselines import baseline_servers
            from chrysalis.node._experiments import node_experiments

            record = _node_record(node, placement, args.topology, args.authority or "", carrier)
            await stack.enter_async_context(node_experiments(node, args.database, record))
            host = args.host or (str(udp.ip) if udp is not None else "127.0.0.1")
            addresses = await stack.enter_async_context(baseline_servers(host, identity))
            handler = _scale_handler(json.dumps(addresses).encode())
        connected = asyncio.ensure_future(node.wait_connected())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([connected, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not connected.done():
            connected.cancel()
            return 1
        stopped.cancel()
        connected.result()
        background = [asyncio.create_task(serve_streams(node, handler))]
        # In its log: the CPU this process used to get here and its page faults (a forked
        # worker's counts start at its fork; an exec'd one's include the interpreter's start
        # and imports). Written before the ready line, so that whoever saw the ready line
        # finds it in the log. (``resource``: imported by the launcher before the fork server.)
        import resource

        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        cpu = time.process_time() * 1000
        print(f"rank {args.rank} ready: {cpu:.1f} ms CPU, {faults} page faults", file=sys.stderr)
        out.write(f"{carrier.local_addr}?authority={node.pid.hex()}\n")
        out.flush()
        await stop.wait()
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
    return 0


# -- supervisor and root ------------------------------------------------------------------------


def _worker_command(
    settings: ScaleSettings,
    placement: Placement,
    *,
    udp: str | None,
    unix: str | None,
    parent: str,
    authority: str | None,
    ca_dir: Path,
    database: Path | None = None,
    host: str | None = None,
    identity_file: Path | None = None,
) -> list[str]:
    """The worker's arguments (``main``'s ``argv``, from ``worker`` on)."""
    command = [
        "worker",
        "--rank", str(placement.rank), "--task", str(placement.task),
        "--role", placement.role, "--level", str(placement.level),
        "--topology", settings.topology, "--parent", parent,
        "--ca-dir", str(ca_dir), "--idle-timeout", str(settings.idle_timeout), "--lifeline",
    ]  # fmt: skip
    if authority is not None:
        command += ["--authority", authority]
    if udp is not None:
        command += ["--udp", udp]
    if unix is not None:
        command += ["--unix", unix]
    if database is not None:
        command += ["--database", str(database)]
    if host is not None:
        command += ["--host", host]
    if identity_file is not None:
        command += ["--identity-file", str(identity_file)]
    return command


def _split_token(line: str, name: str) -> tuple[str, str]:
    address, sep, authority = line.rpartition("?authority=")
    if not sep or len(authority) != 32:
        raise ScaleError(f"{name} printed {line[:200]!r}, not a join token")
    return address, authority


async def _wait_converged(root: Node, nodes: int, timeout: float, progress: TextIO) -> None:
    service = root.nameserver
    step = max(1, nodes // 10)
    reported = 0

    def visible_len() -> int:  # the directory holds the subtree; the root's own entry is apart
        return len(service.directory) + (service.local_entry is not None)

    async def converge() -> None:
        nonlocal reported
        seen = service.revisions.version
        while (visible := visible_len()) < nodes:
            if visible >= reported + step:
                reported = visible - visible % step
                progress.write(f"[root] joined {visible}/{nodes}\n")
            seen = await service.revisions.wait_change(seen)

    try:
        await asyncio.wait_for(converge(), timeout)
    except TimeoutError:
        raise ScaleError(
            f"only {visible_len()}/{nodes} processes visible after {timeout:g} s"
        ) from None


async def _echo_round(
    root: Node, pids: Sequence[Pid], settings: ScaleSettings, clock: Callable[[], float]
) -> list[float]:
    slots = asyncio.Semaphore(settings.echo_concurrency)
    payload = b"\x2a" * settings.echo_payload
    request = encode_echo_request(payload)

    async def one(pid: Pid) -> float:
        async with slots:
            started = clock()
            stream = await root.dial(pid, Consistency.CACHED)
            stream.write(request)
            stream.write_eof()
            decode_echo_reply(await stream.read(-1), payload)
            return clock() - started

    return list(await asyncio.gather(*(one(pid) for pid in pids)))


@final
@dataclass(slots=True)
class _Tree:
    """A launched, converged tree: the root node, every rank's join token, the workers'
    PIDs in rank order, and (persistent mode) the root's experiment store."""

    root: Node
    tokens: dict[int, tuple[str, str]]
    pids: list[Pid]
    launch_seconds: float
    join_seconds: float
    store: Any
    memory: dict[str, float] | None = None
    namespaces: dict[int, str] | None = None
    """``--netns``: each task's namespace name (tasks 1 and up) and address."""
    relaunch: Callable[[int], tuple[list[str], str | None]] | None = None
    """A rank's command to start it again (same identity file, carrier address, parent,
    database) and the file naming its network namespace (``None``: this one's)."""
    cpu: dict[str, float] | None = None
    """Every process's CPU once all were resolvable (``tree_cpu``)."""


async def _until_exit(group: ProcessGroup, work: Awaitable[object]) -> None:
    """Run ``work``, failing at once (``ScaleError``, naming the process and its exit
    status) if a launched process exits meanwhile: a crashed worker is reported, not waited
    for until a timeout."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(group.wait_exit())
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
        if watch.done() and not task.done():
            gone = ", ".join(f"{name} (status {status})" for name, status in watch.result())
            raise ScaleError(f"worker exited before the tree converged: {gone}")
        await task
    finally:
        for pending in (task, watch):
            pending.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)


def _raise_open_files(nodes: int, progress: TextIO) -> None:
    """Raise this process's soft ``RLIMIT_NOFILE`` towards what ``nodes`` workers need (two
    pipe ends each, plus the root's sockets), up to the hard limit; say so if short."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    needed = 2 * nodes + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            progress.write(
                f"[root] warning: {nodes} workers need about {needed} open files, the hard "
                f"limit is {hard}\n"
            )


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def _launched(
    settings: ScaleSettings, work: Path, group: ProcessGroup, progress: TextIO
) -> AsyncIterator[_Tree]:
    """Start the root (this process) and every worker, wait until all are resolvable at
    the root, and yield the tree; the root stops when the block ends (the caller stops the
    group). In persistent mode every process also opens ``work/db/node-<rank>.db``."""
    placements = plan_placement(settings.nodes, settings.nodes_per_task, settings.topology)
    loop = asyncio.get_running_loop()
    ca_dir = work / "ca"
    DevelopmentCA.load_or_create(ca_dir)  # once, before any worker issues from it
    database_dir = work / "db" if settings.persist else None
    if database_dir is not None:
        database_dir.mkdir(parents=True, exist_ok=True)

    def head_sock(task: int) -> str:
        (work / f"task-{task}").mkdir(exist_ok=True)
        return str(work / f"task-{task}" / "head.sock")

    _raise_open_files(settings.nodes, progress)
    started = loop.time()
    cpu_started = time.process_time()
    host = dict.fromkeys(range(placements[-1].task + 1), settings.host)
    spaces: dict[int, str] = {}  # task -> the file naming its namespace
    if settings.netns:
        # Before the fork server: it forks no reaper, and workers enter these by path.
        from chrysalis.node.netns import Namespaces

        namespaces = Namespaces.for_tasks(placements[-1].task)
        namespaces.create()
        group.at_stop(namespaces.delete)
        plan = namespaces.plan
        host = {0: plan.root_address} | {t: plan.address(t) for t in range(1, plan.count + 1)}
        spaces = {t: plan.path(t) for t in range(1, plan.count + 1)}
        progress.write(
            f"[root] {plan.count} network namespaces on {plan.subnet} (root at "
            f"{plan.root_address}): {', '.join(plan.names()[1:])}\n"
        )
    if settings.start == "fork":
        # Before the root binds a socket or starts its loop's I/O: the fork server (and so
        # every worker) must not inherit them.
        group.start_forkserver(
            functools.partial(_warm, ca_dir, settings.persist),
            functools.partial(_hand_identity, ca_dir),
        )
    root_identity = _provider(ca_dir).issue_identity()
    udp = DatagramAddr.udp(host[0], 0)
    root_carrier = _carrier(udp, head_sock(0))  # leaves of task 0 (all of them when flat)
    root = Node(
        root_identity,
        carrier=root_carrier,
        labels=_labels(placements[0], settings.topology),
        quic_config=scale_quic_config(settings.idle_timeout, udp),
    )
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(root)
        store = None
        if database_dir is not None:
            from chrysalis.node._experiments import node_experiments

            record = _node_record(root, placements[0], settings.topology, "", root_carrier)
            from chrysalis.node._baselines import baseline_servers

            store = await stack.enter_async_context(
                node_experiments(root, database_dir / "node-0.db", record)
            )
            addresses = await stack.enter_async_context(baseline_servers(host[0], root_identity))
            # The root is a destination like any node: it answers echoes too.
            handler = _scale_handler(json.dumps(addresses).encode())
            echo = asyncio.create_task(serve_streams(root, handler))
            stack.push_async_callback(_cancel, echo)
        root_token = (str(root.local_addr), root.pid.hex())
        joined: dict[int, tuple[str, str]] = {0: root_token}
        identities = None
        if settings.restart:  # a restarted worker reads its identity back: the same PID
            identities = work / "identity"
            identities.mkdir(mode=0o700, exist_ok=True)

        def command_for(p: Placement, *, again: bool = False) -> list[str]:
            assert p.parent is not None
            if p.role == "head":  # UDP to the root, and a Unix socket for its leaves
                parent, authority = joined[0]
                # started again: on the UDP port it had (its children and tokens name it)
                own_udp = joined[p.rank][0] if again else str(DatagramAddr.udp(host[p.task], 0))
                own_unix = head_sock(p.task)
            else:  # a leaf: Unix datagrams only, to its head (the root when flat)
                task = placements[p.parent].task
                parent = str(DatagramAddr.unixgram(head_sock(task)))
                authority = joined[p.parent][1]
                own_udp, own_unix = None, str(work / f"task-{task}/node-{p.rank}.sock")
            command = _worker_command(
                settings,
                p,
                udp=own_udp,
                unix=own_unix,
                parent=parent,
                authority=authority,
                ca_dir=ca_dir,
                database=None if database_dir is None else database_dir / f"node-{p.rank}.db",
                host=host[p.task] if settings.netns else None,
                identity_file=None if identities is None else identities / f"rank-{p.rank}.json",
            )
            if group.forked:
                return [_FORK_TARGET, *command]
            return [sys.executable, "-m", _MODULE, *command]

        def relaunch(rank: int) -> tuple[list[str], str | None]:
            p = placements[rank]
            return command_for(p, again=True), spaces.get(p.task)

        async def launch(batch: Sequence[Placement]) -> None:
            commands = [command_for(p) for p in batch]
            names = [f"rank-{p.rank}" for p in batch]
            remaining = settings.join_timeout - (loop.time() - started)
            lines = await group.launch(
                commands,
                names=names,
                concurrency=settings.launch_concurrency,
                timeout=max(0.1, remaining),
                netns=[spaces.get(p.task) for p in batch],
            )
            for p, name, line in zip(batch, names, lines, strict=True):
                joined[p.rank] = _split_token(line, name)

        await launch([p for p in placements if p.role == "head"])
        await launch([p for p in placements if p.role == "leaf"])
        launch_seconds = loop.time() - started
        progress.write(f"[root] {len(group)} workers ready after {launch_seconds:.2f} s\n")
        pids = [Pid.parse(joined[p.rank][1]) for p in placements[1:]]

        def missing() -> list[int]:
            resolve = root.nameserver.resolve
            return [
                p.rank
                for p, pid in zip(placements[1:], pids, strict=True)
                if not isinstance(resolve(pid), Found)
            ]

        remaining = settings.join_timeout - launch_seconds
        try:
            await _until_exit(
                group, _wait_converged(root, settings.nodes, max(0.1, remaining), progress)
            )
        except ScaleError as exc:
            raise ScaleError(f"{exc}; unresolvable ranks: {missing()[:20]}") from None
        entries = await root.enumerate(Consistency.CACHED)
        if len(entries) != settings.nodes or missing():
            raise ScaleError(
                f"enumerated {len(entries)} of {settings.nodes}; unresolvable ranks: "
                f"{missing()[:20]}"
            )
        join_seconds = loop.time() - started
        progress.write(f"[root] all {settings.nodes} resolvable after {join_seconds:.2f} s\n")
        ranks = group.named_pids()
        roles = {f"rank-{p.rank}": p.role for p in placements[1:]}
        cpu = tree_cpu(
            [pid for name, pid in ranks.items() if roles.get(name) == "leaf"],
            [pid for name, pid in ranks.items() if roles.get(name) == "head"],
            group.forkserver_pid,
            (time.process_time() - cpu_started) * 1000,
        )
        memory = worker_memory(group.pids())
        if memory is not None:
            progress.write(
                f"[root] workers: RSS {memory['rss_mib_mean']:.1f} MiB, PSS "
                f"{memory['pss_mib_mean']:.1f} MiB each, PSS {memory['pss_mib_total']:.0f} MiB "
                f"in all ({settings.start})\n"
            )
        if cpu is not None:
            progress.write(
                f"[root] CPU: {cpu['ms_per_worker']:.1f} ms per worker in all (leaf median "
                f"{cpu['leaf_ms_median']:.1f} ms, head median {cpu['head_ms_median']:.1f} ms, "
                f"fork server {cpu['forkserver_ms']:.0f} ms, root {cpu['root_ms']:.0f} ms)\n"
            )
        names = {task: Path(path).name for task, path in spaces.items()}
        yield _Tree(
            root, joined, pids, launch_seconds, join_seconds, store, memory, names, relaunch, cpu
        )


async def run_scale(
    settings: ScaleSettings,
    *,
    workdir: Path | None = None,
    progress: TextIO = sys.stderr,
) -> ScaleResult:
    """Launch the run described by ``settings`` (this process is the root), measure it and
    stop every worker. ``workdir`` holds the CA, the Unix sockets and the worker logs (a fresh
    temporary directory, removed afterwards, if ``None``). ``ScaleError`` on any failure."""
    placements = plan_placement(settings.nodes, settings.nodes_per_task, settings.topology)
    owned = workdir is None
    # Unix socket paths are limited to 107 bytes: keep the directory short.
    work = Path(tempfile.mkdtemp(prefix="chrysalis-scale-")) if workdir is None else workdir
    loop = asyncio.get_running_loop()
    group = ProcessGroup(work / "logs")
    try:
        async with _launched(settings, work, group, progress) as tree:
            echo_started = loop.time()
            rounds: list[list[float]] = []
            try:
                async with asyncio.timeout(settings.echo_timeout):
                    for _ in range(settings.echo_rounds):
                        rounds.append(await _echo_round(tree.root, tree.pids, settings, loop.time))
            except TimeoutError:
                raise ScaleError(
                    f"echoes did not finish within {settings.echo_timeout:g} s"
                ) from None
            echo_seconds = loop.time() - echo_started
            later = [sample for samples in rounds[1:] for sample in samples]
            return ScaleResult(
                settings,
                placements[-1].task + 1,
                len(tree.pids),
                tree.launch_seconds,
                tree.join_seconds,
                echo_seconds,
                summarize_latencies(rounds[0]),
                summarize_latencies(later) if later else None,
                tree.memory,
                tree.cpu,
            )
    finally:
        await group.stop()
        if owned:
            shutil.rmtree(work, ignore_errors=True)


def _restart_error(exc: BaseException) -> str:
    """One line for a failed restart: the launch error's first line up to its log tail, and
    the tail's last line (the new process's own error; the log holds earlier runs too)."""
    lines = [line for line in (str(exc) or type(exc).__name__).splitlines() if line.strip()]
    if len(lines) > 1:
        lines = [lines[0].split(": ", 1)[0], lines[-1].strip()]
    return ": ".join(lines)[:300]


async def _wait_registered(store: Any, nodes: int, timeout: float) -> None:
    """Until the root's replica holds ``nodes`` live node rows (registry convergence)."""
    from chrysalis.node._claims import NodeState

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        live = sum(1 for n in store.ledger().nodes.values() if n.state is NodeState.LIVE)
        if live >= nodes:
            return
        if loop.time() > deadline:
            raise ScaleError(f"only {live}/{nodes} nodes registered after {timeout:g} s")
        await asyncio.sleep(0.05)


async def serve_persistent(
    settings: ScaleSettings,
    *,
    workdir: Path | None = None,
    out: TextIO = sys.stdout,
    progress: TextIO = sys.stderr,
    stop: asyncio.Event | None = None,
) -> None:
    """Persistent mode (``chrysalis scale --persist``): launch the tree with a replicated
    experiment database per process, wait until every node row reached the root, print
    ``[root] READY {"tokens": {rank: token}, "processes": {rank: OS process ID}, "workdir":
    ..., "ca_dir": ..., "namespaces": {task: network namespace}}`` (``--netns``; clients such
    as ``chrysalis admin`` need ``--ca-dir``) and serve experiments until
    ``stop`` is set (SIGINT/SIGTERM in ``main``). A worker process that exits meanwhile is
    declared lost (its open work fails with its exit status), and so is any registered node
    not resolvable at the root for twice ``idle_timeout`` seconds (``Liveness``: killed or hung
    elsewhere, fenced by the QUIC idle timeout); a lost node resolvable at the root again
    (resumed, its partition healed) is recorded live again (``node_returned``; the work
    failed at its loss stays failed). ``workdir`` is kept (databases
    and logs) unless it was made here."""
    if not settings.persist:
        raise ValueError("serve_persistent needs ScaleSettings(persist=True)")
    owned = workdir is None
    work = Path(tempfile.mkdtemp(prefix="chrysalis-scale-")) if workdir is None else workdir
    stop = asyncio.Event() if stop is None else stop
    group = ProcessGroup(work / "logs")
    try:
        async with _launched(settings, work, group, progress) as tree:
            await _wait_registered(tree.store, settings.nodes, settings.join_timeout)
            tokens = {
                rank: f"{format_address(DatagramAddr.parse(addr))}?authority={pid}"
                for rank, (addr, pid) in sorted(tree.tokens.items())
            }
            processes = {0: os.getpid()} | {
                int(name.rpartition("-")[2]): pid for name, pid in group.named_pids().items()
            }
            ready = {
                "tokens": tokens,
                "processes": dict(sorted(processes.items())),
                "workdir": str(work),
                "ca_dir": str(work / "ca"),
                "namespaces": tree.namespaces or {},
            }
            out.write(f"[root] READY {json.dumps(ready)}\n")
            out.flush()
            root_pid = tree.root.pid.hex()
            # Twice the idle timeout: a leaf whose head was restarted leaves the root's view
            # when the new head joins and comes back only once it noticed its lost link (one
            # idle timeout) and joined again; with one idle timeout of grace such a live leaf
            # was declared lost in most runs of a 5 s timeout (test_scale_persist's restart)
            grace = 2 * settings.idle_timeout
            watch = Liveness(grace=grace)
            policy = RestartPolicy(settings.restart, settings.restart_backoff)
            restarting: dict[int, asyncio.Task[None]] = {}  # rank -> its restart

            def lost(rank: int, reason: str, why: str) -> None:
                pid = tree.tokens[rank][1]
                progress.write(f"[root] rank {rank} ({pid[:8]}) lost: {why}\n")
                tree.store.apply(lambda ledger: ledger.node_lost(pid, time.time(), reason))

            async def restart(rank: int, status: int, delay: float) -> None:
                """Start ``rank`` again after ``delay`` s (more tries while ``policy``
                allows); its node row stays live meanwhile, so its open claims wait for it
                (resumed by its next incarnation) instead of failing."""
                assert tree.relaunch is not None
                pid = tree.tokens[rank][1]
                name = f"rank-{rank}"

                def same_identity(line: str) -> None:
                    again = _split_token(line, name)[1]
                    if again != pid:
                        raise ScaleError(f"came back as {again[:8]}, not {pid[:8]}")

                why = f"exited with status {status}"
                while True:
                    progress.write(
                        f"[root] rank {rank} ({pid[:8]}) {why}: restarting in {delay:.2f} s "
                        f"(restart {policy.used(rank)} of {policy.limit})\n"
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if stop.is_set():
                        return
                    began = time.monotonic()
                    command, space = tree.relaunch(rank)
                    try:
                        _line, process = await group.relaunch(
                            name,
                            command,
                            timeout=settings.join_timeout,
                            netns=space,
                            check=same_identity,
                        )
                    except (ScaleError, ForkServerError, OSError) as exc:
                        first = _restart_error(exc)
                        why = f"restart failed: {first}"
                        next_delay = policy.exited(rank, 1)  # one more abnormal exit
                        if next_delay is None:
                            lost(
                                rank,
                                f"its process (rank {rank}) could not be restarted: {first}",
                                f"{why}, given up after {policy.used(rank)} restarts",
                            )
                            return
                        delay = next_delay
                        continue
                    progress.write(
                        f"[root] rank {rank} ({pid[:8]}) restarted as process {process} in "
                        f"{time.monotonic() - began:.2f} s (restart {policy.used(rank)} of "
                        f"{policy.limit}, {policy.total} in all)\n"
                    )
                    return

            def restart_done(rank: int, task: asyncio.Task[None]) -> None:
                if restarting.get(rank) is task:
                    del restarting[rank]
                if not task.cancelled() and (exc := task.exception()) is not None:
                    progress.write(f"[root] rank {rank} restart failed: {exc!r}\n")

            # PIDs of ranks restarted since the ledger last held them live: their new process
            # comes back by registering (a new incarnation), never as a return of the lost
            # one (it may be resolvable before its registration reached this replica, and a
            # return written then would put back the old incarnation and address)
            restarted: set[str] = set()
            while not stop.is_set():
                down = {tree.tokens[rank][1] for rank in restarting}  # not lost: restarting
                live = [
                    pid for pid in tree.store.live_pids() if pid != root_pid and pid not in down
                ]
                restarted.difference_update(live)
                resolve = tree.root.nameserver.resolve
                seen = {pid for pid in live if isinstance(resolve(Pid.parse(pid)), Found)}
                for pid in watch.observe(live, seen, time.monotonic()):
                    reason = (
                        f"its node left the namespace (not resolvable at the root for {grace:g} s)"
                    )
                    progress.write(f"[root] {pid[:8]} lost: {reason}\n")
                    tree.store.apply(
                        lambda ledger, p=pid, r=reason: ledger.node_lost(p, time.time(), r)
                    )
                gone = [
                    pid
                    for pid in tree.store.lost_pids()
                    if pid != root_pid and pid not in down and pid not in restarted
                ]
                seen = {pid for pid in gone if isinstance(resolve(Pid.parse(pid)), Found)}
                for pid in watch.returned(gone, seen):
                    reason = "it is resolvable at the root again"
                    progress.write(f"[root] {pid[:8]} returned: {reason}\n")
                    with contextlib.suppress(LedgerError):  # stopped meanwhile: no return
                        tree.store.apply(
                            lambda ledger, p=pid, r=reason: ledger.node_returned(p, time.time(), r)
                        )
                for name, status in group.exited():
                    rank = int(name.rpartition("-")[2])
                    delay = policy.exited(rank, status)
                    if delay is not None and rank not in restarting:
                        restarted.add(tree.tokens[rank][1])
                        task = asyncio.create_task(restart(rank, status, delay))
                        task.add_done_callback(functools.partial(restart_done, rank))
                        restarting[rank] = task
                        continue
                    reason = f"its process (rank {rank}) exited with status {status}"
                    why = f"exit status {status}"
                    if used := policy.used(rank):
                        given_up = f", given up after {used} restart{'s' if used > 1 else ''}"
                        reason += given_up
                        why += given_up
                    lost(rank, reason, why)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), _REAP_INTERVAL)
            for task in list(restarting.values()):
                await _cancel(task)
            if policy.total:
                progress.write(f"[root] {policy.total} worker restarts in all\n")
            routed = tree.root.router.statistics()  # forwarding at the root, for the log
            dropped = ", ".join(f"{r.value} {n}" for r, n in routed.dropped.items() if n)
            progress.write(
                f"[root] stopping: forwarded {routed.forwarded} datagrams, dropped "
                f"{dropped or 'none'}\n"
            )
    finally:
        await group.stop()
        if owned:
            shutil.rmtree(work, ignore_errors=True)


# -- command line -------------------------------------------------------------------------------


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The command line (built once per process: the fork server builds it in ``_warm``, so
    forked workers only parse; building costs more than a worker's whole identity)."""
    return _build_parser()


_WORKER_OPTIONS: list[dict[str, argparse.Action]] = []
"""At most one: the ``worker`` command's options by their ``--name`` (``_worker_options``)."""


def _worker_options() -> dict[str, argparse.Action]:
    """The ``worker`` command's options by their ``--name``, from ``_parser()`` (built once
    per process: the fork server builds it in ``_warm``)."""
    if not _WORKER_OPTIONS:
        commands = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
        worker = commands[0].choices["worker"]
        _WORKER_OPTIONS.append(
            {
                name: action
                for action in worker._actions
                for name in action.option_strings
                if name.startswith("--")
            }
        )
    return _WORKER_OPTIONS[0]


def _parse_worker(argv: Sequence[str]) -> argparse.Namespace | None:
    """``argv`` parsed as ``_parser()`` parses a ``worker`` command line written by
    ``_worker_command`` (``--name value`` pairs and ``--lifeline``), with the same types,
    choices, defaults and required options; ``None`` for anything else (another command,
    ``--name=value``, an unknown option, a value argparse would reject or read otherwise),
    which ``main`` then hands to argparse.

    Why: a forked worker pays a copy-on-write page fault for every page of the fork server
    it writes, and argparse's parse touches about 400 of them (about 2 ms of a worker's CPU;
    the same parse takes 0.16 ms in a warm process); this loop touches few."""
    if not argv or argv[0] != "worker":
        return None
    options = _worker_options()
    values: dict[str, object] = {"command": "worker"}
    for action in options.values():
        if action.default is not argparse.SUPPRESS:
            values[action.dest] = action.default
    given: set[str] = set()
    index = 1
    while index < len(argv):
        found = options.get(argv[index])
        if found is None or found.dest in given:
            return None
        action = found
        given.add(action.dest)
        if type(action) is argparse._StoreTrueAction:
            values[action.dest] = True
            index += 1
            continue
        if type(action) is not argparse._StoreAction or action.nargs is not None:
            return None
        if index + 1 >= len(argv) or argv[index + 1].startswith("-"):
            return None
        raw = argv[index + 1]
        try:
            value = raw if action.type is None else action.type(raw)  # type: ignore[operator]
        except (TypeError, ValueError):
            return None
        if action.choices is not None and value not in action.choices:
            return None
        values[action.dest] = value
        index += 2
    if any(action.required and action.dest not in given for action in options.values()):
        return None
    return argparse.Namespace(**values)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m chrysalis.node._scale",
        description="Launch many Chrysalis processes on this host and measure them.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one sweep: launch, converge, echo (spec 7.3)")
    env = os.environ.get
    run.add_argument("--nodes", type=int, default=int(env("CHRYSALIS_SCALE_NODES", "0")) or None)
    run.add_argument(
        "--nodes-per-task", type=int, default=int(env("CHRYSALIS_SCALE_NODES_PER_TASK", "100"))
    )
    run.add_argument(
        "--topology",
        choices=("flat", "task-head"),
        default=env("CHRYSALIS_SCALE_TOPOLOGY", "task-head"),
    )
    run.add_argument(
        "--identity-concurrency",
        type=int,
        default=int(env("CHRYSALIS_SCALE_IDENTITY_CONCURRENCY", "8")),
        help="workers starting at once (8)",
    )
    run.add_argument(
        "--concurrency",
        type=int,
        default=int(env("CHRYSALIS_SCALE_CONCURRENCY", "1")),
        help="echoes in flight (1: latency without queueing)",
    )
    run.add_argument(
        "--start",
        choices=("fork", "exec"),
        default=env("CHRYSALIS_SCALE_START", "fork"),
        help="fork workers from a warm fork server (default) or exec fresh interpreters",
    )
    run.add_argument("--echo-rounds", type=int, default=3)
    run.add_argument("--join-timeout-secs", type=float, default=300.0)
    run.add_argument("--echo-timeout-secs", type=float, default=120.0)
    run.add_argument("--idle-timeout", type=float, default=60.0)
    run.add_argument("--host", default="127.0.0.1", help="IPv4 address UDP carriers bind")
    run.add_argument("--json", type=Path, help="also write the result record to this file")
    run.add_argument(
        "--persist",
        action="store_true",
        help="serve persistent experiments until SIGINT/SIGTERM (see `chrysalis admin`)",
    )
    run.add_argument(
        "--workdir", type=Path, help="CA, sockets, logs and databases (default: a temp dir)"
    )
    run.add_argument(
        "--netns",
        action="store_true",
        help="run each task head's subtree in a network namespace of its own (one machine as "
        "several hosts; needs root and iproute2)",
    )
    run.add_argument(
        "--restart",
        type=int,
        default=0,
        metavar="N",
        help="with --persist: start a worker that exits abnormally again, with its identity "
        "(same PID; it resumes its claims), at most N times per worker (default 0: never)",
    )
    run.add_argument(
        "--restart-backoff",
        type=float,
        default=0.5,
        metavar="SECS",
        help=f"wait before a worker's first restart, doubled for each further one, at most "
        f"{RESTART_BACKOFF_MAX:g} s (0.5)",
    )

    worker = commands.add_parser("worker", help=argparse.SUPPRESS)
    worker.add_argument("--rank", type=int, required=True)
    worker.add_argument("--task", type=int, required=True)
    worker.add_argument("--role", choices=("head", "leaf"), required=True)
    worker.add_argument("--level", type=int, required=True)
    worker.add_argument("--topology", choices=("flat", "task-head"), required=True)
    worker.add_argument("--parent", required=True)
    worker.add_argument("--authority")
    worker.add_argument("--udp")
    worker.add_argument("--unix")
    worker.add_argument("--ca-dir", type=Path, required=True)
    worker.add_argument("--idle-timeout", type=float, default=60.0)
    worker.add_argument("--lifeline", action="store_true", help="exit when stdin closes")
    worker.add_argument("--database", type=Path, help="persistent mode: this node's replica")
    worker.add_argument("--host", help="this host's address (baseline servers bind it)")
    worker.add_argument(
        "--identity-file", type=Path, help="keep the identity here (read it when it exists)"
    )
    return parser


async def _serve_until_signal(settings: ScaleSettings, workdir: Path | None, out: TextIO) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await serve_persistent(settings, workdir=workdir, out=out, stop=stop)


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """``run``: print ``[root] RESULT {json}`` (exit 0) or one error line (exit 1); usage
    errors exit 2. ``worker``: one scale worker (launched by ``run``)."""
    stdout = sys.stdout if out is None else out
    parser = _parser()
    try:
        args = _parse_worker(argv) if argv is not None else None
        if args is None:
            args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        if args.command == "worker":
            return asyncio.run(_worker(args, stdout))
        if args.nodes is None:
            parser.error("run needs --nodes (or CHRYSALIS_SCALE_NODES)")
        settings = ScaleSettings(
            args.nodes,
            args.nodes_per_task,
            args.topology,
            launch_concurrency=args.identity_concurrency,
            echo_concurrency=args.concurrency,
            echo_rounds=args.echo_rounds,
            join_timeout=args.join_timeout_secs,
            echo_timeout=args.echo_timeout_secs,
            idle_timeout=args.idle_timeout,
            host=args.host,
            persist=args.persist,
            start=args.start,
            netns=args.netns,
            restart=args.restart,
            restart_backoff=args.restart_backoff,
        )
        if settings.persist:
            asyncio.run(_serve_until_signal(settings, args.workdir, stdout))
            return 0
        result = asyncio.run(run_scale(settings, workdir=args.workdir))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    except (ScaleError, ValueError, OSError) as exc:
        message = str(exc) or type(exc).__name__
        print(f"chrysalis-scale: error: {message.splitlines()[0]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # anything else is still one line, never a traceback
        first = str(exc).splitlines()[:1]
        message = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
        print(f"chrysalis-scale: error: {message}", file=sys.stderr)
        return 1
    record = result.to_json()
    if args.json is not None:
        args.json.write_text(json.dumps(record))
    stdout.write(f"[root] RESULT {json.dumps(record)}\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
