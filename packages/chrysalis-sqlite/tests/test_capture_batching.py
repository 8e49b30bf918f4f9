"""The batched local commit of the clock layout: one clock entry per captured row, stamped
with the row's last capture in the transaction, written by the JSON statements (TEXT and
INTEGER keys) or the per-row ones (BLOB keys, values the key's affinity converts), with the
same result; the version's rows are listed once per table; a clock that is behind its
entries is refused as corrupt metadata and rolls the whole transaction back."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.sqlite import (
    MAX_CHANGES_PER_VERSION,
    CorruptMetadataError,
    InvalidSchemaError,
    MissingRowError,
    Replica,
    TableSchema,
    TransactionTooLargeError,
)
from chrysalis.sqlite._transaction import _json_array
from chrysalis.sqlite._values import read_values

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
BLOBS = TableSchema(
    "blobs",
    "CREATE TABLE IF NOT EXISTS blobs (b BLOB PRIMARY KEY, v TEXT)",
    ["b", "v"],
    ["b"],
)
SITE = bytes(range(16))
SCHEMAS = {"notes": NOTES, "tags": TAGS, "blobs": BLOBS}


def _replica() -> Replica:
    return Replica(":memory:", [NOTES, TAGS, BLOBS], site_id=SITE)


def _clock(replica: Replica) -> dict[tuple[str, tuple[Any, ...]], tuple[Any, ...]]:
    """Every clock entry: ``(table, key) -> (version, origin site, seq, deleted)``, pending
    local versions folded first."""
    replica._fold_all()
    entries = {}
    for table, schema in SCHEMAS.items():
        keys = ", ".join(f"c._k{i}" for i in range(len(schema.primary_key)))
        for row in replica.connection.execute(
            f"SELECT {keys}, c._version, o.site_id, c._seq, c._deleted "
            f"FROM __chrysalis_clock_v1_{table} AS c "
            "JOIN __chrysalis_origins_v1 AS o ON o.position = c._origin"
        ):
            width = len(schema.primary_key)
            entries[(table, tuple(row[:width]))] = tuple(row[width:])
    return entries


def _version_rows(replica: Replica, version: int) -> dict[str, set[tuple[Any, ...]]]:
    """The keys ``__chrysalis_versions_v1`` lists for ``version``, per table."""
    listed: dict[str, set[tuple[Any, ...]]] = {}
    for table, keys in replica.connection.execute(
        "SELECT table_name, keys FROM __chrysalis_versions_v1 WHERE db_version = ?", (version,)
    ):
        found = listed.setdefault(table, set())
        if isinstance(keys, str):
            for key in json.loads(keys):
                if key is not None:
                    found.add(tuple(key) if isinstance(key, list) else (key,))
        else:
            offset = 0
            while offset < len(keys):
                values, offset = read_values(keys, offset)
                found.add(values)
    return listed


@pytest.mark.parametrize("count", [1, 2, 31, 100, MAX_CHANGES_PER_VERSION])
def test_every_captured_row_gets_one_entry_in_capture_order(count: int) -> None:
    replica = _replica()
    with replica.transaction() as tx:
        for i in range(count):
            tx.upsert("notes", (f"n{i}", i))
    assert tx.version == 1
    clock = _clock(replica)
    assert clock == {("notes", (f"n{i}",)): (1, SITE, i, 0) for i in range(count)}
    assert _version_rows(replica, 1) == {"notes": {(f"n{i}",) for i in range(count)}}


_OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "upsert-notes",
                "delete-notes",
                "upsert-tags",
                "delete-tags",
                "upsert-blobs",
                "delete-blobs",
                "capture-notes-by-int",
            ]
        ),
        st.integers(0, 5),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(first=_OPS, second=_OPS)
def test_entries_match_a_model_of_two_transactions(
    first: list[tuple[str, int, int]], second: list[tuple[str, int, int]]
) -> None:
    """Random upserts and deletes (repeating keys, three tables, BLOB keys, TEXT keys
    captured as integers) in two transactions: each row's entry is its last capture, the
    version lists exactly its rows, and the tables hold the model's rows."""
    replica = _replica()
    model_rows: dict[tuple[str, tuple[Any, ...]], tuple[Any, ...] | None] = {}
    model_clock: dict[tuple[str, tuple[Any, ...]], tuple[Any, ...]] = {}
    for version, ops in ((1, first), (2, second)):
        written: dict[str, set[tuple[Any, ...]]] = {}
        with replica.transaction() as tx:
            for seq, (op, k, n) in enumerate(ops):
                row: tuple[Any, ...] | None
                table = op.split("-")[1]
                if op == "upsert-notes":
                    key: tuple[Any, ...] = (f"{k}",)
                    row = (f"{k}", n)
                    tx.upsert("notes", row)
                elif op == "capture-notes-by-int":  # TEXT affinity stores the key as text
                    key, row = (f"{k}",), (f"{k}", n)
                    tx.execute("INSERT OR REPLACE INTO notes VALUES (?, ?)", (k, n))
                    tx.capture_upsert("notes", (k,))
                elif op == "delete-notes":
                    key, row = (f"{k}",), None
                    tx.delete("notes", key)
                elif op == "upsert-tags":
                    key, row = (k, n), (k, n, f"t{n}")
                    tx.upsert("tags", row)
                elif op == "delete-tags":
                    key, row = (k, n), None
                    tx.delete("tags", key)
                elif op == "upsert-blobs":
                    key, row = (bytes([k]),), (bytes([k]), f"v{n}")
                    tx.upsert("blobs", row)
                else:
                    key, row = (bytes([k]),), None
                    tx.delete("blobs", key)
                model_rows[(table, key)] = row
                model_clock[(table, key)] = (version, SITE, seq, int(row is None))
                written.setdefault(table, set()).add(key)
        assert tx.version == version
        assert _version_rows(replica, version) == written
    assert _clock(replica) == model_clock
    for (table, key), row in model_rows.items():
        stored = replica.connection.execute(SCHEMAS[table].select_row_sql, key).fetchone()
        assert stored == row, (table, key)


