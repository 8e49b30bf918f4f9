"""The tensor engine against the reference Monarch's (torchmonarch 0.7.0), the same programs on
the same CPU meshes, in one run: client-issued small ops per second, the end-to-end step time
of the data-parallel training example, and a 64 MiB ``reduce("sum")``.

Each round runs every workload once under this environment and once under the reference's
interpreter (``--reference PATH``, else ``$MONARCH_REFERENCE_PYTHON``; without one only ours
runs), each in a fresh process:

* **ops** (2-process mesh): issue ``--ops`` additions ``x = x + 1`` on a 4-element tensor (timed:
  *issue*), then fetch the result (timed to the answer: *done*; the value is checked).
* **train** (2x2 mesh, ``examples/monarch/data_parallel.py``'s model, data and step): forward,
  ``backward()``, the gradients averaged by a ``remote`` gloo all-reduce, ``torch.optim.SGD``,
  and the mesh-averaged loss fetched, which ends the step; 2 warm-up steps, then ``--steps``
  timed. Both sides' last losses are printed (they must agree).
* **reduce** (2-process mesh): ``--reductions`` times ``t.reduce("gpus", "sum")`` of a 64 MiB
  float32 tensor, each finished by fetching one element (the value is checked), after one
  small warm-up reduction. The reference's ``reduce`` fails on CPU (its workers make
  communicators for CUDA only: "no comm found for stream"; the worker fails, the root client's
  fault hook interrupts the main thread), so the child waits at most ``REDUCE_WAIT_S`` for an
  answer and reports the error it saw, tried in round 1 only.

A ratio is the median over rounds of ours / the reference's rate (times: ours / theirs, lower is
better).

Usage: ``python benchmarks/tensor_ops.py [--rounds 3] [--ops 5000] [--steps 10]
[--reductions 5] [--smoke] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: How long the reduce child waits for a reduction's answer (the reference's never comes).
REDUCE_WAIT_S = 60.0

CHILD = """
import json, os, sys, time
import torch
import torch.distributed as dist
from monarch import fetch_shard, get_active_mesh, inspect, remote
from monarch.actor import this_host
from monarch.spmd import setup_torch_elastic_env


def ops(n: int) -> dict:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    with procs.activate():
        x = torch.zeros(4)
        fetch_shard(x).get()
        for _ in range(100):  # warm-up
            x = x + 1
        fetch_shard(x).get()
        started = time.perf_counter()
        for _ in range(n):
            x = x + 1
        issued = time.perf_counter() - started
        value = fetch_shard(x).get()
        done = time.perf_counter() - started
    assert float(value[0]) == n + 100, value
    procs.stop().get()
    return {"issue_per_s": n / issued, "done_per_s": n / done}


# -- train: examples/monarch/data_parallel.py's model, data and step ---------------------------
def init_gloo() -> torch.Tensor:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return torch.tensor(float(dist.get_world_size()))


def average(t: torch.Tensor) -> torch.Tensor:
    out = t.detach().clone()
    dist.all_reduce(out)
    return out / dist.get_world_size()


world_size = remote(init_gloo, propagate=lambda: torch.zeros(()))
mesh_average = remote(average, propagate=lambda t: t.detach().clone())


