"""Actor classes for the worker-process telemetry tests (importable by workers by name)."""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint, finished_spans, metrics_snapshot


class Probe(Actor):
    @endpoint
    def os_pid(self) -> int:
        return os.getpid()

    @endpoint
    def work(self, x: int) -> int:
        return x + 1

    @endpoint
    def spans(self) -> list[tuple[str, str, str, str]]:
        """(name, trace id, span id, parent id) of this worker's finished spans."""
        return [
            (s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_id.hex()) for s in finished_spans()
        ]

    @endpoint
    def latency_count(self, name: str) -> int:
        points = metrics_snapshot().get("monarch.endpoint.latency", [])
        return sum(p.count for p in points if p.attributes.get("endpoint") == name)

    @endpoint
    def telemetry_env(self) -> str:
        return os.environ.get("MONARCH_TELEMETRY", "")
