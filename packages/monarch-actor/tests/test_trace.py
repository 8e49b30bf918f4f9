"""One trace and summed metrics across real worker processes (issue 21, items 1 and 3).

A 4-process program run under ``monarch trace``: the trace has one ``pid`` per process, a track
per actor, and every call's send span parents one receive span per rank it reached, with a flow
arrow across processes; spans of the workers reached the client although they were stopped
before the program ended. Metrics pulled from every process of a mesh sum to the calls made.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import this_host
from monarch.actor._mesh.telemetry import collect_telemetry, mesh_metrics, mesh_trace
from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.telemetry import command, tracing

sys.path.insert(0, str(Path(__file__).parent))  # workers import trace_actors by name
from trace_actors import Relay

HERE = Path(__file__).parent
T = 30.0

_PROGRAM = """
import sys
sys.path.insert(0, {here!r})
from monarch.actor import this_host
from trace_actors import Relay

if __name__ == "__main__":
    procs = this_host().spawn_procs(per_host={{"gpus": 4}})
    relays = procs.spawn("relays", Relay)
    assert relays.work.call(1).get(timeout=30).values() == [2, 2, 2, 2]
    relays.work.broadcast(5)
    assert relays.slice(gpus=0).forward.call_one(relays.slice(gpus=3), 2).get(timeout=30) == 30
    procs.stop().get(timeout=30)
    print("program done")
"""


def _events(path: Path) -> list[dict[str, Any]]:
    trace = json.loads(path.read_text())
    events: list[dict[str, Any]] = trace["traceEvents"]
    return events


def test_monarch_trace_writes_one_trace_of_every_process(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(_PROGRAM.format(here=str(HERE)))
    out = tmp_path / "trace.json"
    env_before = os.environ.get("MONARCH_TRACE_FILE")
    code = command.main(["trace", "-o", str(out), "--", sys.executable, str(prog)])
    assert code == 0, capfd.readouterr().err
    assert "program done" in capfd.readouterr().out
    assert os.environ.get("MONARCH_TRACE_FILE") == env_before  # the child's, not ours
    events = _events(out)
    names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    tracks = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    spans = [e for e in events if e["ph"] == "X"]
    by_id = {e["args"]["span_id"]: e for e in spans}
    assert len(by_id) == len(spans)  # each span once
    # The client and four workers, each its own pid; every span on a named process and track.
    assert len(names) == 5, names
    assert sum(1 for n in names.values() if n.startswith("client ")) == 1
    assert all((e["pid"], e["tid"]) in tracks for e in spans)
    sends = {e["name"]: e for e in spans if e["args"].get("span.kind") == "send"}
    assert set(sends) == {
        "call relays.work",
        "broadcast relays.work",
        "call_one relays.forward",
        "call_one relays.work",  # sent by rank 0's actor, in its worker
    }
    children: dict[str, list[dict[str, Any]]] = {}
    for e in spans:
        children.setdefault(e["args"]["parent_id"], []).append(e)
    flows_in = {(e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "f"}
    for send in sends.values():
        received = children.get(send["args"]["span_id"], [])
        assert len(received) == send["args"]["ranks"], (send, received)
        for r in received:
            assert r["args"]["span.kind"] == "receive"
            assert r["args"]["endpoint"] == send["args"]["endpoint"]
            assert r["args"]["trace_id"] == send["args"]["trace_id"]
            assert r["pid"] != send["pid"]  # across processes
            assert (r["pid"], r["tid"], r["ts"]) in flows_in  # with an arrow into it
            assert tracks[(r["pid"], r["tid"])] == r["args"]["actor"]
    # The fan-outs reached four different processes; the worker-to-worker hop came from the
    # receive span of ``forward`` (rank 0), and landed on rank 3.
    assert len({r["pid"] for r in children[sends["call relays.work"]["args"]["span_id"]]}) == 4
    hop = sends["call_one relays.work"]
    forward = by_id[hop["args"]["parent_id"]]
    assert forward["name"] == "forward"
    assert forward["pid"] == hop["pid"]
    assert "{'gpus': 0/4}" in names[forward["pid"]]
    (landed,) = children[hop["args"]["span_id"]]
    assert "{'gpus': 3/4}" in names[landed["pid"]]
    flows_out = [e for e in events if e["ph"] == "s"]
    assert len(flows_out) == len(flows_in) == sum(s["args"]["ranks"] for s in sends.values())


def test_monarch_trace_of_a_program_that_never_stops_its_processes(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The client's exit handler stops the meshes first, so the workers' spans still arrive."""
    prog = tmp_path / "prog.py"
    prog.write_text(
        _PROGRAM.format(here=str(HERE)).replace("    procs.stop().get(timeout=30)\n", "")
    )
    assert "procs.stop" not in prog.read_text()
    out = tmp_path / "trace.json"
    assert command.main(["trace", "-o", str(out), "--", sys.executable, str(prog)]) == 0
    assert "program done" in capfd.readouterr().out
    spans = [e for e in _events(out) if e["ph"] == "X"]
    assert len({e["pid"] for e in spans if e["name"] == "work"}) == 4


