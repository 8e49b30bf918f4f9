"""How the modules of ``_hosts`` are wired without importing upwards (README, "Layers").

A worker group reports exits to the callback it is built with, the client's node layer tells
its observers of every process gone and of its shutdown, and the layer the runtime builds has
the table of nested processes subscribed, so a process that died cannot have processes spawned
for it.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from chrysalis.core import Pid
from monarch.actor._base.shape import Extent
from monarch.actor._hosts.client_node import ClientNodeLayer
from monarch.actor._hosts.groups import WorkerGroup
from monarch.actor._hosts.host_mesh import _new_node_layer
from monarch.actor._hosts.nested import NestedProcs, nested_procs


class _Exits:
    def __init__(self) -> None:
        self.calls: list[tuple[Pid, str, bool, bool]] = []

    def __call__(self, pid: Pid, reason: str, *, failure: bool, fenced: bool = False) -> None:
        self.calls.append((pid, reason, failure, fenced))


def _group(exits: _Exits, size: int = 2) -> WorkerGroup:
    group = WorkerGroup([f"w{rank}" for rank in range(size)], exits)
    group.pids = [Pid(bytes([rank + 1]) * 16) for rank in range(size)]
    group.exited = [threading.Event() for _ in range(size)]
    return group


def test_a_worker_group_reports_exits_to_its_callback() -> None:
    exits = _Exits()
    group = _group(exits)
    group.on_exit(0, "crashed")
    group.on_exit(0, "crashed again")  # once per rank
    group.on_exit(1, "stopped", expected=True)
    assert exits.calls == [
        (group.pids[0], "crashed", True, False),
        (group.pids[1], "stopped", False, False),
    ]
    assert all(event.is_set() for event in group.exited)


def test_an_unresponsive_worker_is_reported_fenced_and_its_exit_only_ends_the_wait() -> None:
    exits = _Exits()
    group = _group(exits, size=1)
    group.on_unresponsive(0, 9.0, 5.0)
    assert len(exits.calls) == 1
    pid, reason, failure, fenced = exits.calls[0]
    assert (pid, failure, fenced) == (group.pids[0], True, True)
    assert "stopped answering heartbeats" in reason
    assert group.live_pids() == []
    group.on_exit(0, "killed")
    assert len(exits.calls) == 1
    assert group.exited[0].is_set()


class _Observer:
    def __init__(self) -> None:
        self.gone: list[Pid] = []
        self.cleared = 0

    def process_gone(self, pid: Pid) -> None:
        self.gone.append(pid)

    def clear(self) -> None:
        self.cleared += 1


def test_the_node_layer_tells_its_observers_of_deaths_and_of_its_shutdown() -> None:
    layer = ClientNodeLayer()
    observer = _Observer()
    layer.observe(observer)
    assert layer.observer(_Observer) is observer
    pid = Pid(b"\x07" * 16)
    layer.process_died(pid, "exited with status 1", failure=True)  # no client yet: no notice
    assert observer.gone == [pid]
    client: Any = SimpleNamespace(fabric=SimpleNamespace(uplink=None))
    layer.shutdown(client, 1.0)
    assert observer.cleared == 1
    with pytest.raises(LookupError):
        layer.observer(NestedProcs)


def test_the_runtime_s_node_layer_refuses_spawns_for_a_process_that_died() -> None:
    layer = _new_node_layer()
    table = nested_procs(layer)
    requester = Pid(b"\x09" * 16)
    layer.process_died(requester, "was killed by SIGKILL", failure=False)
    with pytest.raises(RuntimeError, match="is gone"):
        table.spawn(
            SimpleNamespace(node_layer=layer),  # type: ignore[arg-type]
            requester.raw,
            "client",
            [0],
            Extent(["gpus"], [1]),
            Extent(["gpus"], [1]),
            "procs",
        )
