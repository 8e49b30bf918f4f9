"""``ProcessJob`` hosts in network namespaces (``chrysalis.node.netns``, chrysalis-node's public
module): two hosts with their own addresses, actors on both called from the client (in the
calling namespace), then everything removed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the actors, importable by the host processes
from job_actors import Where

from chrysalis.node.netns import Namespaces, NetnsUnavailable
from monarch.job import ProcessJob
from monarch.job._procs import session_members

pytestmark = pytest.mark.netns
T = 60


def test_two_hosts_in_two_namespaces() -> None:
    if sys.platform != "linux":
        pytest.skip("network namespaces are Linux's")
    try:
        namespaces = Namespaces.for_tasks(2)
        namespaces.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces cannot be created here: {exc}")
    names = namespaces.plan.task_names()
    job = ProcessJob({"hosts": 2}, namespaces=names)
    sessions: dict[int, int] = {}
    try:
        state = job.state(cached_path=None)
        sessions = {h.pid: h.start_time for h in job.hosts}
        # Each host listens on the wildcard of its namespace and reports its own address.
        assert [h.address.rpartition(":")[0] for h in job.hosts] == [
            f"udp://{address}" for address in namespaces.plan.task_addresses()
        ]
        assert [h.netns for h in job.hosts] == names
        procs = state.hosts.spawn_procs()
        places = [place for _, place in procs.spawn("where", Where).place.call().get(T).items()]
        daemons = [h.pid for h in job.hosts]
        assert [place["host_pid"] for place in places] == daemons  # one on each host
        netns = [place["netns"] for place in places]
        assert netns == [_netns_of(pid) for pid in daemons]  # in the namespace of its host
        assert len(set(netns)) == 2
        assert os.stat("/proc/self/ns/net").st_ino not in netns
        procs.stop().get(timeout=T)
    finally:
        try:
            job.kill()
        finally:
            namespaces.delete()  # OSError if one is left
    assert session_members(sessions) == []  # the hosts and their workers are gone
    assert not any(Path("/run/netns", name).exists() for name in namespaces.plan.names())


def _netns_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino
