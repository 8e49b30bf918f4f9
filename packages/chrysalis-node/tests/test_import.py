import importlib
import subprocess
import sys


def _run_fresh(code: str) -> None:
    """Run ``code`` in a fresh interpreter (nothing imported yet); it must exit 0."""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr


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
    _run_fresh(code)


def test_the_lazy_pair_is_built_at_the_first_look_up_and_kept() -> None:
    """The package's ``__getattr__``/``__dir__`` pair is made once, at the first look-up of a
    missing name (not at import: the CLI's thin path must not import ``chrysalis._lazy``)."""
    code = (
        "import sys, chrysalis.node as node\n"
        "assert node._EXPORTS is None and 'chrysalis._lazy' not in sys.modules\n"
        "dir(node)\n"
        "pair = node._EXPORTS\n"
        "assert pair is not None and 'chrysalis._lazy' in sys.modules\n"
        "node.NodeError, dir(node)\n"
        "assert node._EXPORTS is pair\n"
        "try:\n"
        "    node.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    _run_fresh(code)
