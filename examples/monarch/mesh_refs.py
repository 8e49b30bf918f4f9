"""Mesh references passed between actors, async endpoints, choose and stream.

Actor meshes are picklable handles: an actor that receives one can call, stream to
and slice it from its own process. ``choose`` lets the runtime pick one rank;
``stream`` yields one future per rank, resolving in arrival order.

Written against Meta's Monarch API only; runs unchanged under the reference
``torchmonarch`` and under this repository's ``monarch-actor``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from monarch.actor import (
    Actor,
    Channel,
    Port,
    context,
    current_actor_name,
    current_size,
    endpoint,
    this_host,
)


@dataclass
class Ball:
    """A message carrying mesh references, a port and a time to live."""

    ttl: int
    back: Bouncer
    done: Port[list[str]]
    path: list[str]


class Bouncer(Actor):
    def __init__(self, side: str) -> None:
        self.side = side

    @endpoint
    async def bounce(self, ball: Ball, me: Bouncer) -> None:
        ball.path.append(f"{self.side}{ball.ttl}")
        if ball.ttl == 0:
            ball.done.send(ball.path)
            return
        # Fire and forget (awaiting would deadlock: one message at a time per actor); the
        # ball travels back to the mesh that sent it, carrying a reference to this one.
        ball.back.bounce.broadcast(Ball(ball.ttl - 1, me, ball.done, ball.path), ball.back)


class Worker(Actor):
    def __init__(self, scale: int) -> None:
        self.scale = scale

    @endpoint
    async def work(self, x: int) -> int:
        await asyncio.sleep(0)
        # The spawn-time coordinate: current_rank() is relative to the slice that was called
        # (it is {} on a one-rank slice).
        return x * self.scale + context().actor_instance.rank["gpus"]

    @endpoint
    async def name(self) -> str:
        return current_actor_name()

    @endpoint
    async def size_seen(self) -> dict[str, int]:
        return dict(current_size())


class Client(Actor):
    """Holds a reference to a mesh it did not spawn and talks to it."""

    def __init__(self, workers: Worker) -> None:
        self.workers = workers

    @endpoint
    async def gather(self, x: int) -> list[int]:
        replies = [await f for f in self.workers.work.stream(x)]
        return sorted(replies)

    @endpoint
    async def pick(self, x: int) -> bool:
        value = await self.workers.work.choose(x)
        return value in (x * 10, x * 10 + 1, x * 10 + 2)

    @endpoint
    async def last(self, x: int) -> int:
        return await self.workers.slice(gpus=2).work.call_one(x)

    @endpoint
    async def distinct_names(self) -> int:
        names = await self.workers.name.call()
        return len(set(names.values()))


def main() -> None:
    worker_procs = this_host().spawn_procs(per_host={"gpus": 3})
    client_procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = worker_procs.spawn("workers", Worker, 10)
    clients = client_procs.spawn("clients", Client, workers)

    print("gather:", clients.gather.call(4).get().values())
    print("choose:", clients.pick.call(5).get().values())
    print("slice through a ref:", clients.slice(gpus=1).last.call_one(6).get())
    print("distinct names:", clients.slice(gpus=0).distinct_names.call_one().get())
    print("sizes seen:", workers.slice(gpus=slice(0, 2)).size_seen.call().get().values())
    print("client stream:", sorted(len(f.get()) for f in clients.gather.stream(1)))

    left = worker_procs.spawn("left", Bouncer, "L").slice(gpus=0)
    right = client_procs.spawn("right", Bouncer, "R").slice(gpus=1)
    done, finished = Channel[list[str]].open()
    right.bounce.broadcast(Ball(5, left, done, []), right)
    print("bounce path:", finished.recv().get(timeout=60))

    client_procs.stop().get()
    worker_procs.stop().get()
    print("stopped")


if __name__ == "__main__":
    main()
