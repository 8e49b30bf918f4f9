"""Cluster URLs, without asking any cluster (sans-IO): ``slurm://JOBID[/NODE][?port=N]`` and
``k8s://NAMESPACE/SERVICE[/POD][?port=N]``, and the text the Slurm commands print about them.

Grammar (one spelling per meaning; ``ValueError`` naming the URL and the part for anything
else)::

    slurm = "slurm://" JOBID [ "/" NODE ] [ "?port=" PORT ]
    k8s   = "k8s://" NAMESPACE "/" SERVICE [ "/" POD ] [ "?port=" PORT ]

``JOBID``: 1 to 12 digits; ``NODE``: a Slurm node name, 1 to 64 of ``[A-Za-z0-9._-]`` starting
with a letter or digit; ``NAMESPACE`` and ``SERVICE``: DNS-1123 labels (at most 63 lowercase
letters, digits and ``-``, starting and ending alphanumeric); ``POD``: a DNS-1123 subdomain (at
most 253 characters: labels joined by ``.``); ``PORT``: 1 to 65535, no leading zero. Without
``?port=``, the port is read from the job (the worker loop's ``--port`` in the Slurm batch
script, ``MONARCH_PORT`` or the service's port in Kubernetes).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_SLURM_PORT",
    "MAX_URL_LENGTH",
    "PORT_COMMENT",
    "KubeTarget",
    "SlurmTarget",
    "parse_cluster_url",
    "worker_port_in_comment",
    "worker_port_in_script",
]

#: Longest cluster URL accepted, in characters.
MAX_URL_LENGTH: Final = 512
#: ``SlurmJob``'s (and Monarch's) default ``monarch_port``.
DEFAULT_SLURM_PORT: Final = 22222

_JOB_ID: Final = re.compile(r"[0-9]{1,12}")
_NODE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]{0,63}")
_LABEL: Final = re.compile(r"[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?")
_PORT: Final = re.compile(r"[1-9][0-9]{0,4}")


@dataclass(frozen=True, slots=True)
class SlurmTarget:
    """``slurm://JOBID[/NODE][?port=N]``: the worker loops of Slurm job ``job_id`` (only the one
    on ``node`` when given), listening on ``port`` (None: as the job's batch script says)."""

    job_id: str
    node: str | None = None
    port: int | None = None


@dataclass(frozen=True, slots=True)
class KubeTarget:
    """``k8s://NAMESPACE/SERVICE[/POD][?port=N]``: the worker pods selected by ``service`` in
    ``namespace`` (only ``pod`` when given)."""

    namespace: str
    service: str
    pod: str | None = None
    port: int | None = None


def _bad(url: str, why: str) -> ValueError:
    shown = url if len(url) <= 80 else url[:77] + "..."
    return ValueError(f"cluster URL {shown!r}: {why}")


def _port(url: str, query: str) -> int | None:
    if not query:
        return None
    key, sep, value = query.partition("=")
    if key != "port" or not sep:
        raise _bad(url, "the only query it takes is '?port=N'")
    if _PORT.fullmatch(value) is None or int(value) > 65535:
        raise _bad(url, f"port {value!r} is not 1 to 65535")
    return int(value)


def _is_subdomain(name: str) -> bool:
    return len(name) <= 253 and all(_LABEL.fullmatch(part) for part in name.split("."))


def parse_cluster_url(url: str) -> SlurmTarget | KubeTarget:
    """The target ``url`` names (see the module docstring); ``ValueError`` when malformed."""
    if not isinstance(url, str):
        raise TypeError(f"a cluster URL is a str, not {type(url).__name__}")
    if len(url) > MAX_URL_LENGTH:
        raise _bad(url, f"longer than {MAX_URL_LENGTH} characters")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise _bad(url, "expected slurm://JOBID[/NODE] or k8s://NAMESPACE/SERVICE[/POD]")
    path, qsep, query = rest.partition("?")
    if qsep and not query:
        raise _bad(url, "an empty query")
    port = _port(url, query)
    parts = path.split("/")
    if scheme == "slurm":
        if not 1 <= len(parts) <= 2:
            raise _bad(url, "expected slurm://JOBID[/NODE]")
        if _JOB_ID.fullmatch(parts[0]) is None:
            raise _bad(url, f"job id {parts[0]!r} is not 1 to 12 digits")
        node = parts[1] if len(parts) == 2 else None
        if node is not None and _NODE.fullmatch(node) is None:
            raise _bad(url, f"node name {node!r} is not 1-64 of [A-Za-z0-9._-]")
        return SlurmTarget(parts[0], node, port)
    if scheme == "k8s":
        if not 2 <= len(parts) <= 3:
            raise _bad(url, "expected k8s://NAMESPACE/SERVICE[/POD]")
        for what, value in (("namespace", parts[0]), ("service", parts[1])):
            if _LABEL.fullmatch(value) is None:
                raise _bad(url, f"{what} {value!r} is not a DNS-1123 label")
        pod = parts[2] if len(parts) == 3 else None
        if pod is not None and not _is_subdomain(pod):
            raise _bad(url, f"pod name {pod!r} is not a DNS-1123 subdomain")
        return KubeTarget(parts[0], parts[1], pod, port)
    raise _bad(url, f"unknown scheme {scheme!r} (slurm or k8s)")


#: What a ``SlurmJob`` allocated with ``salloc`` (no batch script) says in its comment.
PORT_COMMENT: Final = "monarch_port="


def worker_port_in_comment(comment: str) -> int | None:
    """The worker loops' port in the comment of a job ``SlurmJob`` allocated with ``salloc``
    (``monarch_port=N``, ``squeue -o %k``, anywhere in it: ``SlurmJob`` adds it after the
    user's own comment, so the last one counts); None when it names none."""
    found = None
    for word in comment.replace(",", " ").split():
        value = word.removeprefix(PORT_COMMENT)
        if value != word and _PORT.fullmatch(value) and int(value) <= 65535:
            found = int(value)
    return found


def worker_port_in_script(script: str) -> int:
    """The ``--port`` of the worker loop in a ``SlurmJob`` batch script (``scontrol write
    batch_script JOBID -``), else ``DEFAULT_SLURM_PORT``."""
    for line in script.splitlines():
        if not line.lstrip().startswith(("exec srun", "srun")):
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        for index, word in enumerate(words[:-1]):
            value = words[index + 1]
            if word == "--port" and _PORT.fullmatch(value) and int(value) <= 65535:
                return int(value)
    return DEFAULT_SLURM_PORT
