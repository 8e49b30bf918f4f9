"""Lifecycle as Monarch behaves (issue 15, item 10): a client that exits while its processes
start, stops that end in bounded time, normal worker exits, and supervision that fails owners."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import Channel, ProcMesh, SupervisionError, this_host
from monarch.actor._hosts.commands import EXIT_TIMEOUT

HERE = Path(__file__).parent
T = 20.0

sys.path.insert(0, str(HERE))  # workers import lifecycle_actors by name
from lifecycle_actors import (  # noqa: E402
    AsyncOwner,
    Blocker,
    Finalized,
    HangsAtExit,
    NeverReady,
    Plain,
    WatchfulOwner,
    hold,
)
from test_procs_mesh import _eventually_gone, _kill  # noqa: E402


def _run_client(
    tmp_path: Path, body: str, timeout: float = 60.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "client.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\n" + textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


# -- a client that ends while its processes are still starting -------------------------------
def test_a_client_that_exits_right_after_spawn_procs_exits_promptly(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _run_client(
        tmp_path,
        """
        from monarch.actor import this_host

        if __name__ == "__main__":
            procs = this_host().spawn_procs({"gpus": 2})  # returns while the workers start
            print("spawned", flush=True)
        """,
    )  # it hung for good at interpreter shutdown (subprocess.TimeoutExpired here)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "spawned"
    assert time.monotonic() - started < 30.0


# -- ActorMesh.stop() of an actor whose __init__ never returns --------------------------------
def _stuck_init_is_stopped(procs: ProcMesh, key: str) -> None:
    started, running = Channel[int].open(once=True)
    stuck: Any = procs.spawn("stuck", NeverReady, started, key)
    sibling: Any = procs.spawn("sibling", Plain)
    running.recv().get(timeout=T)  # __init__ is running (and will not return)
    started_at = time.monotonic()
    assert stuck.stop().get(timeout=T) is None  # it never completed
    assert time.monotonic() - started_at < 10.0  # bounded by stop_actor_timeout (1 s here)
    assert stuck.initialized.get(timeout=T) is None  # resolves, as after a failing __init__
    with pytest.raises(SupervisionError, match="stopped"):
        stuck.ok.call_one().get(timeout=T)
    assert sibling.ok.call_one().get(timeout=T) == "ok"  # the process lives on


@pytest.fixture
def quick_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``stop_actor_timeout`` of 1 s, here and in the workers spawned meanwhile."""
    monkeypatch.setenv("HYPERACTOR_STOP_ACTOR_TIMEOUT", "1")


def test_stop_completes_when_init_never_returns(
    quick_stop: None, procs: Callable[..., ProcMesh]
) -> None:
    key = uuid.uuid4().hex
    try:
        _stuck_init_is_stopped(procs(gpus=1), key)
    finally:
        hold(key).set()  # the stuck thread (in this process) returns and ends


def test_stop_completes_when_init_never_returns_in_a_worker(
    quick_stop: None, transport_mode: str
) -> None:
    procs = this_host().spawn_procs({"gpus": 1})
    try:
        _stuck_init_is_stopped(procs, uuid.uuid4().hex)
    finally:
        procs.stop().get(timeout=T)


def test_stop_completes_when_an_endpoint_never_returns_and_fails_that_call(
    quick_stop: None, procs: Callable[..., ProcMesh]
) -> None:
    key = uuid.uuid4().hex
    try:
        blocker: Any = procs(gpus=1).spawn("blocker", Blocker)
        started, running = Channel[int].open(once=True)
        pending = blocker.block.call_one(started, key)
        running.recv().get(timeout=T)  # the call is running (and will not return)
        assert blocker.stop().get(timeout=T) is None
        with pytest.raises(SupervisionError, match=r"blocker\.block\(\) failed, .*stopped"):
            pending.get(timeout=T)  # its caller is not left waiting
    finally:
        hold(key).set()


