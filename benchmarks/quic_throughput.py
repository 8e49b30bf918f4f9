"""chrysalis-quic against plain aioquic: bulk stream throughput and small round trips.

What it answers: is the Chrysalis QUIC stack (``AsyncioEndpoint`` with its inline driver, per
engine and per datagram carrier) at least as fast as a plain aioquic program doing the same
work? The plain program is what an aioquic user writes: ``aioquic.asyncio.serve`` and
``aioquic.asyncio.connect`` with a stream handler, the stock asyncio adapter, on UDP loopback.

Two measurements, each between two forked processes (a server and a client):

- ``rtt-*``: a 16-byte ping-pong on one long-lived stream (the client writes 16 bytes and
  reads 16 bytes back; the server echoes). The handshake and a warm-up are excluded; the
  trial's value is the median round trip. Lower is better.
- ``bulk-*``: the client writes ``--bulk-mib`` MiB (100 by default) on one stream in 64 KiB
  writes, each followed by ``drain()``, then ends the stream. The server reads until the end
  and times the transfer from the end of its first read to the end of its last one, so the
  handshake is excluded. The trial's value is MiB per second at the receiver. Higher is better.

Ratios, not times (the machines are shared and noisy; see ``benchmarks/README.md``): the cases
of one kind run in rounds, and each round runs the plain-aioquic baseline first and then every
selected candidate once (``A B C D A B C D ...``). A candidate's ratio is the median over the
rounds of ``candidate / baseline`` of the same round; the table also shows the medians of each
side and the spread of the per-round ratios. The baseline runs over UDP only, because
aioquic's stock asyncio adapter has no other carrier: the Unix-datagram rows compare our Unix
carrier with that same UDP baseline.

Both sides run their stacks' defaults, which differ (the table notes list them): the baseline
uses server-only TLS (the client verifies the server against the same development CA, no
client certificate), no Retry, 1,200-byte datagrams, Reno and 1 MiB flow-control windows; the
candidate authenticates both peers (client certificate, or the client proof on qh3), answers
the first Initial with a Retry and runs ``QuicConfig()`` (1,472-byte datagrams, CUBIC, 64 MiB
windows, 1 MiB unacknowledged per stream) with GSO/GRO where the kernel has them.

Usage::

    .venv/bin/python benchmarks/quic_throughput.py                 # full run, 3-4 minutes
    .venv/bin/python benchmarks/quic_throughput.py --quick         # 16 MiB bulk, fewer pings
    .venv/bin/python benchmarks/quic_throughput.py --smoke         # seconds; proves it runs
    .venv/bin/python benchmarks/quic_throughput.py --case rtt-qh3-udp --case bulk-qh3-udp
    .venv/bin/python benchmarks/quic_throughput.py --json out.json   # every trial as JSON
    .venv/bin/python benchmarks/quic_throughput.py --profile prof/   # cProfile the clients
    .venv/bin/python benchmarks/quic_throughput.py --like-for-like   # baseline's packet settings
    .venv/bin/python benchmarks/quic_throughput.py --syscalls --json out.json  # + perf counts
    .venv/bin/python benchmarks/quic_throughput.py --path-calls --json out.json  # see below
    .venv/bin/python benchmarks/quic_throughput.py --path-calls --path-dump dump/  # + names
    .venv/bin/python benchmarks/quic_throughput.py --write-readme  # refresh the package README

The table goes to stdout as Markdown, progress to stderr. Linux only (forked children). Every
wait has a timeout and a child that overstays is terminated, so a run always ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from aioquic.asyncio.client import connect as aioquic_connect
from aioquic.asyncio.server import serve as aioquic_serve
from aioquic.quic.configuration import QuicConfiguration

from chrysalis.core import DatagramAddr
from chrysalis.datagram import DatagramSocket, UdpSocket, UnixDatagramSocket, udp_gso_supported
from chrysalis.quic import (
    ALPN,
    AsyncioEndpoint,
    AsyncioStream,
    DevelopmentCA,
    Identity,
    QuicConfig,
)
from chrysalis.quic._engines.base import EngineFactory

ROOT: Final = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks._common`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    BenchmarkError,
    Child,
    ChildLink,
    add_run_arguments,
    machine_facts,
    median,
    partial_run_warning,
    write_json,
    write_readme_section,
)

__all__ = [
    "CASES",
    "CaseSpec",
    "ClientOutcome",
    "Config",
    "Row",
    "Sample",
    "ServerOutcome",
    "main",
    "markdown_table",
    "reduce_trial",
    "report",
    "write_readme_section",
]

T = TypeVar("T")
MESSAGE: Final = b"0123456789abcdef"
CHUNK: Final = 64 * 1024
MIB: Final = 1024 * 1024
README: Final = ROOT / "packages" / "chrysalis-quic" / "README.md"
README_SECTION: Final = "## Benchmark"
RTT: Final = "rtt"
BULK: Final = "bulk"
PLAIN: Final = "plain-aioquic-udp"


# --------------------------------------------------------------------------------------------
# What runs


@dataclass(frozen=True, slots=True)
class CaseSpec:
    """One table row: a candidate (``engine`` on ``carrier``) measured on ``kind`` against
    plain aioquic over UDP.

    ``target`` bounds the median per-round ratio candidate/baseline: a maximum for round trips
    (lower is better), a minimum for throughput (higher is better); ``None`` is informational.
    """

    name: str
    kind: str  # RTT or BULK
    engine: str  # "aioquic" or "qh3"
    carrier: str  # "udp" or "unix"
    target: float | None

    @property
    def lower_is_better(self) -> bool:
        """Round trips: smaller is better; throughput: larger is better."""
        return self.kind == RTT


CASES: Final = (
    CaseSpec("rtt-aioquic-udp", RTT, "aioquic", "udp", 0.8),
    CaseSpec("rtt-aioquic-unix", RTT, "aioquic", "unix", 0.8),
    CaseSpec("rtt-qh3-udp", RTT, "qh3", "udp", 0.45),
    CaseSpec("bulk-aioquic-udp", BULK, "aioquic", "udp", 1.0),
    CaseSpec("bulk-aioquic-unix", BULK, "aioquic", "unix", 1.0),
    CaseSpec("bulk-qh3-udp", BULK, "qh3", "udp", None),
)
_BY_NAME: Final = {spec.name: spec for spec in CASES}


@dataclass(frozen=True, slots=True)
class Config:
    """How much one run measures. Each kind stops early, after a whole round, once its
    budget is spent (at least one round always runs)."""

    mode: str
    rtt_rounds: int
    pings: int
    warmup: int
    bulk_rounds: int
    bulk_bytes: int
    rtt_budget_s: float
    bulk_budget_s: float
    like_for_like: bool = False

    def trial_timeout_s(self, kind: str) -> float:
        """The longest one trial may take before it is declared hung (generous: >= 1 MiB/s
        for bulk, >= 20 ms per round trip, plus start-up)."""
        if kind == BULK:
            return 30.0 + self.bulk_bytes / MIB
        return 30.0 + 0.02 * (self.pings + self.warmup)

    def __post_init__(self) -> None:
        for name in ("rtt_rounds", "pings", "bulk_rounds", "bulk_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"Config.{name} must be at least 1")
        if self.warmup < 0 or self.bulk_bytes > 1024 * MIB:
            raise ValueError("Config.warmup must be >= 0 and bulk_bytes at most 1 GiB")


FULL: Final = Config("full", 9, 1500, 150, 5, 100 * MIB, 60.0, 120.0)
QUICK: Final = Config("quick", 5, 1000, 100, 3, 16 * MIB, 25.0, 45.0)
SMOKE: Final = Config("smoke", 1, 50, 10, 1, 1 * MIB, 10.0, 10.0)


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a round: the plain baseline (``engine == "plain"``) or a candidate."""

    label: str
    engine: str  # "plain", "aioquic" or "qh3"
    carrier: str  # "udp" or "unix"
    like_for_like: bool = False  # candidate only: the baseline's datagram size, Reno, no GSO


