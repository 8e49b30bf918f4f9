"""Cost of the monarch-actor telemetry hooks: disabled (the default) and enabled.

Why: every message passes about eight telemetry hooks (send, receive, enqueue, endpoint, reply
port open/complete, on both sides). Disabled, each is one module-attribute load and a branch;
this script measures what that costs per round trip, and what turning metrics and tracing on
costs, as ratios against a baseline measured in the same run (ABAB rounds, see
``benchmarks/README.md``).

Rates are per second of this process's CPU time (``time.process_time``, all threads), not of
wall time: on a shared two-core machine the wall clock mostly measures the neighbours, while
the CPU time a round trip costs this process is what the hooks change.

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
"""

from __future__ import annotations

import argparse
import sys
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
    run_mode,
    write_json,
)
from monarch.actor import Actor, _local_proc_mesh, endpoint  # noqa: E402
from monarch.actor._runtime import telemetry as _telemetry  # noqa: E402

HOOKS_PER_ROUND_TRIP = 8
#: Calls in flight in the pipelined cases.
PIPELINE = 32


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


def run(rounds: int, trial_s: float, budget_s: float) -> list[CaseResult]:
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
            for name, metrics, tracing in (
                ("metrics", True, False),
                ("tracing", False, True),
                ("metrics+tracing", True, True),
            ):
                base, cand = alternate(
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
                results.append(CaseResult(case, "telemetry off", f"{name} on", None, base, cand))
    finally:
        procs.stop().get(timeout=10)
    return results


MODES: dict[str, tuple[int, float, float]] = {
    "full": (12, 0.4, 15.0),
    "quick": (6, 0.3, 5.0),
    "smoke": (2, 0.2, 2.0),
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
    args = parser.parse_args(argv)
    mode = run_mode(args)
    rounds, trial_s, budget_s = MODES[mode]
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        budget_s = budget_s * max(1.0, args.rounds / rounds)
        rounds = args.rounds
    results = run(rounds, trial_s, budget_s)
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
    """The results as Markdown: medians, the median of the per-round ratios and its spread."""
    lines = [
        "| case | baseline | candidate | baseline /CPU s | candidate /CPU s | ratio | "
        "min-max | rounds |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if not r.measured:
            lines.append(
                f"| {r.name} | {r.baseline_label} | {r.candidate_label} | - | - | - | - | 0 |"
            )
            continue
        ratios = r.pair_ratios
        lines.append(
            f"| {r.name} | {r.baseline_label} | {r.candidate_label} | "
            f"{r.baseline_median:,.0f} | {r.candidate_median:,.0f} | {r.ratio:.3f}x | "
            f"{min(ratios):.2f}-{max(ratios):.2f} | {len(ratios)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
