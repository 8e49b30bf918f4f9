"""The import order of ``monarch.tensor``'s own modules, checked on the source with ``ast``.

Each module may import (at module level) only the modules below it in ``ORDER``, so the package
has no import cycle, and none imports one of the project's packages inside a function (the
cycle used to be hidden that way). ``if TYPE_CHECKING:`` blocks are type-only and exempt.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import monarch.tensor

PACKAGE = Path(monarch.tensor.__file__).parent

#: Highest first: a module imports only modules after it.
ORDER = (
    "__init__",
    "_move",
    "_fetch",
    "_remote",
    "_rref",
    "_mesh",
    "_worker",
    "_grad",
    "_dist",
    "_tensor",
    "_stream",
    "_context",
    "_errors",
    "_table",
    "_messages",
)

OWN_PACKAGES = ("monarch", "chrysalis")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    tree: ast.Module,
) -> tuple[list[ast.Import | ast.ImportFrom], list[ast.Import | ast.ImportFrom]]:
    """(module-level imports outside ``TYPE_CHECKING``, every import nested in a def or class)."""
    top: list[ast.Import | ast.ImportFrom] = []
    nested: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, in_def: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and not in_def and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                (nested if in_def else top).append(child)
                continue
            defines = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            visit(child, in_def or defines)

    visit(tree, False)
    return top, nested


def _own_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The ``monarch.tensor`` modules an import statement names (by their short names)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            base = ".".join(["monarch", "tensor", base] if base else ["monarch", "tensor"])
        names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
    found = []
    for name in names:
        parts = name.split(".")
        if parts[:2] == ["monarch", "tensor"] and len(parts) >= 3 and parts[2] in ORDER:
            found.append(parts[2])
    return list(dict.fromkeys(found))


def _sources() -> dict[str, ast.Module]:
    return {path.stem: ast.parse(path.read_text()) for path in sorted(PACKAGE.glob("*.py"))}


def test_every_module_has_a_place_in_the_order() -> None:
    assert set(_sources()) == set(ORDER)
    assert not [p for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"]


def test_each_module_imports_only_modules_below_it() -> None:
    problems = []
    for module, tree in _sources().items():
        top, _ = _imports(tree)
        for node in top:
            for target in _own_modules(node):
                if ORDER.index(target) <= ORDER.index(module):
                    problems.append(f"{module}:{node.lineno} imports {target}")
    assert problems == []


def test_no_function_level_imports_of_our_packages() -> None:
    problems = []
    for module, tree in _sources().items():
        _, nested = _imports(tree)
        for node in nested:
            if isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").split(".")[0] in OWN_PACKAGES
            else:
                ours = any(alias.name.split(".")[0] in OWN_PACKAGES for alias in node.names)
            if ours:
                problems.append(f"{module}:{node.lineno}")
    assert problems == []


def test_the_checks_see_a_cycle(tmp_path: Path) -> None:
    """The helpers find an upward import and a function-level one (so the tests can fail)."""
    tree = ast.parse(
        "from monarch.tensor._mesh import DeviceMesh\n"
        "from monarch.tensor import _messages as m\n"
        "def f():\n    from monarch.tensor._stream import Stream\n"
    )
    top, nested = _imports(tree)
    assert [_own_modules(n) for n in top] == [["_mesh"], ["_messages"]]
    assert [_own_modules(n) for n in nested] == [["_stream"]]


def test_each_module_imports_first_in_a_fresh_interpreter() -> None:
    """Importing any module first (not through the package's ``__init__`` order) works."""
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    for key in [k for k in sys.modules if k.startswith('monarch.tensor')]:\n"
        "        del sys.modules[key]\n"
        "    importlib.import_module('monarch.tensor.' + name)\n"
    )
    modules = [name for name in ORDER if name != "__init__"]
    done = subprocess.run(
        [sys.executable, "-c", code, *modules],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
