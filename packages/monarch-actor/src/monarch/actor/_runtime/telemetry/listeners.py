"""What the stores of ``telemetry`` share: bounded listener lists and the default ring size.

Spans (``tracing``) and supervision records (``records``) each keep a ring of the most recent
entries and a list of listeners called as entries are made; both are bounded here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final

__all__ = ["DEFAULT_RING_CAPACITY", "MAX_LISTENERS", "add_listener"]

#: Listeners per kind (supervision records, spans).
MAX_LISTENERS: Final = 64
#: Default capacity of the supervision-record ring and of the finished-span ring.
DEFAULT_RING_CAPACITY: Final = 4096

_listeners_lock = threading.Lock()


def add_listener(listeners: list[Any], listener: Any) -> Callable[[], None]:
    """Append ``listener`` to ``listeners`` (at most ``MAX_LISTENERS``, ``ValueError`` beyond);
    returns a function that removes it again."""
    with _listeners_lock:
        if len(listeners) >= MAX_LISTENERS:
            raise ValueError(f"too many listeners (limit {MAX_LISTENERS})")
        listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in listeners:
                listeners.remove(listener)

    return remove
