"""Shared test configuration: a patient link timeout for worker processes, and the Hypothesis
profiles (the block below)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from monarch.config import configured

#: The QUIC idle timeout of the links to worker processes while these tests run (monarch-actor's
#: default is 3 s). On a starved machine (load above 10 on 2 cores, seen while six people shared
#: one) a link that saw no keepalive for 3 s dropped, and the first call to a fresh mesh of 4
#: failed with "PID ... is not found". Nothing here depends on that timeout: worker deaths reach
#: the client from their exit statuses.
LINK_IDLE_TIMEOUT = 30.0


@pytest.fixture(scope="session", autouse=True)
def patient_links() -> Iterator[None]:
    with configured(mesh_orphan_timeout=LINK_IDLE_TIMEOUT):
        yield


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
