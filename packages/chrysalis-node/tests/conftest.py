"""Shared test configuration: the Hypothesis profiles (the block below)."""

from __future__ import annotations

import os

import pytest

# A `chrysalis ls` (resolve, ping, pipe) run alone starts an agent for the next commands
# (chrysalis.node._agent.autostart). The tests' commands must not leave agents behind or be
# answered by one another's: only a test that asks for it (CHRYSALIS_AGENT_AUTOSTART=1 in its
# own environment, on its own socket) gets one.
os.environ["CHRYSALIS_AGENT_AUTOSTART"] = "0"


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
