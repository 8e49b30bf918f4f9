"""The datagram benchmark script works end to end (its ``--smoke`` mode), and its helpers do
what the benchmark README says. Nothing here asserts anything about speed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    CaseResult,
    Trial,
    alternate,
    markdown_table,
    run_smoke,
    write_readme_section,
)

SCRIPT = ROOT / "benchmarks" / "datagram_throughput.py"
CASES = {"udp", "udp-gso", "unixgram", "inproc", "udp-asyncio", "switch", "switch-cpu"}


def test_smoke_run_produces_a_well_formed_row_for_every_carrier(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_smoke(SCRIPT, out, "--quick", cwd=tmp_path)  # --smoke wins over --quick
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    rows = {row["case"]: row for row in document["cases"]}
    assert set(rows) == CASES
    for name, row in rows.items():
        assert row["measured"], name
        for side in ("baseline", "candidate"):
            assert row[side], (name, side)
            for trial in row[side]:
                assert 0 < trial["received"] <= trial["sent"], (name, side, trial)
                assert math.isfinite(trial["rate"]), (name, side)
                assert trial["rate"] >= 0, (name, side)
        assert len(row["pair_ratios"]) == len(row["baseline"]) == len(row["candidate"])
        assert isinstance(row["ratio"], float)
        assert row["met"] in (True, False) if row["target"] is not None else row["met"] is None
        assert f"| {name} |" in proc.stdout
    assert proc.stdout.startswith("## Benchmark\n")


def _trial(rate: float) -> Trial:
    return Trial(counted=int(rate), seconds=1.0, received=int(rate) + 1, sent=int(rate) + 1)


def test_alternate_runs_baseline_and_candidate_in_abab_order() -> None:
    order: list[str] = []

    def baseline() -> Trial:
        order.append("A")
        return _trial(100)

    def candidate() -> Trial:
        order.append("B")
        return _trial(90)

    base, cand = alternate(baseline, candidate, 3, budget_s=60)
    assert order == ["A", "B", "A", "B", "A", "B"]
    assert len(base) == len(cand) == 3


def test_alternate_stops_after_a_whole_round_once_the_budget_is_spent() -> None:
    ticks = iter(range(100))

    def clock() -> float:
        return float(next(ticks))

    base, cand = alternate(lambda: _trial(1), lambda: _trial(1), 10, budget_s=2.5, clock=clock)
    # the clock starts at 0 and reads 1, 2, 3 after the rounds: 3 - 0 >= 2.5 ends the third
    assert len(base) == len(cand) == 3


def test_ratio_is_the_median_of_per_round_ratios_not_the_ratio_of_medians() -> None:
    result = CaseResult(
        "x",
        "base",
        "cand",
        0.9,
        baseline=(_trial(100), _trial(200), _trial(400)),
        candidate=(_trial(50), _trial(300), _trial(400)),
    )
    assert result.pair_ratios == [0.5, 1.5, 1.0]
    assert result.ratio == 1.0
    assert result.baseline_median == 200
    assert result.candidate_median == 300
    assert result.met is True
    table = markdown_table([result])
    assert "| x | base | 200 | 300 | 1.00x | 0.50-1.50 | >= 0.9x | yes | 3 |" in table


def test_unmeasured_case_has_no_verdict() -> None:
    result = CaseResult("skipped", "base", "cand", 2.0)
    assert result.met is None
    assert "| skipped | base | - | - |" in markdown_table([result])
    with pytest.raises(ValueError, match="median of no values"):
        _ = result.ratio


def test_readme_section_is_appended_when_absent(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\nIntro.\n")
    write_readme_section(readme, "## Benchmark\n\nnew table\n")
    assert readme.read_text() == "# pkg\n\nIntro.\n\n## Benchmark\n\nnew table\n"


def test_readme_section_replacement_leaves_the_other_sections_alone(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\n## Benchmark\n\nold\n\n## Usage\n\nkeep me\n")
    write_readme_section(readme, "## Benchmark\n\nnew\n")
    assert readme.read_text() == "# pkg\n\n## Benchmark\n\nnew\n\n## Usage\n\nkeep me\n"
    write_readme_section(readme, "## Benchmark\n\nnewer\n")
    assert readme.read_text() == "# pkg\n\n## Benchmark\n\nnewer\n\n## Usage\n\nkeep me\n"
