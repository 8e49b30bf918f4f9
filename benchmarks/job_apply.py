"""Time from ``apply()`` to a ready ``HostMesh`` of 4 hosts: this project's ``monarch.job``
against the reference Monarch's (torchmonarch 0.7.0, ``/work/ref/bin/python`` or
``$MONARCH_REF_PYTHON``), side by side in one run.

Usage::

    python benchmarks/job_apply.py [--quick | --smoke] [--case NAME] [--json OUT] [--write-readme]

Cases (each a pair: ours, then the reference's, alternating in every round):

- ``process``: ``ProcessJob({"hosts": 4})``, hosts as local processes (the reference: worker
  loops on Unix sockets; ours: forked from a zygote of the client, on loopback UDP).
- ``netns``: ours only, ``ProcessJob`` with each host in its own network namespace (needs
  root and iproute2; informational, no reference counterpart).
- ``slurm``: ``SlurmJob({"hosts": 4})`` on a throwaway local Slurm cluster of 4 nodes
  (``packages/monarch-job/tests/_slurm_cluster.py``: Debian's slurm-wlm, one machine). The
  reference's worker listens on ``tcp://$(hostname):PORT`` and its client dials the node
  names, so each ``slurmd`` runs in a UTS namespace named after its node, and the node names
  resolve through an ``/etc/hosts`` that exists only inside a private mount namespace: the
  script re-runs itself under ``unshare --mount`` and bind-mounts a temporary hosts file
  there; the machine's ``/etc/hosts`` is never written.

One measurement is one fresh client process (``benchmarks/_job_apply_child.py``, with the
interpreter of its side), which times ``apply()`` + ``state()`` (``state_s``) and until an
actor on every host answered (``ready_s``: the reference's ``state()`` returns before its hosts
are connected, so "ready" means every host ran an actor, for both). Imports and interpreter
start are not timed. The headline is the median over rounds of ours / reference in the same
round; the spread is the min and max of those ratios. Full run: 3 rounds (the machine is
shared); ``--quick``: 2; ``--smoke``: 1 round of ``process``, ours only where no reference
is installed.
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
    check_cases,
    machine_facts,
    machine_line,
    median,
    partial_run_warning,
    run_mode,
    write_json,
    write_readme_section,
)

README: Final = ROOT / "packages" / "monarch-job" / "README.md"
HEADING: Final = "## Benchmark: apply() to a ready HostMesh"
CHILD: Final = ROOT / "benchmarks" / "_job_apply_child.py"
TESTS: Final = ROOT / "packages" / "monarch-job" / "tests"
REF_PYTHON: Final = os.environ.get("MONARCH_REF_PYTHON", "/work/ref/bin/python")
HOSTS: Final = 4
CASES: Final = ("process", "netns", "slurm")
ROUNDS: Final = {"full": 3, "quick": 2, "smoke": 1}
CHILD_TIMEOUT: Final = 240.0
SLURM_NODES: Final = tuple((f"n{i + 1}", f"127.0.0.{i + 2}") for i in range(HOSTS))
_IN_NAMESPACE: Final = "MONARCH_BENCH_PRIVATE_HOSTS"
_squeue_shim_dir: Path | None = None


def _our_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


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


def _have_reference() -> bool:
    return Path(REF_PYTHON).exists()


def _enter_private_hosts(argv: Sequence[str]) -> None:
    """Re-run this script in a private mount namespace (``unshare --mount``) unless already
    there; inside, bind-mount a temporary copy of ``/etc/hosts`` with the Slurm node names."""
    if os.environ.get(_IN_NAMESPACE) != "1":
        if shutil.which("unshare") is None or os.geteuid() != 0:
            raise BenchmarkError("the slurm case needs root and unshare (private /etc/hosts)")
        env = dict(os.environ, **{_IN_NAMESPACE: "1"})
        command = ["unshare", "--mount", "--propagation", "private", sys.executable]
        done = subprocess.run([*command, __file__, *argv], env=env, check=False)
        raise SystemExit(done.returncode)
    hosts = Path(tempfile.mkdtemp(prefix="bench-hosts-")) / "hosts"
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


def _rounds_of(case: str, rounds: int, reference: bool, log_dir: Path) -> list[dict[str, Any]]:
    """``rounds`` rounds of ``case``: ours, then the reference's (where it has one)."""
    records = []
    for index in range(rounds):
        row: dict[str, Any] = {"case": case, "round": index + 1}
        if case == "slurm":
            port = str(23000 + index * 2)
            _wait_slurm_empty()
            ours = _measure(sys.executable, _our_env(), "slurm", str(HOSTS), port, str(log_dir))
            if reference:
                _wait_slurm_empty()
            theirs = (
                _measure(REF_PYTHON, _ref_env(_squeue_shim_dir), "slurm", str(HOSTS),
                         str(int(port) + 1), str(log_dir))
                if reference else None
            )  # fmt: skip
        else:
            ours = _measure(sys.executable, _our_env(), case, str(HOSTS))
            theirs = (
                _measure(REF_PYTHON, _ref_env(), "process", str(HOSTS))
                if reference and case == "process"
                else None
            )
        for key, value in ours.items():
            row[f"ours_{key}"] = value
        if theirs is not None:
            for key, value in theirs.items():
                row[f"ref_{key}"] = value
                row[f"ratio_{key}"] = ours[key] / value
        records.append(row)
        print(f"{case} round {index + 1}/{rounds}: {row}", file=sys.stderr)
    return records


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: medians of every figure, and the min/max of the ratios."""
    out: dict[str, dict[str, Any]] = {}
    for case in dict.fromkeys(r["case"] for r in records):
        rows = [r for r in records if r["case"] == case]
        keys = [k for k in rows[0] if k.startswith(("ours_", "ref_", "ratio_"))]
        figures: dict[str, Any] = {k: median([r[k] for r in rows]) for k in keys}
        for key in keys:
            values = [r[key] for r in rows]
            figures[f"{key}_range"] = [min(values), max(values)]
        figures["rounds"] = len(rows)
        out[case] = figures
    return out


def _cell(figures: dict[str, Any], key: str, ratio: bool = False) -> str:
    if key not in figures:
        return "-"
    low, high = figures[f"{key}_range"]
    if ratio:
        return f"**{figures[key]:.2f}x** ({low:.2f}-{high:.2f})"
    return f"{figures[key]:.2f} s ({low:.2f}-{high:.2f})"


def report(summary: dict[str, dict[str, Any]], meta: dict[str, Any], mode: str) -> str:
    lines = [
        HEADING,
        "",
        *partial_run_warning(mode),
        f"{machine_line(meta)}; `{meta['command']}`. Medians over rounds (min-max in brackets); "
        "ratio = ours / the reference's in the same round (below 1.0x: ours is faster). "
        "*HostMesh* is `apply()` + `state()`; *ready* adds `spawn_procs` and one actor call "
        "answered on every host (the reference's `state()` returns before its hosts are "
        "connected, so only *ready* is the same point for both).",
        "",
        "| case (4 hosts) | ours: HostMesh | ours: ready | reference: HostMesh "
        "| reference: ready | ratio ready |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    names = {
        "process": "`ProcessJob`",
        "netns": "`ProcessJob`, network namespaces",
        "slurm": "`SlurmJob`, local Slurm",
    }
    for case, figures in summary.items():
        lines.append(
            f"| {names[case]} | {_cell(figures, 'ours_state_s')} | "
            f"{_cell(figures, 'ours_ready_s')} | {_cell(figures, 'ref_state_s')} | "
            f"{_cell(figures, 'ref_ready_s')} | {_cell(figures, 'ratio_ready_s', ratio=True)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(
        parser,
        quick="2 rounds",
        smoke="1 round of the process case (CI)",
        cases=CASES,
        readme=f"replace the {HEADING!r} section of packages/monarch-job/README.md",
    )
    args = parser.parse_args(given)
    check_cases(parser, args.case, CASES)
    mode = run_mode(args)
    cases = args.case or (["process"] if mode == "smoke" else list(CASES))
    if "slurm" in cases:
        _enter_private_hosts(given)
    reference = _have_reference()
    meta = machine_facts("benchmarks/job_apply.py", given)
    meta["reference"] = REF_PYTHON if reference else "not installed"
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="job-apply-") as folder:
        for case in cases:
            if case == "netns" and os.geteuid() != 0:
                print("netns: skipped (needs root)", file=sys.stderr)
                continue
            if case == "slurm":
                sys.path.insert(0, str(TESTS))
                import _slurm_cluster  # type: ignore[import-not-found, unused-ignore]

                cluster = _slurm_cluster.start(SLURM_NODES, own_hostnames=True)
                os.environ["SLURM_CONF"] = str(cluster.conf)
                global _squeue_shim_dir
                _squeue_shim_dir = _squeue_shim(Path(folder))
                try:
                    logs = Path(os.environ.get("MONARCH_BENCH_SLURM_LOGS") or folder)
                    records += _rounds_of(case, ROUNDS[mode], reference, logs)
                finally:
                    cluster.stop()
                continue
            records += _rounds_of(case, ROUNDS[mode], reference, Path(folder))
    summary = summarize(records)
    text = report(summary, meta, mode)
    print(text)
    if args.json is not None:
        write_json(args.json, {"meta": meta, "mode": mode, "rounds": records, "summary": summary})
    if args.write_readme:
        write_readme_section(README, text, heading=HEADING)
    return 0


if __name__ == "__main__":
    sys.exit(main())
