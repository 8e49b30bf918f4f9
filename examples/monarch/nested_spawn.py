"""Process meshes spawned from inside an actor, and controllers.

An actor can start processes itself: ``this_host()`` inside an actor is the host it runs
on, and ``spawn_procs`` there gives a process mesh owned by that actor. The actor calls
the actors it spawns there and hands references to them on; when one of those
processes dies, the owner's ``__supervise__`` is told; stopping the owner's processes
stops what it spawned. ``get_or_spawn_controller`` returns one named singleton actor to
every caller, in the client or in an actor.

Written against Meta's Monarch API only; runs unchanged under the reference
``torchmonarch`` and under this repository's ``monarch-actor``.
"""

from __future__ import annotations

import os
import time

import monarch.actor
from monarch.actor import (
    Actor,
    MeshFailure,
    ProcMesh,
    endpoint,
    get_or_spawn_controller,
    this_host,
)


class Registry(Actor):
    """A controller: one per name, wherever it is asked for."""

    def __init__(self) -> None:
        self.names: list[str] = []

    @endpoint
    def register(self, name: str) -> int:
        self.names.append(name)
        return len(self.names)


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    def crash(self) -> None:
        os._exit(1)


class Coordinator(Actor):
    """Spawns its own workers' processes and owns them."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.procs: ProcMesh | None = None
        self.workers: Worker | None = None

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(str(failure))
        return True  # handled here

    @endpoint
    def start_workers(self, n: int) -> list[int]:
        self.procs = this_host().spawn_procs(per_host={"workers": n})
        self.workers = self.procs.spawn("workers", Worker)
        return self.workers.pid.call().get().values()

    @endpoint
    def host_extent(self) -> str:
        return str(this_host().extent)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def sums(self, a: int, b: int) -> list[int]:
        assert self.workers is not None
        return self.workers.add.call(a, b).get().values()

    @endpoint
    def workers_ref(self) -> Worker:
        assert self.workers is not None
        return self.workers

    @endpoint
    def crash_worker(self, rank: int) -> None:
        assert self.workers is not None
        self.workers.slice(workers=rank).crash.broadcast()

    @endpoint
    def told_about_rank(self, rank: int) -> bool:
        return any("workers" in f and f"crashed_ranks=[{rank}]" in f for f in self.failures)

    @endpoint
    def ask_registry(self, name: str) -> int:
        registry = get_or_spawn_controller("registry", Registry).get()
        return registry.register.call_one(name).get()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def main() -> None:
    faults: list[MeshFailure] = []

    def record(failure: MeshFailure) -> None:  # instead of exiting
        faults.append(failure)

    monarch.actor.unhandled_fault_hook = record
    procs = this_host().spawn_procs(per_host={"coordinators": 1})
    coordinator = procs.spawn("coordinator", Coordinator)
    print("this_host() in an actor:", coordinator.host_extent.call_one().get())
    pids = coordinator.start_workers.call_one(2).get()
    own = coordinator.pid.call_one().get()
    print(
        "2 workers, none of them the coordinator's process:",
        len(set(pids)) == 2 and own not in pids,
    )
    print("sums from the coordinator:", coordinator.sums.call_one(1, 2).get())
    workers = coordinator.workers_ref.call_one().get()
    print("sums through a reference in the client:", workers.add.call(2, 3).get().values())

    coordinator.crash_worker.call_one(1).get()
    deadline = time.monotonic() + 60
    told = False
    while not told and time.monotonic() < deadline:
        told = coordinator.told_about_rank.call_one(1).get()
        time.sleep(0.1)
    print("the coordinator was told rank 1 failed:", told)
    print("the other worker carries on:", workers.slice(workers=0).add.call_one(3, 4).get())

    registry = get_or_spawn_controller("registry", Registry).get()
    print("registry from the client:", registry.register.call_one("client").get())
    print("registry from the coordinator:", coordinator.ask_registry.call_one("coordinator").get())
    again = get_or_spawn_controller("registry", Registry).get()
    print("the same registry again:", again.register.call_one("client").get())

    procs.stop().get()
    deadline = time.monotonic() + 30
    while not all(gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    print("stopping the coordinator's processes stopped its workers:", all(gone(p) for p in pids))
    print("faults at the client:", len(faults))


if __name__ == "__main__":
    main()
