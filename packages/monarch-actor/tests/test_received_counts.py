"""Metrics count every envelope a process receives once, by kind, whichever way ``_route``
takes it (a process's own kinds, the root client, no such actor, a live actor) and whether the
runtime records inline or calls the hooks (``metrics.HOOKS``): the two agree, a payload that
does not decode included."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from monarch.actor._base.envelope import ActorAddr, Envelope, MessageKind
from monarch.actor._base.errors import FailureEvent
from monarch.actor._runtime import proc as rt
from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.client import new_local_runtime
from monarch.actor._runtime.telemetry import metrics as tm_metrics

sys.path.insert(0, str(Path(__file__).parent))  # the shared stand-ins, by name
from fake_cells import FakeCell

MALFORMED = b"\xc1"  # never valid msgpack


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[rt.ProcRuntime]:
    monkeypatch.setattr(rt, "PARK_TIMEOUT", 60.0)  # a parked call stays parked for the test
    runtime = new_local_runtime("counting")
    yield runtime
    runtime.close()


class _FakeRoot:
    """The root client of a client process: takes faults."""

    def __init__(self) -> None:
        self.faults: list[FailureEvent] = []

    def on_fault(self, event: FailureEvent) -> None:
        self.faults.append(event)


def _arrive(runtime: rt.ProcRuntime, kind: MessageKind, path: str, payload: bytes) -> None:
    """``env`` arrives from the fabric (``_on_envelope``, which logs what ``_route`` raises),
    on the runtime's loop thread."""
    sender = ActorAddr(runtime.pid_raw, "peer")
    env = Envelope(
        kind, sender, ActorAddr(runtime.pid_raw, path), -1, "ping", 0, None, None, payload
    )
    done = threading.Event()

    def arrive() -> None:
        try:
            runtime._on_envelope(env, [])
        finally:
            done.set()

    runtime.loop.loop.call_soon_threadsafe(arrive)
    assert done.wait(5)


def _received() -> dict[str, float]:
    points = tm.metrics_snapshot().get("monarch.messages.received", [])
    return {dict(p.attributes)["kind"]: p.value for p in points}


@pytest.mark.parametrize("hooked", [False, True], ids=["inline", "hooks"])
def test_every_route_counts_a_received_envelope_once(
    runtime: rt.ProcRuntime, hooked: bool, caplog: pytest.LogCaptureFixture
) -> None:
    event = FailureEvent(
        category="user", kind="failed", actor="a", mesh_name="m", rank=0, reason="x"
    )
    cell, root = FakeCell(), _FakeRoot()
    runtime.cells["alive"] = cell  # type: ignore[assignment]
    runtime.root = root  # type: ignore[assignment]
    tm.enable_telemetry(metrics=True, tracing=False)
    tm_metrics.set_hooks(hooked)
    tm.reset_metrics()
    try:
        _arrive(runtime, MessageKind.SPAWN, "", b"")  # refused: the agent's name is taken
        _arrive(runtime, MessageKind.SUPERVISION, "root", msgspec.msgpack.encode(event))
        _arrive(runtime, MessageKind.SUPERVISION, "", MALFORMED)  # not a ProcDeath
        _arrive(runtime, MessageKind.CALL, "ghost", b"")  # parked: its actor may be on its way
        _arrive(runtime, MessageKind.CALL, "alive", b"")
        _arrive(runtime, MessageKind.SUPERVISION, "alive", MALFORMED)  # not a FailureEvent
        _arrive(runtime, MessageKind.UNDELIVERABLE, "alive", MALFORMED)  # not a bounce
        assert root.faults == [event]
        assert runtime._parked_count == 1
        assert len(cell.items) == 1  # the call; the two malformed envelopes were dropped
        assert _received() == {"spawn": 1, "supervision": 3, "call": 2, "undeliverable": 1}
        runtime.cells.pop("alive")  # (a stopping process stops its actors)
        _arrive(runtime, MessageKind.STOP_PROC, "", b"")  # last: the process stops
        assert runtime.stopped
        assert _received()["stop_proc"] == 1
    finally:
        tm_metrics.set_hooks(False)
        tm.disable_telemetry()
        tm.reset_metrics()
        runtime.cells.pop("alive", None)
        runtime.root = None
