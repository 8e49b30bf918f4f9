"""Prove that every package publishes on its own.

For each package under ``packages/``: build its wheel, create a fresh virtual environment,
install that wheel with its ``test`` extra plus the wheels of the sibling packages it
declares (transitively, nothing else from the workspace), then run the package's own
tests there from a directory outside the repository, so only the installed wheel can be
imported.

Usage: ``python scripts/check_isolated.py [PACKAGE ...]`` (default: all packages).
"""

from __future__ import annotations

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


def main(argv: list[str]) -> int:
    workspace = _workspace()
    selected = argv or list(workspace)
    unknown = [n for n in selected if n not in workspace]
    if unknown:
        print(f"unknown packages: {unknown}; known: {sorted(workspace)}", file=sys.stderr)
        return 2
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
        for name in selected:
            started = time.monotonic()
            env_dir = work / "venvs" / name
            venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
            python = str(env_dir / "bin" / "python")
            closure = _sibling_closure(name, workspace)
            targets = [f"{built[name]}[test]"] + [str(built[d]) for d in closure if d != name]
            _run(
                [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *targets]
            )
            tests = Path(workspace[name]["folder"]) / "tests"  # type: ignore[arg-type]
            run_dir = work / "run" / name
            run_dir.mkdir(parents=True)
            result = subprocess.run(
                [
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
                    os.devnull,
                    str(tests),
                ],
                cwd=run_dir,
                timeout=PER_PACKAGE_TEST_TIMEOUT,
                check=False,
            )
            took = time.monotonic() - started
            status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
            print(f"isolated {name}: {status} in {took:.0f} s", flush=True)
            if result.returncode != 0:
                failures.append(name)
        if failures:
            print(f"isolated install/test failed for: {', '.join(failures)}", file=sys.stderr)
            return 1
        print(f"isolated: all {len(selected)} packages installed and passed alone")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
