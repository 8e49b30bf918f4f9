"""Client-issued small tensor ops per second: monarch-tensor against the reference Monarch's
tensor engine (torchmonarch 0.7.0), the same program on the same 2-process CPU mesh, in one run.

Each round runs the workload once under this environment and once under the reference's
interpreter (``--reference PATH``, else ``$MONARCH_REFERENCE_PYTHON``; without one only ours
runs), each in a fresh process: spawn 2 processes, activate, issue ``--ops`` additions
``x = x + 1`` on a 4-element tensor (timed: *issue*), then fetch the result (timed to the
answer: *done*; the value is checked). The ratio is the median over rounds of ours / the
reference's rate.

Usage: ``python benchmarks/tensor_ops.py [--rounds 3] [--ops 5000] [--smoke] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
import torch
from monarch import fetch_shard
from monarch.actor import this_host


def main() -> None:
    n = int(sys.argv[1])
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
    print("RESULT " + json.dumps({"issue_per_s": n / issued, "done_per_s": n / done}))


if __name__ == "__main__":
    main()
"""


def run_child(python: str, ops: int, env: dict[str, str], workdir: Path) -> dict[str, float]:
    script = workdir / "tensor_ops_child.py"
    script.write_text(CHILD)
    result = subprocess.run(
        [python, str(script), str(ops)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            parsed: dict[str, float] = json.loads(line[len("RESULT ") :])
            return parsed
    raise RuntimeError(f"{python} produced no result:\n{result.stdout}\n{result.stderr[-3000:]}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--reference", default=os.environ.get("MONARCH_REFERENCE_PYTHON"))
    parser.add_argument("--smoke", action="store_true", help="1 round, 200 ops, ours only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.ops, args.reference = 1, 200, None
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"tensor-ops-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    ours_env = dict(os.environ)
    ref_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        row: dict[str, Any] = {"ours": run_child(sys.executable, args.ops, ours_env, workdir)}
        if args.reference:
            row["reference"] = run_child(args.reference, args.ops, ref_env, workdir)
            for key in ("issue_per_s", "done_per_s"):
                row[f"{key}_ratio"] = row["ours"][key] / row["reference"][key]
        rounds.append(row)
        print(f"round {index + 1}/{args.rounds}: {json.dumps(row)}", file=sys.stderr)
    summary: dict[str, float] = {}
    for side in ("ours", "reference"):
        for key in ("issue_per_s", "done_per_s"):
            values = [r[side][key] for r in rounds if side in r]
            if values:
                summary[f"{side}_{key}"] = statistics.median(values)
    for key in ("issue_per_s_ratio", "done_per_s_ratio"):
        values = [r[key] for r in rounds if key in r]
        if values:
            summary[key] = statistics.median(values)
    print(f"## tensor_ops.py: {args.ops} client-issued `x = x + 1` on a 2-process CPU mesh\n")
    print("| measure | ours | reference | ratio (median of rounds) |")
    print("|---|---|---|---|")
    for key, label in (("issue_per_s", "issued ops/s"), ("done_per_s", "completed ops/s")):
        ours = summary.get(f"ours_{key}", float("nan"))
        ref = summary.get(f"reference_{key}", float("nan"))
        ratio = summary.get(f"{key}_ratio", float("nan"))
        print(f"| {label} | {ours:,.0f} | {ref:,.0f} | {ratio:.2f}x |")
    if args.json:
        mode = "smoke" if args.smoke else "full"
        args.json.write_text(json.dumps({"mode": mode, "rounds": rounds, "summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
