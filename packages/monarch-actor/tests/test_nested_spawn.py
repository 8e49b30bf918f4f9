"""Process meshes spawned from inside workers (``_hosts.agent``, ``_hosts.nested``), and
controllers.

An actor in a worker calls ``this_host().spawn_procs`` (or ``spawn_procs`` on a host mesh it
was handed): the client's host agent starts the processes, the actor owns them. Every test
kills the processes it started in ``finally`` (their OS pids come from endpoints).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import monarch.actor._hosts.nested as nested
from monarch.actor import (
    Actor,
    ActorError,
    ProcMesh,
    _local_proc_mesh,
    endpoint,
    get_or_spawn_controller,
    this_host,
    this_proc,
)

sys.path.insert(0, str(Path(__file__).parent))  # workers import nested_actors by name
from nested_actors import Spawner
from test_procs_mesh import _eventually_gone, _kill

T = 30.0


@pytest.fixture
def owner() -> Iterator[tuple[ProcMesh, Any, list[int]]]:
    """One worker running a ``Spawner``; the list collects every OS pid to clean up."""
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="owners")
    pids: list[int] = []
    try:
        spawner: Any = procs.spawn("spawner", Spawner)
        pids.append(spawner.os_pid.call_one().get(timeout=T))
        yield procs, spawner, pids
        procs.stop().get(timeout=T)
    finally:
        _kill(pids)


def test_an_actor_spawns_processes_on_its_host_calls_them_and_hands_them_on(
    transport_mode: str, owner: tuple[ProcMesh, Any, list[int]], faults: Any
) -> None:
    _, spawner, pids = owner
    assert spawner.host_extent.call_one().get(timeout=T) == "{}"  # as in the reference
    places = spawner.spawn.call_one(2).get(timeout=T)
    leaves = [pid for pid, _ in places]
    pids += leaves
    assert len(set(leaves)) == 2
    assert pids[0] not in leaves
    # Started by the client, as the reference's host agent does: not the worker's children.
    assert all(parent != pids[0] for _, parent in places)
    assert spawner.add_everywhere.call_one(2, 3).get(timeout=T) == [5, 5]
    ref: Any = spawner.leaves_ref.call_one().get(timeout=T)  # a reference reaches the client
    assert ref.add.call(1, 1).get(timeout=T).values() == [2, 2]
    assert ref.slice(gpus=1).where.call_one().get(timeout=T)[0] == leaves[1]
    spawner.stop_procs.call_one().get(timeout=T)  # the owner stops them: they exit
    assert _eventually_gone(leaves, 10.0)
    assert faults.settled() == []


def test_a_failing_grandchild_reaches_its_owners_supervise(
    transport_mode: str, owner: tuple[ProcMesh, Any, list[int]], faults: Any
) -> None:
    _, spawner, pids = owner
    leaves = [pid for pid, _ in spawner.spawn.call_one(2).get(timeout=T)]
    pids += leaves
    spawner.kill_leaf.call_one(1).get(timeout=T)
    assert _eventually_gone(leaves[1:], 10.0)
    # Once the exit is reported and the owner's mailbox is past its death notice, the owner
    # has handled it (and the client saw nothing).
    assert faults.settled() == []
    seen = spawner.seen.call_one().get(timeout=T)
    assert len(seen) == 1, "the owner was not told about its dead grandchild"
    assert "crashed_ranks=[1]" in seen[0]
    assert "exited with status 7" in seen[0]
    # The other rank carries on; the owner handled the failure, so the client saw none.
    assert spawner.add_on.call_one(0, 1, 1).get(timeout=T) == 2
    assert faults.settled() == []


def test_grandchildren_do_not_outlive_an_owner_killed_with_sigkill(
    transport_mode: str, owner: tuple[ProcMesh, Any, list[int]], faults: Any
) -> None:
    _, spawner, pids = owner
    leaves = [pid for pid, _ in spawner.spawn.call_one(2).get(timeout=T)]
    pids += leaves
    os.kill(pids[0], signal.SIGKILL)
    assert _eventually_gone(leaves, 10.0), "grandchildren outlived their killed owner"
    faults.wait_for(1, timeout=T)  # the owner's death reaches its own owner, the client
    settled = faults.settled()  # the leaves' exits are reported too: nothing more comes
    assert all("spawner" in str(f) for f in settled), settled  # no failure for the leaves


def test_stopping_the_owning_actor_stops_its_processes(
    transport_mode: str, owner: tuple[ProcMesh, Any, list[int]], faults: Any
) -> None:
    _, spawner, pids = owner
    leaves = [pid for pid, _ in spawner.spawn.call_one(2).get(timeout=T)]
    pids += leaves
    spawner.stop().get(timeout=T)
    assert _eventually_gone(leaves, 10.0)
    assert faults.settled() == []


def test_a_host_mesh_passed_to_an_actor_spawns_on_the_clients_host(
    owner: tuple[ProcMesh, Any, list[int]], faults: Any
) -> None:
    procs, spawner, pids = owner
    leaves = [pid for pid, _ in spawner.spawn.call_one(1, this_host()).get(timeout=T)]
    pids += leaves
    procs.stop().get(timeout=T)  # stopping the owner's processes stops what it spawned
    assert _eventually_gone(leaves, 10.0)
    assert faults.settled() == []


def test_nesting_is_bounded_in_depth_and_count(
    owner: tuple[ProcMesh, Any, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, spawner, pids = owner
    monkeypatch.setattr(nested, "MAX_NESTED_PROCS", 2)  # the agent runs in this process
    assert "at most 2 processes spawned from inside workers" in spawner.try_spawn.call_one(3).get(
        timeout=T
    )
    monkeypatch.setattr(nested, "MAX_SPAWN_DEPTH", 2)  # the owner's children: level 2
    pids += spawner.nest.call_one(1).get(timeout=T)
    child: Any = spawner.leaves_ref.call_one().get(timeout=T)
    message = child.try_spawn.call_one(1).get(timeout=T)
    assert "nested too deeply: at most 2 levels" in message


def test_proc_mesh_host_mesh(owner: tuple[ProcMesh, Any, list[int]]) -> None:
    procs, _, pids = owner
    two = this_host().spawn_procs(per_host={"gpus": 2}, name="two")
    try:
        with pytest.raises(NotImplementedError, match="non-singleton"):
            two.host_mesh  # noqa: B018
        assert str(two.slice(gpus=1).host_mesh.extent) == "{}"
    finally:
        two.stop().get(timeout=T)
    host = procs.host_mesh
    assert str(host.extent) == "{}"
    more = host.spawn_procs(per_host={"gpus": 1}, name="more")
    try:
        spawner: Any = more.spawn("s", Spawner)
        pids.append(spawner.os_pid.call_one().get(timeout=T))
    finally:
        more.stop().get(timeout=T)
    assert str(this_proc().host_mesh.extent) == "{}"


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self) -> int:
        self.value += 1
        return self.value

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def die(self) -> None:
        raise SystemExit("controller down")


class UsesController(Actor):
    @endpoint
    def use(self, name: str) -> int:
        counter: Any = get_or_spawn_controller(name, Counter, 1000).get(timeout=T)
        return int(counter.incr.call_one().get(timeout=T))


def test_get_or_spawn_controller_is_one_actor_per_name_in_the_client(faults: Any) -> None:
    first: Any = get_or_spawn_controller("ctl-counter", Counter, 10).get(timeout=T)
    assert str(first.extent) == "{}"
    assert first.pid.call_one().get(timeout=T) == os.getpid()
    assert first.incr.call_one().get(timeout=T) == 11
    again: Any = get_or_spawn_controller("ctl-counter", Counter, 99).get(timeout=T)
    assert again.incr.call_one().get(timeout=T) == 12  # the same actor, args ignored
    users: Any = _local_proc_mesh(per_host={"gpus": 2}).spawn("users", UsesController)
    assert sorted(users.use.call("ctl-counter").get(timeout=T).values()) == [13, 14]
    other: Any = get_or_spawn_controller("ctl-other", Counter, 0).get(timeout=T)
    assert other.incr.call_one().get(timeout=T) == 1
    with pytest.raises(ValueError):
        get_or_spawn_controller("ctl-bad", int)
    with pytest.raises(Exception):  # noqa: B017 - the controller dies (SupervisionError)
        first.die.call_one().get(timeout=T)
    # Its failure reaches the hidden owner after the caller's error: once handled, the
    # failed controller is never handed out again.
    assert faults.settled() == []  # the hidden owner swallowed the failure
    with pytest.raises(ActorError, match="Failure on ctl-counter"):
        get_or_spawn_controller("ctl-counter", Counter, 10).get(timeout=T)
    assert other.incr.call_one().get(timeout=T) == 2  # the others stay usable


def test_get_or_spawn_controller_from_worker_actors(owner: tuple[ProcMesh, Any, list[int]]) -> None:
    procs, _, _ = owner
    users: Any = procs.spawn("users", UsesController)
    assert users.use.call_one("ctl-worker").get(timeout=T) == 1001
    mine: Any = get_or_spawn_controller("ctl-worker", Counter, 0).get(timeout=T)
    assert mine.incr.call_one().get(timeout=T) == 1002
