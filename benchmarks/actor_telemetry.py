"""Cost of the monarch-actor telemetry hooks: disabled (the default) and enabled.

Why: every message passes about eight telemetry hooks (send, receive, enqueue, endpoint, reply
port open/complete, on both sides). Disabled, each is one module-attribute load and a branch;
this script measures what that costs per round trip, and what turning metrics and tracing on
costs, as ratios against a baseline measured in the same run (ABAB rounds, see
``benchmarks/README.md``).

Rates are per second of this process's CPU time (``time.process_time``, all threads), not of
wall time: on a shared two-core machine the wall clock mostly measures the neighbours, while
the CPU time a round trip costs this process is what the hooks change.

How a call case runs (made to hold on a busy box): one warm-up trial of each side, then short
trials (``trial_cpu_s`` of CPU each) with the baseline on both sides of every candidate trial,
``A B A B ... B A``; round ``i``'s ratio is the candidate's rate over the baseline's rate of the
two trials around it (their calls over their CPU seconds), so a drift of the machine's load
during the round cancels. The headline is the median of the rounds' ratios (min-max beside
it); the table also gives the median CPU microseconds per call of each side and their
difference (the overhead, per call), and whether the case meets its target (issue 21: a ratio
of at least 0.95x for metrics, 0.85x for tracing and for both). ``--rounds`` gives more
rounds (the time budget grows with them).

Cases (rates are round trips, or loop iterations, per CPU second; ratio = candidate / baseline,
so 1.0x means no cost and 0.9x means 10% fewer round trips per CPU second):

- ``disabled-checks``: baseline a loop calling an empty function eight times per iteration;
  candidate the same loop where the function makes the runtime's disabled check
  (``if _telemetry.ACTIVE:``). The difference is the per-round-trip cost of the disabled hooks.
- ``metrics``: in-process ``call_one`` round trips to a sync actor, telemetry off (baseline) vs
  metrics on (candidate).
- ``tracing``: the same with tracing on (a send span per call, a receive span per endpoint run,
  the send span's ids in every CALL envelope).
- ``metrics+tracing``: the same with both on.
- ``pipelined metrics``, ``pipelined tracing``, ``pipelined metrics+tracing``: the same three,
  with ``PIPELINE`` calls in flight (sent, then all awaited), counted per call.

    .venv/bin/python benchmarks/actor_telemetry.py            # about 40 s
    .venv/bin/python benchmarks/actor_telemetry.py --quick    # about 15 s
    .venv/bin/python benchmarks/actor_telemetry.py --smoke    # about 3 s
    .venv/bin/python benchmarks/actor_telemetry.py --json out.json   # every trial as JSON
    .venv/bin/python benchmarks/actor_telemetry.py --rounds 30       # more rounds (a busy box)
    .venv/bin/python benchmarks/actor_telemetry.py --only metrics    # metrics' two cases only
    .venv/bin/python benchmarks/actor_telemetry.py --profile-hooks   # only: each hook in situ

``--instructions`` is not a ratio of rates either, and has little noise (its rounds differ by a
few hundred instructions a call: thread hand-offs batch differently): the script runs again
under ``valgrind --tool=callgrind`` (instrumentation off until the calls), makes
``PIPELINE``-deep pipelined calls in each mode (telemetry off, metrics, tracing, both; every
mode twice, in that order; each after a warm-up and a snapshot, so that what a long run counts
rather than logs, a sent envelope's size, is counted here too) and prints the instructions per
call of the whole process (all threads) in each, less what an empty counting window costs,
the lower of the two rounds (``callgrind_control`` switches the counting on and reads it;
every time of that run is 20 to 50 times too long, so only its counts mean something).
Instructions are not CPU time (the caches, the thread hand-offs and the box's load are not in
them), but they tell a change to the per-call work from the noise of ratios measured at a load
of 5.

    .venv/bin/python benchmarks/actor_telemetry.py --instructions   # ~1 min (640 calls a mode)

``--profile-hooks`` is not a ratio: it wraps each hook the runtime calls (the metric hooks:
``on_sent``, ``on_received`` and ``on_enqueued``, which the runtime inlines unless
``metrics.HOOKS`` is set, as it is here, and ``call_opened`` / ``call_completed`` of the
call latency; ``run_endpoint``, ``send_call_traced``; and ``wrap_endpoint``, ``outgoing_trace``
and ``send_span``, which a sync call no longer reaches: rows appear only if they are hit) with a
``perf_counter_ns`` pair, makes ``PIPELINE``-deep pipelined calls with metrics on, then with
tracing on, and prints the median wall nanoseconds per hook call, in the running program
(caches and threads as they are there, unlike ``telemetry_hooks.py``'s loops). Each figure
includes one wrapper's own cost, given in the table (an empty function wrapped the same way,
called on the same path); the ``run_endpoint`` row includes the body, given too (telemetry off,
the same wrapper around the bare method), and the ``send_call_traced`` row the posts it makes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    CaseResult,
    Trial,
    add_run_arguments,
    alternate,
    machine_facts,
    median,
    run_mode,
    write_json,
)
from monarch.actor import Actor, _local_proc_mesh, endpoint  # noqa: E402
from monarch.actor._runtime import telemetry as _telemetry  # noqa: E402

HOOKS_PER_ROUND_TRIP = 8
#: Calls in flight in the pipelined cases.
PIPELINE = 32
#: The issue's targets (lowest acceptable ratio, telemetry on over off) by what is on.
TARGETS: dict[str, float] = {"metrics": 0.95, "tracing": 0.85, "metrics+tracing": 0.85}


class Echo(Actor):
    @endpoint
    def ping(self, x: int) -> int:
        return x


def _empty() -> None:
    return None


def _check() -> None:
    if _telemetry.ACTIVE:
        _telemetry.on_enqueued(0)


def _loop_trial(fn: Callable[[], None], seconds: float) -> Trial:
    n = 0
    start = time.process_time()
    deadline = start + seconds
    while True:
        for _ in range(1000):
            fn()
            fn()
            fn()
            fn()
            fn()
            fn()
            fn()
            fn()
        n += 1000
        now = time.process_time()
        if now >= deadline:
            return Trial(counted=n, seconds=now - start, received=n, sent=n)


def _calls_trial(
    actor: Any, seconds: float, metrics: bool, tracing: bool, pipeline: int = 1
) -> Trial:
    if metrics or tracing:
        _telemetry.enable_telemetry(metrics=metrics, tracing=tracing)
    else:
        _telemetry.disable_telemetry()
    try:
        n = 0
        start = time.process_time()
        deadline = start + seconds
        while True:
            if pipeline == 1:
                actor.ping.call_one(n).get(timeout=10)
            else:
                for future in [actor.ping.call_one(n) for _ in range(pipeline)]:
                    future.get(timeout=10)
            n += pipeline
            now = time.process_time()
            if now >= deadline:
                return Trial(counted=n, seconds=now - start, received=n, sent=n)
    finally:
        _telemetry.disable_telemetry()
        _telemetry.reset_metrics()


UNDER_CALLGRIND = "ACTOR_TELEMETRY_UNDER_CALLGRIND"
"""Set in the environment of the run ``--instructions`` starts under valgrind."""
#: The modes ``--instructions`` counts, with their switches (metrics, tracing).
INSTRUCTION_MODES: dict[str, tuple[bool, bool]] = {
    "off": (False, False),
    "metrics": (True, False),
    "tracing": (False, True),
    "metrics+tracing": (True, True),
}


def _pipelined(actor: Any, calls: int) -> None:
    for i in range(max(1, calls // PIPELINE)):
        for future in [actor.ping.call_one(i) for _ in range(PIPELINE)]:
            future.get(timeout=120)


def instructions_per_call(
    actor: Any, calls: int, read: Callable[[], int | None], rounds: int = 2
) -> dict[str, float | None]:
    """Instructions per pipelined call in each of ``INSTRUCTION_MODES`` (``read()``: this
    process's instructions so far, ``None`` if unknown), less an empty window's (the lowest of
    three); the lowest of ``rounds`` rounds (the modes alternate within each round)."""

    def window(work: Callable[[], None]) -> int | None:
        before = read()
        work()
        after = read()
        return None if before is None or after is None else after - before

    empties = [w for w in (window(lambda: None) for _ in range(3)) if w is not None]
    empty = min(empties) if empties else 0
    per_call: dict[str, list[float]] = {mode: [] for mode in INSTRUCTION_MODES}
    n = max(1, calls // PIPELINE) * PIPELINE
    for _ in range(rounds):
        for mode, (metrics, tracing) in INSTRUCTION_MODES.items():
            if metrics or tracing:
                _telemetry.enable_telemetry(metrics=metrics, tracing=tracing)
            else:
                _telemetry.disable_telemetry()
            try:
                _pipelined(actor, 2 * PIPELINE)  # warm-up: logs, rows, the shipper started
                _telemetry.metrics_snapshot()  # folded: what a long run counts, counted here
                counted = window(lambda: _pipelined(actor, n))
            finally:
                _telemetry.disable_telemetry()
                _telemetry.reset_metrics()
            if counted is not None:
                per_call[mode].append((counted - empty) / n)
    return {mode: min(values) if values else None for mode, values in per_call.items()}


def instructions_table(counts: dict[str, float | None]) -> str:
    """``instructions_per_call``'s result as Markdown: per call, over telemetry off, and the
    ratio off / on (what the ratio of rates would be if instructions were all that counted)."""
    off = counts.get("off")
    lines = [
        "| mode | instructions per call | over off | off / on |",
        "|---|---:|---:|---:|",
    ]
    for mode, count in counts.items():
        if count is None or off is None:
            lines.append(f"| {mode} | - | - | - |")
            continue
        lines.append(f"| {mode} | {count:,.0f} | {count - off:+,.0f} | {off / count:.3f}x |")
    return "\n".join(lines)


def _callgrind_total() -> int | None:
    """This process's instructions so far (all threads), asked of callgrind."""
    from benchmarks.actor_profile import _CallgrindCounters, parse_callgrind_totals

    return parse_callgrind_totals(_CallgrindCounters._control("-e", "Ir", str(os.getpid())))


def count_instructions(calls: int) -> dict[str, float | None]:
    """``instructions_per_call`` of an in-process actor, this process running under callgrind
    with its instrumentation off (switched on here, around the calls only)."""
    from benchmarks.actor_profile import _CallgrindCounters

    procs = _local_proc_mesh(per_host={"gpus": 1})
    try:
        actor = procs.spawn("echo", Echo)
        actor.ping.call_one(0).get(timeout=120)
        _CallgrindCounters._control("-i", "on", str(os.getpid()))
        try:
            return instructions_per_call(actor, calls, _callgrind_total)
        finally:
            _CallgrindCounters._control("-i", "off", str(os.getpid()))
    finally:
        procs.stop().get(timeout=120)


def rerun_under_callgrind(argv: list[str]) -> int:
    """Run this script again with ``argv`` under callgrind (instrumentation off at start)."""
    with tempfile.TemporaryDirectory(prefix="actor-telemetry-cg-") as folder:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={folder}/callgrind.out.%p",
            f"--log-file={folder}/valgrind.%p.log",
            sys.executable,
            str(Path(__file__).resolve()),
            *argv,
        ]
        return subprocess.call(command, env=dict(os.environ, **{UNDER_CALLGRIND: "1"}))


