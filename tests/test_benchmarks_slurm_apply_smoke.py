"""The SlurmJob apply benchmark works end to end (its ``--smoke`` mode: one round of ours, 4
hosts, on a Slurm cluster of 4 nodes it starts; skipped with the reason where none can start)
and its summary takes medians and the spread. Nothing here asserts anything about speed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.slurm_apply import HEADING, SKIPPED, _round_rows, summarize  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "slurm_apply.py"


def test_smoke_run_times_one_round_of_ours(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    if proc.returncode == SKIPPED:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    (row,) = document["rounds"]
    assert set(row) == {"round", "order", "load_before_ours", "ours_ready", "ours_first_call"}
    assert row["order"] == "ours"
    assert row["load_before_ours"] >= 0
    assert 0 < row["ours_ready"] <= row["ours_first_call"]
    assert math.isfinite(row["ours_first_call"])
    assert proc.stdout.startswith(HEADING + "\n")
    assert "| ours |" in proc.stdout
    assert "smoke run" in proc.stdout


def test_the_summary_takes_medians_and_the_spread_of_the_ratios() -> None:
    rows = [
        {"round": i, "ours_ready": o, "ref_ready": r, "ratio_ready": o / r}
        for i, (o, r) in enumerate([(2.0, 1.0), (3.0, 1.0), (1.0, 1.0)])
    ]
    figures = summarize(rows)
    assert figures["ours_ready"] == 2.0
    assert figures["ratio_ready"] == 2.0
    assert figures["ratio_ready_range"] == [1.0, 3.0]
    assert figures["rounds"] == 3


def test_the_report_lists_every_round_and_counts_those_over_the_target() -> None:
    rows = [
        {
            "round": i + 1, "order": "ours,ref", "load_before_ours": 3.0,
            "ours_ready": o, "ref_ready": r, "ratio_ready": o / r,
            "ours_first_call": o + 1, "ref_first_call": r + 1,
            "ratio_first_call": (o + 1) / (r + 1),
        }
        for i, (o, r) in enumerate([(2.0, 1.0), (1.0, 2.0), (1.5, 3.0)])
    ]  # fmt: skip
    lines = _round_rows(rows)
    assert "ready over 1.0x in 1 of 3" in lines[1]
    assert [line.split(" | ")[4] for line in lines[-3:]] == ["2.00x", "0.50x", "0.50x"]
    assert _round_rows([{"round": 1, "ours_ready": 1.0}]) == []  # no reference: no rows
