"""One-sided tensor transfers with ``monarch.rdma`` (a parameter server and two trainers).

Written against Meta's Monarch API only; runs unchanged under the reference ``torchmonarch``
(its TCP fallback on a host without RDMA devices) and under this repository's ``monarch-rdma``.
A server actor owns a weight tensor and hands out an ``RDMABuffer`` over it; trainers pull the
weights with ``read_into`` and push gradients into the server's buffer with ``write_from``
without the server's actor taking part; an ``RDMAAction`` batches several reads; a dropped
buffer can no longer be used.
"""

from __future__ import annotations

import warnings

import torch

from monarch.actor import Actor, current_rank, endpoint, this_host
from monarch.rdma import RDMAAction, RDMABuffer

warnings.simplefilter("ignore")  # the reference warns that it falls back to TCP


class ParameterServer(Actor):
    def __init__(self) -> None:
        self.weights = torch.arange(8, dtype=torch.float32)
        self.grads = torch.zeros(2, 8, dtype=torch.float32)
        self.weights_buffer = RDMABuffer(self.weights.view(torch.uint8).flatten())
        self.grad_buffers = [RDMABuffer(g.view(torch.uint8).flatten()) for g in self.grads]

    @endpoint
    def handles(self) -> tuple[RDMABuffer, list[RDMABuffer]]:
        return self.weights_buffer, self.grad_buffers

    @endpoint
    def apply(self, lr: float) -> list[float]:
        self.weights -= lr * self.grads.sum(dim=0)
        return list(self.weights.tolist())

    @endpoint
    def drop_weights(self) -> None:
        self.weights_buffer.drop().get()


class Trainer(Actor):
    def __init__(self) -> None:
        self.rank = current_rank().rank
        self.local = torch.zeros(8, dtype=torch.float32)

    @endpoint
    async def step(self, weights: RDMABuffer, grads: list[RDMABuffer]) -> list[float]:
        await weights.read_into(self.local.view(torch.uint8).flatten())
        grad = self.local * (self.rank + 1)
        await grads[self.rank].write_from(grad.view(torch.uint8).flatten())
        return list(self.local.tolist())

    @endpoint
    async def pull_twice(self, weights: RDMABuffer) -> list[list[float]]:
        first = torch.zeros(8, dtype=torch.float32)
        second = torch.zeros(8, dtype=torch.float32)
        action = RDMAAction()
        action.read_remote(first.view(torch.uint8).flatten(), weights).read_remote(
            second.view(torch.uint8).flatten(), weights
        )
        await action.submit()
        return [first.tolist(), second.tolist()]

    @endpoint
    async def try_read(self, weights: RDMABuffer) -> str:
        try:
            await weights.read_into(self.local.view(torch.uint8).flatten(), timeout=10)
        except Exception:
            return "failed"
        return "read"


def main() -> None:
    server_procs = this_host().spawn_procs(per_host={"gpus": 1})
    trainer_procs = this_host().spawn_procs(per_host={"gpus": 2})
    server = server_procs.spawn("server", ParameterServer)
    trainers = trainer_procs.spawn("trainers", Trainer)
    weights, grads = server.handles.call_one().get()
    print("buffer size:", weights.size(), [g.size() for g in grads])
    for step in range(2):
        pulled = trainers.step.call(weights, grads).get()
        print(f"step {step} pulled:", next(iter(pulled.values())))
        print(f"step {step} weights:", server.apply.call_one(0.125).get())
    both = trainers.slice(gpus=0).pull_twice.call_one(weights).get()
    print("action read twice:", both[0] == both[1], both[0][:3])
    server.drop_weights.call_one().get()
    print("after drop:", trainers.slice(gpus=1).try_read.call_one(weights).get())
    trainer_procs.stop().get()
    server_procs.stop().get()


if __name__ == "__main__":
    main()
