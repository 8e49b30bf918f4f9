"""Metrics, tracing spans and supervision event records of the actor runtime.

Why one package: the Monarch 0.2.0 release notes promise three kinds of observability, and all
three hang off the same few places in the runtime (a message sent, a message received, an
endpoint run, an actor failing), so the runtime calls one hook per place, through this package,
and the modules behind it decide what each hook records:

- ``metrics``: counters and histograms in the built-in registry (``metrics_snapshot()``) and the
  runtime's own instruments with their hooks (``on_sent``, ``on_received``, ``on_enqueued``,
  ``on_port_opened``, ``on_port_completed``);
- ``tracing``: spans (``span(name)``, ``@traced``, one span per endpoint run: ``wrap_endpoint``),
  the trace context a CALL envelope carries (``outgoing_trace``), ``chrome_trace()``;
- ``records``: supervision event records (``record_supervision``, ``SupervisionRecord``) and
  lifecycle records of actors and meshes (``record_lifecycle``, ``LifecycleRecord``);
- ``report``: what a process reports to the client about itself (``TelemetryReport``: spans,
  metrics, lifecycle records), pulled through the agent endpoint ``__telemetry__``; a worker's
  finished spans also stream to the client as they are packed, and the rest is pushed at
  ``STOP_PROC``; ``_mesh.telemetry`` collects them for a whole mesh;
- ``command``: the ``monarch`` console script (``monarch trace -o trace.json -- prog``);
- ``otel``: the optional OpenTelemetry mirror; ``listeners``: the bounded listener lists.

``MONARCH_TRACE_FILE`` (set by ``monarch trace``) turns tracing on in the process that imports
this package first, and makes it write one Chrome trace of every span it holds at exit
(``_trace_file_from_environment``).

Switches (module attributes read on the hot path, so a disabled hook costs one attribute load
and a branch; ``enable_telemetry`` sets them, and the ``MONARCH_TELEMETRY`` environment variable,
a comma-separated subset of ``metrics,tracing,otel``, sets them at import, which is how worker
processes inherit them):

- ``METRICS``: the runtime's instruments record (messages sent and received by kind, payload
  bytes, endpoint latency and errors by category, mailbox depth at enqueue, client-side call
  latency, supervision events).
- ``TRACING``: spans are made. The caller's span travels in the CALL envelope (24 bytes: trace
  id and span id), so the endpoint's span is its child in another process. Finished spans go to
  listeners and, packed by a shipper thread, to the client's bounded store (a worker streams
  them there: ``tracing``); ``finished_spans()`` keeps the newest.
- ``otel``: if the optional ``opentelemetry-api`` package is importable, instruments and spans are
  mirrored to OpenTelemetry (whatever SDK the program configured exports them). Without it the
  built-in registry is all there is; nothing else is imported (never torch).

``ACTIVE`` is ``METRICS or TRACING``: the runtime calls the hooks only while it is on. The
switches live here, where the runtime reads them; ``enable_telemetry`` also sets the copies that
``metrics`` and ``tracing`` read, so set them only through it.

Supervision and lifecycle records are always on (they are rare). Every store is bounded: the
rings of recent spans, supervision and lifecycle records (``set_ring_capacity``), the packed
spans kept for the trace, this process's and those other processes sent
(``tracing.MAX_STORED_SPANS``, ``MAX_STORED_BYTES``), the spans waiting to be packed
(``tracing.MAX_PENDING_SPANS``) or sent (``MAX_UNSENT_BATCHES``), the series per instrument
(``MAX_SERIES``; later attribute sets share one overflow series), the listeners
(``MAX_LISTENERS``).

This package took over the old module ``monarch.actor._telemetry`` (kept as an alias for one
release) and re-exports its names.
"""

from __future__ import annotations

import atexit
import json
import logging
import os

from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import otel as _otel
from monarch.actor._runtime.telemetry import records as _records
from monarch.actor._runtime.telemetry import tracing as _tracing
from monarch.actor._runtime.telemetry.listeners import (
    DEFAULT_RING_CAPACITY as DEFAULT_RING_CAPACITY,
)
from monarch.actor._runtime.telemetry.listeners import MAX_LISTENERS
from monarch.actor._runtime.telemetry.metrics import BYTES_BOUNDS as BYTES_BOUNDS
from monarch.actor._runtime.telemetry.metrics import DEPTH_BOUNDS as DEPTH_BOUNDS
from monarch.actor._runtime.telemetry.metrics import (
    MAX_SERIES,
    Counter,
    Histogram,
    Meter,
    MetricPoint,
    UpDownCounter,
    get_meter,
    metrics_snapshot,
    reset_metrics,
)
from monarch.actor._runtime.telemetry.metrics import MAX_TRACKED_PORTS as MAX_TRACKED_PORTS
from monarch.actor._runtime.telemetry.metrics import SECONDS_BOUNDS as SECONDS_BOUNDS
from monarch.actor._runtime.telemetry.metrics import on_enqueued as on_enqueued
from monarch.actor._runtime.telemetry.metrics import on_port_completed as on_port_completed
from monarch.actor._runtime.telemetry.metrics import on_port_opened as on_port_opened
from monarch.actor._runtime.telemetry.metrics import on_received as on_received
from monarch.actor._runtime.telemetry.metrics import on_sent as on_sent
from monarch.actor._runtime.telemetry.records import (
    LIFECYCLE_EVENTS,
    LIFECYCLE_SCHEMA_VERSION,
    SCHEMA_VERSION,
    ChainLink,
    LifecycleRecord,
    SupervisionRecord,
    add_lifecycle_listener,
    add_supervision_listener,
    lifecycle_events,
    supervision_events,
)
from monarch.actor._runtime.telemetry.records import (
    iter_supervision_events as iter_supervision_events,
)
from monarch.actor._runtime.telemetry.records import record_lifecycle as record_lifecycle
from monarch.actor._runtime.telemetry.records import record_supervision as record_supervision
from monarch.actor._runtime.telemetry.tracing import (
    Span,
    add_span_listener,
    chrome_trace,
    finished_spans,
    span,
    traced,
)
from monarch.actor._runtime.telemetry.tracing import outgoing_trace as outgoing_trace
from monarch.actor._runtime.telemetry.tracing import run_endpoint as run_endpoint
from monarch.actor._runtime.telemetry.tracing import wrap_endpoint as wrap_endpoint

