"""What one process reports to the client about itself: its spans and its metrics.

Why: each process keeps its own span ring and metric registry; a trace or a metrics view of a
mesh needs them in one place. Two ways carry them, both answered on the process's runtime loop
(``_runtime.proc``), never by an actor, so a busy actor delays nothing:

- *pull*: the client calls the agent endpoint ``__telemetry__`` of each process of a mesh
  (``TelemetryRequest`` in, ``TelemetryReport`` back; ``_mesh.telemetry`` does this);
- *stream*: a worker sends its finished spans to the client (its authority) as its span
  shipper packs them (``__spans__``, one packed batch per message: ``tracing.encode_batch``),
  every ``tracing.SHIP_INTERVAL`` seconds or ``tracing.SHIP_AT`` spans, and the client keeps
  them packed in its bounded store (``tracing.add_remote_batch``); a worker killed without a
  stop loses at most its last interval;
- *push at stop*: a worker that receives ``STOP_PROC`` first packs what is pending and sends
  every batch not yet streamed (those its own child processes pushed to it included) to the
  stopper's agent (``__spans__``), ahead of the stop's acknowledgement on the same path, so
  when ``ProcMesh.stop()`` returns the client holds them. With the stream, that is how
  ``monarch trace`` gets the spans of processes that are gone by the time the program ends.

Reports are bounded: spans by ``tracing.MAX_STORED_SPANS`` (and bytes), metrics by
``metrics.MAX_SERIES``. Metrics are per OS process: simulated processes sharing one report the
same registry, which ``merge_reports`` counts once (by ``os_pid``).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import msgspec

from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import records as _records
from monarch.actor._runtime.telemetry import tracing as _tracing
from monarch.actor._runtime.telemetry.metrics import MetricPoint
from monarch.actor._runtime.telemetry.records import LifecycleRecord, SupervisionRecord
from monarch.actor._runtime.telemetry.tracing import SpanRecord

__all__ = [
    "MAX_RECENT_FAILURES",
    "SPANS_ENDPOINT",
    "ActorStatus",
    "TELEMETRY_ENDPOINT",
    "TelemetryReport",
    "TelemetryRequest",
    "encode",
    "local_report",
    "merge_reports",
]

#: The agent endpoint that answers a ``TelemetryRequest`` with a ``TelemetryReport``.
TELEMETRY_ENDPOINT = "__telemetry__"
#: The agent endpoint that takes a packed batch of spans (``tracing.encode_batch``) a worker
#: streams, or pushes when stopped.
SPANS_ENDPOINT = "__spans__"


class TelemetryRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the client asks a process for."""

    spans: bool = True
    metrics: bool = True
    lifecycle: bool = False
    #: The process's actors (``ActorStatus``) and its recent failures (``monarch top``).
    actors: bool = False


#: Supervision records of kind ``failed`` a report carries at most (the newest).
MAX_RECENT_FAILURES = 16


class ActorStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One actor of a process, as ``monarch top`` shows it: its readable chain (``name``),
    ``actor_id`` (``path@pid``), class, rank, ``state`` (``starting``, ``running``,
    ``stopping``, ``stopped``, ``failed``), messages queued in its mailbox now (``mailbox``)
    and messages it was given since it was spawned (``received``; rates are differences)."""

    name: str
    actor_id: str
    cls: str = ""
    rank: int = 0
    state: str = ""
    mailbox: int = 0
    received: int = 0


class TelemetryReport(msgspec.Struct, frozen=True, kw_only=True):
    """A process's answer: its label and OS pid, its finished spans (its own and those its
    children pushed to it), its metrics snapshot (``metrics_snapshot()``) and, when asked,
    its lifecycle records (``lifecycle_events()``)."""

    proc: str
    os_pid: int
    spans: list[SpanRecord] = []
    metrics: dict[str, list[MetricPoint]] = {}
    lifecycle: list[LifecycleRecord] = []
    host: str = ""
    actors: list[ActorStatus] = []
    failures: list[SupervisionRecord] = []


def local_report(
    proc: str, request: TelemetryRequest, actors: Sequence[ActorStatus] = ()
) -> TelemetryReport:
    """This process's report (``proc``: the label of the runtime answering; ``actors``: its
    actors, included when the request asks for them)."""
    failures: list[SupervisionRecord] = []
    if request.actors:
        failures = [
            r
            for r in _records.supervision_events()
            if r.event in ("actor_failed", "unhandled_fault")
        ][-MAX_RECENT_FAILURES:]
    return TelemetryReport(
        proc=proc,
        os_pid=_tracing._PID,
        spans=_tracing.span_records() if request.spans else [],
        metrics=_metrics.metrics_snapshot() if request.metrics else {},
        lifecycle=_records.lifecycle_events() if request.lifecycle else [],
        host=_HOST,
        actors=list(actors) if request.actors else [],
        failures=failures,
    )


_HOST = socket.gethostname()


def merge_reports(reports: Sequence[TelemetryReport]) -> dict[str, list[MetricPoint]]:
    """The metrics of ``reports`` summed series by series (same instrument and attributes):
    counters add their values, histograms their counts, sums and buckets (min of mins, max of
    maxes). Each OS process counts once (simulated processes share a registry)."""
    seen: set[int] = set()
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], MetricPoint] = {}
    for report in reports:
        if report.os_pid in seen:
            continue
        seen.add(report.os_pid)
        for name, points in report.metrics.items():
            for p in points:
                key = (name, tuple(sorted(p.attributes.items())))
                prior = merged.get(key)
                merged[key] = p if prior is None else _add(prior, p)
    out: dict[str, list[MetricPoint]] = {}
    for (name, _), point in merged.items():
        out.setdefault(name, []).append(point)
    return out


def _add(a: MetricPoint, b: MetricPoint) -> MetricPoint:
    if a.kind != "histogram":
        return MetricPoint(a.name, a.kind, a.unit, a.attributes, value=a.value + b.value)
    buckets = a.buckets
    if [u for u, _ in a.buckets] == [u for u, _ in b.buckets]:
        buckets = tuple((u, n + m) for (u, n), (_, m) in zip(a.buckets, b.buckets, strict=True))
    return MetricPoint(
        a.name,
        a.kind,
        a.unit,
        a.attributes,
        count=a.count + b.count,
        sum=a.sum + b.sum,
        min=min(a.min, b.min),
        max=max(a.max, b.max),
        buckets=buckets,
    )


def encode(value: TelemetryReport | TelemetryRequest) -> bytes:
    """The msgpack bytes of a request or report."""
    return msgspec.msgpack.encode(value)
