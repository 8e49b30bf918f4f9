"""Actor classes for the cross-process tracing and metrics tests (importable by workers)."""

from __future__ import annotations

from typing import Any

from monarch.actor import Actor, context, endpoint


class Relay(Actor):
    @endpoint
    def work(self, x: int) -> int:
        return x + 1

    @endpoint
    def forward(self, other: Any, x: int) -> int:
        """Call ``other`` (a one-rank mesh) from this actor: a second hop, worker to worker."""
        return int(other.work.call_one(x).get(timeout=20)) * 10

    @endpoint
    def fail(self) -> None:
        raise ValueError("relay failure")

    @endpoint
    def die(self) -> None:
        context().actor_instance.kill("killed on purpose")
