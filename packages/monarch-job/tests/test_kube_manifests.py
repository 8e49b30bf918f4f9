"""The Kubernetes objects are valid Kubernetes objects: a schema check of the manifest shipped
for ``kubectl apply`` (``monarch/job/manifests/monarch-workers.yaml``) and of the pods and
services ``KubernetesJob`` creates, against the API models of the official client (every field
known, of its type, required fields present), and the shipped manifest kept in step with the
code (labels, command, environment, probe)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import monarch.job
from monarch.job._kube_manifests import (
    image_template,
    mesh_labels,
    service_manifest,
    worker_pod_manifest,
)

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")
yaml = pytest.importorskip("yaml", reason="PyYAML comes with the kubernetes extra")


client = kubernetes.client
MANIFEST = Path(monarch.job.__file__).parent / "manifests" / "monarch-workers.yaml"
_SCALARS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "object": (str, int, float, bool, dict, list),  # IntOrString, quantities, raw JSON
    "datetime": (str,),
    "date": (str,),
}


def schema_problems(value: Any, type_name: str, path: str = "") -> list[str]:
    """Where ``value`` (JSON as the API takes it) breaks the client's model ``type_name``."""
    if match := re.fullmatch(r"List\[(.+)\]", type_name):
        if not isinstance(value, list):
            return [f"{path}: a list expected, got {type(value).__name__}"]
        return [
            p for i, v in enumerate(value) for p in schema_problems(v, match[1], f"{path}[{i}]")
        ]
    if match := re.fullmatch(r"Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            return [f"{path}: a map expected, got {type(value).__name__}"]
        return [p for k, v in value.items() for p in schema_problems(v, match[1], f"{path}.{k}")]
    if type_name in _SCALARS:
        ok = isinstance(value, _SCALARS[type_name])
        if type_name in ("int", "float") and isinstance(value, bool):
            ok = False
        return [] if ok else [f"{path}: {type_name} expected, got {value!r}"]
    model = getattr(client, type_name)
    if not isinstance(value, dict):
        return [f"{path}: a {type_name} object expected, got {type(value).__name__}"]
    fields = {json_key: attr for attr, json_key in model.attribute_map.items()}
    problems = [f"{path}.{key}: no such field of {type_name}" for key in value if key not in fields]
    for key, item in value.items():
        if key in fields:
            problems += schema_problems(item, model.openapi_types[fields[key]], f"{path}.{key}")
    if not problems:  # the model's own checks: required fields, enumerations
        try:
            client.ApiClient()._ApiClient__deserialize(value, type_name)
        except ValueError as exc:
            problems.append(f"{path}: {exc}")
    return problems


def test_the_checker_finds_unknown_fields_wrong_types_and_missing_required_ones() -> None:
    assert schema_problems({"metadata": {"name": "p"}, "spec": {"containers": []}}, "V1Pod") == []
    assert schema_problems({"spec": {"containerz": []}}, "V1Pod") == [
        ".spec.containerz: no such field of V1PodSpec"
    ]
    assert schema_problems({"spec": {"containers": [{"name": 3}]}}, "V1Pod") == [
        ".spec.containers[0].name: str expected, got 3"
    ]
    missing = schema_problems({"spec": {"containers": [{"image": "x"}]}}, "V1Pod")
    assert len(missing) == 1
    assert "name" in missing[0]


def test_the_shipped_manifest_is_a_valid_service_and_statefulset() -> None:
    service, statefulset = yaml.safe_load_all(MANIFEST.read_text())
    assert (service["kind"], statefulset["kind"]) == ("Service", "StatefulSet")
    assert schema_problems(service, "V1Service") == []
    assert schema_problems(statefulset, "V1StatefulSet") == []


def test_the_shipped_manifest_matches_what_the_job_creates() -> None:
    service, statefulset = yaml.safe_load_all(MANIFEST.read_text())
    port = 26600
    assert service == service_manifest("workers", port, {})
    template = statefulset["spec"]["template"]
    assert template["metadata"]["labels"] == mesh_labels("workers")
    assert statefulset["spec"]["selector"]["matchLabels"] == mesh_labels("workers")
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    (shipped,) = template["spec"]["containers"]
    image = image_template(shipped["image"], {"cpu": 1, "memory": "2Gi"}, None)
    (made,) = worker_pod_manifest("workers", 0, port, image, "x")["spec"]["containers"]
    assert shipped == made


def test_the_pods_and_services_the_job_creates_are_valid() -> None:
    templates = [
        image_template("img", {"nvidia.com/gpu": 8, "memory": "64Gi"}, "16Gi"),
        client.ApiClient().sanitize_for_serialization(
            client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"a": "b"}),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="worker", image="w")],
                    tolerations=[client.V1Toleration(key="gpu", operator="Exists")],
                ),
            )
        ),
    ]
    for template in templates:
        pod = worker_pod_manifest("trainers", 1, 4000, template, "apply")
        assert schema_problems(pod, "V1Pod") == []
    assert schema_problems(service_manifest("trainers", 4000, {"a": "b"}), "V1Service") == []
