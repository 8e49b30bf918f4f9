"""Actor classes defined in the client's ``__main__`` script work in worker processes."""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from monarch.actor._runtime.main_module import import_main, main_reference

SCRIPT = textwrap.dedent(
    """
    from monarch.actor import Actor, endpoint, this_host

    TOP_LEVEL_RUNS = []


    class Doubler(Actor):
        @endpoint
        def double(self, x: int) -> int:
            return 2 * x

        @endpoint
        def module_name(self) -> str:
            return type(self).__module__


    if __name__ == "__main__":
        procs = this_host().spawn_procs(per_host={"procs": 1})
        doubler = procs.spawn("doubler", Doubler)
        print(doubler.double.call_one(21).get())
        print(doubler.module_name.call_one().get())
        procs.stop().get()
    """
)


def test_actor_class_defined_in_main_script_runs_in_a_worker(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    # The worker ran the script under __mp_main__, so its __main__ block did not run twice.
    assert done.stdout.split() == ["42", "__mp_main__"]


def test_import_main_runs_a_path_without_its_main_block(tmp_path: Path) -> None:
    script = tmp_path / "other.py"
    script.write_text("VALUE = 7\nif __name__ == '__main__':\n    raise SystemExit('ran main')\n")
    saved = sys.modules["__main__"], sys.modules.get("__mp_main__")
    try:
        import_main("path", str(script))
        assert sys.modules["__main__"].VALUE == 7
        assert sys.modules["__mp_main__"] is sys.modules["__main__"]
    finally:
        sys.modules["__main__"] = saved[0]
        if saved[1] is None:
            sys.modules.pop("__mp_main__", None)
        else:
            sys.modules["__mp_main__"] = saved[1]


def test_import_main_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown main module reference kind"):
        import_main("url", "x")


@pytest.mark.parametrize(
    ("spec_name", "file", "expected"),
    [
        ("pkg.mod", "/x/pkg/mod.py", ("name", "pkg.mod")),
        ("pkg.__main__", "/x/pkg/__main__.py", None),  # e.g. python -m pytest
        ("__main__", None, None),
        (None, "/x/prog.py", ("path", "/x/prog.py")),
        (None, "/x/bin/pytest", None),  # a console script without .py
        (None, None, None),  # interactive, python -c
    ],
)
def test_main_reference_kinds(
    monkeypatch: pytest.MonkeyPatch,
    spec_name: str | None,
    file: str | None,
    expected: tuple[str, str] | None,
) -> None:
    fake = types.ModuleType("__main__")
    fake.__spec__ = (
        None if spec_name is None else importlib.machinery.ModuleSpec(spec_name, loader=None)
    )
    if file is not None:
        fake.__file__ = file
    monkeypatch.setitem(sys.modules, "__main__", fake)
    monkeypatch.delitem(sys.modules, "__mp_main__", raising=False)
    assert main_reference() == expected
    assert sys.modules["__mp_main__"] is fake  # results pickled as __mp_main__.X resolve here
