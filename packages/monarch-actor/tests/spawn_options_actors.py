"""Actors and bootstrap callables for ``test_spawn_options`` (workers import them by name)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from monarch.actor import Actor, endpoint, this_host


class Probe(Actor):
    """Reports what the process it runs in looks like."""

    @endpoint
    def env(self, name: str) -> str:
        return os.environ.get(name, "unset")

    @endpoint
    def cpus(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    @endpoint
    def os_pid(self) -> int:
        return os.getpid()


def set_marker() -> None:
    """A sync bootstrap: what it sets is seen by every actor of the process."""
    os.environ["M1_BOOTSTRAP"] = "sync"


async def set_marker_async() -> None:
    """An async bootstrap."""
    await asyncio.sleep(0)
    os.environ["M1_BOOTSTRAP"] = "async"


def fail_bootstrap() -> None:
    raise ValueError("bootstrap went wrong")


def exit_bootstrap() -> None:
    """A bootstrap that gives up with ``sys.exit`` (a ``BaseException``)."""
    sys.exit(3)


def wait_for_file(path: str, bound: float = 30.0) -> None:
    """Hold the process in its bootstrap until the test creates ``path`` (bounded)."""
    deadline = time.monotonic() + bound
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)
    os.environ["M1_BOOTSTRAP"] = "released"


class NestedOwner(Actor):
    """Spawns processes from inside a worker, with a bootstrap."""

    @endpoint
    def spawn_with_bootstrap(self) -> tuple[bool, str]:
        procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=set_marker)
        returned_before_ready = not procs.initialized.done()
        probe = procs.spawn("probe", Probe)
        value = probe.env.call_one("M1_BOOTSTRAP").get(timeout=60)
        procs.stop().get(timeout=30)
        return returned_before_ready, value

    @endpoint
    def spawn_failing(self) -> str:
        procs = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap=fail_bootstrap)
        try:
            procs.initialized.get(timeout=60)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "initialized"
