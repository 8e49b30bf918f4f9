"""Shared machinery of the benchmarks: ABAB alternation, medians, ratio tables, child processes.

Why ratios and not times: the benchmarks run on shared, noisy machines (two cores, other jobs).
A bare "N per second" says more about the neighbours than about the code. So every case runs a
*baseline* (the same work done with the plainest stdlib code) and a *candidate* (the project's
code) in the same run, alternating ``A B A B ...`` so that both see the same load drift, and
reports medians. The headline number is the median of the per-round ratios (candidate over the
baseline run just before it): adjacent runs share the machine's state, so their ratio cancels
most of the noise that the absolute rates carry.

Child processes are forked (``multiprocessing`` with the ``fork`` start method): the parent
has already imported everything, so a child starts in milliseconds and inherits shared memory
and sockets created before the fork. Every wait here has a timeout, and a child that overstays
is terminated; a benchmark run therefore always ends.

The scripts also share their command-line plumbing (``--quick`` / ``--smoke`` / ``--json`` /
``--case`` / ``--write-readme``), the facts about the machine that head every report, and the
writers that put a report into its package README: one copy here keeps every script's options,
JSON records and README sections alike.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import mmap
import multiprocessing
import os
import platform
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")

__all__ = [
    "BenchmarkError",
    "CaseResult",
    "Child",
    "ChildLink",
    "SharedCounters",
    "Trial",
    "add_run_arguments",
    "alternate",
    "alternate_sides",
    "check_cases",
    "filesystem_of",
    "format_rate",
    "machine_facts",
    "machine_line",
    "markdown_table",
    "median",
    "partial_run_warning",
    "run_mode",
    "run_smoke",
    "write_json",
    "write_readme_section",
    "write_readme_subsection",
]


class BenchmarkError(RuntimeError):
    """A benchmark could not produce a measurement (a child failed, hung or sent garbage)."""


# --------------------------------------------------------------------------------------------
# Measurements


@dataclass(frozen=True, slots=True)
class Trial:
    """One timed run of one side (baseline or candidate) of a case.

    ``counted`` datagrams arrived at the receiver during the ``seconds`` between the end of the
    first receive and the last receive (the first receive only starts the clock, so start-up
    costs are not counted). ``received`` and ``sent`` are the totals of the whole run; their
    difference is the loss (UDP may drop).
    """

    counted: int
    seconds: float
    received: int
    sent: int

    @property
    def rate(self) -> float:
        """Datagrams per second at the receiver (0.0 for an empty window)."""
        return self.counted / self.seconds if self.seconds > 0 else 0.0

    @property
    def lost(self) -> int:
        """Datagrams sent but never received."""
        return max(0, self.sent - self.received)

    def to_json(self) -> dict[str, float | int]:
        """A JSON-ready record of the trial."""
        return {
            "rate": self.rate,
            "counted": self.counted,
            "seconds": self.seconds,
            "received": self.received,
            "sent": self.sent,
            "lost": self.lost,
        }


def median(values: Sequence[float]) -> float:
    """The median of ``values``; ``ValueError`` for an empty sequence."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


