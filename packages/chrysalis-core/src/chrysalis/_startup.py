"""A process's start-up import window: the compiled code of dataclasses' generated methods
and of regular expressions, kept across processes (``DataclassCodeCache``,
``RegexProgramCache``).

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

Only the entry points of worker processes (``monarch.actor``'s and ``monarch.job``'s) and the
``chrysalis`` command line's own process (around its parsing and its command's imports) activate
it; a program that imports Chrysalis keeps ``dataclasses`` as it is.
This module imports the standard library only: it must be importable before the stack.

Regular expressions: the stack's modules (and the standard library's and cryptography's under
them) compile about 70 patterns when they load (``re.compile`` at module level: parsing and
code generation in Python, about a tenth of a worker loop's imports; cryptography's
``x509.name`` alone 5 ms). ``RegexProgramCache`` stands in for ``re._compiler.compile`` while
active and keeps each pattern's program (what ``_sre.compile`` is given: the code words, the
flags, the groups), keyed by the pattern and its flags, in a second file beside the first; a
later process makes the same ``re.Pattern`` from it with ``_sre.compile``, which checks the
program (a damaged entry is compiled again). The file is tied to the interpreter's version and
its ``_sre`` engine. ``import_window`` activates both caches.

``DeferredPackage`` serves the same entry points: a worker loop listens (and is attached) before
it imports what only its first spawn needs. Importing a submodule of a package runs the
package's ``__init__`` first, and ``monarch.actor``'s is the whole facade; a ``DeferredPackage``
puts the package in ``sys.modules`` without running its ``__init__`` (its submodules import as
usual), and runs it later, once: when ``run()`` is called, or when a name the package does not
have yet is looked up on it (PEP 562 ``__getattr__``), whichever comes first.
"""

from __future__ import annotations

import _sre  # type: ignore[import-not-found]  # (no stubs: re's engine)
import builtins
import contextlib
import dataclasses
import gc
import importlib.util
import marshal
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from importlib.util import MAGIC_NUMBER
from types import CodeType, ModuleType
from typing import Any, Final

__all__ = [
    "MAX_ENTRIES",
    "DataclassCodeCache",
    "DeferredPackage",
    "RegexProgramCache",
    "dataclass_code_cache",
    "import_window",
    "regex_program_cache",
]

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
        loaded = _read_file(self.path, _FORMAT + MAGIC_NUMBER)
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
        if not self.misses:
            return False
        return _write_file(self.path, _FORMAT + MAGIC_NUMBER, self._used, self._known)


def _read_file(path: str, head: bytes) -> dict[Any, Any]:
    """The dict a cache file holds after its ``head``; empty when the file is missing, too
    large, foreign (another head) or damaged."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError:
        return {}
    if len(data) > MAX_FILE_BYTES or not data.startswith(head):
        return {}
    try:
        loaded = marshal.loads(data[len(head) :])
    except (EOFError, ValueError, TypeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _write_file(path: str, head: bytes, used: dict[Any, Any], known: dict[Any, Any]) -> bool:
    """Write a cache file atomically: the entries this process used, then others it knew, at
    most ``MAX_ENTRIES``; none when byte code is not written. True if it was written."""
    if sys.dont_write_bytecode:
        return False
    entries = dict(used)
    for key, value in known.items():
        if len(entries) >= MAX_ENTRIES:
            break
        entries.setdefault(key, value)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(head + marshal.dumps(entries))
        os.replace(tmp, path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    except BaseException:  # an interrupt while writing: leave no temporary file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


last: DataclassCodeCache | None = None
"""The cache of this process's last ``dataclass_code_cache`` window (for tests and reports)."""


_ABSENT: Final = object()


@contextlib.contextmanager
def _patch_window(
    namespace: dict[str, Any],
    name: str,
    free: object,
    cache: DataclassCodeCache | RegexProgramCache,
    patch: Callable[..., Any],
    last_name: str,
) -> Iterator[None]:
    """While the block runs, ``namespace[name]`` is ``patch`` (a method of ``cache``) if it is
    ``free`` now (``_ABSENT``: not set), then it is ``free`` again (unless someone replaced the
    patch), ``cache`` is saved and becomes this module's ``last_name``. Else (another window is
    active, or someone else's patch) nothing changes: only the outermost window caches."""
    if namespace.get(name, _ABSENT) is not free:
        yield
        return
    namespace[name] = patch
    try:
        yield
    finally:
        if namespace.get(name) == patch:
            if free is _ABSENT:
                del namespace[name]
            else:
                namespace[name] = free
        cache.save()
        globals()[last_name] = cache


@contextlib.contextmanager
def dataclass_code_cache(directory: str | None = None) -> Iterator[DataclassCodeCache]:
    """While the block runs, ``dataclasses`` compiles through a ``DataclassCodeCache``; the file
    is saved when it ends. Nested or concurrent use: only the outermost window caches."""
    cache = DataclassCodeCache(directory)
    with _patch_window(dataclasses.__dict__, "exec", _ABSENT, cache, cache.exec, "last"):
        yield cache


REGEX_FILE_NAME: Final = f"regex-code.{sys.implementation.cache_tag}.bin"
_REGEX_FORMAT: Final = (
    f"chrysalis-regex-code-1 {sys.version} {_sre.MAGIC} {_sre.CODESIZE} {sys.maxunicode}\n"
).encode()
#: One program: (flags, code words, groups - 1, group index, index group), as ``_sre.compile``
#: takes them after the pattern.
_Program = tuple[int, list[int], int, dict[str, int], tuple[str | None, ...]]