def test_a_clock_behind_its_entries_is_corrupt_metadata_and_rolls_back() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        tx.upsert("notes", ("n1", 1))
    # damage the metadata: the clock forgets version 1, so the next commit would reuse it
    replica.connection.execute("UPDATE __chrysalis_replica_v1 SET db_version = 0")
    tx = replica.transaction()
    tx.upsert("notes", ("n1", 2))
    with pytest.raises(CorruptMetadataError, match="clock is behind"):
        tx.commit()
    assert not tx.is_open
    assert not replica.in_transaction
    rows = replica.connection.execute("SELECT id, n FROM notes ORDER BY id").fetchall()
    assert rows == [("n1", 1)]
    assert _clock(replica) == {("notes", ("n1",)): (1, SITE, 0, 0)}
    assert replica.db_version == 0  # the failed commit's clock bump was rolled back too


def test_rows_above_their_share_of_the_byte_bound_commit_when_the_version_fits() -> None:
    # The commit's one statement writes the entries of rows within an equal share of the byte
    # bound (4 MiB / 100 here); a 3 MiB row is above it, so the commit measures every row and
    # writes the rest: the version fits, nothing is lost.
    replica = _replica()
    big = "x" * (3 * 1024 * 1024)
    with replica.transaction() as tx:
        for i in range(100):
            tx.execute("INSERT INTO notes VALUES (?, ?)", (f"n{i:03}", big if i == 57 else i))
            tx.capture_upsert("notes", (f"n{i:03}",))
    assert tx.version == 1
    assert _clock(replica) == {("notes", (f"n{i:03}",)): (1, SITE, i, 0) for i in range(100)}
    assert _version_rows(replica, 1) == {"notes": {(f"n{i:03}",) for i in range(100)}}


def test_a_share_estimate_over_the_bound_is_measured_before_refusing() -> None:
    # An upsert's share (a third of 4 MiB: three captures) plus a delete whose key takes 3 MiB
    # exceeds the bound; the upsert's real size (a few bytes) does not, so the commit succeeds.
    replica = _replica()
    long_key = "k" * (3 * 1024 * 1024)
    with replica.transaction() as tx:
        tx.upsert("notes", ("small", 1))
        tx.capture_delete("tags", (1, 2))
        tx.capture_delete("notes", (long_key,))
    assert tx.version == 1
    clock = _clock(replica)
    assert clock[("notes", ("small",))] == (1, SITE, 0, 0)
    assert clock[("notes", (long_key,))] == (1, SITE, 2, 1)
    # over the bound for real: refused, and everything rolls back
    tx = replica.transaction()
    tx.execute("INSERT INTO notes VALUES ('large', ?)", ("x" * (2 * 1024 * 1024),))
    tx.capture_upsert("notes", ("large",))
    tx.capture_delete("notes", (long_key,))
    with pytest.raises(TransactionTooLargeError):
        tx.commit()
    assert replica.db_version == 1
    assert replica.connection.execute("SELECT count(*) FROM notes").fetchone() == (1,)


def test_a_missing_row_fails_the_commit_in_a_large_transaction() -> None:
    replica = _replica()
    tx = replica.transaction()
    for i in range(100):
        if i != 40:
            tx.execute("INSERT INTO notes VALUES (?, ?)", (f"n{i}", i))
        tx.capture_upsert("notes", (f"n{i}",))
    with pytest.raises(MissingRowError, match="n40"):
        tx.commit()
    assert replica.db_version == 0
    assert replica.connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)
    assert _clock(replica) == {}


def test_the_stored_key_is_recorded_for_a_key_the_affinity_converts() -> None:
    replica = _replica()
    with replica.transaction() as tx:
        tx.execute("INSERT INTO notes VALUES (7, 1)")  # TEXT affinity: stored as '7'
        tx.capture_upsert("notes", (7,))
    assert _clock(replica) == {("notes", ("7",)): (1, SITE, 0, 0)}


