"""Actors the worker processes of the tests import by name."""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint

TORCHRUN_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class EnvReader(Actor):
    """Reads its process's environment."""

    @endpoint
    def torchrun_env(self) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in TORCHRUN_NAMES}

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Collective(Actor):
    """Runs collectives on its process's default group (made by ``init_process_group``)."""

    @endpoint
    def all_reduce(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]

    @endpoint
    def all_reduce_or_die(self, dying_rank: int, numel: int) -> float:
        """Every rank but ``dying_rank`` starts an all-reduce; ``dying_rank`` is killed with
        SIGKILL instead of contributing, so its peers are inside the collective with a peer gone.
        (Killed after starting its own part, it raced the collective: gloo could finish a small
        all-reduce before the signal, and the survivor then succeeded.)"""
        import signal

        import torch
        import torch.distributed as dist

        if dist.get_rank() == dying_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        tensor = torch.ones(numel)
        work = dist.all_reduce(tensor, async_op=True)
        assert work is not None
        work.wait()
        return float(tensor[0])

    @endpoint
    def has_group(self) -> bool:
        import torch.distributed as dist

        return bool(dist.is_initialized())
