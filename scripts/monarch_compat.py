"""Run the Monarch example programs under two implementations and compare their output.

The programs in ``examples/monarch/`` use only Meta's public ``monarch.actor`` API and print
deterministic output. This script runs each one under our interpreter (the workspace
environment, where ``monarch.actor`` is this repository's ``monarch-actor``) and, when one is
given, under an interpreter that has the reference Monarch (``torchmonarch==0.7.0``; it installs
its own top-level ``monarch`` package, so it lives in a separate, detached environment), then
compares standard output line by line. Standard error is not compared: both implementations log
there differently. Printed fractions may differ by ``LAST_DIGIT_UNITS`` in their last digit
(that of a float32 loss depends on the CPU), everything else is compared exactly.

    python scripts/monarch_compat.py                      # ours against the *.expected files
    python scripts/monarch_compat.py --reference PYTHON   # ours, the reference and *.expected
    python scripts/monarch_compat.py --reference PYTHON --record   # rewrite *.expected

``MONARCH_REFERENCE_PYTHON`` is the default for ``--reference``; ``./dev compat`` creates the
detached hatch environment ``reference`` and runs this script with it. The ``*.expected`` files
hold the reference's output, recorded with ``--record``, so the comparison is meaningful where
the reference is not installed (``tests/test_monarch_compat.py`` uses them). Each starts with one
header line naming the reference's version and a digest of the program it was recorded from, so
a program changed without recording it again is caught without the reference. Exit status: 0
when every program exits 0 and every compared output matches, 1 otherwise, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "monarch"
REFERENCE_ENV = "MONARCH_REFERENCE_PYTHON"
DEFAULT_TIMEOUT = 180.0
HEADER_PREFIX = "# recorded from the reference Monarch:"
MAX_DIFF_LINES = 40


@dataclass(frozen=True)
class Run:
    """One program run under one interpreter."""

    returncode: int  # -1 when it timed out
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def status(self) -> str:
        if self.returncode == -1:
            return f"TIMEOUT {self.seconds:.0f}s"
        return f"rc={self.returncode} {self.seconds:.1f}s"


def examples(names: Sequence[str] = ()) -> list[Path]:
    """The example programs, sorted; ``names`` (stems or file names) selects some of them."""
    found = sorted(EXAMPLES.glob("*.py"))
    if not names:
        return found
    wanted = {Path(n).stem for n in names}
    unknown = wanted - {p.stem for p in found}
    if unknown:
        raise ValueError(f"no such example: {', '.join(sorted(unknown))}")
    return [p for p in found if p.stem in wanted]


def expected_path(example: Path) -> Path:
    """Where the reference's recorded output of ``example`` lives."""
    return example.with_suffix(".expected")


def digest(example: Path) -> str:
    """A short digest of the program's text: ties a recording to the program it came from."""
    return hashlib.sha256(example.read_bytes()).hexdigest()[:16]


def header(example: Path, version: str) -> str:
    """The first line of a recording."""
    return f"{HEADER_PREFIX} torchmonarch {version} ran {example.name} sha256:{digest(example)}"


def matches_program(example: Path, header_line: str) -> bool:
    """Whether a recording's header names the program as it is now."""
    return header_line.endswith(f" ran {example.name} sha256:{digest(example)}")


def read_expected(example: Path) -> tuple[str, str] | None:
    """``(header line, recorded output)`` of ``example``, or ``None`` when never recorded."""
    path = expected_path(example)
    if not path.exists():
        return None
    first, _, body = path.read_text().partition("\n")
    if not first.startswith(HEADER_PREFIX):
        raise ValueError(f"{path.name}: the first line is not a {HEADER_PREFIX!r} header")
    return first, body


def write_expected(example: Path, version: str, output: str) -> None:
    expected_path(example).write_text(f"{header(example, version)}\n{output}")


