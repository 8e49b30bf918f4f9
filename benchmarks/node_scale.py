"""Scale of ``chrysalis-node`` on one host: how long until N processes are resolvable at the
root, against starting N bare Python processes, and how fast a fresh stream echoes through the
tree.

Usage::

    python benchmarks/node_scale.py [--quick | --smoke] [--size N]... [--rounds R] [--big-rounds R]
                                    [--import-baseline] [--exec-size N]... [--json OUT]
                                    [--write-readme]

For each size N (full run: 64, 256 and 512 processes, 3 rounds, 2 of 512; ``--quick``: 16 and 64;
``--smoke``: 4) every round runs, back to back so that they see about the same machine load:

1. **bare launch** (baseline): N Python processes that only print one line
   (``python -c "print('ready', flush=True)"``: ``python -c pass`` plus the line the launcher
   waits for), started by the scale tool's own launcher (``chrysalis.node._scale.ProcessGroup``)
   with the same launch concurrency; the time from the first start until every process printed.
2. **import-only launch** (informational, ``--import-baseline``): the same, each process first
   importing the scale worker's modules (QUIC, TLS, nameserver): what a fresh interpreter per
   worker must pay before any protocol work.
3. **chrysalis, forked** (candidate): ``python -m chrysalis.node._scale run --nodes N`` in its
   own session (killed as a group if it overstays): the root plus N - 1 workers forked from its
   warm fork server, task-head topology (UDP heads, Unix-datagram leaves); the time from the
   root's start until every process is resolvable at the root; the workers' RSS and PSS once
   they all are; then fresh-stream echoes from the root to every worker (``[1][len][0x2A]``,
   spec 7.3), one at a time: the first round also opens each QUIC connection, later rounds
   open a fresh stream on the pooled connection.
4. **chrysalis, fresh interpreters** (informational, sizes given by ``--exec-size``; full run:
   64; in the first round of the size only): the same run with ``--start exec``, every worker
   a new ``python -m`` process.
5. **chrysalis, forked, another tree** (A/B, ``--compare PYTHONPATH``): the same run as 3
   with another checkout's packages (``PYTHONPATH``: its ``packages/*/src`` joined by ``:``),
   in the same round; the two runs alternate which goes first from round to round.
6. **Unix echo** (baseline for the echo): a plain asyncio Unix stream server in another
   Python process; the client opens a fresh connection per echo, sends the same request, FIN,
   reads to EOF.

The ratio of a size is the median over its rounds of (candidate / baseline of the same round);
lower is better. Each run also reports the CPU every process of the tree had used once all
were resolvable (the scale result's ``cpu`` record: leaves, heads, fork server, root), per
worker: the figure that load moves least. The machine is shared and noisy: trust ratios more
than times. Every wait is bounded, and every process the script starts is stopped (stdin
closed, then SIGTERM, then SIGKILL; the scale runs' workers also die with their launcher).
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
    median,
    write_json,
    write_readme_section,
)
from chrysalis.node._scale import (  # noqa: E402
    ProcessGroup,
    encode_echo_request,
    summarize_latencies,
)

README: Final = ROOT / "packages" / "chrysalis-node" / "README.md"
BARE: Final = "print('ready', flush=True)"
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
    exec_sizes: tuple[int, ...]
    import_baseline: bool
    big_rounds: int
    """Rounds of sizes from ``BIG`` processes up (they load a shared machine heavily)."""


FULL: Final = Config("full", (64, 256, 512), 32, 3, 2, 300, 300.0, (64,), False, 2)
QUICK: Final = Config("quick", (16, 64), 16, 3, 2, 200, 120.0, (16,), False, 3)
SMOKE: Final = Config("smoke", (4,), 2, 1, 2, 20, 25.0, (4,), True, 1)
BIG: Final = 512
GOAL_NODES: Final = 512
GOAL_RATIO: Final = 3.0
"""Issue 22: 512 processes resolvable in at most 3x the time of 512 bare starts."""


@dataclass(frozen=True, slots=True)
class Round:
    """One round of one size: the launch times in seconds, the scale tool's records (forked;
    fresh interpreters where measured) and the Unix echo latencies (seconds)."""

    nodes: int
    bare_seconds: float
    import_seconds: float | None
    scale: dict[str, Any]
    exec_scale: dict[str, Any] | None
    unix_echo: tuple[float, ...]
    load: tuple[float, float] = (0.0, 0.0)
    """The machine's 1-minute load average at the round's start and end."""
    concurrency: int = 0
    """Processes starting at once in both launches of the round."""
    compare_scale: dict[str, Any] | None = None
    """``--compare``: the forked run of the other tree, same round."""

    @property
    def join_seconds(self) -> float:
        """Root start until every process was resolvable (forked start)."""
        return float(self.scale["join_seconds"])

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record with the derived ratios."""
        unix = summarize_latencies(self.unix_echo)
        echo = self.scale["echo"] or self.scale["first_echo"]
        imported = self.import_seconds
        exec_join = None if self.exec_scale is None else float(self.exec_scale["join_seconds"])
        return {
            "nodes": self.nodes,
            "bare_launch_seconds": self.bare_seconds,
            "import_launch_seconds": imported,
            "join_seconds": self.join_seconds,
            "join_over_bare": self.join_seconds / self.bare_seconds,
            "join_over_import": None if imported is None else self.join_seconds / imported,
            "exec_join_seconds": exec_join,
            "exec_over_bare": None if exec_join is None else exec_join / self.bare_seconds,
            "memory": self.scale.get("memory"),
            "exec_memory": None if self.exec_scale is None else self.exec_scale.get("memory"),
            "scale": self.scale,
            "exec_scale": self.exec_scale,
            "unix_echo": unix.to_json(),
            "echo_p50_over_unix": echo["p50_ms"] / unix.p50_ms,
            "load_average": list(self.load),
            "launch_concurrency": self.concurrency,
            "compare_scale": self.compare_scale,
            "compare_join_over_bare": None
            if self.compare_scale is None
            else float(self.compare_scale["join_seconds"]) / self.bare_seconds,
        }


