"""Identities of processes and actors.

Why: in the design an actor is addressed by (PID, actor path) and nothing else, so meshes and
ports pickle into plain data usable from any process. ``ProcId`` wraps the Chrysalis PID of a
process; ``ActorId`` adds the actor's path inside it. Both are immutable, hashable and pickle by
value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chrysalis.core import Pid
from monarch.actor._base.envelope import ActorAddr

__all__ = ["ActorId", "ProcId"]


@dataclass(frozen=True, slots=True, order=True)
class ProcId:
    """A process: its Chrysalis PID (``label`` is a human hint, not part of identity)."""

    pid: Pid
    label: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.pid.hex()[:12]


@dataclass(frozen=True, slots=True, order=True)
class ActorId:
    """An actor: its process and its path inside that process."""

    proc: ProcId
    path: str

    @property
    def addr(self) -> ActorAddr:
        """The wire address."""
        return ActorAddr(self.proc.pid.raw, self.path)

    def __str__(self) -> str:
        return f"{self.path}@{self.proc}"
