"""The cluster resolvers (``monarch.job._resolvers``, a Chrysalis plugin) against the real Slurm
test cluster and the fake Kubernetes API server: ``slurm://JOBID[/NODE]`` and
``k8s://NAMESPACE/SERVICE[/POD]`` name a running job's worker loops, for the ``chrysalis``
command (``ls``, ``ping``) and for ``attach_to_workers``.

monarch-job is not installed in the workspace environment, so its entry point is not loaded
there: the tests register the plugin module in the process-wide registry explicitly (the entry
point itself is checked in the wheel, ``test_the_wheel_declares_the_entry_point``).
"""

from __future__ import annotations

import io
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _slurm_cluster import SlurmCluster
from cluster_actors import Where

from chrysalis.core import DatagramAddr, default_registry
from chrysalis.node import join_members
from chrysalis.node._cli import main as chrysalis
from monarch.actor import attach_to_workers
from monarch.job import SlurmJob, _resolvers
from monarch.job._slurm import _run

T = 60.0


@pytest.fixture(scope="module")
def plugin() -> Iterator[None]:
    registry = default_registry()
    if "monarch-job:cluster-resolvers" in registry.plugin_names():
        yield  # installed: the entry point registered it
        return
    registry.register(_resolvers, "monarch-job-test:cluster-resolvers")
    try:
        yield
    finally:
        registry.unregister(_resolvers)


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _members(url: str) -> list[tuple[str, str]]:
    settings = default_registry().resolve_address(url)
    return [(name, str(address)) for name, address in join_members(settings)]


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = chrysalis([*argv], out=out)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def slurm_job(
    slurm: SlurmCluster, plugin: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SlurmJob, int]]:
    """A running two-node job whose worker loops no client attached yet."""
    port = _free_udp_port()
    job = SlurmJob(
        {"hosts": 2},
        monarch_port=port,
        log_dir=str(tmp_path_factory.mktemp("slurm-logs")),
        exclusive=False,
        time_limit="00:10:00",
        job_start_timeout=60,
        job_name="monarch_resolve",
        slurm_args=["--comment='a user note'"],  # kept with the port's (salloc)
    )
    job.apply()
    try:
        job._wait_running(job._require_job_id())  # running; nobody attached
        yield job, port
    finally:
        job.kill()


def test_slurm_urls_resolve_to_the_job_s_worker_loops(slurm_job: tuple[SlurmJob, int]) -> None:
    job, port = slurm_job
    job_id = job.job_id
    assert job_id is not None
    comment = _run(["squeue", "-h", "-j", job_id, "-o", "%k"]).strip()
    assert comment.startswith(f"a user note monarch_port={port} ")  # the user's and ours
    assert _members(f"slurm://{job_id}") == [
        ("n1", f"udp://127.0.0.2:{port}"),  # the port read from the job (its comment: salloc)
        ("n2", f"udp://127.0.0.3:{port}"),
    ]
    assert _members(f"slurm://{job_id}/n2") == [("n2", f"udp://127.0.0.3:{port}")]
    assert _members(f"slurm://{job_id}/n1?port=4242") == [("n1", "udp://127.0.0.2:4242")]
    settings = default_registry().resolve_address(f"slurm://{job_id}")
    assert settings.address == DatagramAddr.parse(f"udp://127.0.0.2:{port}")  # the job's root
    with pytest.raises(RuntimeError, match=f"Slurm job {job_id} does not run on node 'n9'"):
        default_registry().resolve_address(f"slurm://{job_id}/n9")
    with pytest.raises(RuntimeError, match="Slurm job 999999 is not listed by squeue"):
        default_registry().resolve_address("slurm://999999")
    with pytest.raises(ValueError, match="job id 'abc'"):
        default_registry().resolve_address("slurm://abc")


def test_chrysalis_ls_and_ping_reach_the_job_s_worker_loops(
    slurm_job: tuple[SlurmJob, int],
) -> None:
    job, port = slurm_job
    code, out = _cli("ls", "--json", "--timeout", "60", f"slurm://{job.job_id}")
    assert code == 0, out
    listed = sorted(loc["address"] for entry in json.loads(out) for loc in entry["locators"])
    assert f"udp://127.0.0.2:{port}" in listed
    assert f"udp://127.0.0.3:{port}" in listed
    roots = [e for e in json.loads(out) if not e["labels"]]  # the worker loops: no labels
    assert len(roots) == 2
    code, out = _cli("ls", "--json", "--timeout", "60", f"slurm://{job.job_id}/n2")
    assert code == 0, out
    roots = [e for e in json.loads(out) if not e["labels"]]  # (and this client, labelled)
    assert [loc["address"] for e in roots for loc in e["locators"]] == [f"udp://127.0.0.3:{port}"]
    code, out = _cli("ping", "--json", "--timeout", "30", f"slurm://{job.job_id}")
    assert code == 0, out  # the job's root answers the join; no echo targets under it
    assert json.loads(out) == {}
    code, out = _cli("ls", "--timeout", "5", "slurm://999999")
    assert code == 2  # a usage error: stderr says the job is not listed
    assert out == ""


