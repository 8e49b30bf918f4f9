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
"""

from __future__ import annotations

import contextlib
import math
import mmap
import multiprocessing
import os
import statistics
import struct
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

__all__ = [
    "BenchmarkError",
    "CaseResult",
    "Child",
    "ChildLink",
    "SharedCounters",
    "Trial",
    "alternate",
    "alternate_sides",
    "format_rate",
    "markdown_table",
    "median",
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
    sides: Sequence[Callable[[], Trial]],
    rounds: int,
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[tuple[Trial, ...], ...]:
    """:func:`alternate` for any number of sides: each round runs every side once, in order
    (``A B C A B C ...``), so trial ``i`` of every side comes from the same round. Returns
    one tuple of trials per side."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if not sides:
        raise ValueError("alternate_sides needs at least one side")
    start = clock()
    trials: list[list[Trial]] = [[] for _ in sides]
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