@dataclass(frozen=True, slots=True)
class CaseResult:
    """Baseline and candidate trials of one case, in the order they ran (paired by index).

    ``target`` is the minimum acceptable ratio (``None``: informational only). ``note`` says
    what the row compares or why it was not measured; a row with no trials is "not measured".
    """

    name: str
    baseline_label: str
    candidate_label: str
    target: float | None
    baseline: tuple[Trial, ...] = ()
    candidate: tuple[Trial, ...] = ()
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        """Whether at least one baseline/candidate pair ran."""
        return bool(self.baseline) and bool(self.candidate)

    @property
    def baseline_median(self) -> float:
        """Median baseline rate (datagrams per second)."""
        return median([t.rate for t in self.baseline])

    @property
    def candidate_median(self) -> float:
        """Median candidate rate (datagrams per second)."""
        return median([t.rate for t in self.candidate])

    @property
    def pair_ratios(self) -> list[float]:
        """Candidate rate over baseline rate for each ABAB round."""
        return [
            (c.rate / b.rate) if b.rate > 0 else math.inf
            for b, c in zip(self.baseline, self.candidate, strict=False)
        ]

    @property
    def ratio(self) -> float:
        """The headline ratio: the median of the per-round ratios."""
        return median(self.pair_ratios)

    @property
    def met(self) -> bool | None:
        """Whether the ratio reaches the target (``None`` without a target or measurement)."""
        if self.target is None or not self.measured:
            return None
        return self.ratio >= self.target

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record of the case (medians, ratios and every trial)."""
        record: dict[str, Any] = {
            "case": self.name,
            "baseline_label": self.baseline_label,
            "candidate_label": self.candidate_label,
            "target": self.target,
            "measured": self.measured,
            "note": self.note,
            "extra": self.extra,
        }
        if self.measured:
            record.update(
                baseline_median=self.baseline_median,
                candidate_median=self.candidate_median,
                ratio=self.ratio,
                ratio_of_medians=self.candidate_median / self.baseline_median
                if self.baseline_median > 0
                else math.inf,
                pair_ratios=self.pair_ratios,
                met=self.met,
                baseline=[t.to_json() for t in self.baseline],
                candidate=[t.to_json() for t in self.candidate],
            )
        return record


def alternate(
    baseline: Callable[[], Trial],
    candidate: Callable[[], Trial],
    rounds: int,
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[tuple[Trial, ...], tuple[Trial, ...]]:
    """Run ``baseline`` and ``candidate`` alternately (A B A B ...) for ``rounds`` rounds.

    Stops early, after a complete round, once ``budget_s`` seconds have passed (at least one
    round always runs), so a slow machine shortens the case instead of overrunning the whole
    benchmark. Returns the trials of each side in the order they ran.
    """
    base, cand = alternate_sides((baseline, candidate), rounds, budget_s=budget_s, clock=clock)
    return base, cand


def alternate_sides(
    sides: Sequence[Callable[[], _T]],
    rounds: int,
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[tuple[_T, ...], ...]:
    """:func:`alternate` for any number of sides: each round runs every side once, in order
    (``A B C A B C ...``), so trial ``i`` of every side comes from the same round. Returns
    one tuple of trials per side (a trial is whatever a side returns: a :class:`Trial`, or a
    latency)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not sides:
        raise ValueError("alternate_sides needs at least one side")
    start = clock()
    trials: list[list[_T]] = [[] for _ in sides]
    for _ in range(rounds):
        for run, record in zip(sides, trials, strict=True):
            record.append(run())
        if clock() - start >= budget_s:
            break
    return tuple(tuple(record) for record in trials)


# --------------------------------------------------------------------------------------------
# Reporting


def format_rate(rate: float) -> str:
    """A rate in datagrams per second, rounded to three significant figures (``1.23 M``)."""
    if not math.isfinite(rate):
        return str(rate)
    for scale, suffix in ((1e6, " M"), (1e3, " k")):
        if rate >= scale:
            return f"{rate / scale:.3g}{suffix}"
    return f"{rate:.3g}"


