"""torch.distributed process groups made on process meshes (``init_process_group``): collectives,
teardown with the mesh, and a rank killed mid-collective that neither hangs the others nor the
client."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import monarch.actor
from monarch.actor import ActorError, MeshFailure, ProcMesh, SupervisionError, this_host
from monarch.spmd import MeshProcessGroup, init_process_group

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))  # workers import spmd_actors by name
from spmd_actors import Collective

T = 120.0


class Faults:
    """What reaches ``monarch.actor.unhandled_fault_hook`` (a condition wakes the waiters)."""

    def __init__(self) -> None:
        self.failures: list[MeshFailure] = []
        self._changed = threading.Condition()

    def __call__(self, failure: MeshFailure) -> None:
        with self._changed:
            self.failures.append(failure)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float) -> list[MeshFailure]:
        with self._changed:
            met = self._changed.wait_for(lambda: len(self.failures) >= count, timeout)
        assert met, f"expected {count} faults, got {self.failures}"
        return self.failures


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Faults:
    log = Faults()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", log)
    return log


@pytest.fixture(scope="module", params=[{"gpus": 2}, {"hosts": 2, "gpus": 2}], ids=["2", "4"])
def mesh(request: pytest.FixtureRequest) -> Iterator[tuple[ProcMesh, MeshProcessGroup, Any]]:
    """A mesh of 2, then of 4 processes with a gloo group, shared by the module's tests."""
    procs = this_host().spawn_procs(per_host=request.param)
    try:
        group = init_process_group(procs, timeout=60.0)
        yield procs, group, procs.spawn("collective", Collective)
    finally:
        procs.stop().get(timeout=T)


def test_the_group_spans_the_mesh_ranked_as_torchrun(
    mesh: tuple[ProcMesh, MeshProcessGroup, Any],
) -> None:
    procs, group, _ = mesh
    size = len(procs.spawn("probe", Collective).has_group.call().get(timeout=T).values())
    assert group.backend == "gloo"  # no CUDA here
    assert group.world_size == size
    states = group.actors.state.call().get(timeout=T).values()
    assert [s["rank"] for s in states] == list(range(size))
    assert {(s["backend"], s["world_size"]) for s in states} == {("gloo", size)}
    assert (group.timeout, group.rendezvous_timeout) == (60.0, 60.0)
    assert len({s["pid"] for s in states}) == size


def test_all_reduce_sums_over_every_process(mesh: tuple[ProcMesh, MeshProcessGroup, Any]) -> None:
    _, group, collective = mesh
    n = group.world_size
    # every rank contributes [rank + 1, 10 * rank]: each must end with the sums
    calls = [
        collective.slice(**point).all_reduce.call_one([rank + 1.0, 10.0 * rank])
        for rank, point in enumerate(_points(mesh[0]))
    ]
    want = [n * (n + 1) / 2, 10.0 * n * (n - 1) / 2]
    assert [c.get(timeout=T) for c in calls] == [want] * n


def _points(procs: ProcMesh) -> list[dict[str, int]]:
    labels = list(procs._labels)
    if labels == ["gpus"]:
        return [{"gpus": g} for g in range(procs.size("gpus"))]
    return [
        {"hosts": h, "gpus": g}
        for h in range(procs.size("hosts"))
        for g in range(procs.size("gpus"))
    ]


def test_a_second_group_on_the_same_mesh_is_refused(
    mesh: tuple[ProcMesh, MeshProcessGroup, Any],
) -> None:
    procs, group, collective = mesh
    with pytest.raises(ActorError, match="already has a default process group"):
        init_process_group(procs, timeout=10.0)
    n = group.world_size  # the first group is untouched
    assert collective.all_reduce.call([1.0]).get(timeout=T).values() == [[float(n)]] * n


def test_bad_arguments_are_rejected(mesh: tuple[ProcMesh, MeshProcessGroup, Any]) -> None:
    procs, _, _ = mesh
    with pytest.raises(ValueError, match="both master_addr and master_port"):
        init_process_group(procs, master_addr="localhost")
    for timeout in (0, -1.0, float("inf"), "10", True):
        with pytest.raises(ValueError, match=r"^timeout"):
            init_process_group(procs, timeout=timeout)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^rendezvous_timeout"):
            init_process_group(procs, rendezvous_timeout=timeout)  # type: ignore[arg-type]


def test_destroy_tears_the_group_down_and_a_new_one_can_be_made() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        collective: Any = procs.spawn("collective", Collective)
        group = init_process_group(
            procs, timeout=30.0, master_addr="127.0.0.1", master_port=_port()
        )
        assert collective.has_group.call().get(timeout=T).values() == [True, True]
        group.destroy().get(timeout=T)
        assert collective.has_group.call().get(timeout=T).values() == [False, False]
        again = init_process_group(procs, timeout=30.0)
        assert again.master_port != group.master_port or again.master_addr != group.master_addr
        assert collective.all_reduce.call([2.0]).get(timeout=T).values() == [[4.0], [4.0]]
    finally:
        procs.stop().get(timeout=T)
    # stopping the mesh destroyed the second group with it: its actors are gone
    with pytest.raises(SupervisionError):
        again.actors.state.call().get(timeout=T)


def _port() -> int:
    from monarch.spmd._network import find_free_port

    return find_free_port()


GROUP_TIMEOUT = 5.0


def test_a_rank_killed_mid_collective_fails_the_call_within_the_timeout(faults: Faults) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        init_process_group(procs, timeout=GROUP_TIMEOUT, rendezvous_timeout=T)
        collective: Any = procs.spawn("collective", Collective)
        assert collective.all_reduce.call([1.0]).get(timeout=T).values() == [[2.0], [2.0]]
        survivor = collective.slice(gpus=0).all_reduce_or_die.call_one(1, 1 << 16)
        dying = collective.slice(gpus=1).all_reduce_or_die.call_one(1, 1 << 16)
        started = time.monotonic()
        with pytest.raises(SupervisionError):
            dying.get(timeout=T)
        # the survivor's collective ends with an error (the peer's connection broke, or the
        # group's timeout passed): no hang
        with pytest.raises(ActorError):
            survivor.get(timeout=GROUP_TIMEOUT + 30.0)
        assert time.monotonic() - started < GROUP_TIMEOUT + 30.0
        # the owner (this client) is told of the death
        (death, *_) = faults.wait_for(1, timeout=T)
        assert "crashed_ranks=[1]" in str(death)
    finally:
        stopping = time.monotonic()
        procs.stop().get(timeout=T)  # the mesh can still be stopped
        assert time.monotonic() - stopping < T


def test_a_rank_missing_from_a_collective_times_out_instead_of_hanging() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        init_process_group(procs, timeout=GROUP_TIMEOUT, rendezvous_timeout=T)
        collective: Any = procs.spawn("collective", Collective)
        started = time.monotonic()
        with pytest.raises(ActorError):  # rank 1 never joins: gloo's timeout ends rank 0's wait
            collective.slice(gpus=0).all_reduce.call_one([1.0]).get(timeout=T)
        took = time.monotonic() - started
        assert GROUP_TIMEOUT * 0.8 < took < GROUP_TIMEOUT + 30.0
    finally:
        procs.stop().get(timeout=T)
