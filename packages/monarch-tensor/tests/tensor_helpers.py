"""Functions the tests run on the workers (imported there by module name)."""

from __future__ import annotations

import torch

from monarch.actor import current_rank


def shard_data(like: torch.Tensor) -> torch.Tensor:
    """This worker's shard: ``expected_shard(rank, shape)``."""
    return expected_shard(current_rank().rank, tuple(like.shape))


def expected_shard(rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Different, known values on each rank."""
    count = 1
    for size in shape:
        count *= size
    return (torch.arange(count, dtype=torch.float32).reshape(shape) + 1) * (rank + 1)


def explode(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("exploded on purpose")


def pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 1, x.sum()
