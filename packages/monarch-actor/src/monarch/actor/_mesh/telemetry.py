"""Telemetry of a whole mesh, collected to the caller: metrics summed over its processes, and
one trace of every process's spans.

Why here: each process keeps its own spans and metrics (``_runtime.telemetry``); this module
asks every process of a mesh for them through the agent endpoint ``__telemetry__``
(``_runtime.telemetry.report``; answered on each process's runtime loop, so busy actors delay
nothing) and merges the answers. Not in Monarch's API (it names no such call), so these are
documented private-ish functions, not ``monarch.actor`` names:

- ``collect_telemetry(mesh)``: one ``TelemetryReport`` per process of the mesh (``ProcMesh``
  or ``ActorMesh``, any slice);
- ``mesh_metrics(mesh)``: their metrics summed series by series (each OS process once):
  ``monarch.endpoint.latency`` counts there equal the calls the mesh handled;
- ``mesh_trace(*meshes)`` / ``write_trace(path, *meshes)``: the caller's spans, the spans
  stopped processes pushed to it, and those of the given meshes' live processes, as one Chrome
  trace-event JSON (``tracing.chrome_trace``: a ``pid`` per process, a track per actor, flow
  arrows between processes) that Perfetto opens.

Every wait is bounded by ``timeout``; a process that does not answer in time is left out of
the result (``TimeoutError`` only if none answered).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec

from monarch.actor._base.envelope import ActorAddr, MessageKind
from monarch.actor._base.future import _Cell
from monarch.actor._mesh.meshes import ActorMesh, ProcMesh
from monarch.actor._runtime.context import current_sender
from monarch.actor._runtime.sinks import OneSink, Reply
from monarch.actor._runtime.telemetry import report as _report
from monarch.actor._runtime.telemetry import tracing as _tracing
from monarch.actor._runtime.telemetry.metrics import MetricPoint
from monarch.actor._runtime.telemetry.report import TelemetryReport, TelemetryRequest

__all__ = ["collect_telemetry", "mesh_metrics", "mesh_trace", "write_trace"]


def _pids(mesh: ProcMesh | ActorMesh[Any]) -> list[bytes]:
    procs = mesh._proc_ids()
    return list(dict.fromkeys(procs[g].pid.raw for g in mesh._shape.ndslice))


def collect_telemetry(
    mesh: ProcMesh | ActorMesh[Any],
    timeout: float = 10.0,
    *,
    spans: bool = True,
    metrics: bool = True,
    lifecycle: bool = False,
    actors: bool = False,
) -> list[TelemetryReport]:
    """Ask every process of ``mesh`` for its spans and metrics (and, with ``lifecycle``, its
    lifecycle records; with ``actors``, its actors' states and recent failures); their
    reports, in rank order (processes that did not answer within ``timeout`` seconds are left
    out)."""
    if not isinstance(mesh, ProcMesh | ActorMesh):
        raise TypeError(f"collect_telemetry takes a ProcMesh or an ActorMesh, not {mesh!r}")
    runtime, sender = current_sender()
    payload = _report.encode(
        TelemetryRequest(spans=spans, metrics=metrics, lifecycle=lifecycle, actors=actors)
    )
    cells: list[tuple[bytes, _Cell[Reply], int]] = []
    try:
        for pid in _pids(mesh):
            cell: _Cell[Reply] = _Cell()
            port = runtime.open_port(sender, OneSink(cell))
            cells.append((pid, cell, port.index))
            runtime.send_system(
                MessageKind.CALL,
                ActorAddr(pid, ""),
                _report.TELEMETRY_ENDPOINT,
                reply_port=port,
                payload=payload,
            )
        deadline = time.monotonic() + timeout
        reports: list[TelemetryReport] = []
        for _pid, cell, _ in cells:
            if not cell.wait(max(0.0, deadline - time.monotonic())):
                continue
            ok, reply = cell.outcome()
            if ok and reply.ok:
                reports.append(msgspec.msgpack.decode(reply.payload, type=TelemetryReport))
        if cells and not reports:
            raise TimeoutError(f"no process of {mesh!r} reported its telemetry within {timeout} s")
        return reports
    finally:
        for _, _, index in cells:
            runtime.close_port(index)


def mesh_metrics(
    mesh: ProcMesh | ActorMesh[Any], timeout: float = 10.0
) -> dict[str, list[MetricPoint]]:
    """The metrics of every process of ``mesh``, summed series by series (same instrument
    and attributes; each OS process once), as ``metrics_snapshot()`` shapes them."""
    return _report.merge_reports(collect_telemetry(mesh, timeout, spans=False))


def mesh_trace(*meshes: ProcMesh | ActorMesh[Any], timeout: float = 10.0) -> dict[str, Any]:
    """One Chrome trace of this process's spans, those stopped processes pushed to it, and
    those of the live processes of ``meshes``."""
    records = _tracing.span_records()
    for mesh in meshes:
        for report in collect_telemetry(mesh, timeout, metrics=False):
            records.extend(report.spans)
    return _tracing.chrome_trace(records)


def write_trace(path: str | Path, *meshes: ProcMesh | ActorMesh[Any], timeout: float = 10.0) -> int:
    """Write ``mesh_trace(*meshes)`` to ``path`` as JSON; returns the number of spans."""
    trace = mesh_trace(*meshes, timeout=timeout)
    Path(path).write_text(json.dumps(trace))
    return sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
