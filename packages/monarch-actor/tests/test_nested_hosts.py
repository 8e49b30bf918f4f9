"""Processes spawned from inside workers on attached hosts (``_hosts.agent``,
``_hosts.nested``): ``this_host()`` in a worker of an attached host is that host, and an attached
host mesh handed to an actor keeps naming its hosts. Worker loops run as subprocesses on loopback
(as in ``test_hosts``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import attach_to_workers, this_host

sys.path.insert(0, str(Path(__file__).parent))  # workers import nested_actors by name
from nested_actors import Spawner
from test_hosts import Daemons
from test_procs_mesh import _eventually_gone, _kill

pytestmark = pytest.mark.slow
T = 30.0


def _loop_of(parent: int, *loops: int) -> int:
    """Which of the worker loops ``loops`` started a worker whose parent is ``parent``: the
    loop itself (an exec'd worker) or the loop's zygote, whose parent is the loop (a forked
    one); ``parent`` itself when neither."""
    if parent in loops:
        return parent
    try:
        grandparent = int(Path(f"/proc/{parent}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return parent
    return grandparent if grandparent in loops else parent


@pytest.fixture
def daemons() -> Iterator[Daemons]:
    made = Daemons()
    yield made
    made.close()


def test_this_host_in_a_worker_of_an_attached_host_is_that_host(
    daemons: Daemons, faults: Any
) -> None:
    daemon = daemons.start()
    pids: list[int] = []
    try:
        hosts = attach_to_workers(workers=[daemon.address], name="remote")
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        spawner: Any = procs.spawn("spawner", Spawner)
        pids.append(spawner.os_pid.call_one().get(timeout=T))
        places = spawner.spawn.call_one(2).get(timeout=T)
        leaves = [pid for pid, _ in places]
        pids += leaves
        # Started by that host's worker loop, like the spawning worker itself.
        assert [_loop_of(p, daemon.popen.pid) for _, p in places] == [daemon.popen.pid] * 2
        assert spawner.add_everywhere.call_one(1, 2).get(timeout=T) == [3, 3]
        spawner.stop().get(timeout=T)  # stopping the owner stops what it spawned
        assert _eventually_gone(leaves, 10.0)
        hosts.shutdown().get(timeout=T)
        assert faults.failures == []
    finally:
        _kill(pids)


def test_an_attached_host_mesh_handed_to_an_actor_spawns_on_its_hosts(
    daemons: Daemons, faults: Any
) -> None:
    one, two = daemons.start(), daemons.start()
    local = this_host().spawn_procs(per_host={"gpus": 1}, name="local")
    pids: list[int] = []
    try:
        hosts = attach_to_workers(workers=[one.address, two.address], name="pair")
        spawner: Any = local.spawn("spawner", Spawner)
        pids.append(spawner.os_pid.call_one().get(timeout=T))
        places = spawner.spawn.call_one(1, hosts.slice(hosts=1)).get(timeout=T)
        pids += [pid for pid, _ in places]
        assert [_loop_of(p, two.popen.pid) for _, p in places] == [two.popen.pid]
        assert os.getpid() not in pids
        places = spawner.spawn.call_one(1, hosts).get(timeout=T)  # both hosts
        pids += [pid for pid, _ in places]
        assert [_loop_of(p, one.popen.pid, two.popen.pid) for _, p in places] == [
            one.popen.pid,
            two.popen.pid,
        ]
        local.stop().get(timeout=T)
        assert _eventually_gone(pids, 10.0)
        hosts.shutdown().get(timeout=T)
        assert faults.failures == []
    finally:
        _kill(pids)
