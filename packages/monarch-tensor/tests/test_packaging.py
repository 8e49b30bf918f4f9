"""``monarch`` is shared by every monarch-* distribution: with monarch-tensor present, its
``monarch/__init__.py`` (``pkgutil.extend_path``) must still find the other distributions'
portions, whether installed into one folder (wheels) or each in its own (editable installs);
without it, ``monarch`` stays a namespace package and monarch-actor works alone.

Each layout is built from the installed (or source) folders of this environment, as links in a
temporary folder, and checked in a fresh interpreter that sees only those folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import monarch.actor
import monarch.spmd
import monarch.tensor

ACTOR_ROOT = Path(monarch.actor.__file__).parent.parent  # .../monarch (actor's portion)
TENSOR_ROOT = Path(monarch.tensor.__file__).parent.parent  # .../monarch (with __init__.py)
#: monarch-spmd, which monarch-tensor depends on (its process groups).
SPMD = Path(monarch.spmd.__file__).parent

#: The folders monarch-actor installs under monarch/.
ACTOR_PARTS = [
    p.name
    for p in ACTOR_ROOT.iterdir()
    if p.is_dir() and (p / "__init__.py").exists() and p.name not in ("tensor", "rdma", "spmd")
]
if (ACTOR_ROOT / "_src").is_dir():
    ACTOR_PARTS.append("_src")

CHECK_BOTH = """
import sys
import monarch, monarch.actor
assert "torch" not in sys.modules, "import monarch.actor imported torch"
from monarch import fetch_shard, remote, no_mesh
import monarch.tensor
from monarch.actor import this_host, Actor
assert fetch_shard is monarch.tensor.fetch_shard
print("ok", monarch.__file__ is not None)
"""

CHECK_ACTOR_ALONE = """
import monarch, monarch.actor
from monarch.actor import this_host, Actor
assert monarch.__file__ is None, monarch.__file__  # a namespace package
try:
    from monarch import fetch_shard
except ImportError:
    pass
else:
    raise SystemExit("fetch_shard importable without monarch-tensor")
from monarch.actor import this_proc
try:
    this_proc().activate()
except NotImplementedError as exc:
    assert "install monarch-tensor" in str(exc), exc
    print("ok")
"""


def _site(folder: Path, parts: dict[str, Path]) -> Path:
    (folder / "monarch").mkdir(parents=True)
    for name, target in parts.items():
        (folder / "monarch" / name).symlink_to(target)
    return folder


def _shadowed_path(tmp_path: Path) -> list[str]:
    """This interpreter's ``sys.path`` with every ``monarch`` folder hidden: an entry holding
    one is replaced by a folder of links to everything else in it (torch and the other
    dependencies stay reachable)."""
    path: list[str] = []
    for index, entry in enumerate(sys.path):
        folder = Path(entry or ".").resolve()
        if not (folder / "monarch").exists():
            path.append(str(folder))
            continue
        shadow = tmp_path / f"shadow{index}"
        shadow.mkdir()
        for child in folder.iterdir():
            if child.name != "monarch":
                (shadow / child.name).symlink_to(child)
        path.append(str(shadow))
    return path


def _run(code: str, path: list[Path], tmp_path: Path) -> str:
    """Run ``code`` in a fresh interpreter whose ``sys.path`` is ``path`` then the shadowed
    path (no site-packages processing: ``-S``)."""
    full = [str(p) for p in path] + _shadowed_path(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["MONARCH_TEST_SYS_PATH"] = json.dumps(full)
    prelude = (
        "import json, os, sys\nsys.path[:] = json.loads(os.environ['MONARCH_TEST_SYS_PATH'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", prelude + code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def _actor_parts() -> dict[str, Path]:
    return {name: ACTOR_ROOT / name for name in ACTOR_PARTS}


def test_one_folder_as_wheels_install(tmp_path: Path) -> None:
    parts = _actor_parts() | {
        "tensor": TENSOR_ROOT / "tensor",
        "spmd": SPMD,
        "__init__.py": TENSOR_ROOT / "__init__.py",
    }
    site = _site(tmp_path / "site", parts)
    assert _run(CHECK_BOTH, [site], tmp_path).strip() == "ok True"


@pytest.mark.parametrize("tensor_first", [True, False])
def test_separate_folders_as_editable_installs(tmp_path: Path, tensor_first: bool) -> None:
    actor = _site(tmp_path / "actor", _actor_parts())
    tensor = _site(
        tmp_path / "tensor",
        {
            "tensor": TENSOR_ROOT / "tensor",
            "spmd": SPMD,
            "__init__.py": TENSOR_ROOT / "__init__.py",
        },
    )
    path = [tensor, actor] if tensor_first else [actor, tensor]
    assert _run(CHECK_BOTH, path, tmp_path).strip() == "ok True"


def test_monarch_actor_alone(tmp_path: Path) -> None:
    actor = _site(tmp_path / "actor", _actor_parts())
    assert _run(CHECK_ACTOR_ALONE, [actor], tmp_path).strip() == "ok"
