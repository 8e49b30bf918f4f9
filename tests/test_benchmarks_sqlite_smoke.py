"""The chrysalis-sqlite benchmark scripts work end to end (their ``--smoke`` modes), and their
README writer replaces only its own subsection. Nothing here asserts anything about speed: the
smoke runs only prove that every case still produces a well-formed row."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke, write_readme_subsection  # noqa: E402
from benchmarks.sqlite_replication import TREE, Case, neighbours, shares  # noqa: E402

CAPTURE = ROOT / "benchmarks" / "sqlite_capture.py"
REPLICATION = ROOT / "benchmarks" / "sqlite_replication.py"


def _run(script: Path, out: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_smoke(script, out, cwd=cwd)


def _check_trials(name: str, row: dict[str, object]) -> None:
    assert row["measured"], name
    for side in ("baseline", "candidate"):
        trials = row[side]
        assert isinstance(trials, list), (name, side)
        assert trials, (name, side)
        for trial in trials:
            assert trial["counted"] > 0, (name, side, trial)
            assert trial["seconds"] > 0, (name, side, trial)
            assert math.isfinite(trial["rate"]), (name, side, trial)
            assert trial["rate"] > 0, (name, side, trial)
    slowdown = row["slowdown"]
    assert isinstance(slowdown, float), name
    assert math.isfinite(slowdown), name
    assert slowdown > 0, name


def test_capture_smoke_run_produces_a_well_formed_row_for_every_case(tmp_path: Path) -> None:
    out = tmp_path / "capture.json"
    proc = _run(CAPTURE, out, tmp_path)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    rows = {row["case"]: row for row in document["cases"]}
    assert set(rows) == {
        "file-commit-each",
        "file-commit-each+fold",
        "file-batch-100",
        "file-batch-100+fold",
        "memory-batch-100",
        "memory-batch-100+fold",
        "memory-batch-100-upsert",
        "memory-batch-100-upsert+fold",
        "file-batch-100-metadata-only",
        "memory-batch-100-metadata-only",
    }
    for name, row in rows.items():
        _check_trials(name, row)
        assert f"| {name} (" in proc.stdout
    assert proc.stdout.startswith("### Capture overhead\n")


def test_replication_smoke_run_converges_every_database_in_both_cases(tmp_path: Path) -> None:
    out = tmp_path / "replication.json"
    proc = _run(REPLICATION, out, tmp_path)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    assert document["config"]["rows"] == 200
    rows = {row["case"]: row for row in document["cases"]}
    assert set(rows) == {"leaf-writer", "spread-writers"}
    for name, row in rows.items():
        _check_trials(name, row)
        for side in ("plain", "chrysalis"):
            for detail in row["extra"][side]:
                # every process reported convergence, no earlier than the clock started
                assert set(detail["per_node_s"]) == {n for n, _ in TREE}, (name, side)
                assert all(s >= 0 for s in detail["per_node_s"].values()), (name, side)
                assert detail["converge_s"] == max(detail["per_node_s"].values())
        assert f"| {name} (" in proc.stdout
    assert proc.stdout.startswith("### Replication across five processes\n")


def test_rows_are_shared_over_the_writers_and_the_tree_is_connected() -> None:
    spread = Case("spread", tuple(n for n, _ in TREE), "")
    assert shares(spread, 12) == {"root": 3, "a": 3, "b": 2, "a1": 2, "b1": 2}
    assert shares(Case("leaf", ("a1",), ""), 7) == {"root": 0, "a": 0, "b": 0, "a1": 7, "b1": 0}
    assert neighbours("root") == ("a", "b")
    assert neighbours("a") == ("root", "a1")
    assert neighbours("b1") == ("b",)
    edges = {frozenset((n, m)) for n, _ in TREE for m in neighbours(n)}
    assert len(edges) == len(TREE) - 1


def test_readme_subsection_replacement_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "# pkg\n\n## Benchmark\n\nintro\n\n### Capture overhead\n\nold capture\n\n"
        "### Replication across five processes\n\nold replication\n\n## Next\n\nkeep\n"
    )
    write_readme_subsection(readme, "### Capture overhead", "### Capture overhead\n\nnew\n")
    assert readme.read_text() == (
        "# pkg\n\n## Benchmark\n\nintro\n\n### Capture overhead\n\nnew\n\n"
        "### Replication across five processes\n\nold replication\n\n## Next\n\nkeep\n"
    )
    write_readme_subsection(
        readme,
        "### Replication across five processes",
        "### Replication across five processes\n\nnewer\n",
    )
    assert readme.read_text() == (
        "# pkg\n\n## Benchmark\n\nintro\n\n### Capture overhead\n\nnew\n\n"
        "### Replication across five processes\n\nnewer\n\n## Next\n\nkeep\n"
    )


def test_readme_subsection_is_appended_to_the_section_or_the_file(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\n## Benchmark\n\nintro\n\n## Next\n\nkeep\n")
    write_readme_subsection(readme, "### Sub", "### Sub\n\nbody\n")
    assert (
        readme.read_text()
        == "# pkg\n\n## Benchmark\n\nintro\n\n### Sub\n\nbody\n\n## Next\n\nkeep\n"
    )
    bare = tmp_path / "BARE.md"
    bare.write_text("# pkg\n")
    write_readme_subsection(bare, "### Sub", "### Sub\n\nbody\n")
    assert bare.read_text() == "# pkg\n\n## Benchmark\n\n### Sub\n\nbody\n"
    write_readme_subsection(bare, "### Sub", "### Sub\n\nagain\n")
    assert bare.read_text() == "# pkg\n\n## Benchmark\n\n### Sub\n\nagain\n"
