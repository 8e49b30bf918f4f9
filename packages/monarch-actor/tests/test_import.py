import importlib
from pathlib import Path


def test_package_imports_and_declares_all() -> None:
    module = importlib.import_module("monarch.actor")
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_namespace_package_has_no_init() -> None:
    """monarch-actor ships no ``monarch/__init__.py``: ``monarch`` is a namespace package, or,
    where monarch-tensor is installed (the one distribution that ships one, for Monarch's
    top-level names), a package whose ``__init__`` keeps its path open to the others."""
    namespace = importlib.import_module("monarch")
    init = getattr(namespace, "__file__", None)
    assert init is None or "extend_path(__path__" in Path(init).read_text()


def test_config_module_is_part_of_the_distribution() -> None:
    config = importlib.import_module("monarch.config")
    assert isinstance(config.__all__, list)