def reference_version(python: str) -> str:
    """The version of ``torchmonarch`` installed for ``python``."""
    code = "import importlib.metadata as m; print(m.version('torchmonarch'))"
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def run_example(python: str, example: Path, timeout: float = DEFAULT_TIMEOUT) -> Run:
    """Run ``example`` with ``python`` from the repository root, bounded by ``timeout``.

    ``PYTHONPATH`` is dropped so each interpreter sees only its own environment's ``monarch``.
    The whole process group is killed on timeout: the examples start worker processes.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    start = time.monotonic()
    proc = subprocess.Popen(
        [python, str(example)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        code = -1
    return Run(code, out, err, time.monotonic() - start)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


#: A decimal number with a fraction (``0.923507``, ``-1.5e-03``): sign, digits, fraction, exponent.
_FLOAT = re.compile(r"([-+]?)(\d+)\.(\d+)((?:[eE][-+]?\d+)?)")
#: How far two printed fractions may differ and still be the same output, in units of their last
#: printed digit: the last digit of a float32 computation moves with the CPU's vector kernels
#: (on an AMD EPYC with AVX-512, 2026-12-04, the reference itself printed ``0.923506`` where it
#: had recorded ``0.923507``).
LAST_DIGIT_UNITS = 2
#: ... and only where that is a small relative change (float32 noise shows in the sixth or
#: seventh significant digit): ``1.5`` and ``1.6`` differ in one unit too, by 7 %.
MAX_RELATIVE = 1e-4


def same_line(want: str, got: str) -> bool:
    """``want`` and ``got`` are the same line: equal, or equal but for their printed fractions,
    each pair written alike (as many decimals, the same exponent) and at most
    ``LAST_DIGIT_UNITS`` apart in its last digit and ``MAX_RELATIVE`` of its value (integers,
    words, dotted versions and addresses, and everything else compared exactly)."""
    if want == got:
        return True
    if _FLOAT.sub("#", want) != _FLOAT.sub("#", got):
        return False
    for a, b in zip(_FLOAT.finditer(want), _FLOAT.finditer(got), strict=True):
        if len(a[3]) != len(b[3]) or a[4] != b[4]:
            return False  # written differently: not the same value at a last digit's noise
        x, y = int(a[1] + a[2] + a[3]), int(b[1] + b[2] + b[3])
        if abs(x - y) > LAST_DIGIT_UNITS or abs(x - y) > MAX_RELATIVE * max(abs(x), abs(y)):
            return False
    return True


def differences(want: str, got: str, want_name: str, got_name: str) -> list[str]:
    """A unified diff of two outputs, line by line; empty when they are the same (a line of
    ``got`` that is ``same_line`` as the line of ``want`` at its place counts as equal)."""
    wanted, gotten = want.splitlines(), got.splitlines()
    gotten = [
        wanted[i] if i < len(wanted) and same_line(wanted[i], line) else line
        for i, line in enumerate(gotten)
    ]
    return list(difflib.unified_diff(wanted, gotten, want_name, got_name, lineterm="", n=1))


def _cell(run: Run | None, reference: str | None, name: str) -> tuple[str, list[str]]:
    """The table cell for ``run`` compared with ``reference`` (text), and the diff lines."""
    if run is None:
        return "-", []
    if not run.ok:
        tail = run.stderr.strip().splitlines()[-5:]
        return f"FAIL {run.status()}", [f"{name}: {run.status()}", *tail]
    if reference is None:
        return f"ok {run.status()}", []
    diff = differences(reference, run.stdout, "reference", name)
    if diff:
        changed = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        return f"DIFF ({changed} lines) {run.status()}", diff
    return f"same {run.status()}", []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="examples to run (default: all)")
    parser.add_argument("--ours", default=sys.executable, help="our interpreter")
    parser.add_argument(
        "--reference",
        default=os.environ.get(REFERENCE_ENV) or None,
        help=f"the reference Monarch's interpreter (default: ${REFERENCE_ENV})",
    )
    parser.add_argument("--record", action="store_true", help="write *.expected from it")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    args = parser.parse_args(argv)
    if args.record and not args.reference:
        parser.error("--record needs --reference (or $MONARCH_REFERENCE_PYTHON)")
    try:
        programs = examples(args.names)
    except ValueError as error:
        parser.error(str(error))

    version = reference_version(args.reference) if args.record else ""
    failed = False
    rows: list[tuple[str, str, str, str]] = []
    details: list[str] = []
    for example in programs:
        try:
            recorded = read_expected(example)
        except ValueError:  # no header: treated as never recorded
            recorded = None
        stale = recorded is not None and not matches_program(example, recorded[0])
        expected = recorded[1] if recorded is not None else None
        ref = run_example(args.reference, example, args.timeout) if args.reference else None
        if ref is not None and ref.ok and args.record:
            write_expected(example, version, ref.stdout)
            expected, stale = ref.stdout, False
        ours = run_example(args.ours, example, args.timeout)
        # Ours is compared with the live reference when there is one, else with the recording.
        baseline = ref.stdout if ref is not None and ref.ok else expected
        ours_cell, ours_diff = _cell(ours, baseline, "ours")
        ref_cell, ref_diff = _cell(ref, expected, "reference")
        if expected is None:
            exp_cell = "missing"
            failed = True
        elif ref is not None and ref.ok and args.record:
            exp_cell = "recorded"
        elif stale:
            exp_cell = "STALE (program changed)"
            failed = True
        else:
            exp_cell = "present"
        rows.append((example.stem, ours_cell, ref_cell, exp_cell))
        for diff in (ours_diff, ref_diff):
            if diff:
                failed = True
                details.append(f"== {example.name}")
                details.extend(diff[:MAX_DIFF_LINES])

    header = ("example", "ours", "reference", "expected")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if details:
        print()
        print("\n".join(details))
    print()
    print("MISMATCH" if failed else "all outputs match")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
