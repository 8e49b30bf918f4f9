"""Actor classes for the worker-process tests (importable by the workers by module name)."""

from __future__ import annotations

import os

from monarch.actor import Actor, context, endpoint


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
