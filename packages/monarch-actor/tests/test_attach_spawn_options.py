"""``bootstrap_command`` and numactl ``proc_bind`` keys on attached hosts: the worker daemon
starts each worker with the command and numactl options carried in ``Spawn`` (as the client
starts local ones), and refuses malformed or oversized ones with ``SpawnFailed``.

The daemons are loopback subprocesses (``test_hosts.Daemons``), killed after each test; the
workers' hosts are shut down in ``finally``.
"""

from __future__ import annotations

import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.actor import (
    BootstrapCommand,
    HostMesh,
    Point,
    attach_to_workers,
    default_bootstrap_cmd,
)
from monarch.actor._hosts.attach_protocol import (
    MAX_COMMAND_ARGS,
    MAX_COMMAND_BYTES,
    MAX_COMMAND_ENV,
    SessionDecoder,
    Spawn,
    WorkerCommand,
    encode_message,
    spawn_problem,
)
from monarch.actor._hosts.commands import WORKER_ARGV_ENV

sys.path.insert(0, str(Path(__file__).parent))  # workers import spawn_options_actors by name
from spawn_options_actors import Probe
from test_hosts import Daemons

T = 30.0


@pytest.fixture
def daemons() -> Iterator[Daemons]:
    made = Daemons()
    yield made
    made.close()


def _command(**changes: Any) -> WorkerCommand:
    fields: dict[str, Any] = {
        "program": sys.executable,
        "arg0": None,
        "args": ["-m", "monarch.actor._worker"],
        "env": {"A": "1", "B": None},
        "inherit_env": True,
    }
    fields.update(changes)
    return WorkerCommand(**fields)


# ---------------------------------------------------------------------------------------------
# The daemon's check of a Spawn's options (pure)
# ---------------------------------------------------------------------------------------------
def test_well_formed_options_pass_and_round_trip() -> None:
    request = Spawn(
        7,
        ["a", "b"],
        [_command(), None],
        [["--membind=0", "--physcpubind=0-3,6"], []],
    )
    assert spawn_problem(request) is None
    assert spawn_problem(Spawn(8, ["a"])) is None
    decoder = SessionDecoder()
    decoder.feed(encode_message(request))
    assert decoder.next() == request


def test_a_command_round_trips_through_bootstrap_command() -> None:
    command = BootstrapCommand("/bin/prog", "argv0", ["x"], {"K": "v", "R": None}, False)
    back = WorkerCommand.of(command).bootstrap_command()
    assert repr(back) == repr(command)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (Spawn(1, ["a", "b"], [_command()]), "1 bootstrap commands for 2 workers"),
        (Spawn(1, ["a"], None, [[], []]), "2 numactl bindings for 1 workers"),
        (
            Spawn(1, ["a"], [_command(args=["x"] * (MAX_COMMAND_ARGS + 1))]),
            f"{MAX_COMMAND_ARGS + 1} arguments",
        ),
        (
            Spawn(1, ["a"], [_command(env={f"V{i}": "x" for i in range(MAX_COMMAND_ENV + 1)})]),
            f"{MAX_COMMAND_ENV + 1} environment entries",
        ),
        (
            Spawn(1, ["a"], [_command(args=["x" * (MAX_COMMAND_BYTES + 1)])]),
            f"(at most {MAX_COMMAND_BYTES})",
        ),
        (Spawn(1, ["a"], [_command(program="")]), "an empty program"),
        (Spawn(1, ["a"], [_command(args=["a\0b"])]), "a NUL character"),
        (Spawn(1, ["a"], [_command(env={"A=B": "x"})]), "environment name 'A=B'"),
        (Spawn(1, ["a"], [_command(env={"": "x"})]), "environment name ''"),
        (Spawn(1, ["a"], None, [["--exec=/bin/sh"]]), "not a list of --cpunodebind"),
        (Spawn(1, ["a"], None, [["--membind=0; rm"]]), "not a list of --cpunodebind"),
        (Spawn(1, ["a"], None, [["--membind=0"] * 4]), "not a list of --cpunodebind"),
    ],
)
def test_hostile_spawn_options_are_refused_with_a_reason(request_: Spawn, reason: str) -> None:
    problem = spawn_problem(request_)
    assert problem is not None
    assert reason in problem


