"""The actor demo: a Monarch program on a process mesh of this host.

Written against Meta's Monarch API (``from monarch.actor import ...``) and nothing else, so it
runs unchanged under the reference ``torchmonarch`` too. It starts four worker processes, spawns
an actor on each, calls them, broadcasts to them, talks to a slice, and shows a supervised
failure: an actor that dies is reported to the actor that owns it, callers of the dead rank get
``SupervisionError``, and the other ranks carry on.

Run it with ``./dev demo`` (sets up the workspace first) or, inside the workspace
environment, ``python examples/actors.py``.
"""

from __future__ import annotations

import os
import time

import monarch.actor
from monarch.actor import (
    Actor,
    ActorError,
    Endpoint,
    MeshFailure,
    ProcMesh,
    context,
    current_rank,
    endpoint,
    this_host,
)


class Trainer(Actor):
    """One replica of a toy model: a single weight, updated by broadcast gradients."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.weight = 1.0
        self.steps = 0

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def step(self, grad: float) -> None:
        # The gradient is scaled by the replica's spawn-time rank, so replicas drift apart.
        self.weight -= self.lr * grad * (1 + context().actor_instance.rank["gpus"])
        self.steps += 1

    @endpoint
    def state(self) -> str:
        return f"weight={self.weight:.2f} after {self.steps} steps"

    @endpoint
    def where(self) -> str:
        return f"message rank {current_rank()}, spawn rank {context().actor_instance.rank}"

    @endpoint
    def check(self, limit: float) -> bool:
        if self.weight < limit:
            raise ValueError(f"weight {self.weight:.2f} fell below {limit}")
        return True

    @endpoint
    def diverge(self) -> None:
        raise FloatingPointError("loss is NaN")


class Coordinator(Actor):
    """Owns the trainers it spawns, so it is told when one of them dies."""

    def __init__(self, procs: ProcMesh) -> None:
        self.trainers = procs.spawn("trainers", Trainer, 0.1)
        self.failures: list[str] = []

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(str(failure))
        return True  # handled here: the failure goes no further up the tree

    @endpoint
    def trainers_mesh(self) -> Trainer:
        self.trainers.initialized.get()  # every trainer is up before the mesh is handed out
        return self.trainers

    @endpoint
    def fail_one(self, gpu: int) -> None:
        # Nobody waits for a broadcast: the exception kills the actor, and its owner (this
        # coordinator) gets a MeshFailure through __supervise__.
        self.trainers.slice(gpus=gpu).diverge.broadcast()

    @endpoint
    def failure_count(self) -> int:
        return len(self.failures)


def wait_for(read: Endpoint[[], int], want: int, timeout: float = 60.0) -> int:
    """Poll until ``read`` reaches ``want``: supervision events arrive asynchronously."""
    deadline = time.monotonic() + timeout
    while (value := read.call_one().get()) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def main() -> None:
    # Failures nobody handles reach the client's hook (by default the program exits). The
    # reference Monarch also reports there each call that bounced off a dead actor; the demo
    # notes those and carries on.
    unhandled: list[MeshFailure] = []

    def note(failure: MeshFailure) -> None:
        unhandled.append(failure)

    monarch.actor.unhandled_fault_hook = note

    procs = this_host().spawn_procs(per_host={"gpus": 4})
    print(f"process mesh: {procs.extent}")
    boss_proc = this_host().spawn_procs(per_host={"procs": 1})
    coordinator = boss_proc.spawn("coordinator", Coordinator, procs)
    trainers = coordinator.trainers_mesh.call_one().get()

    pids = trainers.pid.call().get().values()
    print(
        f"{len(set(pids))} trainers in {len(set(pids))} processes, none of them this one:",
        os.getpid() not in pids,
    )

    for grad in (0.5, 0.25, 0.125):
        trainers.step.broadcast(grad)  # fire and forget, still ordered before the next call
    for point, state in trainers.state.call().get().items():
        print(f"  {point}: {state}")

    pair = trainers.slice(gpus=slice(2, 4))
    print(f"slice gpus=2:4 has extent {pair.extent}:")
    for line in pair.where.call().get().values():
        print(f"  {line}")
    print("one rank:", trainers.slice(gpus=0).state.call_one().get())

    try:
        trainers.check.call(0.8).get()
    except ActorError as error:
        print(f"ActorError from a call: {error.exception}")
    print("the raising rank lives on:", trainers.slice(gpus=3).state.call_one().get())

    coordinator.fail_one.call_one(1).get()
    print("failures seen by the coordinator:", wait_for(coordinator.failure_count, 1))
    try:
        trainers.slice(gpus=1).state.call_one().get(timeout=60)
    except RuntimeError as error:
        print(f"calling the dead rank: {type(error).__name__}")
    healthy = trainers.slice(gpus=slice(2, 4)).state.call().get().values()
    print("the other ranks carry on:", healthy)

    boss_proc.stop().get()
    procs.stop().get()
    print("stopped")


if __name__ == "__main__":
    main()
