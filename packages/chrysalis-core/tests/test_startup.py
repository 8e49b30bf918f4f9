"""``chrysalis._startup``: dataclasses and regular expressions made through the caches are the
same as without them, the caches are kept across processes (files), a damaged file or entry is
only a miss; the import window; a package whose ``__init__`` is deferred."""

from __future__ import annotations

import dataclasses
import gc
import importlib
import inspect
import marshal
import pickle
import re
import sys
import types
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Any

import pytest

from chrysalis import _startup
from chrysalis._startup import (
    FILE_NAME,
    REGEX_FILE_NAME,
    DataclassCodeCache,
    DeferredPackage,
    RegexProgramCache,
    dataclass_code_cache,
    import_window,
    regex_program_cache,
)

# Classes covering what dataclasses generates: defaults, factories, keyword-only fields,
# InitVar and __post_init__, ClassVar, inheritance, order, frozen with slots, unsafe_hash.
# No ``from __future__ import annotations`` in it: the generated ``__init__``'s annotations are
# then the types themselves, which a compilation with the cache module's future flags would turn
# into strings.
SOURCE = """
import dataclasses
from typing import ClassVar

@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()

@dataclasses.dataclass(order=True)
class Box:
    width: float
    items: list[int] = dataclasses.field(default_factory=list)
    scale: dataclasses.InitVar[int] = 1
    count: ClassVar[int] = 0

    def __post_init__(self, scale: int) -> None:
        self.width *= scale

@dataclasses.dataclass(frozen=True)
class Labelled(Point):
    label: str = "p"
    _: dataclasses.KW_ONLY
    weight: float = 1.0

@dataclasses.dataclass(unsafe_hash=True, slots=True)
class Mutable:
    name: str
"""


@pytest.fixture(autouse=True)
def _byte_code_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a process that writes byte code (the test run may not: PYTHONDONTWRITEBYTECODE)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", False)


def _make(window: DataclassCodeCache | None = None) -> types.ModuleType:
    """The classes of ``SOURCE`` in a fresh module (registered, so that pickle finds them)."""
    name = f"_startup_probe_{id(window)}_{len(sys.modules)}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(SOURCE, name, "exec", dont_inherit=True), vars(module))
    return module


def _describe(module: types.ModuleType) -> dict[str, Any]:
    point = module.Point(1, 2, ("a",))
    box = module.Box(2.0, [1], scale=3)
    labelled = module.Labelled(1, label="q", weight=2.0)
    mutable = module.Mutable("m")
    frozen_error = ""
    try:
        point.x = 5
    except dataclasses.FrozenInstanceError as exc:
        frozen_error = str(exc)
    out: dict[str, Any] = {
        "reprs": [repr(point), repr(box), repr(labelled), repr(mutable)],
        "eq": [point == module.Point(1, 2, ("a",)), point == module.Point(1), box == box],
        "hash": [hash(point), hash(labelled), hash(mutable)],
        "order": module.Box(1.0) < module.Box(2.0),
        "frozen": frozen_error,
        "replace": repr(dataclasses.replace(point, y=7)),
        "pickle": repr(pickle.loads(pickle.dumps(labelled))),
        "slots": [module.Point.__slots__, module.Mutable.__slots__],
        "match_args": [module.Point.__match_args__, module.Labelled.__match_args__],
        "fields": [[f.name for f in dataclasses.fields(c)] for c in (module.Box, module.Labelled)],
        "signatures": [
            str(inspect.signature(c))
            for c in (module.Point, module.Box, module.Labelled, module.Mutable)
        ],
        "init_annotations": [
            {k: repr(v) for k, v in c.__init__.__annotations__.items()}
            for c in (module.Point, module.Box, module.Labelled, module.Mutable)
        ],
        "asdict": dataclasses.asdict(labelled),
    }
    return out


def test_classes_made_through_the_cache_are_the_same_as_without_it(tmp_path: Path) -> None:
    plain = _describe(_make())
    with dataclass_code_cache(str(tmp_path)) as cold:
        through_cold = _describe(_make(cold))
    with dataclass_code_cache(str(tmp_path)) as warm:
        through_warm = _describe(_make(warm))
    assert cold.misses > 10
    assert cold.hits >= 0
    assert warm.misses == 0  # every source came from the file
    assert warm.hits == cold.hits + cold.misses
    assert through_cold == plain
    assert through_warm == plain
    assert plain["init_annotations"][0] == {
        "x": "<class 'int'>",
        "y": "<class 'int'>",
        "tags": "tuple[str, ...]",
        "return": "None",
    }


