"""Failures and supervision.

An exception raised by an endpoint with a waiting caller reaches that caller as
``ActorError`` and the actor lives on. A failure nobody waits for (a ``broadcast``)
kills the actor and is reported to the mesh's owner through ``__supervise__``; a
``BaseException`` kills the actor and its caller gets a ``SupervisionError``; later
calls to any slice holding the dead rank fail fast, while other ranks keep working.

Written against Meta's Monarch API only; runs unchanged under the reference
``torchmonarch`` and under this repository's ``monarch-actor``.
"""

from __future__ import annotations

import re
import time

import monarch.actor
from monarch.actor import Actor, ActorError, Endpoint, MeshFailure, ProcMesh, endpoint, this_host


class Fatal(BaseException):
    """Not an ``Exception``: kills the actor even though a caller waits."""


class Worker(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def divide(self, a: int, b: int) -> float:
        self.calls += 1
        return a / b

    @endpoint
    def calls_so_far(self) -> int:
        return self.calls

    @endpoint
    def explode(self) -> None:
        raise Fatal("the end")

    @endpoint
    def fail_quietly(self) -> None:
        raise RuntimeError("nobody is waiting")


class Supervisor(Actor):
    """Owns a mesh of workers and contains their failures."""

    def __init__(self, procs: ProcMesh) -> None:
        # It spawns them, so it owns them, even on processes it only holds a reference to.
        self.workers = procs.spawn("supervised", Worker)
        self.failures: list[str] = []

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append("failure reported")
        return True  # handled: it goes no further up the tree

    @endpoint
    def break_children(self) -> None:
        self.workers.fail_quietly.broadcast()

    @endpoint
    def failures_seen(self) -> int:
        return len(self.failures)


def wait_for(read: Endpoint[[], int], want: int, timeout: float = 60.0) -> int:
    """Poll until ``read`` reaches ``want``: supervision events arrive asynchronously."""
    deadline = time.monotonic() + timeout
    while True:
        value = read.call_one().get()
        if value >= want or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def main() -> None:
    faults: list[MeshFailure] = []

    def record(failure: MeshFailure) -> None:  # instead of exiting
        faults.append(failure)

    monarch.actor.unhandled_fault_hook = record

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    workers = procs.spawn("workers", Worker)

    try:
        workers.divide.call(1, 0).get()
    except ActorError as error:
        print("ActorError caught:", type(error.exception).__name__, "-", error.exception)
    print("still alive:", workers.divide.call(6, 3).get().values())
    print("calls:", workers.calls_so_far.call().get().values())

    try:
        workers.slice(gpus=1).explode.call_one().get(timeout=60)
    except monarch.actor.ActorError:
        print("unexpected ActorError")
    except RuntimeError as error:
        print("caller got:", type(error).__name__)
    for label, target in [("mesh", workers), ("slice gpus=1", workers.slice(gpus=1))]:
        try:
            target.calls_so_far.call().get(timeout=60)
            print(label, "answered")
        except RuntimeError as error:
            print(label, "fails fast:", type(error).__name__)
    print("healthy rank:", workers.slice(gpus=0).calls_so_far.call_one().get())

    boss_procs = this_host().spawn_procs(per_host={"procs": 1})
    child_procs = this_host().spawn_procs(per_host={"gpus": 2})
    boss = boss_procs.spawn("boss", Supervisor, child_procs)
    boss.break_children.call_one().get()
    print("failures seen by the owner:", wait_for(boss.failures_seen, 2))
    # The client owns ``workers`` and has no ``__supervise__``: the rank that died reaches the
    # hook. (The reference also reports, as separate faults, the calls it bounced off the dead
    # rank; only crash reports naming a rank are compared here.)
    crashes = [str(f) for f in faults if "crashed_ranks=[]" not in str(f)]
    for report in crashes:
        ranks = re.search(r"crashed_ranks=\[[0-9, ]*\]", report)
        print("crash at the client:", ranks.group(0) if ranks else report, "the end" in report)

    child_procs.stop().get()
    boss_procs.stop().get()
    procs.stop().get()
    print("stopped")


if __name__ == "__main__":
    main()
