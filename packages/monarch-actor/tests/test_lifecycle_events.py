"""Lifecycle records of actors and meshes (issue 21, item 2): spawned, running, stopping,
stopped, failed, in order, and the root cause of a cascade in the record of every failure."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from monarch.actor import Actor, ProcMesh, context, endpoint, this_host
from monarch.actor._runtime import telemetry as tm

T = 10.0


class Life(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

    @endpoint
    def die(self) -> None:
        context().actor_instance.kill("killed on purpose")

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()


class Child(Actor):
    @endpoint
    def boom(self) -> None:
        raise ValueError("child failure")


class Owner(Actor):
    @endpoint
    def run_child(self) -> None:
        procs: Any = context().actor_instance.proc_mesh
        child = procs.spawn("child", Child)
        child.boom.broadcast()  # nobody awaits it: a supervision event for this owner

    def __supervise__(self, failure: Any) -> bool:
        return False  # not handled: the owner fails too


@pytest.fixture
def records() -> Iterator[Callable[[Callable[[tm.LifecycleRecord], bool]], list[Any]]]:
    """``wait(predicate)``: the lifecycle records made since the test began, once
    ``predicate(record)`` held for one of them (a listener wakes the wait; bounded)."""
    start = max((r.seq for r in tm.lifecycle_events()), default=0)
    start = max(start, max((r.seq for r in tm.supervision_events()), default=0))
    changed = threading.Condition()
    seen: list[tm.LifecycleRecord] = []

    def listen(record: tm.LifecycleRecord) -> None:
        with changed:
            seen.append(record)
            changed.notify_all()

    remove = tm.add_lifecycle_listener(listen)

    def wait(predicate: Callable[[tm.LifecycleRecord], bool]) -> list[Any]:
        with changed:
            met = changed.wait_for(lambda: any(predicate(r) for r in seen), T)
        assert met, [(r.event, r.name) for r in seen]
        return tm.lifecycle_events(after=start)

    yield wait
    remove()


def _events_of(records: list[Any], name_part: str) -> list[str]:
    return [r.event for r in records if r.subject == "actor" and name_part in r.name]


def test_spawn_stop_kill_in_order(
    procs: Callable[..., ProcMesh], faults: Any, records: Any
) -> None:
    mesh = procs(gpus=2)
    actors: Any = mesh.spawn("life", Life)
    assert actors.ping.call().get(timeout=T).values() == [1, 1]
    actors.slice(gpus=1).die.broadcast()
    faults.wait_for(1)
    actors.stop().get(timeout=T)
    got = records(lambda r: r.event == "mesh_stopped" and r.name == "life")
    assert _events_of(got, "life{'gpus': 0/2}") == [
        "actor_spawned",
        "actor_running",
        "actor_stopping",
        "actor_stopped",
    ]
    assert _events_of(got, "life{'gpus': 1/2}") == [
        "actor_spawned",
        "actor_running",
        "actor_failed",
    ]
    mesh_events = [(r.event, r.seq) for r in got if r.subject == "actor_mesh"]
    assert [e for e, _ in mesh_events] == ["mesh_spawned", "mesh_stopping", "mesh_stopped"]
    seq = {(r.event, r.rank): r.seq for r in got if r.subject == "actor"}
    spawned, stopping, stopped = (s for _, s in mesh_events)
    assert spawned < seq[("actor_spawned", 0)]
    assert spawned < seq[("actor_spawned", 1)]
    assert stopping < seq[("actor_stopping", 0)] < seq[("actor_stopped", 0)] < stopped
    (failed,) = [r for r in got if r.event == "actor_failed"]
    assert failed.category == "user"
    assert "killed on purpose" in failed.reason
    assert "killed on purpose" in failed.root_cause  # no cause: it is its own root
    assert failed.owner == "<root>"
    assert failed.mesh_name == failed.actor_id.split("@")[0]
    (spawned_record,) = [r for r in got if r.subject == "actor_mesh" and r.event == "mesh_spawned"]
    assert spawned_record.size == 2
    assert spawned_record.owner == "<root>"
    # Every record is one JSON line of the documented schema.
    decoded = msgspec.json.decode(failed.to_json())
    assert decoded["version"] == tm.LIFECYCLE_SCHEMA_VERSION
    assert set(decoded) == set(tm.LifecycleRecord.__struct_fields__)
    assert all(r.event in tm.LIFECYCLE_EVENTS[r.subject] for r in got)


def test_cascade_root_cause_in_every_failure(
    procs: Callable[..., ProcMesh], faults: Any, records: Any
) -> None:
    owner: Any = procs(gpus=1).spawn("owner", Owner)
    owner.run_child.call_one().get(timeout=T)
    (failure,) = faults.wait_for(1)
    got = records(
        lambda r: r.event == "actor_failed" and "owner" in r.name and "child" not in r.name
    )
    failed = {r.name: r for r in got if r.event == "actor_failed"}
    (child,) = [r for name, r in failed.items() if "Child child" in name]
    (parent,) = [r for name, r in failed.items() if "Child" not in name]
    assert "child failure" in child.root_cause
    assert parent.root_cause == child.root_cause  # the first triggering event, not the owner's
    assert "child failure" not in parent.reason
    assert child.owner == parent.name  # the child mesh is the owner's
    child_mesh = [r for r in got if r.subject == "actor_mesh" and r.name == "child"]
    assert child_mesh[0].event == "mesh_spawned"
    assert child_mesh[0].owner == parent.name
    # The client's error says the same: the report's root cause is the child's failure.
    assert "child failure" in failure.report()
    (record,) = [r for r in tm.supervision_events() if r.event == "unhandled_fault"][-1:]
    assert "child failure" in record.root_cause


def test_process_lifecycle_of_stopped_and_killed_workers(faults: Any, records: Any) -> None:
    """Every worker process: ``proc_starting`` < ``proc_ready`` < ``proc_exited``, recorded
    by the client, the exit with its code (a stop: 0) or signal (a kill: SIGKILL)."""
    first = this_host().spawn_procs({"gpus": 2}, name="lcfirst")
    second = this_host().spawn_procs({"gpus": 2}, name="lcsecond")
    os_pids: list[int] = []
    try:
        os_pids = first.spawn("life", Life).os_pid.call().get(timeout=T).values()
        first.stop().get(timeout=T)
        victims: Any = second.spawn("life", Life)
        os_pids += victims.os_pid.call().get(timeout=T).values()
        os.kill(os_pids[3], signal.SIGKILL)
        faults.wait_for(1, timeout=T)
        got = records(lambda r: r.event == "proc_exited" and r.reason == "signal SIGKILL")
        second.stop().get(timeout=T)
        got = records(
            lambda r: r.event == "proc_exited" and r.name.startswith("lcsecond") and r.rank == 0
        )
    finally:
        for pid in os_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    procs = [r for r in got if r.subject == "proc"]
    by_label: dict[str, list[Any]] = {}
    for r in procs:
        by_label.setdefault(r.name, []).append(r)
    assert sorted(by_label) == sorted(
        f"{mesh}{{'gpus': {rank}/2}}" for mesh in ("lcfirst", "lcsecond") for rank in (0, 1)
    ), sorted(by_label)
    exits = {}
    for label, events in by_label.items():
        assert [r.event for r in events] == ["proc_starting", "proc_ready", "proc_exited"]
        assert events[0].seq < events[1].seq < events[2].seq
        assert all(r.proc == "client" and r.size == 2 for r in events)
        assert events[1].actor_id == events[2].actor_id != ""  # its PID, once known
        exits[label] = events[2].reason
    assert exits == {
        "lcfirst{'gpus': 0/2}": "exit code 0",
        "lcfirst{'gpus': 1/2}": "exit code 0",
        "lcsecond{'gpus': 0/2}": "exit code 0",
        "lcsecond{'gpus': 1/2}": "signal SIGKILL",
    }
    assert all(r.event in tm.LIFECYCLE_EVENTS[r.subject] for r in procs)
