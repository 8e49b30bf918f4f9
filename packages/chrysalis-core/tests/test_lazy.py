"""``chrysalis._lazy.lazy_exports``: the ``__getattr__`` and ``__dir__`` of the lazy facades
(chrysalis-core, -datagram, -quic, -node, monarch-job), on a module made here."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from chrysalis._lazy import lazy_exports

TARGET = "chrysalis_lazy_test_target"
"""A module made for each test in a temporary folder on ``sys.path``, imported by none."""
PACKAGE = "chrysalis_lazy_test_pkg"
"""A package (with a submodule ``sub``) made the same way."""


@pytest.fixture
def facade(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A module ``PACKAGE`` whose ``Thing`` and ``VALUE`` are ``TARGET``'s, lazily, whose
    submodule ``sub`` is reachable lazily, and whose ``__all__`` is assigned after the call."""
    (tmp_path / f"{TARGET}.py").write_text("class Thing:\n    pass\n\nVALUE = 42\n")
    (tmp_path / PACKAGE).mkdir()
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (tmp_path / PACKAGE / "sub.py").write_text("WHO = 'sub'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = types.ModuleType(PACKAGE)
    module.__path__ = [str(tmp_path / PACKAGE)]
    namespace = vars(module)
    table = {"Thing": TARGET, "VALUE": TARGET}
    namespace["__getattr__"], namespace["__dir__"] = lazy_exports(namespace, table, {"sub"})
    namespace["__all__"] = ["Thing", "VALUE", "eager"]
    namespace["eager"] = 1
    monkeypatch.setitem(sys.modules, PACKAGE, module)
    yield module
    for name in (TARGET, f"{PACKAGE}.sub"):
        sys.modules.pop(name, None)


def test_a_name_is_imported_on_first_use_and_then_kept(facade: types.ModuleType) -> None:
    assert TARGET not in sys.modules
    assert "Thing" not in vars(facade)
    thing = facade.Thing
    assert thing is sys.modules[TARGET].Thing
    assert vars(facade)["Thing"] is thing  # cached: later look-ups never reach __getattr__
    vars(sys.modules[TARGET])["Thing"] = object()
    assert facade.Thing is thing
    assert facade.VALUE == 42
    assert "VALUE" in vars(facade)


def test_from_import_of_a_lazy_name(facade: types.ModuleType) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {PACKAGE} import VALUE", namespace)
    assert namespace["VALUE"] == 42


def test_an_unknown_name_raises_pythons_own_attribute_error(facade: types.ModuleType) -> None:
    plain = types.ModuleType(PACKAGE)
    with pytest.raises(AttributeError) as plain_error:
        _ = plain.missing
    with pytest.raises(AttributeError) as lazy_error:
        _ = facade.missing
    assert str(lazy_error.value) == str(plain_error.value)
    assert str(lazy_error.value) == f"module {PACKAGE!r} has no attribute 'missing'"
    assert not hasattr(facade, "__wrapped__")  # what inspect and friends probe for
    assert TARGET not in sys.modules  # an unknown name imports nothing


def test_dir_lists_the_lazy_names_before_their_use(facade: types.ModuleType) -> None:
    listed = dir(facade)
    assert {"Thing", "VALUE", "eager", "__getattr__", "__dir__"} <= set(listed)
    assert listed == sorted(listed)
    assert TARGET not in sys.modules  # dir() imports nothing
    assert "sub" not in listed  # a lazy submodule is not public: not in __all__


def test_a_submodule_is_imported_on_first_use(facade: types.ModuleType) -> None:
    sub = facade.sub
    assert sub is sys.modules[f"{PACKAGE}.sub"]
    assert sub.WHO == "sub"
    assert vars(facade)["sub"] is sub  # bound on the package by the import itself


def test_the_helper_imports_nothing_but_itself() -> None:
    """The thin path of the ``chrysalis`` command may use it: no ``typing``, no ``importlib``."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import chrysalis._lazy\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True
    ).stdout
    assert set(ast.literal_eval(out)) <= {"__future__", "chrysalis", "chrysalis._lazy"}
