"""torch.distributed for the tensor workers, in one private module so it can be swapped (for
``monarch.spmd``'s helpers once they land): joining the mesh's process group and the
subgroups collectives run over."""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch.distributed as dist

__all__ = ["group_for", "join_world", "pick_address"]

#: How long a collective or the rendezvous waits for the other workers.
TIMEOUT = datetime.timedelta(seconds=120)
#: Subgroups a worker keeps at most (one per distinct set of reduced dims and slice).
MAX_GROUPS = 256

_groups: dict[tuple[int, ...], Any] = {}


def pick_address() -> tuple[str, int]:
    """Host and a free TCP port on this worker, for rank 0's rendezvous store."""
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError:
        address = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = int(sock.getsockname()[1])
    return address, port


def join_world(rank: int, world: int, addr: str, port: int) -> None:
    """Join the gloo process group of the mesh's ``world`` workers (once per process)."""
    if dist.is_initialized():
        return
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=TIMEOUT,
    )


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
