"""Deferred clock entries (issue 6): a commit lists its keys in ``__chrysalis_versions_v1``
and writes no clock entry; the entries are written ("folded") in version order by whoever
next needs them (the sender, ``apply_changes``, the status query, ``close``, the next open),
and the result is the entries the commit would have written itself."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from chrysalis.core import Pid
from chrysalis.sqlite import (
    Change,
    EligibilityMode,
    Replica,
    TableSchema,
    TransactionTooLargeError,
)
from chrysalis.sqlite.shell import replication_status
from chrysalis.sqlite.testing import ReplicaNetwork

sys.path.insert(0, str(Path(__file__).parent))  # the shared batch helper, by name
from sqlite_batches import decode_changes

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, n INTEGER)",
    ["id", "n"],
    ["id"],
)
BLOBS = TableSchema(
    "blobs",
    "CREATE TABLE IF NOT EXISTS blobs (b BLOB PRIMARY KEY, v TEXT)",
    ["b", "v"],
    ["b"],
)
SITE, LOW, HIGH = bytes([5]) * 16, bytes([1]) * 16, bytes([9]) * 16
PEER = Pid(b"P" * 16)


def _entries(conn: sqlite3.Connection, table: str = "notes") -> dict[Any, tuple[Any, ...]]:
    """The clock entries as stored, without folding: key -> (version, site, seq, deleted)."""
    return {
        k: (v, site, seq, d)
        for k, v, site, seq, d in conn.execute(
            "SELECT c._k0, c._version, o.site_id, c._seq, c._deleted "
            f"FROM __chrysalis_clock_v1_{table} AS c "
            "JOIN __chrysalis_origins_v1 AS o ON o.position = c._origin"
        )
    }


def _folded(conn: sqlite3.Connection) -> int:
    (mark,) = conn.execute("SELECT folded_through FROM __chrysalis_folded_v1").fetchone()
    return int(mark)


def _write(replica: Replica, *edits: tuple[str, int | None]) -> int:
    with replica.transaction() as tx:
        for key, value in edits:
            if value is None:
                tx.delete("notes", (key,))
            else:
                tx.upsert("notes", (key, value))
    assert tx.version is not None
    return tx.version


def test_a_commit_lists_its_keys_and_the_fold_writes_the_entries() -> None:
    with Replica(":memory:", [NOTES], site_id=SITE) as replica:
        conn = replica.connection
        assert _write(replica, ("a", 1), ("b", 2)) == 1
        assert _entries(conn) == {}  # pending: listed, no entry yet
        assert conn.execute("SELECT db_version, keys FROM __chrysalis_versions_v1").fetchall() == [
            (1, '["a","b"]')
        ]
        assert replica._pending()
        assert _folded(conn) == 0
        replica._fold_all()
        assert _entries(conn) == {"a": (1, SITE, 0, 0), "b": (1, SITE, 1, 0)}
        assert not replica._pending()
        assert _folded(conn) == 1


def test_rows_written_by_several_pending_versions_end_with_the_last() -> None:
    with Replica(":memory:", [NOTES], site_id=SITE) as replica:
        _write(replica, ("a", 1), ("b", 1), ("c", 1))  # 1
        _write(replica, ("a", None), ("b", 2))  # 2: a deleted
        _write(replica, ("b", None), ("a", 3))  # 3: a back, b deleted
        _write(replica, ("c", None))  # 4
        replica._fold_all()
        assert _entries(replica.connection) == {
            "a": (3, SITE, 1, 0),
            "b": (3, SITE, 0, 1),
            "c": (4, SITE, 0, 1),
        }


def test_a_bounded_fold_stops_at_whole_versions() -> None:
    with Replica(":memory:", [NOTES], site_id=SITE) as replica:
        _write(replica, ("a", 1), ("b", 1))
        _write(replica, ("a", 2))
        _write(replica, ("c", 3))
        with replica._write() as conn:
            assert not replica._fold(conn, 1)  # the first version only, however many keys
        assert _entries(replica.connection) == {"a": (1, SITE, 0, 0), "b": (1, SITE, 1, 0)}
        assert _folded(replica.connection) == 1
        with replica._write() as conn:
            assert replica._fold(conn, None)
        assert _entries(replica.connection)["a"] == (2, SITE, 0, 0)
        assert _folded(replica.connection) == 3


@pytest.mark.parametrize(
    ("remote_version", "remote_site", "wins"), [(1, LOW, False), (1, HIGH, True), (2, LOW, True)]
)
def test_a_remote_change_meets_the_entry_of_a_pending_local_write(
    remote_version: int, remote_site: bytes, wins: bool
) -> None:
    with Replica(":memory:", [NOTES], site_id=SITE) as replica:
        _write(replica, ("k", 1))  # version 1, pending
        outcome = replica.apply_changes(
            [Change("notes", ("k",), ("k", 99), remote_version, remote_site, 0)]
        )
        assert outcome.applied == int(wins)
        (n,) = replica.connection.execute("SELECT n FROM notes").fetchone()
        assert n == (99 if wins else 1)
        winner = (remote_version, remote_site) if wins else (1, SITE)
        assert _entries(replica.connection)["k"][:2] == winner
        assert not replica._pending()
        # the next local write is newer than the remote change (Lamport clock), and pending
        _write(replica, ("k", 5))
        replica._fold_all()
        assert _entries(replica.connection)["k"][:2] == (max(remote_version, 1) + 1, SITE)


def test_a_crash_between_commit_and_fold_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    replica = Replica(path, [NOTES], site_id=SITE)
    try:
        _write(replica, ("a", 1))
        _write(replica, ("a", None), ("b", 2))
        # the file as a crash right now would leave it (committed, nothing folded)
        shutil.copy(path, tmp_path / "crashed.sqlite")
    finally:
        replica.close()
    with sqlite3.connect(tmp_path / "crashed.sqlite") as raw:
        assert _entries(raw) == {"a": (2, SITE, 0, 1)}  # tombstones are written at commit
        assert _folded(raw) == 0
    with Replica(tmp_path / "crashed.sqlite", [NOTES]) as reopened:  # folds on open
        assert _entries(reopened.connection) == {"a": (2, SITE, 0, 1), "b": (2, SITE, 1, 0)}
        assert not reopened._pending()
    with sqlite3.connect(path) as raw:  # ``close`` folded the original
        assert _entries(raw) == {"a": (2, SITE, 0, 1), "b": (2, SITE, 1, 0)}


def test_connections_on_one_file_share_the_pending_list(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    with Replica(path, [NOTES], site_id=SITE) as one, Replica(path, [NOTES]) as two:
        _write(one, ("a", 1))
        _write(two, ("b", 2))  # version 2: the clock is shared
        two._fold_all()  # folds the other connection's version too
        assert _entries(one.connection) == {"a": (1, SITE, 0, 0), "b": (2, SITE, 0, 0)}
        _write(one, ("a", 3))
        outcome = two.apply_changes([Change("notes", ("a",), ("a", 7), 3, LOW, 0)])
        assert outcome.applied == 0  # loses to the pending version 3 written by ``one``
        assert _entries(one.connection)["a"] == (3, SITE, 0, 0)


def test_the_sender_selects_pending_versions_without_folding_them() -> None:
    with Replica(":memory:", [NOTES], site_id=SITE) as replica:
        conn = replica.connection
        replica._reconcile_frontier(
            PEER.raw, HIGH, {SITE: True}, replica._origin_position, EligibilityMode.ALLOW
        )
        _write(replica, ("a", 1), ("b", 1))
        _write(replica, ("a", None))  # its tombstone is written at commit
        _write(replica, ("b", 2), ("c", 2))
        selection = replica._select_for_peer(PEER.raw, HIGH)
        assert _folded(conn) == 0  # nothing folded: the selection wrote nothing
        sent = [(c.db_version, c.seq, c.key, c.row) for c in decode_changes(selection.encoded)]
        # a: the tombstone of version 2 beats version 1's upsert; b, written by two pending
        # versions, goes with each, as the row is now (the receiver keeps the last)
        assert sent == [
            (1, 1, ("b",), ("b", 2)),
            (2, 0, ("a",), None),
            (3, 0, ("b",), ("b", 2)),
            (3, 1, ("c",), ("c", 2)),
        ]
        assert selection.complete
        assert selection.advances == {SITE: 3}
        replica._record_ack(PEER.raw, HIGH, selection.advances)  # folds in the same transaction
        assert _folded(conn) == 3
        assert _entries(conn) == {
            "a": (2, SITE, 0, 1),
            "b": (3, SITE, 0, 0),
            "c": (3, SITE, 1, 0),
        }
        assert replica._select_for_peer(PEER.raw, HIGH).encoded == ()


def test_a_pending_version_whose_rows_all_lost_is_not_taken_for_dead() -> None:
    with Replica(":memory:", [NOTES], site_id=SITE) as replica:
        replica._reconcile_frontier(
            PEER.raw, HIGH, {SITE: True}, replica._origin_position, EligibilityMode.ALLOW
        )
        _write(replica, ("a", 1))
        _write(replica, ("a", None))
        sent = decode_changes(replica._select_for_peer(PEER.raw, HIGH).encoded)
        assert [(c.db_version, c.key, c.row) for c in sent] == [(2, ("a",), None)]
        listed = replica.connection.execute(
            "SELECT db_version FROM __chrysalis_versions_v1 ORDER BY 1"
        ).fetchall()
        assert listed == [(1,), (2,)]  # version 1 is pending: kept for the fold
        replica._fold_all()
        assert _entries(replica.connection) == {"a": (2, SITE, 0, 1)}


def test_versions_written_at_commit_keep_the_order_with_pending_ones() -> None:
    """Keys JSON cannot carry (here a BLOB) are written at commit, after folding the pending
    versions first: entries still end as version order says."""
    with Replica(":memory:", [NOTES, BLOBS], site_id=SITE) as replica:
        _write(replica, ("a", 1))  # pending
        with replica.transaction() as tx:
            tx.upsert("blobs", (b"\x00", "x"))
            tx.upsert("notes", ("a", 2))
        assert not replica._pending()  # folded by that commit, which wrote its own entries
        assert _entries(replica.connection)["a"] == (2, SITE, 1, 0)
        assert _entries(replica.connection, "blobs") == {b"\x00": (2, SITE, 0, 0)}


def test_the_status_counts_pending_keys_on_a_plain_connection(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    with Replica(path, [NOTES], site_id=SITE) as replica:
        replica._reconcile_frontier(
            PEER.raw, HIGH, {SITE: True}, replica._origin_position, EligibilityMode.ALLOW
        )
        _write(replica, ("a", 1), ("b", 1))
        _write(replica, ("a", 2))
        raw = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            (status,) = replication_status(raw)
            (origin,) = status.origins
            assert (origin.latest, origin.pending) == (2, 3)  # a row per pending version
            replica._fold_all()
            (status,) = replication_status(raw)
            (origin,) = status.origins
            assert (origin.latest, origin.pending) == (2, 2)
        finally:
            raw.close()
        (status,) = replication_status(replica)
        assert status.origins[0].pending == 2


def test_a_change_received_before_a_pending_local_write_is_folded_loses_to_it(
    tmp_path: Path,
) -> None:
    """Another process's connection writes ``k`` (pending, and no session is woken); a
    concurrent change of ``k`` from the peer with a smaller origin tuple arrives: the local
    write wins everywhere (the session folds before it selects or applies; the apply's own
    fold is checked directly above)."""
    net = ReplicaNetwork(seed=1)
    a = Replica(tmp_path / "a.sqlite", [NOTES], site_id=HIGH)
    b = Replica(":memory:", [NOTES], site_id=LOW)
    other = Replica(tmp_path / "a.sqlite", [NOTES])
    try:
        net.add("a", a)
        net.add("b", b)
        net.connect("a", "b")
        _write(a, ("k", 0))
        net.settle()
        assert _write(other, ("k", 1)) == 2  # pending at a, unseen by the network
        assert _write(b, ("k", 2)) == 2  # (2, LOW) < (2, HIGH)
        net.settle()
        for replica in (a, b):
            assert replica.connection.execute("SELECT n FROM notes").fetchall() == [(1,)]
            replica._fold_all()
            assert _entries(replica.connection)["k"] == (2, HIGH, 0, 0)
    finally:
        other.close()
        a.close()
        b.close()


@pytest.mark.parametrize("letter", ["x", "é"])
def test_a_deferred_commit_counts_its_text_keys_in_bytes(letter: str) -> None:
    """The deferred commit measures a TEXT key in Python (its UTF-8 bytes, counted as the key
    and in the row): two keys of about 1.4 MB each make a version above 4 MiB."""
    key_chars = 1_400_000 // len(letter.encode())
    with Replica(":memory:", [NOTES], site_id=SITE) as replica:
        tx = replica.transaction()
        for n in range(2):
            key = str(n) + letter * key_chars
            tx.execute("INSERT INTO notes VALUES (?, 0)", (key,))
            tx.capture_upsert("notes", (key,))
        with pytest.raises(TransactionTooLargeError):
            tx.commit()
        assert replica.connection.execute("SELECT count(*) FROM notes").fetchone() == (0,)
        with replica.transaction() as tx:  # one such key fits
            tx.execute("INSERT INTO notes VALUES (?, 0)", (letter * key_chars,))
            tx.capture_upsert("notes", (letter * key_chars,))
        assert tx.version == 1


def test_a_database_without_the_fold_mark_has_nothing_pending(tmp_path: Path) -> None:
    """A database of the release that wrote every entry at commit has no mark: the opening
    transaction sets it to the clock, and nothing it lists is folded again."""
    path = tmp_path / "db.sqlite"
    with Replica(path, [NOTES], site_id=SITE) as replica:
        _write(replica, ("a", 1))
        _write(replica, ("a", 2))
    with sqlite3.connect(path) as raw:
        raw.execute("DROP TABLE __chrysalis_folded_v1")
        # a probe: an entry behind its listed version, which a fold of version 2 would raise
        raw.execute("UPDATE __chrysalis_clock_v1_notes SET _version = 1, _seq = 7")
    with Replica(path, [NOTES]) as reopened:
        assert _folded(reopened.connection) == 2
        assert not reopened._pending()
        assert _entries(reopened.connection) == {"a": (1, SITE, 7, 0)}  # nothing re-folded
        assert _write(reopened, ("b", 3)) == 3
