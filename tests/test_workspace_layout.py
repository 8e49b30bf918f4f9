"""The monorepo's layout rules, checked from the files themselves."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())

# Allowed sibling dependencies: the package graph of the design (dependencies point down).
STACK = [
    "chrysalis-core",
    "chrysalis-datagram",
    "chrysalis-quic",
    "chrysalis-nameserver",
    "chrysalis-node",
    "chrysalis-sqlite",
    "monarch-actor",
    "monarch-rdma",
    "monarch-job",
    "monarch-spmd",
    "monarch-tensor",
]
REQUIRED = set(STACK)


def _project(folder: Path) -> dict[str, object]:
    data = tomllib.loads((folder / "pyproject.toml").read_text())
    project = data["project"]
    assert isinstance(project, dict)
    return project


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match is not None, requirement
    return match.group(0).lower().replace("_", "-")


def test_every_package_of_the_layout_exists() -> None:
    names = {str(_project(folder)["name"]) for folder in PACKAGES}
    assert REQUIRED <= names


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_package_has_its_own_metadata_readme_and_typing_marker(folder: Path) -> None:
    project = _project(folder)
    assert project["name"] == folder.name
    for key in ("version", "description", "license", "requires-python", "dependencies"):
        assert key in project, key
    assert project["requires-python"] == ">=3.11"
    assert (folder / "README.md").read_text().strip()
    assert (folder / "tests").is_dir()
    typed = list((folder / "src").rglob("py.typed"))
    assert typed, "py.typed missing"
    build = tomllib.loads((folder / "pyproject.toml").read_text())["build-system"]
    assert build["build-backend"] == "hatchling.build"


#: The one distribution that ships ``monarch/__init__.py`` (the reference's top-level names; it
#: keeps ``monarch`` open to the others with ``pkgutil.extend_path``: its README, "Packaging").
MONARCH_INIT_OWNER = "monarch-tensor"


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_namespace_roots_have_no_init(folder: Path) -> None:
    for namespace in ("chrysalis", "monarch"):
        root = folder / "src" / namespace
        if not root.exists():
            continue
        init = root / "__init__.py"
        if namespace == "monarch" and folder.name == MONARCH_INIT_OWNER:
            assert "extend_path(__path__, __name__)" in init.read_text(), (
                f"{init} must keep monarch open to the other distributions"
            )
        else:
            assert not init.exists(), f"{root} must stay a namespace package"


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: p.name)
def test_sibling_dependencies_point_down_the_stack(folder: Path) -> None:
    project = _project(folder)
    name = str(project["name"])
    deps = [_name(str(r)) for r in project["dependencies"]]  # type: ignore[attr-defined]
    siblings = [d for d in deps if d in REQUIRED or d.startswith(("chrysalis-", "monarch-"))]
    if name not in STACK:
        return  # plugin distributions may depend on anything below them
    for dep in siblings:
        assert dep in STACK, f"{name} depends on unknown sibling {dep}"
        if name == "chrysalis-sqlite":
            assert dep in {"chrysalis-core", "chrysalis-node"} or STACK.index(dep) < STACK.index(
                "chrysalis-node"
            )
        elif name.startswith("monarch-") or dep != "chrysalis-sqlite":
            assert STACK.index(dep) < STACK.index(name), f"{name} -> {dep} points up"


def test_core_depends_only_on_pluggy_and_msgspec() -> None:
    project = _project(ROOT / "packages" / "chrysalis-core")
    deps = {_name(str(r)) for r in project["dependencies"]}  # type: ignore[attr-defined]
    assert deps <= {"pluggy", "msgspec"}
