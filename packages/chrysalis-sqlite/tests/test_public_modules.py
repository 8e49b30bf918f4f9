"""The public ``shell`` and ``topology`` modules re-export exactly their implementations."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("name", ["shell", "topology"])
def test_public_module_reexports_its_implementation(name: str) -> None:
    public = importlib.import_module(f"chrysalis.sqlite.{name}")
    private = importlib.import_module(f"chrysalis.sqlite._{name}")
    assert public.__all__ == private.__all__
    for attribute in public.__all__:
        assert getattr(public, attribute) is getattr(private, attribute)


def test_replication_core_does_not_import_the_node_stack() -> None:
    code = "import sys, chrysalis.sqlite; print('chrysalis.node' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
