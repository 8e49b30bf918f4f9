"""Hosts started separately (``run_worker_loop_forever``) attached over UDP on loopback, and the
host-mesh lifecycle (stop, shutdown, kill) for attached and local hosts.

Each test starts its worker daemons as subprocesses (``python -m monarch.actor._attach``) with
the client's cluster CA directory and kills every process it started in ``finally``.
"""

from __future__ import annotations

import os
import re
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

from monarch.actor import (
    HostMesh,
    SupervisionError,
    attach_to_workers,
    this_host,
)
from monarch.actor._runtime import telemetry as tm
from monarch.actor._runtime.client import client

sys.path.insert(0, str(Path(__file__).parent))  # workers import procs_actors by name
from procs_actors import Counter, Where
from test_procs_mesh import _eventually_gone, _kill

pytestmark = pytest.mark.slow
T = 20.0


class Daemon:
    """A worker loop subprocess on loopback; ``address`` is what it printed."""

    def __init__(self, ca_dir: Path, address: str = "udp://127.0.0.1:0") -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        command = [sys.executable, "-m", "monarch.actor._attach", "--address", address,
                   "--ca", str(ca_dir)]  # fmt: skip
        self.popen = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)
        assert self.popen.stdout is not None
        ready, _, _ = select.select([self.popen.stdout], [], [], 30)
        self.address = self.popen.stdout.readline().decode().strip() if ready else ""
        assert self.address.startswith("udp://127.0.0.1:"), "the worker loop did not start"

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(T)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


class Daemons:
    """Starts worker loops with the client's cluster CA; ``close`` kills them all."""

    def __init__(self) -> None:
        ca_dir = client().node_layer.cluster_ca_dir
        assert ca_dir is not None
        self.ca_dir = ca_dir
        self.made: list[Daemon] = []

    def start(self) -> Daemon:
        daemon = Daemon(self.ca_dir)
        self.made.append(daemon)
        return daemon

    def close(self) -> None:
        for daemon in self.made:
            daemon.close()


@pytest.fixture
def daemons() -> Iterator[Daemons]:
    made = Daemons()
    yield made
    made.close()


def _pids(mesh: Any) -> list[int]:
    return [p for p, _ in mesh.place.call().get(timeout=T).values()]


def test_attach_spawn_call_stop_respawn_and_shutdown(
    transport_mode: str, daemons: Daemons, faults: Any
) -> None:
    one, two = daemons.start(), daemons.start()
    pids: list[int] = []
    try:
        hosts = attach_to_workers(workers=[one.address, two.address], name="pair")
        assert isinstance(hosts, HostMesh)
        assert hosts.extent.labels == ["hosts"]
        assert hosts.extent.sizes == [2]
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        assert procs.extent.labels == ["hosts", "gpus"]
        assert procs.extent.sizes == [2, 2]
        where: Any = procs.spawn("where", Where)
        pids = _pids(where)
        assert len(set(pids)) == 4
        assert os.getpid() not in pids
        assert where.add.call(1, 2).get(timeout=T).values() == [3, 3, 3, 3]
        assert where.slice(hosts=1, gpus=0).add.call_one(2, 2).get(timeout=T) == 4
        counters: Any = procs.spawn("counters", Counter, 10)
        counters.incr.broadcast(1)
        assert counters.get.call().get(timeout=T).values() == [11, 12, 11, 12]

        hosts.stop().get(timeout=T)  # the procs end; the handle and the daemons stay
        assert _eventually_gone(pids, 10.0)
        with pytest.raises(SupervisionError):
            where.add.call(1, 1).get(timeout=T)
        again = hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 1})
        pids = _pids(again.spawn("where", Where))
        assert len(pids) == 1

        hosts.shutdown().get(timeout=T)  # procs stopped, then the worker loops end
        assert one.popen.wait(T) == 0
        assert two.popen.wait(T) == 0
        assert _eventually_gone(pids, 10.0)
        with pytest.raises(RuntimeError, match="HostMesh has already been shut down"):
            hosts.spawn_procs(per_host={"gpus": 1})
        with pytest.raises(RuntimeError, match="reference instead of owned"):
            hosts.slice(hosts=0).stop()
        assert faults.failures == []  # stops and shutdowns are no failures
    finally:
        _kill(pids)


def test_killed_remote_worker_reaches_the_owner_and_fails_calls(
    transport_mode: str, daemons: Daemons, faults: Any
) -> None:
    daemon = daemons.start()
    pids: list[int] = []
    try:
        hosts = attach_to_workers(workers=[daemon.address])
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        counters: Any = procs.spawn("counters", Counter, 0)
        pids = counters.os_pid.call().get(timeout=T).values()
        before = max((r.seq for r in tm.lifecycle_events()), default=0)
        os.kill(pids[1], signal.SIGKILL)
        (failure,) = faults.wait_for(1, timeout=T)  # the owner is the root client
        assert failure.mesh_name == counters._name.get()
        # The client records the remote process's exit (with the daemon's status) before it
        # reports the death.
        (exited,) = [r for r in tm.lifecycle_events(before) if r.event == "proc_exited"]
        assert (exited.rank, exited.reason, exited.proc) == (1, "signal SIGKILL", "client")
        assert "crashed_ranks=[1]" in str(failure)
        assert "SIGKILL" in str(failure)
        with pytest.raises(SupervisionError, match=r"counters\.get\(\) failed.*SIGKILL"):
            counters.get.call().get(timeout=T)  # a slice holding the dead rank fails fast
        assert counters.slice(gpus=0).get.call_one().get(timeout=T) == 0
        procs.stop().get(timeout=T)
        hosts.shutdown().get(timeout=T)
        assert daemon.popen.wait(T) == 0
    finally:
        _kill(pids)


