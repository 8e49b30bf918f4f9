"""A process forked while another thread holds a metrics lock can still use metrics (the child
gets new locks: ``metrics._after_fork``)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.telemetry import metrics as tm_metrics

sys.path.insert(0, str(Path(__file__).parent))  # the shared fork harness, by name
from forking import fork_while_held


def _uses_metrics() -> bool:
    """(in the child) Register an instrument, record, fold and read metrics, reset them."""
    tm.get_meter("fork-test").create_counter("fork_test.count").add(1)
    points = tm.metrics_snapshot()
    tm.reset_metrics()
    return "fork_test.count" in points


LOCKS: dict[str, Callable[[], Any]] = {
    "hook": lambda: tm_metrics._HOOK_LOCK,
    "instruments": lambda: tm_metrics._instruments_lock,
    "instrument": lambda: tm_metrics._supervision._lock,
}


@pytest.mark.parametrize("which", sorted(LOCKS))
def test_a_child_forked_while_a_lock_is_held_uses_metrics(which: str) -> None:
    assert fork_while_held(LOCKS[which](), _uses_metrics) == b"ok"


def _shares_one_lock() -> bool:
    """(in the child) The runtime's instruments share the hook lock; the others have their own."""
    shared = tm_metrics._HOOK_LOCK
    same = all(
        i._lock is shared for i in (tm_metrics._sent, tm_metrics._received, tm_metrics._depth)
    )
    return same and tm_metrics._supervision._lock is not shared


def test_the_runtime_instruments_still_share_one_lock_in_a_child() -> None:
    assert fork_while_held(threading.Lock(), _shares_one_lock) == b"ok"
