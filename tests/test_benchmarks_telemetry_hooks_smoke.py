"""The telemetry hooks A/B (``benchmarks/telemetry_hooks.py``) works end to end: its ``--smoke``
mode loads the hooks of a git revision next to this tree's and times both. Nothing here asserts
anything about speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "telemetry_hooks.py"


def _has_git_history() -> bool:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "HEAD"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.mark.skipif(not _has_git_history(), reason="needs the repository's git history")
def test_smoke_run_times_both_sides_of_both_cases(tmp_path: Path) -> None:
    out = tmp_path / "hooks.json"
    proc = run_smoke(SCRIPT, out, "--against", "HEAD", cwd=tmp_path)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    assert document["config"]["against"] == "HEAD"
    rows = {row["case"]: row for row in document["cases"]}
    assert set(rows) == {"metric hooks", "tracing"}
    for name, row in rows.items():
        assert row["measured"], name
        assert row["baseline"], name
        assert row["candidate"], name
    assert "| metric hooks |" in proc.stdout


@pytest.mark.skipif(not _has_git_history(), reason="needs the repository's git history")
def test_per_hook_rows_time_every_hook_on_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "hooks.json"
    proc = run_smoke(SCRIPT, out, "--against", "HEAD", "--per-hook", cwd=tmp_path)
    document = json.loads(out.read_text())
    assert document["config"]["per_hook"] is True
    hooks = [row for row in document["cases"] if row["case"].startswith("hook: ")]
    assert len(hooks) == 9  # ``per_hook_cases``: eight hooks, and the receive span with both on
    for row in hooks:
        assert row["measured"], row["case"]
        assert row["baseline"], row["case"]
        assert row["candidate"], row["case"]
    assert "ns per call here" in proc.stdout
