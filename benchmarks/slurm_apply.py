"""Time from ``apply()`` to a ready ``HostMesh`` of 4 hosts with ``SlurmJob`` on a local Slurm
cluster: this project's ``monarch.job`` against the reference Monarch's (torchmonarch 0.7.0,
``/work/ref/bin/python`` or ``$MONARCH_REFERENCE_PYTHON``), side by side in one run.
(``benchmarks/job_apply.py`` does the same for ``ProcessJob``.)

Usage::

    python benchmarks/slurm_apply.py [--quick | --smoke] [--json OUT] [--write-readme]

The cluster is a throwaway one of 4 nodes on this machine
(``packages/monarch-job/tests/_slurm_cluster.py``: Debian's slurm-wlm). The reference's worker
listens on ``tcp://$(hostname):PORT`` and its client dials the node names, so each ``slurmd``
runs in a UTS namespace named after its node, and the names resolve through an ``/etc/hosts``
that exists only inside a private mount namespace: the script re-runs itself under ``unshare
--mount`` and bind-mounts a temporary hosts file there (the machine's ``/etc/hosts`` is never
written). The reference reads ``squeue --json`` in the Slurm 24.05 schema; on an older Slurm its
client gets ``_squeue_json_shim.py`` first on ``PATH`` as ``squeue``.

One measurement is one fresh client process (``benchmarks/_slurm_apply_child.py``, with the
interpreter of its side): ``ready`` is ``apply()`` until ``state()`` returned the mesh and
``hosts.initialized`` resolved, ``first_call`` until one process per host answered (the
client's imports and interpreter start are not timed; the worker loops' are). Our sources are
byte-compiled first (``compileall``, untimed), as an installed wheel's are, and one untimed worker
loop start and one worker start write their dataclass and regex caches (``chrysalis._startup``).
Before the first
round one throwaway job of all nodes runs ``srun true`` (untimed): a fresh cluster's first job
and first step cost about 2 s more than later ones (slurmd's first step start-up), which would
otherwise fall on whichever side runs first. Before each side, once ``squeue`` is empty, the
controller is left idle for ``batch_sched_delay`` plus a second (untimed; Slurm's default 3 s):
slurmctld starts a batch job at once only when its last scheduling pass is that old, else at a
later pass, so without the pause the side whose client starts faster after the other's job ended
would wait up to 3 s longer in the queue (measured: 1-2 s for ours, 0 for the reference's slower
client). Rounds alternate
the two sides, each round starting with the side the previous one ended with; the headline is
the median over rounds of ours / reference in the same round, the spread the min and max of
those ratios. Full run: 5 rounds (the machine is shared); ``--quick``: 2; ``--smoke``: 1 round
of ours (exit status 3, with the reason, where no Slurm cluster can start).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    partial_run_warning,
    run_mode,
    write_json,
    write_readme_section,
)

README: Final = ROOT / "packages" / "monarch-job" / "README.md"
HEADING: Final = "## Benchmark: SlurmJob"
CHILD: Final = ROOT / "benchmarks" / "_slurm_apply_child.py"
TESTS: Final = ROOT / "packages" / "monarch-job" / "tests"
REF_PYTHON: Final = os.environ.get("MONARCH_REFERENCE_PYTHON", "/work/ref/bin/python")
HOSTS: Final = 4
ROUNDS: Final = {"full": 5, "quick": 2, "smoke": 1}
#: The exit status of a run that could not start a Slurm cluster (the reason on stderr).
SKIPPED: Final = 3
CHILD_TIMEOUT: Final = 240.0
SLURM_NODES: Final = tuple((f"n{i + 1}", f"127.0.0.{i + 2}") for i in range(HOSTS))
_IN_NAMESPACE: Final = "MONARCH_BENCH_PRIVATE_HOSTS"
_HOSTS_FOLDER: Final = "MONARCH_BENCH_HOSTS_FOLDER"
_squeue_shim_dir: Path | None = None


def _our_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _compile_ours() -> None:
    """Byte-compile this project's sources in place (``__pycache__``, ignored by git), as pip
    does when it installs a wheel: the reference runs from an installed, compiled
    ``site-packages``, while a checkout under ``PYTHONDONTWRITEBYTECODE`` would compile every
    module in every worker loop and the client on every start (measuring the compiler: 0.9 s
    against 0.56 s for the worker loop's imports alone here). Then one worker loop start and one
    worker process start write the dataclass and regex caches (``chrysalis._startup``), as the
    first start of an installed worker loop and its first spawn do. Not timed."""
    sources = sorted(str(p) for p in (ROOT / "packages").glob("*/src"))
    done = subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *sources],
        capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise BenchmarkError(f"compileall failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    # The worker loop's dataclass and regex caches (``chrysalis._startup``), beside the byte code:
    # an installation's first worker loop writes it (the worker loops here inherit this run's
    # environment, which may forbid writing byte code), so one untimed start writes it first.
    # The worker loop imports monarch.actor's facade only on its first spawn (its caches then
    # get the facade's entries): a worker process's start (``-m monarch.actor._worker``, which
    # imports the facade at once) writes those too.
    env = {k: v for k, v in _our_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    for module in ("monarch.job._host_worker", "monarch.actor._worker"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False, env=env,
        )  # fmt: skip
        if done.returncode != 0:
            raise BenchmarkError(f"{module} start failed: {done.stderr[-2000:]}")


def _ref_env(shim: Path | None = None) -> dict[str, str]:
    """The reference client's environment: none of our sources; with ``shim``, a folder whose
    ``squeue`` translates ``--json`` for Slurm older than 24.05 (``_squeue_json_shim.py``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if shim is not None:
        env["MONARCH_REAL_SQUEUE"] = shutil.which("squeue") or "/usr/bin/squeue"
        env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    return env


def _squeue_shim(folder: Path) -> Path | None:
    """A folder with the ``squeue`` shim when this Slurm is older than 24.05, else None."""
    version = subprocess.run(["squeue", "--version"], capture_output=True, text=True, check=False)
    major = version.stdout.split()[-1].split(".")[:2] if version.stdout.strip() else ["99"]
    if tuple(int(x) for x in major) >= (24, 5):
        return None
    target = folder / "shim"
    target.mkdir(exist_ok=True)
    (target / "squeue").symlink_to(ROOT / "benchmarks" / "_squeue_json_shim.py")
    return target


def _measure(python: str, env: dict[str, str], *argv: str) -> dict[str, float]:
    """One child run: its JSON record. ``BenchmarkError`` with its stderr when it fails."""
    try:
        proc = subprocess.run(
            [python, str(CHILD), *argv],
            capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False, env=env,
            cwd=str(ROOT / "benchmarks"),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise BenchmarkError(f"{python} {argv} did not finish in {CHILD_TIMEOUT:g} s") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise BenchmarkError(f"{python} {argv} exited {proc.returncode}: {proc.stderr[-2500:]}")
    record: dict[str, float] = json.loads(lines[-1])
    return record


def _wait_slurm_empty(timeout: float = 60.0) -> None:
    """Until ``squeue`` lists no job (a finished job stays listed ``MinJobAge`` seconds, and
    the reference's status query then reads the previous job's record): not timed."""
    deadline = time.monotonic() + timeout
    listing = ["squeue", "-h", "-t", "all"]
    while subprocess.run(listing, capture_output=True, text=True, check=False).stdout:
        if time.monotonic() > deadline:
            raise BenchmarkError(f"squeue still lists jobs after {timeout:g} s")
        time.sleep(0.5)  # Slurm has no notification for a purged job record


def _settle_seconds() -> float:
    """``batch_sched_delay`` (``scontrol show config``'s SchedulerParameters; Slurm's default
    3) plus one second of the controller's background tick."""
    done = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=False
    )
    delay = 3.0
    for line in done.stdout.splitlines():
        if line.strip().startswith("SchedulerParameters"):
            for item in line.partition("=")[2].split(","):
                key, _, value = item.strip().partition("=")
                if key == "batch_sched_delay" and value.isdigit():
                    delay = float(value)
    return delay + 1.0


def _warm_up(log_dir: Path) -> None:
    """Run one throwaway job of all nodes (``srun true``) to its end, untimed."""
    done = subprocess.run(
        ["sbatch", "--parsable", f"--nodes={HOSTS}", f"--output={log_dir}/warm-up-%j.out",
         "--wrap", "srun true"],
        capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise BenchmarkError(f"the warm-up job was refused: {done.stderr.strip()}")
    _wait_slurm_empty()


def _have_reference() -> bool:
    return Path(REF_PYTHON).exists()


def _enter_private_hosts(argv: Sequence[str]) -> None:
    """Re-run this script in a private mount namespace (``unshare --mount``) unless already
    there; inside, bind-mount a temporary copy of ``/etc/hosts`` with the Slurm node names."""
    if os.environ.get(_IN_NAMESPACE) != "1":
        if shutil.which("unshare") is None or os.geteuid() != 0:
            raise BenchmarkError("the reference needs root and unshare (a private /etc/hosts)")
        # made (and removed) out here: inside, the file is a mount point until the end
        folder = tempfile.mkdtemp(prefix="bench-hosts-")
        env = dict(os.environ, **{_IN_NAMESPACE: "1", _HOSTS_FOLDER: folder})
        command = ["unshare", "--mount", "--propagation", "private", sys.executable]
        try:
            done = subprocess.run([*command, __file__, *argv], env=env, check=False)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        raise SystemExit(done.returncode)
    folder = os.environ.get(_HOSTS_FOLDER) or tempfile.mkdtemp(prefix="bench-hosts-")
    hosts = Path(folder) / "hosts"
    extra = "".join(f"{addr} {name}\n" for name, addr in SLURM_NODES)
    # The reference's client (TcpWithHostname) listens on its host name's address and refuses
    # a loopback one: its name goes first, at the address of the default route's interface.
    own = _route_source()
    first = f"{own} {socket.gethostname()}\n" if own else ""
    hosts.write_text(first + Path("/etc/hosts").read_text() + "\n# benchmark only\n" + extra)
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)


def _route_source() -> str | None:
    """The source address of this host's default route, if any."""
    done = subprocess.run(
        ["ip", "route", "get", "1.1.1.1"], capture_output=True, text=True, check=False
    )
    words = done.stdout.split()
    return words[words.index("src") + 1] if "src" in words[:-1] else None


def _rounds_of(rounds: int, reference: bool, log_dir: Path) -> list[dict[str, Any]]:
    """``rounds`` rounds of ours and the reference's (when it runs), in the order ours, ref,
    ref, ours, ours, ref...: neither side always runs first, after the other's teardown."""
    records = []
    for index in range(rounds):
        row: dict[str, Any] = {"round": index + 1}
        port = 23000 + index * 2
        sides = ["ours", "ref"] if reference else ["ours"]
        if index % 2 == 1:
            sides.reverse()
        results: dict[str, dict[str, float]] = {}
        settle = _settle_seconds()
        for side in sides:
            _wait_slurm_empty()
            time.sleep(settle)  # an idle controller for both sides (see the module docstring)
            row[f"load_before_{side}"] = os.getloadavg()[0]
            if side == "ours":
                results[side] = _measure(
                    sys.executable, _our_env(), str(HOSTS), str(port), str(log_dir)
                )
            else:
                env = _ref_env(_squeue_shim_dir)
                results[side] = _measure(REF_PYTHON, env, str(HOSTS), str(port + 1), str(log_dir))
        row["order"] = ",".join(sides)
        for side, result in results.items():
            row.update({f"{side}_{key}": value for key, value in result.items()})
        if reference:
            for key, value in results["ref"].items():
                row[f"ratio_{key}"] = results["ours"][key] / value
        records.append(row)
        print(f"round {index + 1}/{rounds}: {row}", file=sys.stderr)
    return records


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians of every figure over the rounds, and each one's min and max."""
    keys = [k for k in records[0] if k.startswith(("ours_", "ref_", "ratio_", "load_"))]
    figures: dict[str, Any] = {k: median([r[k] for r in records]) for k in keys}
    for key in keys:
        values = [r[key] for r in records]
        figures[f"{key}_range"] = [min(values), max(values)]
    figures["rounds"] = len(records)
    return figures


def _cell(figures: dict[str, Any], key: str, ratio: bool = False) -> str:
    if key not in figures:
        return "-"
    low, high = figures[f"{key}_range"]
    if ratio:
        return f"**{figures[key]:.2f}x** ({low:.2f}-{high:.2f})"
    return f"{figures[key]:.2f} s ({low:.2f}-{high:.2f})"


def _load_cell(figures: dict[str, Any]) -> str:
    if "load_before_ours" not in figures:
        return "-"
    low, high = figures["load_before_ours_range"]
    return f"median {figures['load_before_ours']:.2f} ({low:.2f}-{high:.2f})"


def _round_rows(records: Sequence[dict[str, Any]]) -> list[str]:
    """One table row per round (the target is about every round, not only the median)."""
    if not records or "ratio_ready" not in records[0]:
        return []
    over = sum(1 for r in records if r["ratio_ready"] > 1.0)
    lines = [
        "",
        f"Every round (ready over 1.0x in {over} of {len(records)}):",
        "",
        "| round | order | load before ours | ready: ours / reference | ratio | "
        "first call: ours / reference | ratio |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['round']} | {r['order']} | {r['load_before_ours']:.2f} | "
            f"{r['ours_ready']:.2f} s / {r['ref_ready']:.2f} s | {r['ratio_ready']:.2f}x | "
            f"{r['ours_first_call']:.2f} s / {r['ref_first_call']:.2f} s | "
            f"{r['ratio_first_call']:.2f}x |"
        )
    return lines


def report(
    figures: dict[str, Any],
    meta: dict[str, Any],
    mode: str,
    records: Sequence[dict[str, Any]] = (),
) -> str:
    lines = [
        HEADING,
        "",
        *partial_run_warning(mode),
        f"{machine_line(meta)}; `{meta['command']}`; Slurm {meta['slurm']}; reference: "
        f"{meta['reference']}. `SlurmJob` of {HOSTS} hosts on a local cluster of {HOSTS} nodes; "
        f"medians of {figures['rounds']} rounds (min-max in brackets); ratio = ours / the "
        "reference's in the same round (lower is better; the target is at most 1.0x). "
        "Our sources byte-compiled and the worker loop's dataclass and regex caches written "
        "(untimed), "
        f"as an installation's are after its first start. 1-minute load average before ours "
        f"ran: {_load_cell(figures)}.",
        "",
        "| | ready | first call |",
        "|---|---:|---:|",
        f"| reference | {_cell(figures, 'ref_ready')} | {_cell(figures, 'ref_first_call')} |",
        f"| ours | {_cell(figures, 'ours_ready')} | {_cell(figures, 'ours_first_call')} |",
        f"| ratio | {_cell(figures, 'ratio_ready', True)} "
        f"| {_cell(figures, 'ratio_first_call', True)} |",
        *_round_rows(records),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    add_run_arguments(
        parser,
        quick="2 rounds",
        smoke="1 round of ours (CI)",
        readme=f"replace the {HEADING!r} section of packages/monarch-job/README.md",
    )
    args = parser.parse_args(given)
    mode = run_mode(args)
    reference = mode != "smoke" and _have_reference()
    if reference:
        _enter_private_hosts(given)  # re-runs this script in a private mount namespace
    sys.path.insert(0, str(TESTS))
    import _slurm_cluster  # type: ignore[import-not-found, unused-ignore]

    meta = machine_facts("benchmarks/slurm_apply.py", given)
    meta["reference"] = REF_PYTHON if reference else "not run"
    try:
        cluster = _slurm_cluster.start(SLURM_NODES, own_hostnames=reference)
    except _slurm_cluster.SlurmUnavailable as exc:
        print(f"skipped: no Slurm cluster: {exc}", file=sys.stderr)
        return SKIPPED
    global _squeue_shim_dir
    os.environ["SLURM_CONF"] = str(cluster.conf)
    meta["bytecode"] = "compiled (compileall) for ours; the reference's site-packages as installed"
    try:
        version = subprocess.run(["squeue", "--version"], capture_output=True, text=True)
        meta["slurm"] = version.stdout.split()[-1] if version.stdout.strip() else "?"
        _compile_ours()
        with tempfile.TemporaryDirectory(prefix="slurm-apply-") as folder:
            _squeue_shim_dir = _squeue_shim(Path(folder)) if reference else None
            logs = Path(os.environ.get("MONARCH_BENCH_SLURM_LOGS") or folder)
            _warm_up(logs)
            records = _rounds_of(ROUNDS[mode], reference, logs)
    finally:
        try:  # a cancelled job's slurmstepd is still cleaning up: let it end with its job
            _wait_slurm_empty(30.0)
        except BenchmarkError as exc:
            print(f"warning: {exc}", file=sys.stderr)
        finally:
            cluster.stop()
    figures = summarize(records)
    text = report(figures, meta, mode, records)
    print(text)
    if args.json is not None:
        write_json(args.json, {"meta": meta, "mode": mode, "rounds": records, "summary": figures})
    if args.write_readme:
        write_readme_section(README, text, heading=HEADING)
    return 0


if __name__ == "__main__":
    sys.exit(main())
