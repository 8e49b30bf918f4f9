"""Prove that every package publishes on its own.

For each package under ``packages/``: build its wheel, create a fresh virtual environment,
install that wheel with its ``test`` extra plus the wheels of the sibling packages it
declares (transitively, nothing else from the workspace), then run the package's own
tests there from a directory outside the repository, so only the installed wheel can be
imported.

Usage: ``python scripts/check_isolated.py [--jobs N] [PACKAGE ...]`` (default: all packages).

``--jobs`` (default 2, or ``$CHRYSALIS_ISOLATED_JOBS``) packages are installed and tested at
once, the slowest first; each one's output is printed in one block when it is done. Most of a
package's test time is spent waiting on child processes and timers, not computing: on a 2-core
machine two at a time take about half as long as one at a time (the packages' own times add
up to about 24 minutes there, and the check takes about 12; see the README, "CI time").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "packages"
PER_PACKAGE_TEST_TIMEOUT = 900


def _markers_ini() -> str:
    """A ``[pytest]`` section holding the root ``pytest.ini``'s ``markers`` and nothing else."""
    lines = (Path(__file__).resolve().parent.parent / "pytest.ini").read_text().splitlines()
    markers: list[str] = []
    for line in lines:
        if line.startswith("markers"):
            markers.append("markers =")
        elif markers and line.startswith((" ", "\t")) and line.strip():
            markers.append(line)
        elif markers:
            break
    return "[pytest]\n" + "\n".join(markers) + "\n"


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"cannot parse requirement {requirement!r}")
    return match.group(1).lower().replace("_", "-")


def _workspace() -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = {}
    for folder in sorted(PACKAGES.iterdir()):
        pyproject = folder / "pyproject.toml"
        if pyproject.exists():
            project = tomllib.loads(pyproject.read_text())["project"]
            found[project["name"]] = {"folder": folder, "project": project}
    return found


def _sibling_closure(name: str, workspace: dict[str, dict[str, object]]) -> list[str]:
    seen: list[str] = []
    stack = [name]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.append(current)
        project = workspace[current]["project"]
        assert isinstance(project, dict)
        requirements = list(project.get("dependencies", []))
        if current == name:
            # The package's own test extra may name siblings (test helpers such as the
            # fault-injection carrier); they come from the workspace too, never from an index.
            requirements += project.get("optional-dependencies", {}).get("test", [])
        for requirement in requirements:
            dep = _requirement_name(requirement)
            if dep in workspace:
                stack.append(dep)
    return seen


def _run(cmd: list[str], **kwargs: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


#: Packages whose tests take longest start first, so that the others fill the other slot.
_SLOWEST_FIRST = (
    "monarch-actor",
    "monarch-job",
    "chrysalis-node",
    "monarch-tensor",
    "monarch-spmd",
    "chrysalis-quic",
    "chrysalis-sqlite",
)


def _check_one(
    name: str,
    workspace: dict[str, dict[str, object]],
    built: dict[str, Path],
    work: Path,
) -> tuple[bool, str]:
    """Install ``name`` alone into a fresh venv and run its tests: (passed, the output)."""
    started = time.monotonic()
    log = work / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env_dir = work / "venvs" / name
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    closure = _sibling_closure(name, workspace)
    targets = [f"{built[name]}[test]"] + [str(built[d]) for d in closure if d != name]
    tests = Path(workspace[name]["folder"]) / "tests"  # type: ignore[arg-type]
    run_dir = work / "run" / name
    run_dir.mkdir(parents=True)
    # Only the repository's marker registrations (slow, netns) from its pytest.ini: none of its
    # options or paths, so the package's tests run as an installed package's would.
    ini = run_dir / "pytest.ini"
    ini.write_text(_markers_ini())
    # --no-compile: pip would byte-compile every installed module (torch's thousands: its
    # install took 43 s with that, 18 s without, measured here); the tests compile what they
    # import, once.
    install = [
        python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
        *targets,
    ]  # fmt: skip
    pytest = [
        python,
        "-m",
        "pytest",
        "-q",
        "--import-mode=importlib",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(run_dir),
        "-c",
        str(ini),
        str(tests),
    ]
    with log.open("w") as out:
        ok = True
        for cmd, timeout in ((install, 600), (pytest, PER_PACKAGE_TEST_TIMEOUT)):
            out.write("+ " + " ".join(cmd) + "\n")
            out.flush()
            try:
                code = subprocess.run(
                    cmd, cwd=run_dir, stdout=out, stderr=subprocess.STDOUT, timeout=timeout
                ).returncode
            except subprocess.TimeoutExpired:
                out.write(f"timed out after {timeout} s\n")
                code = -1
            if code != 0:
                ok = False
                status = f"FAILED (exit {code})"
                break
        else:
            status = "ok"
        out.write(f"isolated {name}: {status} in {time.monotonic() - started:.0f} s\n")
    return ok, log.read_text()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", type=int, default=int(os.environ.get("CHRYSALIS_ISOLATED_JOBS", "2"))
    )
    parser.add_argument("packages", nargs="*")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    workspace = _workspace()
    selected = args.packages or list(workspace)
    unknown = [n for n in selected if n not in workspace]
    if unknown:
        print(f"unknown packages: {unknown}; known: {sorted(workspace)}", file=sys.stderr)
        return 2
    slowest = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
    selected.sort(key=lambda name: slowest.get(name, len(slowest)))  # stable: others in order
    check_started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="chrysalis-isolated-"))
    wheels = work / "wheels"
    try:
        needed = sorted({dep for n in selected for dep in _sibling_closure(n, workspace)})
        for name in needed:
            folder = workspace[name]["folder"]
            _run(
                [
                    sys.executable,
                    "-m",
                    "build",
                    "--wheel",
                    "--no-isolation",
                    "--outdir",
                    str(wheels),
                    str(folder),
                ],
                stdout=subprocess.DEVNULL,
            )
        built = {p.name.split("-")[0].replace("_", "-").lower(): p for p in wheels.glob("*.whl")}
        failures: list[str] = []
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            running = {
                pool.submit(_check_one, name, workspace, built, work): name for name in selected
            }
            for done in concurrent.futures.as_completed(running):
                ok, output = done.result()
                print(output, end="", flush=True)
                if not ok:
                    failures.append(running[done])
        if failures:
            print(f"isolated install/test failed for: {', '.join(failures)}", file=sys.stderr)
            return 1
        print(
            f"isolated: all {len(selected)} packages installed and passed alone "
            f"in {time.monotonic() - check_started:.0f} s ({args.jobs} at a time)"
        )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
