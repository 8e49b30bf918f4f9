"""Actors of the Slurm and Kubernetes tests (the workers on those hosts import them by name)."""

from __future__ import annotations

import os
import socket

from monarch.actor import Actor, endpoint


class Where(Actor):
    """Says where it runs: the Slurm node (or pod) name, the host name and its process id."""

    @endpoint
    def where(self) -> tuple[str, str, int]:
        node = os.environ.get("SLURMD_NODENAME") or os.environ.get("MONARCH_POD_NAME", "")
        return node, socket.gethostname(), os.getpid()

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b
