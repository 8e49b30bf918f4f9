"""A persistent allocation: client process 1 applies a ``ProcessJob`` and saves it, runs actors
and exits; client process 2 builds the same specification, reconnects to the same worker loops
through the saved job, runs actors there, then kills the job, after which no process of it runs.

The hosts are three network namespaces with their own addresses (the issue's scenario: the
local job with hosts in namespaces); the test is skipped, with the reason, where this machine
cannot make them (not root, no ``ip``). The same reconnect on loopback hosts is the README's
example (``tests/test_readme_examples.py`` runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chrysalis.node.netns import Namespaces, NetnsUnavailable
from monarch.job import ProcessJob, job_load
from monarch.job._procs import session_members

HERE = Path(__file__).parent
T = 120

CLIENT = textwrap.dedent(
    """
    import json, os, sys
    from monarch.actor import shutdown_context
    from monarch.job import ProcessJob
    from job_actors import Where

    if __name__ == "__main__":
        saved, spec, then = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
        job = ProcessJob({"hosts": spec["hosts"]}, namespaces=spec["namespaces"])
        state = job.state(cached_path=saved)  # client 1 applies, client 2 reconnects
        procs = state.hosts.spawn_procs()
        places = [p for _, p in procs.spawn("where", Where).place.call().get(timeout=60).items()]
        out = {
            "apply_id": job.apply_id,
            "hosts": [p["host_pid"] for p in places],
            "workers": [p["pid"] for p in places],
            "netns": [p["netns"] for p in places],
            "client_netns": os.stat("/proc/self/ns/net").st_ino,
        }
        if then == "kill":
            job.kill()
            out["active_after_kill"] = job.active
        else:
            procs.stop().get(timeout=60)
        shutdown_context().get(timeout=60)
        print(json.dumps(out), flush=True)
    """
)


@pytest.fixture
def hosts_spec() -> Iterator[dict[str, Any]]:
    if sys.platform != "linux":
        pytest.skip("network namespaces are Linux's")
    try:
        namespaces = Namespaces.for_tasks(3)
        namespaces.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces cannot be created here: {exc}")
    try:
        yield {"hosts": 3, "namespaces": namespaces.plan.task_names()}
    finally:
        namespaces.delete()  # OSError if one is left
        assert not any(Path("/run/netns", name).exists() for name in namespaces.plan.names())


def _run(script: Path, *args: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=T,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_later_client_process_reconnects_then_kills(
    tmp_path: Path, hosts_spec: dict[str, Any]
) -> None:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), *(p for p in sys.path if p)]),
        MONARCH_MESH_ORPHAN_TIMEOUT="3.0",
    )
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    saved = str(tmp_path / "state" / "job.pkl")
    spec = json.dumps(hosts_spec)
    count = hosts_spec["hosts"]
    one = _run(script, saved, spec, "keep", env=env)
    job = job_load(saved)
    assert isinstance(job, ProcessJob)
    assert job.apply_id == one["apply_id"]
    hosts = job.hosts
    sessions = {h.pid: h.start_time for h in hosts}
    try:
        assert len(hosts) == count
        assert one["hosts"] == [h.pid for h in hosts]
        assert len(set(one["netns"])) == count  # every host in a namespace of its own
        assert one["client_netns"] not in one["netns"]
        assert [h.netns for h in hosts] == hosts_spec["namespaces"]
        same = ProcessJob({"hosts": count}, namespaces=hosts_spec["namespaces"])
        assert job.can_run(same)  # client 1 is gone, its hosts live on
        two = _run(script, saved, spec, "kill", env=env)
        assert two["apply_id"] == one["apply_id"]  # the same allocation, not a new one
        assert two["hosts"] == one["hosts"]
        assert two["netns"] == one["netns"]
        assert two["active_after_kill"] is False
        assert session_members(sessions) == []  # hosts and their workers: all gone
        assert not job.can_run(same)
    finally:
        job.kill()  # only if the test failed before client 2 killed it
    assert session_members(sessions) == []


UNSAVED = textwrap.dedent(
    """
    import json
    from monarch.job import ProcessJob

    if __name__ == "__main__":
        job = ProcessJob({"hosts": 1})
        job.state(cached_path=None)  # not saved: no later process could reconnect
        print(json.dumps([[h.pid, h.start_time] for h in job.hosts]), flush=True)
        raise RuntimeError("the client fails without killing its job")
    """
)


def test_a_job_nobody_saved_ends_with_the_client_that_applied_it(tmp_path: Path) -> None:
    script = tmp_path / "unsaved.py"
    script.write_text(UNSAVED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=T)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the client fails" in done.stderr
    hosts = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    assert session_members(hosts) == []
