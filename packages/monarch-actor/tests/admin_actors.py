"""Actor classes for the admin endpoint and ``monarch top`` tests (importable by workers)."""

from __future__ import annotations

from monarch.actor import Actor, context, endpoint


class Ticker(Actor):
    """Counts its ticks; ``fail`` raises (a user error: the actor lives on)."""

    def __init__(self) -> None:
        self.ticks = 0

    @endpoint
    def tick(self) -> int:
        self.ticks += 1
        return self.ticks

    @endpoint
    def fail(self) -> None:
        raise ValueError("ticker failure")

    @endpoint
    def die(self) -> None:
        context().actor_instance.abort("ticker died on purpose")