@pytest.mark.parametrize(
    "create_sql",
    [
        "CREATE TABLE IF NOT EXISTS ci (id TEXT PRIMARY KEY COLLATE NOCASE, v TEXT)",
        "CREATE TABLE IF NOT EXISTS ci (id TEXT COLLATE RTRIM, v TEXT, UNIQUE (id))",
        "CREATE TABLE IF NOT EXISTS ci (id TEXT, v TEXT, PRIMARY KEY (id COLLATE NOCASE))",
        # the index compares as BINARY, but ``id = ?`` uses the column's NOCASE
        "CREATE TABLE IF NOT EXISTS ci "
        "(id TEXT COLLATE NOCASE, v TEXT, UNIQUE (id COLLATE BINARY))",
    ],
)
def test_a_key_with_a_collation_other_than_binary_is_refused(create_sql: str) -> None:
    schema = TableSchema("ci", create_sql, ["id", "v"], ["id"])
    with pytest.raises(InvalidSchemaError, match="must compare as BINARY"):
        Replica(":memory:", [schema])


def test_a_table_replaced_after_open_is_checked_again_at_commit() -> None:
    schema = TableSchema(
        "ci", "CREATE TABLE IF NOT EXISTS ci (id TEXT PRIMARY KEY, v TEXT)", ["id", "v"], ["id"]
    )
    replica = Replica(":memory:", [schema])
    assert replica._unique_keys() == {"ci"}
    replica.connection.execute("DROP TABLE ci")
    replica.connection.execute("CREATE TABLE ci (id TEXT PRIMARY KEY COLLATE NOCASE, v TEXT)")
    assert replica._unique_keys() == frozenset()  # the commit counts rows the slow way
    replica.connection.execute("DROP TABLE ci")
    replica.connection.execute(schema.create_sql)
    assert replica._unique_keys() == {"ci"}


@given(
    st.lists(
        st.one_of(
            # without NUL: SQLite's JSON functions end a text there (such keys bypass JSON)
            st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=8),
            st.integers(-5, 5),
        ),
        max_size=6,
    )
)
@settings(max_examples=200, deadline=None)
def test_the_keys_json_reads_back_as_the_keys(values: list[str | int]) -> None:
    text = _json_array(values)  # type: ignore[arg-type]
    assert json.loads(text) == values
    conn = sqlite3.connect(":memory:")
    try:
        read = [v for (v,) in conn.execute("SELECT value FROM json_each(?) ORDER BY key", (text,))]
    finally:
        conn.close()
    assert read == values


@given(st.lists(st.text(st.sampled_from('a"\\\x00\x01\x1f\x7f~ '), max_size=4), max_size=6))
@settings(max_examples=200, deadline=None)
def test_the_keys_json_escapes_every_ascii_text_that_needs_it(values: list[str]) -> None:
    # the quick JSON of ASCII texts decides with one ``translate``: quotes, backslashes and
    # unprintable characters (NUL included) must all reach ``json.dumps``
    text = _json_array(values)  # type: ignore[arg-type]
    assert json.loads(text) == values
    quick = '["' + '","'.join(values) + '"]' if values else None
    if text == quick:
        assert all(v.isprintable() and '"' not in v and "\\" not in v for v in values)


@pytest.mark.parametrize("with_delete", [False, True])
def test_a_key_with_a_nul_is_found_at_commit_on_the_general_path(with_delete: bool) -> None:
    # the captures' fast path leaves the NUL search to the commit: with several tables (or a
    # delete) the keys take the general path, which must not list them as JSON either
    replica = _replica()
    with replica.transaction() as tx:
        tx.upsert("notes", ("gone", 0))
    with replica.transaction() as tx:
        tx.execute("INSERT INTO notes VALUES (?, ?)", ("a\0b", 1))
        tx.capture_upsert("notes", ("a\0b",))
        tx.upsert("tags", (1, 2, "x"))
        if with_delete:
            tx.delete("notes", ("gone",))
    clock = _clock(replica)
    assert clock[("notes", ("a\0b",))] == (2, SITE, 0, 0)
    assert clock[("tags", (1, 2))] == (2, SITE, 1, 0)
    notes = {("a\0b",), ("gone",)} if with_delete else {("a\0b",)}
    assert _version_rows(replica, 2) == {"notes": notes, "tags": {(1, 2)}}


@pytest.mark.parametrize("use_upsert", [False, True])
def test_a_key_with_a_nul_keeps_every_character(use_upsert: bool) -> None:
    replica = _replica()
    keys = ["a\0b", "a", "c\0"]
    with replica.transaction() as tx:
        for i, key in enumerate(keys):
            if use_upsert:
                tx.upsert("notes", (key, i))
            else:
                tx.execute("INSERT INTO notes VALUES (?, ?)", (key, i))
                tx.capture_upsert("notes", (key,))
    assert _clock(replica) == {("notes", (key,)): (1, SITE, i, 0) for i, key in enumerate(keys)}
    assert _version_rows(replica, 1) == {"notes": {(key,) for key in keys}}
