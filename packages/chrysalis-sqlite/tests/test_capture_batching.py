"""The batched local commit: one change-log row and one winner per captured mutation, numbered
in capture order, whatever the chunking of the multi-row statements; a clock that is behind the
log is refused as corrupt metadata and rolls the whole transaction back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.sqlite import (
    MAX_CHANGES_PER_VERSION,
    CorruptMetadataError,
    Replica,
    TableSchema,
    decode_values,
)

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, n INTEGER)",
    ["id", "n"],
    ["id"],
)
TAGS = TableSchema(
    "tags",
    "CREATE TABLE IF NOT EXISTS tags (k INTEGER, j INTEGER, label TEXT, PRIMARY KEY (k, j))",
    ["k", "j", "label"],
    ["k", "j"],
)
SITE = bytes(range(16))


def _replica() -> Replica:
    return Replica(":memory:", [NOTES, TAGS], site_id=SITE)


def _log(replica: Replica, version: int) -> list[tuple[Any, ...]]:
    rows = replica.connection.execute(
        "SELECT seq, table_name, key_values, row_values FROM __chrysalis_changes_v1 "
        "WHERE site_id = ? AND db_version = ? ORDER BY seq",
        (SITE, version),
    ).fetchall()
    return [
        (seq, table, decode_values(key), None if row is None else decode_values(row))
        for seq, table, key, row in rows
    ]


def _winners(replica: Replica) -> dict[tuple[str, tuple[Any, ...]], tuple[Any, ...]]:
    rows = replica.connection.execute(
        "SELECT table_name, key_values, db_version, site_id, seq, deleted "
        "FROM __chrysalis_resolved_rows_v2"
    ).fetchall()
    return {(t, decode_values(k)): (v, s, q, d) for t, k, v, s, q, d in rows}


@pytest.mark.parametrize("count", [1, 2, 31, 32, 33, 63, 100, MAX_CHANGES_PER_VERSION])
def test_every_chunking_logs_each_mutation_once_in_capture_order(count: int) -> None:
    replica = _replica()
    with replica.transaction() as tx:
        for i in range(count):
            tx.upsert("notes", (f"n{i}", i))
    assert tx.version == 1
    log = _log(replica, 1)
    assert log == [(i, "notes", (f"n{i}",), (f"n{i}", i)) for i in range(count)]
    winners = _winners(replica)
    assert winners == {("notes", (f"n{i}",)): (1, SITE, i, 0) for i in range(count)}


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["upsert-notes", "delete-notes", "upsert-tags", "delete-tags"]),
        st.integers(0, 5),
        st.integers(-3, 3),
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=100, deadline=None)
@given(first=_OPS, second=_OPS)
def test_log_and_winners_match_a_model_of_two_transactions(
    first: list[tuple[str, int, int]], second: list[tuple[str, int, int]]
) -> None:
    """Random upserts and deletes (repeating keys, two tables) in two transactions: the log
    holds exactly the captured mutations in order, and each key's winner is its last one."""
    replica = _replica()
    model_rows: dict[tuple[str, tuple[Any, ...]], tuple[Any, ...] | None] = {}
    model_winners: dict[tuple[str, tuple[Any, ...]], tuple[Any, ...]] = {}
    for version, ops in ((1, first), (2, second)):
        expected_log = []
        with replica.transaction() as tx:
            for seq, (op, k, n) in enumerate(ops):
                row: tuple[Any, ...] | None
                if op == "upsert-notes":
                    key: tuple[Any, ...] = (f"n{k}",)
                    row = (f"n{k}", n)
                    tx.upsert("notes", row)
                elif op == "delete-notes":
                    key, row = (f"n{k}",), None
                    tx.delete("notes", key)
                elif op == "upsert-tags":
                    key, row = (k, n), (k, n, f"t{n}")
                    tx.upsert("tags", (k, n, f"t{n}"))
                else:
                    key, row = (k, n), None
                    tx.delete("tags", key)
                table = op.split("-")[1]
                expected_log.append((seq, table, key, row))
                model_rows[(table, key)] = row
                model_winners[(table, key)] = (version, SITE, seq, int(row is None))
        assert tx.version == version
        assert _log(replica, version) == expected_log
    assert _winners(replica) == model_winners
    for (table, key), row in model_rows.items():
        schema = NOTES if table == "notes" else TAGS
        stored = replica.connection.execute(schema.select_row_sql, key).fetchone()
        assert stored == row, (table, key)


def test_a_clock_behind_the_log_is_corrupt_metadata_and_rolls_back() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        tx.upsert("notes", ("n1", 1))
    # damage the metadata: the clock forgets version 1, so the next commit would reuse it
    replica.connection.execute("UPDATE __chrysalis_replica_v1 SET db_version = 0")
    tx = replica.transaction()
    tx.upsert("notes", ("n2", 2))
    with pytest.raises(CorruptMetadataError, match="already in the change log"):
        tx.commit()
    assert not tx.is_open
    assert not replica.in_transaction
    rows = replica.connection.execute("SELECT id, n FROM notes ORDER BY id").fetchall()
    assert rows == [("n1", 1)]
    assert _log(replica, 1) == [(0, "notes", ("n1",), ("n1", 1))]
    assert replica.db_version == 0  # the failed commit's clock bump was rolled back too
