"""Fixtures: simulated proc meshes that are always stopped, and a recording fault hook."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

import monarch.actor
from monarch.actor import MeshFailure, ProcMesh, _local_proc_mesh
from monarch.actor.testing import flush_supervision
from monarch.config._registry import configured


class FaultLog:
    """Records what reaches ``monarch.actor.unhandled_fault_hook``.

    The hook call is the event: it wakes the tests waiting in :meth:`wait_until` (a condition
    variable, bounded by a timeout), so they need not poll the list."""

    def __init__(self) -> None:
        self.failures: list[MeshFailure] = []
        self._changed = threading.Condition()

    def __call__(self, failure: MeshFailure) -> None:
        with self._changed:
            self.failures.append(failure)
            self._changed.notify_all()

    def wait_until(
        self, predicate: Callable[[list[MeshFailure]], bool], timeout: float = 5.0
    ) -> list[MeshFailure]:
        """Wait (at most ``timeout`` seconds) until ``predicate(failures)`` holds; fails the
        test with the failures seen so far if it never does."""
        with self._changed:
            met = self._changed.wait_for(lambda: predicate(self.failures), timeout)
        assert met, f"the faults never matched: {[f.report() for f in self.failures]}"
        return self.failures

    def settled(self, timeout: float = 20.0) -> list[MeshFailure]:
        """The faults once every supervision event already received or in flight reached the
        hook (``flush_supervision``): what a negative check ("no fault reached the client")
        compares, instead of sleeping a while first."""
        flush_supervision(timeout)
        with self._changed:
            return list(self.failures)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[MeshFailure]:
        """Wait (bounded) until at least ``count`` faults arrived."""
        with self._changed:
            met = self._changed.wait_for(lambda: len(self.failures) >= count, timeout)
        assert met, f"expected {count} faults, got {self.failures}"
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
    """A bounded 5 ms poll, only for state with no event to wait on: how many threads are left
    (``test_bounds.py``: actor threads end on their own, and the threads of a finished mesh are
    not reachable from the test to join). Faults wait on ``faults`` (a condition), "nothing
    more comes" on ``faults.settled()``."""

    def wait(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "condition not reached in time"
            time.sleep(0.005)

    return wait


# --- Hypothesis profiles (issue 15). This block is the same in every tests/conftest.py of the
# repository (tests/test_hypothesis_profiles.py compares them), so a package's tests load them when
# it is installed and tested alone too. The top README's "Testing" section says what they do.
def pytest_configure(config: pytest.Config) -> None:
    """Register the Hypothesis profiles ``ci`` (derandomized, no example database, no
    deadline) and ``dev`` (new examples every run, failures saved in ``.hypothesis/``), then
    load ``--hypothesis-profile``'s, else ``ci`` where ``CI=true``, else the one named by
    ``HYPOTHESIS_PROFILE``, else ``dev``."""
    import os

    from hypothesis import HealthCheck, settings

    slow = [HealthCheck.too_slow]
    settings.register_profile(
        "ci",
        derandomize=True,
        database=None,
        print_blob=True,
        deadline=None,
        suppress_health_check=slow,
    )
    settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=slow)
    chosen = config.getoption("--hypothesis-profile", None)
    if not chosen and os.environ.get("CI", "").lower() in ("true", "1"):
        chosen = "ci"
    settings.load_profile(chosen or os.environ.get("HYPOTHESIS_PROFILE") or "dev")


# --- end of the Hypothesis profiles
