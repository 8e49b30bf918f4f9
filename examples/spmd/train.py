"""A torchrun-style DDP training script, written for ``torchrun`` and nothing else.

    torchrun --nproc-per-node 2 examples/spmd/train.py RESULT.json

runs it under torchrun; ``examples/spmd/run_script.py`` runs it, unchanged, on a Monarch process
mesh through ``SPMDActor``. Both write the same result: rank 0 writes the world size, the loss
over the global batch step by step and the final weights, rounded, as JSON to ``RESULT.json``.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 5
GLOBAL_BATCH = 8


def main() -> None:
    result_path = sys.argv[1]
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    y = x.sum(dim=1, keepdim=True)
    local = GLOBAL_BATCH // world
    losses = []
    for step in range(STEPS):
        start = step * GLOBAL_BATCH + rank * local  # this rank's share of the global batch
        loss = torch.nn.functional.mse_loss(
            model(x[start : start + local]), y[start : start + local]
        )
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(round(float(total) / world, 4))
    if rank == 0:
        weight = [round(float(w), 4) for w in model.module.weight.detach().flatten()]
        with open(result_path, "w") as f:
            json.dump({"world_size": world, "losses": losses, "weight": weight}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
