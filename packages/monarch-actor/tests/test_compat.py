"""Monarch programs that must run unchanged (issue #15, item 7): real worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from monarch.actor import Channel, Extent, ProcMesh, Shape, Slice, this_host

sys.path.insert(0, str(Path(__file__).parent))  # workers import compat_actors by name
from compat_actors import Echo, LateReplier

T = 30.0


@pytest.fixture
def spawned() -> Iterator[list[ProcMesh]]:
    """Proc meshes the test spawned: stopped at the end (their workers killed if that fails)."""
    meshes: list[ProcMesh] = []
    yield meshes
    for mesh in meshes:
        pids: list[int] = []
        with contextlib.suppress(Exception):
            pids = list(mesh.spawn("reaper", Echo).os_pid.call().get(timeout=T).values())
        try:
            mesh.stop().get(timeout=T)
        except Exception:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_spawn_procs_without_arguments_is_a_one_process_mesh(
    spawned: list[ProcMesh], transport_mode: str
) -> None:
    procs = this_host().spawn_procs()  # raised "sizes and strides must have the same length"
    spawned.append(procs)
    assert procs.size() == 1
    assert dict(procs.extent) == {}
    echo = procs.spawn("echo", Echo)
    assert echo.rank.call_one().get(timeout=T) == "{}"
    assert list(echo.rank.call().get(timeout=T).values()) == ["{}"]
    assert echo.os_pid.call_one().get(timeout=T) != os.getpid()


def test_a_zero_dimensional_row_major_slice_holds_one_rank() -> None:
    assert Slice.new_row_major([]) == Slice(offset=0, sizes=[], strides=[])
    shape = Shape.from_extent(Extent([], []))
    assert list(shape.ndslice) == [0]
    assert shape.labels == []


def test_lambdas_closures_and_local_classes_cross_processes(
    spawned: list[ProcMesh], transport_mode: str
) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    spawned.append(procs)
    echo = procs.spawn("echo", Echo)
    one = echo.slice(gpus=1)
    offset = 100

    class Local:
        def __init__(self, value: int) -> None:
            self.value = value

    # As arguments: a lambda, a closure, a local class (the worker builds an instance).
    assert one.apply.call_one(lambda x: x * 3, 7).get(timeout=T) == 21
    assert list(echo.apply.call(lambda x: x + offset, 1).get(timeout=T).values()) == [101, 101]
    made = one.apply.call_one(Local, 9).get(timeout=T)
    assert type(made).__name__ == "Local"
    assert made.value == 9
    # As results: a closure and an instance of a class local to the endpoint.
    adder = one.make_adder.call_one(10).get(timeout=T)
    assert adder(5) == 15
    local = one.make_local_object.call_one(4).get(timeout=T)
    assert local.doubled() == 8


def test_cloudpickle_is_a_required_dependency() -> None:
    # Not an extra: Monarch programs pass lambdas without installing anything more.
    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    required = project["project"]["dependencies"]
    assert any(r.startswith("cloudpickle") for r in required), required
    assert "cloudpickle" not in project["project"].get("optional-dependencies", {})


def test_explicit_response_port_answered_from_a_thread_after_returning(
    spawned: list[ProcMesh], transport_mode: str
) -> None:
    # The endpoint returns at once; a thread it started replies later, outside any actor.
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    spawned.append(procs)
    late = procs.spawn("late", LateReplier)
    assert late.slice(gpus=0).from_thread.call_one(21).get(timeout=T) == 42
    assert list(late.from_thread.call(5).get(timeout=T).values()) == [10, 10]
    with pytest.raises(ValueError, match="late boom"):
        late.slice(gpus=1).error_from_thread.call_one("late boom").get(timeout=T)
    port, receiver = Channel.open()
    late.slice(gpus=1).send_from_thread.broadcast(port, "via a channel")
    assert receiver.recv().get(timeout=T) == "via a channel"
