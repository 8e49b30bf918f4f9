"""Make the client's ``__main__`` importable in worker processes.

Why: Monarch programs define their actor classes in the script they run
(``python train.py``), and those classes are pickled by reference (``__main__.Trainer``). A
worker started with ``python -m monarch.actor._worker`` has its own ``__main__``, so the lookup
would fail. The client therefore tells each worker how to find its main module, and the worker
loads it the way ``multiprocessing``'s spawn start method does: the script runs under the name
``__mp_main__`` (so its ``if __name__ == "__main__":`` block does not run again) and is installed
as both ``__main__`` and ``__mp_main__``. Objects of classes defined there pickle back to the
client as ``__mp_main__.X``; the client aliases ``__mp_main__`` to its own ``__main__``.

Nothing is loaded for interactive sessions, ``python -c``, or a ``-m`` main that is itself a
package's ``__main__`` (pytest, for instance).

A script that keeps its program outside ``if __name__ == "__main__":`` would run it again in
every worker. While a worker imports the main module, starting Monarch there (``this_host()``,
a client for ``this_proc()``/``context()``/spawning) raises ``UnguardedMainError``, which says
so; the worker then fails its start with that message (``_hosts.worker``), and the client's
``spawn_procs`` reports it instead of a timeout.

In ``_runtime`` (not ``_hosts``, where the worker and the spawning code use it too): the client
runtime itself refuses to start while the main module is being imported
(``refuse_while_importing``), and a layer imports only itself and the layers below.
"""

from __future__ import annotations

import runpy
import sys
import types

__all__ = [
    "UnguardedMainError",
    "import_main",
    "main_reference",
    "refuse_while_importing",
    "refused_while_importing",
    "unguarded_message",
]

#: The main module a worker is importing now (``import_main``), else None.
_importing: str | None = None
#: The first ``UnguardedMainError`` message of that import (kept: the script may catch it).
_refused: str | None = None


class UnguardedMainError(RuntimeError):
    """The client's main module started Monarch while a worker process imported it."""


def unguarded_message(module: str, what: str) -> str:
    """What is wrong when ``module`` ran ``what`` while a worker imported it, and the fix."""
    return (
        f"the client's main module {module} ran {what} while a worker process imported it. "
        "Worker processes import the main module to find the actor classes defined there, "
        "so a program that runs on import runs again in every worker: put it under "
        '`if __name__ == "__main__":` (as with multiprocessing)'
    )


def refuse_while_importing(what: str) -> None:
    """Raise ``UnguardedMainError`` if this worker is importing the client's main module now.

    Called where Monarch would start in this process (``this_host()`` in a worker, the first
    ``client()``): in a worker that can only be the main module's program running on import.
    """
    global _refused
    module = _importing
    if module is not None:
        message = unguarded_message(module, what)
        if _refused is None:
            _refused = message
        raise UnguardedMainError(message)


def refused_while_importing() -> str | None:
    """The message of the first refusal during the last ``import_main``, if any."""
    return _refused


def main_reference() -> tuple[str, str] | None:
    """Where a worker finds this process's main module: ``("name"|"path", value)`` or None."""
    main = sys.modules.get("__main__")
    if main is None:
        return None
    sys.modules.setdefault("__mp_main__", main)
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if isinstance(name, str):
        if name == "__main__" or name.endswith(".__main__"):
            return None
        return ("name", name)
    path = getattr(main, "__file__", None)
    if isinstance(path, str) and path.endswith(".py"):
        return ("path", path)
    return None


def import_main(kind: str, value: str) -> None:
    """Load the client's main module as ``__mp_main__`` and alias it as ``__main__``.

    Raises whatever the module raises while it runs (``UnguardedMainError`` if it starts
    Monarch, see ``refuse_while_importing``), and ``ValueError`` for an unknown kind.
    """
    global _importing, _refused
    if kind not in ("name", "path"):
        raise ValueError(f"unknown main module reference kind {kind!r}")
    _importing, _refused = value, None
    try:
        if kind == "name":
            namespace = runpy.run_module(value, run_name="__mp_main__", alter_sys=True)
        else:
            namespace = runpy.run_path(value, run_name="__mp_main__")
    finally:
        _importing = None
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(namespace)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