async def timed_launch(
    code: str, count: int, logs: Path, timeout: float, concurrency: int = LAUNCH_CONCURRENCY
) -> float:
    """Seconds until ``count`` processes running ``python -c code`` all printed their line
    (at most ``concurrency`` starting at once)."""
    group = ProcessGroup(logs)
    try:
        started = time.monotonic()
        await group.launch(
            [[sys.executable, "-c", code]] * count,
            names=[f"p{i}" for i in range(count)],
            concurrency=concurrency,
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


def run_scale(
    nodes: int,
    config: Config,
    workdir: Path,
    start: str = "fork",
    concurrency: int = LAUNCH_CONCURRENCY,
    pythonpath: str | None = None,
) -> dict[str, Any]:
    """One ``chrysalis.node._scale run`` in its own session (at most ``concurrency`` workers
    starting at once; ``pythonpath``: another tree's packages); its result record."""
    out = workdir / f"scale-{nodes}-{start}{'-compare' * (pythonpath is not None)}.json"
    out.unlink(missing_ok=True)
    env = None if pythonpath is None else dict(os.environ, PYTHONPATH=pythonpath)
    command = [
        sys.executable, "-m", "chrysalis.node._scale", "run", "--nodes", str(nodes),
        "--start", start,
        "--nodes-per-task", str(config.nodes_per_task),
        "--identity-concurrency", str(concurrency),
        "--echo-rounds", str(config.echo_rounds),
        "--join-timeout-secs", str(config.run_timeout * 0.8),
        "--echo-timeout-secs", str(config.run_timeout * 0.15),
        "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env
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
        raise BenchmarkError(f"scale run of {nodes} ({start}) failed: {stderr.decode()[-2000:]}")
    record: dict[str, Any] = json.loads(out.read_text())
    return record


def measure(
    config: Config,
    sizes: Sequence[int],
    *,
    rounds: int,
    big_rounds: int,
    import_baseline: bool,
    exec_sizes: Sequence[int],
    concurrency: int = LAUNCH_CONCURRENCY,
    compare: str | None = None,
) -> list[Round]:
    """Every round of every size (see the module docstring)."""
    result = []
    with tempfile.TemporaryDirectory(prefix="chrysalis-bench-") as tmp:
        work = Path(tmp)
        for nodes in sizes:
            for index in range(big_rounds if nodes >= BIG else rounds):
                print(f"[{nodes} processes, round {index + 1}]", file=sys.stderr)
                timeout = config.run_timeout
                load = os.getloadavg()[0]
                bare = asyncio.run(timed_launch(BARE, nodes, work / "bare", timeout, concurrency))
                imported = None
                if import_baseline:
                    imported = asyncio.run(
                        timed_launch(IMPORT_ONLY, nodes, work / "imp", timeout, concurrency)
                    )
                other = None
                if compare is not None and index % 2 == 1:  # alternate which tree goes first
                    other = run_scale(
                        nodes, config, work, concurrency=concurrency, pythonpath=compare
                    )
                scale = run_scale(nodes, config, work, concurrency=concurrency)
                if compare is not None and other is None:
                    other = run_scale(
                        nodes, config, work, concurrency=concurrency, pythonpath=compare
                    )
                fresh = None
                if nodes in exec_sizes and index == 0:  # informational: the first round only
                    fresh = run_scale(nodes, config, work, "exec", concurrency)
                echoes = asyncio.run(unix_echo(config.unix_echoes, work, timeout))
                loads = (load, os.getloadavg()[0])
                result.append(
                    Round(nodes, bare, imported, scale, fresh, echoes, loads, concurrency, other)
                )
                print(
                    f"  bare {bare:.2f} s, import-only {_s(imported)} s, chrysalis forked "
                    f"{scale['join_seconds']:.2f} s "
                    f"({scale['join_seconds'] / bare:.2f}x), fresh interpreters "
                    f"{_s(None if fresh is None else fresh['join_seconds'])} s, CPU per worker "
                    f"{_cpu(scale)}"
                    + (
                        ""
                        if other is None
                        else f"; other tree {other['join_seconds']:.2f} s "
                        f"({other['join_seconds'] / bare:.2f}x), CPU per worker {_cpu(other)}"
                    ),
                    file=sys.stderr,
                )
    return result


def _cpu(scale: dict[str, Any] | None) -> str:
    """``ms per worker (leaf median)`` of a run's cpu record."""
    cpu = None if scale is None else scale.get("cpu")
    if not cpu:
        return "-"
    return f"{cpu['ms_per_worker']:.1f} ({cpu['leaf_ms_median']:.1f})"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


def _ms(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    return f"{summary['p50_ms']:.2f} / {summary['p90_ms']:.2f}"


def _ratio(values: Sequence[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def _mib(memory: dict[str, Any] | None) -> str:
    if memory is None:
        return "-"
    return f"{memory['rss_mib_mean']:.1f} / {memory['pss_mib_mean']:.1f}"


def _by_size(rounds: Sequence[Round]) -> dict[int, list[Round]]:
    sizes: dict[int, list[Round]] = {}
    for r in rounds:
        sizes.setdefault(r.nodes, []).append(r)
    return sizes


def markdown_table(rounds: Sequence[Round]) -> str:
    """Start-up (one row per size: medians, ratio = median of per-round ratios, min-max),
    then echo latencies (medians over the rounds)."""
    lines = [
        "| processes | tasks | rounds | bare launch s | chrysalis forked: all resolvable s "
        "| forked vs bare | goal | fresh interpreters: all resolvable s | fresh vs bare "
        "| import-only launch s | worker RSS / PSS MiB, forked | PSS of all workers MiB "
        "| worker RSS / PSS MiB, fresh |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for nodes, group in _by_size(rounds).items():
        records = [r.to_json() for r in group]
        ratios = [rec["join_over_bare"] for rec in records]
        goal = "-"
        if nodes == GOAL_NODES:
            under = sum(ratio <= GOAL_RATIO for ratio in ratios)
            goal = f"<= {GOAL_RATIO:g}x: {under} of {len(ratios)} rounds" + (
                " (met in every round)" if under == len(ratios) else " (NOT met in every round)"
            )
        fresh = [rec["exec_join_seconds"] for rec in records if rec["exec_join_seconds"]]
        fresh_ratios = [rec["exec_over_bare"] for rec in records if rec["exec_over_bare"]]
        imported = [r.import_seconds for r in group if r.import_seconds is not None]
        memory = [rec["memory"] for rec in records if rec["memory"]]
        exec_memory = [rec["exec_memory"] for rec in records if rec["exec_memory"]]
        total = f"{median([m['pss_mib_total'] for m in memory]):.0f}" if memory else "-"
        lines.append(
            f"| {nodes} | {group[0].scale['tasks']} | {len(group)} "
            f"| {median([r.bare_seconds for r in group]):.2f} "
            f"| {median([r.join_seconds for r in group]):.2f} | {_ratio(ratios)} | {goal} "
            f"| {_s(median(fresh) if fresh else None)} "
            f"| {_ratio(fresh_ratios) if fresh_ratios else '-'} "
            f"| {_s(median(imported) if imported else None)} "
            f"| {_mib(memory[-1] if memory else None)} | {total} "
            f"| {_mib(exec_memory[-1] if exec_memory else None)} |"
        )
    lines += ["", *round_table(rounds)]
    lines += [
        "",
        "| processes | tasks | first dial echo p50 / p90 ms | fresh-stream echo p50 / p90 ms "
        "| Unix fresh-connection echo p50 / p90 ms | echo p50 vs Unix |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for nodes, group in _by_size(rounds).items():
        last = group[-1]
        record = last.to_json()
        ratio = median([r.to_json()["echo_p50_over_unix"] for r in group])
        lines.append(
            f"| {nodes} | {last.scale['tasks']} | {_ms(last.scale['first_echo'])} "
            f"| {_ms(last.scale['echo'])} | {_ms(record['unix_echo'])} | {ratio:.1f}x |"
        )
    return "\n".join(lines)


def round_table(rounds: Sequence[Round]) -> list[str]:
    """One row per round: load, both launches, the ratio, CPU per worker (and the other
    tree's run with ``--compare``)."""
    compared = any(r.compare_scale is not None for r in rounds)
    header = (
        "| processes | round | load average | bare launch s | forked: all resolvable s "
        "| forked vs bare | CPU per worker ms (leaf median) |"
    )
    rule = "|---:|---:|---|---:|---:|---:|---:|"
    if compared:
        header += " other tree: all resolvable s | other tree vs bare | other tree CPU ms (leaf) |"
        rule += "---:|---:|---:|"
    lines = [header, rule]
    for nodes, group in _by_size(rounds).items():
        for index, r in enumerate(group, 1):
            row = (
                f"| {nodes} | {index} | {r.load[0]:.1f} to {r.load[1]:.1f} | {r.bare_seconds:.2f} "
                f"| {r.join_seconds:.2f} | {r.join_seconds / r.bare_seconds:.2f}x "
                f"| {_cpu(r.scale)} |"
            )
            if compared:
                other = r.compare_scale
                if other is None:
                    row += " - | - | - |"
                else:
                    join = float(other["join_seconds"])
                    row += f" {join:.2f} | {join / r.bare_seconds:.2f}x | {_cpu(other)} |"
            lines.append(row)
    return lines


def render_section(config: Config, rounds: Sequence[Round], meta: dict[str, Any]) -> str:
    """The ``## Benchmark`` section of the package README."""
    note = " (a smoke run: proves the script works, the numbers mean nothing)" * (
        config.mode == "smoke"
    )
    loads = [value for r in rounds for value in r.load]
    concurrency = rounds[0].concurrency if rounds else LAUNCH_CONCURRENCY
    load = f" 1-minute load average {min(loads):.1f} to {max(loads):.1f} during the rounds." * bool(
        loads
    )
    return (
        "## Benchmark\n\n"
        f"`{meta['command']}`, {machine_line(meta)}"
        f"{note}.{load} Task-head topology, {config.nodes_per_task} processes per task (the "
        f"root's task has the root and its Unix leaves; other tasks a UDP head and Unix "
        f"leaves), {concurrency} processes starting at once in every launch (bare and "
        "chrysalis alike); the echoes run one at a time, 1-byte payload.\n\n"
        f"{markdown_table(rounds)}\n\n"
        "- *bare launch*: Python processes that only print a line (`python -c pass` plus the "
        "line the launcher waits for). *chrysalis forked*: from the root's start until every "
        "process is resolvable at the root, workers forked from the launcher's warm fork "
        "server (each issues its identity, joins its parent over QUIC and publishes its "
        "entry); *fresh interpreters*: the same with `--start exec` (first round only). "
        "*forked vs bare*: the "
        "median over the rounds of the per-round ratio (min-max in brackets); the goal is "
        "issue 22's. *import-only* (`--import-baseline`): fresh interpreters that import the "
        "worker's modules and stop.\n"
        "- Memory: mean resident (RSS) and proportional (PSS: shared pages divided among "
        "their sharers) set size per worker once all are resolvable (`/proc/PID/smaps_rollup`"
        ", last round), and the workers' PSS summed (median over the rounds).\n"
        "- Per round: the 1-minute load average at the round's start and end, and the CPU "
        "every process of the tree had used once all were resolvable, divided by the workers "
        "(root since its start, fork server, heads, leaves; `/proc`), with the leaves' median "
        "in brackets. *other tree* (`--compare PYTHONPATH`): the same forked run of another "
        "checkout in the same round, the two alternating which goes first.\n"
        "- *first dial*: a fresh stream to every worker that also sets up the QUIC connection "
        "(through the worker's head for other tasks); *fresh-stream*: later rounds, a new "
        "stream on the pooled connection (both: the last round). The baseline opens a new "
        "Unix stream connection per echo between two asyncio Python processes.\n"
        "- Reproduce: `.venv/bin/python benchmarks/node_scale.py` (a few minutes on two "
        "busy cores; it loads the machine with 512 processes for a few seconds per round; "
        "`--quick`: 16 and 64 processes; `--size N --rounds R`: other sizes; "
        "`--launch-concurrency N`: processes starting at once in both launches; "
        "`--compare PYTHONPATH`: A/B against another tree; "
        "`--json OUT`: every record).\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_run_arguments(
        parser,
        quick="16 and 64 processes",
        smoke="4 processes: proves it runs",
        json_help="also write every record as JSON here",
        readme="replace the '## Benchmark' section of packages/chrysalis-node/README.md",
    )
    parser.add_argument("--size", type=int, action="append", help="processes (repeatable)")
    parser.add_argument("--rounds", type=int, help="rounds per size (full run: 3)")
    parser.add_argument(
        "--big-rounds", type=int, help=f"rounds of sizes from {BIG} up (full run: 2)"
    )
    parser.add_argument(
        "--import-baseline",
        action="store_true",
        help="also time fresh interpreters that only import the worker's modules",
    )
    parser.add_argument(
        "--launch-concurrency",
        type=int,
        default=LAUNCH_CONCURRENCY,
        help=f"processes starting at once, bare and chrysalis alike ({LAUNCH_CONCURRENCY})",
    )
    parser.add_argument(
        "--compare",
        metavar="PYTHONPATH",
        help="also run the forked launch of another tree (its packages/*/src joined by ':') "
        "in every round, alternating which goes first",
    )
    parser.add_argument(
        "--exec-size",
        type=int,
        action="append",
        help="also run these sizes with fresh interpreters (--start exec; full run: 64)",
    )
    args = parser.parse_args(argv)
    config = SMOKE if args.smoke else QUICK if args.quick else FULL
    sizes = tuple(args.size) if args.size else config.sizes
    if any(not 2 <= n <= 512 for n in sizes):
        parser.error("--size must be in 2..512")
    rounds = config.rounds if args.rounds is None else args.rounds
    big_rounds = config.big_rounds if args.big_rounds is None else args.big_rounds
    if rounds < 1 or big_rounds < 1:
        parser.error("--rounds and --big-rounds must be at least 1")
    if not 1 <= args.launch_concurrency <= 64:
        parser.error("--launch-concurrency must be in 1..64")
    exec_sizes = tuple(args.exec_size) if args.exec_size else config.exec_sizes
    meta: dict[str, Any] = {
        "mode": config.mode,
        **machine_facts("benchmarks/node_scale.py", argv),
    }
    started = time.monotonic()
    try:
        measured = measure(
            config,
            sizes,
            rounds=rounds,
            big_rounds=big_rounds,
            import_baseline=config.import_baseline or args.import_baseline,
            exec_sizes=exec_sizes,
            concurrency=args.launch_concurrency,
            compare=args.compare,
        )
    except BenchmarkError as exc:
        print(f"node_scale: {exc}", file=sys.stderr)
        return 1
    section = render_section(config, measured, meta)
    print(section)
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.json is not None:
        document = {**meta, "rounds": [r.to_json() for r in measured]}
        write_json(args.json, document)
    if args.write_readme:
        write_readme_section(README, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
