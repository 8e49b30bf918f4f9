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
import threading
from typing import Final

__all__ = [
    "EXIT_FENCED",
    "EXIT_ORPHANED",
    "exit_when_orphaned",
    "exit_when_stdin_ends",
    "say_last_words",
]

#: Exit status of a worker whose parent link was gone for longer than its bound.
EXIT_ORPHANED: Final = 3
#: Exit status of a worker that learnt it may have been declared dead (its lease ran out).
EXIT_FENCED: Final = 4


def say_last_words(message: str, *, bound: float = 0.5) -> None:
    """Say why on stderr, never holding the exit for more than ``bound`` seconds: the stderr pipe
    may be gone with the client (a write raises ``BrokenPipeError``) or full with nobody reading
    it (a write blocks). The write goes to the raw fd (another thread may hold ``sys.stderr``'s
    lock) from a daemon thread, waited for at most ``bound``; the pipe is not made non-blocking,
    since its open file description is shared with the sibling processes that write to it."""

    def write() -> None:
        with contextlib.suppress(Exception):
            os.write(2, message.encode("utf-8", "replace"))

    writer = threading.Thread(target=write, name="last-words", daemon=True)
    writer.start()
    writer.join(bound)


def exit_when_orphaned(orphaned: threading.Event, label: str) -> None:
    """Exit (``EXIT_ORPHANED``, at once: no orphan survives, even with actor threads stuck in
    user code) once ``orphaned`` is set."""
    orphaned.wait()
    say_last_words(f"monarch worker {label}: the parent link is gone; exiting (no orphans)\n")
    os._exit(EXIT_ORPHANED)


def exit_when_stdin_ends(label: str) -> None:
    """The host daemon holds our stdin open while it lives; its end means it died."""
    with contextlib.suppress(Exception):  # the raw fd: no buffer lock held at shutdown
        while os.read(0, 4096):
            pass
    say_last_words(f"monarch worker {label}: the host's worker loop is gone; exiting\n")
    os._exit(EXIT_ORPHANED)
