"""The replica's storage: atomic capture, last-writer-wins application, clock, origins,
frontiers and the apply lock."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import Pid
from chrysalis.sqlite import (
    MAX_CHANGES_PER_VERSION,
    BatchChunk,
    Change,
    CorruptMetadataError,
    EligibilityMode,
    FrameDecoder,
    FrontierEntry,
    InvalidBatchError,
    InvalidMutationError,
    MissingRowError,
    MissingSchemaError,
    NonUniqueKeyError,
    Replica,
    ReplicaBusyError,
    ReplicaClosedError,
    SqlValue,
    TableSchema,
    TransactionTooLargeError,
    encode_message,
    encode_values,
)

sys.path.insert(0, str(Path(__file__).parent))  # the shared batch helper, by name
from sqlite_batches import decode_changes

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, author TEXT, body TEXT)",
    ["id", "author", "body"],
    ["id"],
)
LOW, HIGH, OTHER = bytes([1]) * 16, bytes([9]) * 16, bytes([5]) * 16


def _replica(path: str | Path = ":memory:", site: bytes = OTHER) -> Replica:
    return Replica(path, [NOTES], site_id=site)


def _rows(replica: Replica) -> list[tuple[object, ...]]:
    return replica.connection.execute("SELECT id, author, body FROM notes ORDER BY id").fetchall()


def _log(replica: Replica, table: str = "notes") -> list[tuple[Any, ...]]:
    """The clock entries of ``table``: ``(origin site, version, seq, key, deleted)`` in
    origin-tuple order (single-column keys), pending local versions folded first."""
    replica._fold_all()
    return replica.connection.execute(
        "SELECT o.site_id, c._version, c._seq, c._k0, c._deleted "
        f"FROM __chrysalis_clock_v1_{table} AS c "
        "JOIN __chrysalis_origins_v1 AS o ON o.position = c._origin ORDER BY 1, 2, 3"
    ).fetchall()


def _write(replica: Replica, note: str, author: str, body: str) -> int | None:
    with replica.transaction() as tx:
        tx.execute(
            "INSERT INTO notes VALUES (?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "author = excluded.author, body = excluded.body",
            (note, author, body),
        )
        tx.capture_upsert("notes", (note,))
    return tx.version


def _busy(replica: Replica) -> bool:
    return replica.in_transaction  # a call, so type checkers do not narrow it between asserts


def _upsert(note: str, body: str, version: int, site: bytes, seq: int = 0) -> Change:
    return Change("notes", (note,), (note, "remote", body), version, site, seq)


def _delete(note: str, version: int, site: bytes, seq: int = 0) -> Change:
    return Change("notes", (note,), None, version, site, seq)


def test_metadata_tables_are_created_on_open() -> None:
    with _replica() as replica:
        names = {
            name
            for (name,) in replica.connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            )
        }
        assert {
            "__chrysalis_replica_v1",
            "__chrysalis_clock_v1_notes",
            "__chrysalis_versions_v1",
            "__chrysalis_folded_v1",
            "__chrysalis_origins_v1",
            "__chrysalis_peer_state_v1",
            "__chrysalis_frontiers_v5",
            "notes",
        } <= names
        assert not names & {"__chrysalis_changes_v1", "__chrysalis_resolved_rows_v2"}
        assert replica.site_id == OTHER
        assert replica.db_version == 0
        assert replica.origins() == (OTHER,)


def test_random_site_id_is_sixteen_bytes_and_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    with Replica(path, [NOTES]) as first:
        site = first.site_id
        assert len(site) == 16
        _write(first, "n1", "alice", "hello")
    with Replica(path, [NOTES]) as again:
        assert again.site_id == site
        assert again.db_version == 1
        assert _rows(again) == [("n1", "alice", "hello")]
    with pytest.raises(ValueError, match="already has site id"):
        Replica(path, [NOTES], site_id=HIGH)


def test_captures_application_write_and_log_atomically() -> None:
    with _replica() as replica:
        assert _write(replica, "n1", "alice", "hello") == 1
        assert _rows(replica) == [("n1", "alice", "hello")]
        assert _log(replica) == [(OTHER, 1, 0, "n1", 0)]
        assert replica.db_version == 1
        versions = replica.connection.execute(
            "SELECT o.site_id, v.db_version, v.table_name, v.keys FROM __chrysalis_versions_v1 "
            "AS v JOIN __chrysalis_origins_v1 AS o ON o.position = v.origin"
        ).fetchall()
        assert versions == [(OTHER, 1, "notes", '["n1"]')]


def test_rollback_discards_the_write_and_its_capture() -> None:
    with _replica() as replica:

        def failing_write() -> None:
            with replica.transaction() as tx:
                tx.execute("INSERT INTO notes VALUES ('n1', 'a', 'b')")
                tx.capture_upsert("notes", ("n1",))
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            failing_write()
        assert _rows(replica) == []
        assert _log(replica) == []
        assert replica.db_version == 0
        assert not replica.in_transaction


def test_commit_without_captures_does_not_advance_the_clock() -> None:
    with _replica() as replica:
        with replica.transaction() as tx:
            tx.execute("INSERT INTO notes VALUES ('local-only', 'a', 'b')")
        assert tx.version is None
        assert replica.db_version == 0
        assert _log(replica) == []
        assert _rows(replica) == [("local-only", "a", "b")]


def test_one_transaction_numbers_its_mutations_in_capture_order() -> None:
    with _replica() as replica:
        with replica.transaction("IMMEDIATE") as tx:
            tx.execute("INSERT INTO notes VALUES ('a', 'x', '1'), ('b', 'x', '2')")
            tx.capture_upsert("notes", ("a",))
            tx.capture_upsert("notes", ("b",))
            tx.execute("DELETE FROM notes WHERE id = 'a'")
            tx.capture_delete("notes", ("a",))
            assert tx.pending_mutations == 3
        # one entry per row: the last capture of "a" (a delete, seq 2) stands for it
        assert _log(replica) == [(OTHER, 1, 1, "b", 0), (OTHER, 1, 2, "a", 1)]


def test_captured_key_comes_from_the_stored_row() -> None:
    with _replica() as replica:
        with replica.transaction() as tx:
            tx.execute("INSERT INTO notes VALUES (7, 'a', 'b')")  # TEXT affinity stores '7'
            tx.capture_upsert("notes", (7,))
        assert _log(replica) == [(OTHER, 1, 0, "7", 0)]


def test_capture_rejects_bad_keys_missing_rows_and_unknown_tables() -> None:
    with _replica() as replica:
        # a captured upsert whose row is missing at commit fails the commit, which rolls back
        tx = replica.transaction()
        tx.execute("INSERT INTO notes VALUES ('here', 'a', 'b')")
        tx.capture_upsert("notes", ("here",))
        tx.capture_upsert("notes", ("absent",))
        with pytest.raises(MissingRowError, match="absent"):
            tx.commit()
        assert not tx.is_open
        assert not replica.in_transaction
        assert _rows(replica) == []
        assert _log(replica) == []
        assert replica.db_version == 0
        # ... unless a later delete capture of the key replaced it
        with replica.transaction() as tx:
            tx.execute("INSERT INTO notes VALUES ('gone', 'a', 'b')")
            tx.capture_upsert("notes", ("gone",))
            tx.delete("notes", ("gone",))
        assert _log(replica) == [(OTHER, 1, 1, "gone", 1)]
    with _replica() as replica, replica.transaction() as tx:
        with pytest.raises(InvalidMutationError, match="key columns"):
            tx.capture_upsert("notes", ("a", "b"))
        with pytest.raises(InvalidMutationError, match="NULL"):
            tx.capture_delete("notes", (None,))
        with pytest.raises(InvalidMutationError, match="sequence"):
            tx.capture_delete("notes", "abc")
        with pytest.raises(MissingSchemaError):
            tx.capture_delete("other", ("a",))
        with pytest.raises(InvalidMutationError, match="cannot be replicated"):
            tx.capture_delete("notes", ([1],))
        assert tx.pending_mutations == 0


def test_commit_detects_a_key_that_is_not_unique() -> None:
    schema = TableSchema(
        "loose",
        "CREATE TABLE IF NOT EXISTS loose (id TEXT, v TEXT, UNIQUE (id))",
        ["id", "v"],
        ["id"],
    )
    with Replica(":memory:", [schema]) as replica:
        # the application replaces the table after open, losing the uniqueness it declared
        replica.connection.execute("DROP TABLE loose")
        replica.connection.execute("CREATE TABLE loose (id TEXT, v TEXT)")
        tx = replica.transaction()
        tx.execute("INSERT INTO loose VALUES ('k', '1'), ('k', '2')")
        tx.capture_upsert("loose", ("k",))
        with pytest.raises(NonUniqueKeyError):
            tx.commit()
        assert replica.connection.execute("SELECT COUNT(*) FROM loose").fetchone() == (0,)


def test_transactions_hold_the_apply_lock() -> None:
    with _replica() as replica:
        tx = replica.transaction()
        assert _busy(replica)
        with pytest.raises(ReplicaBusyError):
            replica.transaction()
        with pytest.raises(ReplicaBusyError):
            replica.apply_changes([_upsert("n", "x", 1, HIGH)])
        tx.rollback()
        tx.rollback()  # idempotent
        assert not _busy(replica)
        with pytest.raises(ReplicaClosedError):
            tx.execute("SELECT 1")
        replica.connection.execute("BEGIN")  # a transaction begun behind the replica's back
        with pytest.raises(ReplicaBusyError):
            replica.transaction()
        replica.connection.execute("ROLLBACK")
        assert _write(replica, "n", "a", "b") == 1
        with pytest.raises(ValueError, match="behavior"):
            replica.transaction("SOMETIMES")  # type: ignore[arg-type]


def test_transactions_are_bounded() -> None:
    with _replica() as replica:
        with replica.transaction() as tx:
            for i in range(MAX_CHANGES_PER_VERSION):
                tx.capture_delete("notes", (f"k{i}",))
            with pytest.raises(TransactionTooLargeError):
                tx.capture_delete("notes", ("one-more",))
            tx.rollback()
        big = "x" * (3 * 1024 * 1024)
        with replica.transaction() as tx:
            tx.execute("INSERT INTO notes VALUES ('a', 'x', ?)", (big,))
            tx.capture_upsert("notes", ("a",))
        assert replica.db_version == 1  # one 3 MiB row fits
        tx = replica.transaction()
        tx.execute("INSERT INTO notes VALUES ('b', 'x', ?), ('c', 'x', ?)", (big, big))
        tx.capture_upsert("notes", ("b",))
        tx.capture_upsert("notes", ("c",))
        with pytest.raises(TransactionTooLargeError):
            tx.commit()  # the bytes are bounded at commit, which rolls everything back
        assert replica.db_version == 1
        assert [r[0] for r in _rows(replica)] == ["a"]


def test_row_resolution_is_deterministic_and_duplicate_safe() -> None:
    with _replica() as replica:
        # out of order: the higher site id at the same version arrives first, then the lower
        first = replica.apply_changes([_upsert("n", "from-high", 2, HIGH)])
        second = replica.apply_changes([_upsert("n", "from-low", 2, LOW)])
        assert (first.logged, first.applied) == (1, 1)
        assert (second.logged, second.applied) == (1, 0)  # new, but it lost
        assert _rows(replica) == [("n", "remote", "from-high")]
        replay = replica.apply_changes(
            [_upsert("n", "from-high", 2, HIGH), _upsert("n", "from-low", 2, LOW)]
        )
        # the winner's replay is a duplicate; the loser's cannot be told from a new loser
        assert (replay.received, replay.logged, replay.applied, replay.duplicates) == (2, 1, 0, 1)
        newer_delete = replica.apply_changes([_delete("n", 3, LOW)])
        assert newer_delete.applied == 1
        assert _rows(replica) == []
        assert replica.db_version == 3
        # an older upsert cannot resurrect the deleted row
        assert replica.apply_changes([_upsert("n", "stale", 2, HIGH, seq=7)]).applied == 0
        assert _rows(replica) == []
        assert set(replica.origins()) == {OTHER, LOW, HIGH}
        # the next local write is newer than everything seen
        assert _write(replica, "n", "local", "wins") == 4
        assert replica.apply_changes([_upsert("n", "older", 3, HIGH, seq=9)]).applied == 0
        assert _rows(replica) == [("n", "local", "wins")]


def test_sequence_numbers_break_ties_within_one_version() -> None:
    with _replica() as replica:
        replica.apply_changes([_upsert("n", "seq1", 5, HIGH, seq=1)])
        assert replica.apply_changes([_upsert("n", "seq0", 5, HIGH, seq=0)]).applied == 0
        assert _rows(replica) == [("n", "remote", "seq1")]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.one_of(st.none(), st.text(max_size=3)),
            st.integers(1, 6),
            st.sampled_from([LOW, HIGH, OTHER]),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=12,
        unique_by=lambda t: (t[2], t[3], t[4]),
    ),
    st.randoms(use_true_random=False),
    st.integers(1, 4),
)
def test_receipt_order_never_decides_the_winner(
    specs: list[tuple[str, str | None, int, bytes, int]], rng: object, chunk: int
) -> None:
    changes = [
        _delete(note, v, site, seq) if body is None else _upsert(note, body, v, site, seq)
        for note, body, v, site, seq in specs
    ]
    expected: dict[str, tuple[tuple[int, bytes, int], str | None]] = {}
    for note, body, v, site, seq in specs:
        if note not in expected or (v, site, seq) > expected[note][0]:
            expected[note] = ((v, site, seq), body)
    shuffled = list(changes)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    with Replica(":memory:", [NOTES], site_id=bytes(16)) as replica:
        for start in range(0, len(shuffled), chunk):
            replica.apply_changes(shuffled[start : start + chunk])
        replica.apply_changes(changes)  # a full replay changes nothing
        want = sorted((n, "remote", b) for n, (_, b) in expected.items() if b is not None)
        assert _rows(replica) == want
        assert replica.db_version == max(v for _, _, v, _, _ in specs)
        winners = sorted((stamp[1], stamp[0], stamp[2], n) for n, (stamp, _) in expected.items())
        assert [(s, v, q, n) for s, v, q, n, _ in _log(replica)] == winners


def test_invalid_changes_are_rejected_and_roll_back_their_whole_chunk() -> None:
    good = _upsert("good", "x", 1, HIGH)
    bad_cases: list[tuple[Change, type[Exception]]] = [
        (_upsert("n", "x", 1, b"short"), InvalidBatchError),
        (_upsert("n", "x", 0, HIGH), InvalidBatchError),
        (_upsert("n", "x", 1, HIGH, seq=-1), InvalidBatchError),
        (Change("notes", ("n", "m"), None, 1, HIGH, 1), InvalidMutationError),
        (Change("notes", (None,), None, 1, HIGH, 1), InvalidMutationError),
        (Change("notes", ("n",), ("n", "short row"), 1, HIGH, 1), InvalidMutationError),
        (Change("notes", ("n",), ("m", "a", "b"), 1, HIGH, 1), InvalidMutationError),
        (Change("elsewhere", ("n",), None, 1, HIGH, 1), MissingSchemaError),
    ]
    with _replica() as replica:
        for bad, error in bad_cases:
            with pytest.raises(error):
                replica.apply_changes([good, bad])
            assert _rows(replica) == []
            assert _log(replica) == []
            assert replica.db_version == 0
            assert not replica.in_transaction
        assert replica.origins() == (OTHER,)


def test_a_change_the_table_refuses_rolls_back_its_chunk() -> None:
    checked = TableSchema(
        "counts",
        "CREATE TABLE IF NOT EXISTS counts (id TEXT PRIMARY KEY, n INTEGER CHECK (n >= 0))",
        ["id", "n"],
        ["id"],
    )
    with Replica(":memory:", [checked], site_id=OTHER) as replica:
        with pytest.raises(InvalidMutationError, match="IntegrityError"):
            replica.apply_changes(
                [
                    Change("counts", ("a",), ("a", 1), 1, HIGH, 0),
                    Change("counts", ("b",), ("b", -1), 1, HIGH, 1),
                ]
            )
        assert replica.connection.execute("SELECT COUNT(*) FROM counts").fetchone() == (0,)
        assert replica.db_version == 0


def test_writes_outside_replica_transactions_are_not_replicated() -> None:
    with _replica() as replica:
        replica.connection.execute("INSERT INTO notes VALUES ('raw', 'a', 'b')")
        assert _log(replica) == []
        assert replica.db_version == 0


def test_change_listeners_run_after_commits_that_grow_the_log() -> None:
    calls: list[int] = []
    with _replica() as replica:
        remove = replica.add_change_listener(lambda: calls.append(replica.db_version))
        _write(replica, "n", "a", "b")
        replica.apply_changes([_upsert("m", "x", 4, HIGH)])
        replica.apply_changes([_upsert("m", "x", 4, HIGH)])  # duplicate: nothing changed
        with replica.transaction() as tx:
            tx.execute("INSERT INTO notes VALUES ('quiet', 'a', 'b')")  # nothing captured
        assert calls == [1, 4]
        remove()
        _write(replica, "n", "a", "c")
        assert calls == [1, 4]


def test_origins_survive_reopening_and_entries_keep_their_origin(tmp_path: Path) -> None:
    path = tmp_path / "origins.sqlite"
    with _replica(path) as replica:
        replica.apply_changes([_upsert("a", "x", 1, HIGH), _upsert("b", "x", 1, LOW)])
    with _replica(path) as reopened:
        assert set(reopened.origins()) == {OTHER, LOW, HIGH}
        assert reopened.origins()[0] == OTHER
        assert [(site, key) for site, _, _, key, _ in _log(reopened)] == [
            (LOW, "b"),
            (HIGH, "a"),
        ]


_EARLIER_LAYOUT = (
    "CREATE TABLE __chrysalis_replica_v1 (singleton INTEGER PRIMARY KEY CHECK (singleton = 1), "
    "site_id BLOB NOT NULL, db_version INTEGER NOT NULL)",
    "CREATE TABLE __chrysalis_changes_v1 (site_id BLOB NOT NULL, db_version INTEGER NOT NULL, "
    "seq INTEGER NOT NULL, table_name TEXT NOT NULL, key_values BLOB NOT NULL, row_values BLOB, "
    "PRIMARY KEY (site_id, db_version, seq)) WITHOUT ROWID",
    "CREATE TABLE __chrysalis_resolved_rows_v2 (table_name TEXT NOT NULL, key_values BLOB NOT "
    "NULL, db_version INTEGER NOT NULL, site_id BLOB NOT NULL, seq INTEGER NOT NULL, deleted "
    "INTEGER NOT NULL, PRIMARY KEY (table_name, key_values)) WITHOUT ROWID",
    "CREATE TABLE __chrysalis_origins_v1 (position INTEGER PRIMARY KEY, site_id BLOB NOT NULL "
    "UNIQUE)",
    "CREATE TABLE notes (id TEXT PRIMARY KEY, author TEXT, body TEXT)",
)


def _earlier_layout_database(path: Path, table: str = "notes") -> None:
    """A database as the earlier layout left it: rows, their changes logged (with payloads)
    and winners; ``a`` won by HIGH at version 2 (an older change of OTHER lost), ``b``
    deleted by OTHER at version 3."""
    conn = sqlite3.connect(path)
    for statement in _EARLIER_LAYOUT:
        conn.execute(statement)
    conn.execute("INSERT INTO __chrysalis_replica_v1 VALUES (1, ?, 3)", (OTHER,))
    conn.executemany("INSERT INTO __chrysalis_origins_v1 (site_id) VALUES (?)", [(OTHER,), (HIGH,)])
    conn.execute("INSERT INTO notes VALUES ('a', 'high', 'won')")
    a, b = encode_values(["a"]), encode_values(["b"])
    conn.executemany(
        "INSERT INTO __chrysalis_changes_v1 VALUES (?, ?, ?, ?, ?, ?)",
        [
            (OTHER, 1, 0, table, a, encode_values(["a", "other", "lost"])),
            (OTHER, 1, 1, table, b, encode_values(["b", "other", "x"])),
            (HIGH, 2, 0, table, a, encode_values(["a", "high", "won"])),
            (OTHER, 3, 1, table, b, None),
        ],
    )
    conn.executemany(
        "INSERT INTO __chrysalis_resolved_rows_v2 VALUES (?, ?, ?, ?, ?, ?)",
        [(table, a, 2, HIGH, 0, 0), (table, b, 3, OTHER, 1, 1)],
    )
    conn.commit()
    conn.close()


def test_a_database_of_the_earlier_log_layout_is_converted_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    _earlier_layout_database(path)
    with Replica(path, [NOTES]) as replica:
        assert replica.site_id == OTHER
        assert replica.db_version == 3
        names = {
            n
            for (n,) in replica.connection.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table'"
            )
        }
        assert not names & {"__chrysalis_changes_v1", "__chrysalis_resolved_rows_v2"}
        assert _rows(replica) == [("a", "high", "won")]
        assert _log(replica) == [(OTHER, 3, 1, "b", 1), (HIGH, 2, 0, "a", 0)]
        # the winners travel to a new peer with their origin tuples, the delete as a delete
        peer, peer_site = b"P" * 16, b"S" * 16
        replica._reconcile_frontier(
            peer,
            peer_site,
            {OTHER: True, HIGH: True},
            replica._origin_position,
            EligibilityMode.ALLOW,
        )
        sent = decode_changes(replica._select_for_peer(peer, peer_site).encoded)
        assert sorted((c.site_id, c.db_version, c.seq, c.key, c.row) for c in sent) == [
            (OTHER, 3, 1, ("b",), None),
            (HIGH, 2, 0, ("a",), ("a", "high", "won")),
        ]
        # a remote change older than the converted winner still loses
        assert replica.apply_changes([_upsert("a", "stale", 2, LOW)]).applied == 0


def test_earlier_metadata_of_an_unregistered_table_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    _earlier_layout_database(path, table="elsewhere")
    with pytest.raises(CorruptMetadataError, match=r"elsewhere.*register every table"):
        Replica(path, [NOTES])
    conn = sqlite3.connect(path)
    names = {n for (n,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
    assert names == {
        "__chrysalis_replica_v1",
        "__chrysalis_changes_v1",
        "__chrysalis_resolved_rows_v2",
        "__chrysalis_origins_v1",
        "notes",
    }  # nothing was created, converted or dropped
    assert conn.execute("SELECT COUNT(*) FROM __chrysalis_changes_v1").fetchone() == (4,)
    conn.close()


def test_frontiers_are_peer_incarnation_scoped_and_monotonic() -> None:
    peer = Pid(b"P" * 16)
    incarnation_1, incarnation_2 = b"1" * 16, b"2" * 16
    with _replica() as replica:
        replica._register_origins([LOW, HIGH])
        positions = [
            p for (p,) in replica.connection.execute("SELECT position FROM __chrysalis_origins_v1")
        ]
        assert positions == [1, 2, 3]
        assert replica._origins_after(1) == [LOW, HIGH]  # incremental discovery by position
        assert replica._origins_after(3) == []
        replica._reconcile_frontier(
            peer.raw, incarnation_1, {OTHER: True, LOW: True, HIGH: False}, 3, EligibilityMode.ALLOW
        )
        replica._record_ack(peer.raw, incarnation_1, {OTHER: 5, LOW: 2})
        replica._record_ack(peer.raw, incarnation_1, {OTHER: 3})  # never goes back
        assert replica.peer_frontier(peer, incarnation_1) == {
            LOW: FrontierEntry(2, True),
            OTHER: FrontierEntry(5, True),
            HIGH: FrontierEntry(0, False),
        }
        # eligibility upserts keep the acknowledged progress
        replica._reconcile_frontier(
            peer.raw, incarnation_1, {OTHER: False}, 3, EligibilityMode.ALLOW
        )
        assert replica.peer_frontier(peer, incarnation_1)[OTHER] == FrontierEntry(5, False)
        state = replica._load_peer_state(peer.raw, incarnation_1)
        assert state.origin_position == 3
        assert state.mode is EligibilityMode.ALLOW
        assert state.explicit_sites == {LOW}
        # a new incarnation of the same peer starts from nothing
        assert replica.peer_frontier(peer, incarnation_2) == {}
        fresh = replica._load_peer_state(peer.raw, incarnation_2)
        assert (fresh.origin_position, fresh.mode, fresh.explicit_sites) == (0, None, frozenset())


def test_closed_replicas_refuse_work() -> None:
    replica = _replica()
    replica.close()
    replica.close()
    assert replica.closed
    with pytest.raises(ReplicaClosedError):
        replica.transaction()
    with pytest.raises(ReplicaClosedError):
        _ = replica.db_version
    with pytest.raises(ReplicaClosedError):
        replica.apply_changes([])


def test_a_database_with_a_corrupt_site_id_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE __chrysalis_replica_v1 (singleton INTEGER PRIMARY KEY, site_id BLOB, "
        "db_version INTEGER)"
    )
    conn.execute("INSERT INTO __chrysalis_replica_v1 VALUES (1, x'0102', 0)")
    conn.commit()
    conn.close()
    with pytest.raises(CorruptMetadataError):
        Replica(path, [NOTES])


def test_upsert_writes_and_captures_the_stored_row_in_one_call() -> None:
    with _replica() as replica:
        with replica.transaction() as tx:
            stored = tx.upsert("notes", (7, "alice", "hello"))  # TEXT affinity stores '7'
            assert stored == ("7", "alice", "hello")
            assert tx.upsert("notes", ("7", "alice", "edited")) == ("7", "alice", "edited")
            with pytest.raises(InvalidMutationError, match="3 columns"):
                tx.upsert("notes", ("x", "short"))
        assert _rows(replica) == [("7", "alice", "edited")]
        assert _log(replica) == [(OTHER, 1, 1, "7", 0)]  # one entry: the last capture


def test_upsert_fills_in_an_integer_primary_key_and_handles_key_only_tables() -> None:
    counters = TableSchema(
        "counters",
        "CREATE TABLE IF NOT EXISTS counters (id INTEGER PRIMARY KEY, name TEXT)",
        ["id", "name"],
        ["id"],
    )
    tags = TableSchema(
        "tags", "CREATE TABLE IF NOT EXISTS tags (tag TEXT PRIMARY KEY)", ["tag"], ["tag"]
    )
    with Replica(":memory:", [counters, tags], site_id=OTHER) as replica:
        with replica.transaction() as tx:
            assert tx.upsert("counters", (None, "first")) == (1, "first")
            assert tx.upsert("tags", ("red",)) == ("red",)
            assert tx.upsert("tags", ("red",)) == ("red",)  # already there: DO NOTHING
        assert [k for *_, k, _ in _log(replica, "counters")] == [1]
        assert [(q, k) for _, _, q, k, _ in _log(replica, "tags")] == [(2, "red")]


def test_delete_removes_and_captures_even_an_absent_row() -> None:
    with _replica() as replica:
        _write(replica, "n1", "a", "b")
        with replica.transaction() as tx:
            assert tx.delete("notes", ("n1",)) is True
            assert tx.delete("notes", ("never-there",)) is False
        assert _rows(replica) == []
        # tombstones: a newer delete wins over older upserts of the key elsewhere
        assert _log(replica) == [(OTHER, 2, 0, "n1", 1), (OTHER, 2, 1, "never-there", 1)]


PAIRS = TableSchema(
    "pairs",
    "CREATE TABLE IF NOT EXISTS pairs (a, b, v, PRIMARY KEY (a, b))",
    ["a", "b", "v"],
    ["a", "b"],
)
# (no REAL keys: SQLite's own key comparison equates 0 and 0.0, the metadata does not)
_KEY_PARTS = st.one_of(st.integers(-2, 2), st.sampled_from(["x", "y", "1"]))
_PAIR_CHANGES = st.lists(
    st.builds(
        lambda a, b, v, version, site, seq: Change(
            "pairs", (a, b), None if v is None else (a, b, v), version, site, seq
        ),
        _KEY_PARTS,
        st.sampled_from([1, "1"]),
        st.one_of(st.none(), st.integers(0, 3), st.text(max_size=2)),
        st.integers(1, 4),
        st.sampled_from([LOW, HIGH, OTHER]),
        st.integers(0, 2),
    ),
    max_size=14,
)


def _state(replica: Replica) -> tuple[list[Any], ...]:
    replica._fold_all()
    conn = replica.connection
    return (
        sorted(conn.execute("SELECT a, b, v, typeof(a) FROM pairs").fetchall(), key=repr),
        sorted(
            conn.execute(
                "SELECT c._k0, c._k1, c._version, o.site_id, c._seq, c._deleted "
                "FROM __chrysalis_clock_v1_pairs AS c "
                "JOIN __chrysalis_origins_v1 AS o ON o.position = c._origin"
            ).fetchall(),
            key=repr,
        ),
        [replica.db_version],
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(_PAIR_CHANGES, min_size=1, max_size=4))
def test_batched_apply_matches_applying_changes_one_by_one(chunks: list[list[Change]]) -> None:
    """Chunks with duplicates (within a chunk and across chunks), repeated rows, deletes and
    keys that differ only in type (1 / "1"): the chunk apply gives the same outcome counts,
    rows, clock entries and clock as a model that applies one change at a time (a change equal
    to its row's winner is a duplicate, a smaller one loses), and the session's path (the
    encodings as received) gives the same database."""
    batched = Replica(":memory:", [PAIRS], site_id=bytes(16))
    wire = Replica(":memory:", [PAIRS], site_id=bytes(16))
    winners: dict[bytes, tuple[int, bytes, int]] = {}
    rows: dict[bytes, tuple[Any, ...] | None] = {}
    keys: dict[bytes, tuple[Any, ...]] = {}
    for chunk in chunks:
        want_logged = want_applied = 0
        for change in chunk:  # the model: one change at a time
            key = encode_values(change.key)
            stamp = (change.db_version, change.site_id, change.seq)
            if winners.get(key) == stamp:
                continue  # a duplicate
            want_logged += 1
            if key in winners and stamp < winners[key]:
                continue
            keys[key] = change.key
            winners[key] = stamp
            rows[key] = change.row
            want_applied += 1
        outcome = batched.apply_changes(chunk)
        assert (outcome.received, outcome.logged, outcome.applied) == (
            len(chunk),
            want_logged,
            want_applied,
        )
        decoder = FrameDecoder(keep_encodings=True)
        decoder.feed(encode_message(BatchChunk(tuple(chunk))))
        message = decoder.next_message()
        assert isinstance(message, BatchChunk)
        assert decoder.chunk_encodings is not None
        assert wire._apply(message.changes, decoder.chunk_encodings) == outcome
    want_rows = sorted(
        (
            (*row, {int: "integer", float: "real", str: "text"}[type(row[0])])
            for row in rows.values()
            if row is not None
        ),
        key=repr,
    )
    state = _state(batched)
    assert state[0] == want_rows
    want_clock = [(*keys[k], *stamp, int(rows[k] is None)) for k, stamp in winners.items()]
    assert state[1] == sorted(want_clock, key=repr)
    assert state == _state(wire)
    batched.close()
    wire.close()


def test_a_received_key_must_match_its_row_exactly() -> None:
    """On the session's path the key is compared with the row's key by type and value (floats
    by bit pattern), as strictly as comparing their encodings."""
    cases: list[tuple[tuple[SqlValue, ...], tuple[SqlValue, ...]]] = [
        ((0.0, 1), (-0.0, 1, "v")),
        ((1, 1), (1.0, 1, "v")),
        (("1", 1), (1, 1, "v")),
    ]
    with Replica(":memory:", [PAIRS], site_id=OTHER) as replica:
        for key, row in cases:
            change = Change("pairs", key, row, 1, HIGH, 0)
            body = encode_message(BatchChunk((change,)))
            decoder = FrameDecoder(keep_encodings=True)
            decoder.feed(body)
            message = decoder.next_message()
            assert isinstance(message, BatchChunk)
            assert decoder.chunk_encodings is not None
            with pytest.raises(InvalidMutationError, match="differs from its row's key"):
                replica._apply(message.changes, decoder.chunk_encodings)
        assert replica.connection.execute("SELECT COUNT(*) FROM pairs").fetchone() == (0,)
        assert _state(replica)[1] == []


def test_only_the_change_that_still_wins_a_row_is_selected() -> None:
    """A row written in two versions travels once, under the later one, once they are
    folded (pending versions are sent as they are: see ``test_fold``); the earlier version's
    list, left with no row it still wins, is removed by the selection."""
    peer, peer_site = b"P" * 16, b"S" * 16
    with _replica() as replica:
        _write(replica, "n", "a", "first")
        _write(replica, "m", "a", "other")
        _write(replica, "n", "a", "second")
        replica._fold_all()
        replica._reconcile_frontier(
            peer, peer_site, {OTHER: True}, replica._origin_position, EligibilityMode.ALLOW
        )
        selection = replica._select_for_peer(peer, peer_site)
        sent = [(c.db_version, c.seq, c.key, c.row) for c in decode_changes(selection.encoded)]
        assert sent == [(2, 0, ("m",), ("m", "a", "other")), (3, 0, ("n",), ("n", "a", "second"))]
        assert selection.advances == {OTHER: 3}
        assert selection.complete
        listed = replica.connection.execute(
            "SELECT db_version FROM __chrysalis_versions_v1 ORDER BY db_version"
        ).fetchall()
        assert listed == [(2,), (3,)]  # version 1 lost its only row
