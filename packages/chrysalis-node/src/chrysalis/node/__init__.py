"""Chrysalis Node facade, the `chrysalis` command, address resolvers and the scale tool."""

from __future__ import annotations

__all__: list[str] = []