__all__ = [
    "LIFECYCLE_EVENTS",
    "LIFECYCLE_SCHEMA_VERSION",
    "MAX_LISTENERS",
    "MAX_SERIES",
    "SCHEMA_VERSION",
    "ChainLink",
    "Counter",
    "Histogram",
    "LifecycleRecord",
    "Meter",
    "MetricPoint",
    "Span",
    "SupervisionRecord",
    "UpDownCounter",
    "add_lifecycle_listener",
    "add_span_listener",
    "add_supervision_listener",
    "chrome_trace",
    "disable_telemetry",
    "enable_telemetry",
    "finished_spans",
    "get_meter",
    "lifecycle_events",
    "metrics_snapshot",
    "reset_metrics",
    "set_ring_capacity",
    "span",
    "supervision_events",
    "telemetry_state",
    "traced",
]

_log = logging.getLogger("monarch.actor.telemetry")

# Hot-path switches (see the module docstring). ``ACTIVE`` is ``METRICS or TRACING``.
METRICS = False
TRACING = False
ACTIVE = False


def enable_telemetry(metrics: bool = True, tracing: bool = True, otel: bool = False) -> None:
    """Turn metrics and tracing on or off in this process (worker processes read
    ``MONARCH_TELEMETRY``, which this also sets so that workers spawned later inherit it).

    ``otel=True`` mirrors instruments and spans to OpenTelemetry; it needs the optional
    ``opentelemetry-api`` package (``ImportError`` otherwise).
    """
    global METRICS, TRACING, ACTIVE
    if otel:
        _otel.load()
    else:
        _otel.unload()
    _metrics.set_mirrored(otel)
    METRICS, TRACING = bool(metrics), bool(tracing)
    _metrics.set_enabled(METRICS)
    _tracing.set_enabled(TRACING)
    ACTIVE = METRICS or TRACING
    parts = [n for n, on in (("metrics", METRICS), ("tracing", TRACING), ("otel", otel)) if on]
    if ACTIVE:
        os.environ["MONARCH_TELEMETRY"] = ",".join(parts)
    else:
        os.environ.pop("MONARCH_TELEMETRY", None)


def disable_telemetry() -> None:
    """Turn metrics, tracing and the OpenTelemetry mirror off."""
    enable_telemetry(metrics=False, tracing=False, otel=False)


def telemetry_state() -> dict[str, bool]:
    """Which switches are on: ``{"metrics": ..., "tracing": ..., "otel": ...}``."""
    return {"metrics": METRICS, "tracing": TRACING, "otel": _otel.enabled()}


def set_ring_capacity(capacity: int) -> None:
    """Resize the supervision-record ring and the ring of recent finished spans (keeps the
    newest entries; the spans kept for the trace are bounded by ``tracing.MAX_STORED_SPANS``)."""
    if capacity < 1:
        raise ValueError("ring capacity must be at least 1")
    _records.resize(capacity)
    _tracing.resize(capacity)


def _from_environment() -> None:
    raw = os.environ.get("MONARCH_TELEMETRY", "")
    parts = {p.strip().lower() for p in raw.split(",") if p.strip()}
    unknown = parts - {"metrics", "tracing", "otel"}
    if unknown:
        _log.warning("MONARCH_TELEMETRY: unknown parts %s ignored", sorted(unknown))
    if not parts & {"metrics", "tracing"}:
        return
    otel = "otel" in parts
    try:
        enable_telemetry("metrics" in parts, "tracing" in parts, otel)
    except ImportError:
        _log.warning("MONARCH_TELEMETRY asks for otel but opentelemetry-api is not installed")
        enable_telemetry("metrics" in parts, "tracing" in parts, False)


_from_environment()

#: Where ``monarch trace`` wants this program's trace (``MONARCH_TRACE_FILE``), or ``None``.
_trace_file: str | None = None


def _trace_file_from_environment() -> None:
    """``MONARCH_TRACE_FILE`` (set by ``monarch trace``): turn tracing on, and write one
    Chrome trace of every span this process holds when it exits. Read once, by the process
    that imports ``monarch.actor`` first (the client), and removed from the environment so
    that the worker processes it starts do not write one too (they stream their spans to the
    client, and push the rest when stopped: ``report``). The handler is registered before the
    client runtime registers its own shutdown, so it runs after that shutdown stopped the
    meshes."""
    global _trace_file
    path = os.environ.pop("MONARCH_TRACE_FILE", None)
    if not path:
        return
    _trace_file = path
    enable_telemetry(metrics=METRICS, tracing=True, otel=_otel.enabled())
    atexit.register(_write_trace_file)


def _write_trace_file() -> None:
    if _trace_file is None or _tracing._PID != _tracing_pid_at_start:
        return  # a forked child (the zygote's workers) inherited the handler: not its file
    try:
        trace = _tracing.chrome_trace(_tracing.span_records())
        with open(_trace_file, "w", encoding="utf-8") as out:
            json.dump(trace, out)
    except Exception:
        _log.exception("could not write the trace to %s", _trace_file)


_tracing_pid_at_start = os.getpid()
_trace_file_from_environment()
