"""Capture overhead of ``chrysalis.sqlite``: plain SQLite inserts vs captured inserts.

Usage::

    python benchmarks/sqlite_capture.py [--quick] [--smoke] [--case NAME] [--json OUT]
                                        [--write-readme] [--clock {auto,cpu,wall}]

Every case runs the same inserts two ways, alternately (``A B A B ...``, see
``benchmarks/_common.py``), each trial on a fresh database:

- **baseline** (plain): a stdlib ``sqlite3`` connection, ``BEGIN``, ``INSERT INTO chalkboard
  VALUES (?, ?, ?)`` per row, ``COMMIT``;
- **candidate** (captured): a ``Replica`` on the same kind of database,
  ``with replica.transaction() as tx``, the same ``INSERT`` through ``tx.execute`` followed by
  ``tx.capture_upsert`` per row (or ``tx.upsert`` where the case says so); the commit then also
  bumps the logical clock, checks the captured rows (one aggregate query: found, and their
  size) and lists the version's keys. The rows' clock entries are written later, by a *fold*
  (the replicator's, in normal use): the plain case names measure the **commit path** (what
  the application's transaction pays; every ``REPLICATOR_EVERY`` transactions the trial folds
  with the clock stopped, as a replicator would off the application's path, which also keeps
  the pending backlog under the replica's bound, so no commit folds); the ``+fold`` cases
  run ``Replica._fold_all()`` after every transaction inside the timed region (its own
  write transaction), the **total**.

The rows are the shared-chalkboard schema ``(id TEXT PRIMARY KEY, author TEXT, message TEXT)``
with a 43-character message. A trial runs whole transactions until ``seconds`` have passed on
its clock and counts the rows; rate = rows / elapsed time on that clock. The headline number is
the **slowdown**, the ratio of the median rates (plain median / captured median); the table
also shows the min-max of the per-round slowdowns (the noise). Target: captured at most 1.5x
slower. No network is involved; replication throughput across processes is a separate
benchmark.

Which clock (``--clock``, default ``auto``): both sides of a ``memory-*`` case are pure
in-process CPU work, so their trials are timed in **process CPU time**
(``time.process_time``): wall time there also counts the time the process was descheduled by
other jobs on a shared machine. ``file-*`` cases are timed in **wall time**, since waiting for
``fsync`` is a real cost of a durable commit that CPU time would hide. Both sides of a case
always use the same clock, in the same way (the baseline's code is the same whichever clock);
every trial also records the other clock (``wall_s`` / ``cpu_s`` in the JSON), and ``--clock
cpu`` / ``--clock wall`` time every case on one clock, to compare. Measured on the same
trials (2026-12-01, busy 2-core machine): CPU time removes the descheduled stretches (the
upsert case's per-round slowdowns 0.96-1.94 in CPU time, 0.75-2.11 on the wall) but not the
rest of the noise, which is the CPU's own throughput under other jobs (the plain baseline's
rate still ranged 189k-353k rows/s in CPU time). Instruction counts (callgrind) are the
steady measure; see the package README.

Cases:

``file-commit-each``
    a database file (default rollback journal, ``synchronous=FULL``), one row per transaction:
    the shared-chalkboard ``write`` pattern, where each commit is durable.
``file-batch-100``
    a database file, 100 rows per transaction.
``memory-batch-100``
    ``:memory:``, 100 rows per transaction: no I/O at all, the pure CPU cost of capture.
``memory-batch-100-upsert``
    as ``memory-batch-100``, the candidate using ``tx.upsert(table, row)`` (write and capture
    in one call) instead of ``execute`` + ``capture_upsert``.
``<case>+fold``
    the same, each transaction followed by a fold of its clock entries in a write
    transaction of its own: an upper bound of what a replicator does, which folds inside
    the write transactions it runs anyway (an ``Ack``'s, an apply's), however many commits
    came before; on a file this case pays an extra ``fsync`` per commit.
``file-batch-100-metadata-only`` and ``memory-batch-100-metadata-only``
    the **floor** of the commit path, not a way to use the package: the candidate is the
    plain inserts plus exactly the statements a commit runs (the clock update, the aggregate
    query over the keys as JSON joined with the table, and the version's row), with the
    package's own statements, from JSON prepared before the clock starts: no Python call per
    capture. A commit cannot be cheaper than this with this layout.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make ``benchmarks._common`` importable
    sys.path.insert(0, str(ROOT))

from benchmarks._common import (  # noqa: E402
    CaseResult,
    Trial,
    add_run_arguments,
    alternate,
    check_cases,
    filesystem_of,
    machine_facts,
    machine_line,
    run_mode,
    write_json,
    write_readme_subsection,
)
from chrysalis.sqlite import Replica, TableSchema, _sql  # noqa: E402

README: Final = ROOT / "packages" / "chrysalis-sqlite" / "README.md"
SUBSECTION: Final = "### Capture overhead"
TARGET_SLOWDOWN: Final = 1.5
# commit-path trials fold (untimed) this often: a replicator's pace, below MAX_PENDING_VERSIONS
REPLICATOR_EVERY: Final = 64
MESSAGE: Final = "the quick brown fox jumps over the lazy dog"
INSERT: Final = "INSERT INTO chalkboard VALUES (?, ?, ?)"
CHALKBOARD: Final = TableSchema(
    "chalkboard",
    "CREATE TABLE IF NOT EXISTS chalkboard (id TEXT PRIMARY KEY, author TEXT, message TEXT)",
    ["id", "author", "message"],
    ["id"],
)


@dataclass(frozen=True)
class Config:
    """How long and how often to measure."""

    rounds: int
    seconds: float
    budget_s: float


# Why not more and shorter trials in the same time: tried (40 rounds of 0.2 s against 20 of
# 0.4 s, 2026-12-01, same tree, busy 2-core machine), the interquartile range of the per-round
# slowdowns did not narrow (memory-batch-100 1.28-1.52 against 1.27-1.51, the upsert case
# 1.42-1.76 against 1.23-1.56) and the extremes widened
FULL: Final = Config(rounds=20, seconds=0.4, budget_s=40.0)
QUICK: Final = Config(rounds=6, seconds=0.25, budget_s=10.0)
SMOKE: Final = Config(rounds=1, seconds=0.03, budget_s=1.0)

Clock = Callable[[], float]
"""What a trial is timed with (``time.perf_counter`` or ``time.process_time``)."""

CLOCKS: Final[dict[str, Clock]] = {"wall": time.perf_counter, "cpu": time.process_time}
"""The clocks by name (``--clock``)."""


@dataclass(frozen=True)
class Case:
    """One row of the table."""

    name: str
    on_file: bool
    per_transaction: int
    use_upsert: bool = False
    metadata_only: bool = False
    fold: bool = False


CASES: Final = (
    Case("file-commit-each", on_file=True, per_transaction=1),
    Case("file-commit-each+fold", on_file=True, per_transaction=1, fold=True),
    Case("file-batch-100", on_file=True, per_transaction=100),
    Case("file-batch-100+fold", on_file=True, per_transaction=100, fold=True),
    Case("memory-batch-100", on_file=False, per_transaction=100),
    Case("memory-batch-100+fold", on_file=False, per_transaction=100, fold=True),
    Case("memory-batch-100-upsert", on_file=False, per_transaction=100, use_upsert=True),
    Case(
        "memory-batch-100-upsert+fold",
        on_file=False,
        per_transaction=100,
        use_upsert=True,
        fold=True,
    ),
    Case("file-batch-100-metadata-only", on_file=True, per_transaction=100, metadata_only=True),
    Case("memory-batch-100-metadata-only", on_file=False, per_transaction=100, metadata_only=True),
)


def clock_name(case: Case, choice: str) -> str:
    """The clock of ``case`` for ``--clock choice``: ``auto`` is CPU time in memory, wall time
    on a file (``fsync`` waits are a real cost)."""
    if choice == "auto":
        return "wall" if case.on_file else "cpu"
    return choice


class Timer:
    """Times one trial on its clock (``timed``) and on the other (``other``), with pauses
    (untimed work) taken out of both; ``trial`` makes the record. The same for both sides."""

    def __init__(self, timed: Clock, other: Clock) -> None:
        self.timed = timed
        self._other = other
        self.start = timed()
        self._other_start = other()
        self._paused_other = 0.0

    def pause(self, started: float, other_started: float) -> float:
        """Take the time since ``started`` (on the timed clock; ``other_started`` on the other)
        out of the trial; returns the paused time on the timed clock."""
        paused = self.timed() - started
        self._paused_other += self._other() - other_started
        self.start += paused
        return paused

    def trial(self, rows: int, now: float) -> tuple[Trial, float]:
        """The trial ending at ``now`` (timed clock) and its length on the other clock."""
        other = self._other() - self._other_start - self._paused_other
        return Trial(counted=rows, seconds=now - self.start, received=rows, sent=rows), other


def _clocks(name: str) -> tuple[Clock, Clock]:
    """The timed clock named ``name`` and the other one."""
    other = "cpu" if name == "wall" else "wall"
    return CLOCKS[name], CLOCKS[other]


def _database(folder: str, case: Case, side: str, counter: list[int]) -> str:
    if not case.on_file:
        return ":memory:"
    counter[0] += 1
    return os.path.join(folder, f"{case.name}-{side}-{counter[0]}.sqlite")


def plain_trial(path: str, case: Case, seconds: float, timing: str = "wall") -> tuple[Trial, float]:
    """Plain ``sqlite3`` inserts for ``seconds`` on the clock ``timing``; returns the rows and the
    elapsed time on that clock, and the elapsed time on the other clock."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(CHALKBOARD.create_sql)
        rows = 0
        per = case.per_transaction
        timed, other = _clocks(timing)
        timer = Timer(timed, other)
        deadline = timer.start + seconds
        while True:
            conn.execute("BEGIN")
            for _ in range(per):
                conn.execute(INSERT, (f"note-{rows}", "alice", MESSAGE))
                rows += 1
            conn.execute("COMMIT")
            now = timed()
            if now >= deadline:
                return timer.trial(rows, now)
    finally:
        conn.close()


