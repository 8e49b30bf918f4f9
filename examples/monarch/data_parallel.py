"""Data-parallel training of a small MLP on a 2x2 mesh of CPU processes (Monarch's tensor engine).

Written against Meta's Monarch API only; runs unchanged under the reference ``torchmonarch`` and
under this repository's ``monarch-actor`` + ``monarch-tensor``, printing the same losses. Inside
``procs.activate()`` the model, the data and every step are torch code run on all four
processes: each process builds its own batch from its rank in the mesh, ``backward()`` computes
its gradients, a ``remote`` function averages them across the mesh over a gloo process group,
and ``torch.optim.SGD`` steps every replica the same way.

The gradients are averaged with ``torch.distributed`` inside a ``remote`` function rather than
with ``Tensor.reduce``: the reference's ``reduce`` does not run on CPU (its workers make the
communicators for CUDA only; on CPU the worker fails with "no comm found for stream").
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from monarch import fetch_shard, get_active_mesh, inspect, no_mesh, remote
from monarch.actor import this_host
from monarch.spmd import setup_torch_elastic_env

STEPS = 8


def init_gloo() -> torch.Tensor:
    """Join this process to the mesh's gloo process group (torchrun's variables are set)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return torch.tensor(float(dist.get_world_size()))


def average(t: torch.Tensor) -> torch.Tensor:
    """The mean of ``t`` over every process of the group."""
    out = t.detach().clone()
    dist.all_reduce(out)
    return out / dist.get_world_size()


world_size = remote(init_gloo, propagate=lambda: torch.zeros(()))
mesh_average = remote(average, propagate=lambda t: t.detach().clone())


def main() -> None:
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    setup_torch_elastic_env(procs)
    with procs.activate():
        print("processes in the group:", int(inspect(world_size()).item()))
        rank = get_active_mesh().rank(("hosts", "gpus"))
        # Each process its own batch of 8 samples: a fixed function of its rank.
        x = torch.sin(torch.arange(32.0).reshape(8, 4) * 0.3 + rank)
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.5
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        with torch.no_grad():  # the same initial weights on every process
            for p in model.parameters():
                p.copy_(torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
        for step in range(STEPS):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():
                p.grad = mesh_average(p.grad)
            optimizer.step()
            optimizer.zero_grad()
            print(f"step {step}: loss {inspect(mesh_average(loss)).item():.6f}")
        losses = [
            fetch_shard(loss, hosts=h, gpus=g).get().item() for h in range(2) for g in range(2)
        ]
        print("last losses by rank:", [f"{v:.6f}" for v in losses])
        weights = [fetch_shard(model[2].weight, hosts=h, gpus=1).get() for h in range(2)]
        with no_mesh.activate():  # fetched values are local tensors
            print("replicas agree:", bool(torch.equal(weights[0], weights[1])))
    procs.stop().get()


if __name__ == "__main__":
    main()
