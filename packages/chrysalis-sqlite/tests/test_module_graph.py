"""The modules of ``chrysalis.sqlite`` import one another one way only.

Why: ``Replica`` and ``ReplicaTransaction`` used to import each other (the transaction read
the replica's private members); both now share a ``ReplicaCatalog``. The graph is read from
the sources with ``ast``, counting every import (also those under ``TYPE_CHECKING`` and inside
functions), so a cycle cannot hide behind a deferred import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import chrysalis.sqlite

PACKAGE = "chrysalis.sqlite"
ROOT = Path(chrysalis.sqlite.__file__).parent


def _imports(path: Path) -> set[str]:
    """The ``chrysalis.sqlite`` modules one source file imports (by module name)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE + "."))
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module == PACKAGE:  # ``from chrysalis.sqlite import _sql``
                found.update(f"{PACKAGE}.{a.name}" for a in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module)
    modules = {f"{PACKAGE}.{p.stem}" for p in ROOT.glob("*.py")}
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(ROOT.glob("*.py")):
        name = PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"
        graph[name] = _imports(path) - {name}
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert f"{PACKAGE}._transaction" in graph[f"{PACKAGE}._replica"]
    assert f"{PACKAGE}._catalog" in graph[f"{PACKAGE}._transaction"]


def test_transaction_and_replica_share_the_catalog_without_a_cycle() -> None:
    graph = _graph()
    for lower in ("_transaction", "_catalog", "_fold"):
        reached = _reachable(graph, f"{PACKAGE}.{lower}")
        assert f"{PACKAGE}._replica" not in reached, f"{lower} reaches _replica"
    for lower in ("_catalog", "_fold"):
        reached = _reachable(graph, f"{PACKAGE}.{lower}")
        assert f"{PACKAGE}._transaction" not in reached, f"{lower} reaches _transaction"


def test_no_module_of_the_package_imports_itself_back() -> None:
    graph = _graph()
    cyclic = sorted(m for m in graph if m != PACKAGE and m in _reachable(graph, m))
    assert cyclic == []
