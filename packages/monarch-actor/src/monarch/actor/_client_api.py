"""Client-wide entry points: the fault hook, shutdown, and the in-process proc mesh helper.

Why a module of its own: these functions are looked up or replaced by users at module level
(``monarch.actor.unhandled_fault_hook = f``), so the facade re-exports them as plain functions
while the machinery stays in ``_runtime``.
"""

from __future__ import annotations

import sys
import threading

from monarch.actor._errors import MeshFailure
from monarch.actor._future import Future, _Cell
from monarch.actor._runtime import shutdown_client

__all__ = ["default_unhandled_fault_hook", "shutdown_context"]


def default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """The default ``unhandled_fault_hook``: exit with status 1.

    The runtime catches the ``SystemExit``, writes the failure report to stderr and interrupts
    the main thread with ``KeyboardInterrupt``, so ``atexit`` handlers run.
    """
    sys.exit(1)


def shutdown_context(timeout: float = 5.0) -> Future[None]:
    """Tear down the client: stop every mesh the root client owns, then the runtime loop.

    Idempotent (a second call resolves to ``None`` at once); bounded by ``timeout`` seconds per
    stop. Using the API again afterwards bootstraps a fresh client.
    """
    cell: _Cell[None] = _Cell()

    def run() -> None:
        try:
            shutdown_client(timeout)
        except BaseException as exc:
            cell.set_exception(exc)
        else:
            cell.set_result(None)

    threading.Thread(target=run, name="monarch-shutdown", daemon=True).start()
    return Future._create(cell)