@given(
    st.lists(st.text(max_size=20), max_size=12),
    st.dictionaries(st.text(max_size=8), st.none() | st.text(max_size=8), max_size=6),
    st.lists(st.lists(st.text(max_size=24), max_size=5), max_size=3),
)
def test_the_check_never_raises(args: list[str], env: dict[str, str | None], numa: Any) -> None:
    labels = ["w"] * len(numa) if numa else ["w"]
    request = Spawn(1, labels, [_command(args=args, env=env)] * len(labels), numa or None)
    problem = spawn_problem(request)
    assert problem is None or isinstance(problem, str)


# ---------------------------------------------------------------------------------------------
# On attached hosts (daemon subprocesses over loopback)
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_wrapper_bootstrap_command_on_an_attached_host(
    tmp_path: Path, daemons: Daemons, faults: Any
) -> None:
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text('#!/bin/sh\nexport M3_WRAPPED="by the wrapper"\nexec "$M3_PYTHON" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    base = default_bootstrap_cmd()
    command = BootstrapCommand(
        str(wrapper), None, base.args, {"M3_PYTHON": sys.executable, "M3_FROM_ENV": "env"}
    )
    hosts = attach_to_workers(workers=[daemons.start().address])
    try:
        procs = hosts.spawn_procs({"gpus": 1}, bootstrap_command=command)
        assert procs.initialized.get(timeout=T) is True
        probe: Any = procs.spawn("probe", Probe)
        assert probe.env.call_one("M3_WRAPPED").get(timeout=T) == "by the wrapper"
        assert probe.env.call_one("M3_FROM_ENV").get(timeout=T) == "env"
        assert probe.env.call_one(WORKER_ARGV_ENV).get(timeout=T) == "unset"
    finally:
        hosts.shutdown().get(timeout=T)
    assert faults.failures == []


@pytest.mark.slow
def test_a_per_point_bootstrap_command_on_attached_hosts(daemons: Daemons) -> None:
    def per_point(point: Point) -> BootstrapCommand:
        return default_bootstrap_cmd().with_env({"M3_RANK": f"{point['hosts']}.{point['gpus']}"})

    hosts = attach_to_workers(workers=[daemons.start().address, daemons.start().address])
    try:
        procs = hosts.spawn_procs({"gpus": 2}, bootstrap_command=per_point)
        probe: Any = procs.spawn("probe", Probe)
        values = probe.env.call("M3_RANK").get(timeout=T).values()
        assert values == ["0.0", "0.1", "1.0", "1.1"]
    finally:
        hosts.shutdown().get(timeout=T)


@pytest.mark.slow
def test_a_program_the_host_cannot_run_fails_initialized(daemons: Daemons) -> None:
    command = BootstrapCommand("/nonexistent/m3-program", None, [], {})
    hosts = attach_to_workers(workers=[daemons.start().address])
    try:
        procs = hosts.spawn_procs({"gpus": 1}, bootstrap_command=command)
        with pytest.raises(RuntimeError, match=r"could not be started on host .*m3-program"):
            procs.initialized.get(timeout=T)
        again = hosts.spawn_procs({"gpus": 1})  # the daemon is still serving
        assert again.initialized.get(timeout=T) is True
    finally:
        hosts.shutdown().get(timeout=T)


@pytest.mark.slow
def test_numactl_keys_on_an_attached_host(daemons: Daemons) -> None:
    hosts: HostMesh = attach_to_workers(workers=[daemons.start().address])
    try:
        procs = hosts.spawn_procs({"gpus": 1}, proc_bind=[{"membind": "0"}])
        if shutil.which("numactl") is None:  # the daemon runs on this host
            with pytest.raises(RuntimeError, match=r"proc_bind membind needs numactl.* on host"):
                procs.initialized.get(timeout=T)
        else:
            probe: Any = procs.spawn("probe", Probe)
            assert probe.os_pid.call_one().get(timeout=T) > 0
    finally:
        hosts.shutdown().get(timeout=T)
