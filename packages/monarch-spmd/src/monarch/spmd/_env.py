"""The torchrun environment of one mesh position (sans-IO: pure computation, no process state).

torchrun (``torch.distributed.run``) gives every worker ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``,
``ROLE_NAME``, ``MASTER_ADDR`` and ``MASTER_PORT``. On a mesh, as in Monarch, the last dimension
is the one within a host (``gpus`` in ``per_host={"gpus": 2}``): ``LOCAL_RANK`` is the coordinate
along it, ``LOCAL_WORLD_SIZE`` its size, and the other dimensions number the hosts (groups).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ROLE_NAME", "TorchrunRanks", "torchrun_ranks"]

#: ``ROLE_NAME`` as Monarch sets it (torchrun's default role is ``default``).
ROLE_NAME = "rank"

_MAX_PORT = 65535


@dataclass(frozen=True)
class TorchrunRanks:
    """The ranks torchrun would give one worker (see :func:`torchrun_ranks`)."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    group_world_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside a world of {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local rank {self.local_rank} outside a host of {self.local_world_size}"
            )
        if not 0 <= self.group_rank < self.group_world_size:
            raise ValueError(f"group rank {self.group_rank} outside {self.group_world_size}")

    def variables(self, master_addr: str, master_port: int) -> dict[str, str]:
        """The environment variables (all strings) for a rendezvous at ``master_addr:port``."""
        if not isinstance(master_addr, str) or not master_addr:
            raise ValueError(
                f"master_addr must be a non-empty host name or address: {master_addr!r}"
            )
        if isinstance(master_port, bool) or not isinstance(master_port, int):
            raise ValueError(f"master_port must be an int: {master_port!r}")
        if not 0 < master_port <= _MAX_PORT:
            raise ValueError(f"master_port must be in 1..{_MAX_PORT}: {master_port}")
        return {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "GROUP_WORLD_SIZE": str(self.group_world_size),
            "ROLE_RANK": str(self.rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "ROLE_NAME": ROLE_NAME,
            "WORLD_SIZE": str(self.world_size),
        }


def torchrun_ranks(
    rank: int, coordinates: Mapping[str, int], sizes: Mapping[str, int]
) -> TorchrunRanks:
    """The torchrun ranks of the mesh position ``coordinates`` (linear ``rank``) in a mesh of
    ``sizes`` (dimension name -> size, in the mesh's order: the last one is within a host).

    A mesh of no dimensions is one process: rank 0 of a world of 1.
    """
    if list(coordinates) != list(sizes):
        raise ValueError(
            f"coordinates {dict(coordinates)} do not name the dimensions {list(sizes)}"
        )
    for label, size in sizes.items():
        if size < 1:
            raise ValueError(f"dimension {label!r} has size {size}")
        if not 0 <= coordinates[label] < size:
            raise ValueError(f"coordinate {label}={coordinates[label]} outside size {size}")
    world_size = math.prod(sizes.values())
    if not sizes:
        return TorchrunRanks(rank, 0, world_size, 1, rank, world_size)
    local_label = list(sizes)[-1]
    local_world_size = sizes[local_label]
    return TorchrunRanks(
        rank=rank,
        local_rank=coordinates[local_label],
        world_size=world_size,
        local_world_size=local_world_size,
        group_rank=rank // local_world_size,
        group_world_size=(world_size + local_world_size - 1) // local_world_size,
    )
