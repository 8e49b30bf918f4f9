"""A persistent allocation: client process 1 applies a ``ProcessJob`` and saves it, runs actors
and exits; client process 2 loads it, reconnects to the same worker loops, runs actors there,
then kills the job, after which no process of it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from monarch.job import ProcessJob, job_load
from monarch.job._procs import session_members

HERE = Path(__file__).parent
T = 120

FIRST = textwrap.dedent(
    """
    import json, sys
    from monarch.actor import shutdown_context
    from monarch.job import ProcessJob
    from job_actors import Where

    if __name__ == "__main__":
        job = ProcessJob({"hosts": 2})
        state = job.state(cached_path=sys.argv[1])
        procs = state.hosts.spawn_procs()
        places = procs.spawn("where", Where).place.call().get(timeout=60)
        procs.stop().get(timeout=60)
        shutdown_context().get(timeout=60)
        print(json.dumps({
            "apply_id": job.apply_id,
            "hosts": [p["host_pid"] for _, p in places.items()],
        }), flush=True)
    """
)

SECOND = textwrap.dedent(
    """
    import json, sys
    from monarch.actor import shutdown_context
    from monarch.job import ProcessJob
    from job_actors import Where

    if __name__ == "__main__":
        job = ProcessJob({"hosts": 2})  # the same specification: the saved job runs it
        state = job.state(cached_path=sys.argv[1])
        procs = state.hosts.spawn_procs(per_host={"gpus": 2})
        places = procs.spawn("where", Where).place.call().get(timeout=60)
        out = {
            "apply_id": job.apply_id,
            "hosts": [p["host_pid"] for _, p in places.items()],
            "workers": [p["pid"] for _, p in places.items()],
        }
        job.kill()
        out["active_after_kill"] = job.active
        print(json.dumps(out), flush=True)
    """
)


def _run(script: Path, saved: Path, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, str(script), str(saved)],
        capture_output=True,
        text=True,
        env=env,
        timeout=T,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_later_client_process_reconnects_then_kills(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), *(p for p in sys.path if p)]),
        MONARCH_MESH_ORPHAN_TIMEOUT="3.0",
    )
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text(FIRST)
    second.write_text(SECOND)
    saved = tmp_path / "state" / "job.pkl"
    one = _run(first, saved, env)
    job = job_load(str(saved))
    assert isinstance(job, ProcessJob)
    assert job.apply_id == one["apply_id"]
    hosts = job.hosts
    sessions = {h.pid: h.start_time for h in hosts}
    try:
        assert one["hosts"] == [h.pid for h in hosts]
        assert job.can_run(ProcessJob({"hosts": 2}))  # client 1 is gone, its hosts live on
        two = _run(second, saved, env)
        assert two["apply_id"] == one["apply_id"]  # the same allocation, not a new one
        assert two["hosts"] == [hosts[0].pid, hosts[0].pid, hosts[1].pid, hosts[1].pid]
        assert two["active_after_kill"] is False
        assert session_members(sessions) == []  # hosts and their workers: all gone
        for pid in two["workers"]:  # type: ignore[attr-defined]
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
        assert not job.can_run(ProcessJob({"hosts": 2}))
    finally:
        job.kill()  # only if the test failed before client 2 killed it
    assert session_members(sessions) == []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True
