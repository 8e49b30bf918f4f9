"""The node scale benchmark works end to end (its ``--smoke`` mode: 4 processes) and writes its
README section in place. Nothing here asserts anything about speed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke, write_readme_section  # noqa: E402
from benchmarks.node_scale import SMOKE  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "node_scale.py"


def test_smoke_run_measures_launches_convergence_and_echoes(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_smoke(SCRIPT, out, cwd=tmp_path)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    (row,) = document["rounds"]
    nodes = SMOKE.sizes[0]
    assert row["nodes"] == nodes
    scale = row["scale"]
    assert scale["event"] == "chrysalis_scale_result"
    assert scale["children"] == nodes - 1
    assert 0 < scale["launch_seconds"] <= scale["join_seconds"] == row["join_seconds"]
    assert scale["first_echo"]["count"] == nodes - 1
    assert scale["echo"]["count"] == (SMOKE.echo_rounds - 1) * (nodes - 1)
    assert row["unix_echo"]["count"] == SMOKE.unix_echoes
    assert scale["start"] == "fork"
    assert row["exec_scale"]["start"] == "exec"  # the fresh-interpreter comparison ran too
    assert row["exec_scale"]["children"] == nodes - 1
    assert row["memory"]["processes"] == nodes - 1
    assert 0 < row["memory"]["pss_mib_mean"] <= row["memory"]["rss_mib_mean"]
    for key in (
        "bare_launch_seconds",
        "import_launch_seconds",
        "join_over_bare",
        "exec_join_seconds",
        "exec_over_bare",
    ):
        assert math.isfinite(row[key])
        assert row[key] > 0
    assert row["join_over_bare"] == row["join_seconds"] / row["bare_launch_seconds"]
    assert proc.stdout.startswith("## Benchmark\n")
    assert "smoke run" in proc.stdout
    assert f"\n| {nodes} | {scale['tasks']} |" in proc.stdout


def test_readme_section_is_appended_once_then_replaced_in_place(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\n## Usage\n\ntext\n")
    write_readme_section(readme, "## Benchmark\n\nfirst\n")
    assert readme.read_text() == "# pkg\n\n## Usage\n\ntext\n\n## Benchmark\n\nfirst\n"
    readme.write_text(readme.read_text() + "\n## Later\n\nkept\n")
    write_readme_section(readme, "## Benchmark\n\nsecond\n")
    assert readme.read_text() == (
        "# pkg\n\n## Usage\n\ntext\n\n## Benchmark\n\nsecond\n\n## Later\n\nkept\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]