def test_attach_to_workers_takes_a_slurm_url(slurm_job: tuple[SlurmJob, int]) -> None:
    job, _ = slurm_job
    hosts = attach_to_workers(workers=[f"slurm://{job.job_id}"], name="resolved")
    try:
        assert hosts.extent.sizes == [2]
        where: Any = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
        places = where.where.call().get(timeout=T).values()
        assert [node for node, _, _ in places] == ["n1", "n2"]
    finally:
        hosts.shutdown().get(timeout=T)


# -- Kubernetes (the fake API server) ----------------------------------------------------------
@pytest.fixture(scope="module")
def kube_job(plugin: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")
    from _fake_kube import FakeKube

    from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

    saved = {key: os.environ.get(key) for key in ("PYTHONPATH", "KUBECONFIG")}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the fake's pods
    fake = FakeKube()
    path = fake.kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    os.environ["KUBECONFIG"] = str(path)  # what the resolver reads
    job = KubernetesJob("monarch", timeout=60, kubeconfig=KubeConfig.from_path(str(path)))
    job.add_mesh("workers", 2, image_spec=ImageSpec("fake/monarch"))
    job.apply()
    try:
        job.state(cached_path=None).workers.stop().get(timeout=T)  # Ready; detached again
        yield job
    finally:
        job.kill()
        fake.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_k8s_urls_resolve_to_the_service_s_ready_pods(kube_job: Any) -> None:
    members = _members("k8s://monarch/workers-svc")
    assert [name for name, _ in members] == ["workers-0", "workers-1"]  # rank order
    assert all(address.startswith("udp://127.0.0.") for _, address in members)
    assert _members("k8s://monarch/workers-svc/workers-1") == members[1:]
    with pytest.raises(RuntimeError, match="API answered 404"):
        default_registry().resolve_address("k8s://monarch/nosuch-svc")
    with pytest.raises(RuntimeError, match="selects no pod 'workers-7'"):
        default_registry().resolve_address("k8s://monarch/workers-svc/workers-7")
    code, out = _cli("ls", "--json", "--timeout", "60", "k8s://monarch/workers-svc")
    assert code == 0, out
    listed = sorted(loc["address"] for e in json.loads(out) for loc in e["locators"])
    assert all(address in listed for _, address in members)


def test_attach_to_workers_takes_a_k8s_url(kube_job: Any) -> None:
    hosts = attach_to_workers(workers=["k8s://monarch/workers-svc"], name="pods")
    try:
        where: Any = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
        assert [n for n, _, _ in where.where.call().get(timeout=T).values()] == [
            "workers-0",
            "workers-1",
        ]
    finally:
        hosts.stop().get(timeout=T)


def test_the_wheel_declares_the_entry_point() -> None:
    """The ``chrysalis`` entry point in pyproject.toml names this plugin module (the wheel
    built by scripts/check_isolated.py carries it; there it is loaded by the registry)."""
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["chrysalis"] == {
        "cluster-resolvers": "monarch.job._resolvers"
    }
    dists = {d.metadata["Name"] for d in __import__("importlib.metadata").metadata.distributions()}
    if "monarch-job" in dists:  # installed (the isolated check): the registry loaded it
        assert "monarch-job:cluster-resolvers" in default_registry().plugin_names()


def test_a_batch_job_s_port_comes_from_its_script_when_its_comment_names_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job ``sbatch`` started (``immediate=False``, busy nodes) has no port in its comment:
    its batch script's ``srun`` line gives it (no cluster needed: the commands are faked)."""
    asked: list[str] = []
    answers = {
        "squeue -h -j 7 -o %T|%N": "RUNNING|n1\n",
        "scontrol show hostnames n1": "n1\n",
        "scontrol show node -o n1": "NodeName=n1 Arch=x86_64 NodeAddr=127.0.0.2 State=ALLOC\n",
        "squeue -h -j 7 -o %k": "(null)\n",
        "scontrol write batch_script 7 -": "#!/bin/bash\nexec srun w --port 4321 --slurm-node-a\n",
    }

    def run(argv: list[str], stdin: str | None = None, env: object = None) -> str:
        asked.append(" ".join(argv))
        return answers[" ".join(argv)]

    monkeypatch.setattr("monarch.job._slurm._run", run)
    settings = _resolvers.resolve_slurm("slurm://7")
    assert settings.address == DatagramAddr.parse("udp://127.0.0.2:4321")
    assert asked[-2:] == ["squeue -h -j 7 -o %k", "scontrol write batch_script 7 -"]
