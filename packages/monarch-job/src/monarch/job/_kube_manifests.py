"""The Kubernetes objects ``KubernetesJob`` creates and what it reads back from pods, as plain
dicts (sans-IO: no client, no network).

A provisioned mesh ``NAME`` of ``N`` replicas is a headless Service ``NAME-svc`` and the pods
``NAME-0`` .. ``NAME-(N-1)``, like a StatefulSet's: each pod has ``hostname``/``subdomain`` so
it has the stable DNS name ``NAME-RANK.NAME-svc.NAMESPACE.svc``, and the labels
``app.kubernetes.io/name=monarch-worker``, ``monarch.pytorch.org/mesh-name=NAME`` and
``apps.kubernetes.io/pod-index=RANK`` (the rank the client orders the mesh by). Its ``worker``
container runs ``python -m monarch.job._host_worker --port PORT``, which listens on the pod's IP
(``$MONARCH_HOST_IP`` from the downward API); ``MONARCH_PORT`` tells a client the port. Its
readiness probe tests the file the worker loop creates once it listens, so a Ready pod is one a
client can attach to.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "MESH_LABEL",
    "NAME_LABEL",
    "RANK_LABEL",
    "WORKER_NAME",
    "mesh_labels",
    "pod_failure",
    "pod_is_ready",
    "pod_port",
    "pod_rank",
    "service_manifest",
    "worker_pod_manifest",
]

NAME_LABEL: Final = "app.kubernetes.io/name"
WORKER_NAME: Final = "monarch-worker"
MESH_LABEL: Final = "monarch.pytorch.org/mesh-name"
RANK_LABEL: Final = "apps.kubernetes.io/pod-index"
APPLY_LABEL: Final = "monarch.pytorch.org/apply-id"
DEFAULT_PORT: Final = 26600
MAX_REPLICAS: Final = 1024
_WORKER_ENV: Final = frozenset(
    {"MONARCH_PORT", "MONARCH_HOST_IP", "MONARCH_POD_NAME", "MONARCH_READY_FILE"}
)
#: The file the worker loop creates once it listens; the pod's readiness probe tests it.
READY_FILE: Final = "/tmp/monarch-worker-ready"
_DNS_LABEL = re.compile(r"^[a-z]([a-z0-9]{0,61}[a-z0-9])?$")


def check_mesh_name(name: str) -> str:
    """``name`` if it is a valid mesh name (RFC 1123 label, lowercase alphanumerics, starting
    with a letter: it names pods and a service), else ``ValueError`` saying why."""
    if not isinstance(name, str) or not _DNS_LABEL.match(name):
        raise ValueError(
            f"Mesh name {name!r} is invalid: it must have 1 to 63 lowercase alphanumeric "
            "characters and start with a letter"
        )
    if len(name) + len(f"-{MAX_REPLICAS}") > 63:
        raise ValueError(f"Mesh name {name!r} is too long to name its pods (at most 58 characters)")
    return name


def mesh_labels(mesh: str) -> dict[str, str]:
    """The labels every pod of ``mesh`` carries (its Service selects them)."""
    return {NAME_LABEL: WORKER_NAME, MESH_LABEL: mesh}


def label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def worker_command(port: int) -> list[str]:
    return ["python", "-m", "monarch.job._host_worker", "--port", str(port)]


def worker_pod_manifest(
    mesh: str,
    rank: int,
    port: int,
    template: Mapping[str, Any],
    apply_id: str,
) -> dict[str, Any]:
    """The pod of ``mesh``'s rank ``rank`` from a pod template (``{"metadata": ..., "spec":
    ...}``, a ``V1PodTemplateSpec`` as a dict): the template's labels, annotations and spec, plus
    the mesh's labels, the rank, the stable host name, and the worker container's command, port
    and environment (the container named ``worker``, else the first; a command the template
    gives is kept)."""
    metadata = dict(template.get("metadata") or {})
    spec = copy.deepcopy(dict(template.get("spec") or {}))
    containers = spec.get("containers") or []
    if not containers:
        raise ValueError(f"the pod template of mesh {mesh!r} has no container")
    container = next((c for c in containers if c.get("name") == "worker"), containers[0])
    if not container.get("command"):
        container["command"] = worker_command(port)
    env = [e for e in container.get("env") or [] if e.get("name") not in _WORKER_ENV]
    env += [
        {"name": "MONARCH_PORT", "value": str(port)},
        {"name": "MONARCH_HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "MONARCH_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    env.append({"name": "MONARCH_READY_FILE", "value": READY_FILE})
    container["env"] = env
    container.setdefault(
        "readinessProbe",
        {
            "exec": {"command": ["test", "-f", READY_FILE]},
            "periodSeconds": 1,
            "failureThreshold": 1,
        },
    )
    ports = [p for p in container.get("ports") or [] if p.get("name") != "monarch"]
    container["ports"] = [*ports, {"name": "monarch", "containerPort": port, "protocol": "UDP"}]
    spec["containers"] = containers
    spec["hostname"] = f"{mesh}-{rank}"
    spec["subdomain"] = f"{mesh}-svc"
    spec.setdefault("restartPolicy", "Never")  # a worker loop that exits ends its host
    labels = {**(metadata.get("labels") or {}), **mesh_labels(mesh)}
    labels[RANK_LABEL] = str(rank)
    labels[APPLY_LABEL] = apply_id
    pod_metadata: dict[str, Any] = {"name": f"{mesh}-{rank}", "labels": labels}
    if metadata.get("annotations"):
        pod_metadata["annotations"] = dict(metadata["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": spec}


def image_template(
    image: str, resources: Mapping[str, str | int] | None, shared_memory_size: str | None
) -> dict[str, Any]:
    """The pod template of an ``ImageSpec``: one ``worker`` container of ``image`` with
    ``resources`` as requests and limits, and a memory-backed ``/dev/shm`` when asked."""
    container: dict[str, Any] = {"name": "worker", "image": image}
    spec: dict[str, Any] = {"containers": [container]}
    if resources:
        values = {str(k): str(v) for k, v in resources.items()}
        container["resources"] = {"requests": values, "limits": dict(values)}
    if shared_memory_size is not None:
        container["volumeMounts"] = [{"name": "dev-shm", "mountPath": "/dev/shm"}]
        spec["volumes"] = [
            {"name": "dev-shm", "emptyDir": {"medium": "Memory", "sizeLimit": shared_memory_size}}
        ]
    return {"spec": spec}


def service_manifest(mesh: str, port: int, labels: Mapping[str, str]) -> dict[str, Any]:
    """The headless Service that gives ``mesh``'s pods stable DNS names (ready or not)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{mesh}-svc", "labels": {**labels, **mesh_labels(mesh)}},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": mesh_labels(mesh),
            "ports": [{"name": "monarch", "port": port, "protocol": "UDP"}],
        },
    }


