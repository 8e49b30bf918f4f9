"""Actor classes for the liveness tests (importable by the workers by module name)."""

from __future__ import annotations

import os
import time
from typing import Any

from monarch.actor import Actor, Port, endpoint


class Sleeper(Actor):
    @endpoint
    def os_pid(self) -> int:
        return os.getpid()

    @endpoint
    def nap(self, started: Port[int], late: Port[str], seconds: float) -> int:
        """Tell ``started`` this process's pid (the call runs now), sleep, then send on
        ``late`` and return: what a stopped process would send when it runs again."""
        started.send(os.getpid())
        time.sleep(seconds)
        late.send("late")
        return os.getpid()


class Owner(Actor):
    """Owns a ``Sleeper`` mesh on a proc mesh it was given; tells a watcher its failures."""

    def __init__(self) -> None:
        self.failures: list[str] = []
        self.watcher: Port[str] | None = None

    @endpoint
    def spawn_child(self, procs: Any, watcher: Port[str]) -> tuple[Any, list[int]]:
        """Spawn the child mesh; return a reference to it and its processes' pids."""
        self.watcher = watcher
        self.child = procs.spawn("child", Sleeper)
        return self.child, list(self.child.os_pid.call().get(timeout=20).values())

    def __supervise__(self, failure: Any) -> bool:
        self.failures.append(str(failure))
        if self.watcher is not None:
            self.watcher.send(str(failure))
        return True

    @endpoint
    def seen(self) -> list[str]:
        return list(self.failures)
