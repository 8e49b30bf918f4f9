"""A process forked while another thread holds a metrics lock can still use metrics (the child
gets new locks: ``metrics._after_fork``)."""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.telemetry import metrics as tm_metrics

TIMEOUT = 30.0


def _fork_while_held(lock: Any) -> bytes:
    """Fork while another thread holds ``lock``; the child registers an instrument, records,
    folds and reads metrics, resets them and writes ``ok`` (bounded: a child stuck on a lock
    is killed and the answer is empty)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(TIMEOUT)

    holder = threading.Thread(target=hold)
    holder.start()
    read, write = os.pipe()
    try:
        assert held.wait(TIMEOUT)
        pid = os.fork()
        if pid == 0:  # the child: use metrics, answer, out without cleanup
            try:
                tm.get_meter("fork-test").create_counter("fork_test.count").add(1)
                points = tm.metrics_snapshot()
                tm.reset_metrics()
                os.write(write, b"ok" if "fork_test.count" in points else b"no")
            finally:
                os._exit(0)
    finally:
        release.set()
        holder.join(TIMEOUT)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], TIMEOUT)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return b""
        return os.read(read, 2)
    finally:
        os.close(read)
        os.waitpid(pid, 0)


LOCKS: dict[str, Callable[[], Any]] = {
    "hook": lambda: tm_metrics._HOOK_LOCK,
    "instruments": lambda: tm_metrics._instruments_lock,
    "instrument": lambda: tm_metrics._supervision._lock,
}


@pytest.mark.parametrize("which", sorted(LOCKS))
def test_a_child_forked_while_a_lock_is_held_uses_metrics(which: str) -> None:
    assert _fork_while_held(LOCKS[which]()) == b"ok"


def test_the_runtime_instruments_still_share_one_lock_in_a_child() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            shared = tm_metrics._HOOK_LOCK
            same = all(
                i._lock is shared
                for i in (tm_metrics._sent, tm_metrics._received, tm_metrics._depth)
            )
            own = tm_metrics._supervision._lock is not shared
            os.write(write, b"ok" if same and own else b"no")
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], TIMEOUT)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        data = os.read(read, 2) if ready else b""
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert data == b"ok"
