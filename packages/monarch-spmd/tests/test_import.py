"""The facade: what it exports, the namespace package, and that it needs no torch to import."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path


def test_package_imports_and_declares_all() -> None:
    module = importlib.import_module("monarch.spmd")
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), name
    assert module.SPMDActor.__module__ == "monarch.spmd"


def test_namespace_package_has_no_init() -> None:
    # A namespace package; where monarch-tensor is installed (the one distribution that ships
    # monarch/__init__.py), that __init__ keeps the package open to the others.
    namespace = importlib.import_module("monarch")
    init = getattr(namespace, "__file__", None)
    assert init is None or "extend_path(__path__" in Path(init).read_text()


# A meta path finder that makes ``import torch`` (and lightning) fail as if not installed.
BLOCK_TORCH = textwrap.dedent(
    """
    import sys

    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "lightning"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoTorch())
    """
)


def run_without_torch(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where torch cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_importing_monarch_spmd_does_not_import_torch() -> None:
    result = run_without_torch(
        """
        import monarch.spmd
        from monarch.spmd import SPMDActor, setup_torch_elastic_env, torchrun_ranks
        assert "torch" not in sys.modules
        assert torchrun_ranks(3, {"hosts": 1, "gpus": 1}, {"hosts": 2, "gpus": 2}).group_rank == 1
        try:
            import torch
        except ModuleNotFoundError:
            print("blocked")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "blocked"  # the block works: the test can fail


def test_the_process_group_says_it_needs_torch_where_torch_is_missing() -> None:
    result = run_without_torch(
        """
        from monarch.actor import ActorError, this_host
        from monarch.spmd import init_process_group

        procs = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            init_process_group(procs, timeout=10.0)
        except ActorError as error:
            print(str(error))
        finally:
            procs.stop().get(timeout=30)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "monarch.spmd.init_process_group needs torch" in result.stdout
    assert "pip install 'torch>=2.13,<2.14'" in result.stdout


def test_the_lightning_glue_says_it_needs_the_extra_where_lightning_is_missing() -> None:
    result = run_without_torch(
        """
        try:
            import monarch.spmd.lightning
        except ImportError as error:
            print(error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "monarch.spmd.lightning needs Lightning" in result.stdout
    assert "pip install 'monarch-spmd[lightning]'" in result.stdout
