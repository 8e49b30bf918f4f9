"""``KubernetesJob``: hosts as Kubernetes pods, through the official ``kubernetes`` client (the
``monarch-job[kubernetes]`` extra).

Why this shape (Monarch's ``KubernetesJob``, API-compatible in its constructor and ``add_mesh``):

- *Provisioning* meshes (``add_mesh(..., image_spec=...)`` or ``pod_template=...``): ``apply()``
  creates, per mesh, a headless Service ``NAME-svc`` and the pods ``NAME-0`` ..
  ``NAME-(N-1)`` itself (``_kube_manifests``), each running our worker loop on the pod's IP.
  The reference instead creates a ``MonarchMesh`` custom resource for its operator; we need no
  operator. ``kill()`` deletes the pods and the Service and waits (bounded) until the pods are
  gone, so no worker process is left.
- *Attach-only* meshes (neither given): pods someone else started, found by label selector;
  ``kill()`` leaves them (as the reference, which raises for them; we kill what we created and
  say so in the log).
- ``state()`` watches each mesh's pods until every rank ``0..N-1`` (from the pod label
  ``pod_rank_label``) is Ready, failing at once, with the pod and the reason, when a pod of the
  mesh crashed (restartPolicy ``Never``: a crashed worker loop is a lost host), or after
  ``timeout`` seconds naming the missing ranks. It attaches to ``udp://POD_IP:PORT`` (port from
  the pod's ``MONARCH_PORT``), retrying while the worker loops start.
- The job pickles with its specification and kubeconfig path: a later client reconnects while
  the pods run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

try:
    from kubernetes import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
        client,
        config,
        watch,
    )
    from kubernetes.client.rest import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
        ApiException,
    )
except ImportError:  # pragma: no cover - the extra is missing
    raise RuntimeError(
        "please install kubernetes to use KubernetesJob: `pip install monarch-job[kubernetes]`"
    ) from None

from monarch.actor import HostMesh
from monarch.job._attach import attach_retrying
from monarch.job._job import JobState, JobTrait
from monarch.job._kube_manifests import (
    DEFAULT_PORT,
    MAX_REPLICAS,
    RANK_LABEL,
    check_mesh_name,
    image_template,
    label_selector,
    mesh_labels,
    pod_failure,
    pod_is_ready,
    pod_port,
    pod_rank,
    service_manifest,
    worker_pod_manifest,
)

__all__ = ["ImageSpec", "KubeConfig", "KubernetesJob"]

_log = logging.getLogger("monarch.job.kubernetes")

#: Seconds ``state()`` waits for Ready pods' worker loops to accept the client.
WORKER_START_TIMEOUT: Final = 120.0
#: Seconds ``kill()`` waits for the deleted pods to be gone.
KILL_TIMEOUT: Final = 60.0


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """The container image of a provisioned mesh's worker pods, with optional resource
    requests/limits (``{"nvidia.com/gpu": 4, "memory": "64Gi"}``) and a memory-backed
    ``/dev/shm`` of ``shared_memory_size``. The image must have Python with ``monarch-job``
    installed as ``python``."""

    image: str
    resources: dict[str, str | int] | None = None
    shared_memory_size: str | None = None


@dataclasses.dataclass(frozen=True)
class KubeConfig:
    """How to reach the API server: a kubeconfig file (``KubeConfig.from_path``: out of the
    cluster, with the file's server, credentials, CA and ``proxy-url``), an in-memory client
    configuration (``KubeConfig.from_config``), else (``KubeConfig()``) the in-cluster service
    account (``$KUBERNETES_SERVICE_HOST``/``_PORT``, the pod's token and CA files)."""

    local: Path | None = None
    #: An in-memory configuration (process-local: a saved job drops it; see ``from_config``).
    remote: client.Configuration | None = dataclasses.field(default=None, compare=False)
    #: A saved job whose in-memory configuration was dropped: it needs the current
    #: specification's (``state()`` with a ``KubernetesJob`` carrying one) before it can connect.
    requires_rebind: bool = False

    @classmethod
    def from_path(cls, path: str) -> KubeConfig:
        return cls(local=Path(path).expanduser())

    @classmethod
    def from_config(cls, configuration: client.Configuration) -> KubeConfig:
        """An in-memory client configuration (``kubernetes.client.Configuration``). It is not
        saved with the job: a later client reconnects through ``state()`` of a specification
        that carries a current configuration (prefer ``from_path`` where there is a file)."""
        if not isinstance(configuration, client.Configuration):
            raise TypeError(
                f"from_config takes a kubernetes.client.Configuration, not {type(configuration)}"
            )
        return cls(remote=configuration)

    @property
    def out_of_cluster(self) -> bool:
        return self.local is not None or self.remote is not None or self.requires_rebind

    def api_client(self) -> client.ApiClient:
        """A client for this configuration (``RuntimeError`` when it cannot be loaded)."""
        if self.remote is not None:
            return client.ApiClient(self.remote)
        if self.requires_rebind:
            raise RuntimeError(
                "this saved KubernetesJob's in-memory Kubernetes configuration "
                "(KubeConfig.from_config) was not saved with it: reconnect through state() of "
                "a KubernetesJob given a current configuration"
            )
        configuration = client.Configuration()
        try:
            if self.local is not None:
                config.load_kube_config(
                    config_file=str(self.local), client_configuration=configuration
                )
            else:
                config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as exc:
            where = f"kubeconfig file {self.local}" if self.local else "in-cluster configuration"
            raise RuntimeError(f"cannot load the Kubernetes {where}: {exc}") from exc
        return client.ApiClient(configuration)


@dataclasses.dataclass(frozen=True)
class _Mesh:
    name: str
    num_replicas: int
    label_selector: str
    pod_rank_label: str
    port: int
    template: dict[str, Any] | None  # None: attach-only

    @property
    def provisioned(self) -> bool:
        return self.template is not None


class KubernetesJob(JobTrait):
    """A job whose meshes are Kubernetes pods in ``namespace`` (see the module docstring).
    ``timeout``: seconds ``state()`` waits for a mesh's pods to be Ready (None: no limit)."""

    def __init__(
        self,
        namespace: str,
        timeout: int | None = None,
        kubeconfig: KubeConfig | None = None,
        attach_to: str | None = None,
        *,
        ca: str = "trust_all_connections",
    ) -> None:
        super().__init__()
        if attach_to is not None:
            raise NotImplementedError(
                "KubernetesJob(attach_to=...): attaching through a forwarded port is not "
                "implemented (kubectl port-forward carries TCP, the worker loops speak QUIC over "
                "UDP); the client must reach the pods' IPs (run it in the cluster)"
            )
        self._namespace = namespace
        self._timeout = timeout
        self._kubeconfig = kubeconfig or KubeConfig()
        self._ca = ca
        self._meshes: dict[str, _Mesh] = {}
        self._attached: dict[str, HostMesh] = {}
        self._created_apply_id: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_attached"] = {}
        if self._kubeconfig.remote is not None:
            _log.warning(
                "the in-memory Kubernetes configuration is not saved with the job: a later "
                "client reconnects through state() of a KubernetesJob given a current one"
            )
            state["_kubeconfig"] = KubeConfig(requires_rebind=True)
        return state

    def _rebind_connection_inputs(self, spec: JobTrait) -> None:
        if isinstance(spec, KubernetesJob) and self._kubeconfig.requires_rebind:
            self._kubeconfig = spec._kubeconfig

    def add_mesh(
        self,
        name: str,
        num_replicas: int,
        label_selector: str | None = None,
        pod_rank_label: str = RANK_LABEL,
        image_spec: ImageSpec | None = None,
        port: int = DEFAULT_PORT,
        pod_template: client.V1PodTemplateSpec | Mapping[str, Any] | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """Add mesh ``name`` of ``num_replicas`` pods: provisioned from ``image_spec`` or
        ``pod_template`` (a ``V1PodTemplateSpec`` or its dict), else attach-only (pods found
        by ``label_selector``, ranked by ``pod_rank_label``). ``labels``/``annotations`` go on
        the provisioned pods."""
        check_mesh_name(name)
        if isinstance(num_replicas, bool) or not 1 <= num_replicas <= MAX_REPLICAS:
            raise ValueError(f"num_replicas must be 1 to {MAX_REPLICAS}, got {num_replicas!r}")
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is not a port")
        provisioned = image_spec is not None or pod_template is not None
        if image_spec is not None and pod_template is not None:
            raise ValueError("'image_spec' and 'pod_template' are mutually exclusive.")
        if provisioned and label_selector is not None:
            raise ValueError("'label_selector' cannot be customized when provisioning.")
        if provisioned and pod_rank_label != RANK_LABEL:
            raise ValueError("'pod_rank_label' cannot be customized when provisioning.")
        if not provisioned and (labels is not None or annotations is not None):
            raise ValueError("'labels' and 'annotations' can only be set when provisioning.")
        template: dict[str, Any] | None = None
        if image_spec is not None:
            template = image_template(
                image_spec.image, image_spec.resources, image_spec.shared_memory_size
            )
        elif pod_template is not None:
            template = (
                dict(pod_template)
                if isinstance(pod_template, Mapping)
                else client.ApiClient().sanitize_for_serialization(pod_template)
            )
        if template is not None and (labels or annotations):
            metadata = dict(template.get("metadata") or {})
            metadata["labels"] = {**(metadata.get("labels") or {}), **(labels or {})}
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **(annotations or {})}
            template = {**template, "metadata": metadata}
        selector = label_selector or _selector(mesh_labels(name))
        self._meshes[name] = _Mesh(name, num_replicas, selector, pod_rank_label, port, template)

    # -- engine hooks ---------------------------------------------------------------------------
    def _create(self, client_script: str | None) -> None:
        if client_script is not None:
            raise RuntimeError("KubernetesJob cannot run batch-mode scripts")
        if not self._meshes:
            raise ValueError("At least one mesh must be added using add_mesh()")
        apply_id = f"a{time.time_ns():x}"
        with self._kubeconfig.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            created: list[tuple[str, str]] = []  # (kind, name): only what we made is undone
            try:
                for mesh in self._meshes.values():
                    if mesh.template is not None:
                        self._create_mesh(core, mesh, apply_id, created)
            except BaseException:
                for kind, name in reversed(created):  # all or nothing
                    with contextlib.suppress(Exception):
                        _delete_object(core, kind, name, self._namespace)
                raise
        self._created_apply_id = apply_id

    def _create_mesh(
        self, core: client.CoreV1Api, mesh: _Mesh, apply_id: str, created: list[tuple[str, str]]
    ) -> None:
        assert mesh.template is not None
        labels = dict((mesh.template.get("metadata") or {}).get("labels") or {})
        service = service_manifest(mesh.name, mesh.port, labels)
        core.create_namespaced_service(self._namespace, service)
        created.append(("service", service["metadata"]["name"]))
        for rank in range(mesh.num_replicas):
            body = worker_pod_manifest(mesh.name, rank, mesh.port, mesh.template, apply_id)
            core.create_namespaced_pod(self._namespace, body)
            created.append(("pod", body["metadata"]["name"]))
        _log.info(
            "created mesh %s: service %s-svc and %d pods in namespace %s",
            mesh.name, mesh.name, mesh.num_replicas, self._namespace,
        )  # fmt: skip

    def _state(self) -> JobState:
        meshes: dict[str, HostMesh] = {}
        with self._kubeconfig.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            ready = {
                m.name: self._wait_for_ready_pods(core, m, self._timeout)
                for m in self._meshes.values()
            }
        try:
            for mesh in self._meshes.values():
                workers = [f"udp://{ip}:{port}" for ip, port in ready[mesh.name]]
                meshes[mesh.name] = attach_retrying(
                    mesh.name,
                    workers,
                    ca=self._ca,
                    alive=functools.partial(self._pods_alive, mesh),
                    timeout=WORKER_START_TIMEOUT,
                    where=f"namespace {self._namespace}",
                )
        except BaseException:
            for attached in meshes.values():
                with contextlib.suppress(Exception):
                    attached.stop().get(timeout=10)
            raise
        self._attached.update(meshes)
        return JobState(meshes)

    def _kill(self) -> None:
        for attached in self._attached.values():
            with contextlib.suppress(Exception):
                attached.kill().get(timeout=10)
        self._attached.clear()
        provisioned = [m for m in self._meshes.values() if m.provisioned]
        skipped = [m.name for m in self._meshes.values() if not m.provisioned]
        if skipped:
            _log.warning(
                "kill() leaves the attach-only meshes %s (their pods are not ours)", skipped
            )
        if not provisioned:
            return
        with self._kubeconfig.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            for mesh in provisioned:
                self._delete_mesh(core, mesh)
            deadline = time.monotonic() + KILL_TIMEOUT
            interval = 0.05
            while any(self._list_pods(core, m) for m in provisioned):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the pods of {[m.name for m in provisioned]} are still listed "
                        f"{KILL_TIMEOUT:g} s after their deletion"
                    )
                time.sleep(interval)  # deletion has a grace period: poll with back-off
                interval = min(interval * 2, 1.0)
        _log.info("deleted the pods and services of %s", [m.name for m in provisioned])
        self._created_apply_id = None

    def can_run(self, spec: JobTrait) -> bool:
        if not (
            isinstance(spec, KubernetesJob)
            and spec._namespace == self._namespace
            and spec._meshes == self._meshes
            and self.active
        ):
            return False
        try:
            with self._kubeconfig.api_client() as api_client:
                core = client.CoreV1Api(api_client)
                for mesh in self._meshes.values():
                    self._wait_for_ready_pods(core, mesh, 5)
        except RuntimeError:
            return False
        return True

    # -- pods -----------------------------------------------------------------------------------
    def _delete_mesh(self, core: client.CoreV1Api, mesh: _Mesh) -> None:
        for rank in range(mesh.num_replicas):
            _delete_object(core, "pod", f"{mesh.name}-{rank}", self._namespace)
        _delete_object(core, "service", f"{mesh.name}-svc", self._namespace)

    def _list_pods(self, core: client.CoreV1Api, mesh: _Mesh) -> list[dict[str, Any]]:
        listed = core.list_namespaced_pod(self._namespace, label_selector=mesh.label_selector)
        return [_as_dict(p) for p in listed.items]

    def _pods_alive(self, mesh: _Mesh) -> bool:
        try:
            with self._kubeconfig.api_client() as api_client:
                pods = self._list_pods(client.CoreV1Api(api_client), mesh)
        except (ApiException, OSError):
            return True  # cannot tell: keep trying until the attach times out
        return bool(pods) and not any(pod_failure(p) for p in pods)

    def _wait_for_ready_pods(
        self, core: client.CoreV1Api, mesh: _Mesh, timeout: float | None
    ) -> list[tuple[str, int]]:
        """``(pod IP, port)`` of ranks ``0..N-1`` once all are Ready (see the module docstring)."""
        ready: dict[int, tuple[str, int]] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            left = None if deadline is None else max(1, int(deadline - time.monotonic() + 0.999))
            w = watch.Watch()
            try:
                for event in w.stream(
                    core.list_namespaced_pod,
                    namespace=self._namespace,
                    label_selector=mesh.label_selector,
                    timeout_seconds=left,
                ):
                    if event["type"] == "ERROR":
                        raise RuntimeError(
                            f"watching the pods of mesh {mesh.name} failed: {event['object']}"
                        )
                    pod = _as_dict(event["object"])
                    name = (pod.get("metadata") or {}).get("name")
                    try:
                        rank = pod_rank(pod, mesh.pod_rank_label)
                    except ValueError as exc:
                        _log.warning("skipping a pod of mesh %s: %s", mesh.name, exc)
                        continue
                    if not 0 <= rank < mesh.num_replicas:
                        _log.warning(
                            "skipping pod %s: rank %d outside 0..%d",
                            name,
                            rank,
                            mesh.num_replicas - 1,
                        )
                        continue
                    if event["type"] == "DELETED":
                        ready.pop(rank, None)
                        continue
                    failure = pod_failure(pod)
                    if failure is not None:
                        raise RuntimeError(
                            f"pod {name} (rank {rank}) of mesh {mesh.name} crashed: {failure}"
                        )
                    if pod_is_ready(pod):
                        ready[rank] = (pod["status"]["podIP"], pod_port(pod, mesh.port))
                        if len(ready) == mesh.num_replicas:
                            _log.info("mesh %s: all %d pods Ready", mesh.name, mesh.num_replicas)
                            return [ready[r] for r in range(mesh.num_replicas)]
                    else:
                        ready.pop(rank, None)
            except ApiException as exc:
                raise RuntimeError(f"watching the pods of mesh {mesh.name} failed: {exc}") from exc
            finally:
                w.stop()
        missing = sorted(set(range(mesh.num_replicas)) - set(ready))
        raise RuntimeError(
            f"mesh {mesh.name}: {len(ready)}/{mesh.num_replicas} pods Ready after {timeout} s; "
            f"missing ranks {missing} (selector {mesh.label_selector})"
        )


def _selector(labels: Mapping[str, str]) -> str:
    return label_selector(labels)


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    serialized: dict[str, Any] = client.ApiClient().sanitize_for_serialization(obj)
    return serialized


def _delete_object(core: client.CoreV1Api, kind: str, name: str, namespace: str) -> None:
    """Delete a pod or service; one already gone is fine."""
    try:
        if kind == "pod":
            core.delete_namespaced_pod(name, namespace)
        else:
            core.delete_namespaced_service(name, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
