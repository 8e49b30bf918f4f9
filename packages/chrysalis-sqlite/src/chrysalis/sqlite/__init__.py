"""Replicated SQLite over Chrysalis Node links with row-level last-writer-wins convergence."""

from __future__ import annotations

__all__: list[str] = []
