"""Programs written for Meta's Monarch run unchanged here and print what the reference prints.

Each program in ``examples/monarch/`` runs under this workspace's interpreter and its standard
output must equal ``<name>.expected``, the reference Monarch's (``torchmonarch==0.7.0``) output
recorded by ``scripts/monarch_compat.py --record``. When ``MONARCH_REFERENCE_PYTHON`` names an
interpreter with the reference installed, every program also runs under it, live, and must still
print its recording (so a stale recording, or a program that is not really portable, fails).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "monarch_compat_script", ROOT / "scripts" / "monarch_compat.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


compat = _load_script()
EXAMPLES: list[Path] = compat.examples()
REFERENCE = os.environ.get(compat.REFERENCE_ENV, "")
TIMEOUT = 180.0


RECORD = "./dev compat --record"  # how to record again, with the reference


def _check(python: str, example: Path) -> None:
    recorded = compat.read_expected(example)
    assert recorded is not None, f"{example.name} was never recorded: {RECORD} {example.stem}"
    run = compat.run_example(python, example, TIMEOUT)
    assert run.ok, f"{example.name} under {python}: {run.status()}\n{run.stderr[-4000:]}"
    diff = compat.differences(recorded[1], run.stdout, "reference", python)
    assert not diff, "\n".join(diff)


def test_there_are_examples_and_recordings() -> None:
    assert len(EXAMPLES) >= 4
    for example in EXAMPLES:
        recorded = compat.read_expected(example)
        assert recorded is not None, example.name
        assert recorded[1].strip(), example.name


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_recording_comes_from_the_reference_for_this_version_of_the_program(
    example: Path,
) -> None:
    recorded = compat.read_expected(example)
    assert recorded is not None
    assert recorded[0].startswith(f"{compat.HEADER_PREFIX} torchmonarch 0.7.0 ran "), recorded[0]
    assert compat.matches_program(example, recorded[0]), (
        f"{example.name} changed since its output was recorded: {RECORD} {example.stem}"
    )


def test_a_changed_program_no_longer_matches_its_recording(tmp_path: Path) -> None:
    program = tmp_path / "p.py"
    program.write_text("print(1)\n")
    line = compat.header(program, "0.7.0")
    assert compat.matches_program(program, line)
    program.write_text("print(2)\n")
    assert not compat.matches_program(program, line)


#: The reference's public modules the examples may import: ``monarch.actor``, ``monarch.rdma``,
#: ``monarch.spmd`` and the top-level names of the tensor engine (``from monarch import
#: fetch_shard``).
PUBLIC = {"monarch", "monarch.actor", "monarch.rdma", "monarch.spmd"}


def test_examples_use_only_the_public_monarch_api() -> None:
    for example in EXAMPLES:
        imports = [
            line.split()[1]
            for line in example.read_text().splitlines()
            if line.startswith(("import ", "from ")) and "monarch" in line
        ]
        assert imports, example.name
        assert set(imports) <= PUBLIC, (example.name, imports)


def test_differences_finds_a_changed_line_and_nothing_else() -> None:
    assert compat.differences("a\nb\n", "a\nb\n", "x", "y") == []
    diff = compat.differences("a\nb\nc\n", "a\nB\nc\n", "x", "y")
    assert "-b" in diff
    assert "+B" in diff
    assert not [line for line in diff if line in ("-a", "+a", "-c", "+c")]


def test_differences_forgive_the_last_digit_of_a_fraction_only() -> None:
    """A printed float32 loss may move by a unit of its sixth decimal with the CPU (the
    reference printed ``0.923506`` on a machine where it had recorded ``0.923507``); integers,
    words and larger moves still differ."""
    want = "step 3: loss 0.923507\nrank 1 of 4\n"
    assert compat.differences(want, "step 3: loss 0.923506\nrank 1 of 4\n", "x", "y") == []
    for got in (
        "step 3: loss 0.923607\nrank 1 of 4\n",  # a real change
        "step 3: loss 0.923507\nrank 2 of 4\n",  # an integer
        "step 4: loss 0.923507\nrank 1 of 4\n",  # the words around it
        "step 3: loss 0.923507 0.1\nrank 1 of 4\n",  # one number more
    ):
        assert compat.differences(want, got, "x", "y"), got
    assert compat.same_line("a 1.500002e-03 b", "a 1.500001e-03 b")
    assert compat.same_line("loss -0.923507 -0.923505", "loss -0.923505 -0.923507")
    assert not compat.same_line("loss -0.10", "loss -0.11")  # one unit, but 10 %
    for want, got in (
        ("a 1.5e-03 b", "a 1.6e-03 b"),  # one unit of a short fraction is a real change
        ("lr 1.0e-07", "lr 1.0e-06"),  # another exponent
        ("lr 0.000001", "lr 0.000005"),  # 4 units of the last digit
        ("ip 10.0.0.1", "ip 10.0.0.10"),  # written differently
        ("Python 3.10", "Python 3.1"),
        ("x 0.923507", "x 0.9235070"),
    ):
        assert not compat.same_line(want, got), (want, got)


def test_a_program_that_hangs_is_stopped_and_reported(tmp_path: Path) -> None:
    hang = tmp_path / "hang.py"
    hang.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    run = compat.run_example(sys.executable, hang, timeout=1.0)
    assert run.returncode == -1
    assert not run.ok
    assert run.stdout == "started\n"
    assert "TIMEOUT" in run.status()


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_prints_what_the_reference_printed(example: Path) -> None:
    _check(sys.executable, example)


@pytest.mark.slow
@pytest.mark.skipif(not REFERENCE, reason=f"${compat.REFERENCE_ENV} is not set")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_under_the_reference_prints_its_recording(example: Path) -> None:
    _check(REFERENCE, example)
