"""The capture fast path (``ReplicaTransaction``): while every capture of a transaction is an
upsert of one table with one TEXT key, only the key texts are kept; any other capture moves
them to the general lists. The result must be the same as the general path's: each row's
entry is its last capture, with its index in the transaction; errors are raised where the
contract says (at the capture, or at the commit, which rolls back). ``tx.upsert`` decides
with a compiled per-table check whether a row needs ``RETURNING``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.sqlite import (
    MAX_CHANGES_PER_VERSION,
    InvalidMutationError,
    MissingRowError,
    Replica,
    ReplicaClosedError,
    TableSchema,
    TransactionTooLargeError,
)
from chrysalis.sqlite._sql import stable_row_types
from chrysalis.sqlite._transaction import _row_writer

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
ROWIDS = TableSchema(
    "rowids",
    "CREATE TABLE IF NOT EXISTS rowids (id INTEGER PRIMARY KEY, v TEXT)",
    ["id", "v"],
    ["id"],
)
SITE = bytes(range(16))
SCHEMAS = {"notes": NOTES, "tags": TAGS, "rowids": ROWIDS}


def _replica() -> Replica:
    return Replica(":memory:", [NOTES, TAGS, ROWIDS], site_id=SITE)


def _clock(replica: Replica, *, fold: bool = True) -> dict[tuple[str, tuple[Any, ...]], Any]:
    """Every clock entry: ``(table, key) -> (version, seq, deleted)`` (pending versions
    folded first unless ``fold`` is false)."""
    if fold:
        replica._fold_all()
    entries = {}
    for table, schema in SCHEMAS.items():
        width = len(schema.primary_key)
        keys = ", ".join(f"_k{i}" for i in range(width))
        for row in replica.connection.execute(
            f"SELECT {keys}, _version, _seq, _deleted FROM __chrysalis_clock_v1_{table}"
        ):
            entries[(table, tuple(row[:width]))] = tuple(row[width:])
    return entries


_KEYS = st.sampled_from(["a", "b", "é", "x\x00y", "日本", "c d"])
_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["capture-notes", "upsert-notes", "delete-notes", "capture-list", "upsert-tags"]
        ),
        _KEYS,
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(transactions=st.lists(_OPS, min_size=1, max_size=3))
def test_entries_match_a_model_whatever_mix_ends_the_fast_path(
    transactions: list[list[tuple[str, str, int]]],
) -> None:
    """Captures through ``execute`` + ``capture_upsert`` (tuple and list keys, ASCII,
    non-ASCII and NUL texts), ``upsert``, deletes and another table, in any order: each row
    ends with its last capture's entry and the table holds the model's rows."""
    replica = _replica()
    model_rows: dict[tuple[str, tuple[Any, ...]], tuple[Any, ...] | None] = {}
    model_clock: dict[tuple[str, tuple[Any, ...]], tuple[int, int, int]] = {}
    for version, ops in enumerate(transactions, start=1):
        with replica.transaction() as tx:
            for seq, (op, k, n) in enumerate(ops):
                row: tuple[Any, ...] | None
                key: tuple[Any, ...]
                if op in ("capture-notes", "capture-list"):
                    table, key, row = "notes", (k,), (k, n)
                    tx.execute("INSERT OR REPLACE INTO notes VALUES (?, ?)", row)
                    tx.capture_upsert("notes", (k,) if op == "capture-notes" else [k])
                elif op == "upsert-notes":
                    table, key, row = "notes", (k,), (k, n)
                    assert tx.upsert("notes", row) == row
                elif op == "delete-notes":
                    table, key, row = "notes", (k,), None
                    tx.delete("notes", key)
                else:
                    table, key, row = "tags", (n, len(k)), (n, len(k), k)
                    assert tx.upsert("tags", row) == row
                model_rows[(table, key)] = row
                model_clock[(table, key)] = (version, seq, int(row is None))
            assert tx.pending_mutations == len(ops)
        assert tx.version == version
    assert _clock(replica) == model_clock
    for (table, key), row in model_rows.items():
        stored = replica.connection.execute(SCHEMAS[table].select_row_sql, key).fetchone()
        assert stored == row, (table, key)


def test_a_closed_transaction_refuses_fast_captures_and_upserts() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        tx.upsert("notes", ("a", 1))
        tx.capture_upsert("notes", ("a",))
    for call in (
        lambda: tx.capture_upsert("notes", ("b",)),
        lambda: tx.upsert("notes", ("b", 2)),
    ):
        with pytest.raises(ReplicaClosedError):
            call()


def test_the_fast_path_is_bounded_at_the_capture() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        for i in range(MAX_CHANGES_PER_VERSION):
            tx.capture_upsert("notes", (f"n{i}",))
        assert tx.pending_mutations == MAX_CHANGES_PER_VERSION
        with pytest.raises(TransactionTooLargeError):
            tx.capture_upsert("notes", ("over",))
        with pytest.raises(TransactionTooLargeError):
            tx.upsert("notes", ("over", 1))
        tx.rollback()


def test_invalid_keys_are_refused_at_the_capture_in_fast_mode() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        tx.upsert("notes", ("a", 1))  # the fast mode has started
        with pytest.raises(InvalidMutationError):
            tx.capture_upsert("notes", ("a", "b"))
        with pytest.raises(InvalidMutationError):
            tx.capture_upsert("notes", (None,))
        with pytest.raises(InvalidMutationError):
            tx.capture_upsert("notes", ("\ud800",))  # not valid Unicode
        with pytest.raises(InvalidMutationError):
            tx.capture_upsert("notes", "a")  # a text is not a key
        with pytest.raises(InvalidMutationError):
            tx.upsert("notes", ("a", 1, 2))
        assert tx.pending_mutations == 1
    assert _clock(replica) == {("notes", ("a",)): (1, 0, 0)}


def test_a_missing_row_fails_a_fast_commit_and_rolls_everything_back() -> None:
    replica = _replica()
    tx = replica.transaction()
    tx.upsert("notes", ("a", 1))
    tx.upsert("notes", ("b", 2))
    tx.execute("DELETE FROM notes WHERE id = 'a'")
    with pytest.raises(MissingRowError):
        tx.commit()
    assert replica.connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    assert replica.db_version == 0


def test_a_schema_change_sends_the_fast_captures_down_the_general_path() -> None:
    """The commit reads ``PRAGMA schema_version`` with its measure query: after the table
    was replaced by one whose key is not known unique, the fast captures are written the
    general way (their entries at commit, no pending version)."""
    replica = _replica()
    with replica.transaction() as tx:
        tx.upsert("notes", ("a", 1))
    assert _clock(replica, fold=False) == {}  # pending: written by a later fold
    replica.connection.execute("DROP TABLE notes")
    # a key with another collation: not unique under binary comparison
    replica.connection.execute("CREATE TABLE notes (id TEXT PRIMARY KEY COLLATE NOCASE, n)")
    with replica.transaction() as tx:
        tx.upsert("notes", ("b", 2))
    assert tx.version == 2
    entries = _clock(replica, fold=False)
    assert entries[("notes", ("b",))] == (2, 0, 0)  # written at commit


@pytest.mark.parametrize(
    ("row", "stored"),
    [
        ((7, 1), ("7", 1)),  # TEXT affinity turns the integer key into text
        (("k", "3"), ("k", 3)),  # INTEGER affinity turns the text into an integer
        (["k", 3], ("k", 3)),  # a list comes back as a tuple
        (("k", 2.0), ("k", 2)),  # an integral real becomes an integer
    ],
)
def test_upsert_returns_the_row_as_stored(row: Any, stored: tuple[Any, ...]) -> None:
    replica = _replica()
    with replica.transaction() as tx:
        assert tx.upsert("notes", row) == stored
    assert replica.connection.execute("SELECT * FROM notes").fetchall() == [stored]
    assert _clock(replica) == {("notes", (stored[0],)): (1, 0, 0)}


def test_upsert_fills_in_an_integer_primary_key() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        first = tx.upsert("rowids", (None, "a"))
        second = tx.upsert("rowids", (None, "b"))
    assert (first, second) == ((1, "a"), (2, "b"))
    assert _clock(replica) == {("rowids", (1,)): (1, 0, 0), ("rowids", (2,)): (1, 1, 0)}


_AFFINITIES = st.lists(
    st.sampled_from(["TEXT", "INTEGER", "NUMERIC", "REAL", "BLOB"]), min_size=1, max_size=5
)
_VALUES = st.one_of(
    st.none(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=3), st.binary()
)


class _Recorder:
    """What a compiled row writer touches of a transaction, recorded."""

    def __init__(self, fast_table: str) -> None:
        self._fast_table = fast_table
        self._fast: list[str] = []
        self.executed: list[tuple[str, tuple[object, ...]]] = []
        self.captured: list[tuple[str, tuple[object, ...]]] = []

    def execute(self, sql: str, row: tuple[object, ...]) -> None:
        self.executed.append((sql, row))

    def _capture_stored(self, table: str, row: tuple[object, ...]) -> None:
        self.captured.append((table, row))


@settings(max_examples=300, deadline=None)
@given(
    affinities=_AFFINITIES,
    row=st.lists(_VALUES, max_size=6),
    key_index=st.integers(-1, 4),
    fast=st.booleans(),
)
def test_the_compiled_row_writer_follows_the_per_column_rule(
    affinities: list[str], row: list[object], key_index: int, fast: bool
) -> None:
    """The writer writes a row only when every value's type is one its column keeps (and
    the arity is right), and captures its key on the fast path only for a text key of the
    fast table."""
    stable = stable_row_types(tuple(affinities))
    key_index = min(key_index, len(stable) - 1)
    exact = len(row) == len(stable) and all(
        type(v) in types for v, types in zip(row, stable, strict=False)
    )
    tx = _Recorder("t" if fast else "")
    values = tuple(row)
    assert _row_writer(stable, key_index)(tx, values, "SQL", "t") is exact  # type: ignore[arg-type]
    assert tx.executed == ([("SQL", values)] if exact else [])
    on_fast_path = exact and fast and key_index >= 0 and type(values[key_index]) is str
    assert tx._fast == ([values[key_index]] if on_fast_path else [])
    assert tx.captured == ([("t", values)] if exact and not on_fast_path else [])