def test_the_window_ends_with_the_block_and_saves_only_when_something_was_compiled(
    tmp_path: Path,
) -> None:
    with dataclass_code_cache(str(tmp_path)) as cache:
        assert vars(dataclasses)["exec"] == cache.exec
        _make(cache)
    assert "exec" not in vars(dataclasses)
    assert _startup.last is cache
    path = tmp_path / FILE_NAME
    written = path.stat().st_mtime_ns
    with dataclass_code_cache(str(tmp_path)) as again:
        _make(again)
    assert again.misses == 0
    assert not again.save()
    assert path.stat().st_mtime_ns == written


def test_a_nested_window_leaves_the_outer_one_in_charge(tmp_path: Path) -> None:
    with dataclass_code_cache(str(tmp_path / "outer")) as outer:
        with dataclass_code_cache(str(tmp_path / "inner")) as inner:
            _make(inner)
        assert vars(dataclasses)["exec"] == outer.exec
    assert outer.misses > 0
    assert inner.misses == 0
    assert "exec" not in vars(dataclasses)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a cache at all",
        b"chrysalis-dataclass-code-1\n" + b"\x00\x00\x00\x00" + b"junk",  # another magic
        b"chrysalis-dataclass-code-1\n" + MAGIC_NUMBER + b"\xff\x00truncated",
        b"chrysalis-dataclass-code-1\n" + MAGIC_NUMBER + b"\xe9",  # marshal: EOF
    ],
)
def test_a_damaged_or_foreign_file_is_an_empty_cache_and_is_replaced(
    tmp_path: Path, content: bytes
) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    with dataclass_code_cache(str(tmp_path)) as cache:
        through = _describe(_make(cache))
    assert through == _describe(_make())
    assert cache.hits + cache.misses > 10
    assert DataclassCodeCache(str(tmp_path))._read()  # a valid file again


def test_no_file_is_written_where_byte_code_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    with dataclass_code_cache(str(tmp_path)) as cache:
        _make(cache)
    assert cache.misses > 0
    assert not (tmp_path / FILE_NAME).exists()


