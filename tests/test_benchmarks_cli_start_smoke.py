"""The CLI start-up benchmark works end to end (its ``--smoke`` mode: one round against a root
it starts) and writes its own README section. Nothing here asserts anything about speed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke, write_readme_section  # noqa: E402
from benchmarks.cli_start import CASES, HEADING, LABELS  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "cli_start.py"


def test_smoke_run_times_help_and_ls_against_a_bare_interpreter(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_smoke(SCRIPT, out, cwd=tmp_path, timeout=120.0)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    (row,) = document["rounds"]
    for key in ("bare_seconds", "help_seconds", "imports_seconds", "ls_seconds", "ls_over_bare"):
        assert math.isfinite(row[key])
        assert row[key] > 0
    assert row["ls_over_bare"] == row["ls_seconds"] / row["bare_seconds"]
    assert document["summary"]["ls_over_bare"] == row["ls_over_bare"]
    assert proc.stdout.startswith(HEADING + "\n")
    for case in CASES:  # a row per measured command, the lone ``ls`` and the agent's included
        if case != "bare":
            assert f"| {LABELS[case]} |" in proc.stdout, case
    assert "smoke run" in proc.stdout


def test_its_section_sits_beside_the_scale_benchmark(tmp_path: Path) -> None:
    """``node_scale.py --write-readme`` replaces ``## Benchmark`` whole, so this script owns a
    section of its own."""
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\n## Benchmark\n\nscale\n")
    write_readme_section(readme, f"{HEADING}\n\nfirst\n", heading=HEADING)
    write_readme_section(readme, f"{HEADING}\n\nsecond\n", heading=HEADING)
    assert readme.read_text() == f"# pkg\n\n## Benchmark\n\nscale\n\n{HEADING}\n\nsecond\n"
