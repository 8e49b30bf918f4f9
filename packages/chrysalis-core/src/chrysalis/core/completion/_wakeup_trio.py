"""trio waiting for ``Wakeup`` (imported lazily, so importing the package never loads trio).

A waiter is a ``trio.Event``; the wake callback sets it through ``TrioToken.run_sync_soon``,
which is safe from any thread. A finished run makes the callback a no-op.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from chrysalis.core.completion._wakeup import Wakeup

__all__ = ["wait_trio"]


async def wait_trio(wakeup: Wakeup, since: int) -> None:
    """Wait on ``wakeup`` until its epoch differs from ``since`` (always a checkpoint)."""
    token = trio.lowlevel.current_trio_token()
    event = trio.Event()

    def wake() -> None:
        with contextlib.suppress(trio.RunFinishedError):  # a finished run has nobody to wake
            token.run_sync_soon(event.set)

    if not wakeup._register(since, wake):
        await trio.lowlevel.checkpoint()
        return
    try:
        await event.wait()
    finally:
        wakeup._unregister(wake)
