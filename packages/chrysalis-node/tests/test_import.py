import importlib


def test_package_imports_and_declares_all() -> None:
    module = importlib.import_module("chrysalis.node")
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_namespace_package_has_no_init() -> None:
    namespace = importlib.import_module("chrysalis")
    assert getattr(namespace, "__file__", None) is None
