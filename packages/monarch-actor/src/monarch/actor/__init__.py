"""Monarch-compatible actors, meshes and supervision on Chrysalis (`from monarch.actor import
Actor, endpoint, this_host`).
"""

from __future__ import annotations

__all__: list[str] = []
