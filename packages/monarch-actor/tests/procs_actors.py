"""Actor classes for the worker-process tests (importable by the workers by module name)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from monarch.actor import Actor, Port, context, endpoint


class Counter(Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @endpoint
    def incr(self, by: int = 1) -> None:
        self.value += by

    @endpoint
    def get(self) -> int:
        return self.value + context().actor_instance.rank["gpus"]

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, data: bytes) -> bytes:
        return data

    @endpoint
    def fail(self) -> None:
        raise ValueError("boom in a worker")

    @endpoint
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @endpoint
    def nap_after_telling(self, started: Port[int], seconds: float) -> int:
        """``nap``, after sending this process's pid on ``started``: the caller then knows the
        call is running (an event to wait on, not a guess of how long delivery takes)."""
        started.send(os.getpid())
        time.sleep(seconds)
        return os.getpid()


class Where(Actor):
    """Reports where it runs: OS pid and network namespace (for the multi-host tests)."""

    @endpoint
    def place(self) -> tuple[int, int]:
        return os.getpid(), os.stat("/proc/self/ns/net").st_ino

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b

    @endpoint
    def shout(self, text: str) -> None:
        """Write ``text`` to this process's stderr."""
        print(text, file=sys.stderr, flush=True)


class Supervisor(Actor):
    """Owns a ``Counter`` mesh spawned on a proc mesh it was given; records its failures."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.child: Any = None
        self.watcher: Port[str] | None = None

    @endpoint
    def spawn_child(self, procs: Any) -> list[int]:
        self.child = procs.spawn("child", Counter, 0)
        return list(self.child.os_pid.call().get(timeout=20).values())

    @endpoint
    def child_pids(self) -> list[int]:
        return list(self.child.os_pid.call().get(timeout=20).values())

    def __supervise__(self, failure: Any) -> bool:
        self.failures.append(str(failure))
        if self.watcher is not None:
            self.watcher.send(str(failure))
        return True

    @endpoint
    def watch(self, watcher: Port[str]) -> None:
        """Send every failure, from now on, to ``watcher``: the caller waits on its receiver
        instead of polling ``seen``."""
        self.watcher = watcher

    @endpoint
    def seen(self) -> list[str]:
        return list(self.failures)

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()


class Logged(Actor):
    """Appends ``<name> cleanup`` to a file when it stops (cleanup order across processes)."""

    def __init__(self, log: str, name: str) -> None:
        self.log = log
        self.name = name

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()

    @endpoint
    def get(self) -> int:
        return 0

    def __cleanup__(self, exc: BaseException | None) -> None:
        with open(self.log, "a") as handle:
            handle.write(f"{self.name} cleanup\n")


class LoggedParent(Logged):
    """A ``Logged`` that owns a ``Logged`` child mesh on a proc mesh it was given."""

    @endpoint
    def spawn_child(self, procs: Any) -> list[int]:
        self.child = procs.spawn("child", Logged, self.log, "child")
        return list(self.child.os_pid.call().get(timeout=20).values())


class NestedSpawner(Actor):
    """Spawns processes from inside a worker (they are owned by this actor)."""

    @endpoint
    def nested(self) -> str:
        from monarch.actor import this_host

        try:
            this_host().spawn_procs(per_host={"procs": 1})
        except NotImplementedError as exc:
            return str(exc)
        return "spawned"
