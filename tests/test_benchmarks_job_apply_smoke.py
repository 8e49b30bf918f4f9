"""The job-apply benchmark works end to end (its ``--smoke`` mode: one round of ``ProcessJob``
with 4 hosts, side by side with the reference's where the reference is installed) and writes
its own README section. Nothing here asserts anything about speed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke  # noqa: E402
from benchmarks.job_apply import HEADING, summarize  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "job_apply.py"


def test_smoke_run_times_a_process_job_of_four_hosts(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_smoke(SCRIPT, out, cwd=tmp_path, timeout=240.0)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    (row,) = document["rounds"]
    assert row["case"] == "process"
    assert 0 < row["ours_state_s"] <= row["ours_ready_s"]
    assert math.isfinite(row["ours_ready_s"])
    if "ref_ready_s" in row:  # the reference is installed here
        assert row["ratio_ready_s"] == row["ours_ready_s"] / row["ref_ready_s"]
    assert proc.stdout.startswith(HEADING + "\n")
    assert "| `ProcessJob` |" in proc.stdout
    assert "smoke run" in proc.stdout


def test_the_summary_takes_medians_and_the_spread_of_the_ratios() -> None:
    rows = [
        {"case": "slurm", "round": i, "ours_ready_s": o, "ref_ready_s": r, "ratio_ready_s": o / r}
        for i, (o, r) in enumerate([(2.0, 1.0), (3.0, 1.0), (1.0, 1.0)])
    ]
    figures = summarize(rows)["slurm"]
    assert figures["ours_ready_s"] == 2.0
    assert figures["ratio_ready_s"] == 2.0
    assert figures["ratio_ready_s_range"] == [1.0, 3.0]
    assert figures["rounds"] == 3
