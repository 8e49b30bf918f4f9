"""The public ``topology`` module re-exports exactly its implementation; ``shell`` is its own."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest


@pytest.mark.parametrize("name", ["topology"])
def test_public_module_reexports_its_implementation(name: str) -> None:
    public = importlib.import_module(f"chrysalis.sqlite.{name}")
    private = importlib.import_module(f"chrysalis.sqlite._{name}")
    assert public.__all__ == private.__all__
    for attribute in public.__all__:
        assert getattr(public, attribute) is getattr(private, attribute)


def test_the_shell_module_is_the_implementation() -> None:
    shell = importlib.import_module("chrysalis.sqlite.shell")
    assert shell.__all__
    for attribute in shell.__all__:
        value = getattr(shell, attribute)
        if isinstance(value, type):
            assert value.__module__ == "chrysalis.sqlite.shell"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("chrysalis.sqlite._shell")


def test_replication_core_does_not_import_the_node_stack() -> None:
    code = "import sys, chrysalis.sqlite; print('chrysalis.node' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"
