import importlib


def test_package_imports_and_declares_all() -> None:
    module = importlib.import_module("chrysalis.datagram")
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_namespace_package_has_no_init() -> None:
    namespace = importlib.import_module("chrysalis")
    assert getattr(namespace, "__file__", None) is None


def test_the_in_process_carrier_is_listed_before_its_first_use() -> None:
    """A fresh process: ``dir(chrysalis.datagram)`` lists the lazily loaded names (completion,
    ``inspect.getmembers``) before anything imported their module."""
    import subprocess
    import sys

    code = (
        "import sys, chrysalis.datagram as d\n"
        "assert 'chrysalis.datagram._inproc' not in sys.modules\n"
        "assert {'InprocNetwork', 'InprocSocket'} <= set(dir(d))\n"
        "assert d.InprocNetwork.__module__ == 'chrysalis.datagram._inproc'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
