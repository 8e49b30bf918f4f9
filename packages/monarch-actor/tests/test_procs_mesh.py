"""Proc meshes of real worker processes (``this_host().spawn_procs``) over Chrysalis Nodes.

Every test kills the workers it started in ``finally`` (their OS pids come from an endpoint).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import ActorError, Channel, ProcMesh, SupervisionError, this_host
from monarch.actor._hosts.groups import LocalWorkerGroup

sys.path.insert(0, str(Path(__file__).parent))  # workers import procs_actors by name
import contextlib

from procs_actors import Counter, LoggedParent, Supervisor

T = 20.0


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # an exited process not reaped yet (a zombie) counts as gone
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return True
    except (OSError, IndexError):
        return True
    try:  # a zombie of ours: reap it
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def _eventually_gone(pids: list[int], timeout: float) -> bool:
    """True once every process in ``pids`` has exited (a zombie counts), False after
    ``timeout`` seconds. The exit is the event: a pidfd becomes readable when its process
    exits, so this waits in ``select`` instead of polling. Where ``pidfd_open`` is missing
    (not Linux, kernel before 5.3) it falls back to a bounded 0.1 s poll of ``_gone``."""
    deadline = time.monotonic() + timeout
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                continue  # reaped already
            except (AttributeError, OSError):
                return _poll_gone(pids, deadline)
        pending = set(fds)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select(list(pending), [], [], left)
            pending.difference_update(ready)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def _poll_gone(pids: list[int], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def mesh(transport_mode: str) -> Iterator[tuple[ProcMesh, Any, list[int]]]:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    pids: list[int] = []
    try:
        counters: Any = procs.spawn("counters", Counter, 10)
        pids = counters.os_pid.call().get(timeout=T).values()
        yield procs, counters, pids
        procs.stop().get(timeout=T)
    finally:
        _kill(pids)


def test_workers_are_separate_os_processes(mesh: tuple[ProcMesh, Any, list[int]]) -> None:
    _, _, pids = mesh
    assert len(set(pids)) == 2
    assert os.getpid() not in pids


def test_call_broadcast_call_one_and_slicing(mesh: tuple[ProcMesh, Any, list[int]]) -> None:
    _, counters, _ = mesh
    counters.incr.broadcast(5)  # ordered before the next call from this thread
    assert counters.get.call().get(timeout=T).values() == [15, 16]
    assert counters.slice(gpus=1).get.call_one().get(timeout=T) == 16
    counters.slice(gpus=0).incr.broadcast(1)
    assert counters.get.call().get(timeout=T).values() == [16, 16]
    counters.slice(gpus=0).incr.broadcast(-1)


def test_choose_reaches_one_worker(mesh: tuple[ProcMesh, Any, list[int]]) -> None:
    _, counters, pids = mesh
    assert counters.os_pid.choose().get(timeout=T) in pids


def test_large_buffers_cross_processes(mesh: tuple[ProcMesh, Any, list[int]]) -> None:
    _, counters, _ = mesh
    data = os.urandom(3 * 1024 * 1024)
    assert counters.slice(gpus=1).echo.call_one(data).get(timeout=T) == data


def test_actor_error_reaches_the_caller_and_the_actor_lives_on(
    mesh: tuple[ProcMesh, Any, list[int]],
) -> None:
    _, counters, _ = mesh
    with pytest.raises(ActorError, match="boom in a worker"):
        counters.slice(gpus=0).fail.call_one().get(timeout=T)
    assert counters.slice(gpus=0).get.call_one().get(timeout=T) == 15


def test_stop_ends_every_worker_cleanly(transport_mode: str) -> None:
    procs = this_host().spawn_procs({"gpus": 2})
    pids: list[int] = []
    try:
        assert procs._state is not None
        group = procs._state.group
        assert isinstance(group, LocalWorkerGroup)
        counters: Any = procs.spawn("c", Counter, 0)
        pids = counters.os_pid.call().get(timeout=T).values()
        procs.stop().get(timeout=T)
        assert [p.wait(timeout=T) for p in group.popens] == [0, 0]
        with pytest.raises(SupervisionError):
            counters.get.call().get(timeout=T)
    finally:
        _kill(pids)


def test_killed_worker_makes_later_calls_to_its_rank_fail(transport_mode: str, faults: Any) -> None:
    procs = this_host().spawn_procs({"gpus": 2})
    pids: list[int] = []
    try:
        counters: Any = procs.spawn("c", Counter, 0)
        pids = counters.os_pid.call().get(timeout=T).values()
        os.kill(pids[1], signal.SIGKILL)
        # The reaper marks the rank unreachable with its exit status, then reports the death
        # to the owner: the client's fault hook. Once the hook has it, calls name the exit
        # (earlier ones may name the broken connection, which the transport can notice first).
        (death,) = faults.wait_for(1, timeout=T)
        assert "crashed_ranks=[1]" in str(death)
        with pytest.raises(SupervisionError, match=r"c\.get\(\) failed.*SIGKILL"):
            counters.slice(gpus=1).get.call_one().get(timeout=T)
        assert counters.slice(gpus=0).get.call_one().get(timeout=T) == 0  # rank 0 lives
        procs.stop().get(timeout=T)  # still succeeds after a crash
    finally:
        _kill(pids)


def test_workers_exit_when_the_client_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from monarch.actor import this_host
        from procs_actors import Counter
        procs = this_host().spawn_procs({{"gpus": 2}})
        pids = procs.spawn("c", Counter, 0).os_pid.call().get(timeout=20).values()
        print(" ".join(map(str, pids)), flush=True)
        time.sleep(60)
        """
    )
    env = dict(os.environ, MONARCH_MESH_ORPHAN_TIMEOUT="1.0", TMPDIR=str(tmp_path))
    client = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True
    )
    pids: list[int] = []
    try:
        assert client.stdout is not None
        pids = [int(p) for p in client.stdout.readline().split()]
        assert len(pids) == 2
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=T)
        assert _eventually_gone(pids, 10.0), "workers outlived their killed client"
    finally:
        client.kill()
        client.wait(timeout=T)
        if client.stdout is not None:
            client.stdout.close()
        _kill(pids)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_process_death_reaches_the_owning_actor_in_another_process(
    transport_mode: str, faults: Any
) -> None:
    owners = this_host().spawn_procs({"gpus": 1}, name="owners")
    workers = this_host().spawn_procs({"gpus": 2}, name="workers")
    pids: list[int] = []
    try:
        supervisor: Any = owners.spawn("supervisor", Supervisor)
        pids = [supervisor.os_pid.call_one().get(timeout=T)]
        child_pids = supervisor.spawn_child.call_one(workers).get(timeout=T)
        pids += child_pids
        watcher, told = Channel[str].open()
        supervisor.watch.call_one(watcher).get(timeout=T)
        os.kill(child_pids[1], signal.SIGKILL)
        told.recv().get(timeout=T)  # the owner's __supervise__ ran
        seen = supervisor.seen.call_one().get(timeout=T)
        assert len(seen) == 1, "the owner was not told about the dead process once"
        assert "MeshFailure" in seen[0]
        assert "crashed_ranks=[1]" in seen[0]
        assert "SIGKILL" in seen[0]
        assert faults.settled() == []  # handled by the owner: nothing reaches the client hook
        owners.stop().get(timeout=T)
        workers.stop().get(timeout=T)
    finally:
        _kill(pids)


