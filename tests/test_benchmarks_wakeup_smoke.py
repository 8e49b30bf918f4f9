"""The wake-up cost benchmark works end to end (its ``--smoke`` mode: one short trial of each
side of every case, the actor case included). Nothing here asserts anything about speed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke  # noqa: E402
from benchmarks.wakeup_cost import CASES, HEADING, WAKEUPS  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "wakeup_cost.py"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_smoke_run_measures_every_case_pinned_and_free(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_smoke(SCRIPT, out, cwd=tmp_path, timeout=240.0)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    assert "guest_halt_poll_ns" in document["meta"]
    results = {row["case"]: row for row in document["results"]}
    assert set(results) == set(CASES)
    for case, row in results.items():
        assert row["wakeups"] == WAKEUPS[case]
        sides = {"same CPU", "free"} | ({"split"} if case == "actor" else set())
        assert set(row["p50_us"]) == sides
        for value in row["p50_us"].values():
            assert math.isfinite(value)
            assert value > 0
        assert f"| {case} | {WAKEUPS[case]} |" in proc.stdout
    assert proc.stdout.startswith(HEADING + "\n")
    assert "smoke run" in proc.stdout


def test_an_unknown_case_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--case", "nonsense"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert "unknown case(s): nonsense" in proc.stderr
