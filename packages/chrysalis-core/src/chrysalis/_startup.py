"""A process's start-up import window: the compiled code of dataclasses' generated methods,
kept across processes (``DataclassCodeCache``).

Why: a worker loop or worker process started fresh spends most of its start-up importing the
stack (monarch-job's issue 19: every host of a job starts one at once, and the job is ready when
the slowest listens), and about a third of that import is making dataclasses: Chrysalis, Monarch
and aioquic define some 190 of them, and for each the standard library's ``dataclasses``
writes the source of ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``...
and compiles it with ``exec``, one method at a time (about 1,000 compilations, two thirds of
the dataclass time). Byte-code caches (``.pyc``) keep a module's compiled code across processes,
but not that of code generated while it runs.

What: ``DataclassCodeCache`` stands in for ``exec`` inside the ``dataclasses`` module while it
is active, compiles each generated source once (exactly as ``exec`` would: the file name
``<string>``, no future flags of its caller) and keeps the code objects, keyed by their source
text, in a file beside the byte-code caches (``sys.pycache_prefix`` when set, else this
package's ``__pycache__``; written atomically, and only after a process compiled something new;
none when ``sys.dont_write_bytecode``). A later process's same source gets the same code
without compiling it. The classes made are the same as without it: the cache only saves the
compilation, keyed by the complete source, and the file is tied to the interpreter's byte-code
magic number. A missing, unreadable, foreign or damaged file is an empty cache; a file that
cannot be written is skipped.

Only the entry points of worker processes (``monarch.actor``'s and ``monarch.job``'s) activate
it, around their own imports; a program that imports Chrysalis keeps ``dataclasses`` as it is.
This module imports the standard library only: it must be importable before the stack.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import marshal
import os
import sys
from collections.abc import Iterator
from importlib.util import MAGIC_NUMBER
from types import CodeType
from typing import Any, Final

__all__ = ["MAX_ENTRIES", "DataclassCodeCache", "dataclass_code_cache"]

MAX_ENTRIES: Final = 8192
"""At most this many sources in the file (those this process used first, then older ones)."""
MAX_FILE_BYTES: Final = 32 * 1024 * 1024
"""A cache file larger than this is not read (it is replaced)."""
_FORMAT: Final = b"chrysalis-dataclass-code-1\n"
FILE_NAME: Final = f"dataclass-code.{sys.implementation.cache_tag}.bin"


def default_directory() -> str:
    """Where the cache file lives: beside the byte-code caches."""
    if sys.pycache_prefix:
        return os.path.join(sys.pycache_prefix, "chrysalis")
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")


class DataclassCodeCache:
    """Compiled code of generated sources, by source text (see the module's doc)."""

    def __init__(self, directory: str | None = None) -> None:
        self.path = os.path.join(default_directory() if directory is None else directory, FILE_NAME)
        self.hits = 0
        self.misses = 0
        self._known: dict[str, CodeType] = self._read()
        self._used: dict[str, CodeType] = {}

    def _read(self) -> dict[str, CodeType]:
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError:
            return {}
        head = _FORMAT + MAGIC_NUMBER
        if len(data) > MAX_FILE_BYTES or not data.startswith(head):
            return {}
        try:
            loaded = marshal.loads(data[len(head) :])
        except (EOFError, ValueError, TypeError):
            return {}
        if not isinstance(loaded, dict):
            return {}
        return {k: v for k, v in loaded.items() if isinstance(k, str) and isinstance(v, CodeType)}

    def exec(
        self,
        source: Any,
        globals: dict[str, Any] | None = None,
        locals: Any = None,
        /,
    ) -> None:
        """``exec(source, globals, locals)``, with ``source`` compiled once across processes."""
        if not isinstance(source, str):
            builtins.exec(source, globals, locals)
            return
        code = self._known.get(source)
        if code is None:
            # as ``exec`` compiles a string called from ``dataclasses``: no future flags
            code = compile(source, "<string>", "exec", dont_inherit=True)
            self._known[source] = code
            self.misses += 1
        else:
            self.hits += 1
        self._used[source] = code
        builtins.exec(code, globals, locals)

    def save(self) -> bool:
        """Write the file (atomically) if this process compiled something new; True if it did."""
        if not self.misses or sys.dont_write_bytecode:
            return False
        entries = dict(self._used)
        for source, code in self._known.items():
            if len(entries) >= MAX_ENTRIES:
                break
            entries.setdefault(source, code)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(_FORMAT + MAGIC_NUMBER + marshal.dumps(entries))
            os.replace(tmp, self.path)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        return True


last: DataclassCodeCache | None = None
"""The cache of this process's last ``dataclass_code_cache`` window (for tests and reports)."""


@contextlib.contextmanager
def dataclass_code_cache(directory: str | None = None) -> Iterator[DataclassCodeCache]:
    """While the block runs, ``dataclasses`` compiles through a ``DataclassCodeCache``; the file
    is saved when it ends. Nested or concurrent use: only the outermost window caches."""
    global last
    cache = DataclassCodeCache(directory)
    namespace = vars(dataclasses)
    if "exec" in namespace:  # another window is active (or someone else's patch): leave it
        yield cache
        return
    namespace["exec"] = cache.exec
    try:
        yield cache
    finally:
        if namespace.get("exec") == cache.exec:
            del namespace["exec"]
        cache.save()
        last = cache
