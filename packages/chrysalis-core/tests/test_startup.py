"""``chrysalis._startup``: dataclasses made through the code cache are the same as without it,
the cache is kept across processes (a file), and a damaged file is only an empty cache."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import sys
import types
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import Any

import pytest

from chrysalis import _startup
from chrysalis._startup import FILE_NAME, DataclassCodeCache, dataclass_code_cache

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
