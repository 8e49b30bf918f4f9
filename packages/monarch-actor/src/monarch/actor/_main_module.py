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
"""

from __future__ import annotations

import runpy
import sys
import types

__all__ = ["import_main", "main_reference"]


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

    Raises whatever the module raises while it runs, and ``ValueError`` for an unknown kind.
    """
    if kind == "name":
        namespace = runpy.run_module(value, run_name="__mp_main__", alter_sys=True)
    elif kind == "path":
        namespace = runpy.run_path(value, run_name="__mp_main__")
    else:
        raise ValueError(f"unknown main module reference kind {kind!r}")
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(namespace)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
