import importlib
from pathlib import Path


def test_package_imports_and_declares_all() -> None:
    module = importlib.import_module("monarch.rdma")
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_namespace_package_has_no_init() -> None:
    # A namespace package; where monarch-tensor is installed (the one distribution that ships
    # monarch/__init__.py), that __init__ keeps the package open to the others.
    namespace = importlib.import_module("monarch")
    init = getattr(namespace, "__file__", None)
    assert init is None or "extend_path(__path__" in Path(init).read_text()
