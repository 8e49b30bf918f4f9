"""The worker's exit watches: the daemon threads that end a worker whose parent is gone.

Why a module of its own, importing only the standard library: these threads are still alive
when the worker's interpreter finalizes after a normal stop, and a thread's frame keeps its
function's module globals alive past the interpreter's clearing of modules. Were they defined
in ``worker`` (whose globals name the runtime's functions, and through them the runtime, its
actors and the program's modules), the program's module globals would never be released at
exit and their ``__del__`` would not run (Monarch runs them on ``ProcMesh.stop()``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Final

__all__ = ["EXIT_FENCED", "EXIT_ORPHANED", "exit_when_orphaned", "exit_when_stdin_ends"]

#: Exit status of a worker whose parent link was gone for longer than its bound.
EXIT_ORPHANED: Final = 3
#: Exit status of a worker that learnt it may have been declared dead (its lease ran out).
EXIT_FENCED: Final = 4


def exit_when_orphaned(orphaned: threading.Event, label: str) -> None:
    """Exit (``EXIT_ORPHANED``, at once: no orphan survives, even with actor threads stuck in
    user code) once ``orphaned`` is set."""
    orphaned.wait()
    sys.stderr.write(f"monarch worker {label}: the parent link is gone; exiting (no orphans)\n")
    sys.stderr.flush()
    os._exit(EXIT_ORPHANED)


def exit_when_stdin_ends(label: str) -> None:
    """The host daemon holds our stdin open while it lives; its end means it died."""
    with contextlib.suppress(Exception):  # the raw fd: no buffer lock held at shutdown
        while os.read(0, 4096):
            pass
    sys.stderr.write(f"monarch worker {label}: the host's worker loop is gone; exiting\n")
    sys.stderr.flush()
    os._exit(EXIT_ORPHANED)
