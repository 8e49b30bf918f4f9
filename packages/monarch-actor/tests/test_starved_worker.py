"""The first call to a fresh worker whose link was lost while it was starved of CPU.

The flake this guards against: on a heavily loaded machine a freshly spawned worker (its READY
line already printed, so its entry *was* committed at the client) got no CPU for longer than
``mesh_orphan_timeout`` (the QUIC idle timeout, 3 s). The client's QUIC connection to it idled
out, the nameserver link ended and the worker's entry was revoked; the worker, once it ran
again, joined again at once. The first call, sent in between, failed at once with "process
<pid> is unreachable: PID <pid> is not found (NotFound)". Here ``SIGSTOP`` is the starvation,
made deterministic: the call is sent while the worker is stopped and its entry revoked, then
the worker runs again. ``Node.dial`` waits (bounded) for a child that is joining again, so the
call is delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

from monarch.actor import this_host
from monarch.actor._hosts.groups import LocalWorkerGroup
from monarch.actor._mesh.meshes import wait_ready
from monarch.actor._runtime.client import client

sys.path.insert(0, str(Path(__file__).parent))  # workers import liveness_actors by name
from liveness_actors import Sleeper

T = 30.0


async def _until(node: Any, pid: Any, present: bool) -> None:
    """Wait (no polling: on the directory's revisions) until ``pid`` is (not) in ``node``'s
    directory."""
    watch = node.nameserver.revisions
    seen = watch.version
    while (node.nameserver.get(pid) is not None) is not present:
        seen = await watch.wait_change(seen)


def _directory(pid: Any, *, present: bool) -> None:
    runtime = client()
    node = runtime.node_layer.node
    waiting = asyncio.run_coroutine_threadsafe(
        asyncio.wait_for(_until(node, pid, present), T), runtime.loop.loop
    )
    waiting.result(T + 5)


def test_the_first_call_reaches_a_fresh_worker_whose_link_was_lost_while_it_was_starved(
    faults: Any,
) -> None:
    procs = this_host().spawn_procs({"gpus": 1}, name="starved")
    os_pid: int | None = None
    try:
        state = procs._state
        assert state is not None
        assert state.ready is not None
        wait_ready(state.ready)
        group = state.group
        assert isinstance(group, LocalWorkerGroup)
        os_pid = group.popens[0].pid
        pid = group.pids[0]
        os.kill(os_pid, signal.SIGSTOP)  # starved: no CPU at all
        # The client's connection idles out (mesh_orphan_timeout) and the entry is revoked.
        _directory(pid, present=False)
        sleeper: Any = procs.spawn("sleeper", Sleeper)
        call = sleeper.os_pid.call_one()  # dialled while the worker cannot answer
        os.kill(os_pid, signal.SIGCONT)  # it runs again and joins again
        assert call.get(timeout=T) == os_pid
        _directory(pid, present=True)
        assert faults.settled() == []
        procs.stop().get(timeout=T)
    finally:
        if os_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(os_pid, signal.SIGCONT)
