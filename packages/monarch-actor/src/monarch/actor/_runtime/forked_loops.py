"""The ``.get()`` event loops a forked child must never run or close (``returns_future``,
"Forks"), in a module of their own.

Why a module of its own: the function given to ``os.register_at_fork`` lives as long as the
interpreter, and with it the globals of the module that defines it, which interpreter exit
then never clears. Registered from ``returns_future``, that kept the runtime's modules, and
through them the program's own objects, alive past the release of module globals at exit:
an exec'd worker's module-level ``__del__`` never ran (``test_lifecycle``'s finalizer tests).
Here the registered function's globals are this module's: the standard library, a weak
registry and what could not be abandoned.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

__all__ = ["LOOPS", "abandon"]

#: Live ``_ThreadLoop``s by ``id`` of their event loop (weakly: a thread's ends with it): the
#: task factory finds its owner here, a fork abandons them.
LOOPS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

_ABANDONED: list[Any] = []


def abandon(loop: Any) -> None:
    """In a forked child: make an inherited loop inert without touching the epoll instance and
    self-pipe it shares with the parent (``returns_future``, "Forks")."""
    if hasattr(loop, "_closed"):
        loop._closed = True  # close() and the finalizer then leave it alone
    else:  # pragma: no cover - not an asyncio selector loop: keep it, unclosed, for good
        _ABANDONED.append(loop)


def _abandon_inherited() -> None:
    """After a fork, in the child: every loop of the parent's threads is abandoned, also one
    the forking thread was running a body on (asyncio itself no longer reports it running in
    the child; a child that goes on in it fails loudly instead of sharing the parent's)."""
    for owner in list(LOOPS.values()):
        abandon(owner.loop)
    LOOPS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_abandon_inherited)
