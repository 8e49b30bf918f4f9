"""One ``monarch.config`` setting's effective value, cheaply.

``monarch.config.get_global_config()`` builds every setting's value (about a hundred, durations
formatted) and costs tens of microseconds; a transfer needs three or four settings, so it reads
them one by one through the registry's own getter (runtime override, else environment, else
default: the same answer as ``get_global_config()[name]`` for the non-duration keys used here).
"""

from __future__ import annotations

from typing import Any

from monarch.config import _registry

__all__ = ["setting"]


def setting(name: str) -> Any:
    """The effective value of ``monarch.config`` setting ``name``."""
    return _registry.get(name)
