"""Telemetry across real worker processes: the switch reaches workers through the environment,
and the caller's span crosses the Node transport in the envelope."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import span, this_host
from monarch.actor._runtime import telemetry as tm

sys.path.insert(0, str(Path(__file__).parent))  # workers import telemetry_actors by name
from telemetry_actors import Probe

T = 20.0


@pytest.fixture
def traced_workers() -> Iterator[Any]:
    saved = os.environ.get("MONARCH_TELEMETRY")
    tm.enable_telemetry(metrics=True, tracing=True)
    pids: list[int] = []
    try:
        procs = this_host().spawn_procs(per_host={"gpus": 1})
        probe: Any = procs.spawn("probe", Probe)
        pids = probe.os_pid.call().get(timeout=T).values()
        yield probe
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


def test_worker_spans_are_children_of_the_client_span(traced_workers: Any) -> None:
    probe = traced_workers
    assert probe.telemetry_env.call_one().get(timeout=T) == "metrics,tracing"
    with span("client step") as root:
        assert probe.work.call_one(1).get(timeout=T) == 2
    assert isinstance(root, tm.Span)
    spans = probe.spans.call_one().get(timeout=T)
    work = [s for s in spans if s[0] == "work"]
    assert work, spans
    _name, trace_id, _, parent_id = work[-1]
    (send,) = [s for s in tm.finished_spans() if s.name == "call_one probe.work"]
    assert send.parent_id == root.span_id
    assert (trace_id, parent_id) == (root.trace_id.hex(), send.span_id.hex())
    assert probe.latency_count.call_one("work").get(timeout=T) == 1
