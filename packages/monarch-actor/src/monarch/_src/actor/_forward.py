"""Names the reference's ``monarch._src.actor`` modules have that ``monarch.actor`` may gain.

Why: the aliases in this folder re-export public ``monarch.actor`` names. A few names the
reference has in these modules (``attach``, ``enable_transport``, ``returns_future``, ...) are
public in Monarch and may be added to ``monarch.actor`` later; the aliases look them up there
when first used (a module ``__getattr__``), so they need no edit when that happens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import monarch.actor

__all__ = ["forwarder"]


def forwarder(module: str, names: frozenset[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` that finds ``names`` in ``monarch.actor``."""

    def __getattr__(name: str) -> Any:
        if name in names:
            try:
                return getattr(monarch.actor, name)
            except AttributeError:
                raise AttributeError(
                    f"module {module!r} has no attribute {name!r}: monarch.actor has no "
                    f"{name!r} yet"
                ) from None
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
