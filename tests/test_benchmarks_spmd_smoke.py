"""The SPMD all-reduce benchmark works end to end (its ``--smoke`` mode). Nothing here asserts
anything about speed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "spmd_allreduce.py"


def test_smoke_run_measures_both_sides(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("monarch.spmd")
    out = tmp_path / "bench.json"
    proc = run_smoke(SCRIPT, out, cwd=tmp_path, timeout=300.0)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    (trial,) = document["trials"]
    for side in ("torchrun", "mesh"):
        assert 0 < trial[side]["startup"] < 300, side
        (median,) = trial[side]["medians"].values()
        assert math.isfinite(median), side
        assert median > 0, side
    assert "| all-reduce 64 KiB |" in proc.stdout
    assert "| start-up to a ready group |" in proc.stdout