class RegexProgramCache:
    """Regular expression programs by pattern and flags (see the module's doc)."""

    def __init__(self, directory: str | None = None) -> None:
        where = default_directory() if directory is None else directory
        self.path = os.path.join(where, REGEX_FILE_NAME)
        self.hits = 0
        self.misses = 0
        self._known: dict[tuple[str | bytes, int], _Program] = self._read()
        self._used: dict[tuple[str | bytes, int], _Program] = {}

    def _read(self) -> dict[tuple[str | bytes, int], _Program]:
        return _read_file(self.path, _REGEX_FORMAT)  # an entry is checked when it is used

    def compile(self, pattern: Any, flags: int = 0) -> Any:
        """``re._compiler.compile(pattern, flags)``, a string pattern's program made once across
        processes (``re.compile`` calls it on a miss of its own per-process cache)."""
        if not isinstance(pattern, str | bytes) or flags & re.DEBUG:
            return _compile_program(pattern, flags)
        key = (pattern, int(flags))
        program = self._known.get(key)
        if program is not None:
            try:
                compiled = _sre.compile(pattern, *program)
            except Exception:  # a damaged entry: _sre checks the program
                program = None
            else:
                self.hits += 1
                self._used[key] = program
                return compiled
        parsed = re._parser.parse(pattern, flags)  # type: ignore[attr-defined]
        state = parsed.state
        indexgroup: list[str | None] = [None] * state.groups
        for name, index in state.groupdict.items():
            indexgroup[index] = name
        program = (
            int(flags | state.flags),
            [int(word) for word in re._compiler._code(parsed, flags)],  # type: ignore[attr-defined]
            state.groups - 1,
            dict(state.groupdict),
            tuple(indexgroup),
        )
        self._known[key] = self._used[key] = program
        self.misses += 1
        return _sre.compile(pattern, *program)

    def save(self) -> bool:
        """Write the file (atomically) if this process compiled something new; True if it did."""
        if not self.misses:
            return False
        return _write_file(self.path, _REGEX_FORMAT, self._used, self._known)


_compile_program = re._compiler.compile  # type: ignore[attr-defined]
last_regex: RegexProgramCache | None = None
"""The cache of this process's last ``regex_program_cache`` window (for tests and reports)."""


@contextlib.contextmanager
def regex_program_cache(directory: str | None = None) -> Iterator[RegexProgramCache]:
    """While the block runs, ``re`` compiles patterns through a ``RegexProgramCache``; the file
    is saved when it ends. Nested or concurrent use: only the outermost window caches."""
    cache = RegexProgramCache(directory)
    namespace = re._compiler.__dict__  # type: ignore[attr-defined]
    with _patch_window(namespace, "compile", _compile_program, cache, cache.compile, "last_regex"):
        yield cache


@contextlib.contextmanager
def import_window() -> Iterator[None]:
    """A worker entry point's import window: the cyclic collector paused (the imports make
    long-lived objects only, and collections while importing find no garbage), dataclasses
    and regular expressions compiled through the caches (``dataclass_code_cache``,
    ``regex_program_cache``), and what the imports made
    moved to the permanent generation at the end (``gc.freeze``: else the first full
    collection walks all of it). A collector already off (another window, or the program's
    choice) is left as it is, and nothing is frozen then."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        with dataclass_code_cache(), regex_program_cache():
            yield
    finally:
        if paused:
            gc.freeze()
            gc.enable()


class DeferredPackage:
    """Package ``name`` in ``sys.modules`` with its ``__init__`` not run yet (module doc).

    Made before anything imports the package (``RuntimeError`` if it is imported already,
    ``ImportError`` if it cannot be found). Its submodules import as usual meanwhile. ``run()``
    runs the ``__init__`` in the same module object, once (in an ``import_window``; a second
    call, from any thread, waits for the first and returns the module), so names already bound
    by importing submodules stay the same objects. Until then, looking up a name the module
    lacks runs it first, except for the package's submodules, which ``from package import
    submodule`` looks up before importing them.
    """

    def __init__(self, name: str) -> None:
        if name in sys.modules:
            raise RuntimeError(f"{name} is imported already: its __init__ cannot be deferred")
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            raise ImportError(f"{name} is not a package that can be imported", name=name)
        self.name = name
        self._spec = spec
        self._lock = threading.RLock()
        self._done = False
        self.module = importlib.util.module_from_spec(spec)
        self.module.__getattr__ = self._getattr  # type: ignore[method-assign]
        sys.modules[name] = self.module

    @property
    def done(self) -> bool:
        """Whether the ``__init__`` ran (or is running, on this thread)."""
        return self._done

    def run(self) -> ModuleType:
        """Run the package's ``__init__`` now, unless it ran (see the class doc)."""
        with self._lock:
            if not self._done:
                self._done = True
                vars(self.module).pop("__getattr__", None)
                assert self._spec.loader is not None
                try:
                    with import_window():
                        self._spec.loader.exec_module(self.module)
                except BaseException:
                    sys.modules.pop(self.name, None)  # as a failed import leaves it
                    raise
        return self.module

    def _getattr(self, attribute: str) -> Any:
        if (
            attribute.startswith("__")
            or importlib.util.find_spec(f"{self.name}.{attribute}") is not None
        ):
            raise AttributeError(f"module {self.name!r} has no attribute {attribute!r}")
        return getattr(self.run(), attribute)
