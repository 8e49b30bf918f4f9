"""Monarch configuration (``monarch.config``): settings of the actor runtime.

Skeleton: the settings land with the monarch-actor issue.
"""

from __future__ import annotations

__all__: list[str] = []