def captured_trial(
    path: str, case: Case, seconds: float, timing: str = "wall"
) -> tuple[Trial, float]:
    """The same inserts through ``Replica.transaction`` with a capture per row (and, for a
    ``+fold`` case, a fold of the clock entries after every transaction)."""
    replica = Replica(path, [CHALKBOARD])
    try:
        rows = 0
        transactions = 0
        per = case.per_transaction
        timed, other = _clocks(timing)
        timer = Timer(timed, other)
        deadline = timer.start + seconds
        while True:
            with replica.transaction() as tx:
                if case.use_upsert:
                    for _ in range(per):
                        tx.upsert("chalkboard", (f"note-{rows}", "alice", MESSAGE))
                        rows += 1
                else:
                    for _ in range(per):
                        key = f"note-{rows}"
                        tx.execute(INSERT, (key, "alice", MESSAGE))
                        tx.capture_upsert("chalkboard", (key,))
                        rows += 1
            transactions += 1
            if case.fold:
                replica._fold_all()
            elif transactions % REPLICATOR_EVERY == 0:
                # the commit path: a replicator folds off the application's path (below the
                # replica's pending bound, so no commit folds); untimed here
                pause, other_pause = timed(), other()
                replica._fold_all()
                deadline += timer.pause(pause, other_pause)
            now = timed()
            if now >= deadline:
                return timer.trial(rows, now)
    finally:
        replica.close()


