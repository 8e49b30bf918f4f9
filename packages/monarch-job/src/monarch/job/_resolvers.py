"""Cluster resolvers, a Chrysalis plugin: ``slurm://JOBID[/NODE]`` and
``k8s://NAMESPACE/SERVICE[/POD]`` to the worker loops of a running job.

Registered in the ``chrysalis`` entry-point group of this distribution (``pyproject.toml``), so
with monarch-job installed the ``chrysalis`` command (``join``, ``ls``, ``ping``) and
``attach_to_workers(workers=["slurm://JOBID"])`` accept these URLs; code that runs without the
installed distribution registers it with ``chrysalis.core.default_registry().register(
monarch.job._resolvers)``.

What a URL resolves to: every worker loop of the job is a Chrysalis root node (its own
namespace). The resolver returns, as ``JoinSettings``, the first worker loop's address (the job's
*root*: the first node of the allocation, or rank 0; what ``join`` and ``ping`` contact) and,
as the ``members.N`` options (``chrysalis.node.member_options``), every worker loop, named by
its Slurm node or pod, in allocation (rank) order: ``attach_to_workers`` attaches to all of
them and ``chrysalis ls`` lists the nodes under each. With ``/NODE`` or ``/POD``, only that one.

Unlike the join-token resolvers, these ask the cluster (``squeue``/``scontrol``, the Kubernetes
API through the official client), bounded by each command's timeout, and fail with
``RuntimeError`` naming the job when it is not running or not ready; URL syntax errors are
``ValueError`` (``monarch.job._cluster_url``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, Final

from chrysalis.core import AddressResolverSpec, DatagramAddr, JoinSettings, hookimpl
from chrysalis.node import member_options
from monarch.job._cluster_url import (
    KubeTarget,
    SlurmTarget,
    parse_cluster_url,
    worker_port_in_comment,
    worker_port_in_script,
)
from monarch.job._kube_manifests import DEFAULT_PORT, RANK_LABEL, pod_is_ready, pod_port
from monarch.job._slurm_text import node_addrs, parse_squeue

__all__ = ["chrysalis_address_resolvers", "resolve_k8s", "resolve_slurm"]


def _ip(host: str, where: str) -> str:
    """``host`` as an IP literal (a node address may be a host name)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise RuntimeError(f"{where}: cannot resolve the host name {host!r}: {exc}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first
    return str(infos[0][4][0])


def _settings(members: Sequence[tuple[str, str, int]]) -> JoinSettings:
    addresses = [
        (name, DatagramAddr.parse(f"udp://[{ip}]:{port}" if ":" in ip else f"udp://{ip}:{port}"))
        for name, ip, port in members
    ]
    return JoinSettings(addresses[0][1], None, member_options(addresses))


def resolve_slurm(url: str) -> JoinSettings:
    """``slurm://JOBID[/NODE][?port=N]``: the worker loops of a running Slurm job (see the
    module docstring)."""
    target = parse_cluster_url(url)
    if not isinstance(target, SlurmTarget):
        raise ValueError(f"{url!r} is not a slurm:// URL")
    from monarch.job._slurm import _run

    job = f"Slurm job {target.job_id}"
    try:
        listed = parse_squeue(_run(["squeue", "-h", "-j", target.job_id, "-o", "%T|%N"]))
    except RuntimeError as exc:
        if "Invalid job id" not in str(exc):
            raise
        listed = None
    if listed is None:
        raise RuntimeError(f"{job} is not listed by squeue")
    state, nodelist = listed
    if state != "RUNNING" or not nodelist:
        raise RuntimeError(f"{job} is not running (state {state})")
    names = _run(["scontrol", "show", "hostnames", nodelist]).split()
    if target.node is not None:
        if target.node not in names:
            raise RuntimeError(f"{job} does not run on node {target.node!r} (it runs on {names})")
        names = [target.node]
    addrs = node_addrs(_run(["scontrol", "show", "node", "-o", ",".join(names)]), names)
    port = target.port
    if port is None:  # a job allocated with salloc names it in its comment (no batch script)
        port = worker_port_in_comment(_run(["squeue", "-h", "-j", target.job_id, "-o", "%k"]))
    if port is None:
        try:
            port = worker_port_in_script(
                _run(["scontrol", "write", "batch_script", target.job_id, "-"])
            )
        except RuntimeError:  # not ours to read (another user's job): Monarch's default
            port = worker_port_in_script("")
    return _settings([(n, _ip(a, job), port) for n, a in zip(names, addrs, strict=True)])


def _kube_config() -> Any:
    from monarch.job.kubernetes import KubeConfig

    path = os.environ.get("KUBECONFIG")
    return KubeConfig.from_path(path.split(os.pathsep)[0]) if path else KubeConfig()


def _rank(pod: dict[str, Any]) -> tuple[int, str]:
    metadata = pod.get("metadata") or {}
    value = (metadata.get("labels") or {}).get(RANK_LABEL, "")
    rank = int(value) if value.isdigit() else 1 << 30
    return rank, str(metadata.get("name"))


def resolve_k8s(url: str) -> JoinSettings:
    """``k8s://NAMESPACE/SERVICE[/POD][?port=N]``: the Ready pods the service selects, by rank
    (``KUBECONFIG``, else the in-cluster configuration; see the module docstring)."""
    target = parse_cluster_url(url)
    if not isinstance(target, KubeTarget):
        raise ValueError(f"{url!r} is not a k8s:// URL")
    from kubernetes import client  # type: ignore[import-not-found, import-untyped, unused-ignore]
    from kubernetes.client.rest import (  # type: ignore[import-not-found, import-untyped, unused-ignore]
        ApiException,
    )

    where = f"service {target.namespace}/{target.service}"
    try:
        with _kube_config().api_client() as api_client:
            core = client.CoreV1Api(api_client)
            service = api_client.sanitize_for_serialization(
                core.read_namespaced_service(target.service, target.namespace)
            )
            spec = service.get("spec") or {}
            selector = spec.get("selector") or {}
            if not selector:
                raise RuntimeError(f"{where} has no pod selector")
            ports = spec.get("ports") or []
            default = int(ports[0].get("targetPort") or ports[0]["port"]) if ports else DEFAULT_PORT
            listed = core.list_namespaced_pod(
                target.namespace, label_selector=",".join(f"{k}={v}" for k, v in selector.items())
            )
            pods = [api_client.sanitize_for_serialization(p) for p in listed.items]
    except ApiException as exc:
        raise RuntimeError(
            f"{where}: the Kubernetes API answered {exc.status} {exc.reason}"
        ) from None
    except OSError as exc:
        raise RuntimeError(f"{where}: cannot reach the Kubernetes API: {exc}") from None
    if target.pod is not None:
        pods = [p for p in pods if (p.get("metadata") or {}).get("name") == target.pod]
        if not pods:
            raise RuntimeError(f"{where} selects no pod {target.pod!r}")
    ready = sorted((p for p in pods if pod_is_ready(p)), key=_rank)
    if not ready:
        raise RuntimeError(f"{where} selects no Ready pod (of {len(pods)})")
    return _settings(
        [
            (
                str(p["metadata"]["name"]),
                str(p["status"]["podIP"]),
                target.port or pod_port(p, default),
            )
            for p in ready
        ]
    )


_RESOLVERS: Final = (
    AddressResolverSpec("slurm", resolve_slurm, "slurm://JOBID[/NODE]: a Slurm job's worker loops"),
    AddressResolverSpec(
        "k8s", resolve_k8s, "k8s://NAMESPACE/SERVICE[/POD]: a Kubernetes service's worker pods"
    ),
)


@hookimpl
def chrysalis_address_resolvers() -> Sequence[AddressResolverSpec]:
    """The ``slurm`` and ``k8s`` cluster resolvers."""
    return _RESOLVERS
