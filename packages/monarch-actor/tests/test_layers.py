"""The layering rule of ``monarch.actor`` (README, "Layers"), checked on the source with ``ast``.

``_hosts -> _mesh -> _runtime -> _transport -> _base``: a module of a layer subpackage imports
its own layer or a layer to its right, and imports none of the project's packages inside a
function (``if TYPE_CHECKING:`` blocks are type-only and exempt). Every flat module is the
facade, a public module, or an old path kept importable for one release (``MOVED``, ``SPLIT``);
a layer must not import an old path.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import monarch.actor

#: Left to right: a layer may import itself and the layers after it.
LAYERS = ("_hosts", "_mesh", "_runtime", "_transport", "_base")

PACKAGE = Path(monarch.actor.__file__).parent

#: Old flat paths kept importable for one release: old module -> its new home.
MOVED = {
    "_shape": "_base.shape",
    "_value_mesh": "_base.value_mesh",
    "_ids": "_base.ids",
    "_errors": "_base.errors",
    "_codec": "_base.codec",
    "_envelope": "_base.envelope",
    "_future": "_base.future",
    "_loop": "_base.loop",
    "_actor": "_base.actor",
    "_endpoint": "_base.endpoint",
    "_node_transport": "_transport.node",
    "_lane_proto": "_transport.lane_proto",
    "_lane": "_transport.lane",
    "_shm": "_transport.shm",
    "_uid": "_base.uid",
    "_liveness": "_runtime.liveness",
    "_watchdog": "_runtime.watchdog",
    "_returns_future": "_runtime.returns_future",
    "_enable_transport": "_runtime.enable_transport",
    "_adverbs": "_mesh.adverbs",
    "_accumulator": "_mesh.accumulator",
    "_logging_option": "_mesh.logging_option",
    "_telemetry": "_runtime.telemetry",
    "_context": "_runtime.context",
    "_port": "_runtime.ports",
    "_logging": "_runtime.logging",
    "_worker": "_hosts.worker",
    "_zygote": "_hosts.zygote",
    "_main_module": "_runtime.main_module",
    "_client_api": "_hosts.settle",
    "_client_attach": "_hosts.client_attach",
}

#: Old flat modules split into several: each re-exports the old module's names from their new
#: homes (old module -> the new modules, in its layer).
SPLIT = {
    "_host": (
        "_hosts.commands",
        "_hosts.groups",
        "_hosts.client_node",
        "_hosts.spawn",
        "_hosts.host_mesh",
    ),
    "_attach": (
        "_hosts.attach_protocol",
        "_hosts.attach_session",
        "_hosts.attach_daemon",
        "_hosts.host_mesh",
    ),
    "_host_agent": ("_hosts.nested", "_hosts.agent", "_hosts.spawn"),
}

#: ``monarch.actor._transport`` was the seam module; the package took its path and re-exports it.
SEAM_NAMES = (
    "Attachable",
    "DeliverCallback",
    "InProcessFabric",
    "InProcessTransport",
    "ProcessTransport",
    "UndeliverableCallback",
)

#: ``monarch.actor._mesh`` was the meshes module; the package took its path and re-exports the
#: names that module exported and those other modules imported from it.
MESH_NAMES = (
    "READY_TIMEOUT",
    "ActorMesh",
    "ProcMesh",
    "_ProcMeshState",
    "_adopt",
    "_forget",
    "_spawn_system_actor",
    "local_proc_mesh",
    "set_host_resolver",
    "this_proc",
    "wait_ready",
)

#: Above every layer: the facade and the public modules may import anything.
FACADE = {"__init__", "config", "testing"}

OWN_PACKAGES = ("monarch", "chrysalis")


def _layer_files() -> list[tuple[str, Path]]:
    return [
        (layer, path)
        for layer in LAYERS
        if (PACKAGE / layer).is_dir()
        for path in sorted((PACKAGE / layer).rglob("*.py"))
    ]


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


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The absolute module names an import statement names (``from a import b``: ``a.b`` too)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parent = module.split(".")[: -node.level]
        base = ".".join([*parent, base] if base else parent)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _layer_of(target: str) -> str | None:
    """The layer a ``monarch.actor`` module belongs to (an old path: its new home's)."""
    parts = target.split(".")
    if parts[:2] != ["monarch", "actor"] or len(parts) < 3:
        return None
    name = parts[2]
    if name in LAYERS:
        return name
    if name in MOVED:
        return MOVED[name].split(".")[0]
    if name in SPLIT:
        return SPLIT[name][0].split(".")[0]
    return None


def test_no_layer_imports_a_layer_to_its_left() -> None:
    problems = []
    for layer, path in _layer_files():
        module = "monarch.actor." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        top, _ = _imports(ast.parse(path.read_text()))
        for node in top:
            for target in _targets(node, module):
                parts = target.split(".")
                old = set(MOVED) | set(SPLIT)
                if parts[:2] == ["monarch", "actor"] and parts[2:3] and parts[2] in old:
                    problems.append(f"{module}:{node.lineno} imports the old path {target}")
                if target.startswith("monarch.actor._transport.") and parts[3] in SEAM_NAMES:
                    problems.append(f"{module}:{node.lineno} imports {target} (use .seam)")
                other = _layer_of(target)
                if other is not None and LAYERS.index(other) < LAYERS.index(layer):
                    problems.append(f"{module}:{node.lineno} ({layer}) imports {target} ({other})")
    assert problems == []


def test_no_function_level_imports_of_our_packages_in_the_layers() -> None:
    problems = []
    for _, path in _layer_files():
        _, nested = _imports(ast.parse(path.read_text()))
        for node in nested:
            if isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").split(".")[0] in OWN_PACKAGES
            else:
                ours = any(alias.name.split(".")[0] in OWN_PACKAGES for alias in node.names)
            if ours:
                problems.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert problems == []


def test_every_flat_module_is_the_facade_or_an_old_path() -> None:
    """Nothing is left to move: a new flat module has to go into a layer (or be public)."""
    flat = {p.stem for p in PACKAGE.glob("*.py")}
    assert flat - FACADE - set(MOVED) - set(SPLIT) == set()


def test_old_paths_are_the_moved_modules() -> None:
    for old, new in MOVED.items():
        moved = importlib.import_module(f"monarch.actor.{new}")
        assert importlib.import_module(f"monarch.actor.{old}") is moved
    package = importlib.import_module("monarch.actor._transport")
    seam = importlib.import_module("monarch.actor._transport.seam")
    assert sorted(package.__all__) == sorted(seam.__all__) == sorted(SEAM_NAMES)
    for name in SEAM_NAMES:
        assert getattr(package, name) is getattr(seam, name)
    package = importlib.import_module("monarch.actor._mesh")
    meshes = importlib.import_module("monarch.actor._mesh.meshes")
    assert set(meshes.__all__) <= set(package.__all__) <= set(MESH_NAMES)
    for name in MESH_NAMES:
        assert getattr(package, name) is getattr(meshes, name)


def test_the_old_paths_of_split_modules_re_export_every_name_from_its_new_home() -> None:
    """A split module's old path keeps every top-level name the old module had (its ``__all__``
    and the private names code written against it may use), as the object of the new home."""
    for old, homes in SPLIT.items():
        shim = importlib.import_module(f"monarch.actor.{old}")
        assert shim.__name__ == f"monarch.actor.{old}"  # not replaced: a module of its own
        new = [importlib.import_module(f"monarch.actor.{home}") for home in homes]
        names = [n for n in vars(shim) if not n.startswith("__")]
        assert set(shim.__all__) <= set(names)
        for name in names:
            value = getattr(shim, name)
            alias = {"_start_group": "start_group"}.get(name, name)
            assert any(getattr(m, alias, None) is value for m in new), f"{old}.{name}"


def test_the_hooks_of_the_lower_layers_are_registered_at_import() -> None:
    """``_runtime.context`` reaches the client and ``this_proc`` through hooks that
    ``_runtime.client`` and ``_mesh`` set when ``monarch.actor`` is imported (H1, H2); the
    root client's proc mesh is made through H2 on first use."""
    context = importlib.import_module("monarch.actor._runtime.context")
    client = importlib.import_module("monarch.actor._runtime.client")
    mesh = importlib.import_module("monarch.actor._mesh.meshes")
    assert context._proc_resolver is mesh.this_proc
    assert context._root_context is client._root_context
    root = context.context().actor_instance
    assert str(root) == "<root>"
    assert context.current_sender() == (client.client().runtime, client.client().root)
    procs = root.proc_mesh
    assert isinstance(procs, mesh.ProcMesh)
    assert procs is root.proc_mesh  # made once
    assert procs._proc_ids() == (client.client().runtime.proc_id,)


def test_the_hooks_of_the_runtime_and_meshes_are_registered_at_import() -> None:
    """``_runtime`` builds the client's node layer, and ``_mesh`` the host mesh of a process,
    through hooks that ``_hosts.host_mesh`` sets at import (H3, H4). The layer is made with the
    table of nested processes subscribed to its process deaths."""
    runtime = importlib.import_module("monarch.actor._runtime.client")
    mesh = importlib.import_module("monarch.actor._mesh.meshes")
    host_mesh = importlib.import_module("monarch.actor._hosts.host_mesh")
    client_node = importlib.import_module("monarch.actor._hosts.client_node")
    nested = importlib.import_module("monarch.actor._hosts.nested")
    assert runtime._node_layer_factory is host_mesh._new_node_layer
    layer = runtime.client().node_layer
    assert isinstance(layer, client_node.ClientNodeLayer)
    assert isinstance(nested.nested_procs(layer), nested.NestedProcs)
    assert mesh._host_resolver is host_mesh._host_of
    assert isinstance(mesh.this_proc().host_mesh, host_mesh.HostMesh)


def test_the_worker_and_daemon_entry_points_run_under_dash_m() -> None:
    """``python -m monarch.actor._worker`` and ``python -m monarch.actor._attach`` (the old
    paths, documented) still run the moved programs: the shims call ``main`` when run as
    ``__main__`` (where the ``sys.modules`` swap must not happen)."""
    for module, option in (("_worker", "--authority"), ("_attach", "--address")):
        result = subprocess.run(
            [sys.executable, "-m", f"monarch.actor.{module}", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        )
        assert result.returncode == 0, result.stderr
        assert f"usage: python -m monarch.actor.{module}" in result.stdout
        assert option in result.stdout