def test_unhandled_process_death_reaches_the_client_hook(transport_mode: str, faults: Any) -> None:
    procs = this_host().spawn_procs({"gpus": 2})
    pids: list[int] = []
    try:
        counters: Any = procs.spawn("c", Counter, 0)
        pids = counters.os_pid.call().get(timeout=T).values()
        os.kill(pids[0], signal.SIGKILL)
        (failure,) = faults.wait_for(1, timeout=T)
        assert failure.mesh_name == counters._name.get()
        assert "crashed_ranks=[0]" in str(failure)
        assert "procs_actors.Counter" in str(failure)
        with pytest.raises(SupervisionError, match=r"c\.get\(\) failed"):
            counters.slice(gpus=0).get.call_one().get(timeout=T)
        procs.stop().get(timeout=T)
        assert len(faults.settled()) == 1  # at most once per rank, and a stop is no failure
    finally:
        _kill(pids)


def test_stopping_a_parent_stops_its_children_on_other_processes_first(
    transport_mode: str, tmp_path: Path
) -> None:
    log = tmp_path / "cleanup.log"
    parents_procs = this_host().spawn_procs({"gpus": 1}, name="parents")
    children_procs = this_host().spawn_procs({"gpus": 1}, name="children")
    pids: list[int] = []
    try:
        parent: Any = parents_procs.spawn("parent", LoggedParent, str(log), "parent")
        pids = [parent.os_pid.call_one().get(timeout=T)]
        pids += parent.spawn_child.call_one(children_procs).get(timeout=T)
        parent.stop().get(timeout=T)
        assert _lines(log) == ["child cleanup", "parent cleanup"]  # depth first
        parents_procs.stop().get(timeout=T)
        children_procs.stop().get(timeout=T)
    finally:
        _kill(pids)


