"""How ``KubernetesJob`` reaches the API server (``KubeConfig``), against the fake API server
(``_fake_kube``) without pods: a kubeconfig file (out of the cluster), the in-cluster service
account (``$KUBERNETES_SERVICE_HOST``/``_PORT``, the pod's token and CA files; the fake then
serves HTTPS), an in-memory configuration that a saved job drops and a reconnecting
specification gives back, the ``k8s://`` resolver's choice between ``$KUBECONFIG`` and
in-cluster, and the errors where none can be loaded."""

from __future__ import annotations

import logging
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")

from kubernetes import client
from kubernetes.config import incluster_config

sys.path.insert(0, str(Path(__file__).parent))
from _fake_kube import FakeKube, self_signed

from monarch.job import _resolvers
from monarch.job.kubernetes import KubeConfig, KubernetesJob

TOKEN = "in-cluster-token"


@pytest.fixture(scope="module")
def https_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKube]:
    fake = FakeKube(tls=self_signed(tmp_path_factory.mktemp("tls")))
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def in_cluster(https_kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    """This process as a pod of the fake's cluster: the service's address in the environment,
    the service account's token and the cluster CA in their files."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    assert https_kube.tls is not None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(https_kube.port))
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(https_kube.tls[0]))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    return https_kube


def _list_pods(config: KubeConfig, fake: FakeKube, namespace: str) -> str:
    """List pods through ``config``; the Authorization header the fake saw."""
    before = len(fake.requests)
    with config.api_client() as api:
        assert client.CoreV1Api(api).list_namespaced_pod(namespace).items == []
    assert fake.requests[before:] == [("GET", f"/api/v1/namespaces/{namespace}/pods")]
    return fake.authorizations[before].replace("bearer ", "Bearer ", 1)  # in-cluster: lower case


def test_in_cluster_the_service_account_reaches_the_api_server(in_cluster: FakeKube) -> None:
    config = KubeConfig()
    assert not config.out_of_cluster
    assert _list_pods(config, in_cluster, "inside") == f"Bearer {TOKEN}"


def test_in_cluster_without_a_service_account_the_error_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="in-cluster configuration"):
        KubeConfig().api_client()


def test_out_of_cluster_a_kubeconfig_file_wins(in_cluster: FakeKube, tmp_path: Path) -> None:
    plain = FakeKube()  # another API server, named only by the file
    try:
        path = plain.kubeconfig(tmp_path / "config")
        config = KubeConfig.from_path(str(path))
        assert config.out_of_cluster
        assert _list_pods(config, plain, "outside") == "Bearer fake-token"
        assert ("GET", "/api/v1/namespaces/outside/pods") not in in_cluster.requests
    finally:
        plain.close()
    with pytest.raises(RuntimeError, match=f"kubeconfig file {tmp_path / 'missing'}"):
        KubeConfig.from_path(str(tmp_path / "missing")).api_client()


def test_the_resolver_uses_kubeconfig_else_in_cluster(
    in_cluster: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _resolvers._kube_config() == KubeConfig()
    path = tmp_path / "config"
    monkeypatch.setenv("KUBECONFIG", f"{path}:/elsewhere")
    assert _resolvers._kube_config() == KubeConfig.from_path(str(path))


def test_an_in_memory_configuration_is_used_then_dropped_from_a_saved_job(
    in_cluster: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    assert in_cluster.tls is not None
    configuration = client.Configuration()
    configuration.host = in_cluster.url
    configuration.ssl_ca_cert = str(in_cluster.tls[0])
    configuration.api_key = {"authorization": "memory-token"}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    config = KubeConfig.from_config(configuration)
    assert config.out_of_cluster
    assert _list_pods(config, in_cluster, "memory") == "Bearer memory-token"
    with pytest.raises(TypeError, match="Configuration"):
        KubeConfig.from_config("not a configuration")  # type: ignore[arg-type, unused-ignore]

    job = KubernetesJob("memory", timeout=5, kubeconfig=config)
    with caplog.at_level(logging.WARNING, logger="monarch.job.kubernetes"):
        saved = pickle.loads(pickle.dumps(job))
    assert "not saved with the job" in caplog.text
    assert saved._kubeconfig.requires_rebind
    with pytest.raises(RuntimeError, match="reconnect through state"):
        saved._kubeconfig.api_client()
    saved._rebind_connection_inputs(KubernetesJob("memory", kubeconfig=config))
    assert saved._kubeconfig.remote is configuration  # the current specification's
    assert _list_pods(saved._kubeconfig, in_cluster, "memory") == "Bearer memory-token"


def test_attaching_through_a_forwarded_port_is_refused_with_the_reason() -> None:
    with pytest.raises(NotImplementedError, match="port-forward carries TCP"):
        KubernetesJob("ns", None, None, "tcp://127.0.0.1:26600")  # Monarch's 4th argument
    assert KubernetesJob("ns", 5)._timeout == 5
