"""The ``ProcessJob`` apply benchmark works end to end (its ``--smoke`` mode: one round of ours,
two hosts). Nothing here asserts anything about speed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "job_apply.py"


def test_smoke_run_times_one_round_of_ours(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_smoke(SCRIPT, out, cwd=tmp_path, timeout=240.0)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    (row,) = document["rounds"]
    assert set(row) == {"round", "load", "ours"}
    assert row["load"] >= 0
    for key in ("ready", "first_call"):
        assert math.isfinite(row["ours"][key])
        assert 0 < row["ours"][key]
    assert row["ours"]["ready"] <= row["ours"]["first_call"]
    assert "| ours |" in proc.stdout
