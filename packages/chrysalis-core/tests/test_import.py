import importlib


def test_package_imports_and_declares_all() -> None:
    module = importlib.import_module("chrysalis.core")
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_namespace_package_has_no_init() -> None:
    namespace = importlib.import_module("chrysalis")
    assert getattr(namespace, "__file__", None) is None


def test_lazy_names_and_the_hookspecs_submodule_in_a_fresh_process() -> None:
    """In a process that imported only ``chrysalis.core``: the plugin names load on first use,
    ``dir()`` lists them before, and the public submodule ``hookspecs`` is an attribute of the
    package as it was when ``__init__`` imported it."""
    import subprocess
    import sys

    code = (
        "import sys, chrysalis.core as c\n"
        "assert 'chrysalis.core._plugins' not in sys.modules\n"
        "assert 'default_registry' in dir(c)\n"
        "assert c.hookspecs.__name__ == 'chrysalis.core.hookspecs'\n"
        "assert c.default_registry is sys.modules['chrysalis.core._plugins'].default_registry\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
