"""A process forked while another thread holds the listeners' lock can still add and remove
span and supervision-record listeners (the child gets a new lock: ``listeners._after_fork``)."""

from __future__ import annotations

import sys
from pathlib import Path

from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.telemetry import listeners as tm_listeners
from monarch.actor._runtime.telemetry import tracing as tm_tracing

sys.path.insert(0, str(Path(__file__).parent))  # the shared fork harness, by name
from forking import fork_while_held


def test_a_child_forked_while_the_listeners_lock_is_held_adds_and_removes_listeners() -> None:
    """Fork while another thread holds the listeners' lock; the child adds and removes a span
    listener and a supervision-record listener (bounded: a child stuck on the lock is killed
    and the answer is empty)."""
    lock = tm_listeners._listeners_lock

    def child() -> bool:
        remove = tm.add_span_listener(lambda s: None)
        plain_with = tm_tracing._PLAIN
        remove()
        tm.add_supervision_listener(lambda r: None)()
        new = tm_listeners._listeners_lock is not lock
        return new and plain_with is False and tm_tracing._PLAIN is True

    assert fork_while_held(lock, child) == b"ok"
