"""Time from ``apply()`` to a ready ``HostMesh`` of N hosts: ``monarch.job.ProcessJob`` here
against the reference Monarch's ``ProcessJob`` (torchmonarch) on the same machine, alternating.

Every trial is a fresh client process running the same program (written to a file, so both
implementations import its actor class the way programs do; our sources are byte-compiled
first, as an installed wheel's are): ``ProcessJob({"hosts": N})``, ``state(cached_path=None)``,
``hosts.initialized`` (**ready**), then one process per host and one call answered by all of
them (**first call**), then ``kill()``. Rounds alternate reference and ours (``R O R O ...``);
the ratio is the median of the per-round ratios ours / reference (lower is better; the issue's
target is at most 1.0x). ``--netns`` adds the issue's namespace case: ours with every host in a
network namespace of its own (``ProcessJob(namespaces=...)``, this package's local job with
hosts at addresses of their own; needs root), against the same reference trials.

    python benchmarks/job_apply.py [--hosts 4] [--rounds 5] [--reference PYTHON] [--netns]
    python benchmarks/job_apply.py --smoke --json out.json   # one round, ours only, 2 hosts
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRIAL_TIMEOUT = 300.0

TRIAL = textwrap.dedent(
    """
    import json, os, sys, time
    from monarch.actor import Actor, endpoint

    class Ping(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    if __name__ == "__main__":
        from monarch.job import ProcessJob
        count, namespaces = int(sys.argv[1]), json.loads(sys.argv[2])
        started = time.perf_counter()
        if namespaces:
            job = ProcessJob({"hosts": count}, namespaces=namespaces)
        else:
            job = ProcessJob({"hosts": count})
        hosts = job.state(cached_path=None).hosts
        hosts.initialized.get()
        ready = time.perf_counter() - started
        procs = hosts.spawn_procs()
        pids = procs.spawn("ping", Ping).pid.call().get(timeout=240)
        first_call = time.perf_counter() - started
        assert len(set(pids.values())) == count
        procs.stop().get(timeout=60)
        job.kill()
        print(json.dumps({"ready": ready, "first_call": first_call}), flush=True)
        os._exit(0)  # the reference's client can linger at exit
    """
)


def _ours_env() -> dict[str, str]:
    sources = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sources))


def _compile_ours(env: dict[str, str]) -> None:
    """Byte-compile our sources in place (``__pycache__``, ignored by git), as pip does when it
    installs a wheel: the reference runs from a compiled ``site-packages``; a checkout under
    ``PYTHONDONTWRITEBYTECODE`` would compile every module on every start. Not timed."""
    sources = env["PYTHONPATH"].split(os.pathsep)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *sources],
        capture_output=True, timeout=TRIAL_TIMEOUT, check=True,
    )  # fmt: skip


def _trial(python: str, script: Path, env: dict[str, str], count: int, ns: list[str]) -> Any:
    done = subprocess.run(
        [python, str(script), str(count), json.dumps(ns)],
        capture_output=True,
        text=True,
        env=env,
        cwd=script.parent,
        timeout=TRIAL_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} trial failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reference", default=os.environ.get("MONARCH_REFERENCE_PYTHON"))
    parser.add_argument("--netns", action="store_true", help="also ours in network namespaces")
    parser.add_argument("--smoke", action="store_true", help="one round, ours only, 2 hosts")
    parser.add_argument("--json", type=Path, help="write every trial there")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hosts, args.rounds, args.reference, args.netns = 2, 1, None, False
    if args.reference is None and not args.smoke and Path("/work/ref/bin/python").exists():
        args.reference = "/work/ref/bin/python"
    env = _ours_env()
    _compile_ours(env)
    # The reference brings its own ``monarch``: none of ours may shadow it.
    reference_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="job-apply-bench-") as tmp:
        script = Path(tmp) / "trial.py"
        script.write_text(TRIAL)
        namespaces = None
        if args.netns:
            sys.path.insert(0, str(ROOT / "packages" / "chrysalis-node" / "src"))
            from chrysalis.node.netns import Namespaces

            namespaces = Namespaces.for_tasks(args.hosts)
            namespaces.create()
        try:
            for index in range(args.rounds):
                row: dict[str, Any] = {"round": index, "load": os.getloadavg()[0]}
                if args.reference:
                    row["reference"] = _trial(args.reference, script, reference_env, args.hosts, [])
                row["ours"] = _trial(sys.executable, script, env, args.hosts, [])
                if namespaces is not None:
                    row["ours_netns"] = _trial(
                        sys.executable, script, env, args.hosts, namespaces.plan.task_names()
                    )
                print(json.dumps(row), file=sys.stderr, flush=True)
                rows.append(row)
        finally:
            if namespaces is not None:
                namespaces.delete()
    summary: dict[str, Any] = {}
    loads = sorted(r["load"] for r in rows)
    print(f"## `ProcessJob` of {args.hosts} hosts: apply() to ready, {args.rounds} rounds\n")
    print(
        f"1-minute load average before each round: median {statistics.median(loads):.2f} "
        f"({loads[0]:.2f}-{loads[-1]:.2f}); our sources byte-compiled, as installed ones are.\n"
    )
    print("| case | ready (median s) | first call (median s) | ratio ready | ratio first call |")
    print("|---|---|---|---|---|")
    for case in ("reference", "ours", "ours_netns"):
        if case not in rows[0]:
            continue
        ready = statistics.median(r[case]["ready"] for r in rows)
        first = statistics.median(r[case]["first_call"] for r in rows)
        ratios = ["", ""]
        if "reference" in rows[0] and case != "reference":
            ratios = [
                f"{statistics.median(r[case][k] / r['reference'][k] for r in rows):.2f}x"
                for k in ("ready", "first_call")
            ]
        summary[case] = {"ready": ready, "first_call": first}
        print(f"| {case} | {ready:.2f} | {first:.2f} | {ratios[0]} | {ratios[1]} |")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"mode": "smoke" if args.smoke else "full", "rounds": rows, "summary": summary},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
