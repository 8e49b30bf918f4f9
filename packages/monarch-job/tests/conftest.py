"""Shared test configuration: the Slurm test cluster (one per session, for every module that
asks for it) and the Hypothesis profiles (the block below)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the workers import cluster_actors by name
import _slurm_cluster
from _slurm_cluster import SlurmCluster, SlurmUnavailable


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """A running test cluster; ``SLURM_CONF`` (for the Slurm commands) and ``PYTHONPATH`` (for
    the workers, which inherit the submitter's environment) set while it runs."""
    if sys.platform != "linux":
        pytest.skip("the Slurm test cluster needs Linux")
    try:
        cluster = _slurm_cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(f"no Slurm test cluster: {exc}")
    saved = {key: os.environ.get(key) for key in ("SLURM_CONF", "PYTHONPATH")}
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        cluster.stop()


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
