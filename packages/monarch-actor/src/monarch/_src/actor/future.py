"""``monarch._src.actor.future`` as Monarch's documentation and examples import it:
``Future``, re-exported from ``monarch.actor``."""

from __future__ import annotations

from monarch.actor import Future

__all__ = ["Future"]
