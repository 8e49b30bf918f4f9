"""Scale of ``chrysalis-node`` on one host: how long until N processes are resolvable from the
root, and how fast a fresh stream echoes through the tree.

Usage::

    python benchmarks/node_scale.py [--quick | --smoke] [--size N]... [--json OUT]
                                    [--write-readme]

For each size N (full run: 16, 64 and 128 processes; ``--quick``: 8 and 16; ``--smoke``: 4)
the script runs, back to back so that they see about the same machine load:

1. **bare launch** (baseline): N Python processes that print one line and wait
   (``python -c "print(...); sys.stdin.read()"``), started by the scale tool's own launcher
   (``chrysalis.node._scale.ProcessGroup``) with the same launch concurrency; the time from the
   first start until every process printed.
2. **import-only launch** (informational): the same, each process first importing the scale
   worker's modules (``chrysalis.node._scale``: QUIC, TLS, nameserver). The difference to (1)
   is interpreter start-up and imports, which no protocol work can avoid.
3. **chrysalis** (candidate): ``python -m chrysalis.node._scale run --nodes N`` in its own
   session (killed as a group if it overstays): the root plus N - 1 workers in the task-head
   topology, the time from the root's start until every process is resolvable at the root,
   then fresh-stream echoes from the root to every worker (``[1][len][0x2A]``, spec 7.3),
   one at a time: the first round also opens each QUIC connection, later rounds open a fresh
   stream on the pooled connection.
4. **Unix echo** (baseline for the echo): a plain asyncio Unix stream server in another
   Python process; the client opens a fresh connection per echo, sends the same request, FIN,
   reads to EOF.

The ratios are candidate / baseline in the same round (lower is better for both times). The
machine is shared and noisy: trust ratios more than times. Every wait is bounded, and every
process the script starts is stopped (stdin closed, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks._common`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    BenchmarkError,
    add_run_arguments,
    machine_facts,
    machine_line,
    write_json,
    write_readme_section,
)
from chrysalis.node._scale import (  # noqa: E402
    ProcessGroup,
    encode_echo_request,
    summarize_latencies,
)

README: Final = ROOT / "packages" / "chrysalis-node" / "README.md"
BARE: Final = "import sys; print('ready', flush=True); sys.stdin.read()"
IMPORT_ONLY: Final = (
    "import sys, chrysalis.node._scale; print('ready', flush=True); sys.stdin.read()"
)
UNIX_SERVER: Final = """
import asyncio, struct, sys
async def handle(reader, writer):
    op, length = struct.unpack('>BI', await reader.readexactly(5))
    writer.write(struct.pack('>I', length) + await reader.readexactly(length))
    await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_unix_server(handle, sys.argv[1])
    print('ready', flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    server.close()
asyncio.run(main())
"""
LAUNCH_CONCURRENCY: Final = 8


@dataclass(frozen=True, slots=True)
class Config:
    """Sizes and effort of one mode."""

    mode: str
    sizes: tuple[int, ...]
    nodes_per_task: int
    rounds: int
    echo_rounds: int
    unix_echoes: int
    run_timeout: float


FULL: Final = Config("full", (16, 64, 128), 32, 1, 3, 300, 240.0)
QUICK: Final = Config("quick", (8, 16), 8, 1, 3, 200, 120.0)
SMOKE: Final = Config("smoke", (4,), 2, 1, 2, 20, 25.0)


@dataclass(frozen=True, slots=True)
class Round:
    """One round of one size: the three launch times in seconds, the scale tool's record and
    the Unix echo latencies (seconds)."""

    nodes: int
    bare_seconds: float
    import_seconds: float | None
    scale: dict[str, Any]
    unix_echo: tuple[float, ...]

    @property
    def join_seconds(self) -> float:
        """Root start until every process was resolvable."""
        return float(self.scale["join_seconds"])

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record with the derived ratios."""
        unix = summarize_latencies(self.unix_echo)
        echo = self.scale["echo"] or self.scale["first_echo"]
        imported = self.import_seconds
        return {
            "nodes": self.nodes,
            "bare_launch_seconds": self.bare_seconds,
            "import_launch_seconds": imported,
            "join_seconds": self.join_seconds,
            "join_over_bare": self.join_seconds / self.bare_seconds,
            "join_over_import": None if imported is None else self.join_seconds / imported,
            "scale": self.scale,
            "unix_echo": unix.to_json(),
            "echo_p50_over_unix": echo["p50_ms"] / unix.p50_ms,
        }


async def timed_launch(code: str, count: int, logs: Path, timeout: float) -> float:
    """Seconds until ``count`` processes running ``python -c code`` all printed their line."""
    group = ProcessGroup(logs)
    try:
        started = time.monotonic()
        await group.launch(
            [[sys.executable, "-c", code]] * count,
            names=[f"p{i}" for i in range(count)],
            concurrency=LAUNCH_CONCURRENCY,
            timeout=timeout,
        )
        return time.monotonic() - started
    finally:
        await group.stop()


async def unix_echo(count: int, workdir: Path, timeout: float) -> tuple[float, ...]:
    """``count`` fresh-connection echoes against a Unix stream server process (seconds)."""
    path = str(workdir / "echo.sock")
    group = ProcessGroup(workdir / "logs")
    request = encode_echo_request(b"\x2a")
    expected = b"\x00\x00\x00\x01\x2a"
    try:
        await group.launch(
            [[sys.executable, "-c", UNIX_SERVER, path]],
            names=["unix-echo"],
            concurrency=1,
            timeout=timeout,
        )
        samples = []
        async with asyncio.timeout(timeout):
            for _ in range(count):
                started = time.perf_counter()
                reader, writer = await asyncio.open_unix_connection(path)
                writer.write(request)
                writer.write_eof()
                reply = await reader.read()
                samples.append(time.perf_counter() - started)
                writer.close()
                if reply != expected:
                    raise BenchmarkError(f"unix echo returned {reply!r}")
        return tuple(samples)
    finally:
        await group.stop()


def run_scale(nodes: int, config: Config, workdir: Path) -> dict[str, Any]:
    """One ``chrysalis.node._scale run`` in its own session; its result record."""
    out = workdir / f"scale-{nodes}.json"
    command = [
        sys.executable, "-m", "chrysalis.node._scale", "run", "--nodes", str(nodes),
        "--nodes-per-task", str(config.nodes_per_task),
        "--identity-concurrency", str(LAUNCH_CONCURRENCY),
        "--echo-rounds", str(config.echo_rounds),
        "--join-timeout-secs", str(config.run_timeout * 0.8),
        "--echo-timeout-secs", str(config.run_timeout * 0.15),
        "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _stdout, stderr = proc.communicate(timeout=config.run_timeout)
    except subprocess.TimeoutExpired:
        raise BenchmarkError(f"scale run of {nodes} overstayed {config.run_timeout:g} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # workers share the session: none survives
        proc.wait(timeout=10)
    if proc.returncode != 0 or not out.exists():
        raise BenchmarkError(f"scale run of {nodes} failed: {stderr.decode()[-2000:]}")
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def measure(config: Config, sizes: Sequence[int], *, import_baseline: bool = True) -> list[Round]:
    """Every round of every size (see the module docstring); ``import_baseline=False``
    skips the import-only launches (about 40 % of a full run)."""
    rounds = []
    with tempfile.TemporaryDirectory(prefix="chrysalis-bench-") as tmp:
        work = Path(tmp)
        for nodes in sizes:
            for index in range(config.rounds):
                print(f"[{nodes} processes, round {index + 1}]", file=sys.stderr)
                timeout = config.run_timeout
                bare = asyncio.run(timed_launch(BARE, nodes, work / "bare", timeout))
                imported = None
                if import_baseline:
                    imported = asyncio.run(timed_launch(IMPORT_ONLY, nodes, work / "imp", timeout))
                scale = run_scale(nodes, config, work)
                echoes = asyncio.run(unix_echo(config.unix_echoes, work, timeout))
                rounds.append(Round(nodes, bare, imported, scale, echoes))
                print(
                    f"  bare {bare:.2f} s, import-only {_s(imported)} s, "
                    f"chrysalis {scale['join_seconds']:.2f} s",
                    file=sys.stderr,
                )
    return rounds


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def _ms(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    return f"{summary['p50_ms']:.2f} / {summary['p90_ms']:.2f}"


def markdown_table(rounds: Sequence[Round]) -> str:
    """One row per round: launch times, ratios and echo latencies."""
    lines = [
        "| processes | tasks | bare launch s | import-only launch s | chrysalis: all resolvable s "
        "| vs bare | vs import-only | first dial echo p50 / p90 ms "
        "| fresh-stream echo p50 / p90 ms | Unix fresh-connection echo p50 / p90 ms "
        "| echo p50 vs Unix |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        record = r.to_json()
        ratio = record["join_over_import"]
        over_import = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(
            f"| {r.nodes} | {r.scale['tasks']} | {r.bare_seconds:.2f} | {_s(r.import_seconds)} "
            f"| {r.join_seconds:.2f} | {record['join_over_bare']:.1f}x "
            f"| {over_import} | {_ms(r.scale['first_echo'])} "
            f"| {_ms(r.scale['echo'])} | {_ms(record['unix_echo'])} "
            f"| {record['echo_p50_over_unix']:.1f}x |"
        )
    return "\n".join(lines)


def render_section(config: Config, rounds: Sequence[Round], meta: dict[str, Any]) -> str:
    """The ``## Benchmark`` section of the package README."""
    note = " (a smoke run: proves the script works, the numbers mean nothing)" * (
        config.mode == "smoke"
    )
    return (
        "## Benchmark\n\n"
        f"`{meta['command']}`, {machine_line(meta)}"
        f"{note}. Task-head topology, {config.nodes_per_task} processes per task (the root's "
        f"task has the root and its Unix leaves; other tasks a UDP head and Unix leaves), "
        f"{LAUNCH_CONCURRENCY} processes starting at once in every launch, one round per "
        "size; the echoes run one at a time, 1-byte payload.\n\n"
        f"{markdown_table(rounds)}\n\n"
        "- *bare launch*: Python processes that only print and wait; *import-only*: the same "
        "after importing the worker's modules (QUIC, TLS, nameserver). *chrysalis*: from the "
        "root's start until every process is resolvable at the root (each worker also issues "
        "its identity, joins its parent over QUIC and publishes its entry). "
        "The ratio to import-only is the protocol's own share.\n"
        "- *first dial*: a fresh stream to every worker that also sets up the QUIC connection "
        "(through the worker's head for other tasks); *fresh-stream*: later rounds, a new "
        "stream on the pooled connection. The baseline opens a new Unix stream connection "
        "per echo between two asyncio Python processes.\n"
        "- Reproduce: `.venv/bin/python benchmarks/node_scale.py` (about 7 minutes on two "
        "busy cores; `--no-import-baseline`: about 4; `--quick`: 8 and 16 processes; "
        "`--json OUT`: every record).\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_run_arguments(
        parser,
        quick="8 and 16 processes",
        smoke="4 processes: proves it runs",
        json_help="also write every record as JSON here",
        readme="replace the '## Benchmark' section of packages/chrysalis-node/README.md",
    )
    parser.add_argument("--size", type=int, action="append", help="processes (repeatable)")
    parser.add_argument(
        "--no-import-baseline", action="store_true", help="skip the import-only launches"
    )
    args = parser.parse_args(argv)
    config = SMOKE if args.smoke else QUICK if args.quick else FULL
    sizes = tuple(args.size) if args.size else config.sizes
    if any(not 2 <= n <= 512 for n in sizes):
        parser.error("--size must be in 2..512")
    meta: dict[str, Any] = {
        "mode": config.mode,
        **machine_facts("benchmarks/node_scale.py", argv),
    }
    started = time.monotonic()
    try:
        rounds = measure(config, sizes, import_baseline=not args.no_import_baseline)
    except BenchmarkError as exc:
        print(f"node_scale: {exc}", file=sys.stderr)
        return 1
    section = render_section(config, rounds, meta)
    print(section)
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.json is not None:
        document = {**meta, "rounds": [r.to_json() for r in rounds]}
        write_json(args.json, document)
    if args.write_readme:
        write_readme_section(README, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
