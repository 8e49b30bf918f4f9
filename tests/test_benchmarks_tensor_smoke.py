"""The tensor-engine benchmark works end to end (``--smoke``: one round, ours only). Nothing
here asserts anything about speed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "tensor_ops.py"


def test_smoke_run_measures_our_engine(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    (row,) = document["rounds"]
    for kind, key in (
        ("ops", "issue_per_s"),
        ("ops", "done_per_s"),
        ("train", "step_s"),
        ("reduce", "reduce_s"),
    ):
        assert math.isfinite(row[f"ours_{kind}"][key])
        assert row[f"ours_{kind}"][key] > 0
    assert not any(k.startswith("reference_") for k in row)
    # The training example's loss after 2 warm-up and 2 timed steps (its recorded output).
    # (Its last printed digit depends on the CPU's float32 kernels: see the compat script's
    # ``LAST_DIGIT_UNITS``.)
    assert math.isclose(float(row["ours_train"]["last_loss"]), 0.923507, abs_tol=2.5e-6)
    assert "| issued ops/s (2 processes) |" in proc.stdout
    assert "| training step, s (2x2 mesh) |" in proc.stdout
