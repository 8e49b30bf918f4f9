"""``tx.upsert``'s one-frame fast path (``_fast_upserter``): once a transaction's captures are
the fast ones of a TEXT-keyed table, ``tx.upsert`` is a function compiled for that table's
column type pattern. It must take exactly the rows the general path would store as given,
hand every other row, table and state to the general path before writing anything, and stop
being used as soon as the fast captures end (another capture, the end of the transaction)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.sqlite import (
    MAX_CHANGES_PER_VERSION,
    InvalidMutationError,
    Replica,
    ReplicaClosedError,
    TableSchema,
    TransactionTooLargeError,
)

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, n INTEGER, body TEXT)",
    ["id", "n", "body"],
    ["id"],
)
TAGS = TableSchema(
    "tags",
    "CREATE TABLE IF NOT EXISTS tags (k INTEGER PRIMARY KEY, label TEXT)",
    ["k", "label"],
    ["k"],
)
SITE = bytes(range(16))


def _replica() -> Replica:
    return Replica(":memory:", [NOTES, TAGS], site_id=SITE)


def _clock(replica: Replica) -> dict[tuple[str, Any], tuple[int, int, int]]:
    """Every clock entry after folding: ``(table, key) -> (version, seq, deleted)``."""
    replica._fold_all()
    entries = {}
    for table in ("notes", "tags"):
        for key, *rest in replica.connection.execute(
            f"SELECT _k0, _version, _seq, _deleted FROM __chrysalis_clock_v1_{table}"
        ):
            entries[(table, key)] = tuple(rest)
    return entries


def _is_compiled(tx: Any) -> bool:
    """Whether ``tx.upsert`` is a compiled fast upserter (not the general bound method)."""
    return getattr(tx.upsert, "__self__", None) is None and tx.upsert.__name__ == "upsert"


# values SQLite stores as given in these columns, and values it converts (7 in a TEXT
# column, "3" and 2.0 in an INTEGER column) or keeps with another type than the fast
# path takes (a BLOB key)
_KEYS = st.sampled_from(["a", "b", "é", "x\x00y", 7, b"a", "c d"])
_NUMBERS = st.sampled_from([0, 1, -(2**63), None, "3", 2.0, 1.5, b"\x01", "x"])
_BODIES = st.sampled_from(["hi", None, 5, b"\x00", ""])
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["upsert", "upsert-list", "upsert-short", "capture", "tags"]),
        _KEYS,
        _NUMBERS,
        _BODIES,
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(transactions=st.lists(_OPS, min_size=1, max_size=3))
def test_fast_upserts_store_and_capture_what_the_general_path_would(
    transactions: list[list[tuple[str, Any, Any, Any]]],
) -> None:
    """Rows of every kind through ``tx.upsert`` (tuples and lists, values SQLite converts,
    BLOB and INTEGER keys on the TEXT key, wrong lengths), mixed with captures and another
    table: each returns the row as stored, and each row ends with its last capture's
    entry."""
    replica = _replica()
    model: dict[tuple[str, Any], tuple[int, int, int]] = {}
    version = 0  # a transaction without captures commits no version
    for ops in transactions:
        version += 1
        captured = 0
        with replica.transaction() as tx:
            for op, k, n, body in ops:
                if op == "upsert-short":
                    with pytest.raises(InvalidMutationError):
                        tx.upsert("notes", (k, n))
                    continue
                if op == "tags":
                    stored = tx.upsert("tags", (n if type(n) is int else 1, body))
                    table = "tags"
                elif op == "capture":
                    tx.execute("INSERT OR REPLACE INTO notes VALUES (?, ?, ?)", (k, n, body))
                    tx.capture_upsert("notes", (k,))
                    stored = tx.connection.execute(
                        "SELECT * FROM notes WHERE id = ?", (k,)
                    ).fetchone()
                    table = "notes"
                else:
                    row = (k, n, body)
                    stored = tx.upsert("notes", row if op == "upsert" else list(row))
                    table = "notes"
                    assert (
                        stored
                        == tx.connection.execute(
                            "SELECT * FROM notes WHERE id = ?", (stored[0],)
                        ).fetchone()
                    )
                model[(table, stored[0])] = (version, captured, 0)
                captured += 1
            assert tx.pending_mutations == captured
        assert tx.version == (version if captured else None)
        if not captured:
            version -= 1
    assert _clock(replica) == model


def test_upsert_is_compiled_in_fast_mode_and_general_again_when_it_ends() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        assert not _is_compiled(tx)
        assert tx.upsert("notes", ("a", 1, "x")) == ("a", 1, "x")
        assert _is_compiled(tx)
        row = ("b", 2, None)
        assert tx.upsert("notes", row) is row  # taken by the fast path: the same tuple
        assert tx.upsert(table="notes", row=("c", 3, "z")) == ("c", 3, "z")
        assert tx.upsert("notes", ("d", "4", "w")) == ("d", 4, "w")  # converted: read back
        assert _is_compiled(tx)  # a row it cannot take does not end the fast mode
        tx.upsert("tags", (1, "t"))  # another table: the captures leave the fast mode
        assert not _is_compiled(tx)
        assert tx.upsert("notes", ("e", 5, "v")) == ("e", 5, "v")
        assert not _is_compiled(tx)
        assert tx.pending_mutations == 6
    with pytest.raises(ReplicaClosedError):
        tx.upsert("notes", ("f", 6, "u"))
    assert _clock(replica) == {
        ("notes", "a"): (1, 0, 0),
        ("notes", "b"): (1, 1, 0),
        ("notes", "c"): (1, 2, 0),
        ("notes", "d"): (1, 3, 0),
        ("tags", 1): (1, 4, 0),
        ("notes", "e"): (1, 5, 0),
    }


def test_a_compiled_upsert_refuses_a_wrong_row_before_writing_it() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        tx.upsert("notes", ("a", 1, "x"))
        assert _is_compiled(tx)
        for bad in (("b", 1), ("b", 1, "x", "y")):
            with pytest.raises(InvalidMutationError):
                tx.upsert("notes", bad)
        assert tx.pending_mutations == 1
        assert tx.connection.execute("SELECT count(*) FROM notes").fetchone() == (1,)


def test_a_compiled_upsert_is_bounded_at_the_capture() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        for i in range(MAX_CHANGES_PER_VERSION):
            tx.upsert("notes", (f"n{i}", i, "x"))
        assert _is_compiled(tx)
        with pytest.raises(TransactionTooLargeError):
            tx.upsert("notes", ("over", 1, "x"))
        tx.rollback()
    assert replica.connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)


def test_a_rolled_back_fast_transaction_leaves_the_next_one_general() -> None:
    replica = _replica()
    tx = replica.transaction()
    tx.upsert("notes", ("a", 1, "x"))
    tx.upsert("notes", ("b", 2, "x"))
    tx.rollback()
    with pytest.raises(ReplicaClosedError):
        tx.upsert("notes", ("c", 3, "x"))
    with replica.transaction() as tx2:
        assert not _is_compiled(tx2)
        tx2.upsert("notes", ("c", 3, "x"))
    assert _clock(replica) == {("notes", "c"): (1, 0, 0)}
