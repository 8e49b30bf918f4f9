"""Run ``mypy --strict`` over every package: all sources in one run, then each package's tests.

Each package's ``tests/`` folder is checked on its own because test module names
(``test_import`` and friends) repeat across packages.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    packages = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
    srcs = [str(p / "src") for p in packages]
    env = dict(os.environ, MYPYPATH=os.pathsep.join(srcs))
    mypy = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"), *argv]
    failed = False
    print("mypy --strict: sources of", len(packages), "packages", flush=True)
    failed |= subprocess.call([*mypy, *srcs], cwd=ROOT, env=env) != 0
    for package in packages:
        tests = package / "tests"
        if any(tests.rglob("*.py")):
            print(f"mypy --strict: {package.name}/tests", flush=True)
            failed |= subprocess.call([*mypy, str(tests)], cwd=ROOT, env=env) != 0
    extra = [str(ROOT / d) for d in ("tests", "examples", "benchmarks", "scripts")]
    extra = [d for d in extra if any(Path(d).rglob("*.py"))]
    if extra:
        print("mypy --strict:", ", ".join(Path(d).name for d in extra), flush=True)
        failed |= subprocess.call([*mypy, *extra], cwd=ROOT, env=env) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