# --------------------------------------------------------------------------------------------
# Measurements


@dataclass(frozen=True, slots=True)
class Sample:
    """One trial of one side: ``value`` is the median round trip in microseconds (``rtt``)
    or the receiver's MiB per second (``bulk``); ``detail`` holds the raw figures."""

    value: float
    detail: dict[str, float | int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Row:
    """Baseline and candidate samples of one case, paired by round (index)."""

    spec: CaseSpec
    baseline: tuple[Sample, ...]
    candidate: tuple[Sample, ...]

    @property
    def measured(self) -> bool:
        """Whether at least one round produced both sides."""
        return bool(self.baseline) and bool(self.candidate)

    @property
    def pair_ratios(self) -> list[float]:
        """``candidate / baseline`` for each round."""
        return [
            c.value / b.value if b.value > 0 else math.inf
            for b, c in zip(self.baseline, self.candidate, strict=False)
        ]

    @property
    def ratio(self) -> float:
        """The headline: the median of the per-round ratios."""
        return median(self.pair_ratios)

    @property
    def met(self) -> bool | None:
        """Whether the ratio is within the target (``None`` without one)."""
        if self.spec.target is None or not self.measured:
            return None
        if self.spec.lower_is_better:
            return self.ratio <= self.spec.target
        return self.ratio >= self.spec.target

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record: medians, ratios and every trial."""
        record: dict[str, Any] = {
            "case": self.spec.name,
            "kind": self.spec.kind,
            "engine": self.spec.engine,
            "carrier": self.spec.carrier,
            "unit": "us" if self.spec.kind == RTT else "MiB/s",
            "lower_is_better": self.spec.lower_is_better,
            "target": self.spec.target,
            "measured": self.measured,
        }
        if self.measured:
            record.update(
                baseline_median=median([s.value for s in self.baseline]),
                candidate_median=median([s.value for s in self.candidate]),
                ratio=self.ratio,
                pair_ratios=self.pair_ratios,
                met=self.met,
                baseline=[{"value": s.value, **s.detail} for s in self.baseline],
                candidate=[{"value": s.value, **s.detail} for s in self.candidate],
            )
        return record


@dataclass(frozen=True, slots=True)
class ServerOutcome:
    """What the server of a trial saw: ``received`` bytes in all; ``counted`` of them arrived
    during the ``seconds`` between the end of its first read and the end of its last; it used
    ``cpu_s`` of CPU (user + system) from its first read to the end of the stream."""

    received: int
    counted: int
    seconds: float
    cpu_s: float
    syscalls: dict[str, int] = field(default_factory=dict)
    path: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClientOutcome:
    """What the client of a trial did: the timed round trips (seconds; empty for bulk), the
    bytes it uploaded (0 for round trips) and the CPU it used in the timed part."""

    rtts: tuple[float, ...]
    sent: int
    cpu_s: float
    syscalls: dict[str, int] = field(default_factory=dict)
    path: dict[str, float] = field(default_factory=dict)


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[int(fraction * (len(ordered) - 1))]


def reduce_trial(kind: str, client: object, server: object, config: Config) -> Sample:
    """Check the two outcomes of a trial and reduce them to its :class:`Sample`."""
    if not isinstance(client, ClientOutcome) or not isinstance(server, ServerOutcome):
        raise BenchmarkError(f"malformed outcomes {client!r:.80} / {server!r:.80}")
    if kind == RTT:
        rtts = client.rtts
        if len(rtts) != config.pings or not all(math.isfinite(r) and r > 0 for r in rtts):
            raise BenchmarkError(f"malformed round trips ({len(rtts)} values)")
        echoed = (config.warmup + config.pings) * len(MESSAGE)
        if server.received != echoed:
            raise BenchmarkError(f"the server echoed {server.received} bytes, not {echoed}")
        detail: dict[str, float | int] = {
            "pings": len(rtts),
            "p90_us": _percentile(rtts, 0.9) * 1e6,
            "min_us": min(rtts) * 1e6,
            "client_cpu_us_per_rtt": client.cpu_s / len(rtts) * 1e6,
            "server_cpu_us_per_rtt": server.cpu_s / (config.warmup + config.pings) * 1e6,
        }
        for role, counts in (("client", client.syscalls), ("server", server.syscalls)):
            for name, count in counts.items():
                detail[f"{role}_{name}_per_rtt"] = count / (config.warmup + config.pings)
        for role, path in (("client", client.path), ("server", server.path)):
            for name, value in path.items():
                detail[f"{role}_{name}"] = value
        return Sample(median(rtts) * 1e6, detail)
    if client.sent != config.bulk_bytes or server.received != client.sent:
        raise BenchmarkError(f"the receiver got {server.received} bytes of {client.sent}")
    if server.counted <= 0 or server.seconds <= 0:
        raise BenchmarkError("the transfer arrived in a single read: nothing to time")
    mib = server.received / MIB
    return Sample(
        server.counted / server.seconds / MIB,
        {
            "bytes": server.received,
            "counted": server.counted,
            "seconds": server.seconds,
            "client_cpu_s_per_mib": client.cpu_s / mib,
            "server_cpu_s_per_mib": server.cpu_s / mib,
        },
    )


# --------------------------------------------------------------------------------------------
# System calls (``--syscalls``): counted by ``perf stat`` on the kernel's syscall tracepoints


SYSCALLS: Final = (
    "epoll_wait",
    "epoll_pwait",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "futex",
    "timerfd_settime",
)
_PERF_READY_S: Final = 0.3  # perf attaches in milliseconds; the warm-up waits this long
_counted_syscalls: tuple[str, ...] = ()  # set by ``main`` before any fork (children inherit)


class _SyscallCounter:
    """``perf stat`` attached to this process from ``start`` to ``stop``: the count of every
    system call (``all``) and of each name in ``names``. Why perf: the kernel's tracepoints
    cost nothing measurable per call (``strace`` slows every call and would change the very
    timing, delayed ACKs included, that decides how many calls a round trip makes)."""

    def __init__(self, names: Sequence[str]) -> None:
        self._names = tuple(names)
        self._proc: subprocess.Popen[bytes] | None = None
        self._out = ""

    def start(self) -> None:
        perf = shutil.which("perf")
        if perf is None:
            raise BenchmarkError("--syscalls needs perf on PATH")
        fd, self._out = tempfile.mkstemp(prefix="quic-syscalls-", suffix=".csv")
        os.close(fd)
        events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{n}" for n in self._names]
        self._proc = subprocess.Popen(
            [perf, "stat", "-x,", "-o", self._out, "-e", ",".join(events), "-p", str(os.getpid())],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> dict[str, int]:
        """Stop perf; the counts (``all`` and each name perf could count)."""
        proc = self._proc
        if proc is None:
            return {}
        self._proc = None
        try:
            proc.send_signal(signal.SIGINT)
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        counts: dict[str, int] = {}
        try:
            with open(self._out, encoding="utf-8") as lines:
                for line in lines:
                    fields = line.strip().split(",")
                    if len(fields) > 2 and fields[0].isdigit():
                        event = fields[2]
                        if event == "raw_syscalls:sys_enter":
                            counts["all"] = int(fields[0])
                        else:
                            counts[event.removeprefix("syscalls:sys_enter_")] = int(fields[0])
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self._out)
        return counts


class _PathCounter:
    """``--path-calls``: counts the calls (Python functions and builtins, ``sys.setprofile``)
    from the receipt of a datagram to the next send, per request/response step, and all calls.

    Why: both processes of a ping-pong wait only on that path (receive, answer, send); work
    after the send overlaps the peer's. The hooks wrap the receive and send of both stacks
    (chrysalis' carriers, aioquic's protocol and asyncio's datagram transport) in this
    forked child only. The profiler slows everything several times, so timers (delayed
    ACKs) fire where they would not: compare calls, never the times of such a run.
    """

    def __init__(self, dump: Path | None = None) -> None:
        self.calls = 0
        self.mark: int | None = None
        self.paths: list[int] = []
        # ``--path-dump``: the names of the calls of every path (bounded: at most
        # ``_PATH_DUMP_LIMIT`` paths of at most ``_PATH_DUMP_CALLS`` names each).
        self.dump = dump
        self.names: list[str] = []
        self.named: list[list[str]] = []

    def profile(self, frame: object, event: str, arg: object) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1
            if self.dump is not None and self.mark is not None:
                names = self.names
                if len(names) < _PATH_DUMP_CALLS:
                    if event == "call":
                        code = frame.f_code  # type: ignore[attr-defined]
                        names.append(f"{Path(code.co_filename).name}:{code.co_name}")
                    else:
                        names.append(f"C:{getattr(arg, '__qualname__', arg)}")

    def received(self) -> None:
        if self.mark is None:
            self.mark = self.calls
            self.names = []

    def sending(self) -> None:
        if self.mark is not None:
            self.paths.append(self.calls - self.mark)
            self.mark = None
            if self.dump is not None and len(self.named) < _PATH_DUMP_LIMIT:
                self.named.append(self.names)

    def install(self) -> None:
        from asyncio.selector_events import _SelectorDatagramTransport  # type: ignore[attr-defined]

        from aioquic.asyncio.protocol import QuicConnectionProtocol

        def after(fn: Callable[..., Any], hook: Callable[[], None]) -> Callable[..., Any]:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                result = fn(*args, **kwargs)
                if result:  # a datagram (chrysalis: their count)
                    hook()
                return result

            return wrapped

        def before(fn: Callable[..., Any], hook: Callable[[], None]) -> Callable[..., Any]:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                hook()
                return fn(*args, **kwargs)

            return wrapped

        for cls in (UdpSocket, UnixDatagramSocket):
            cls.try_recv = after(cls.try_recv, self.received)  # type: ignore[method-assign]
            cls.try_send_to = before(cls.try_send_to, self.sending)  # type: ignore[method-assign]
        protocol: Any = QuicConnectionProtocol
        protocol.datagram_received = before(protocol.datagram_received, self.received)
        transport: Any = _SelectorDatagramTransport
        transport.sendto = before(transport.sendto, self.sending)
        sys.setprofile(self.profile)

    def stop(self, messages: int) -> dict[str, float]:
        sys.setprofile(None)
        paths = sorted(self.paths[len(self.paths) // 5 :])  # after the warm-up
        if not paths:
            return {}
        if self.dump is not None:
            named = sorted(self.named[len(self.named) // 5 :], key=len)
            if named:
                # The median path by length, one call a line (``C:`` marks a builtin).
                out = self.dump / f"path-calls.{os.getpid()}.txt"
                out.write_text("\n".join(named[len(named) // 2]) + "\n")
        return {"path_calls": median([float(p) for p in paths]), "calls": self.calls / messages}


_path_calls = False  # set by ``main`` before any fork (children inherit)
_path_dump: Path | None = None  # ``--path-dump``, likewise
_PATH_DUMP_LIMIT = 4096  # paths kept for ``--path-dump``
_PATH_DUMP_CALLS = 4096  # names kept per path


def _path_counter() -> _PathCounter | None:
    if not _path_calls:
        return None
    counter = _PathCounter(_path_dump)
    counter.install()
    return counter


def _syscall_counter() -> _SyscallCounter | None:
    if not _counted_syscalls:
        return None
    counter = _SyscallCounter(_counted_syscalls)
    counter.start()
    return counter


# --------------------------------------------------------------------------------------------
# The two processes: shared protocol code


class _Stream:
    """The two operations a trial needs, over an ``AsyncioStream`` or an aioquic
    ``StreamReader``/``StreamWriter`` pair, so both sides run the very same loops."""

    __slots__ = ("drain", "read", "readexactly", "write", "write_eof")

    def __init__(
        self,
        read: Callable[[int], Awaitable[bytes]],
        readexactly: Callable[[int], Awaitable[bytes]],
        write: Callable[[bytes], None],
        drain: Callable[[], Awaitable[None]],
        write_eof: Callable[[], None],
    ) -> None:
        self.read = read
        self.readexactly = readexactly
        self.write = write
        self.drain = drain
        self.write_eof = write_eof


def _ours(stream: AsyncioStream) -> _Stream:
    return _Stream(stream.read, stream.readexactly, stream.write, stream.drain, stream.write_eof)


def _theirs(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Stream:
    return _Stream(reader.read, reader.readexactly, writer.write, writer.drain, writer.write_eof)


async def _serve_stream(stream: _Stream, kind: str) -> ServerOutcome:
    """The server's half of a trial. ``rtt``: echo until the end of the stream. ``bulk``:
    count bytes until the end, timing from the end of the first read to the end of the last,
    then answer ``b"ok"``."""
    clock, cpu = time.perf_counter, time.process_time
    received = counted = 0
    first = last = cpu_start = 0.0
    syscalls = _syscall_counter() if kind == RTT else None
    if syscalls is not None:
        await asyncio.sleep(_PERF_READY_S)  # let perf attach (the first ping waits, untimed)
    path = _path_counter() if kind == RTT else None
    while True:
        data = await stream.read(CHUNK)
        if not data:
            break
        if received == 0:
            cpu_start = cpu()
        if kind == RTT:
            stream.write(data)
            received += len(data)
            continue
        last = clock()
        if received == 0:
            first = last
        else:
            counted += len(data)
        received += len(data)
    cpu_s = cpu() - cpu_start
    counts = {} if syscalls is None else syscalls.stop()
    paths = {} if path is None else path.stop(max(1, received // len(MESSAGE)))
    if kind == BULK:
        stream.write(b"ok")
    stream.write_eof()
    return ServerOutcome(received, counted, last - first, cpu_s, counts, paths)


async def _run_client(stream: _Stream, kind: str, config: Config) -> ClientOutcome:
    """The client's half: the ping-pong or the upload. Ends the stream and waits, bounded,
    for the server's end."""
    clock, cpu = time.perf_counter, time.process_time
    if kind == RTT:
        size = len(MESSAGE)
        syscalls = _syscall_counter()
        if syscalls is not None:
            await asyncio.sleep(_PERF_READY_S)  # let perf attach before the first ping
        path = _path_counter()
        for _ in range(config.warmup):
            stream.write(MESSAGE)
            await stream.readexactly(size)
        rtts: list[float] = []
        cpu_start = cpu()
        for _ in range(config.pings):
            start = clock()
            stream.write(MESSAGE)
            await stream.readexactly(size)
            rtts.append(clock() - start)
        counts = {} if syscalls is None else syscalls.stop()
        paths = {} if path is None else path.stop(config.warmup + config.pings)
        outcome = ClientOutcome(tuple(rtts), 0, cpu() - cpu_start, counts, paths)
        stream.write_eof()
        tail = await asyncio.wait_for(stream.read(CHUNK), 10)
        if tail:
            raise BenchmarkError(f"unexpected echo after the last ping: {tail!r:.60}")
        return outcome
    chunk = os.urandom(CHUNK)
    sent = 0
    cpu_start = cpu()
    while sent < config.bulk_bytes:
        piece = chunk if config.bulk_bytes - sent >= CHUNK else chunk[: config.bulk_bytes - sent]
        stream.write(piece)
        await stream.drain()
        sent += len(piece)
    stream.write_eof()
    answer = await asyncio.wait_for(stream.readexactly(2), config.trial_timeout_s(BULK))
    if answer != b"ok":
        raise BenchmarkError(f"the server answered {answer!r}")
    return ClientOutcome((), sent, cpu() - cpu_start)


# --------------------------------------------------------------------------------------------
# The plain aioquic baseline


def _plain_server_config(identity: Identity) -> QuicConfiguration:
    config = QuicConfiguration(is_client=False, alpn_protocols=[ALPN])
    config.certificate = identity.leaf
    config.certificate_chain = list(identity.chain[1:])
    config.private_key = identity.private_key
    return config


def _plain_client_config(identity: Identity, server: Identity) -> QuicConfiguration:
    config = QuicConfiguration(is_client=True, alpn_protocols=[ALPN])
    config.server_name = server.server_name
    config.load_verify_locations(cadata=identity.roots_pem())
    return config


async def _plain_server(link: ChildLink, identity: Identity, kind: str) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[ServerOutcome] = loop.create_future()
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            outcome = await _serve_stream(_theirs(reader, writer), kind)
        except BaseException as exc:
            if not done.done():
                done.set_exception(exc)
            raise
        if not done.done():
            done.set_result(outcome)

    def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = loop.create_task(handle(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await aioquic_serve(
        "127.0.0.1", 0, configuration=_plain_server_config(identity), stream_handler=on_stream
    )
    try:
        transport = server._transport
        assert transport is not None
        port = int(transport.get_extra_info("sockname")[1])
        link.send(str(DatagramAddr.udp("127.0.0.1", port)))
        link.send(await asyncio.wait_for(done, 600))
        await asyncio.sleep(0.05)  # let the last packets (FIN, "ok") leave
    finally:
        server.close()


async def _plain_client(
    identity: Identity, server: Identity, address: str, kind: str, config: Config
) -> ClientOutcome:
    host, port = DatagramAddr.parse(address).to_sockaddr()[:2]
    async with aioquic_connect(
        host, port, configuration=_plain_client_config(identity, server)
    ) as protocol:
        reader, writer = await asyncio.wait_for(protocol.create_stream(), 10)
        return await _run_client(_theirs(reader, writer), kind, config)


# --------------------------------------------------------------------------------------------
# The chrysalis candidate


def _engine(name: str) -> EngineFactory | None:
    if name == "qh3":
        from chrysalis.quic import Qh3Engine

        return Qh3Engine
    return None  # the endpoint's default: aioquic


def _socket(side: Side, path: str) -> DatagramSocket:
    if side.carrier == "unix":
        return UnixDatagramSocket.bind(path)
    offload = False if side.like_for_like else None  # None: GSO/GRO where the kernel has them
    return UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gso=offload, gro=offload)


def _quic_config(side: Side) -> QuicConfig | None:
    if side.like_for_like:
        return QuicConfig(max_udp_payload=1200, congestion_control="reno")
    return None  # the endpoint's defaults


async def _ours_server(
    link: ChildLink, identity: Identity, side: Side, kind: str, path: str
) -> None:
    sock = _socket(side, path)
    async with AsyncioEndpoint.spawn_duplex(
        identity, sock, config=_quic_config(side), engine=_engine(side.engine)
    ) as ep:
        link.send(str(sock.local_addr))
        _, stream = await asyncio.wait_for(ep.accept(), 30)
        link.send(await _serve_stream(_ours(stream), kind))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stream.wait_closed(), 5)


async def _ours_client(
    identity: Identity,
    server: Identity,
    address: str,
    side: Side,
    kind: str,
    config: Config,
    path: str,
) -> ClientOutcome:
    sock = _socket(side, path)
    async with AsyncioEndpoint.spawn_duplex(
        identity, sock, config=_quic_config(side), engine=_engine(side.engine)
    ) as ep:
        conn = await asyncio.wait_for(ep.connect(server.pid, DatagramAddr.parse(address)), 10)
        stream = await asyncio.wait_for(conn.open_stream(), 10)
        return await _run_client(_ours(stream), kind, config)


# --------------------------------------------------------------------------------------------
# Child entry points (forked; arguments are inherited, not pickled)


def _profiled(profile: str | None, run: Callable[[], T]) -> T:
    if profile is None:
        return run()
    profiler = cProfile.Profile()
    try:
        result: T = profiler.runcall(run)
        return result
    finally:
        profiler.dump_stats(profile)


def server_main(
    link: ChildLink, identity: Identity, side: Side, kind: str, path: str, profile: str | None
) -> None:
    """Serve one trial: report the address, then the server's outcome."""

    def run() -> None:
        if side.engine == "plain":
            asyncio.run(_plain_server(link, identity, kind))
        else:
            asyncio.run(_ours_server(link, identity, side, kind, path))

    _profiled(profile, run)


def client_main(
    link: ChildLink,
    identity: Identity,
    server: Identity,
    address: str,
    side: Side,
    kind: str,
    config: Config,
    path: str,
    profile: str | None,
) -> None:
    """Run one trial's client and report its outcome."""

    def run() -> ClientOutcome:
        if side.engine == "plain":
            return asyncio.run(_plain_client(identity, server, address, kind, config))
        return asyncio.run(_ours_client(identity, server, address, side, kind, config, path))

    link.send(_profiled(profile, run))


# --------------------------------------------------------------------------------------------
# The parent: trials and rounds


class Bench:
    """Forks the two processes of each trial, pinned to different CPUs unless ``pin`` is
    false, and owns the temporary directory of the Unix-datagram socket paths."""

    def __init__(
        self, config: Config, *, pin: bool, profile_dir: Path | None, profile_role: str
    ) -> None:
        self.config = config
        self.ca = DevelopmentCA.create()
        self._dir = tempfile.mkdtemp(prefix="chrysalis-quicbench-")
        self._serial = 0
        cpus = sorted(os.sched_getaffinity(0))
        self._cpus: tuple[int | None, int | None] = (
            (cpus[0], cpus[1]) if pin and len(cpus) >= 2 else (None, None)
        )
        self._profile_dir = profile_dir
        self._profile_role = profile_role

    def close(self) -> None:
        """Remove the socket directory."""
        shutil.rmtree(self._dir, ignore_errors=True)

    def _profile(self, role: str, side: Side, kind: str) -> str | None:
        if self._profile_dir is None or role != self._profile_role:
            return None
        self._profile_dir.mkdir(parents=True, exist_ok=True)
        name = f"{self._serial:03d}-{kind}-{side.engine}-{side.carrier}-{role}.prof"
        return str(self._profile_dir / name)

    def trial(self, side: Side, kind: str) -> Sample:
        """One trial of ``side``: fork the server, then the client; collect both outcomes."""
        self._serial += 1
        timeout = self.config.trial_timeout_s(kind)
        server_id, client_id = self.ca.issue(), self.ca.issue()
        tag = f"{side.label}-{kind}-{self._serial}"
        server_path = os.path.join(self._dir, f"s{self._serial}.sock")
        client_path = os.path.join(self._dir, f"c{self._serial}.sock")
        server = Child(
            server_main,
            server_id,
            side,
            kind,
            server_path,
            self._profile("server", side, kind),
            name=f"server-{tag}",
            cpu=self._cpus[0],
        )
        client: Child | None = None
        try:
            server.start()
            address = server.receive(30.0)
            if not isinstance(address, str):
                raise BenchmarkError(f"server-{tag}: malformed address {address!r:.80}")
            client = Child(
                client_main,
                client_id,
                server_id,
                address,
                side,
                kind,
                self.config,
                client_path,
                self._profile("client", side, kind),
                name=f"client-{tag}",
                cpu=self._cpus[1],
            )
            client.start()
            outcome = client.receive(timeout)
            served = server.receive(timeout)
        finally:
            for child in (client, server):
                if child is not None:
                    child.stop(10.0)
            for path in (server_path, client_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        return reduce_trial(kind, outcome, served, self.config)


def _sides(specs: Sequence[CaseSpec], like_for_like: bool) -> list[Side]:
    return [Side(PLAIN, "plain", "udp")] + [
        Side(spec.name, spec.engine, spec.carrier, like_for_like) for spec in specs
    ]


def run_kind(bench: Bench, kind: str, specs: Sequence[CaseSpec]) -> list[Row]:
    """The rounds of one kind: baseline, then every candidate, per round (``A B C ...``),
    until the rounds or the budget run out (after a whole round)."""
    config = bench.config
    rounds = config.rtt_rounds if kind == RTT else config.bulk_rounds
    budget = config.rtt_budget_s if kind == RTT else config.bulk_budget_s
    sides = _sides(specs, config.like_for_like)
    samples: list[list[Sample]] = [[] for _ in sides]
    start = time.monotonic()
    unit = "us" if kind == RTT else "MiB/s"
    for index in range(rounds):
        for side, record in zip(sides, samples, strict=True):
            sample = bench.trial(side, kind)
            record.append(sample)
            calls = ""
            if "client_all_per_rtt" in sample.detail:
                calls = " syscalls/rtt " + " ".join(
                    f"{role} {sample.detail.get(f'{role}_all_per_rtt', 0.0):.2f}"
                    for role in ("client", "server")
                )
            if "client_path_calls" in sample.detail:
                calls += " path calls " + " ".join(
                    f"{role} {sample.detail.get(f'{role}_path_calls', 0.0):.0f}"
                    f"/{sample.detail.get(f'{role}_calls', 0.0):.0f}"
                    for role in ("client", "server")
                )
            print(
                f"{kind} round {index + 1}/{rounds} {side.label:>18}: {sample.value:9.1f} {unit}"
                + calls,
                file=sys.stderr,
                flush=True,
            )
        if time.monotonic() - start >= budget:
            break
    baseline = tuple(samples[0])
    return [
        Row(spec, baseline, tuple(record)) for spec, record in zip(specs, samples[1:], strict=True)
    ]


def run_cases(bench: Bench, names: Sequence[str]) -> list[Row]:
    """Every selected case (all when ``names`` is empty), in table order."""
    unknown = sorted(set(names) - set(_BY_NAME))
    if unknown:
        raise BenchmarkError(f"unknown case(s) {', '.join(unknown)}")
    selected = [spec for spec in CASES if not names or spec.name in names]
    rows: dict[str, Row] = {}
    for kind in (RTT, BULK):
        specs = [spec for spec in selected if spec.kind == kind]
        if specs:
            rows.update((row.spec.name, row) for row in run_kind(bench, kind, specs))
    return [rows[spec.name] for spec in selected]


# --------------------------------------------------------------------------------------------
# Output


def _value(kind: str, value: float) -> str:
    return f"{value:,.0f} µs" if kind == RTT else f"{value:.1f} MiB/s"


def markdown_table(rows: Sequence[Row]) -> str:
    """One row per case: medians of each side, the median per-round ratio, its spread, the
    target and the verdict."""
    lines = [
        "| case | metric | plain aioquic, UDP (median) | chrysalis (median) "
        "| ratio (median) | ratio min-max | target | met? | rounds |",
        "|---|---|---:|---:|---:|---:|---:|:---:|---:|",
    ]
    for row in rows:
        spec = row.spec
        metric = "round trip, 16 B" if spec.kind == RTT else "bulk, one stream"
        target = "-"
        if spec.target is not None:
            target = f"<= {spec.target:g}x" if spec.lower_is_better else f">= {spec.target:g}x"
        if not row.measured:
            lines.append(f"| {spec.name} | {metric} | - | - | - | - | {target} | n/a | 0 |")
            continue
        ratios = row.pair_ratios
        met = {True: "yes", False: "**no**", None: "-"}[row.met]
        lines.append(
            f"| {spec.name} | {metric} "
            f"| {_value(spec.kind, median([s.value for s in row.baseline]))} "
            f"| {_value(spec.kind, median([s.value for s in row.candidate]))} "
            f"| {row.ratio:.2f}x | {min(ratios):.2f}-{max(ratios):.2f} | {target} | {met} "
            f"| {len(ratios)} |"
        )
    return "\n".join(lines)


def report(rows: Sequence[Row], meta: dict[str, Any]) -> str:
    """The Markdown ``## Benchmark`` section: how it was run, the table, the notes."""
    config = meta["config"]
    pinning = ", pinned to different CPUs" if meta["pinned"] else ", not pinned"
    lines = [
        README_SECTION,
        "",
        f"Measured {meta['date']} on {meta['machine']} with `{meta['command']}` "
        f"(Python {meta['python']}, aioquic {meta['aioquic']}, qh3 {meta['qh3']}, "
        f"Linux {meta['kernel']}; {meta['elapsed_s']} s in all).",
        "",
        f"Two forked processes per trial (server and client{pinning}), asyncio on both "
        "sides, loopback. **Round trip**: a 16-byte ping-pong on one "
        f"long-lived stream, {config['pings']:,} round trips after {config['warmup']} warm-up "
        "ones; a trial's value is its median round trip (lower is better). **Bulk**: "
        f"{config['bulk_bytes'] // MIB} MiB on one stream in 64 KiB writes with `drain()`, "
        "timed at the receiver from its first read to its last (higher is better). Each "
        "round runs plain aioquic first, then every candidate of that kind; the ratio is the "
        "median over rounds of candidate / baseline of the same round. The targets bound "
        "that ratio.",
        "",
        markdown_table(rows),
        "",
    ]
    lines += partial_run_warning(meta["mode"])
    lines += [
        "- Baseline: `aioquic.asyncio.serve` / `connect` with a stream handler (the stock "
        "asyncio adapter), over UDP only, since the stock adapter has no other carrier; the "
        "`-unix` rows compare our Unix-datagram carrier with the same UDP baseline. It runs "
        "aioquic's defaults: server-only TLS (the client verifies the server's certificate "
        "from the same development CA and presents none), no Retry, 1,200-byte datagrams, "
        "Reno, 1 MiB flow-control windows, and a send buffer without bound (its `drain()` "
        "never waits).",
        "- Chrysalis: `AsyncioEndpoint.spawn_duplex` on both sides with the inline driver: "
        "mutual authentication (client certificate on aioquic, the client proof on qh3), a "
        "Retry before any server state, 64 MiB windows, at most 1 MiB unacknowledged per "
        "stream, and "
        + (
            "(`--like-for-like`) the baseline's 1,200-byte datagrams and Reno, UDP without GSO/GRO."
            if config["like_for_like"]
            else "the other `QuicConfig()` defaults: 1,472-byte datagrams, CUBIC; UDP uses "
            f"GSO/GRO ({'available' if meta['gso'] else 'not available'} on this kernel)."
        ),
        "- `-qh3-` rows run the qh3 engine on both ends; `bulk-qh3-udp` has no target "
        "(informational).",
    ]
    return "\n".join(lines) + "\n"


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "absent"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_run_arguments(
        parser,
        quick="16 MiB bulk, fewer round trips",
        smoke="one tiny round: proves it runs",
        json_help="also write every trial as JSON here",
        cases=[spec.name for spec in CASES],
        readme="replace the '## Benchmark' section of packages/chrysalis-quic/README.md",
    )
    parser.add_argument("--bulk-mib", type=int, help="bulk transfer size in MiB (1..1024)")
    parser.add_argument(
        "--like-for-like",
        action="store_true",
        help="candidates use the baseline's 1,200-byte datagrams and Reno, UDP without GSO/GRO",
    )
    parser.add_argument(
        "--pin", action="store_true", help="pin the server and the client to different CPUs"
    )
    parser.add_argument(
        "--syscalls",
        action="store_true",
        help="round trips: count system calls per round trip and side with perf (JSON detail)",
    )
    parser.add_argument(
        "--path-calls",
        action="store_true",
        help="round trips: count calls from each datagram received to the next send (slow; "
        "JSON detail; compare the counts, not the times)",
    )
    parser.add_argument(
        "--path-dump",
        type=Path,
        help="with --path-calls: write each process's median path, one call name a line, "
        "to DIR/path-calls.PID.txt",
    )
    parser.add_argument("--profile", type=Path, help="cProfile one role of every trial here")
    parser.add_argument(
        "--profile-role", choices=("client", "server"), default="client", help="with --profile"
    )
    args = parser.parse_args(argv)
    config = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.bulk_mib is not None:
        if not 1 <= args.bulk_mib <= 1024:
            parser.error("--bulk-mib must be in 1..1024")
        config = dataclasses.replace(config, bulk_bytes=args.bulk_mib * MIB)
    if args.like_for_like:
        config = dataclasses.replace(config, like_for_like=True)
    global _counted_syscalls, _path_calls, _path_dump
    _counted_syscalls = SYSCALLS if args.syscalls else ()
    _path_calls = args.path_calls
    if args.path_dump is not None:
        if not args.path_calls:
            parser.error("--path-dump needs --path-calls")
        args.path_dump.mkdir(parents=True, exist_ok=True)
        _path_dump = args.path_dump
    meta: dict[str, Any] = {
        "mode": config.mode,
        **machine_facts("benchmarks/quic_throughput.py", argv),
        "aioquic": _version("aioquic"),
        "qh3": _version("qh3"),
        "gso": udp_gso_supported(),
        "pinned": args.pin,
        "config": {
            "rtt_rounds": config.rtt_rounds,
            "pings": config.pings,
            "warmup": config.warmup,
            "bulk_rounds": config.bulk_rounds,
            "bulk_bytes": config.bulk_bytes,
            "like_for_like": config.like_for_like,
        },
    }
    bench = Bench(config, pin=args.pin, profile_dir=args.profile, profile_role=args.profile_role)
    started = time.monotonic()
    try:
        rows = run_cases(bench, args.case)
    except BenchmarkError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    finally:
        bench.close()
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    section = report(rows, meta)
    print(section)
    if args.json is not None:
        document = {**meta, "cases": [row.to_json() for row in rows]}
        write_json(args.json, document)
    if args.write_readme:
        write_readme_section(README, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