def test_an_unwritable_directory_is_skipped(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with dataclass_code_cache(str(blocker / "sub")) as cache:  # cannot be made
        _make(cache)
    assert cache.misses > 0
    assert not cache.save()


# Regular expressions covering what the compiler generates: literals and classes, named and
# numbered groups, back references, look-arounds, conditionals, possessive and lazy repeats,
# inline and given flags (case folding beyond ASCII, verbose, multi-line, ASCII), bytes.
PATTERNS: list[tuple[str | bytes, int]] = [
    (r"(?P<key>[A-Za-z_]\w*)\s*=\s*(?P<value>\"[^\"]*\"|\d+)", 0),
    (r"^(\d{1,3})(?:\.(\d{1,3})){3}$", 0),
    (r"(?i)stra(ss|ß)e", 0),
    (r"(?<=@)\w+(?=\.)", 0),
    (r"(<)?(\w+@\w+(?:\.\w+)+)(?(1)>|$)", 0),
    (r"(a+?)(b*+)\1", 0),
    (r"  \d+  # digits\n  [a-f]*  # hex", re.VERBOSE),
    (r"^\s*#.*$", re.MULTILINE | re.IGNORECASE),
    (r"\w+", re.ASCII),
    (rb"[\x00-\x1f]+|(?P<word>[a-z]+)", re.IGNORECASE),
]
SAMPLES = ["name = \"v\"", "10.0.0.255", "STRASSE Straße", "me@host.org", "<a@b.c>", "aabbaa",
           "12abc", "  # comment\nx", "héllo world", "ünï"]  # fmt: skip


def _behaviour(compiled: list[re.Pattern[Any]]) -> list[Any]:
    out: list[Any] = []
    for pattern in compiled:
        out.append((pattern.pattern, pattern.flags, pattern.groups, dict(pattern.groupindex)))
        for sample in SAMPLES:
            text: Any = sample.encode() if isinstance(pattern.pattern, bytes) else sample
            out.append([(*m.groups(), m.span()) for m in pattern.finditer(text)])
    return out


def _compile_all(cache: RegexProgramCache | None) -> list[re.Pattern[Any]]:
    compile_ = _startup._compile_program if cache is None else cache.compile
    return [compile_(pattern, flags) for pattern, flags in PATTERNS]


def test_patterns_made_through_the_regex_cache_are_the_same_as_without_it(tmp_path: Path) -> None:
    plain = _behaviour(_compile_all(None))
    with regex_program_cache(str(tmp_path)) as cold:
        through_cold = _behaviour(_compile_all(cold))
    with regex_program_cache(str(tmp_path)) as warm:
        through_warm = _behaviour(_compile_all(warm))
    assert (cold.misses, cold.hits) == (len(PATTERNS), 0)
    assert (warm.misses, warm.hits) == (0, len(PATTERNS))  # every program came from the file
    assert through_cold == plain
    assert through_warm == plain


def test_the_regex_window_patches_re_only_while_it_runs(tmp_path: Path) -> None:
    compiler: Any = re._compiler  # type: ignore[attr-defined]
    with regex_program_cache(str(tmp_path / "outer")) as outer:
        assert compiler.compile == outer.compile
        with regex_program_cache(str(tmp_path / "inner")) as inner:
            re.compile(r"only-in-this-test-(\d+)x")  # through re's own per-process cache
        assert compiler.compile == outer.compile
    assert compiler.compile is _startup._compile_program
    assert _startup.last_regex is outer
    assert outer.misses == 1
    assert inner.misses == inner.hits == 0
    assert (tmp_path / "outer" / REGEX_FILE_NAME).exists()
    assert not (tmp_path / "inner").exists()


def test_a_damaged_regex_program_is_compiled_again(tmp_path: Path) -> None:
    key = (r"(\d+)-(\w+)", 0)
    bogus: tuple[Any, ...] = (32, [1, 2, 3, 999], 1, {}, (None, None))  # _sre refuses it
    data = marshal.dumps({key: bogus, ("x", 0): "not a program"})
    (tmp_path / REGEX_FILE_NAME).write_bytes(_startup._REGEX_FORMAT + data)
    with regex_program_cache(str(tmp_path)) as cache:
        pattern = cache.compile(*key)
        other = cache.compile("x", 0)
    assert pattern.match("12-ab") is not None
    assert pattern.match("12-ab").groups() == ("12", "ab")
    assert other.match("x") is not None
    assert (cache.hits, cache.misses) == (0, 2)
    assert RegexProgramCache(str(tmp_path))._read()[key] != bogus  # replaced


@pytest.mark.parametrize(
    "content",
    [b"", b"junk", b"chrysalis-regex-code-1 another-python\n" + marshal.dumps({}), b"\xe9"],
)
def test_a_foreign_regex_file_is_an_empty_cache(tmp_path: Path, content: bytes) -> None:
    (tmp_path / REGEX_FILE_NAME).write_bytes(content)
    assert RegexProgramCache(str(tmp_path))._read() == {}


def test_the_import_window_pauses_collection_caches_and_freezes(tmp_path: Path) -> None:
    assert gc.isenabled()
    before = gc.get_freeze_count()
    try:
        with import_window():
            assert not gc.isenabled()
            assert "exec" in vars(dataclasses)
            assert re._compiler.compile is not _startup._compile_program  # type: ignore[attr-defined]
            kept = [object() for _ in range(100)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(kept)
        gc.disable()
        with import_window():  # the collector was off: left off, nothing frozen
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def _package(tmp_path: Path, name: str) -> Path:
    """A package whose ``__init__`` counts its runs and imports a submodule; a second
    submodule that imports nothing of it."""
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text(
        "import builtins\n"
        "builtins.__dict__.setdefault('_deferred_runs', []).append(__name__)\n"
        f"from {name}.inner import VALUE\n"
        "NAME = 'facade'\n"
    )
    (root / "inner.py").write_text("VALUE = 42\n")
    (root / "light.py").write_text("LIGHT = 1\n")
    return root


def test_a_deferred_package_runs_its_init_on_first_use_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    name = f"deferred_probe_{len(sys.modules)}"
    _package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(builtins, "_deferred_runs", [], raising=False)
    deferred = DeferredPackage(name)
    try:
        light = importlib.import_module(f"{name}.light")  # a submodule: the __init__ waits
        exec(f"from {name} import inner", {})  # a submodule by name: it waits too
        assert light.LIGHT == 1
        assert builtins._deferred_runs == []  # type: ignore[attr-defined]
        assert not deferred.done
        module = sys.modules[name]
        assert module.NAME == "facade"  # a name it lacks: the __init__ runs
        assert builtins._deferred_runs == [name]  # type: ignore[attr-defined]
        assert deferred.run() is module
        assert module.VALUE == 42
        assert module.light is light
        assert builtins._deferred_runs == [name]  # type: ignore[attr-defined]  # once
        assert "__getattr__" not in vars(module)
        with pytest.raises(AttributeError):
            module.missing  # noqa: B018
        with pytest.raises(RuntimeError, match="imported already"):
            DeferredPackage(name)
    finally:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]


def test_only_a_findable_package_can_be_deferred() -> None:
    with pytest.raises(ImportError):
        DeferredPackage("no_such_package_anywhere")
    with pytest.raises(RuntimeError):
        DeferredPackage("json")  # imported already