def profile_hooks(calls: int) -> dict[str, dict[str, tuple[int, float]]]:
    """Median wall ns per call of each hook in situ (see the module docstring), by mode
    (``metrics``, ``tracing``, ``off``): ``{mode: {hook: (calls, median ns)}}``."""
    from monarch.actor._runtime.telemetry import tracing as _tracing

    clock = time.perf_counter_ns
    samples: dict[str, list[int]] = {}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        acc = samples.setdefault(name, [])

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            result = fn(*args, **kwargs)
            acc.append(clock() - start)
            return result

        return wrapper

    from monarch.actor._runtime.telemetry import metrics as _metrics

    hooks = ("on_sent", "on_received", "on_enqueued")
    saved_hooks = {name: getattr(_telemetry, name) for name in hooks}
    port_hooks = ("call_opened", "call_completed")
    saved_port_hooks = {name: getattr(_metrics, name) for name in port_hooks}
    # The send side the runtime's endpoints call (``send_call_traced`` where the tree has it,
    # ``send_traced`` in older revisions), shown as ``send_call_traced`` either way.
    send_side = "send_call_traced" if hasattr(_tracing, "send_call_traced") else "send_traced"
    saved = (
        _telemetry.run_endpoint,
        _telemetry.wrap_endpoint,
        _telemetry.outgoing_trace,
        getattr(_tracing, send_side),
        _tracing.send_span,
    )

    def install(mode: str) -> None:
        samples.clear()
        for name in hooks:
            setattr(_telemetry, name, timed(name, saved_hooks[name]))
        for name in port_hooks:
            setattr(_metrics, name, timed(name, saved_port_hooks[name]))
        original_run = timed("run_endpoint (+ body)", saved[0])
        empty = timed("(an empty function, wrapped)", _empty)

        def run(cell: Any, envelope: Any, fn: Any, args: Any, kwargs: Any) -> Any:
            empty()
            if mode == "off":
                return timed("endpoint body alone", fn)(*args, **kwargs)
            return original_run(cell, envelope, fn, args, kwargs)

        _telemetry.run_endpoint = run
        # Not on a sync call's path any more (async endpoints, the slow paths): shown if hit.
        _telemetry.wrap_endpoint = timed("wrap_endpoint (async endpoints)", saved[1])
        _telemetry.outgoing_trace = timed("outgoing_trace", saved[2])
        setattr(_tracing, send_side, timed("send_call_traced (+ the posts)", saved[3]))
        _tracing.send_span = timed("send_span (a listener or the mirror)", saved[4])

    def uninstall() -> None:
        for name in hooks:
            setattr(_telemetry, name, saved_hooks[name])
        for name in port_hooks:
            setattr(_metrics, name, saved_port_hooks[name])
        (
            _telemetry.run_endpoint,
            _telemetry.wrap_endpoint,
            _telemetry.outgoing_trace,
            _,
            _tracing.send_span,
        ) = saved
        setattr(_tracing, send_side, saved[3])

    out: dict[str, dict[str, tuple[int, float]]] = {}
    procs = _local_proc_mesh(per_host={"gpus": 1})
    try:
        actor = procs.spawn("echo", Echo)
        actor.ping.call_one(0).get(timeout=10)
        for mode in ("metrics", "tracing", "off"):
            install(mode)
            if mode == "off":
                _telemetry.disable_telemetry()
                _telemetry.ACTIVE = True  # ``run_endpoint`` only: every hook checks its flag
                _metrics.set_hooks(True)  # a sync call goes through ``run_endpoint`` (not inlined)
            else:
                _telemetry.enable_telemetry(metrics=mode == "metrics", tracing=mode == "tracing")
                # the runtime records sends, receipts and enqueues inline: call the hooks
                _metrics.set_hooks(True)
            try:
                for i in range(max(1, calls // PIPELINE)):
                    for future in [actor.ping.call_one(i) for _ in range(PIPELINE)]:
                        future.get(timeout=10)
            finally:
                uninstall()
                _metrics.set_hooks(False)
                _telemetry.disable_telemetry()
                _telemetry.reset_metrics()
            out[mode] = {
                name: (len(values), float(statistics.median(values)))
                for name, values in samples.items()
                if values
            }
    finally:
        procs.stop().get(timeout=10)
    return out


def profile_table(profile: dict[str, dict[str, tuple[int, float]]]) -> str:
    """The in-situ profile as Markdown: one row per hook and mode."""
    lines = ["| mode | hook | calls per round trip | median ns per call |", "|---|---|---:|---:|"]
    for mode, rows in profile.items():
        trips = rows.get("(an empty function, wrapped)", (1, 0.0))[0] or 1
        for name, (n, ns) in rows.items():
            lines.append(f"| {mode} | {name} | {n / trips:.2f} | {ns:,.0f} |")
    return "\n".join(lines)


def bracketed(
    baseline: Callable[[], Trial],
    candidate: Callable[[], Trial],
    rounds: int,
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[tuple[Trial, ...], tuple[Trial, ...]]:
    """Run ``A B A B ... B A`` after one warm-up trial of each side (not counted): each
    candidate trial between two baseline trials. Returns ``(baseline, candidate)`` paired by
    round, round ``i``'s baseline being the two trials around its candidate trial merged (their
    counts and CPU seconds summed), so ``CaseResult.pair_ratios`` compares each candidate trial
    with the load it ran in. Stops after a complete round once ``budget_s`` seconds have passed
    (at least one round runs)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    baseline()
    candidate()
    start = clock()
    before = baseline()
    base: list[Trial] = []
    cand: list[Trial] = []
    for _ in range(rounds):
        middle = candidate()
        after = baseline()
        base.append(
            Trial(
                counted=before.counted + after.counted,
                seconds=before.seconds + after.seconds,
                received=before.received + after.received,
                sent=before.sent + after.sent,
            )
        )
        cand.append(middle)
        before = after
        if clock() - start >= budget_s:
            break
    return tuple(base), tuple(cand)


#: The call cases' telemetry modes: name, metrics on, tracing on.
CALL_MODES: tuple[tuple[str, bool, bool], ...] = (
    ("metrics", True, False),
    ("tracing", False, True),
    ("metrics+tracing", True, True),
)


def run(
    rounds: int, trial_s: float, budget_s: float, only: frozenset[str] | None = None
) -> list[CaseResult]:
    """Every case (the call cases of ``only``'s modes if given), in order."""
    results = []
    base, cand = alternate(
        lambda: _loop_trial(_empty, trial_s),
        lambda: _loop_trial(_check, trial_s),
        rounds,
        budget_s=budget_s,
    )
    results.append(
        CaseResult(
            "disabled-checks",
            "8 empty calls",
            "8 disabled hook checks",
            None,
            base,
            cand,
        )
    )
    procs = _local_proc_mesh(per_host={"gpus": 1})
    try:
        actor = procs.spawn("echo", Echo)
        actor.ping.call_one(0).get(timeout=10)
        for pipeline in (1, PIPELINE):
            for name, metrics, tracing in CALL_MODES:
                if only is not None and name not in only:
                    continue
                base, cand = bracketed(
                    lambda pipeline=pipeline: _calls_trial(  # type: ignore[misc]
                        actor, trial_s, False, False, pipeline
                    ),
                    lambda m=metrics, t=tracing, pipeline=pipeline: _calls_trial(  # type: ignore[misc]
                        actor, trial_s, m, t, pipeline
                    ),
                    rounds,
                    budget_s=budget_s,
                )
                case = name if pipeline == 1 else f"pipelined {name}"
                results.append(
                    CaseResult(case, "telemetry off", f"{name} on", TARGETS[name], base, cand)
                )
    finally:
        procs.stop().get(timeout=10)
    return results


MODES: dict[str, tuple[int, float, float]] = {
    "full": (30, 0.15, 40.0),
    "quick": (12, 0.1, 10.0),
    "smoke": (2, 0.05, 2.0),
}
"""Rounds, seconds of CPU per trial and budget per case (seconds) of each mode."""


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(
        parser, quick="fewer, shorter rounds (~15 s)", smoke="a few short rounds (~3 s)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="ABAB rounds per case (default: the mode's); each case's time budget grows with it",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[name for name, _, _ in CALL_MODES],
        default=None,
        help="only the call cases of this telemetry mode (repeatable; default: every mode)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="only: instructions per pipelined call in each mode, under callgrind (no ratios)",
    )
    parser.add_argument(
        "--profile-hooks",
        action="store_true",
        help="only profile each hook in situ (median ns per call; no ratios)",
    )
    args = parser.parse_args(argv)
    mode = run_mode(args)
    if args.instructions:
        if not os.environ.get(UNDER_CALLGRIND):
            if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
                print("--instructions needs valgrind and callgrind_control", file=sys.stderr)
                return 2
            return rerun_under_callgrind(sys.argv[1:] if argv is None else list(argv))
        counts = count_instructions({"full": 640, "quick": 320, "smoke": 64}[mode])
        print(instructions_table(counts))
        if args.json is not None:
            write_json(
                args.json,
                {
                    "mode": mode,
                    **machine_facts("benchmarks/actor_telemetry.py", argv),
                    "instructions_per_call": counts,
                },
            )
        return 0
    if args.profile_hooks:
        n_calls = {"full": 6400, "quick": 3200, "smoke": 320}[mode]
        profile = profile_hooks(n_calls)
        print(profile_table(profile))
        if args.json is not None:
            write_json(
                args.json,
                {
                    "mode": mode,
                    **machine_facts("benchmarks/actor_telemetry.py", argv),
                    "profile": {
                        m: {h: {"calls": n, "median_ns": ns} for h, (n, ns) in rows.items()}
                        for m, rows in profile.items()
                    },
                },
            )
        return 0
    rounds, trial_s, budget_s = MODES[mode]
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        budget_s = budget_s * max(1.0, args.rounds / rounds)
        rounds = args.rounds
    results = run(rounds, trial_s, budget_s, None if args.only is None else frozenset(args.only))
    print(table(results))
    if args.json is not None:
        document = {
            "mode": mode,
            **machine_facts("benchmarks/actor_telemetry.py", argv),
            "config": {"rounds": rounds, "trial_cpu_s": trial_s, "budget_s": budget_s},
            "cases": [r.to_json() for r in results],
        }
        write_json(args.json, document)
    loops, calls = results[0], results[1]
    if loops.measured and calls.measured:
        # One loop iteration makes HOOKS_PER_ROUND_TRIP calls: its extra cost is a round trip's.
        per_trip_ns = (1 / loops.candidate_median - 1 / loops.baseline_median) * 1e9
        trip_us = 1e6 / calls.baseline_median
        print(
            f"\ndisabled hooks: {per_trip_ns:.0f} ns of CPU per round trip "
            f"({HOOKS_PER_ROUND_TRIP} checks, {per_trip_ns / HOOKS_PER_ROUND_TRIP:.0f} ns each, "
            f"measured over an empty call) = {per_trip_ns / 1000 / trip_us:.2%} of the "
            f"{trip_us:.0f} us of CPU an in-process call_one round trip takes"
        )
    return 0


def table(results: list[CaseResult]) -> str:
    """The results as Markdown: median rates, CPU microseconds per call and their difference,
    the median of the per-round ratios and its spread, the target and whether it is met."""
    lines = [
        "| case | baseline /CPU s | candidate /CPU s | us/call off | us/call on | overhead us "
        "| ratio (median) | min-max | target | met? | rounds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|",
    ]
    for r in results:
        if not r.measured:
            lines.append(f"| {r.name} | - | - | - | - | - | - | - | - | n/a | 0 |")
            continue
        ratios = r.pair_ratios
        off_us = median([1e6 / t.rate for t in r.baseline if t.rate > 0])
        on_us = median([1e6 / t.rate for t in r.candidate if t.rate > 0])
        target = f">= {r.target:g}x" if r.target is not None else "-"
        met = {True: "yes", False: "**no**", None: "-"}[r.met]
        digits = 3 if r.name == "disabled-checks" else 2  # a loop iteration: 8 calls
        lines.append(
            f"| {r.name} | {r.baseline_median:,.0f} | {r.candidate_median:,.0f} | "
            f"{off_us:.{digits}f} | {on_us:.{digits}f} | {on_us - off_us:+.{digits}f} | "
            f"{r.ratio:.3f}x | {min(ratios):.2f}-{max(ratios):.2f} | {target} | {met} | "
            f"{len(ratios)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