# -- reading pods (dicts as the API returns them) -------------------------------------------------
def pod_rank(pod: Mapping[str, Any], rank_label: str) -> int:
    """The pod's rank from ``rank_label`` (``ValueError`` when missing or not an integer)."""
    metadata = pod.get("metadata") or {}
    value = (metadata.get("labels") or {}).get(rank_label)
    if value is None:
        raise ValueError(f"pod {metadata.get('name')} has no label {rank_label!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"pod {metadata.get('name')} has rank {value!r}, not an int") from None


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's ``Ready`` condition is ``True`` and it has an IP."""
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return ready and bool(status.get("podIP"))


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why the pod can no longer serve (``Failed``/``Succeeded``, or a container that
    terminated), or None."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        terminated = state.get("terminated")
        if terminated:
            reason = terminated.get("reason") or "no reason"
            return (
                f"container {container.get('name')} terminated "
                f"(exit code {terminated.get('exitCode')}, {reason})"
            )
    if phase in ("Failed", "Succeeded"):
        return (
            f"phase {phase}: {status.get('reason') or status.get('message') or 'no reason given'}"
        )
    return None


def pod_port(pod: Mapping[str, Any], default: int) -> int:
    """The worker port: ``MONARCH_PORT`` in a container's environment, else ``default``."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == "MONARCH_PORT" and env.get("value"):
                try:
                    return int(env["value"])
                except ValueError:
                    break
    return default
