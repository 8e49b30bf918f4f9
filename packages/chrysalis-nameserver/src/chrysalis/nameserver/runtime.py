"""The few runtime services the nameserver I/O layer needs, for asyncio and for trio.

They live in ``chrysalis.core.runtime`` (shared with ``chrysalis.quic`` and
``chrysalis.node``); this module re-exports them under the names it always had, so code
written against ``chrysalis.nameserver.runtime`` keeps working. ``current_library`` is
``chrysalis.core.runtime.current_async_library``.
"""

from __future__ import annotations

from chrysalis.core.runtime import (
    AsyncioSpawner,
    Event,
    Spawner,
    Task,
    TrioSpawner,
    default_spawner,
    fail_after,
    is_cancellation,
    join_shielded,
    monotonic,
    monotonic_millis,
    new_event,
    race,
    run_in_thread,
    sleep,
)
from chrysalis.core.runtime import current_async_library as current_library

__all__ = [
    "AsyncioSpawner",
    "Event",
    "Spawner",
    "Task",
    "TrioSpawner",
    "current_library",
    "default_spawner",
    "fail_after",
    "is_cancellation",
    "join_shielded",
    "monotonic",
    "monotonic_millis",
    "new_event",
    "race",
    "run_in_thread",
    "sleep",
]