def test_children_do_not_outlive_a_parent_killed_with_sigkill(
    transport_mode: str, tmp_path: Path, faults: Any
) -> None:
    log = tmp_path / "cleanup.log"
    parents_procs = this_host().spawn_procs({"gpus": 1}, name="parents")
    children_procs = this_host().spawn_procs({"gpus": 1}, name="children")
    pids: list[int] = []
    try:
        parent: Any = parents_procs.spawn("parent", LoggedParent, str(log), "parent")
        pids = [parent.os_pid.call_one().get(timeout=T)]
        pids += parent.spawn_child.call_one(children_procs).get(timeout=T)
        os.kill(pids[0], signal.SIGKILL)
        assert _eventually_gone(pids[:1], T)
        # Its death notice reached the child's process (stopping the child) and the client
        # (a fault: the parent's owner is the client): both handled once the flush returns.
        assert len(faults.settled()) == 1
        assert _lines(log) == ["child cleanup"], "the child outlived its killed parent"
        parents_procs.stop().get(timeout=T)
        children_procs.stop().get(timeout=T)
    finally:
        _kill(pids)


def test_a_call_waiting_on_a_killed_worker_fails_naming_the_actor_and_endpoint(
    transport_mode: str, faults: Any
) -> None:
    procs = this_host().spawn_procs({"gpus": 1})
    pids: list[int] = []
    try:
        counters: Any = procs.spawn("sleepy", Counter, 0)
        pids = counters.os_pid.call().get(timeout=T).values()
        started, running = Channel[int].open(once=True)
        pending = counters.nap_after_telling.call_one(started, 60.0)
        assert running.recv().get(timeout=T) == pids[0]  # the call is running in the worker
        os.kill(pids[0], signal.SIGKILL)
        # The reason is whichever the caller's process noticed first: the worker's exit
        # (SIGKILL) or its broken stream; the actor and endpoint are always named.
        named = r"sleepy\.nap_after_telling\(\) failed, .*sleepy-"
        with pytest.raises(SupervisionError, match=named):
            pending.get(timeout=T)
        faults.wait_for(1, timeout=T)
        procs.stop().get(timeout=T)
    finally:
        _kill(pids)


def test_an_unhandled_child_process_death_fails_the_parent_up_to_the_client(
    tmp_path: Path, faults: Any
) -> None:
    log = tmp_path / "cleanup.log"
    parents_procs = this_host().spawn_procs({"gpus": 1}, name="parents")
    children_procs = this_host().spawn_procs({"gpus": 1}, name="children")
    pids: list[int] = []
    try:
        parent: Any = parents_procs.spawn("parent", LoggedParent, str(log), "parent")
        pids = [parent.os_pid.call_one().get(timeout=T)]
        child_pids = parent.spawn_child.call_one(children_procs).get(timeout=T)
        pids += child_pids
        os.kill(child_pids[0], signal.SIGKILL)
        (failure,) = faults.wait_for(1, timeout=T)  # the parent has no __supervise__
        assert failure.mesh_name == parent._name.get()
        assert "was not handled" in failure.report()
        assert "SIGKILL" in failure.report()  # the causal chain reaches the process death
        assert "parent cleanup" in _lines(log)
        with pytest.raises(SupervisionError, match=r"parent\.get\(\) failed"):
            parent.get.call_one().get(timeout=T)
        parents_procs.stop().get(timeout=T)
        children_procs.stop().get(timeout=T)
    finally:
        _kill(pids)