def test_kill_ends_the_worker_loop_and_its_procs_at_once(daemons: Daemons, faults: Any) -> None:
    daemon = daemons.start()
    pids: list[int] = []
    try:
        hosts = attach_to_workers(workers=[daemon.address])
        where: Any = hosts.spawn_procs(per_host={"gpus": 2}).spawn("where", Where)
        pids = _pids(where)
        hosts.kill().get(timeout=T)
        assert daemon.popen.wait(T) == 0
        assert _eventually_gone(pids, 10.0)
        time.sleep(0.5)
        assert faults.failures == []  # a kill by the owner is not a failure
    finally:
        _kill(pids)


def test_a_busy_host_refuses_another_client_and_serves_after_its_client_died(
    daemons: Daemons, tmp_path: Path
) -> None:
    daemon = daemons.start()
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from monarch.actor import attach_to_workers
        from procs_actors import Where
        hosts = attach_to_workers(workers=[{daemon.address!r}])
        where = hosts.spawn_procs(per_host={{"gpus": 1}}).spawn("w", Where)
        print(where.place.call_one().get(timeout=20)[0], flush=True)
        time.sleep(60)
        """
    )
    env = dict(os.environ, MONARCH_MESH_ORPHAN_TIMEOUT="1.0")
    other = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    pids: list[int] = []
    try:
        assert other.stdout is not None
        ready, _, _ = select.select([other.stdout], [], [], 40)
        line = other.stdout.readline().decode().strip() if ready else ""
        assert line.isdigit(), "the other client did not attach"
        pids = [int(line)]
        with pytest.raises(RuntimeError, match="attached to client"):
            attach_to_workers(workers=[daemon.address])
        other.send_signal(signal.SIGKILL)
        other.wait(T)
        assert _eventually_gone(pids, 15.0), "a dead client's worker outlived it"
        deadline = time.monotonic() + 15
        while True:  # the daemon notices the lost session within its idle timeout
            try:
                hosts = attach_to_workers(workers=[daemon.address])
                break
            except RuntimeError:
                assert time.monotonic() < deadline, "the host never became free again"
                time.sleep(0.5)
        where: Any = hosts.spawn_procs().spawn("w", Where)
        pids += _pids(where)
        hosts.shutdown().get(timeout=T)
    finally:
        other.kill()
        other.wait(T)
        if other.stdout is not None:
            other.stdout.close()
        _kill(pids)


def test_attach_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="at least one"):
        attach_to_workers(workers=[])
    with pytest.raises(ValueError, match="only udp://HOST:PORT and tcp://HOST:PORT"):
        attach_to_workers(workers=["ipc:///tmp/monarch-worker"])  # tcp:// is UDP here
    with pytest.raises(ValueError, match="not udp://HOST:PORT"):
        attach_to_workers(workers=["udp://127.0.0.1"])
    with pytest.raises(ValueError, match="listed twice"):
        attach_to_workers(workers=["udp://127.0.0.1:9", "udp://localhost:9"])
    with pytest.raises(ValueError, match="not a CA directory"):
        attach_to_workers(workers=["udp://127.0.0.1:9"], ca="/nonexistent/ca")


def test_attach_to_a_silent_address_fails_with_the_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from monarch.actor._hosts import host_mesh

    monkeypatch.setattr(host_mesh, "ATTACH_TIMEOUT", 2.0)
    with pytest.raises(RuntimeError, match=r"udp://127\.0\.0\.1:9"):
        attach_to_workers(workers=["udp://127.0.0.1:9"])


def test_local_host_kill_is_not_a_failure(faults: Any) -> None:
    host = this_host()
    procs = host.spawn_procs({"gpus": 2})
    pids: list[int] = []
    try:
        pids = _pids(procs.spawn("where", Where))
        host.kill().get(timeout=T)
        assert _eventually_gone(pids, 10.0)
        time.sleep(0.5)
        assert faults.failures == []
        with pytest.raises(RuntimeError, match="already been shut down"):
            host.spawn_procs({"gpus": 1})
        assert this_host() is not host  # the client's host mesh is fresh again
    finally:
        _kill(pids)


def test_a_killed_worker_loop_takes_its_workers_and_fails_their_actors(
    daemons: Daemons, faults: Any
) -> None:
    daemon = daemons.start()
    pids: list[int] = []
    try:
        hosts = attach_to_workers(workers=[daemon.address])
        counters: Any = hosts.spawn_procs(per_host={"gpus": 2}).spawn("counters", Counter, 0)
        pids = counters.os_pid.call().get(timeout=T).values()
        daemon.popen.send_signal(signal.SIGKILL)
        assert _eventually_gone(pids, 10.0), "workers outlived their worker loop"
        name = counters._name.get()
        faults.wait_until(lambda seen: sum(f.mesh_name == name for f in seen) >= 2, timeout=T)
        ours = [f for f in faults.failures if f.mesh_name == name]  # to the owner, the client
        assert sorted(r for f in ours for r in f.crashed_ranks) == [0, 1], [str(f) for f in ours]
        for failure in ours:  # whichever the client noticed first: the lost session or the
            # worker's own exit (its stdin pipe from the dead worker loop ended)
            assert re.search(r"was lost|exited with status 3", failure.report()), failure.report()
        with pytest.raises(SupervisionError, match=r"counters\.get\(\) failed"):
            counters.get.call().get(timeout=T)
        with pytest.raises(RuntimeError, match="was lost"):
            hosts.spawn_procs(per_host={"gpus": 1})
    finally:
        _kill(pids)
