"""asyncio waiting for ``Wakeup`` (imported lazily, so importing the package never loads asyncio).

A waiter is a future on the caller's loop; the wake callback resolves it through
``call_soon_threadsafe``, which is safe from the driver thread and from the loop thread alike.
A closed loop makes the callback a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chrysalis.core.completion._wakeup import Wakeup

__all__ = ["wait_asyncio"]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_asyncio(wakeup: Wakeup, since: int) -> None:
    """Wait on ``wakeup`` until its epoch differs from ``since`` (always yields once)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop has nobody left to wake
            loop.call_soon_threadsafe(_resolve, future)

    if not wakeup._register(since, wake):
        await asyncio.sleep(0)
        return
    try:
        await future
    finally:
        wakeup._unregister(wake)