# -- ProcMesh.stop() lets the worker's interpreter finalize -----------------------------------
@pytest.fixture(params=["zygote", "exec"])
def spawn_method(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MONARCH_WORKER_SPAWN_METHOD", request.param)
    return str(request.param)


def test_proc_mesh_stop_runs_the_workers_atexit_handlers_and_module_finalizers(
    spawn_method: str, tmp_path: Path
) -> None:
    log = tmp_path / "exit.log"
    procs = this_host().spawn_procs({"gpus": 2})
    pids: list[int] = []
    try:
        finalized: Any = procs.spawn("finalized", Finalized, str(log))
        pids = finalized.os_pid.call().get(timeout=T).values()
        assert procs.stop().get(timeout=T) is None
        assert _eventually_gone(pids, T)
        lines = sorted(log.read_text().splitlines()) if log.exists() else []
        expected = sorted([f"atexit {pid}" for pid in pids] + [f"__del__ {pid}" for pid in pids])
        assert lines == expected  # os._exit (or a kill) ran neither
    finally:
        _kill(pids)


def test_proc_mesh_stop_kills_a_worker_that_does_not_exit_in_time(spawn_method: str) -> None:
    procs = this_host().spawn_procs({"gpus": 1})
    pids: list[int] = []
    try:
        stuck: Any = procs.spawn("hangs", HangsAtExit)
        pids = stuck.os_pid.call().get(timeout=T).values()
        assert procs.stop().get(timeout=T + EXIT_TIMEOUT) is None  # escalated to a kill
        assert _eventually_gone(pids, T)
    finally:
        _kill(pids)


def test_module_finalizers_run_for_modules_the_worker_imported_at_start(tmp_path: Path) -> None:
    """An exec'd worker imports the client's main script, and with it the actor module, before
    it freezes its start-up objects out of the collector's reach: they are released anyway."""
    log = tmp_path / "exit.log"
    done = _run_client(
        tmp_path,
        f"""
        from monarch.actor import this_host
        from lifecycle_actors import Finalized

        if __name__ == "__main__":
            procs = this_host().spawn_procs({{"gpus": 1}})
            mesh = procs.spawn("finalized", Finalized, {str(log)!r})
            print(mesh.os_pid.call_one().get(timeout=20), flush=True)
            procs.stop().get(timeout=20)
        """,
        env={"MONARCH_WORKER_SPAWN_METHOD": "exec"},
    )
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    assert sorted(log.read_text().splitlines()) == [f"__del__ {pid}", f"atexit {pid}"]


# -- an unhandled supervision event fails the owner, and the call it is handling --------------
@pytest.mark.parametrize("mode", ["false", "raise"])
def test_unhandled_supervision_fails_the_call_in_flight(
    procs: Callable[..., ProcMesh], faults: Any, mode: str
) -> None:
    owner: Any = procs(gpus=1).spawn("owner", AsyncOwner, mode)
    owner.spawn_child.call_one().get(timeout=T)
    reason = "supervise raised on purpose" if mode == "raise" else "child failure"
    # The endpoint awaits for good: the call timed out while the owner lived on.
    with pytest.raises(SupervisionError, match=r"owner\.fail_child_during_call\(\) failed") as info:
        owner.fail_child_during_call.call_one().get(timeout=T)
    assert reason in str(info.value)
    (failure,) = faults.wait_for(1)  # the owner failed: its owner (the client) is told
    assert failure.mesh_name == owner._name.get()
    assert reason in failure.report()
    with pytest.raises(SupervisionError):
        owner.spawn_child.call_one().get(timeout=T)


def test_unhandled_supervision_fails_the_call_in_flight_in_a_worker(
    transport_mode: str, faults: Any
) -> None:
    procs = this_host().spawn_procs({"gpus": 1})
    try:
        owner: Any = procs.spawn("owner", AsyncOwner, "false")
        owner.spawn_child.call_one().get(timeout=T)
        with pytest.raises(SupervisionError, match="child failure"):
            owner.fail_child_during_call.call_one().get(timeout=T)
        faults.wait_for(1)
    finally:
        procs.stop().get(timeout=T)


# -- a failure from a fire-and-forget broadcast reaches the owner's __supervise__ -------------
def test_a_broadcast_failure_reaches_supervise_while_the_owner_awaits(
    procs: Callable[..., ProcMesh], faults: Any
) -> None:
    owner: Any = procs(gpus=1).spawn("owner", WatchfulOwner)
    child = owner.spawn_child.call_one().get(timeout=T)
    # The owner's endpoint awaits its own __supervise__: it never ran while the endpoint was
    # in flight (TimeoutError), only once the owner went back to its mailbox.
    (failure,) = owner.fail_child_and_wait.call_one().get(timeout=T)
    assert "MeshFailure" in failure
    assert child._name.get() in failure  # the event is about the mesh the owner owns
    assert "child failure" in failure
    assert faults.settled() == []  # handled: nothing reaches the client
