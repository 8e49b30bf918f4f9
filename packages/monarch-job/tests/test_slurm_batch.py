"""``SlurmJob.apply(client_script=...)`` (batch mode) on the real Slurm test cluster: the job
runs the client script inside its allocation, that client's ``job_load().state()`` attaches to
the job it runs in and runs actors on both nodes, and the job ends with the client, leaving no
process behind."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from _slurm_cluster import SlurmCluster

from monarch.job import SlurmJob

CLIENT = textwrap.dedent("""
    import json, os, sys
    from monarch.job import SlurmJob, job_load
    from cluster_actors import Where
    job = job_load()  # saved by apply(client_script=...): the job this client runs in
    assert job.job_id == os.environ["SLURM_JOB_ID"], (job.job_id, os.environ["SLURM_JOB_ID"])
    hosts = job.state(cached_path=None).hosts
    where = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
    nodes = sorted(n for n, _, _ in where.where.call().get(timeout=60).values())
    print("BATCH-RESULT", json.dumps({"nodes": nodes, "args": sys.argv[1:]}), flush=True)
""")


def _listed(cluster: SlurmCluster, job_id: str) -> bool:
    return job_id in cluster.run("squeue", "-h", "-t", "all", "-o", "%i").split()


def test_a_batch_job_runs_its_client_on_its_own_allocation(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # .monarch/job_state.pkl: the submit (and batch) directory
    (tmp_path / "client.py").write_text(CLIENT)
    port = 25000 + os.getpid() % 2000
    job = SlurmJob(
        {"hosts": 2},
        monarch_port=port,
        log_dir=str(tmp_path),
        exclusive=False,
        time_limit="00:10:00",
        job_name="monarch_batch",
    )
    job.apply(client_script=f"{tmp_path / 'client.py'} --lr 0.1")
    job_id = job.job_id
    assert job_id is not None
    assert job.active
    try:
        deadline = time.monotonic() + 120
        while _listed(slurm, job_id) and time.monotonic() < deadline:
            time.sleep(0.5)  # squeue has no notification: the job ends with its client
        assert not _listed(slurm, job_id) or "COMPLETED" in slurm.run(
            "squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"
        )
    finally:
        if _listed(slurm, job_id):
            job.kill()
    out = "\n".join(p.read_text() for p in tmp_path.glob(f"slurm_{job_id}_*"))
    (line,) = [row for row in out.splitlines() if row.startswith("BATCH-RESULT")] or [out[-3000:]]
    assert line == 'BATCH-RESULT {"nodes": ["n1", "n2"], "args": ["--lr", "0.1"]}'
    leftovers = subprocess.run(
        ["pgrep", "-f", f"--port {port}"], capture_output=True, text=True, check=False
    ).stdout.split()
    assert [pid for pid in leftovers if int(pid) != os.getpid()] == []  # workers ended too
