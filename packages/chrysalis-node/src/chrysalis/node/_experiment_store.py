"""Persistent scale experiments in replicated SQLite: the trusted tables (five, plus their
sibling tables) and the store that applies the claim ledger's decisions as transactions
(issue 22).

Why SQLite and why these tables: every scale process keeps a ``chrysalis.sqlite.Replica``
(a file per process, or memory for an admin client) replicated along the node tree by
``chrysalis.sqlite.topology.ReplicationTopology``, so a record written anywhere reaches every
process, and any process can submit, inspect or cancel. The tables are *trusted*
descriptors (``TableSchema``): peers compare their digests and never send SQL. Each
operation of ``chrysalis.node._claims.ExperimentLedger`` runs inside one ``IMMEDIATE``
replica transaction: the ledger is loaded from the tables in that transaction, decides, and
every record it changed is written with ``tx.upsert`` (the write and its capture in the
replica's local mutation log, atomically), so concurrent processes on one file, or a crash
halfway, never leave half a decision.

Package graph: chrysalis-sqlite sits above chrysalis-node, so this module is imported only
by the code that needs persistence (``chrysalis scale --persist``, ``chrysalis admin``),
never by ``chrysalis.node`` itself; without chrysalis-sqlite those commands say so.

Tables (every column NOT NULL; PIDs as 32 lowercase hex digits, times in seconds since the
epoch):

- ``scale_node`` (pk ``pid``): incarnation, rank, parent, level, task, role, carrier,
  address, labels, started_at, state;
- ``scale_experiment`` (pk ``name``): kind, payload, count, warmup, concurrency, timeout,
  submitted_by, submitted_at, cancelled_at;
- ``scale_target`` (pk ``experiment, role, position``): pid (role ``source`` or
  ``destination``);
- ``scale_claim`` (pk ``experiment, source``): incarnation, attempt, state, claimed_at,
  updated_at, error;
- ``scale_result`` (pk ``experiment, source, destination``): status, count, completed,
  seconds, p50_ms, p90_ms, p99_ms, mean_ms, max_ms, mib_per_second, error;
- ``scale_result_baseline`` (pk ``experiment, source, destination``): baselines (JSON);
- ``scale_experiment_option`` (pk ``experiment``): options (JSON: ``{"baselines": bool}``),
  the spec's fields added after ``scale_experiment`` existed (a sibling table, so an older
  database needs no ``ALTER TABLE``; an experiment without a row has the defaults);
- ``scale_claim_lost`` (pk ``experiment, source``): the ``scale_claim`` columns: the
  failure a loss decided for the pair (``LossVerdict``), written only by ``node_lost``,
  never by the pair's source, so a claim or result row the source wrote before it learnt of
  its loss does not replace it when replicas merge (the ledger reads the verdict and
  ignores that pair's results);
- ``scale_node_history`` (pk ``pid``): losses, lost_at, lost_reason, returned_at,
  returned_reason: how often a node was declared lost, its last loss and its last return
  (written with the node row once it was lost; a sibling table like the options; a node
  without a row was never lost);
- ``scale_progress`` (pk ``experiment, source``): done, planned, updated_at: a running
  source's timed operations so far (``publish_progress``, at most one write a second per
  source; informational, outside the ledger: ``submit``'s progress bar reads it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, final

from chrysalis.node._claims import (
    ClaimRecord,
    ClaimState,
    Decision,
    ExperimentLedger,
    ExperimentRecord,
    ExperimentSpec,
    LossVerdict,
    NodeRecord,
    NodeState,
    Record,
    ResultRecord,
    TargetRecord,
)
from chrysalis.sqlite import Replica, SqlValue, TableSchema

__all__ = ["SCHEMAS", "TABLES", "ExperimentStore", "open_replica"]

T = TypeVar("T")


def _schema(table: str, columns: str, key: Sequence[str]) -> TableSchema:
    names = [part.split()[0] for part in columns.split(",")]
    body = ", ".join(f"{part.strip()} NOT NULL" for part in columns.split(","))
    create = f"CREATE TABLE IF NOT EXISTS {table} ({body}, PRIMARY KEY ({', '.join(key)}))"
    return TableSchema(table, create, columns=names, primary_key=list(key))


NODE_TABLE: Final = _schema(
    "scale_node",
    "pid TEXT, incarnation INTEGER, rank INTEGER, parent TEXT, level INTEGER, task INTEGER,"
    " role TEXT, carrier TEXT, address TEXT, labels TEXT, started_at REAL, state TEXT",
    ["pid"],
)
EXPERIMENT_TABLE: Final = _schema(
    "scale_experiment",
    "name TEXT, kind TEXT, payload INTEGER, count INTEGER, warmup INTEGER,"
    " concurrency INTEGER, timeout REAL, submitted_by TEXT, submitted_at REAL,"
    " cancelled_at REAL",
    ["name"],
)
TARGET_TABLE: Final = _schema(
    "scale_target",
    "experiment TEXT, role TEXT, position INTEGER, pid TEXT",
    ["experiment", "role", "position"],
)
CLAIM_TABLE: Final = _schema(
    "scale_claim",
    "experiment TEXT, source TEXT, incarnation INTEGER, attempt INTEGER, state TEXT,"
    " claimed_at REAL, updated_at REAL, error TEXT",
    ["experiment", "source"],
)
RESULT_TABLE: Final = _schema(
    "scale_result",
    "experiment TEXT, source TEXT, destination TEXT, status TEXT, count INTEGER,"
    " completed INTEGER, seconds REAL, p50_ms REAL, p90_ms REAL, p99_ms REAL, mean_ms REAL,"
    " max_ms REAL, mib_per_second REAL, error TEXT",
    ["experiment", "source", "destination"],
)
BASELINE_TABLE: Final = _schema(
    "scale_result_baseline",
    "experiment TEXT, source TEXT, destination TEXT, baselines TEXT",
    ["experiment", "source", "destination"],
)
OPTION_TABLE: Final = _schema(
    "scale_experiment_option",
    "experiment TEXT, options TEXT",
    ["experiment"],
)
LOSS_TABLE: Final = _schema(
    "scale_claim_lost",
    "experiment TEXT, source TEXT, incarnation INTEGER, attempt INTEGER, state TEXT,"
    " claimed_at REAL, updated_at REAL, error TEXT",
    ["experiment", "source"],
)
NODE_HISTORY_TABLE: Final = _schema(
    "scale_node_history",
    "pid TEXT, losses INTEGER, lost_at REAL, lost_reason TEXT, returned_at REAL,"
    " returned_reason TEXT",
    ["pid"],
)
PROGRESS_TABLE: Final = _schema(
    "scale_progress",
    "experiment TEXT, source TEXT, done INTEGER, planned INTEGER, updated_at REAL",
    ["experiment", "source"],
)
SCHEMAS: Final = (
    NODE_TABLE, EXPERIMENT_TABLE, TARGET_TABLE, CLAIM_TABLE, RESULT_TABLE, BASELINE_TABLE,
    OPTION_TABLE, NODE_HISTORY_TABLE, LOSS_TABLE, PROGRESS_TABLE,
)  # fmt: skip
"""The trusted descriptors, in load order."""
TABLES: Final = tuple(schema.table for schema in SCHEMAS)


def open_replica(path: str) -> Replica:
    """A replica at ``path`` (a file, or ``:memory:``) holding the experiment tables."""
    return Replica(path, list(SCHEMAS))


def _rows(record: Record) -> list[tuple[str, tuple[SqlValue, ...]]]:
    if isinstance(record, LossVerdict):  # the claim row, and the verdict that outlasts it
        table, row = _row(record.claim)
        return [(table, row), (LOSS_TABLE.table, row)]
    rows = [_row(record)]
    if isinstance(record, ResultRecord) and record.baselines:
        key = (record.experiment, record.source, record.destination)
        rows.append((BASELINE_TABLE.table, (*key, record.baselines)))
    if isinstance(record, NodeRecord) and (record.losses or record.returned_at):
        r = record
        history = (r.losses, float(r.lost_at), r.lost_reason, float(r.returned_at))
        rows.append((NODE_HISTORY_TABLE.table, (r.pid, *history, r.returned_reason)))
    if isinstance(record, ExperimentRecord):
        options = json.dumps({"baselines": record.spec.baselines})
        rows.append((OPTION_TABLE.table, (record.spec.name, options)))
    return rows


def _row(record: Record) -> tuple[str, tuple[SqlValue, ...]]:
    assert not isinstance(record, LossVerdict)  # two rows: ``_rows``
    if isinstance(record, NodeRecord):
        r = record
        return NODE_TABLE.table, (
            r.pid, r.incarnation, r.rank, r.parent, r.level, r.task, r.role, r.carrier,
            r.address, r.labels, float(r.started_at), r.state.value,
        )  # fmt: skip
    if isinstance(record, ExperimentRecord):
        s = record.spec
        return EXPERIMENT_TABLE.table, (
            s.name, s.kind, s.payload, s.count, s.warmup, s.concurrency, float(s.timeout),
            record.submitted_by, float(record.submitted_at), float(record.cancelled_at),
        )  # fmt: skip
    if isinstance(record, TargetRecord):
        return TARGET_TABLE.table, (record.experiment, record.role, record.position, record.pid)
    if isinstance(record, ClaimRecord):
        c = record
        return CLAIM_TABLE.table, (
            c.experiment, c.source, c.incarnation, c.attempt, c.state.value,
            float(c.claimed_at), float(c.updated_at), c.error,
        )  # fmt: skip
    r2 = record
    return RESULT_TABLE.table, (
        r2.experiment, r2.source, r2.destination, r2.status, r2.count, r2.completed,
        float(r2.seconds), float(r2.p50_ms), float(r2.p90_ms), float(r2.p99_ms),
        float(r2.mean_ms), float(r2.max_ms), float(r2.mib_per_second), r2.error,
    )  # fmt: skip


def _records(execute: Callable[[str], Any]) -> list[Record]:
    found: list[Record] = []
    history = {
        str(row[0]): row[1:]
        for row in execute(
            f"SELECT {', '.join(NODE_HISTORY_TABLE.columns)} FROM {NODE_HISTORY_TABLE.table}"
        )
    }
    for row in execute(f"SELECT {', '.join(NODE_TABLE.columns)} FROM scale_node"):
        values = list(row)
        values[11] = NodeState(values[11])
        found.append(NodeRecord(*values, *history.get(str(row[0]), ())))
    options = {
        str(row[0]): _options(str(row[1]))
        for row in execute(f"SELECT {', '.join(OPTION_TABLE.columns)} FROM {OPTION_TABLE.table}")
    }
    for row in execute(f"SELECT {', '.join(EXPERIMENT_TABLE.columns)} FROM scale_experiment"):
        spec = ExperimentSpec(*row[:7], **options.get(str(row[0]), {}))
        found.append(ExperimentRecord(spec, row[7], row[8], row[9]))
    for row in execute(f"SELECT {', '.join(TARGET_TABLE.columns)} FROM scale_target"):
        found.append(TargetRecord(*row))
    for table in (CLAIM_TABLE, LOSS_TABLE):
        for row in execute(f"SELECT {', '.join(table.columns)} FROM {table.table}"):
            claim = ClaimRecord(row[0], row[1], row[2], row[3], ClaimState(row[4]), *row[5:])
            found.append(claim if table is CLAIM_TABLE else LossVerdict(claim))
    baselines = {
        (row[0], row[1], row[2]): str(row[3])
        for row in execute(
            f"SELECT {', '.join(BASELINE_TABLE.columns)} FROM {BASELINE_TABLE.table}"
        )
    }
    for row in execute(f"SELECT {', '.join(RESULT_TABLE.columns)} FROM scale_result"):
        key = (row[0], row[1], row[2])
        found.append(dataclasses.replace(ResultRecord(*row), baselines=baselines.get(key, "")))
    return found


def _options(text: str) -> dict[str, Any]:
    """The spec fields of an ``scale_experiment_option`` row that this release knows (an
    unreadable row, or unknown keys, leave the defaults)."""
    try:
        decoded = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    return {k: v for k, v in decoded.items() if k == "baselines" and isinstance(v, bool)}


@final
class ExperimentStore:
    """The ledger kept in ``replica``'s tables. ``ledger()`` reads a snapshot;
    ``decide(op)`` runs ``op`` on the ledger inside one ``IMMEDIATE`` replica transaction and
    writes (and captures) every record of the decision it returns. Loads the whole ledger
    per call: fine for the bounded ledger (``MAX_NODES``, ``MAX_EXPERIMENTS``), not tuned."""

    __slots__ = ("_replica",)

    def __init__(self, replica: Replica) -> None:
        missing = [t for t in TABLES if t not in replica.schemas]
        if missing:
            raise ValueError(f"the replica does not declare {', '.join(missing)}")
        self._replica = replica

    @property
    def replica(self) -> Replica:
        return self._replica

    def ledger(self) -> ExperimentLedger:
        """A snapshot of every record."""
        return ExperimentLedger.from_records(_records(self._replica.connection.execute))

    def live_pids(self) -> list[str]:
        """PIDs of the nodes recorded ``live`` (one query, no ledger load)."""
        return self._pids(NodeState.LIVE)

    def lost_pids(self) -> list[str]:
        """PIDs of the nodes recorded ``lost`` (one query, no ledger load)."""
        return self._pids(NodeState.LOST)

    def _pids(self, state: NodeState) -> list[str]:
        rows = self._replica.connection.execute(
            "SELECT pid FROM scale_node WHERE state = ?", (state.value,)
        )
        return [str(pid) for (pid,) in rows]

    def has_open_work(self, pid: str) -> bool:
        """Whether some experiment names ``pid`` as a source whose pair has not ended: one
        indexed query, so an idle node's poll does not load the ledger."""
        row = self._replica.connection.execute(
            "SELECT 1 FROM scale_target AS t WHERE t.role = 'source' AND t.pid = ?"
            " AND NOT EXISTS (SELECT 1 FROM scale_claim AS c WHERE c.experiment = t.experiment"
            " AND c.source = t.pid AND c.state IN ('done', 'failed', 'cancelled'))"
            " AND NOT EXISTS (SELECT 1 FROM scale_claim_lost AS l"
            " WHERE l.experiment = t.experiment AND l.source = t.pid) LIMIT 1",
            (pid,),
        ).fetchone()
        return row is not None

    def publish_progress(
        self, experiment: str, source: str, done: int, planned: int, now: float
    ) -> None:
        """Record that ``source`` completed ``done`` of its ``planned`` timed operations of
        ``experiment`` (replicated like every row; not a ledger decision)."""
        with self._replica.transaction("IMMEDIATE") as tx:
            tx.upsert(PROGRESS_TABLE.table, (experiment, source, done, planned, float(now)))

    def progress(self, experiment: str) -> dict[str, tuple[int, int]]:
        """``source -> (done, planned)`` as last published for ``experiment``."""
        rows = self._replica.connection.execute(
            "SELECT source, done, planned FROM scale_progress WHERE experiment = ?",
            (experiment,),
        )
        return {str(source): (int(done), int(planned)) for source, done, planned in rows}

    def decide(self, op: Callable[[ExperimentLedger], tuple[T, Decision]]) -> T:
        """Run ``op(ledger)`` and store its decision atomically; returns ``op``'s value. An
        exception from ``op`` rolls back and writes nothing."""
        with self._replica.transaction("IMMEDIATE") as tx:
            ledger = ExperimentLedger.from_records(_records(tx.execute))
            value, decision = op(ledger)
            for record in decision.records:
                for table, row in _rows(record):
                    tx.upsert(table, row)
        return value

    def apply(self, op: Callable[[ExperimentLedger], Decision]) -> Decision:
        """``decide`` for an operation that returns only its decision."""
        return self.decide(lambda ledger: (decision := op(ledger), decision))
