"""The QUIC CPU benchmark works end to end (its ``--smoke`` mode, without valgrind) and its
callgrind arithmetic does what its docstring says. Nothing here asserts anything about speed."""

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
from benchmarks.quic_cpu import (  # noqa: E402
    ENGINES,
    SMOKE,
    instructions_per_round_trip,
    parse_collected,
)

SCRIPT = ROOT / "benchmarks" / "quic_cpu.py"


@pytest.mark.parametrize("carrier", ["udp", "inproc"])
def test_smoke_run_counts_calls_for_both_engines(tmp_path: Path, carrier: str) -> None:
    out = tmp_path / "cpu.json"
    proc = run_smoke(SCRIPT, out, "--carrier", carrier, cwd=tmp_path)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    rows = {row["engine"]: row for row in document["cases"]}
    assert set(rows) == set(ENGINES)
    for engine, row in rows.items():
        assert row["carrier"] == carrier
        assert row["round_trips"] == SMOKE.round_trips
        assert "instructions_per_rtt" not in row  # no valgrind without --callgrind
        python, builtin = row["python_calls_per_rtt"], row["builtin_calls_per_rtt"]
        # a round trip is a write, a datagram each way and a read on both sides: far more
        # than a handful of calls, and the parts add up to the total
        assert math.isfinite(python), engine
        assert python > 50, engine
        assert row["calls_per_rtt"] == pytest.approx(python + builtin)
        assert f"| {engine} | {carrier} |" in proc.stdout
    assert proc.stdout.startswith("## QUIC CPU per round trip\n")
    assert "smoke run" in proc.stdout


def test_one_engine_only(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    run_smoke(SCRIPT, out, "--engine", "qh3", "--carrier", "inproc", cwd=tmp_path)
    assert [row["engine"] for row in json.loads(out.read_text())["cases"]] == ["qh3"]


def test_callgrind_summary_is_parsed_and_differenced() -> None:
    stderr = "==1== Events    : Ir\n==1== Collected : 2316879643\n==1==\n"
    assert parse_collected(stderr) == 2316879643
    assert instructions_per_round_trip(1_000_000, 6_000_000) == 10_000.0
    with pytest.raises(BenchmarkError, match="no instruction count"):
        parse_collected("==1== valgrind: something went wrong\n")
