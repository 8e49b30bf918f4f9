"""Actors the worker processes of the tests import by name."""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint

TORCHRUN_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class EnvReader(Actor):
    """Reads its process's environment."""

    @endpoint
    def torchrun_env(self) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in TORCHRUN_NAMES}

    @endpoint
    def pid(self) -> int:
        return os.getpid()
