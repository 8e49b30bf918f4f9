"""``spawn_procs`` returns at once, and its options: ``bootstrap``, ``proc_bind``,
``bootstrap_command`` (reference behaviour catalogue entries 40, 45 and 46).

Every test that starts processes stops them in ``finally``; the processes of a spawn that
failed are killed by the spawning thread itself (checked through their OS pids where known).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from monarch.actor import (
    ActorError,
    BootstrapCommand,
    Point,
    ProcMesh,
    default_bootstrap_cmd,
    this_host,
)
from monarch.actor._hosts.commands import WORKER_ARGV_ENV
from monarch.actor._hosts.groups import LocalWorkerGroup
from monarch.actor._hosts.worker import _argv_from_environment
from monarch.actor._mesh import meshes

sys.path.insert(0, str(Path(__file__).parent))  # workers import spawn_options_actors by name
from spawn_options_actors import (
    NestedOwner,
    Probe,
    exit_bootstrap,
    fail_bootstrap,
    set_marker,
    set_marker_async,
    wait_for_file,
)

T = 30.0


@pytest.fixture
def stopped() -> Iterator[list[ProcMesh]]:
    """Proc meshes to stop at the end of the test, whatever happened."""
    meshes: list[ProcMesh] = []
    yield meshes
    for mesh in meshes:
        mesh.stop().get(timeout=T)


# -- checks made before anything starts (no processes) -----------------------------------------
def test_proc_bind_length_must_equal_procs_per_host() -> None:
    with pytest.raises(
        ValueError, match=r"^proc_bind length \(1\) must equal procs_per_host \(2\)$"
    ):
        this_host().spawn_procs({"gpus": 2}, proc_bind=[{"cpus": "0"}])
    with pytest.raises(
        ValueError, match=r"^proc_bind length \(2\) must equal procs_per_host \(1\)$"
    ):
        this_host().spawn_procs(proc_bind=[{"cpus": "0"}, {}])
    with pytest.raises(
        ValueError, match=r"^proc_bind length \(0\) must equal procs_per_host \(6\)$"
    ):
        this_host().spawn_procs({"a": 2, "b": 3}, proc_bind=[])


def test_proc_bind_entries_are_checked() -> None:
    host = this_host()
    with pytest.raises(ValueError, match="unknown proc_bind key 'cpu'"):
        host.spawn_procs(proc_bind=[{"cpu": "0"}])
    with pytest.raises(ValueError, match="is not a CPU list"):
        host.spawn_procs(proc_bind=[{"cpus": "zero"}])
    with pytest.raises(ValueError, match="bad range"):
        host.spawn_procs(proc_bind=[{"cpus": "3-1"}])
    with pytest.raises(TypeError, match="must be a dict"):
        host.spawn_procs(proc_bind=["0"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list of dicts"):
        host.spawn_procs(proc_bind={"cpus": "0"})  # type: ignore[arg-type]
    if shutil.which("numactl") is None:
        with pytest.raises(RuntimeError, match="proc_bind membind needs numactl"):
            host.spawn_procs(proc_bind=[{"membind": "0"}])


def test_bootstrap_arguments_are_checked() -> None:
    host = this_host()
    with pytest.raises(TypeError, match="bootstrap must be a zero-argument callable"):
        host.spawn_procs(bootstrap="not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bootstrap_command must be a BootstrapCommand"):
        host.spawn_procs(bootstrap_command="python")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"bootstrap_command\(\{'gpus': 0/1\}\) returned 'x'"):
        host.spawn_procs({"gpus": 1}, bootstrap_command=lambda point: "x")  # type: ignore[arg-type,return-value]


def test_default_bootstrap_cmd_is_our_worker_entry_point() -> None:
    command = default_bootstrap_cmd()
    assert command.program == sys.executable
    assert command.arg0 is None
    assert command.args == ["-m", "monarch.actor._worker"]
    assert command.env == {}
    assert command.inherit_env is True
    changed = command.with_env({"A": "1", "PATH": None})
    assert changed.env == {"A": "1", "PATH": None}
    assert command.env == {}  # with_env makes a new command
    changed.env["B"] = "2"  # the property is a copy, as in the reference
    assert "B" not in changed.env
    assert changed.environment({"PATH": "/bin", "HOME": "/h"}) == {"HOME": "/h", "A": "1"}
    changed.inherit_env = False
    assert changed.environment({"HOME": "/h"}) == {"A": "1"}
    copy = pickle.loads(pickle.dumps(changed))
    assert (copy.program, copy.args, copy.env, copy.inherit_env) == (
        sys.executable,
        ["-m", "monarch.actor._worker"],
        {"A": "1", "PATH": None},
        False,
    )
    assert "monarch.actor._worker" in repr(command)
    with pytest.raises(TypeError):
        BootstrapCommand("", None, [], {})
    with pytest.raises(TypeError):
        BootstrapCommand("/bin/sh", None, "-c", {})
    with pytest.raises(TypeError):
        BootstrapCommand("/bin/sh", None, [], {"A": 1})  # type: ignore[dict-item]


def test_worker_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKER_ARGV_ENV, '["--parent", "udp://127.0.0.1:1"]')
    assert _argv_from_environment() == ["--parent", "udp://127.0.0.1:1"]
    assert WORKER_ARGV_ENV not in os.environ  # not inherited by what the worker starts
    monkeypatch.setenv(WORKER_ARGV_ENV, "{not json")
    with pytest.raises(SystemExit, match="is not JSON"):
        _argv_from_environment()
    monkeypatch.setenv(WORKER_ARGV_ENV, '["ok", 3]')
    with pytest.raises(SystemExit, match="JSON list of strings"):
        _argv_from_environment()


# -- processes -------------------------------------------------------------------------------
def test_spawn_procs_returns_before_the_workers_are_up(
    tmp_path: Path, stopped: list[ProcMesh]
) -> None:
    gate = tmp_path / "gate"
    procs = this_host().spawn_procs({"gpus": 2}, bootstrap=partial(wait_for_file, str(gate)))
    stopped.append(procs)
    # The bootstrap cannot have finished: the file it waits for does not exist yet.
    assert not procs.initialized.done()
    probe: Any = procs.spawn("probe", Probe)  # does not wait either
    sliced = procs.slice(gpus=1)  # nor does slicing
    assert not procs.initialized.done()
    gate.touch()
    assert procs.initialized.get(timeout=T) is True
    assert probe.env.call("M1_BOOTSTRAP").get(timeout=T).values() == ["released"] * 2
    late: Any = sliced.spawn("late", Probe)
    assert late.env.call_one("M1_BOOTSTRAP").get(timeout=T) == "released"


def test_calls_made_before_the_workers_are_up_wait_for_them(
    tmp_path: Path, stopped: list[ProcMesh], monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = tmp_path / "gate"
    procs = this_host().spawn_procs({"gpus": 1}, bootstrap=partial(wait_for_file, str(gate)))
    stopped.append(procs)
    probe: Any = procs.spawn("probe", Probe)
    waits: list[bool] = []
    wait_ready = meshes.wait_ready

    def open_gate_then_wait(ready: Any) -> Any:
        # the call below is waiting for the processes, which are held in their bootstrap
        # until the gate opens: open it now, from inside the wait
        waits.append(ready.done())
        gate.touch()
        return wait_ready(ready)

    monkeypatch.setattr(meshes, "wait_ready", open_gate_then_wait)
    # The call waits (bounded) until the processes are up and the actor exists.
    assert probe.env.call_one("M1_BOOTSTRAP").get(timeout=T) == "released"
    assert waits[:1] == [False]  # it did wait, for processes not up yet


@pytest.mark.parametrize("bootstrap", [set_marker, set_marker_async], ids=["sync", "async"])
def test_bootstrap_runs_before_any_user_actor(bootstrap: Any, stopped: list[ProcMesh]) -> None:
    procs = this_host().spawn_procs({"gpus": 2}, bootstrap=bootstrap)
    stopped.append(procs)
    probe: Any = procs.spawn("probe", Probe)
    expected = "async" if bootstrap is set_marker_async else "sync"
    assert probe.env.call("M1_BOOTSTRAP").get(timeout=T).values() == [expected] * 2


def test_failing_bootstrap_fails_initialized_and_the_first_use(faults: Any) -> None:
    procs = this_host().spawn_procs({"gpus": 2}, bootstrap=fail_bootstrap)
    probe: Any = procs.spawn("probe", Probe)
    with pytest.raises(ActorError, match="bootstrap went wrong"):
        procs.initialized.get(timeout=T)

    async def awaited() -> bool:
        return await procs.initialized

    with pytest.raises(ActorError, match="bootstrap went wrong"):
        asyncio.run(awaited())  # the reference's spelling
    assert procs._state is not None
    group = procs._state.group
    assert isinstance(group, LocalWorkerGroup)
    assert [p.poll() for p in group.popens] == [-signal.SIGKILL] * 2  # ended by the spawn
    with pytest.raises(ActorError, match="bootstrap went wrong"):
        probe.initialized.get(timeout=T)
    with pytest.raises(ActorError, match="bootstrap went wrong"):
        probe.slice(gpus=0).env.call_one("M1_BOOTSTRAP")
    late: Any = procs.spawn("late", Probe)
    with pytest.raises(ActorError, match="bootstrap went wrong"):
        late.env.call("M1_BOOTSTRAP")
    assert procs.stop().get(timeout=T) is None  # nothing left to stop: the spawn killed them
    assert probe.stop().get(timeout=T) is None
    assert faults.settled() == []  # the killed processes are no supervision failure


def test_a_worker_that_cannot_start_fails_initialized_and_the_first_use(faults: Any) -> None:
    command = BootstrapCommand("/bin/sh", None, ["-c", "exit 3"], {})
    procs = this_host().spawn_procs({"gpus": 1}, bootstrap_command=command)
    probe: Any = procs.spawn("probe", Probe)
    started = r"worker process procs\{'gpus': 0/1\} exited with status 3"
    with pytest.raises(RuntimeError, match=started):
        procs.initialized.get(timeout=T)
    with pytest.raises(RuntimeError, match="exited with status 3"):
        probe.os_pid.call_one()
    procs.stop().get(timeout=T)
    assert faults.settled() == []


def test_stop_while_the_workers_start(tmp_path: Path, faults: Any) -> None:
    gate = tmp_path / "gate"
    procs = this_host().spawn_procs({"gpus": 1}, bootstrap=partial(wait_for_file, str(gate)))
    probe: Any = procs.spawn("probe", Probe)
    stopping = procs.stop()
    assert not stopping.done()
    gate.touch()
    assert stopping.get(timeout=T) is None
    assert procs.initialized.get(timeout=T) is True
    with pytest.raises(RuntimeError, match="already been stopped"):
        probe.initialized.get(timeout=T)
    assert faults.settled() == []


def test_host_kill_while_the_workers_start(tmp_path: Path, faults: Any) -> None:
    host = this_host()
    procs = host.spawn_procs({"gpus": 2}, bootstrap=partial(wait_for_file, str(tmp_path / "x")))
    assert procs._state is not None
    group = procs._state.group
    assert isinstance(group, LocalWorkerGroup)
    host.kill().get(timeout=T)
    with pytest.raises(RuntimeError):
        procs.initialized.get(timeout=T)
    assert all(p.poll() is not None for p in group.popens)  # none outlived the kill
    assert faults.settled() == []  # a kill by the owner is no failure


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs this process may use",
)
def test_proc_bind_cpus_binds_each_process(stopped: list[ProcMesh]) -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    procs = this_host().spawn_procs({"gpus": 2}, proc_bind=[{"cpus": str(first)}, {"cpus": second}])
    stopped.append(procs)
    probe: Any = procs.spawn("probe", Probe)
    assert probe.cpus.call().get(timeout=T).values() == [[first], [second]]
    assert sorted(os.sched_getaffinity(0))[:2] == [first, second]  # the client is untouched


def test_bootstrap_command_runs_a_wrapper_that_execs_the_worker(
    tmp_path: Path, stopped: list[ProcMesh]
) -> None:
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text('#!/bin/sh\nexport M1_WRAPPED="by the wrapper"\nexec "$M1_PYTHON" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    base = default_bootstrap_cmd()
    command = BootstrapCommand(
        str(wrapper), None, base.args, {"M1_PYTHON": sys.executable, "M1_FROM_ENV": "env"}
    )
    procs = this_host().spawn_procs({"gpus": 1}, bootstrap_command=command)
    stopped.append(procs)
    probe: Any = procs.spawn("probe", Probe)
    assert probe.env.call_one("M1_WRAPPED").get(timeout=T) == "by the wrapper"
    assert probe.env.call_one("M1_FROM_ENV").get(timeout=T) == "env"
    assert probe.env.call_one(WORKER_ARGV_ENV).get(timeout=T) == "unset"
    assert probe.os_pid.call_one().get(timeout=T) != os.getpid()


def test_bootstrap_command_per_point(stopped: list[ProcMesh]) -> None:
    def per_point(point: Point) -> BootstrapCommand:
        return default_bootstrap_cmd().with_env({"M1_RANK": f"rank {point['gpus']}"})

    procs = this_host().spawn_procs({"gpus": 2}, bootstrap_command=per_point)
    stopped.append(procs)
    probe: Any = procs.spawn("probe", Probe)
    assert probe.env.call("M1_RANK").get(timeout=T).values() == ["rank 0", "rank 1"]


def test_spawn_procs_inside_an_actor_returns_at_once_and_runs_the_bootstrap(
    stopped: list[ProcMesh],
) -> None:
    procs = this_host().spawn_procs({"gpus": 1})
    stopped.append(procs)
    owner: Any = procs.spawn("owner", NestedOwner)
    returned_before_ready, value = owner.spawn_with_bootstrap.call_one().get(timeout=2 * T)
    assert returned_before_ready
    assert value == "sync"
    assert "bootstrap went wrong" in owner.spawn_failing.call_one().get(timeout=2 * T)


def test_shutdown_context_stops_started_and_starting_meshes_as_this_client(
    tmp_path: Path,
) -> None:
    """Review fix: ``shutdown_context`` stopped the root's meshes from its own thread, where no
    actor context is set, so ``current_sender`` bootstrapped a fresh client (the old one was
    already unpublished): the STOP_PROC acknowledgements went to that one and the stop waited
    out its whole timeout. A mesh still starting is stopped from a thread that copies the
    shutdown thread's context, so it must be the old root's too."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import importlib
        from monarch.actor import shutdown_context, this_host
        from spawn_options_actors import Probe
        up = this_host().spawn_procs({{"gpus": 1}})
        print(up.spawn("p", Probe).os_pid.call_one().get(timeout=30), flush=True)
        starting = this_host().spawn_procs({{"gpus": 1}})
        shutdown_context().get(timeout=60)
        runtime = importlib.import_module("monarch.actor._runtime.client")
        print("fresh client" if runtime._client is not None else "no client", flush=True)
        """
    )
    env = dict(os.environ, TMPDIR=str(tmp_path))
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, env=env, text=True, timeout=90
    )
    lines = run.stdout.split()
    with contextlib.suppress(ValueError, IndexError, ProcessLookupError):
        os.kill(int(lines[0]), signal.SIGKILL)
    assert run.returncode == 0, run.stderr
    assert lines[-1] == "client", run.stdout  # the last word of "no client"
    assert lines[-2] == "no", run.stdout
    assert "did not stop within" not in run.stderr, run.stderr


def test_a_spawn_racing_a_client_shutdown_starts_no_process() -> None:
    """Review fix: ``spawn_procs`` now starts its processes on a thread of its own, so a client
    shutdown can come between the node check (``ensure_started``) and the group's registration
    in ``layer.groups``. The shutdown had swapped that list out (killing what it held): a group
    registered after it was never killed, and its processes started anyway."""
    from types import SimpleNamespace

    from monarch.actor._base.shape import Extent
    from monarch.actor._hosts.spawn import start_group

    started: list[bool] = []
    layer = SimpleNamespace(_lock=threading.Lock(), closed=False, groups=[])

    def ensure_started(client: Any) -> tuple[str, str, Path]:
        layer.closed = True  # the shutdown runs right after the node check
        return "udp://127.0.0.1:1", "00" * 16, Path("/nonexistent")

    layer.ensure_started = ensure_started
    group = SimpleNamespace(start=lambda *args, **kwargs: started.append(True))
    with pytest.raises(RuntimeError, match="shut down"):
        start_group(
            SimpleNamespace(node_layer=layer),  # type: ignore[arg-type]
            None,
            Extent(["gpus"], [1]),
            Extent(["gpus"], [1]),
            "procs",
            group=group,  # type: ignore[arg-type]
        )
    assert started == []
    assert layer.groups == []


def test_a_bootstrap_that_exits_fails_initialized_and_is_no_fault(faults: Any) -> None:
    """Review fix: a ``bootstrap`` ending in ``sys.exit`` (a ``BaseException``) failed the setup
    actor itself, so ``initialized`` raised ``SupervisionError`` and the failure of that actor
    reached the owner, here the client's ``unhandled_fault_hook`` (by default: exit)."""
    procs = this_host().spawn_procs({"gpus": 1}, bootstrap=exit_bootstrap)
    with pytest.raises(ActorError, match="SystemExit"):
        procs.initialized.get(timeout=T)
    procs.stop().get(timeout=T)
    assert faults.settled() == []
