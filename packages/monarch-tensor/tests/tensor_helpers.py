"""Functions the tests run on the workers (imported there by module name)."""

from __future__ import annotations

import threading
import time

import torch

from monarch.actor import Actor, current_rank, endpoint


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


class Scaler(Actor):
    """An actor whose endpoints take and return shards (``rref``)."""

    def __init__(self) -> None:
        self.factor = 3.0
        self.seen = 0
        self.rank = current_rank().rank  # the rank in the mesh (a call to a slice sees {})

    @endpoint(propagate=lambda x: x)
    def scale(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return x * self.factor + self.rank

    @endpoint(propagate=lambda x: (x, x.sum()))
    def halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x - 1, x.sum()

    @endpoint(propagate=lambda x: x)
    def fail(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the actor refused")

    @endpoint
    def no_propagate(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @endpoint(propagate="inspect")
    def inspected(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return x * 2

    @endpoint(propagate="mocked")
    def mocked(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @endpoint(propagate="bogus")
    def bogus(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @endpoint
    def calls(self) -> int:
        return self.seen


def pid_of(x: torch.Tensor) -> torch.Tensor:
    """This worker's process id."""
    import os

    return torch.tensor(os.getpid())


#: Calls of ``data_dependent`` in this process.
calls = {"data_dependent": 0}


def data_dependent(x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """An output whose shape depends on the values (cannot run on meta tensors), and a string."""
    calls["data_dependent"] += 1
    n = int(x.sum().item())
    return torch.arange(n, dtype=torch.int32), f"rank {current_rank().rank}"


def calls_of(name: str) -> int:
    return calls[name]


#: A flag one stream raises and another waits for (``test_streams``).
_flag = threading.Event()


def wait_for_flag(x: torch.Tensor) -> torch.Tensor:
    """``x + 1`` once another stream raised the flag (``x`` itself after 20 s without it)."""
    raised = _flag.wait(20.0)
    _flag.clear()
    return x + 1 if raised else x


def raise_flag(x: torch.Tensor) -> torch.Tensor:
    _flag.set()
    return x


def slow_fill(x: torch.Tensor, value: float) -> torch.Tensor:
    """``x`` filled with ``value`` in place, slowly (another stream must wait for it)."""
    time.sleep(0.3)
    return x.fill_(value)
