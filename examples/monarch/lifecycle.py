"""Lifecycle: futures, ``__cleanup__``, stopping actor meshes and process meshes.

A ``Future`` caches its outcome and a ``get`` that times out does not cancel the
work; stopping an actor mesh runs ``__cleanup__`` on every rank and later calls on
it fail with ``SupervisionError`` while other meshes on the same processes keep
working; a stopped process mesh refuses new actors.

Written against Meta's Monarch API only; runs unchanged under the reference
``torchmonarch`` and under this repository's ``monarch-actor``.
"""

from __future__ import annotations

import time

import monarch.actor
from monarch.actor import Actor, MeshFailure, context, endpoint, this_host, this_proc


class Recorder(Actor):
    """Lives in the client process (``this_proc()``) and collects notes."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    @endpoint
    def note(self, text: str) -> None:
        self.notes.append(text)

    @endpoint
    def read(self) -> list[str]:
        return sorted(self.notes)


class Sleeper(Actor):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    @endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)
        return "rested"

    @endpoint
    def hello(self) -> str:
        return "hello"

    def __cleanup__(self, exc: Exception | None) -> None:
        gpu = context().actor_instance.rank["gpus"]
        self.recorder.note.call_one(f"cleanup gpus={gpu} error={exc is not None}").get()


def main() -> None:
    ignored: list[MeshFailure] = []

    # Messages to a stopped mesh may also bounce back as faults; they are expected here.
    def ignore(failure: MeshFailure) -> None:
        ignored.append(failure)

    monarch.actor.unhandled_fault_hook = ignore

    recorder = this_proc().spawn("recorder", Recorder)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    sleepers = procs.spawn("sleepers", Sleeper, recorder)
    others = procs.spawn("others", Sleeper, recorder)

    future = sleepers.slice(gpus=0).nap.call_one(1.0)
    try:
        future.get(timeout=0.05)
    except TimeoutError:
        print("get(timeout) timed out; the call goes on")
    print("later get:", future.get(timeout=60), "cached:", future.get())

    print("hello:", sleepers.hello.call().get().values())
    sleepers.stop().get()
    print("cleanups:", recorder.read.call_one().get())
    try:
        sleepers.hello.call().get(timeout=60)
    except RuntimeError as error:
        print("stopped mesh:", type(error).__name__, "stopped" in str(error))
    print("sibling mesh:", others.hello.call().get().values())

    procs.stop().get()
    print("after proc stop:", recorder.read.call_one().get())
    try:
        procs.spawn("late", Sleeper, recorder).initialized.get(timeout=60)
    except RuntimeError as error:
        print("spawn on a stopped proc mesh:", error)
    try:
        others.hello.call().get(timeout=60)
    except RuntimeError as error:
        print("call on a stopped proc mesh:", type(error).__name__)
    print("done")


if __name__ == "__main__":
    main()
