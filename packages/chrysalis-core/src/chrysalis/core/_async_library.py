"""Which async library runs the current task, found without importing asyncio or trio (so
that ``chrysalis.core.completion`` can use it and still import neither). Public as
``chrysalis.core.runtime.current_async_library``."""

from __future__ import annotations

import sys

__all__ = ["current_async_library"]


def current_async_library(caller: str = "this call") -> str:
    """``"trio"`` or ``"asyncio"`` for the running task, without importing either library.

    Raises ``RuntimeError`` outside both (``caller`` names what needed one in the message).
    """
    trio_module = sys.modules.get("trio")
    if trio_module is not None:
        try:
            trio_module.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return "trio"
    asyncio_module = sys.modules.get("asyncio")
    if asyncio_module is not None:
        try:
            asyncio_module.get_running_loop()
        except RuntimeError:
            pass
        else:
            return "asyncio"
    raise RuntimeError(f"{caller} needs a running asyncio or trio task")
