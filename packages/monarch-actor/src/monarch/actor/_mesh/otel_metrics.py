"""The program's mesh-wide metrics as OpenTelemetry observable instruments.

Why: the OpenTelemetry mirror (``enable_telemetry(otel=True)``) exports each process's own
instruments from that process, which needs an SDK and an exporter configured in every worker.
This exporter needs one only in the client: ``export_mesh_metrics()`` registers observable
instruments (``opentelemetry-api``; the optional ``otel`` extra) on a meter called
``monarch.mesh``, whose callbacks pull the summed metrics of the client and every live proc
mesh it owns (``_mesh.admin``'s collection, the same as ``GET /metrics``) whenever the SDK's
reader collects. Per instrument of the client's registry (``get_meter``): a counter becomes an
observable counter, an up-down counter an observable up-down counter, a histogram two
observable counters ``NAME.count`` and ``NAME.sum`` (the API has no observable histogram), each
series with its attributes. Instruments registered only in workers are not exported (create
them in the client too). One collection pass of the reader pulls once: a callback refreshes
the snapshot only when its instrument was already served from the one it holds.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from typing import Any

from monarch.actor._mesh.admin import collect_reports
from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import report as _report
from monarch.actor._runtime.telemetry.metrics import MetricPoint

__all__ = ["MeshMetricsExport", "export_mesh_metrics"]

#: The OpenTelemetry meter (instrumentation scope) name of the exported instruments.
METER_NAME = "monarch.mesh"


class MeshMetricsExport:
    """The registered observable instruments (``instruments``: OpenTelemetry name -> kind)."""

    def __init__(self, meter_provider: Any, timeout: float) -> None:
        otel_metrics: Any = importlib.import_module("opentelemetry.metrics")
        self._observation = otel_metrics.Observation
        self._timeout = timeout
        self._lock = threading.Lock()
        self._snapshot: dict[str, list[MetricPoint]] = {}
        self._served: set[str] = set()
        meter = otel_metrics.get_meter(METER_NAME, meter_provider=meter_provider)
        self.instruments: dict[str, str] = {}
        for name, kind, unit, description in _metrics.instrument_specs():
            if kind == "histogram":
                for part, part_unit in (("count", "1"), ("sum", unit)):
                    full = f"{name}.{part}"
                    meter.create_observable_counter(
                        full, [self._callback(full, name, part)], part_unit, description
                    )
                    self.instruments[full] = "counter"
            elif kind == "up_down_counter":
                meter.create_observable_up_down_counter(
                    name, [self._callback(name, name, "value")], unit, description
                )
                self.instruments[name] = kind
            else:
                meter.create_observable_counter(
                    name, [self._callback(name, name, "value")], unit, description
                )
                self.instruments[name] = "counter"

    def _points(self, full: str, name: str) -> list[MetricPoint]:
        with self._lock:
            if full in self._served or not self._served:
                reports = collect_reports(self._timeout)
                self._snapshot = _report.merge_reports(reports)
                self._served = set()
            self._served.add(full)
            return list(self._snapshot.get(name, []))

    def _callback(self, full: str, name: str, part: str) -> Any:
        def observe(_options: Any) -> Iterable[Any]:
            out = []
            for p in self._points(full, name):
                value = p.count if part == "count" else p.sum if part == "sum" else p.value
                out.append(self._observation(value, dict(p.attributes)))
            return out

        return observe


def export_mesh_metrics(meter_provider: Any = None, timeout: float = 5.0) -> MeshMetricsExport:
    """Register the program's mesh-wide metrics as observable instruments on the meter
    ``monarch.mesh`` of ``meter_provider`` (the global one if ``None``); ``ImportError``
    without ``opentelemetry-api``. ``timeout``: how long one collection waits for the
    processes' answers."""
    return MeshMetricsExport(meter_provider, timeout)