def markdown_table(results: Sequence[CaseResult]) -> str:
    """The ratio table in Markdown: one row per case, medians, ratio, spread, target, verdict."""
    lines = [
        "| case | baseline | baseline dgram/s (median) | chrysalis dgram/s (median) "
        "| ratio (median) | ratio min-max | target | met? | rounds | lost (cand.) |",
        "|---|---|---:|---:|---:|---:|---:|:---:|---:|---:|",
    ]
    for r in results:
        target = f">= {r.target:g}x" if r.target is not None else "-"
        if not r.measured:
            lines.append(
                f"| {r.name} | {r.baseline_label} | - | - | - | - | {target} | n/a | 0 | - |"
            )
            continue
        ratios = r.pair_ratios
        met = {True: "yes", False: "**no**", None: "-"}[r.met]
        lost = sum(t.lost for t in r.candidate)
        sent = sum(t.sent for t in r.candidate)
        lost_text = f"{lost / sent:.2%}" if sent else "-"
        lines.append(
            f"| {r.name} | {r.baseline_label} | {format_rate(r.baseline_median)} "
            f"| {format_rate(r.candidate_median)} | {r.ratio:.2f}x "
            f"| {min(ratios):.2f}-{max(ratios):.2f} | {target} | {met} "
            f"| {len(ratios)} | {lost_text} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Child processes and shared counters


class SharedCounters:
    """``slots`` unsigned 64-bit counters in an anonymous shared mapping.

    Created before forking, the mapping is shared by the parent and every child, so a receiver
    can publish "received so far" and a sender can read it without a system call. Each counter
    has exactly one writer; aligned 8-byte stores are not torn on the machines this runs on,
    and readers must tolerate a stale value anyway.
    """

    __slots__ = ("_map", "_slots")
    _U64 = struct.Struct("=Q")

    def __init__(self, slots: int) -> None:
        if not 0 < slots <= 512:
            raise ValueError(f"slots must be in 1..512, got {slots}")
        self._slots = slots
        self._map = mmap.mmap(-1, 8 * slots)

    def get(self, index: int) -> int:
        """The value of counter ``index``."""
        return int(self._U64.unpack_from(self._map, 8 * self._check(index))[0])

    def set(self, index: int, value: int) -> None:
        """Store ``value`` (``0 .. 2**64 - 1``) in counter ``index``."""
        self._U64.pack_into(self._map, 8 * self._check(index), value)

    def reset(self) -> None:
        """Zero every counter."""
        self._map[:] = bytes(8 * self._slots)

    def _check(self, index: int) -> int:
        if not 0 <= index < self._slots:
            raise IndexError(f"counter {index} out of range 0..{self._slots - 1}")
        return index


class ChildLink:
    """The child's end of its pipe to the parent: ``send`` results, ``receive`` commands."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def send(self, value: object) -> None:
        """Send ``value`` (picklable) to the parent."""
        self._conn.send(("ok", value))

    def receive(self, timeout: float) -> object:
        """The next value from the parent; :class:`BenchmarkError` after ``timeout`` seconds."""
        if not self._conn.poll(timeout):
            raise BenchmarkError(f"no message from the parent within {timeout} s")
        return self._conn.recv()


def _child_entry(
    conn: Connection, target: Callable[..., None], args: tuple[object, ...], cpu: int | None
) -> None:
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        target(ChildLink(conn), *args)
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None  # reported through the pipe; exit quietly
    finally:
        conn.close()


class Child:
    """A forked child process running ``target(link, *args)`` with a pipe to the parent.

    ``cpu`` pins the child to that CPU (``os.sched_setaffinity``); ``None`` leaves it to the
    scheduler.
    The child reports through ``link.send``; an exception in the child is sent back and raised
    in the parent as :class:`BenchmarkError` by the next :meth:`receive`. :meth:`stop` always
    leaves no process behind (join, then terminate, then kill, each bounded).
    """

    def __init__(
        self, target: Callable[..., None], *args: object, name: str, cpu: int | None = None
    ) -> None:
        if "fork" not in multiprocessing.get_all_start_methods():
            raise BenchmarkError("the benchmarks need the 'fork' start method (Linux)")
        context = multiprocessing.get_context("fork")
        self.name = name
        self._conn, child_conn = context.Pipe(duplex=True)
        self._child_conn = child_conn
        self._process = context.Process(
            target=_child_entry, args=(child_conn, target, args, cpu), name=name, daemon=True
        )

    def start(self) -> Child:
        """Fork the child; returns ``self``."""
        self._process.start()
        self._child_conn.close()  # the parent keeps only its own end
        return self

    def send(self, value: object) -> None:
        """Send ``value`` to the child (read there with ``link.receive``)."""
        self._conn.send(value)

    def receive(self, timeout: float) -> object:
        """The child's next ``link.send`` value.

        Raises :class:`BenchmarkError` if the child failed (with its traceback), exited, or
        sent nothing within ``timeout`` seconds.
        """
        try:
            ready = self._conn.poll(timeout)
        except (OSError, EOFError) as exc:
            raise BenchmarkError(f"{self.name}: pipe broken ({exc})") from None
        if not ready:
            raise BenchmarkError(f"{self.name}: no reply within {timeout} s")
        try:
            message = self._conn.recv()
        except EOFError:
            raise BenchmarkError(
                f"{self.name}: exited without replying (exit code {self._process.exitcode})"
            ) from None
        if not (isinstance(message, tuple) and len(message) == 2):
            raise BenchmarkError(f"{self.name}: malformed reply {message!r:.200}")
        kind, payload = message
        if kind == "error":
            raise BenchmarkError(f"{self.name} failed:\n{payload}")
        return payload

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the child to exit, then terminate it."""
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(1.0)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(1.0)
        self._conn.close()


# --------------------------------------------------------------------------------------------
# Command line, machine facts and README sections


def add_run_arguments(
    parser: argparse.ArgumentParser,
    *,
    quick: str,
    smoke: str,
    json_help: str = "also write every trial as JSON to this file",
    cases: Iterable[str] | None = None,
    case_help: str | None = None,
    readme: str | None = None,
) -> None:
    """Add the options every benchmark script has: ``--quick`` and ``--smoke`` (with the
    script's own description of what they shrink), ``--json OUT``, ``--case NAME``
    (repeatable, when the script has named ``cases``; ``case_help`` replaces the generated list
    of names) and ``--write-readme`` (when ``readme`` says what it replaces).

    ``--smoke`` wins over ``--quick`` (see :func:`run_mode`): the smoke run is the one CI
    executes, and it must stay short whatever else is given."""
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--smoke", action="store_true", help=smoke)
    parser.add_argument("--json", type=Path, help=json_help)
    if cases is not None:
        names = ", ".join(cases)
        parser.add_argument(
            "--case",
            action="append",
            default=[],
            help=case_help or f"run only this case (repeatable): {names}",
        )
    if readme is not None:
        parser.add_argument("--write-readme", action="store_true", help=readme)


def check_cases(
    parser: argparse.ArgumentParser, given: Iterable[str], known: Iterable[str]
) -> None:
    """Exit through ``parser.error`` (status 2, usage on stderr) if ``--case`` named a case
    the script does not have: a typo must not silently run nothing."""
    unknown = set(given) - set(known)
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")


def run_mode(args: argparse.Namespace) -> str:
    """``"smoke"``, ``"quick"`` or ``"full"``, from the options :func:`add_run_arguments`
    added (smoke first)."""
    if args.smoke:
        return "smoke"
    return "quick" if args.quick else "full"


def run_smoke(
    script: Path, json_out: Path, *extra: str, cwd: Path, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run ``script --smoke --json json_out *extra`` with this interpreter in ``cwd`` (bounded
    by ``timeout`` seconds) and return it, stdout and stderr captured as text: how the smoke
    tests in ``tests/`` prove that a script still works. :class:`BenchmarkError`, with the
    tail of its stderr, if the script failed."""
    proc = subprocess.run(
        [sys.executable, str(script), "--smoke", "--json", str(json_out), *extra],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise BenchmarkError(
            f"{script.name} --smoke exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    return proc


def partial_run_warning(mode: str) -> list[str]:
    """Report lines (a bold warning, then a blank line) for a ``quick`` or ``smoke`` run, none
    for a ``full`` one: numbers from a shortened run must not be quoted as the benchmark's."""
    if mode == "full":
        return []
    return [
        f"**{mode} run: fewer or shorter trials than the full benchmark; do not "
        "quote these numbers.**",
        "",
    ]


def machine_facts(script: str | None = None, argv: Sequence[str] | None = None) -> dict[str, str]:
    """The facts that head every report and JSON record: the date, the machine (cores,
    architecture), the Python version, the kernel release and, given the ``script``'s path
    relative to the repository (``benchmarks/x.py``), the command line that reproduces the run
    (``argv`` as given to ``main``; ``None`` means ``sys.argv[1:]``)."""
    facts = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, shared with other jobs",
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    if script is not None:
        given = list(argv) if argv is not None else sys.argv[1:]
        facts["command"] = f"python {script}" + "".join(f" {a}" for a in given)
    return facts


def machine_line(meta: dict[str, Any]) -> str:
    """``date, machine, Python x.y.z`` from :func:`machine_facts` (for a report's header)."""
    return f"{meta['date']}, {meta['machine']}, Python {meta['python']}"


def filesystem_of(folder: str) -> str:
    """The type of the file system ``folder`` lives on (``ext4``, ``tmpfs``, ...), from the
    longest matching mount point in ``/proc/mounts``; ``"unknown"`` where that cannot be read.
    Disk-bound numbers mean little without it (a ``tmpfs`` commit never waits for a disk)."""
    try:
        best = ("", "unknown")
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if (
                    len(fields) > 2
                    and folder.startswith(fields[1])
                    and len(fields[1]) > len(best[0])
                ):
                    best = (fields[1], fields[2])
        return best[1]
    except OSError:
        return "unknown"


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` as indented JSON (values JSON does not know, such as
    paths, are written as their ``str``)."""
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def _replace_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one atomic rename, keeping its permission bits: an
    interrupted run leaves the old README, never half of a new one (nor a temporary file)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(temporary, os.stat(path).st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


_SECTION_HEADING = re.compile(r"^## ", re.MULTILINE)


def write_readme_section(readme: Path, section: str, heading: str = "## Benchmark") -> None:
    """Replace the ``heading`` section of ``readme`` (up to the next ``## `` heading) with
    ``section`` (which starts with that heading), or append it at the end if absent.

    Nothing else in the file changes; the file is read right before it is replaced, and
    replaced atomically."""
    text = readme.read_text()
    found = re.search(rf"^{re.escape(heading)}[ \t]*$", text, re.MULTILINE)
    if found is None:
        updated = text.rstrip("\n") + "\n\n" + section
    else:
        following = _SECTION_HEADING.search(text, found.end())
        rest = "" if following is None else "\n" + text[following.start() :]
        updated = text[: found.start()] + section + rest
    _replace_file(readme, updated)


def write_readme_subsection(
    readme: Path, heading: str, text: str, section: str = "## Benchmark"
) -> None:
    """Replace the subsection ``heading`` (a ``### `` line, up to the next ``### `` or ``## ``
    heading) of the ``section`` of ``readme`` with ``text``: several scripts can share one
    package's benchmark section, each owning its subsection.

    A missing subsection is appended at the end of the section, and a missing section at the
    end of the file; everything else in the file is left as it was (replaced atomically)."""
    body = text.rstrip("\n") + "\n"
    content = readme.read_text()
    found = re.search(rf"^{re.escape(section)}[ \t]*$", content, re.MULTILINE)
    if found is None:
        _replace_file(readme, content.rstrip("\n") + f"\n\n{section}\n\n" + body)
        return
    after = _SECTION_HEADING.search(content, found.end())
    section_end = after.start() if after is not None else len(content)
    own = re.compile(rf"^{re.escape(heading)}[ \t]*$", re.MULTILINE).search(
        content, found.end(), section_end
    )
    if own is None:
        head = content[:section_end].rstrip("\n") + "\n\n"
        tail = content[section_end:]
        _replace_file(readme, head + body + ("\n" + tail if tail else ""))
        return
    following = re.compile(r"^##+ ", re.MULTILINE).search(content, own.end(), section_end)
    end = following.start() if following is not None else section_end
    tail = content[end:]
    _replace_file(readme, content[: own.start()] + body + ("\n" + tail if tail else ""))
