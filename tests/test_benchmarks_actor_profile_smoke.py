"""The actor call profile (``benchmarks/actor_profile.py``) works end to end (its ``--smoke``
mode: one spawned worker, 30 + 10 calls) and every stage's probes still fire; its probes leave
the runtime as it was; its arithmetic does what its docstring says. Nothing here asserts
anything about speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ``benchmarks`` is a folder of scripts, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks._common import run_smoke  # noqa: E402
from benchmarks.actor_profile import (  # noqa: E402
    KINDS,
    MODES,
    OVERLAPPING,
    PIPELINED_CALLS,
    STAGES,
    WITHIN,
    _Recorder,
    function_diff,
    join_records,
    parse_callgrind_totals,
    parse_perf_count,
    per_call,
    stage_table,
    torch_available,
)
from monarch.actor._base.future import _Cell  # noqa: E402
from monarch.actor._mesh.adverbs import Endpoint  # noqa: E402
from monarch.actor._runtime.cell import ActorCell, _Mailbox, _SyncRunner  # noqa: E402
from monarch.actor._transport import node as _node  # noqa: E402
from monarch.actor._transport import shm as _shm  # noqa: E402
from monarch.actor._transport.lane_proto import LaneDecoder  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "actor_profile.py"


def test_smoke_run_times_every_stage_of_both_calls(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    proc = run_smoke(SCRIPT, out, cwd=tmp_path, timeout=120)
    document = json.loads(out.read_text())
    assert document["mode"] == "smoke"
    assert document["command"].startswith("python benchmarks/actor_profile.py --smoke")
    kinds = KINDS if torch_available() else KINDS[:2]
    assert set(document["cases"]) == set(kinds)
    for kind, calls in zip(kinds, MODES["smoke"], strict=False):
        case = document["cases"][kind]
        assert case["calls"] == calls
        # every call followed on both sides, and every probe fired on every followed call
        assert case["followed"] == calls, kind
        stages = {entry["stage"]: entry for entry in case["stages"]}
        for stage, *_ in STAGES + OVERLAPPING:
            assert stages[stage]["n"] == calls, (kind, stage)
        assert stages["round trip (probed)"]["n"] == calls
        for stage, *_ in WITHIN:  # the shared-memory spans: every large call, no small one
            assert stages[stage]["n"] == (0 if kind == "call_one" else calls), (kind, stage)
        assert case["round_trip"]["n"] == calls
        assert case["cpu_us_per_call"]["client"] > 0
        assert case["cpu_us_per_call"]["worker"] > 0
        assert ("instructions_per_call" in case) == (document["instructions"] is None)
    for stage, process, *_ in STAGES:
        assert f"| {stage} | {process} |" in proc.stdout
    assert proc.stdout.startswith("## Actor call profile")
    assert "smoke run" in proc.stdout


def test_probes_are_removed_without_a_trace() -> None:
    targets = [
        (_shm.ShmPool, "put"),
        (_shm, "receive_buffer"),
        (_node, "encode_frame"),
        (_node.NodeProcessTransport, "_share"),
        (_node.NodeProcessTransport, "send"),
        (_node.NodeProcessTransport, "_on_inbound"),
        (LaneDecoder, "get_buffer"),
        (LaneDecoder, "buffer_updated"),
        (Endpoint, "_encode"),
        (_Cell, "set_result"),
        (_Mailbox, "put"),
        (_SyncRunner, "_call"),
        (ActorCell, "_begin"),
        (ActorCell, "_reply_value"),
    ]
    before = [getattr(owner, name) for owner, name in targets]
    recorder = _Recorder()
    recorder.install_client()
    try:
        assert _node.NodeProcessTransport.send is not before[4]
        assert _shm.receive_buffer is not before[1]
    finally:
        recorder.uninstall()
    recorder.install_worker()
    try:
        assert _SyncRunner._call is not before[11]
    finally:
        recorder.uninstall()
    assert [getattr(owner, name) for owner, name in targets] == before


def test_stages_add_up_to_the_round_trip_and_calls_pair_by_sequence() -> None:
    marks = ["call", "encoded", "send", "framed"]
    worker_marks = [
        "read",
        "decoded",
        "enqueued",
        "picked",
        "begun",
        "returned",
        "reply_send",
        "reply_framed",
    ]
    client = [
        {**{m: 10 * i for i, m in enumerate(marks)}, "seq": 7, "sent": 35},
        {"call": 0, "seq": 8, "done": 5},  # the worker never saw it: left out
    ]
    worker = [{**{m: 100 + 10 * i for i, m in enumerate(worker_marks)}, "seq": 7, "reply_sent": 0}]
    client[0].update({"reply_read": 300, "reply_decoded": 310, "delivered": 320, "done": 1000})
    client[0]["shm_put"] = 50  # a duration (ns), not a mark
    worker[0]["shm_take"] = 20
    rows = join_records(client, worker)
    assert len(rows) == 1
    assert rows[0]["w.read"] == 100
    table = {entry["stage"]: entry for entry in stage_table(rows)}
    stages = [table[stage]["median_us"] for stage, *_ in STAGES]
    assert table["round trip (probed)"]["median_us"] == 1.0
    assert sum(stages) == pytest.approx(1.0)
    assert table["future completion (wake, decode)"]["median_us"] == 0.68
    assert table["future completion (wake, decode)"]["share"] == 0.68
    assert table["(overlaps) client send returned after"]["median_us"] == 0.005
    assert table["(within) client shm slot copy"]["median_us"] == 0.05
    assert table["(within) worker shm slot take"]["median_us"] == 0.02
    assert table["(within) worker shm slot take"]["share"] == 0.02


def test_instruction_counts_are_parsed_and_the_counting_cost_subtracted() -> None:
    assert parse_perf_count("1234567,,instructions:u,1000,100.00,,\n") == 1234567
    assert parse_perf_count("<not supported>,,instructions:u,0,100.00,,\n") is None
    assert parse_perf_count("") is None
    answer = (
        "PID 23012: python -c\n\n  Totals:         Ir \n   Th 1  116,646,994 \n"
        "   Th 3        1,006 \n\n"
    )
    assert parse_callgrind_totals(answer) == 116_648_000
    off = "PID 1: python\n  No information available as instrumentation is switched off.\n"
    assert parse_callgrind_totals(off) is None
    assert per_call(10_500, 500, 100) == 100.0
    assert per_call(None, 500, 100) is None
    assert per_call(10_500, None, 100) is None


def test_pipelined_section_counts_both_processes_and_the_functions_they_run(
    tmp_path: Path,
) -> None:
    out = tmp_path / "pipelined.json"
    proc = run_smoke(SCRIPT, out, "--only-pipelined", cwd=tmp_path, timeout=120)
    document = json.loads(out.read_text())
    assert document["cases"] == {}
    section = document["pipelined"]
    for kind in ("call_one", "payload_1mib"):
        case = section[kind]
        assert case["calls"] == PIPELINED_CALLS["smoke"]
        for side in ("client", "worker"):
            assert case["per_call"][side]["cpu_us"] > 0
            functions = case["functions"][side]
            # every call ran the transport's send on both sides (the worker's: its reply)
            send = next(v for k, v in functions.items() if k.endswith("(send)") and "node" in k)
            assert send[0] >= 1.0
    large = section["payload_1mib"]["functions"]
    # only the 1 MiB calls put buffers in shared memory or lend them (a ``bytes``, where the
    # worker can read the client), once per call
    shared = ("(put)", "(lend)")
    put = [v for k, v in large["client"].items() if "shm.py" in k and k.endswith(shared)]
    assert put
    assert sum(v[0] for v in put) == 1.0
    assert not any(
        "shm.py" in k and k.endswith(shared) for k in section["call_one"]["functions"]["client"]
    )
    assert "### Pipelined calls" in proc.stdout
    assert "what a pipelined 1 MiB call runs beyond a tiny one" in proc.stdout


def test_function_diff_keeps_what_grew_most_extra_time_first() -> None:
    small = {"a": [1.0, 5.0], "b": [2.0, 1.0], "same": [1.0, 3.0]}
    large = {"a": [1.0, 9.0], "b": [3.0, 1.5], "new": [1.0, 20.0], "same": [1.0, 3.2]}
    rows = function_diff(small, large, top=10)
    assert [row[0] for row in rows] == ["new", "a", "b"]
    assert rows[0] == ("new", 1.0, 1.0, 20.0)
    assert rows[2] == ("b", 3.0, 1.0, 0.5)
    assert len(function_diff(small, large, top=1)) == 1
