"""Actor classes for the admin endpoint and ``monarch top`` tests (importable by workers)."""

from __future__ import annotations

from typing import Any

from monarch.actor import Actor, context, endpoint, this_host


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


class Spawner(Actor):
    """Spawns a proc mesh of its own from inside its worker, with a ``Ticker`` on it."""

    def __init__(self) -> None:
        self.procs: Any = None
        self.tickers: Any = None

    @endpoint
    def spawn(self, name: str) -> int:
        self.procs = this_host().spawn_procs(per_host={"gpus": 1}, name=name)
        self.tickers = self.procs.spawn("inner", Ticker)
        return int(self.tickers.tick.call_one().get(timeout=30))

    @endpoint
    def stop_inner(self) -> None:
        if self.procs is not None:
            self.procs.stop().get(timeout=30)
            self.procs = None
