"""Hypothesis profiles (issue 15): CI runs are derandomized and use no example database, on
every package's tests, in the workspace run and when a package is installed and tested alone
(``scripts/check_isolated.py``: its ``tests/`` folder run with ``-c /dev/null`` outside the
workspace's configuration, so each folder's own ``conftest.py`` must load the profiles)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = [*sorted((ROOT / "packages").glob("*/tests")), ROOT / "tests"]
BEGIN = "# --- Hypothesis profiles"
END = "# --- end of the Hypothesis profiles\n"

PROBE = """
import json
import os

from hypothesis import given, settings, strategies as st

EXPLICIT = settings(max_examples=20)  # what @settings(max_examples=20) inherits
SEEN: list[int] = []


@EXPLICIT
@given(st.integers(0, 2**62))
def test_draws(value: int) -> None:
    SEEN.append(value)


def test_report() -> None:
    current = settings()
    report = {
        "profile": settings._current_profile,
        "derandomize": EXPLICIT.derandomize,
        "database": EXPLICIT.database is None,
        "deadline": EXPLICIT.deadline is None,
        "max_examples": current.max_examples,
        "drawn": SEEN,
    }
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump(report, out)
"""


def _block(path: Path) -> str:
    text = path.read_text()
    assert BEGIN in text, f"{path} lacks the Hypothesis profiles block"
    assert END in text, f"{path} lacks the end of the Hypothesis profiles block"
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def test_every_tests_folder_loads_the_same_profiles() -> None:
    blocks = {folder: _block(folder / "conftest.py") for folder in FOLDERS}
    reference = blocks[ROOT / "tests"]
    assert [f for f, b in blocks.items() if b != reference] == []


def _probe(tmp_path: Path, name: str, ci: str | None) -> dict[str, object]:
    """Run a probe test as check_isolated.py runs a package's tests: its folder (with a copy
    of a package's conftest.py) outside the workspace, ``-c /dev/null``, another root dir."""
    folder = tmp_path / name / "tests"
    folder.mkdir(parents=True)
    conftest = (ROOT / "packages" / "chrysalis-sqlite" / "tests" / "conftest.py").read_text()
    (folder / "conftest.py").write_text(conftest)
    (folder / "test_probe.py").write_text(PROBE)
    run_dir = tmp_path / name / "run"
    run_dir.mkdir()
    out = tmp_path / name / "out.json"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    env["PROBE_OUT"] = str(out)
    if ci is not None:
        env["CI"] = ci
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "--import-mode=importlib"),
            *("-p", "no:cacheprovider", "--rootdir", str(run_dir), "-c", os.devnull),
            str(folder),
        ],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert isinstance(report, dict)
    return report


def test_ci_runs_are_derandomized_and_developer_runs_draw_new_examples(tmp_path: Path) -> None:
    first, second = _probe(tmp_path, "ci1", "true"), _probe(tmp_path, "ci2", "true")
    assert first["profile"] == "ci"
    assert (first["derandomize"], first["database"], first["deadline"]) == (True, True, True)
    assert first["drawn"] == second["drawn"]  # the same examples, run after run
    mine, again = _probe(tmp_path, "dev1", None), _probe(tmp_path, "dev2", "false")
    assert mine["profile"] == again["profile"] == "dev"
    assert (mine["derandomize"], mine["database"], mine["deadline"]) == (False, False, True)
    assert mine["max_examples"] == 200  # tests without their own count
    assert mine["drawn"] != again["drawn"]


@pytest.mark.parametrize("value", ["true", "TRUE", "1"])
def test_ci_is_read_from_the_environment(tmp_path: Path, value: str) -> None:
    assert _probe(tmp_path, "ci", value)["profile"] == "ci"


def test_the_ci_entry_point_sets_ci() -> None:
    assert 'export CI="${CI:-true}"' in (ROOT / ".ci" / "run").read_text()
