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
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    (row,) = document["rounds"]
    for key in ("issue_per_s", "done_per_s"):
        assert math.isfinite(row["ours"][key])
        assert row["ours"][key] > 0
    assert "| issued ops/s |" in proc.stdout
