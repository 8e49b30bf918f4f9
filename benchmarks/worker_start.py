"""Start-up cost of a Monarch process: CPU and wall time of ``import monarch.actor`` and of a
host's worker loop from exec to listening, one source tree against another in the same run.

Usage::

    python benchmarks/worker_start.py [--baseline TREE] [--quick | --smoke] [--json OUT]
                                      [--write-readme]

Why: a worker loop (``run_worker_loop_forever``, what ``SlurmJob`` / ``ProcessJob`` start on
every host) and a mesh process started without the zygote are fresh interpreters, and most of
their start-up is importing the stack (issues 19 and 23). The figure that matters is CPU time,
not wall time: a cluster's hosts all start at once, and on a loaded machine the wall time is
mostly the neighbours'.

Each round runs these commands back to back, so that they see about the same load:

1. **bare** (the floor): ``python -c pass``.
2. **import** on each tree: ``python -c "import monarch.actor"``.
3. **loop** on each tree: ``python -m monarch.actor._attach --address udp://127.0.0.1:0`` (the
   worker loop's documented entry point), from exec until it prints its listening address; it
   is then killed (SIGKILL) and reaped.
4. **job_host** on each tree: ``python -m monarch.job._host --listen udp://127.0.0.1:0
   --ready-stdout`` (a ``ProcessJob`` host started with exec), measured the same way.

The two trees are the candidate (this checkout) and the baseline (``--baseline``, default
``/work/main``), each run with its own ``packages/*/src`` first on ``PYTHONPATH``; their order
alternates from round to round. A child's CPU time is its user + system time as ``wait4``
reports it when it is reaped (for the loop: up to the kill, right after the line it printed);
wall time runs from ``Popen`` to its exit (import) or to its address line (loop). Every child
runs with bytecode caches (one ``PYTHONPYCACHEPREFIX`` per tree, written by a warm-up run of
each command), as an installed program does. The ratios are candidate / baseline of the same
round; the headline is their median (full run: 15 rounds; ``--quick``: 5; ``--smoke``: 1).
Every wait is bounded, and every child is killed however the run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
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
    run_mode,
    write_json,
    write_readme_section,
)

README: Final = ROOT / "packages" / "monarch-actor" / "README.md"
HEADING: Final = "## Start-up cost"
ROUNDS: Final = {"full": 15, "quick": 5, "smoke": 1}
COMMAND_TIMEOUT: Final = 60.0
"""Seconds one measured command may take."""
DEFAULT_BASELINE: Final = Path("/work/main")
IMPORT_CODE: Final = "import monarch.actor"
LOOPS: Final = {
    "loop": ("-m", "monarch.actor._attach", "--address", "udp://127.0.0.1:0"),
    "job_host": ("-m", "monarch.job._host", "--listen", "udp://127.0.0.1:0", "--ready-stdout"),
    "cluster_host": (
        "-m",
        "monarch.job._host_worker",
        "--host",
        "127.0.0.1",
        "--port",
        "PORT",
        "--ready-file",
        "/dev/stdout",
    ),
}
"""The processes measured from exec to listening: the worker loop's documented entry point
(``run_worker_loop_forever``), a job's host as ``ProcessJob`` starts it where it cannot fork,
and the worker loop of ``SlurmJob``'s and ``KubernetesJob``'s hosts (``PORT``: a free UDP
port, as ``--port`` must be one; its address goes to stdout through ``--ready-file``)."""
NAMES: Final = {
    "import": '`python -c "import monarch.actor"`',
    "loop": "worker loop (`-m monarch.actor._attach`) to listening",
    "job_host": "job host (`-m monarch.job._host`) to listening",
    "cluster_host": "cluster host (`-m monarch.job._host_worker`) to listening",
}
NOTES: Final = """\
What changed in this round (issue 19's SlurmJob target, third round; the earlier rounds'
changes stay: the cyclic collector paused and frozen around a worker's imports,
`importlib.metadata` only on an entry-point lookup, dataclass methods compiled once across
processes, aioquic's verification-only imports deferred, no IDNA codec at start):

- **A cluster host listens before it imports `monarch.actor`'s facade.** Importing any
  submodule of `monarch.actor` runs its `__init__`, the whole facade (runtime, meshes, the
  client's host meshes, telemetry), and the worker daemon itself imported what starting
  workers needs (the zygote, worker groups, and through them most of the runtime): none of it
  is needed to listen and be attached, which is all a ready `HostMesh` waits for. The daemon's
  spawn half moved to `_hosts.attach_procs` (it registers itself with `attach_daemon` when
  imported), and `monarch.job._host_worker` (Slurm's and Kubernetes' hosts) and
  `monarch.job._host` (a `ProcessJob` host started with exec) put `monarch.actor` into
  `sys.modules` with its `__init__` not run yet (`chrysalis._startup.DeferredPackage`) and run
  it on the daemon's first `Spawn` (`attach_daemon.set_spawn_imports`), on the spawning thread,
  before its zygote forks. Other programs, `python -m monarch.actor._attach` and
  `monarch.actor._worker` import the facade as before.
- **Regular expressions compiled once across processes** (`chrysalis._startup`): the standard
  library, cryptography and the stack compile about 55 patterns while a worker loop imports
  (cryptography's `x509.name` alone 5 ms); the worker entry points' import window
  (`import_window`: the collector paused, the dataclass cache, and now a cache of each
  pattern's engine program beside it, `regex-code.<tag>.bin`) makes them from the file.

`tests/test_start_cost.py` (monarch-actor) and `tests/test_host_start.py` (monarch-job) run
each worker entry point under `-X importtime` until it prints its address and fail if any of
the modules it must not import by then was imported (for the job hosts now also the runtime,
the meshes, the transports, `attach_procs`, worker groups and the zygote), and check that both
caches were written; monarch-job's `test_host_worker.py` checks that the facade ran only on
first use, and `test_process_job.py`/`test_kubernetes.py` spawn through such hosts.
The `import monarch.actor` row includes the interpreter's exit; the worker rows end at
listening.
"""


def tree_env(tree: Path, cache: Path, ca_dir: Path) -> dict[str, str]:
    """The environment of a child run on ``tree``'s sources, with bytecode caches in ``cache``
    and the development CA in ``ca_dir``."""
    sources = sorted(str(p) for p in (tree / "packages").glob("*/src"))
    if not sources:
        raise BenchmarkError(f"{tree} has no packages/*/src")
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(sources)
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    env["CHRYSALIS_DEV_CA_DIR"] = str(ca_dir)
    return env


def _cpu(rusage: Any) -> float:
    return float(rusage.ru_utime + rusage.ru_stime)


def _reap(popen: subprocess.Popen[bytes]) -> float:
    """Wait for ``popen`` (bounded) and return its CPU seconds; it must have exited with 0."""
    deadline = time.monotonic() + COMMAND_TIMEOUT
    while True:
        pid, status, rusage = os.wait4(popen.pid, os.WNOHANG)
        if pid == popen.pid:
            popen.returncode = os.waitstatus_to_exitcode(status)
            return _cpu(rusage)
        if time.monotonic() > deadline:
            popen.kill()
            raise BenchmarkError(f"{popen.args!r} did not end within {COMMAND_TIMEOUT} s")
        time.sleep(0.002)


def run_command(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``argv`` to its end: (CPU seconds, wall seconds)."""
    start = time.perf_counter()
    popen = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert popen.stderr is not None
        err = popen.stderr.read()  # ends when the child exits (or closes it)
        cpu = _reap(popen)
        wall = time.perf_counter() - start
    finally:
        if popen.returncode is None:
            popen.kill()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(popen.pid, 0)
        if popen.stderr is not None:
            popen.stderr.close()
    if popen.returncode != 0:
        raise BenchmarkError(f"{argv!r} failed ({popen.returncode}): {err.decode()[-2000:]}")
    return cpu, wall


def _free_udp_port() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def run_loop(env: dict[str, str], case: str = "loop") -> tuple[float, float]:
    """Start the ``LOOPS[case]`` process; (CPU seconds up to its address line, wall seconds to
    that line)."""
    argv = [_free_udp_port() if arg == "PORT" else arg for arg in LOOPS[case]]
    start = time.perf_counter()
    popen = subprocess.Popen(
        [sys.executable, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert popen.stdout is not None
    assert popen.stderr is not None
    line = b""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(popen.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + COMMAND_TIMEOUT
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise BenchmarkError(f"{case} did not listen within {COMMAND_TIMEOUT} s")
                chunk = os.read(popen.stdout.fileno(), 4096)
                if not chunk:
                    err = popen.stderr.read().decode(errors="replace")
                    raise BenchmarkError(f"{case} exited before listening: {err[-2000:]}")
                line += chunk
        wall = time.perf_counter() - start
        os.kill(popen.pid, signal.SIGKILL)
        cpu = _reap(popen)
    finally:
        if popen.returncode is None:
            popen.kill()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(popen.pid, 0)
        popen.stdout.close()
        popen.stderr.close()
    if not line.startswith(b"udp://"):
        raise BenchmarkError(f"unexpected first line from {case}: {line!r}")
    return cpu, wall


def measure(mode: str, baseline: Path) -> dict[str, Any]:
    rounds = ROUNDS[mode]
    trees = {"candidate": ROOT, "baseline": baseline}
    samples: dict[str, list[tuple[float, float]]] = {"bare": []}
    for side in trees:
        for case in ("import", *LOOPS):
            samples[f"{case}/{side}"] = []
    loads = []
    with tempfile.TemporaryDirectory(prefix="worker-start-") as scratch:
        ca_dir = Path(scratch) / "ca"
        envs = {
            side: tree_env(tree, Path(scratch) / f"pyc-{side}", ca_dir)
            for side, tree in trees.items()
        }
        bare = [sys.executable, "-c", "pass"]
        for env in envs.values():  # warm-up: bytecode caches, the CA
            run_command([sys.executable, "-c", IMPORT_CODE], env)
            for case in LOOPS:
                run_loop(env, case)
        for index in range(rounds):
            loads.append(os.getloadavg()[0])
            order = list(trees) if index % 2 == 0 else list(reversed(list(trees)))
            samples["bare"].append(run_command(bare, envs["candidate"]))
            for side in order:
                samples[f"import/{side}"].append(
                    run_command([sys.executable, "-c", IMPORT_CODE], envs[side])
                )
            for case in LOOPS:
                for side in order:
                    samples[f"{case}/{side}"].append(run_loop(envs[side], case))
            print(f"round {index + 1}/{rounds} done", file=sys.stderr)
    return {"rounds": rounds, "samples": samples, "load": loads}


def _ratios(samples: dict[str, list[tuple[float, float]]], case: str, which: int) -> list[float]:
    cand = samples[f"{case}/candidate"]
    base = samples[f"{case}/baseline"]
    return [c[which] / b[which] for c, b in zip(cand, base, strict=True)]


def report(result: dict[str, Any], meta: dict[str, str], baseline: Path) -> str:
    samples = result["samples"]
    bare_cpu = median([s[0] for s in samples["bare"]])
    loads = result["load"]
    lines = [
        HEADING,
        "",
        f"{machine_line(meta)}; load average {min(loads):.1f} to {max(loads):.1f} during the "
        f"run; {result['rounds']} rounds; baseline: the sources of `{baseline}`. Reproduce: "
        f"`{meta.get('command', 'python benchmarks/worker_start.py')}`.",
        "",
        "| command | tree | CPU ms (median) | CPU ms above `python -c pass` | wall ms (median) |",
        "|---|---|---:|---:|---:|",
    ]
    lines.append(
        f"| `python -c pass` | - | {1000 * bare_cpu:.0f} | 0 | "
        f"{1000 * median([s[1] for s in samples['bare']]):.0f} |"
    )
    names = NAMES
    for case in ("import", *LOOPS):
        for side in ("baseline", "candidate"):
            cpu = median([s[0] for s in samples[f"{case}/{side}"]])
            wall = median([s[1] for s in samples[f"{case}/{side}"]])
            lines.append(
                f"| {names[case]} | {side} | {1000 * cpu:.0f} | {1000 * (cpu - bare_cpu):.0f} | "
                f"{1000 * wall:.0f} |"
            )
    lines += ["", "| command | CPU ratio candidate / baseline (median, min-max) | wall ratio |"]
    lines.append("|---|---|---|")
    for case in ("import", *LOOPS):
        cpu_ratios = _ratios(samples, case, 0)
        wall_ratios = _ratios(samples, case, 1)
        lines.append(
            f"| {names[case]} | {median(cpu_ratios):.2f}x "
            f"({min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}) | {median(wall_ratios):.2f}x |"
        )
    return "\n".join(lines) + "\n\n" + NOTES


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(
        parser,
        quick="5 rounds instead of 15",
        smoke="one round (what CI runs: only proves the script works)",
        readme=f"the {HEADING!r} section of {README.relative_to(ROOT)}",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=DEFAULT_BASELINE,
        help="the source tree to compare with (its packages/*/src), default %(default)s",
    )
    args = parser.parse_args(argv)
    mode = run_mode(args)
    meta = machine_facts("benchmarks/worker_start.py", argv)
    result = measure(mode, args.baseline.resolve())
    text = report(result, meta, args.baseline)
    print(text)
    if args.json is not None:
        write_json(args.json, {"meta": meta, "mode": mode, **result})
    if args.write_readme:
        if mode != "full":
            print("--write-readme needs a full run; README left as it is", file=sys.stderr)
        else:
            write_readme_section(README, text, HEADING)
    return 0


if __name__ == "__main__":
    sys.exit(main())