def metadata_only_trial(
    path: str, case: Case, seconds: float, timing: str = "wall"
) -> tuple[Trial, float]:
    """The floor: plain inserts plus the statements a commit runs, nothing else (with the
    package's own statements from ``chrysalis.sqlite._sql``): the clock update, the aggregate
    query over the keys as JSON (prepared in advance) joined with the table (which also reads
    the new version), and the version's row in ``__chrysalis_versions_v1``."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(CHALKBOARD.create_sql)
        clock = _sql.clock_sql(
            CHALKBOARD.table, CHALKBOARD.columns, CHALKBOARD.primary_key, ("TEXT",)
        )
        for statement in (*_sql.METADATA_DDL, *_sql.VERSIONS_DDL, _sql.FOLDED_DDL, *clock.ddl):
            conn.execute(statement)
        conn.execute("INSERT INTO __chrysalis_replica_v1 VALUES (1, randomblob(16), 0)")
        conn.execute(_sql.INIT_FOLDED)
        (site,) = conn.execute("SELECT site_id FROM __chrysalis_replica_v1").fetchone()
        conn.execute(_sql.INSERT_ORIGIN, (site,))
        per = case.per_transaction
        # the keys of each transaction as JSON, prepared in advance (refilled if a fast
        # machine outruns them)
        prepared: list[str] = []
        rows = 0
        timed, other = _clocks(timing)
        timer = Timer(timed, other)
        deadline = timer.start + seconds
        while True:
            if rows // per >= len(prepared):
                pause, other_pause = timed(), other()
                first = len(prepared)
                prepared += [
                    json.dumps([f"note-{i}" for i in range(t * per, (t + 1) * per)])
                    for t in range(first, first + 50)
                ]
                deadline += timer.pause(pause, other_pause)
            keys = prepared[rows // per]
            conn.execute("BEGIN")
            for _ in range(per):
                conn.execute(INSERT, (f"note-{rows}", "alice", MESSAGE))
                rows += 1
            conn.execute(_sql.BUMP_CLOCK, (0,))
            # the rows found and their size, the new version and what it must be above, the
            # schema version (the entries are written by a later fold)
            version = conn.execute(clock.measure_values, (keys, 1)).fetchone()[2]
            conn.execute(_sql.INSERT_VERSION, (1, version, CHALKBOARD.table, keys))
            conn.execute("COMMIT")
            now = timed()
            if now >= deadline:
                return timer.trial(rows, now)
    finally:
        conn.close()


def run_case(case: Case, config: Config, folder: str, clock: str = "auto") -> CaseResult:
    """Alternate plain and captured trials of ``case``; every trial gets a fresh database.
    Both sides are timed on the same clock (``clock_name(case, clock)``)."""
    counter = [0]
    name = clock_name(case, clock)
    other_seconds: dict[str, list[float]] = {"plain": [], "captured": []}

    def baseline() -> Trial:
        path = _database(folder, case, "plain", counter)
        trial, other = plain_trial(path, case, config.seconds, name)
        other_seconds["plain"].append(other)
        return trial

    def candidate() -> Trial:
        path = _database(folder, case, "captured", counter)
        if case.metadata_only:
            trial, other = metadata_only_trial(path, case, config.seconds, name)
        else:
            trial, other = captured_trial(path, case, config.seconds, name)
        other_seconds["captured"].append(other)
        return trial

    base, cand = alternate(baseline, candidate, config.rounds, budget_s=config.budget_s)
    if case.metadata_only:
        label = "floor: plain inserts + the commit's statements only"
    elif case.use_upsert:
        label = "tx.upsert"
    else:
        label = "tx.execute + capture_upsert"
    label += ", total with the fold" if case.fold else ""
    label += ", commit path" if not case.fold and not case.metadata_only else ""
    return CaseResult(
        case.name,
        "plain sqlite3",
        label,
        1 / TARGET_SLOWDOWN,
        baseline=base,
        candidate=cand,
        extra={
            "rows_per_transaction": case.per_transaction,
            "file": case.on_file,
            "clock": name,
            # each trial's length on the other clock, in order (``cpu_s`` when timed on the
            # wall, ``wall_s`` when timed in CPU time)
            f"{'wall' if name == 'cpu' else 'cpu'}_s": other_seconds,
        },
    )


def slowdown(result: CaseResult) -> float:
    """Plain median rate over captured median rate (the headline number)."""
    return result.baseline_median / result.candidate_median


_COST_NOTE: Final = (
    "Which is which: rows without `+fold` are the **commit path**, what the application's",
    "transaction pays; the clock entries are written later by a fold, which in normal use",
    "runs inside the replicator's own write transactions (an `Ack`'s, an apply's), not in",
    "the application's (the trial folds every 64 transactions with its clock stopped, as a",
    "replicator would; without a session a replica folds a bounded step in the commit that",
    "finds more than 256 versions pending). Rows with `+fold` are the **total**: the same,",
    "each transaction followed by a fold in a write transaction of its own, in the timed",
    "region (more than a replicator does: on a file that is an extra `fsync` per commit).",
    "Where the time goes:",
    "each captured row costs, besides the application's own insert, a Python call that",
    "remembers its key and, at commit, its share of one aggregate query per table over the",
    "keys as JSON joined with the table (a key lookup: rows found, and their size for the",
    "byte bound); each transaction adds one clock update and one `__chrysalis_versions_v1`",
    "row. The fold writes one clock entry per row (a B-tree insert, and a key lookup for the",
    "tombstone flag) with one statement per version. The `*-metadata-only` rows are the floor",
    "of the commit path: the same plain inserts plus only the commit's statements, from JSON",
    "prepared in advance, with no Python per capture. cr-sqlite's published figure is about",
    "2.5x.",
)


def _rate(rate: float) -> str:
    return f"{rate / 1000:.1f} k" if rate >= 1000 else f"{rate:.0f}"


def markdown(results: Sequence[CaseResult], meta: dict[str, Any]) -> str:
    """The capture subsection of the README's benchmark section: the table and how it was
    measured."""
    lines = [
        SUBSECTION,
        "",
        "Measured by `benchmarks/sqlite_capture.py` "
        f"({meta['mode']} run, {machine_line(meta)}, "
        f"SQLite {meta['sqlite']}, database files on {meta['filesystem']}). Plain `sqlite3` "
        "inserts and captured inserts through `Replica.transaction()` alternate (A B A B), "
        f"each trial ({meta['config']['seconds']} s) on a fresh database; the slowdown is the "
        "ratio of the median rates. Clock: both sides of a case are timed on the same clock, "
        "process CPU time (`cpu`) for the in-memory cases (pure CPU work: wall time would also "
        "count the time other jobs held the CPU) and wall time (`wall`) on files (`fsync` "
        "waits are a real cost). "
        f"Target: captured at most {TARGET_SLOWDOWN}x slower.",
        "",
        "| case | rows per transaction | clock | plain rows/s (median) | captured rows/s (median) "
        "| slowdown (ratio of medians) | per-round slowdown min-max | met? | rounds |",
        "|---|---:|:---:|---:|---:|---:|---:|:---:|---:|",
    ]
    for r in results:
        per_round = [1 / x for x in r.pair_ratios if x > 0]
        s = slowdown(r)
        if r.name.endswith("-metadata-only"):
            met = "(floor)"
        elif r.name.endswith("+fold"):
            met = "(total) yes" if s <= TARGET_SLOWDOWN else "(total) no"
        else:
            met = "yes" if s <= TARGET_SLOWDOWN else "**no**"
        lines.append(
            f"| {r.name} ({r.candidate_label}) | {r.extra['rows_per_transaction']} "
            f"| {r.extra['clock']} | {_rate(r.baseline_median)} | {_rate(r.candidate_median)} "
            f"| {s:.2f}x "
            f"| {min(per_round):.2f}-{max(per_round):.2f} | {met} | {len(per_round)} |"
        )
    lines += ["", *_COST_NOTE, ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_run_arguments(
        parser,
        quick="fewer, shorter rounds",
        smoke="one tiny round per case",
        cases=[c.name for c in CASES],
        readme="replace the capture subsection of the package README's benchmark section",
    )
    parser.add_argument(
        "--clock",
        choices=("auto", *CLOCKS),
        default="auto",
        help="what the trials are timed with: auto (CPU time in memory, wall time on a file), "
        "or one clock for every case",
    )
    args = parser.parse_args(argv)
    check_cases(parser, args.case, [c.name for c in CASES])
    config = SMOKE if args.smoke else QUICK if args.quick else FULL
    cases = [c for c in CASES if not args.case or c.name in args.case]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sqlite-capture-") as folder:
        meta: dict[str, Any] = {
            "mode": run_mode(args),
            **machine_facts(),
            "sqlite": sqlite3.sqlite_version,
            "filesystem": filesystem_of(folder),
            "config": {"rounds": config.rounds, "seconds": config.seconds},
            "clock": args.clock,
        }
        results: list[CaseResult] = []
        for case in cases:
            print(f"running {case.name} ...", file=sys.stderr, flush=True)
            results.append(run_case(case, config, folder, args.clock))
    meta["elapsed_s"] = round(time.monotonic() - started, 1)
    section = markdown(results, meta)
    print(section)
    if args.json is not None:
        document = {
            **meta,
            "target_slowdown": TARGET_SLOWDOWN,
            "cases": [{**r.to_json(), "slowdown": slowdown(r)} for r in results],
        }
        write_json(args.json, document)
    if args.write_readme:
        write_readme_subsection(README, SUBSECTION, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