def train(steps: int) -> dict:
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    setup_torch_elastic_env(procs)
    with procs.activate():
        assert int(inspect(world_size()).item()) == 4
        rank = get_active_mesh().rank(("hosts", "gpus"))
        x = torch.sin(torch.arange(32.0).reshape(8, 4) * 0.3 + rank)
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.5
        model = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)

        def step() -> float:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():
                p.grad = mesh_average(p.grad)
            optimizer.step()
            optimizer.zero_grad()
            return float(inspect(mesh_average(loss)).item())

        for _ in range(2):  # warm-up
            step()
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            last = step()
            times.append(time.perf_counter() - started)
    procs.stop().get()
    return {
        "step_s": sum(times) / len(times),
        "median_step_s": sorted(times)[len(times) // 2],
        "last_loss": f"{last:.6f}",
    }


def reduce(n: int, wait: float) -> dict:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    with procs.activate():
        x = torch.ones(16 * 1024 * 1024)  # 64 MiB of float32 on each process
        try:
            small = torch.ones(4).reduce("gpus", "sum")  # warm-up: the process group
            fetch_shard(small).get(timeout=wait)
            started = time.perf_counter()
            for _ in range(n):
                total = x.reduce("gpus", "sum")
                value = fetch_shard(total[0]).get(timeout=wait)
            elapsed = time.perf_counter() - started
        except BaseException as error:  # the reference's fault hook interrupts the main thread
            print("RESULT " + json.dumps({"error": f"{type(error).__name__}: {error}"[:500]}))
            sys.stdout.flush()
            os._exit(0)  # the reference's mesh does not stop after the failed collective
    assert float(value) == 2.0, value
    procs.stop().get()
    return {"reduce_s": elapsed / n, "reduce_gb_per_s": 64 / 1024 / (elapsed / n)}


if __name__ == "__main__":
    kind, n = sys.argv[1], int(sys.argv[2])
    if kind == "ops":
        result = ops(n)
    elif kind == "train":
        result = train(n)
    else:
        result = reduce(n, float(sys.argv[3]))
    print("RESULT " + json.dumps(result))
"""


def run_child(python: str, args: list[str], env: dict[str, str], workdir: Path) -> dict[str, Any]:
    script = workdir / "tensor_ops_child.py"
    script.write_text(CHILD)
    result = subprocess.run(
        [python, str(script), *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        start_new_session=True,
    )
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            parsed: dict[str, Any] = json.loads(line[len("RESULT ") :])
            if "error" in parsed:  # the worker's own report, when it printed one
                seen = [ln.strip() for ln in result.stderr.splitlines() if "no comm" in ln]
                if seen:
                    parsed["worker_error"] = seen[0][:300]
            return parsed
    raise RuntimeError(f"{python} produced no result:\n{result.stdout}\n{result.stderr[-3000:]}")


#: (workload, key, label, higher is better)
MEASURES = (
    ("ops", "issue_per_s", "issued ops/s (2 processes)", True),
    ("ops", "done_per_s", "completed ops/s (2 processes)", True),
    ("train", "step_s", "training step, s (2x2 mesh)", False),
    ("reduce", "reduce_s", "64 MiB reduce('sum'), s (2 processes)", False),
)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reductions", type=int, default=5)
    parser.add_argument("--reference", default=os.environ.get("MONARCH_REFERENCE_PYTHON"))
    parser.add_argument(
        "--smoke", action="store_true", help="1 round, 200 ops, 2 steps, 1 reduction, ours only"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.ops, args.steps, args.reductions = 1, 200, 2, 1
        args.reference = None
    with tempfile.TemporaryDirectory(prefix="tensor-ops-") as folder:
        return _run(args, Path(folder))


def _run(args: argparse.Namespace, workdir: Path) -> int:
    ours_env = dict(os.environ)
    ref_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    counts = {"ops": args.ops, "train": args.steps, "reduce": args.reductions}
    rounds: list[dict[str, Any]] = []
    reference_reduce: dict[str, Any] | None = None
    for index in range(args.rounds):
        row: dict[str, Any] = {}
        for kind, count in counts.items():
            extra = [str(REDUCE_WAIT_S)] if kind == "reduce" else []
            ours = run_child(sys.executable, [kind, str(count), *extra], ours_env, workdir)
            row[f"ours_{kind}"] = ours
            if not args.reference:
                continue
            if kind == "reduce" and reference_reduce is not None and "error" in reference_reduce:
                continue  # it failed in round 1: not tried again
            theirs = run_child(args.reference, [kind, str(count), *extra], ref_env, workdir)
            row[f"reference_{kind}"] = theirs
            if kind == "reduce":
                reference_reduce = theirs
        for kind, key, _, _ in MEASURES:
            ours, theirs = row.get(f"ours_{kind}", {}), row.get(f"reference_{kind}", {})
            if key in ours and key in theirs:
                row[f"{key}_ratio"] = ours[key] / theirs[key]
        rounds.append(row)
        print(f"round {index + 1}/{args.rounds}: {json.dumps(row)}", file=sys.stderr)
    summary: dict[str, Any] = {}
    for kind, key, _, _ in MEASURES:
        for side in ("ours", "reference"):
            values = [
                r[f"{side}_{kind}"][key] for r in rounds if key in r.get(f"{side}_{kind}", {})
            ]
            if values:
                summary[f"{side}_{key}"] = statistics.median(values)
        ratios = [r[f"{key}_ratio"] for r in rounds if f"{key}_ratio" in r]
        if ratios:
            summary[f"{key}_ratio"] = statistics.median(ratios)
    if reference_reduce is not None and "error" in reference_reduce:
        summary["reference_reduce_error"] = reference_reduce
    losses = {
        side: sorted({r[f"{side}_train"]["last_loss"] for r in rounds if f"{side}_train" in r})
        for side in ("ours", "reference")
    }
    print(
        f"## tensor_ops.py: {args.ops} client-issued `x = x + 1`, {args.steps} training steps, "
        f"{args.reductions} 64 MiB reductions; CPU meshes\n"
    )
    print("| measure | ours | reference | ratio ours/reference (median of rounds) |")
    print("|---|---|---|---|")
    for _, key, label, _ in MEASURES:
        ours_value = summary.get(f"ours_{key}", float("nan"))
        ref_value = summary.get(f"reference_{key}", float("nan"))
        ratio = summary.get(f"{key}_ratio", float("nan"))
        fmt = "{:,.0f}" if key.endswith("per_s") else "{:.4f}"
        ref_cell = (
            "failed"
            if key == "reduce_s" and "reference_reduce_error" in summary
            else (fmt.format(ref_value))
        )
        ratio_cell = f"{ratio:.2f}x" if ratio == ratio else "-"  # NaN: no ratio
        print(f"| {label} | {fmt.format(ours_value)} | {ref_cell} | {ratio_cell} |")
    print(f"\nlast training loss: ours {losses['ours']}, reference {losses['reference']}")
    if "reference_reduce_error" in summary:
        print(f"reference reduce: {json.dumps(summary['reference_reduce_error'])}")
    if args.json:
        mode = "smoke" if args.smoke else "full"
        args.json.write_text(json.dumps({"mode": mode, "rounds": rounds, "summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
