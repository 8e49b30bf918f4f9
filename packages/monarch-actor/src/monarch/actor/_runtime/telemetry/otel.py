"""The optional OpenTelemetry mirror of ``telemetry``'s instruments and spans.

If the optional ``opentelemetry-api`` package is importable, ``enable_telemetry(otel=True)``
loads it here (``load``), and then every built-in instrument gets an OpenTelemetry twin
(``instrument``) and every span a twin span (``start_span``, ``end_span``): whatever SDK the
program configured exports them. Without it nothing is imported (never torch), and the built-in
registry and span ring are all there is. The OpenTelemetry modules are imported by name: the
package is an optional extra without type stubs here.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["end_span", "enabled", "instrument", "load", "start_span", "unload"]

_log = logging.getLogger("monarch.actor.telemetry")

#: ``opentelemetry.metrics`` and ``opentelemetry.trace`` while the mirror is on, else ``None``.
_otel_metrics: Any = None
_otel_trace: Any = None

_NO_PARENT = bytes(8)


def _unchanged() -> None:
    return None


#: Called after the mirror is turned on or off: ``tracing._refresh_plain`` (set by ``tracing``,
#: which imports this module), so the runtime's spans take the object path while it is on.
_changed: Callable[[], None] = _unchanged


def load() -> None:
    """Turn the mirror on: import the OpenTelemetry API (``ImportError`` if it is missing)."""
    global _otel_metrics, _otel_trace
    otel_metrics = importlib.import_module("opentelemetry.metrics")
    otel_trace = importlib.import_module("opentelemetry.trace")
    _otel_metrics, _otel_trace = otel_metrics, otel_trace
    _changed()


def unload() -> None:
    """Turn the mirror off (twins made so far are left to their owners to drop)."""
    global _otel_metrics, _otel_trace
    _otel_metrics = _otel_trace = None
    _changed()


def enabled() -> bool:
    """Whether the mirror is on."""
    return _otel_trace is not None


def instrument(kind: str, name: str, unit: str, description: str) -> Any:
    """The OpenTelemetry twin of a built-in instrument of ``kind`` (``counter``,
    ``up_down_counter``, ``histogram``), or ``None`` while the mirror is off or when the SDK
    rejects it (the built-in registry still counts)."""
    if _otel_metrics is None:
        return None
    meter = _otel_metrics.get_meter("monarch")
    try:
        if kind == "histogram":
            return meter.create_histogram(name, unit, description)
        if kind == "up_down_counter":
            return meter.create_up_down_counter(name, unit, description)
        return meter.create_counter(name, unit, description)
    except Exception:  # an SDK may reject a name
        _log.warning("could not mirror instrument %s to OpenTelemetry", name)
        return None


def start_span(
    name: str, attributes: dict[str, Any], trace_id: bytes, parent_id: bytes, span_id: bytes
) -> tuple[Any, bytes, bytes]:
    """Start the OpenTelemetry twin of a span (``None`` while the mirror is off); returns it
    with the ids to use, the twin's when an SDK assigns real ones. A ``parent_id`` of zeros
    means a root span."""
    trace = _otel_trace
    if trace is None:
        return None, trace_id, span_id
    context = None
    if parent_id != _NO_PARENT:
        parent = trace.SpanContext(
            trace_id=int.from_bytes(trace_id, "big"),
            span_id=int.from_bytes(parent_id, "big"),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    try:
        otel_span = trace.get_tracer("monarch").start_span(
            name, context=context, attributes=attributes
        )
    except Exception:
        return None, trace_id, span_id
    ctx = otel_span.get_span_context()
    if ctx.is_valid:
        return otel_span, ctx.trace_id.to_bytes(16, "big"), ctx.span_id.to_bytes(8, "big")
    return otel_span, trace_id, span_id


def end_span(otel_span: Any, exc: BaseException | None) -> None:
    """End a twin span, recording ``exc`` as its error; never raises."""
    try:
        if exc is not None:
            otel_span.record_exception(exc)
            trace = _otel_trace
            if trace is not None:
                otel_span.set_status(trace.Status(trace.StatusCode.ERROR))
        otel_span.end()
    except BaseException:  # the mirror must never break the span it mirrors
        return
