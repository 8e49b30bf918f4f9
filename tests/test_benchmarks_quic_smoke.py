"""The QUIC benchmark script works end to end (its ``--smoke`` mode) and its helpers do what
its docstring says. Nothing here asserts anything about speed: the smoke run only proves that
every case still produces a well-formed row."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import BenchmarkError, run_smoke  # noqa: E402
from benchmarks.quic_throughput import (  # noqa: E402
    BULK,
    CASES,
    MESSAGE,
    RTT,
    SMOKE,
    CaseSpec,
    ClientOutcome,
    Row,
    Sample,
    ServerOutcome,
    _PathCounter,
    markdown_table,
    reduce_trial,
    write_readme_section,
)

SCRIPT = ROOT / "benchmarks" / "quic_throughput.py"
NAMES = {
    "rtt-aioquic-udp",
    "rtt-aioquic-unix",
    "rtt-qh3-udp",
    "bulk-aioquic-udp",
    "bulk-aioquic-unix",
    "bulk-qh3-udp",
}


def test_smoke_run_produces_a_well_formed_row_for_every_case(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = run_smoke(SCRIPT, out, cwd=tmp_path)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    rows = {row["case"]: row for row in document["cases"]}
    assert set(rows) == NAMES
    for name, row in rows.items():
        assert row["measured"], name
        assert row["lower_is_better"] == name.startswith("rtt-")
        for side in ("baseline", "candidate"):
            assert row[side], (name, side)
            for trial in row[side]:
                assert math.isfinite(trial["value"]), (name, side)
                assert trial["value"] > 0, (name, side)
                if name.startswith("rtt-"):
                    assert trial["pings"] == SMOKE.pings
                    assert trial["min_us"] <= trial["value"] <= trial["p90_us"]
                else:
                    assert trial["bytes"] == SMOKE.bulk_bytes
                    assert 0 < trial["counted"] < trial["bytes"]
        assert len(row["pair_ratios"]) == len(row["baseline"]) == len(row["candidate"])
        assert isinstance(row["ratio"], float)
        assert row["ratio"] > 0
        if row["target"] is None:
            assert row["met"] is None
        else:
            assert row["met"] in (True, False)
        assert f"| {name} |" in proc.stdout
    assert proc.stdout.startswith("## Benchmark\n")
    assert "smoke run" in proc.stdout


def _row(spec: CaseSpec, baseline: list[float], candidate: list[float]) -> Row:
    return Row(spec, tuple(Sample(v) for v in baseline), tuple(Sample(v) for v in candidate))


def test_round_trip_target_is_a_maximum_ratio() -> None:
    spec = CaseSpec("rtt-x", RTT, "aioquic", "udp", 0.8)
    assert _row(spec, [100.0, 200.0, 100.0], [70.0, 150.0, 90.0]).met is True  # 0.75x
    assert _row(spec, [100.0, 100.0, 100.0], [90.0, 70.0, 95.0]).met is False  # 0.9x


def test_throughput_target_is_a_minimum_ratio() -> None:
    spec = CaseSpec("bulk-x", BULK, "aioquic", "udp", 1.0)
    assert _row(spec, [10.0, 10.0, 10.0], [11.0, 9.0, 12.0]).met is True  # 1.1x
    assert _row(spec, [10.0, 10.0, 10.0], [9.0, 9.5, 12.0]).met is False  # 0.95x


def test_ratio_is_the_median_of_per_round_ratios() -> None:
    spec = CaseSpec("bulk-x", BULK, "aioquic", "udp", None)
    row = _row(spec, [10.0, 20.0, 40.0], [20.0, 20.0, 20.0])
    assert row.pair_ratios == [2.0, 1.0, 0.5]
    assert row.ratio == 1.0
    assert row.met is None


def test_unmeasured_row_is_marked_not_applicable() -> None:
    spec = CASES[0]
    table = markdown_table([_row(spec, [], [])])
    assert f"| {spec.name} |" in table
    assert "| n/a | 0 |" in table


def test_trial_reduction_rejects_a_short_transfer() -> None:
    client = ClientOutcome((), SMOKE.bulk_bytes, 0.1)
    server = ServerOutcome(SMOKE.bulk_bytes - 1, 1000, 0.01, 0.1)
    with pytest.raises(BenchmarkError, match="receiver got"):
        reduce_trial(BULK, client, server, SMOKE)


def test_trial_reduction_rejects_missing_round_trips() -> None:
    echoed = (SMOKE.warmup + SMOKE.pings) * len(MESSAGE)
    client = ClientOutcome((0.001,) * (SMOKE.pings - 1), 0, 0.1)
    with pytest.raises(BenchmarkError, match="round trips"):
        reduce_trial(RTT, client, ServerOutcome(echoed, 0, 0.0, 0.1), SMOKE)


def test_trial_reduction_rejects_garbage_from_a_child() -> None:
    with pytest.raises(BenchmarkError, match="malformed"):
        reduce_trial(RTT, ("not", "an", "outcome"), None, SMOKE)


def test_round_trip_trial_reduces_to_its_median_in_microseconds() -> None:
    rtts = tuple(0.001 * (1 + i % 3) for i in range(SMOKE.pings))  # 1, 2 and 3 ms
    echoed = (SMOKE.warmup + SMOKE.pings) * len(MESSAGE)
    sample = reduce_trial(RTT, ClientOutcome(rtts, 0, 0.05), ServerOutcome(echoed, 0, 0, 0), SMOKE)
    assert sample.value == pytest.approx(2000.0)
    assert sample.detail["client_cpu_us_per_rtt"] == pytest.approx(1000.0)


def test_readme_section_is_appended_once_then_replaced_in_place(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\nintro\n\n## Usage\n\ntext\n")
    write_readme_section(readme, "## Benchmark\n\nfirst\n")
    assert readme.read_text() == "# pkg\n\nintro\n\n## Usage\n\ntext\n\n## Benchmark\n\nfirst\n"
    readme.write_text(readme.read_text() + "\n## Later\n\nkept\n")
    write_readme_section(readme, "## Benchmark\n\nsecond\n")
    assert readme.read_text() == (
        "# pkg\n\nintro\n\n## Usage\n\ntext\n\n## Benchmark\n\nsecond\n\n## Later\n\nkept\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temporary left behind


def test_path_dump_writes_the_median_path_by_name(tmp_path: Path) -> None:
    # ``--path-dump``: the counter keeps the names of each path's calls and writes the median
    # one (by length, after the first fifth as warm-up); calls outside a path are not named.
    counter = _PathCounter(tmp_path)
    frame = sys._getframe()
    for length in (9, 1, 3, 2, 5):  # the first is warm-up; median of [1, 2, 3, 5] is 3
        counter.profile(frame, "c_call", len)  # before the receipt: not on a path
        counter.received()
        for _ in range(length):
            counter.profile(frame, "call", None)
        counter.profile(frame, "c_call", len)
        counter.sending()
    result = counter.stop(messages=5)
    assert result["path_calls"] == 3.5  # each path plus its builtin: [2, 3, 4, 6]
    (dump,) = tmp_path.iterdir()
    name = f"{Path(__file__).name}:test_path_dump_writes_the_median_path_by_name"
    assert dump.read_text().splitlines() == [name] * 3 + ["C:len"]
