"""What a job asks for, checked (sans-IO: no processes, sockets or clocks here).

A job names its host meshes: ``{"trainers": 2, "dataloaders": 1}`` (mesh name -> number of
hosts), and may give each a per-host process layout (``MeshSpec(hosts=2, per_host={"gpus":
4})``), which ``JobState.layout(name)`` hands back for ``spawn_procs``. Every engine normalises
its ``meshes`` argument here, so the same bad input fails the same way whatever the engine, and
names its hosts ``<mesh>_<rank>`` in mesh order (the order of the ``hosts`` dimension).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, NamedTuple

__all__ = [
    "MAX_HOSTS_PER_JOB",
    "MAX_MESHES",
    "MeshSpec",
    "host_keys",
    "normalize_meshes",
    "parse_ready_line",
]

#: Most host meshes one job names.
MAX_MESHES: Final = 64
#: Most hosts one job allocates, all meshes together.
MAX_HOSTS_PER_JOB: Final = 4096
#: Most dimensions / processes of one per-host layout.
MAX_LAYOUT_DIMS: Final = 8
MAX_PROCS_PER_HOST: Final = 1024
_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}\Z")
#: Names ``JobState`` uses itself: a mesh cannot be called so.
RESERVED_NAMES: Final = frozenset({"layout"})


class MeshSpec(NamedTuple):
    """One host mesh of a job: ``hosts`` hosts, each to run the processes of ``per_host``
    (dimension -> size; ``{}``: one process per host, as ``spawn_procs()``)."""

    hosts: int
    per_host: Mapping[str, int] = {}


def _check_layout(name: str, per_host: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(per_host, Mapping):
        raise TypeError(f"mesh {name!r}: per_host is a mapping of dimension -> size")
    if len(per_host) > MAX_LAYOUT_DIMS:
        raise ValueError(f"mesh {name!r}: at most {MAX_LAYOUT_DIMS} per-host dimensions")
    layout: dict[str, int] = {}
    total = 1
    for dim, size in per_host.items():
        if not isinstance(dim, str) or not _NAME.match(dim):
            raise ValueError(f"mesh {name!r}: per-host dimension {dim!r} is not a name")
        if dim == "hosts":
            raise ValueError(f"mesh {name!r}: 'hosts' is the host dimension, not a per-host one")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh {name!r}: per-host size of {dim!r} is {size!r}, not >= 1")
        total *= size
        if total > MAX_PROCS_PER_HOST:
            raise ValueError(f"mesh {name!r}: more than {MAX_PROCS_PER_HOST} processes per host")
        layout[dim] = size
    return layout


def normalize_meshes(meshes: Mapping[str, int | MeshSpec]) -> dict[str, MeshSpec]:
    """The job's meshes as ``{name: MeshSpec}`` in the given order, checked: names are
    identifiers (not ``layout``), host counts integers >= 1, at most ``MAX_MESHES`` meshes and
    ``MAX_HOSTS_PER_JOB`` hosts. ``TypeError``/``ValueError`` naming the offending mesh."""
    if not isinstance(meshes, Mapping):
        raise TypeError(f"meshes is a mapping of mesh name -> hosts, not {type(meshes).__name__}")
    if not meshes:
        raise ValueError("a job needs at least one mesh")
    if len(meshes) > MAX_MESHES:
        raise ValueError(f"a job names at most {MAX_MESHES} meshes, not {len(meshes)}")
    out: dict[str, MeshSpec] = {}
    total = 0
    for name, value in meshes.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"mesh name {name!r} is not an identifier (letters, digits, _)")
        if name in RESERVED_NAMES:
            raise ValueError(f"mesh name {name!r} is reserved by JobState")
        spec = value if isinstance(value, MeshSpec) else MeshSpec(value)
        hosts = spec.hosts
        if isinstance(hosts, bool) or not isinstance(hosts, int):
            raise TypeError(f"mesh {name!r}: the number of hosts is an int, not {hosts!r}")
        if hosts < 1:
            raise ValueError(f"mesh {name!r}: needs at least one host, not {hosts}")
        total += hosts
        if total > MAX_HOSTS_PER_JOB:
            raise ValueError(f"a job allocates at most {MAX_HOSTS_PER_JOB} hosts")
        out[name] = MeshSpec(hosts, _check_layout(name, spec.per_host))
    return out


def host_keys(meshes: Mapping[str, MeshSpec]) -> list[tuple[str, int, str]]:
    """``(mesh, rank, key)`` of every host, meshes in order, ranks ascending; the key
    ``<mesh>_<rank>`` names the host in logs and file names."""
    return [
        (name, rank, f"{name}_{rank}")
        for name, spec in meshes.items()
        for rank in range(spec.hosts)
    ]


#: Longest address line a worker loop may report.
MAX_READY_LINE: Final = 512


def parse_ready_line(data: bytes) -> str | None:
    """The worker-loop address in what a host reported so far (``udp://IP:PORT`` then a
    newline), None while the line is incomplete; ``ValueError`` for anything else."""
    line, newline, _ = data.partition(b"\n")
    if not newline:
        if len(data) > MAX_READY_LINE:
            raise ValueError(f"a worker loop reported more than {MAX_READY_LINE} bytes, no line")
        return None
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("udp://") or ":" not in text[6:] or len(text) > MAX_READY_LINE:
        raise ValueError(f"a worker loop reported {text!r}, not udp://IP:PORT")
    host, _, port = text[6:].rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"a worker loop reported {text!r}, not udp://IP:PORT")
    if host in ("0.0.0.0", "[::]", "::"):
        raise ValueError(f"a worker loop reported the wildcard address {text!r}: not routable")
    return text
