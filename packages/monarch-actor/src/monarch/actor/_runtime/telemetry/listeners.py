"""What the stores of ``telemetry`` share: bounded listener lists and the default ring size.

Spans (``tracing``) and supervision records (``records``) each keep a ring of the most recent
entries and a list of listeners called as entries are made; both are bounded here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Final

__all__ = ["DEFAULT_RING_CAPACITY", "MAX_LISTENERS", "add_listener"]

#: Listeners per kind (supervision records, spans).
MAX_LISTENERS: Final = 64
#: Default capacity of the supervision-record ring and of the finished-span ring.
DEFAULT_RING_CAPACITY: Final = 4096

#: Held while a listener list changes (and while ``changed`` runs: ``add_listener``); read as
#: this module's attribute, since a forked child replaces it (``_after_fork``).
_listeners_lock = threading.Lock()


def add_listener(
    listeners: list[Any], listener: Any, changed: Callable[[], None] | None = None
) -> Callable[[], None]:
    """Append ``listener`` to ``listeners`` (at most ``MAX_LISTENERS``, ``ValueError`` beyond);
    returns a function that removes it again. ``changed()``, if given, is called after each
    change while the lock is still held, so what it derives from the list is stored in the
    same order as the changes (it must not take the lock itself)."""
    with _listeners_lock:
        if len(listeners) >= MAX_LISTENERS:
            raise ValueError(f"too many listeners (limit {MAX_LISTENERS})")
        listeners.append(listener)
        if changed is not None:
            changed()

    def remove() -> None:
        with _listeners_lock:
            if listener in listeners:
                listeners.remove(listener)
                if changed is not None:
                    changed()

    return remove


def _after_fork() -> None:
    """A forked child gets a new lock: a thread of the parent may have held the old one, and
    that thread is not here."""
    global _listeners_lock
    _listeners_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)
