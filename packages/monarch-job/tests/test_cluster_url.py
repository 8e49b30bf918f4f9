"""The sans-IO cluster URL parser (``monarch.job._cluster_url``): every well-formed URL parses
to what it names and prints back; anything else is a ``ValueError`` naming the URL."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.job._cluster_url import (
    DEFAULT_SLURM_PORT,
    KubeTarget,
    SlurmTarget,
    parse_cluster_url,
    worker_port_in_script,
)

job_ids = st.from_regex(r"[0-9]{1,12}", fullmatch=True)
nodes = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,63}", fullmatch=True)
labels = st.from_regex(r"[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?", fullmatch=True)
ports = st.none() | st.integers(1, 65535)


def _query(port: int | None) -> str:
    return "" if port is None else f"?port={port}"


@given(job_ids, st.none() | nodes, ports)
def test_slurm_urls_parse_to_what_they_name(job: str, node: str | None, port: int | None) -> None:
    url = f"slurm://{job}" + ("" if node is None else f"/{node}") + _query(port)
    assert parse_cluster_url(url) == SlurmTarget(job, node, port)


@given(labels, labels, st.none() | st.lists(labels, min_size=1, max_size=3).map(".".join), ports)
def test_k8s_urls_parse_to_what_they_name(
    namespace: str, service: str, pod: str | None, port: int | None
) -> None:
    url = f"k8s://{namespace}/{service}" + ("" if pod is None else f"/{pod}") + _query(port)
    assert parse_cluster_url(url) == KubeTarget(namespace, service, pod, port)


@given(st.text(max_size=80))
def test_any_other_text_is_a_value_error_or_a_target(text: str) -> None:
    for url in (text, f"slurm://{text}", f"k8s://{text}"):
        outcome: object
        try:
            outcome = parse_cluster_url(url)
        except ValueError as exc:
            outcome = exc
        if isinstance(outcome, ValueError):
            assert "cluster URL" in str(outcome)
        else:
            assert isinstance(outcome, SlurmTarget | KubeTarget)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("slurm:12", "expected slurm://"),
        ("slurm://", "job id"),
        ("slurm://12a", "job id '12a'"),
        ("slurm://1234567890123", "job id"),
        ("slurm://12/n1/x", "expected slurm://JOBID"),
        ("slurm://12/-n1", "node name"),
        ("slurm://12?port=0", "port '0'"),
        ("slurm://12?port=65536", "port"),
        ("slurm://12?port=022", "port"),
        ("slurm://12?host=x", "only query"),
        ("slurm://12?", "empty query"),
        ("k8s://ns", "expected k8s://"),
        ("k8s://NS/svc", "namespace 'NS'"),
        ("k8s://ns/svc-", "service 'svc-'"),
        ("k8s://ns/svc/Pod", "pod name"),
        ("k8s://ns/svc/p/q", "expected k8s://"),
        ("nomad://x", "unknown scheme"),
        ("slurm://" + "1" * 600, "longer than"),
    ],
)
def test_malformed_urls_say_what_is_wrong(url: str, why: str) -> None:
    with pytest.raises(ValueError, match="cluster URL") as caught:
        parse_cluster_url(url)
    assert why in str(caught.value)


def test_the_worker_port_comes_from_the_batch_script_s_srun_line() -> None:
    script = (
        "#!/bin/bash\n#SBATCH --nodes=2\n# --port 1\n"
        "exec srun --nodes=2 /usr/bin/python -m monarch.job._host_worker --port 31337 "
        "--slurm-node-addr\n"
    )
    assert worker_port_in_script(script) == 31337
    assert worker_port_in_script("#!/bin/bash\nsrun hostname\n") == DEFAULT_SLURM_PORT
    assert worker_port_in_script("srun x --port 99999\n") == DEFAULT_SLURM_PORT
