"""Capture overhead of ``chrysalis.sqlite``: plain SQLite inserts vs captured inserts.

Usage::

    python benchmarks/sqlite_capture.py [--quick] [--smoke] [--case NAME] [--json OUT]
                                        [--write-readme]

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
with a 43-character message. A trial runs whole transactions until ``seconds`` have passed and
counts the rows; rate = rows / elapsed time. The headline number is the **slowdown**, the ratio
of the median rates (plain median / captured median); the table also shows the min-max of the
per-round slowdowns (the noise). Target: captured at most 1.5x slower. No network is involved;
replication throughput across processes is a separate benchmark.

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
from collections.abc import Sequence
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


FULL: Final = Config(rounds=20, seconds=0.4, budget_s=40.0)
QUICK: Final = Config(rounds=6, seconds=0.25, budget_s=10.0)
SMOKE: Final = Config(rounds=1, seconds=0.03, budget_s=1.0)


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


def _trial(rows: int, seconds: float) -> Trial:
    return Trial(counted=rows, seconds=seconds, received=rows, sent=rows)


def _database(folder: str, case: Case, side: str, counter: list[int]) -> str:
    if not case.on_file:
        return ":memory:"
    counter[0] += 1
    return os.path.join(folder, f"{case.name}-{side}-{counter[0]}.sqlite")


def plain_trial(path: str, case: Case, seconds: float) -> Trial:
    """Plain ``sqlite3`` inserts for ``seconds``; returns the rows and the elapsed time."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(CHALKBOARD.create_sql)
        rows = 0
        per = case.per_transaction
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            conn.execute("BEGIN")
            for _ in range(per):
                conn.execute(INSERT, (f"note-{rows}", "alice", MESSAGE))
                rows += 1
            conn.execute("COMMIT")
            now = time.perf_counter()
            if now >= deadline:
                return _trial(rows, now - start)
    finally:
        conn.close()


def captured_trial(path: str, case: Case, seconds: float) -> Trial:
    """The same inserts through ``Replica.transaction`` with a capture per row (and, for a
    ``+fold`` case, a fold of the clock entries after every transaction)."""
    replica = Replica(path, [CHALKBOARD])
    try:
        rows = 0
        transactions = 0
        per = case.per_transaction
        start = time.perf_counter()
        deadline = start + seconds
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
                pause = time.perf_counter()
                replica._fold_all()
                paused = time.perf_counter() - pause
                start += paused
                deadline += paused
            now = time.perf_counter()
            if now >= deadline:
                return _trial(rows, now - start)
    finally:
        replica.close()


def metadata_only_trial(path: str, case: Case, seconds: float) -> Trial:
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
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            if rows // per >= len(prepared):
                pause = time.perf_counter()
                first = len(prepared)
                prepared += [
                    json.dumps([f"note-{i}" for i in range(t * per, (t + 1) * per)])
                    for t in range(first, first + 50)
                ]
                paused = time.perf_counter() - pause
                start += paused
                deadline += paused
            keys = prepared[rows // per]
            conn.execute("BEGIN")
            for _ in range(per):
                conn.execute(INSERT, (f"note-{rows}", "alice", MESSAGE))
                rows += 1
            conn.execute(_sql.BUMP_CLOCK)
            # the rows found and their size, the new version and what it must be above, the
            # schema version (the entries are written by a later fold)
            version = conn.execute(clock.measure_values, (keys, 1)).fetchone()[2]
            conn.execute(_sql.INSERT_VERSION, (1, version, CHALKBOARD.table, keys))
            conn.execute("COMMIT")
            now = time.perf_counter()
            if now >= deadline:
                return _trial(rows, now - start)
    finally:
        conn.close()


def run_case(case: Case, config: Config, folder: str) -> CaseResult:
    """Alternate plain and captured trials of ``case``; every trial gets a fresh database."""
    counter = [0]

    def baseline() -> Trial:
        return plain_trial(_database(folder, case, "plain", counter), case, config.seconds)

    def candidate() -> Trial:
        path = _database(folder, case, "captured", counter)
        if case.metadata_only:
            return metadata_only_trial(path, case, config.seconds)
        return captured_trial(path, case, config.seconds)

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
        extra={"rows_per_transaction": case.per_transaction, "file": case.on_file},
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
        "each trial on a fresh database; the slowdown is the ratio of the median rates. "
        f"Target: captured at most {TARGET_SLOWDOWN}x slower.",
        "",
        "| case | rows per transaction | plain rows/s (median) | captured rows/s (median) "
        "| slowdown (ratio of medians) | per-round slowdown min-max | met? | rounds |",
        "|---|---:|---:|---:|---:|---:|:---:|---:|",
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
            f"| {_rate(r.baseline_median)} | {_rate(r.candidate_median)} | {s:.2f}x "
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
        }
        results: list[CaseResult] = []
        for case in cases:
            print(f"running {case.name} ...", file=sys.stderr, flush=True)
            results.append(run_case(case, config, folder))
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
