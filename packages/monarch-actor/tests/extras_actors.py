"""Actors for ``test_public_extras`` (workers import them by module name)."""

from __future__ import annotations

import logging
import os
import sys

from monarch.actor import Actor, endpoint
from monarch.config import get_global_config


class Probe(Actor):
    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def executable(self) -> str:
        return sys.executable

    @endpoint
    def root_level(self) -> int:
        return logging.getLogger().getEffectiveLevel()

    @endpoint
    def setting(self, name: str) -> object:
        return get_global_config()[name]

    @endpoint
    def add(self, a: int, b: int) -> int:
        return a + b
