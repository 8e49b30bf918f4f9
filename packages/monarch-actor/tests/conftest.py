"""Fixtures: simulated proc meshes that are always stopped, and a recording fault hook."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

import monarch.actor
from monarch.actor import MeshFailure, ProcMesh, _local_proc_mesh
from monarch.config._registry import configured


class FaultLog:
    """Records what reaches ``monarch.actor.unhandled_fault_hook``."""

    def __init__(self) -> None:
        self.failures: list[MeshFailure] = []

    def __call__(self, failure: MeshFailure) -> None:
        self.failures.append(failure)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[MeshFailure]:
        deadline = time.monotonic() + timeout
        while len(self.failures) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(self.failures) >= count, f"expected {count} faults, got {self.failures}"
        return self.failures


@pytest.fixture(scope="module", params=["lanes", "force-quic"])
def transport_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Multi-process tests run twice: over direct lanes, and with ``force_quic`` (the setting
    reaches the workers through their environment)."""
    if request.param == "force-quic":
        with configured(force_quic=True):
            yield request.param
    else:
        yield request.param


@pytest.fixture(autouse=True)
def faults(monkeypatch: pytest.MonkeyPatch) -> FaultLog:
    log = FaultLog()
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", log)
    return log


@pytest.fixture
def procs() -> Iterator[Callable[..., ProcMesh]]:
    made: list[ProcMesh] = []

    def make(**per_host: int) -> ProcMesh:
        mesh = _local_proc_mesh(per_host=per_host or None)
        made.append(mesh)
        return mesh

    yield make
    for mesh in made:
        mesh.stop().get(timeout=10)


@pytest.fixture
def wait_until() -> Callable[..., None]:
    def wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(0.005)

    return wait
