"""A worker process that stops answering (here: ``SIGSTOP``) is declared dead and fenced.

Real worker processes, with direct lanes and with ``force_quic``: the client's heartbeats
(``_runtime.watchdog``) go unanswered for ``supervision_watchdog_timeout`` seconds, the caller
gets a ``SupervisionError`` and the owner's ``__supervise__`` the event, as for a killed
process; once the process runs again (``SIGCONT``) its lease has run out, so it sends nothing
(its late reply never leaves) and exits with status 4 instead of rejoining.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Channel, SupervisionError, this_host
from monarch.actor._hosts.groups import LocalWorkerGroup
from monarch.actor._hosts.worker_exits import EXIT_FENCED, EXIT_ORPHANED
from monarch.config._registry import configured

sys.path.insert(0, str(Path(__file__).parent))  # workers import liveness_actors by name
from liveness_actors import Owner, Sleeper

T = 20.0
WATCHDOG = 3.0  # short, with a margin for a loaded machine (every worker is watched)


@pytest.fixture
def short_watchdog(transport_mode: str) -> Iterator[None]:
    with configured(supervision_watchdog_timeout=WATCHDOG):
        yield


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


def test_a_stopped_worker_is_declared_dead_fenced_and_exits_when_it_runs_again(
    short_watchdog: None, faults: Any
) -> None:
    owners = this_host().spawn_procs({"gpus": 1}, name="owners")
    workers = this_host().spawn_procs({"gpus": 2}, name="workers")
    pids: list[int] = []
    try:
        owner: Any = owners.spawn("owner", Owner)
        watcher, told = Channel[str].open()
        child, child_pids = owner.spawn_child.call_one(workers, watcher).get(timeout=T)
        pids = list(child_pids)
        started, running = Channel[int].open()
        late, late_messages = Channel[str].open()
        call = child.slice(gpus=1).nap.call_one(started, late, 5.0)
        stopped = running.recv().get(timeout=T)
        assert stopped == child_pids[1]
        os.kill(stopped, signal.SIGSTOP)
        began = time.monotonic()
        # The caller: a SupervisionError within a bound, not a wait for ever.
        with pytest.raises(SupervisionError, match=r"child\.nap\(\) failed"):
            call.get(timeout=WATCHDOG + T)
        assert time.monotonic() - began < WATCHDOG + 10.0
        # The owner: the same event as for a dead process, naming the silence.
        event = told.recv().get(timeout=T)
        assert "crashed_ranks=[1]" in event
        assert "stopped answering heartbeats" in event
        # Later calls to that rank fail fast; the other rank lives on.
        with pytest.raises(SupervisionError, match="stopped answering heartbeats"):
            child.slice(gpus=1).os_pid.call_one().get(timeout=T)
        assert child.slice(gpus=0).os_pid.call_one().get(timeout=T) == child_pids[0]
        # It runs again: its lease ran out, so it sends nothing and exits by itself.
        assert workers._state is not None
        group = workers._state.group
        assert isinstance(group, LocalWorkerGroup)
        os.kill(stopped, signal.SIGCONT)
        assert group.popens[1].wait(timeout=T) == EXIT_FENCED
        assert len(owner.seen.call_one().get(timeout=T)) == 1  # declared once, not again at exit
        assert faults.settled() == []  # handled by the owner
        # Its exit status says it fenced itself before sending: the late message never left.
        assert not late_messages.recv().done()
        owners.stop().get(timeout=T)
        workers.stop().get(timeout=T)
    finally:
        _kill(pids)


def test_a_worker_busy_in_a_long_call_keeps_answering_heartbeats(
    transport_mode: str, faults: Any
) -> None:
    with configured(supervision_watchdog_timeout=2.0):
        procs = this_host().spawn_procs({"gpus": 1})
        pids: list[int] = []
        try:
            sleeper: Any = procs.spawn("sleeper", Sleeper)
            pids = [sleeper.os_pid.call_one().get(timeout=T)]
            started, _running = Channel[int].open()
            late, _late = Channel[str].open()
            # 2.5 timeouts in one endpoint: the runtime loop answers while the actor sleeps.
            assert sleeper.nap.call_one(started, late, 5.0).get(timeout=T) == pids[0]
            assert faults.settled() == []
            procs.stop().get(timeout=T)
        finally:
            _kill(pids)


@pytest.mark.parametrize("stderr_state", ["closed", "full"])
def test_the_orphan_exit_is_not_held_by_a_dead_or_full_stderr_pipe(stderr_state: str) -> None:
    """The orphaned worker's last words go to stderr, which may be a pipe its dead client no
    longer reads: closed (a write raises ``BrokenPipeError``) or full (a write blocks). Neither
    may keep the worker alive."""
    code = f"""
import os, sys, threading
from monarch.actor._hosts.worker_exits import exit_when_orphaned
r, w = os.pipe()
os.dup2(w, 2)
if {stderr_state!r} == "closed":
    os.close(r)
else:
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(2, True)
orphaned = threading.Event()
orphaned.set()
exit_when_orphaned(orphaned, "w0")
"""
    done = subprocess.run([sys.executable, "-c", code], timeout=30, check=False)
    assert done.returncode == EXIT_ORPHANED
