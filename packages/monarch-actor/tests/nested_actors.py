"""Actors for ``test_nested_spawn`` (workers import them by module name)."""

from __future__ import annotations

import os
from typing import Any

from monarch.actor import Actor, MeshFailure, ProcMesh, context, endpoint, this_host


class Leaf(Actor):
    """A grandchild: says where it runs, and can die."""

    def __init__(self, tag: str = "leaf") -> None:
        self.tag = tag

    @endpoint
    def where(self) -> tuple[int, int]:
        return os.getpid(), os.getppid()

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    def exit_process(self) -> None:
        os._exit(7)

    @endpoint
    def spawn_leaves(self, n: int) -> list[int]:
        """Nest one level further (used to reach the depth bound)."""
        self.procs = this_host().spawn_procs(per_host={"gpus": n})
        self.leaves = self.procs.spawn("deeper", Leaf, "deeper")
        return [pid for pid, _ in self.leaves.where.call().get(timeout=60).values()]


class Spawner(Actor):
    """Spawns processes from inside its worker and owns them."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.leaves: Any = None
        self.procs: ProcMesh | None = None

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(str(failure))
        return True

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()

    @endpoint
    def spawn(self, n: int, host: Any = None) -> list[tuple[int, int]]:
        hosts = this_host() if host is None else host
        self.procs = hosts.spawn_procs(per_host={"gpus": n}, name="grandchildren")
        self.leaves = self.procs.spawn("leaves", Leaf)
        return list(self.leaves.where.call().get(timeout=60).values())

    @endpoint
    def host_extent(self) -> str:
        return str(this_host().extent)

    @endpoint
    def add_everywhere(self, a: int, b: int) -> list[int]:
        return list(self.leaves.add.call(a, b).get(timeout=30).values())

    @endpoint
    def add_on(self, rank: int, a: int, b: int) -> int:
        return int(self.leaves.slice(gpus=rank).add.call_one(a, b).get(timeout=30))

    @endpoint
    def leaves_ref(self) -> Any:
        return self.leaves

    @endpoint
    def procs_ref(self) -> Any:
        return self.procs

    @endpoint
    def kill_leaf(self, rank: int) -> None:
        self.leaves.slice(gpus=rank).exit_process.broadcast()

    @endpoint
    def seen(self) -> list[str]:
        return list(self.failures)

    @endpoint
    def stop_procs(self) -> None:
        assert self.procs is not None
        self.procs.stop().get(timeout=30)

    @endpoint
    def try_spawn(self, n: int) -> str:
        try:
            # spawn_procs returns at once: the bounds are checked by the client's host agent,
            # whose refusal reaches ``initialized``.
            this_host().spawn_procs(per_host={"gpus": n}).initialized.get(timeout=60)
        except RuntimeError as exc:
            return str(exc)
        return "spawned"

    @endpoint
    def nest(self, levels: int) -> list[int]:
        """Spawn a chain ``levels`` deep below this actor; the os pids of each level."""
        self.procs = this_host().spawn_procs(per_host={"gpus": 1}, name="level")
        self.leaves = self.procs.spawn("nested", Spawner)
        pids = [self.leaves.os_pid.call_one().get(timeout=60)]
        if levels > 1:
            pids += self.leaves.nest.call_one(levels - 1).get(timeout=120)
        return pids

    @endpoint
    def rank(self) -> str:
        return str(context().actor_instance.rank)
