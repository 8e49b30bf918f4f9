"""Chrysalis nameserver: versioned protocol, bounded codec, directory and resolver state
machines, sessions and links.
"""

from __future__ import annotations

__all__: list[str] = []