def test_monarch_trace_without_a_program() -> None:
    assert command.main(["trace", "-o", "unused.json"]) == 2


def test_monarch_console_script_is_declared() -> None:
    pyproject = HERE.parent / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("installed without its pyproject.toml")
    scripts = tomllib.loads(pyproject.read_text())["project"]["scripts"]
    module, _, name = scripts["monarch"].partition(":")
    assert getattr(importlib.import_module(module), name) is command.main


@pytest.fixture
def traced_relays() -> Iterator[Any]:
    saved = os.environ.get("MONARCH_TELEMETRY")
    tm.enable_telemetry(metrics=True, tracing=True)
    tm.reset_metrics()
    pids: list[int] = []
    try:
        procs = this_host().spawn_procs(per_host={"gpus": 4})
        relays: Any = procs.spawn("relays", Relay)
        yield procs, relays
        procs.stop().get(timeout=T)
    finally:
        tm.disable_telemetry()
        if saved is None:
            os.environ.pop("MONARCH_TELEMETRY", None)
        else:
            os.environ["MONARCH_TELEMETRY"] = saved
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _count(points: dict[str, Any], name: str, **attributes: str) -> float:
    total = 0.0
    for p in points.get(name, []):
        if all(p.attributes.get(k) == v for k, v in attributes.items()):
            total += p.count if p.kind == "histogram" else p.value
    return total


def test_metrics_summed_across_processes_equal_the_calls(traced_relays: Any) -> None:
    procs, relays = traced_relays
    for _ in range(3):
        assert relays.work.call(1).get(timeout=T).values() == [2, 2, 2, 2]
    assert relays.slice(gpus=2).work.call_one(7).get(timeout=T) == 8
    with pytest.raises(Exception, match="relay failure"):
        relays.slice(gpus=1).fail.call_one().get(timeout=T)
    reports = collect_telemetry(procs, T)
    assert len({r.os_pid for r in reports}) == 4
    per_process = [_count(r.metrics, "monarch.endpoint.latency", endpoint="work") for r in reports]
    assert sorted(per_process) == [3, 3, 3, 4]
    merged = mesh_metrics(relays, T)  # the actor mesh reaches the same four processes
    assert _count(merged, "monarch.endpoint.latency", endpoint="work") == 13
    assert _count(merged, "monarch.endpoint.errors", endpoint="fail", category="user") == 1
    assert _count(merged, "monarch.messages.received", kind="call") == 14
    assert _count(merged, "monarch.messages.payload_size", kind="port_value") >= 13
    # The client side of the same calls: one call latency per call, by endpoint.
    local = tm.metrics_snapshot()
    assert _count(local, "monarch.client.call_latency", endpoint="work") == 4
    assert _count(local, "monarch.client.call_latency", endpoint="fail") == 1
    assert _count(local, "monarch.messages.sent", kind="call") >= 14
    # The runtime's own requests (the two snapshots above) are not calls: no latency of theirs.
    assert _count(local, "monarch.client.call_latency") == 5
    # A slice asks only its own processes.
    one = mesh_metrics(relays.slice(gpus=2), T)
    assert _count(one, "monarch.endpoint.latency", endpoint="work") == 4


