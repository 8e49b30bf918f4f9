"""``KubernetesJob`` through the official ``kubernetes`` client against a FAKE API server
(``_fake_kube``: no real cluster can run here). The fake's pods are local worker-loop
processes, so ``state()`` returns working host meshes: apply, wait for Ready, spawn and call
actors on both pods, reconnect from a pickled job, lose a pod (a fault at the client), kill
(pods and service deleted, processes gone); pods that never become Ready and pods that crash
fail ``state()`` with the reason.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")

from kubernetes import client  # type: ignore[import-not-found, import-untyped, unused-ignore]

sys.path.insert(0, str(Path(__file__).parent))  # the workers import cluster_actors by name
from _fake_kube import FakeKube
from cluster_actors import Where

import monarch.actor
from monarch.actor import SupervisionError
from monarch.job import job_loads
from monarch.job._kube_manifests import (
    pod_failure,
    pod_is_ready,
    pod_port,
    pod_rank,
    service_manifest,
    worker_pod_manifest,
)
from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

T = 60.0


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeKube, KubeConfig]]:
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the fake's pods
    fake = FakeKube()
    path = fake.kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    try:
        yield fake, KubeConfig.from_path(str(path))
    finally:
        fake.close()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_apply_state_actors_reconnect_crash_and_kill(
    kube: tuple[FakeKube, KubeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, kubeconfig = kube
    job = KubernetesJob("monarch", timeout=60, kubeconfig=kubeconfig)
    job.add_mesh("workers", 2, image_spec=ImageSpec("fake/monarch", resources={"cpu": 1}))
    job.apply()
    created = [r for r in fake.requests if r[0] == "POST"]
    assert created == [
        ("POST", "/api/v1/namespaces/monarch/services"),
        ("POST", "/api/v1/namespaces/monarch/pods"),
        ("POST", "/api/v1/namespaces/monarch/pods"),
    ]
    pod = fake.pods[("monarch", "workers-1")].body
    assert pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1"
    assert pod["spec"]["subdomain"] == "workers-svc"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}
    try:
        hosts = job.state(cached_path=None).workers
        assert hosts.extent.sizes == [2]
        where: Any = hosts.spawn_procs(per_host={"gpus": 1}).spawn("where", Where)
        places = where.where.call().get(timeout=T).values()
        assert [node for node, _, _ in places] == ["workers-0", "workers-1"]  # in rank order
        assert where.add.call(1, 2).get(timeout=T).values() == [3, 3]
        pids = [pid for _, _, pid in places] + fake.pod_pids()
        assert len(pids) == 4
        assert all(_alive(p) for p in pids)
        copy = job_loads(job.dumps())  # what a later client would load
        assert isinstance(copy, KubernetesJob)
        assert copy.can_run(job)

        # pod workers-1's worker loop crashes: the fault reaches the client, calls fail, and
        # the pod reports the crash
        faults: list[Any] = []
        heard = threading.Event()

        def hook(failure: Any) -> None:
            faults.append(failure)
            heard.set()

        monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", hook)
        crashed = fake.pods[("monarch", "workers-1")]
        assert crashed.process is not None
        crashed.process.kill()
        assert heard.wait(T), "no supervision event reached the client after a pod crashed"
        assert "was lost" in faults[0].report()
        with pytest.raises(SupervisionError, match="was lost"):
            where.where.call().get(timeout=T)
        assert not copy.can_run(job)  # a crashed pod: the allocation cannot serve it any more
    finally:
        job.kill()
    assert fake.pods == {}
    assert fake.services == {}
    assert [p for p in pids if _alive(p)] == []
    assert ("DELETE", "/api/v1/namespaces/monarch/services/workers-svc") in fake.requests
    assert not job.active


def test_pods_that_never_become_ready_fail_state_with_the_missing_ranks(
    kube: tuple[FakeKube, KubeConfig],
) -> None:
    fake, kubeconfig = kube
    job = KubernetesJob("monarch", timeout=1, kubeconfig=kubeconfig)
    job.add_mesh("stuck", 1, image_spec=ImageSpec("fake/never-ready"))
    job.apply()
    try:
        with pytest.raises(RuntimeError, match=r"0/1 pods Ready.*missing ranks \[0\]"):
            job.state(cached_path=None)
    finally:
        job.kill()
    assert ("monarch", "stuck-0") not in fake.pods


def test_a_crashing_pod_fails_state_at_once_with_its_exit(
    kube: tuple[FakeKube, KubeConfig],
) -> None:
    fake, kubeconfig = kube
    job = KubernetesJob("monarch", timeout=60, kubeconfig=kubeconfig)
    job.add_mesh("crashy", 1, image_spec=ImageSpec("fake/crash"))
    job.apply()
    try:
        with pytest.raises(
            RuntimeError, match=r"crashy-0 \(rank 0\) of mesh crashy crashed.*exit code 3"
        ):
            job.state(cached_path=None)
    finally:
        job.kill()
    assert fake.pods == {}


def test_an_existing_pod_name_fails_apply_and_leaves_nothing(
    kube: tuple[FakeKube, KubeConfig],
) -> None:
    fake, kubeconfig = kube
    first = KubernetesJob("monarch", kubeconfig=kubeconfig)
    first.add_mesh("taken", 1, image_spec=ImageSpec("fake/never-ready"))
    first.apply()
    try:
        second = KubernetesJob("other", kubeconfig=kubeconfig)
        second.add_mesh("free", 1, image_spec=ImageSpec("fake/never-ready"))
        second.add_mesh("taken", 1, image_spec=ImageSpec("fake/never-ready"))
        fake.pods[("other", "taken-0")] = fake.pods[("monarch", "taken-0")]  # squat the name
        with pytest.raises(client.ApiException, match="already exists"):
            second.apply()
        assert ("other", "free-0") not in fake.pods  # the first mesh was rolled back
        assert not second.active
        del fake.pods[("other", "taken-0")]
    finally:
        first.kill()


# -- the manifests and the readers (pure) ---------------------------------------------------------
def test_a_pod_template_keeps_its_own_settings_and_gets_the_worker_ones() -> None:
    template = client.ApiClient().sanitize_for_serialization(
        client.V1PodTemplateSpec(
            metadata=client.V1ObjectMeta(labels={"team": "a"}, annotations={"x": "y"}),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(name="sidecar", image="s"),
                    client.V1Container(
                        name="worker", image="w", env=[client.V1EnvVar(name="A", value="1")]
                    ),
                ],
                node_selector={"gpu": "h100"},
            ),
        )
    )
    pod = worker_pod_manifest("trainers", 3, 4000, template, "apply1")
    assert pod["metadata"]["name"] == "trainers-3"
    assert pod["metadata"]["labels"] == {
        "team": "a",
        "app.kubernetes.io/name": "monarch-worker",
        "monarch.pytorch.org/mesh-name": "trainers",
        "apps.kubernetes.io/pod-index": "3",
        "monarch.pytorch.org/apply-id": "apply1",
    }
    assert pod["metadata"]["annotations"] == {"x": "y"}
    spec = pod["spec"]
    assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == (
        "trainers-3",
        "trainers-svc",
        "Never",
    )
    assert spec["nodeSelector"] == {"gpu": "h100"}
    sidecar, worker = spec["containers"]
    assert "command" not in sidecar
    assert worker["command"] == ["python", "-m", "monarch.job._host_worker", "--port", "4000"]
    assert [e["name"] for e in worker["env"]] == [
        "A", "MONARCH_PORT", "MONARCH_HOST_IP", "MONARCH_POD_NAME", "MONARCH_READY_FILE",
    ]  # fmt: skip
    assert worker["readinessProbe"]["exec"]["command"] == [
        "test",
        "-f",
        "/tmp/monarch-worker-ready",
    ]
    assert worker["ports"] == [{"name": "monarch", "containerPort": 4000, "protocol": "UDP"}]
    assert pod_port(pod, 1) == 4000
    assert template["spec"]["containers"][1].get("command") is None  # the template is not changed
    service = service_manifest("trainers", 4000, {"team": "a"})
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "monarch-worker",
        "monarch.pytorch.org/mesh-name": "trainers",
    }


def test_pod_status_readers() -> None:
    conditions = [{"type": "Ready", "status": "True"}]
    ready = {
        "metadata": {"name": "p", "labels": {"r": "2"}},
        "status": {"podIP": "10.0.0.1", "conditions": conditions},
    }
    assert pod_is_ready(ready)
    assert pod_rank(ready, "r") == 2
    assert pod_failure(ready) is None
    assert not pod_is_ready(
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )  # no IP
    with pytest.raises(ValueError, match="no label"):
        pod_rank(ready, "other")
    with pytest.raises(ValueError, match="not an int"):
        pod_rank({"metadata": {"labels": {"r": "x"}}}, "r")
    terminated = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    crashed = {"status": {"phase": "Running", "containerStatuses": [
        {"name": "worker", "state": terminated}]}}  # fmt: skip
    assert pod_failure(crashed) == "container worker terminated (exit code 137, OOMKilled)"
    assert (
        pod_failure({"status": {"phase": "Failed", "reason": "Evicted"}}) == "phase Failed: Evicted"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Bad_Name", "num_replicas": 1}, "invalid"),
        ({"name": "1abc", "num_replicas": 1}, "invalid"),
        ({"name": "ok", "num_replicas": 0}, "num_replicas"),
        ({"name": "ok", "num_replicas": 1, "port": 0}, "not a port"),
        (
            {"name": "ok", "num_replicas": 1, "image_spec": ImageSpec("i"), "pod_template": {}},
            "mutually",
        ),
        (
            {
                "name": "ok",
                "num_replicas": 1,
                "image_spec": ImageSpec("i"),
                "label_selector": "a=b",
            },
            "label_selector",
        ),
        ({"name": "ok", "num_replicas": 1, "labels": {"a": "b"}}, "only be set when provisioning"),
    ],
)
def test_add_mesh_refuses_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KubernetesJob("ns").add_mesh(**kwargs)


def test_the_job_pickles_its_specification() -> None:
    job = KubernetesJob("ns", timeout=5, kubeconfig=KubeConfig.from_path("/k"))
    job.add_mesh("workers", 2, image_spec=ImageSpec("img"), labels={"a": "b"})
    job.add_mesh("found", 1, label_selector="app=x")
    copy = pickle.loads(pickle.dumps(job))
    assert copy._meshes == job._meshes
    assert copy._kubeconfig == job._kubeconfig
    assert copy._meshes["found"].template is None
    assert copy._meshes["workers"].template["metadata"]["labels"] == {"a": "b"}
