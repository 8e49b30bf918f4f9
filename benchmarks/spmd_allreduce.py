"""All-reduce through a process group made on a Monarch mesh against the same under ``torchrun``.

Usage::

    python benchmarks/spmd_allreduce.py [--quick | --smoke] [--json OUT]

Each round runs, back to back so that both see about the same machine load:

1. **torchrun** (baseline): ``python -m torch.distributed.run --standalone --nproc-per-node 2``
   running this script in ``--worker`` mode: ``init_process_group("gloo")`` from torchrun's
   environment, then the measurement.
2. **mesh** (candidate): ``this_host().spawn_procs(per_host={"gpus": 2})``,
   ``monarch.spmd.init_process_group(procs)`` (gloo), then the same measurement in an actor on
   each process.

The measurement (``measure``, the same function on both sides): for each size, a float32 tensor
of that many bytes, 2 warm-up all-reduces, then ``iters`` timed ones, each after a barrier; the
figure is the median, the slower rank's. The ratio is mesh / torchrun in the same round and the
headline is the median of the per-round ratios (target: at most 1.1, the mesh adds nothing to the
data path). Start-up (informational): wall time from launching (``torchrun`` started /
``spawn_procs`` called) to a ready group (the last rank's ``init_process_group`` returned / the
client's ``init_process_group`` returned). ``OMP_NUM_THREADS=1`` on both sides (torchrun's
default). Full run: 5 rounds, 1 MiB and 64 MiB, 20 iterations; ``--quick``: 2 rounds;
``--smoke``: 1 round of 64 KiB, 3 iterations (proves the script works; do not quote it).
Sizes up to 1 MiB run 8x the iterations (1 MiB: 160): a millisecond each needs more of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
TARGET = 1.1
WARMUP = 2


def _iterations(size: int, iters: int) -> int:
    """Small sizes take a millisecond or less: more of them, for a stable median."""
    return iters * 8 if size <= MIB else iters


def measure(sizes: list[int], iters: int) -> dict[str, float]:
    """Median seconds of one all-reduce of each size (bytes) on the default group, the slower
    rank's (every rank calls this; every rank gets the same answer). Sizes up to 1 MiB run 8x
    the iterations."""
    import torch
    import torch.distributed as dist

    medians: dict[str, float] = {}
    for size in sizes:
        tensor = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(WARMUP):
            dist.all_reduce(tensor)
        times = []
        for _ in range(_iterations(size, iters)):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        slowest = torch.tensor([statistics.median(times)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        medians[str(size)] = float(slowest)
    return medians


def _worker(out: str, sizes: list[int], iters: int) -> None:
    """``--worker``: what torchrun runs on each rank."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    ready = torch.tensor([time.time()], dtype=torch.float64)
    dist.all_reduce(ready, op=dist.ReduceOp.MAX)
    medians = measure(sizes, iters)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"ready": float(ready), "medians": medians}))
    dist.destroy_process_group()


def _torchrun_round(sizes: list[int], iters: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            __file__,
            "--worker",
            str(out),
            "--sizes",
            ",".join(map(str, sizes)),
            "--iters",
            str(iters),
        ]
        started = time.time()
        subprocess.run(command, check=True, timeout=timeout, capture_output=True, cwd=folder)
        result = json.loads(out.read_text())
    return {"startup": result["ready"] - started, "medians": result["medians"]}


def _mesh_round(sizes: list[int], iters: int, timeout: float) -> dict[str, Any]:
    from monarch.actor import Actor, endpoint, this_host
    from monarch.spmd import init_process_group

    class Bench(Actor):
        @endpoint
        def measure(self, sizes: list[int], iters: int) -> dict[str, float]:
            return measure(sizes, iters)

    started = time.time()
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        init_process_group(procs, timeout=timeout)
        startup = time.time() - started
        bench: Any = procs.spawn("bench", Bench)
        medians = bench.measure.call(sizes, iters).get(timeout=timeout).values()[0]
    finally:
        procs.stop().get(timeout=60)
    return {"startup": startup, "medians": medians}


def _ratio_row(
    name: str, baseline: list[float], candidate: list[float], target: float | None
) -> str:
    ratios = [c / b for b, c in zip(baseline, candidate, strict=True)]
    ratio = statistics.median(ratios)
    met = "" if target is None else ("yes" if ratio <= target else "no")
    wanted = "" if target is None else f"<= {target}x"
    return (
        f"| {name} | {statistics.median(baseline) * 1e3:.2f} ms | "
        f"{statistics.median(candidate) * 1e3:.2f} ms | {ratio:.3f}x | "
        f"{min(ratios):.3f}-{max(ratios):.3f} | {wanted} | {met} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--iters", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker, [int(s) for s in args.sizes.split(",")], args.iters)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for its workers
    if args.smoke:
        rounds, sizes, iters, run = 1, [64 * 1024], 3, "smoke"
    else:
        rounds, sizes, iters = (2 if args.quick else 5), [MIB, 64 * MIB], 20
        run = "quick" if args.quick else "full"
    timeout = 300.0
    trials: list[dict[str, Any]] = []
    for index in range(rounds):
        baseline = _torchrun_round(sizes, iters, timeout)
        candidate = _mesh_round(sizes, iters, timeout)
        trials.append({"torchrun": baseline, "mesh": candidate})
        print(f"round {index + 1}/{rounds}: {json.dumps(trials[-1])}", file=sys.stderr, flush=True)
    lines = [
        "## Benchmark: all-reduce on a mesh's process group against torchrun",
        "",
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, shared with other jobs;"
        f" {run} run, {rounds} rounds, {iters} iterations ({iters * 8} up to 1 MiB),"
        " 2 processes, gloo.",
        "",
        "| case | torchrun (median) | mesh (median) | ratio (median) | per-round | target | met? |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        key = str(size)
        label = f"all-reduce {size // MIB} MiB" if size >= MIB else f"all-reduce {size // 1024} KiB"
        lines.append(
            _ratio_row(
                label,
                [t["torchrun"]["medians"][key] for t in trials],
                [t["mesh"]["medians"][key] for t in trials],
                TARGET,
            )
        )
    lines.append(
        _ratio_row(
            "start-up to a ready group",
            [t["torchrun"]["startup"] for t in trials],
            [t["mesh"]["startup"] for t in trials],
            None,
        )
    )
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"mode": run, "sizes": sizes, "trials": trials}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
