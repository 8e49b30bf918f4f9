"""``ProcessJob``: hosts as local worker-loop processes, shared by the tests of this module
(catalogue items 39, 44 and 47 of the reference's lifecycle tests)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the actors, importable by the host processes
from job_actors import HostProbe, Where

from monarch.actor import HostMesh
from monarch.job import MeshSpec, ProcessJob, job_loads
from monarch.job._procs import _wait_gone, session_members

T = 60


@pytest.fixture(scope="module")
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"hosts": 4, "extra": MeshSpec(1, {"gpus": 2})})
    try:
        yield job
    finally:
        hosts = job.hosts
        job.kill()
        assert session_members({h.pid: h.start_time for h in hosts}) == []


@pytest.fixture(scope="module")
def hosts(job: ProcessJob) -> HostMesh:
    return job.state(cached_path=None).hosts


def test_hosts_are_separate_worker_loops(job: ProcessJob, hosts: HostMesh) -> None:
    assert dict(hosts.extent) == {"hosts": 4}
    assert len(job.hosts) == 5
    keys = [h.key for h in job.hosts]
    assert keys == ["hosts_0", "hosts_1", "hosts_2", "hosts_3", "extra_0"]
    assert len({h.pid for h in job.hosts}) == 5
    assert all(h.address.startswith("udp://127.0.0.1:") for h in job.hosts)
    assert job.active
    assert job.can_run(ProcessJob({"hosts": 4, "extra": MeshSpec(1, {"gpus": 2})}))
    assert not job.can_run(ProcessJob({"hosts": 3, "extra": MeshSpec(1, {"gpus": 2})}))


def test_proc_mesh_multi_actor_and_sliced(job: ProcessJob, hosts: HostMesh) -> None:
    """Item 39: ``call()`` on 4 hosts x 3 procs has labels hosts, gpus and sizes 4, 3 with
    ``point.rank == i`` in order; a sliced proc mesh spawns onto exactly its ranks."""
    procs = hosts.spawn_procs(per_host={"gpus": 3})
    try:
        where = procs.spawn("where", Where)
        places = where.place.call().get(timeout=T)
        assert list(places._labels) == ["hosts", "gpus"]
        assert list(places.extent.sizes) == [4, 3]
        items = list(places.items())
        assert [point.rank for point, _ in items] == list(range(12))
        daemon_of = {h.pid: i for i, h in enumerate(job.hosts)}
        for point, place in items:
            assert daemon_of[place["host_pid"]] == point["hosts"]  # on the host of its rank
        pids = {point.rank: place["pid"] for point, place in items}
        assert len(set(pids.values())) == 12
        sliced = procs.slice(hosts=slice(1, 3), gpus=2)
        more = sliced.spawn("sliced", Where)
        got = more.place.call().get(timeout=T)
        assert sorted(place["pid"] for _, place in got.items()) == sorted([pids[5], pids[8]])
    finally:
        procs.stop().get(timeout=T)


def test_this_host_inside_actors_is_their_host(job: ProcessJob, hosts: HostMesh) -> None:
    """Item 47: ``this_host()`` in an actor is the host ``host.slice(hosts=i)`` of its rank,
    for sliced proc meshes too: a process it spawns there is started by that host."""
    procs = hosts.spawn_procs()
    try:
        probes = procs.slice(hosts=slice(1, 4)).spawn("probes", HostProbe)
        answers = {
            point["hosts"] + 1: host_pid  # the slice starts at host 1
            for point, host_pid in probes.host_of_this_host.call().get(timeout=T).items()
        }
        assert answers == {rank: job.hosts[rank].pid for rank in (1, 2, 3)}
        on_slice = hosts.slice(hosts=2).spawn_procs()
        try:
            where = on_slice.spawn("w", Where)
            assert where.place.call_one().get(timeout=T)["host_pid"] == answers[2]
        finally:
            on_slice.stop().get(timeout=T)
    finally:
        procs.stop().get(timeout=T)


def test_stop_and_reconnect(job: ProcessJob, hosts: HostMesh) -> None:
    """Item 44: ``hm.stop()`` ends the user processes; ``job.state().hosts`` reconnects to the
    same worker loops."""
    procs = hosts.spawn_procs()
    where = procs.spawn("where", Where)
    first = [place for _, place in where.place.call().get(timeout=T).items()]
    hosts.stop().get(timeout=T)
    for place in first:  # the workers were the hosts' children: gone (or zombies, reaped)
        assert _gone(place["pid"])
    again = job.state(cached_path=None).hosts
    procs2 = again.spawn_procs()
    try:
        second = procs2.spawn("where", Where).place.call().get(timeout=T)
        assert [p["host_pid"] for _, p in second.items()] == [p["host_pid"] for p in first]
        assert {p["pid"] for _, p in second.items()}.isdisjoint({p["pid"] for p in first})
    finally:
        procs2.stop().get(timeout=T)


def test_layout_and_pickling(job: ProcessJob) -> None:
    state = job.state(cached_path=None)
    assert state.layout("extra") == {"gpus": 2}
    assert state.layout("hosts") == {}
    procs = state.extra.spawn_procs(per_host=state.layout("extra"))
    try:
        places = procs.spawn("where", Where).place.call().get(timeout=T)
        assert {p["host_pid"] for _, p in places.items()} == {job.hosts[4].pid}
        assert len(list(places.items())) == 2
    finally:
        procs.stop().get(timeout=T)
    copy = job_loads(job.dumps())
    assert isinstance(copy, ProcessJob)
    assert copy.hosts == job.hosts
    assert copy.apply_id == job.apply_id
    assert copy.can_run(job)


def _sockets(pid: int) -> set[str]:
    """The socket inodes process ``pid`` holds."""
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def _gone(pid: int) -> bool:
    return _wait_gone([pid], 10.0) == []  # a pidfd wait, bounded


def test_bad_specifications_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one host"):
        ProcessJob({"hosts": 0})
    with pytest.raises(ValueError, match="not an identifier"):
        ProcessJob({"bad name": 1})
    with pytest.raises(ValueError, match="reserved"):
        ProcessJob({"layout": 1})
    with pytest.raises(ValueError, match="namespace name"):
        ProcessJob({"hosts": 1}, namespaces=["a/b"])
    with pytest.raises(RuntimeError, match="batch-mode"):
        ProcessJob({"hosts": 1}).apply(client_script="x.py")


def test_a_host_that_cannot_start_fails_apply_with_its_log(tmp_path: Path) -> None:
    job = ProcessJob({"hosts": 2}, listen="udp://203.0.113.1:0")  # not an address of this host
    with pytest.raises(RuntimeError, match="hosts_0") as failure:
        job.apply()
    assert "log tail" in str(failure.value)  # with the host's own reason from its log:
    assert "Cannot assign requested address" in str(failure.value)
    assert not job.active
    assert job.hosts == []
    assert job._tmpdir is None  # its logs were removed with it


def test_a_lost_host_fails_the_calls_to_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose worker loop dies (SIGKILL of its process: the node is gone) surfaces at
    the client as a supervision event on the mesh using it (one failure, its rank on that
    host, within the orphan timeout), calls to that rank fail with ``SupervisionError``, the
    other host's rank keeps answering, and ``kill()`` leaves nothing."""
    import signal
    import threading
    import time

    import monarch.actor
    from monarch.actor import MeshFailure, SupervisionError
    from monarch.actor.testing import flush_supervision

    failures: list[MeshFailure] = []
    arrived = threading.Event()

    def hook(failure: MeshFailure) -> None:  # the client owns the mesh: its faults come here
        failures.append(failure)
        arrived.set()

    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", hook)
    client_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a port the client holds
    client_socket.bind(("127.0.0.1", 0))
    job = ProcessJob({"hosts": 2})
    sessions: dict[int, int] = {}
    try:
        hosts = job.state(cached_path=None).hosts
        sessions = {h.pid: h.start_time for h in job.hosts}
        procs = hosts.spawn_procs()
        where = procs.spawn("where", Where)
        assert len(where.place.call().get(timeout=T).values()) == 2
        # Hosts forked from this client hold none of its sockets (its ports stay its own).
        mine = f"socket:[{os.fstat(client_socket.fileno()).st_ino}]"
        assert mine in _sockets(os.getpid())
        assert _sockets(os.getpid()).isdisjoint(_sockets(job.hosts[0].pid))
        started = time.monotonic()
        os.kill(job.hosts[1].pid, signal.SIGKILL)
        assert arrived.wait(15.0), "the lost host never reached the client"
        assert time.monotonic() - started < 15.0  # the orphan timeout (3 s) and some slack
        with pytest.raises(SupervisionError):
            where.slice(hosts=1).place.call_one().get(timeout=T)
        assert where.slice(hosts=0).place.call_one().get(timeout=T)["host_pid"] == job.hosts[0].pid
        procs.stop().get(timeout=T)
        flush_supervision(20.0)  # every event in flight reached the hook before it is undone
        assert [f.crashed_ranks for f in failures] == [[1]]  # one event: its rank on host 1
        assert failures[0].mesh_name == where._name.get(timeout=T)
        assert f"host {job.hosts[1].address}" in str(failures[0].event)  # which host was lost
    finally:
        job.kill()
        client_socket.close()
    assert session_members(sessions) == []


def test_hosts_start_with_exec_where_no_zygote_forks_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a zygote (another interpreter, or no fork) every host is ``python -m
    monarch.job._host`` reporting its address on an inherited pipe."""
    monkeypatch.setattr(ProcessJob, "_start_zygote", lambda self: None)
    job = ProcessJob({"hosts": 1})
    try:
        hosts = job.state(cached_path=None).hosts
        (host,) = job.hosts
        assert "monarch.job._host" in Path(f"/proc/{host.pid}/cmdline").read_bytes().decode()
        procs = hosts.spawn_procs()
        place = procs.spawn("where", Where).place.call_one().get(timeout=T)
        assert place["host_pid"] == host.pid
        procs.stop().get(timeout=T)
    finally:
        job.kill()
    assert session_members({host.pid: host.start_time}) == []
