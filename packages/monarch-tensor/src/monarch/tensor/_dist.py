"""torch.distributed for the tensor engine, in one private module: the mesh's default process
group is made by ``monarch.spmd.init_process_group`` (from the client, once, unless the workers
already have one, e.g. made by the program through monarch.spmd), and the workers find the
subgroups collectives run over here."""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from monarch.spmd import init_process_group

__all__ = ["ensure_world", "group_for", "initialized"]

#: How long a collective or the rendezvous waits for the other workers.
TIMEOUT = datetime.timedelta(seconds=120)
#: Subgroups a worker keeps at most (one per distinct set of reduced dims and slice).
MAX_GROUPS = 256

_groups: dict[tuple[int, ...], Any] = {}


def initialized() -> bool:
    """Whether this process has a default process group (worker side)."""
    return bool(dist.is_initialized())


def ensure_world(procs: Any, workers: Any, timeout_s: float) -> Any:
    """Client side: make the default process group of every process of ``procs`` (the mesh the
    tensor ``workers`` run on) unless they all have one; the ``MeshProcessGroup`` made, or
    ``None``. A mesh where only some processes have one is an error."""
    states = list(workers.dist_initialized.call().get(timeout=timeout_s).values())
    if all(states):
        return None
    if any(states):
        raise RuntimeError(
            "some processes of the mesh have a torch.distributed process group and others do "
            "not: the tensor engine needs one over all of them"
        )
    return init_process_group(procs, backend="gloo", timeout=TIMEOUT.total_seconds())


def group_for(ranks: tuple[int, ...]) -> Any:
    """The process group of ``ranks`` (this worker's among them): the world group when they
    are all the workers, else a subgroup made by its members only, cached."""
    if not dist.is_initialized():
        raise RuntimeError("the mesh's process group is not initialised on this worker")
    if len(ranks) == dist.get_world_size():
        return dist.group.WORLD
    group = _groups.get(ranks)
    if group is None:
        if len(_groups) >= MAX_GROUPS:
            raise RuntimeError(f"more than {MAX_GROUPS} distinct process subgroups requested")
        group = dist.new_group(list(ranks), use_local_synchronization=True)
        _groups[ranks] = group
    return group