def test_pulled_spans_of_live_workers(traced_relays: Any) -> None:
    procs, relays = traced_relays
    with tm.span("client step") as step:
        relays.work.call(1).get(timeout=T)
    assert isinstance(step, tm.Span)
    trace = mesh_trace(procs, timeout=T)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    (send,) = [e for e in spans if e["args"]["parent_id"] == step.span_id.hex()]
    assert send["name"] == "call relays.work"
    received = [e for e in spans if e["args"]["parent_id"] == send["args"]["span_id"]]
    assert len({e["pid"] for e in received}) == 4


def test_spans_of_a_killed_worker_reach_the_client(traced_relays: Any, faults: Any) -> None:
    """A worker streams its finished spans to the client as it goes (every
    ``tracing.SHIP_INTERVAL`` seconds): killed with SIGKILL, never stopped nor pulled, its spans
    up to its last shipment are in the client's trace, each parented by the client's send."""
    _procs, relays = traced_relays
    victim = relays.slice(gpus=2)
    (report,) = collect_telemetry(victim, T, spans=False, metrics=False)
    with tm.span("before the kill") as step:
        for x in range(5):
            assert victim.work.call_one(x).get(timeout=T) == x + 1
    assert isinstance(step, tm.Span)
    sends = {s.span_id for s in tm.finished_spans() if s.parent_id == step.span_id}
    assert len(sends) == 5

    def streamed() -> list[tracing.SpanRecord]:
        return [
            r
            for r in tracing.span_records()
            if r.os_pid == report.os_pid and r.name == "work" and r.parent_id in sends
        ]

    # Bounded by the test's timeout, not by the interval: a loaded box may be slow.
    assert tracing.wait_stored(lambda: len(streamed()) == 5, T), streamed()
    os.kill(report.os_pid, signal.SIGKILL)
    faults.wait_for(1, timeout=T)
    trace = tracing.chrome_trace(tracing.span_records())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    received = [
        e for e in events if e["ph"] == "X" and e["args"]["parent_id"] in {s.hex() for s in sends}
    ]
    assert len(received) == 5
    assert {names[e["pid"]] for e in received} == {f"{report.proc} (os pid {report.os_pid})"}
    flows_in = {(e["pid"], e["tid"], e["ts"]) for e in events if e["ph"] == "f"}
    assert all((e["pid"], e["tid"], e["ts"]) in flows_in for e in received)


def test_lifecycle_records_of_worker_processes(traced_relays: Any, faults: Any) -> None:
    procs, relays = traced_relays
    assert relays.work.call(1).get(timeout=T).values() == [2, 2, 2, 2]
    relays.slice(gpus=1).die.broadcast()
    faults.wait_for(1)
    relays.stop().get(timeout=T)
    reports = collect_telemetry(procs, T, spans=False, metrics=False, lifecycle=True)
    by_rank = {}
    for report in reports:
        (rank,) = {r.rank for r in report.lifecycle if "relays" in r.name}
        by_rank[rank] = [r.event for r in report.lifecycle if "relays" in r.name]
        assert all(r.proc == report.proc for r in report.lifecycle)
    alive = ["actor_spawned", "actor_running", "actor_stopping", "actor_stopped"]
    assert by_rank == {
        0: alive,
        1: ["actor_spawned", "actor_running", "actor_failed"],
        2: alive,
        3: alive,
    }
    client = [(r.subject, r.event) for r in tm.lifecycle_events() if r.name in ("procs", "relays")]
    assert client[-4:] == [
        ("proc_mesh", "mesh_spawned"),
        ("actor_mesh", "mesh_spawned"),
        ("actor_mesh", "mesh_stopping"),
        ("actor_mesh", "mesh_stopped"),
    ]
