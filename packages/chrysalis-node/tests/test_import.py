import importlib
import subprocess
import sys


def test_package_imports_and_declares_all() -> None:
    module = importlib.import_module("chrysalis.node")
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_namespace_package_has_no_init() -> None:
    namespace = importlib.import_module("chrysalis")
    assert getattr(namespace, "__file__", None) is None


def test_the_package_imports_its_names_on_first_use() -> None:
    """``import chrysalis.node`` alone pulls in no QUIC (the ``chrysalis`` command relies on
    it), and the public classes are named at the package whichever module was imported first."""
    code = (
        "import sys, chrysalis.node as node\n"
        "assert 'chrysalis.quic' not in sys.modules, 'eager'\n"
        "from chrysalis.node._sessions import LinkSessions\n"
        "from chrysalis.node._node import Node\n"
        "assert Node.__module__ == LinkSessions.__module__ == 'chrysalis.node'\n"
        "assert node.Node is Node and set(node.__all__) <= set(dir(node))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
