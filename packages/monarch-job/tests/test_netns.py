"""``ProcessJob`` hosts in network namespaces: two hosts with their own addresses, actors on
both called from the client (in the calling namespace), then everything removed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the actors, importable by the host processes
from job_actors import Where

from monarch.job import ProcessJob
from monarch.job._netns import NetnsHosts, NetnsUnavailable
from monarch.job._procs import session_members

pytestmark = pytest.mark.netns
T = 60


def test_two_hosts_in_two_namespaces() -> None:
    if sys.platform != "linux":
        pytest.skip("network namespaces are Linux's")
    namespaces = NetnsHosts(2)
    try:
        namespaces.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces cannot be created here: {exc}")
    job = ProcessJob({"hosts": 2}, namespaces=namespaces.names)
    sessions: dict[int, int] = {}
    try:
        state = job.state(cached_path=None)
        sessions = {h.pid: h.start_time for h in job.hosts}
        # Each host listens on the wildcard of its namespace and reports its own address.
        assert [h.address.rpartition(":")[0] for h in job.hosts] == [
            f"udp://{address}" for address in namespaces.addresses
        ]
        assert [h.netns for h in job.hosts] == namespaces.names
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
        job.kill()
        left = namespaces.delete()
    assert session_members(sessions) == []  # the hosts and their workers are gone
    assert left == []
    assert namespaces.exists() == []


def _netns_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def test_netns_hosts_refuses_bad_counts() -> None:
    with pytest.raises(ValueError, match="1 to 63"):
        NetnsHosts(0)
