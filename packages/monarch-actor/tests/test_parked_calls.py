"""Calls that overtake their actor's spawn are held (bounded), then routed or rejected."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch.actor import Future, SupervisionError
from monarch.actor._base.envelope import ActorAddr, Envelope, MessageKind
from monarch.actor._runtime import proc as rt
from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.client import new_local_runtime
from monarch.actor._runtime.sinks import Reply, decode_reply, gather_future

sys.path.insert(0, str(Path(__file__).parent))  # the shared stand-ins, by name
from fake_cells import FakeCell


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[rt.ProcRuntime]:
    # 2 s: the checks that a call is still held run on this thread while the runtime's loop
    # thread times it out; at 0.2 s, this thread held off the CPU (or the GIL) that long saw
    # a call already rejected
    monkeypatch.setattr(rt, "PARK_TIMEOUT", 2.0)
    runtime = new_local_runtime("parking")
    yield runtime
    runtime.close()


def _call_to(runtime: rt.ProcRuntime, path: str, received: bool = False) -> Future[list[Reply]]:
    port, future = gather_future(1, lambda replies: replies)
    sender = ActorAddr(port.actor.pid, port.actor.path)
    env = Envelope(
        MessageKind.CALL, sender, ActorAddr(runtime.pid_raw, path),
        -1, "ping", 0, port, None, b"",
    )  # fmt: skip
    done = threading.Event()

    def route() -> None:
        runtime._route(env, [], received)  # ``received``: as ``_on_envelope`` routes it
        done.set()

    runtime.loop.loop.call_soon_threadsafe(route)
    assert done.wait(5)
    return future


def test_call_to_an_actor_that_never_arrives_is_rejected_after_the_park_timeout(
    runtime: rt.ProcRuntime,
) -> None:
    future = _call_to(runtime, "ghost-0001")
    assert not future.done()  # held, not rejected at once
    assert runtime._parked_count == 1
    (reply,) = future.get(timeout=5)
    assert reply.ok is False
    with pytest.raises(SupervisionError, match="no actor 'ghost-0001' exists"):
        decode_reply(reply)
    assert runtime._parked_count == 0
    assert not runtime._parked


def _spawn_lands(runtime: rt.ProcRuntime, path: str) -> FakeCell:
    """An actor appears at ``path`` (a fake cell) and the calls parked for it are routed."""
    cell = FakeCell()
    done = threading.Event()

    def spawn_lands() -> None:
        runtime.cells[path] = cell  # type: ignore[assignment]
        runtime._unpark(path)
        done.set()

    runtime.loop.loop.call_soon_threadsafe(spawn_lands)
    assert done.wait(5)
    return cell


def test_parked_calls_reach_the_actor_in_order_once_it_exists(
    runtime: rt.ProcRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rt, "PARK_TIMEOUT", 60.0)  # no call may time out before the spawn lands
    futures = [_call_to(runtime, "late-0001") for _ in range(3)]
    cell = _spawn_lands(runtime, "late-0001")
    ports = [item.env.reply_port for item in cell.items]  # type: ignore[attr-defined]
    assert len(ports) == 3
    assert all(p is not None for p in ports)
    assert [p.index for p in ports] == sorted(p.index for p in ports)
    assert runtime._parked_count == 0
    assert not any(f.done() for f in futures)  # delivered, not rejected
    runtime.cells.pop("late-0001")


def test_parked_calls_are_bounded(runtime: rt.ProcRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rt, "MAX_PARKED_CALLS", 2)
    held = [_call_to(runtime, f"ghost-{i}") for i in range(2)]
    overflow = _call_to(runtime, "ghost-9")
    (reply,) = overflow.get(timeout=5)  # rejected at once: nothing more is held
    assert reply.ok is False
    assert runtime._parked_count == 2
    for future in held:
        assert future.get(timeout=5)[0].ok is False


def test_parked_calls_are_counted_as_received_once_with_metrics_on(
    runtime: rt.ProcRuntime,
) -> None:
    """Metrics on: a parked call is counted as received when it arrives and observed at its
    mailbox depth when it reaches the actor, not received a second time then (``_route``
    counts a call to an actor and its depth with one tick, only for a call just received)."""
    tm.enable_telemetry(metrics=True, tracing=False)
    tm.reset_metrics()
    try:
        for _ in range(3):
            _call_to(runtime, "late-0002", received=True)
        assert runtime._parked_count == 3
        cell = _spawn_lands(runtime, "late-0002")
        assert len(cell.items) == 3
        snapshot = tm.metrics_snapshot()
        received = snapshot["monarch.messages.received"]
        assert [p.value for p in received if p.attributes == {"kind": "call"}] == [3]
        (depth,) = snapshot["monarch.mailbox.depth"]
        assert depth.count == 3
        runtime.cells.pop("late-0002")
    finally:
        tm.disable_telemetry()
        tm.reset_metrics()
