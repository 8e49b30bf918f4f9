"""``Replica``: replicated SQLite on a stdlib ``sqlite3`` connection, with row-level LWW.

Why a replica owns its connection: replication state (site id, logical clock, change log, row
winners, origins, per-peer frontiers) lives in the same SQLite database as the application's
tables, so every write to it can share a transaction with the data it describes. The
application writes through ``Replica.transaction()`` (see ``_transaction``); writes made outside
it are invisible to replication.

Metadata lives in ordinary tables, created on open (their layout matches the reference
implementation, so a database can move between implementations):

- ``__chrysalis_replica_v1``: the singleton ``(site_id, db_version)``; the site id is 16 random
  bytes chosen on first open, ``db_version`` is the Lamport clock.
- ``__chrysalis_changes_v1``: the durable change log, keyed by the origin tuple, so replays of
  the same change are recognised and ignored. Logs are never compacted.
- ``__chrysalis_resolved_rows_v2``: the winning origin tuple per ``(table, encoded key)``.
- ``__chrysalis_origins_v1``: an append-only registry of every origin site seen, with strictly
  increasing positions (sessions discover new origins incrementally by position).
- ``__chrysalis_peer_state_v1`` / ``__chrysalis_frontiers_v5``: per peer incarnation
  ``(peer PID, peer site)``, the outbound eligibility mode and, per origin, the highest version
  the peer acknowledged (``synced_at``) and whether the origin is eligible on that link.

Remote changes (``apply_changes``) are applied one chunk per transaction: each change is logged
under its *original* origin tuple (a duplicate is skipped entirely), the clock advances to at
least its version, and the row is written only if its tuple is greater than the recorded
winner's. Receipt order therefore never decides a winner, and losing changes stay in the log
and are still relayed. The chunk is applied set-based (see ``_apply``): it is staged once in a
per-connection ``TEMP`` table, one join finds duplicates and current winners, and the log rows
and winners are copied from the stage, with the same result as applying one change at a time.

Concurrency: one replica is one connection, used from one thread. The "apply lock" of the
reference is the rule that replica transactions do not nest: while the application holds
``transaction()``, anything else that needs the lock (another transaction, a session applying
or selecting changes) raises ``ReplicaBusyError`` instead of interleaving. Other processes may
open the same database file; their commits are noticed through ``PRAGMA data_version``.
"""

from __future__ import annotations

import bisect
import os
import sqlite3
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Final

from chrysalis.core import Pid
from chrysalis.sqlite import _sql
from chrysalis.sqlite._errors import (
    ChangeVersionTooLargeError,
    CodecError,
    CorruptMetadataError,
    DuplicatePeerError,
    InvalidBatchError,
    InvalidMutationError,
    InvalidSchemaError,
    MissingSchemaError,
    ReplicaBusyError,
    ReplicaClosedError,
    quote,
)
from chrysalis.sqlite._protocol import Change, EncodedChange, encode_change_parts
from chrysalis.sqlite._schema import TableSchema
from chrysalis.sqlite._scope import SITE_ID_LEN, EligibilityMode
from chrysalis.sqlite._transaction import ReplicaTransaction, TransactionBehavior
from chrysalis.sqlite._values import encode_row_and_key, encode_values

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ROWS",
    "ApplyOutcome",
    "FrontierEntry",
    "Replica",
]

MAX_BATCH_ROWS: Final = 4096
"""Most changes in one outbound batch (unless its single version group is larger)."""

MAX_BATCH_BYTES: Final = 4 * 1024 * 1024
"""Most encoded change bytes in one outbound batch; one larger version group is an error."""

_F64 = struct.Struct(">d")


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """What ``Replica.apply_changes`` did with one chunk of changes.

    ``received``: changes in the chunk. ``logged``: new to the change log (the rest were
    duplicates, skipped entirely). ``applied``: logged changes that won last-writer-wins and
    were written to their table; ``logged - applied`` lost to an existing winner.
    """

    received: int
    logged: int
    applied: int

    @property
    def duplicates(self) -> int:
        """Changes that were already in the log."""
        return self.received - self.logged


@dataclass(frozen=True, slots=True)
class FrontierEntry:
    """Outbound progress toward one peer incarnation for one origin site.

    ``synced_at``: the highest version of the origin the peer acknowledged (0: none).
    ``eligible``: whether the link currently carries this origin's changes.
    """

    synced_at: int
    eligible: bool


@dataclass(frozen=True, slots=True)
class _PeerState:
    """Durable outbound state of one peer incarnation, as loaded by a session."""

    origin_position: int
    mode: EligibilityMode | None
    explicit_sites: frozenset[bytes]


@dataclass(frozen=True, slots=True)
class _Selection:
    """Changes chosen for one outbound batch (encoded, in origin-tuple order)."""

    encoded: tuple[bytes, ...]
    tables: frozenset[str]
    advances: Mapping[bytes, int]
    complete: bool


def _to_sql_error(exc: sqlite3.Error, what: str) -> InvalidMutationError:
    return InvalidMutationError(f"{what}: {type(exc).__name__}: {exc}")


class Replica:
    """A replicated SQLite database: application tables plus ``__chrysalis_*`` metadata.

    ``Replica(path, schemas)`` opens (or creates) the database at ``path`` (a file, or
    ``":memory:"``), creates the metadata tables, runs every schema's ``create_sql``, checks
    that each table has exactly the declared columns and a unique primary key, and loads the
    site id (chosen at random on first open; ``site_id`` fixes it for a new database, and must
    match an existing one). ``schemas`` must be non-empty with unique table names.

    Write through ``transaction()``; read through ``connection``. Remote changes arrive through
    a ``ReplicaSession`` (or ``apply_changes``). ``add_change_listener`` registers callbacks
    run after every commit that added to the change log (local or remote), which is how an
    adapter wakes the sessions of other links. Close with ``close()`` or a ``with`` block.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        schemas: Iterable[TableSchema],
        *,
        timeout: float = 5.0,
        site_id: bytes | None = None,
    ) -> None:
        schema_list = list(schemas)
        if not schema_list:
            raise InvalidSchemaError("a replica needs at least one table schema")
        by_name: dict[str, TableSchema] = {}
        for schema in schema_list:
            if not isinstance(schema, TableSchema):
                raise InvalidSchemaError(f"not a TableSchema: {type(schema).__name__}")
            if schema.table.lower() in {t.lower() for t in by_name}:
                raise InvalidSchemaError(f"table {quote(schema.table)} is registered twice")
            by_name[schema.table] = schema
        if site_id is not None and (not isinstance(site_id, bytes) or len(site_id) != SITE_ID_LEN):
            raise ValueError("site_id must be exactly 16 bytes")
        self._schemas = by_name
        self._schemas_view: Mapping[str, TableSchema] = MappingProxyType(by_name)
        self._path = os.fspath(path)
        self._conn = sqlite3.connect(self._path, timeout=timeout, isolation_level=None)
        self._busy: object | None = None
        self._closed = False
        self._epoch = 0
        self._listeners: list[Callable[[], None]] = []
        self._sessions: dict[bytes, object] = {}
        self._origins: list[bytes] = []
        self._positions: list[int] = []
        self._origin_positions: dict[bytes, int] = {}
        self._last_position = 0
        try:
            self._site_id = self._initialise(site_id)
            self._refresh_origins()
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    def _initialise(self, requested_site: bytes | None) -> bytes:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _sql.METADATA_DDL:
                conn.execute(statement)
            conn.execute(_sql.INCOMING_DDL)
            if requested_site is None:
                conn.execute(
                    "INSERT OR IGNORE INTO __chrysalis_replica_v1 (singleton, site_id, db_version)"
                    " VALUES (1, randomblob(16), 0)"
                )
            else:
                conn.execute(
                    "INSERT OR IGNORE INTO __chrysalis_replica_v1 (singleton, site_id, db_version)"
                    " VALUES (1, ?, 0)",
                    (requested_site,),
                )
            for schema in self._schemas.values():
                try:
                    conn.execute(schema.create_sql)
                except (sqlite3.Error, sqlite3.Warning) as exc:
                    raise InvalidSchemaError(
                        f"create_sql of {quote(schema.table)} failed: {exc}"
                    ) from None
                _check_table(conn, schema)
            row = conn.execute(
                "SELECT site_id FROM __chrysalis_replica_v1 WHERE singleton = 1"
            ).fetchone()
            site = row[0] if row else None
            if not isinstance(site, bytes) or len(site) != SITE_ID_LEN:
                raise CorruptMetadataError(f"stored site id {quote(site)} is not 16 bytes")
            if requested_site is not None and site != requested_site:
                raise ValueError(
                    f"the database already has site id {site.hex()}, not {requested_site.hex()}"
                )
            conn.execute(_sql.INSERT_ORIGIN, (site,))
            conn.execute(
                "INSERT OR IGNORE INTO __chrysalis_origins_v1 (site_id) SELECT DISTINCT site_id "
                "FROM __chrysalis_changes_v1 ORDER BY site_id"
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return site

    # ----------------------------------------------------------------------------------------
    # Public surface

    @property
    def site_id(self) -> bytes:
        """This replica's 16-byte site id."""
        return self._site_id

    @property
    def path(self) -> str:
        """The database path given to the constructor."""
        return self._path

    @property
    def schemas(self) -> Mapping[str, TableSchema]:
        """The registered table schemas by table name (read-only)."""
        return self._schemas_view

    @property
    def connection(self) -> sqlite3.Connection:
        """The database connection, for reads. Writes made on it outside ``transaction()``
        are not replicated; never begin or end transactions on it directly."""
        self._check_open()
        return self._conn

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    @property
    def in_transaction(self) -> bool:
        """Whether the apply lock is held (a replica transaction or an internal write)."""
        return self._busy is not None

    @property
    def db_version(self) -> int:
        """The logical clock: the last version this replica committed or saw."""
        self._check_open()
        (version,) = self._conn.execute(
            "SELECT db_version FROM __chrysalis_replica_v1 WHERE singleton = 1"
        ).fetchone()
        return int(version)

    def transaction(self, behavior: TransactionBehavior = "DEFERRED") -> ReplicaTransaction:
        """Take the apply lock and begin a SQLite transaction (``BEGIN <behavior>``).

        Raises ``ReplicaBusyError`` if a replica transaction is already open.
        """
        if behavior not in ("DEFERRED", "IMMEDIATE", "EXCLUSIVE"):
            raise ValueError(f"unknown transaction behavior {quote(behavior)}")
        self._check_open()
        self._acquire()
        transaction = ReplicaTransaction(self, self._conn)
        self._busy = transaction
        try:
            self._conn.execute(f"BEGIN {behavior}")
        except BaseException:
            self._busy = None
            raise
        return transaction

    def apply_changes(self, changes: Iterable[Change]) -> ApplyOutcome:
        """Apply remote changes atomically (one transaction) under last-writer-wins.

        Each change is validated, logged under its original origin tuple (duplicates are
        skipped), advances the clock, and is written to its table only if its
        ``(db_version, site_id, seq)`` beats the row's recorded winner. On any error nothing
        of the chunk is kept. Raises ``MissingSchemaError``, ``InvalidBatchError``,
        ``InvalidMutationError`` or ``ReplicaBusyError``.
        """
        return self._apply(list(changes), None)

    def _apply(
        self, chunk: Sequence[Change], encodings: Sequence[EncodedChange] | None
    ) -> ApplyOutcome:
        """``apply_changes``, optionally with each change's key and row value lists as
        received (``FrameDecoder.chunk_encodings``), which are then stored as they are.

        Why set-based: a chunk holds thousands of changes, and one SQL round trip per step
        per change (log insert, winner lookup, row write, winner update) was the receiver's
        whole cost. So the chunk is validated in Python first, then one staged join answers
        "already logged?" and "current winner?" for every change, the last-writer-wins
        decisions are made in chunk order in Python (exactly as applying the changes one by
        one would), the log rows and each row's final winner are copied from the stage by
        ``INSERT ... SELECT``, and the table writes run in chunk order, each run of one
        statement as one ``executemany``.
        """
        with self._write() as conn:
            origins = {_check_origin(c) for c in chunk}
            if encodings is not None and len(encodings) != len(chunk):
                raise ValueError("one encoding per change is required")
            items: list[tuple[TableSchema, Change, bytes, bytes | None]] = []
            for i, change in enumerate(chunk):
                schema = self._schema(change.table)
                if encodings is None:
                    key_blob, row_blob = _check_change(schema, change)
                else:
                    key_blob, row_blob = encodings[i]
                    _check_received(schema, change, row_blob)
                items.append((schema, change, key_blob, row_blob))
            conn.executemany(_sql.INSERT_ORIGIN, [(s,) for s in sorted(origins)])
            logged, applied, highest = self._apply_items(conn, items) if items else (0, 0, 0)
            if highest:
                conn.execute(_sql.ADVANCE_CLOCK, (highest,))
        self._refresh_origins()
        if logged:
            self._changed()
        return ApplyOutcome(len(chunk), logged, applied)

    def _apply_items(
        self,
        conn: sqlite3.Connection,
        items: Sequence[tuple[TableSchema, Change, bytes, bytes | None]],
    ) -> tuple[int, int, int]:
        """Log, resolve and write validated changes; returns ``(logged, applied, highest
        logged version)``. Runs inside the caller's write transaction."""
        conn.execute(_sql.CLEAR_INCOMING)
        conn.executemany(
            _sql.STAGE_INCOMING,
            [
                (i, c.site_id, c.db_version, c.seq, c.table, key_blob, row_blob)
                for i, (_, c, key_blob, row_blob) in enumerate(items)
            ],
        )
        found = conn.execute(_sql.SELECT_INCOMING).fetchall()
        if len(found) != len(items):
            raise CorruptMetadataError("the change log or the row winners have duplicate keys")
        seen: set[tuple[bytes, int, int]] = set()
        winners: dict[tuple[str, bytes], tuple[int, bytes, int]] = {}
        final: dict[tuple[str, bytes], int] = {}
        new_log: list[int] = []
        writes: list[tuple[TableSchema, Change]] = []
        highest = 0
        for i, ((duplicate, w_version, w_site, w_seq), (schema, change, key_blob, _)) in enumerate(
            zip(found, items, strict=True)
        ):
            version, site, seq = change.db_version, change.site_id, change.seq
            origin = (site, version, seq)
            if duplicate or origin in seen:
                continue
            seen.add(origin)
            new_log.append(i)
            if version > highest:
                highest = version
            row_id = (change.table, key_blob)
            current = winners.get(row_id)
            if current is None and w_version is not None:
                current = (w_version, w_site, w_seq)
            candidate = (version, site, seq)
            if current is not None and candidate <= current:
                continue
            winners[row_id] = candidate
            final[row_id] = i
            writes.append((schema, change))
        logged_set = set(new_log)
        if len(new_log) < len(items):  # drop the duplicates, then log the rest
            conn.executemany(
                _sql.DROP_INCOMING, [(i,) for i in range(len(items)) if i not in logged_set]
            )
        if new_log:
            conn.execute(_sql.LOG_INCOMING)
        _write_rows(conn, writes)
        if len(final) < len(new_log):  # keep one winner per row, then record them
            winning = set(final.values())
            conn.executemany(_sql.DROP_INCOMING, [(i,) for i in new_log if i not in winning])
        if final:
            conn.execute(_sql.RESOLVE_INCOMING)
        conn.execute(_sql.CLEAR_INCOMING)
        return len(new_log), len(writes), highest

    def origins(self) -> tuple[bytes, ...]:
        """Every origin site id this replica knows, in registry (position) order."""
        self._check_open()
        self._refresh_origins()
        return tuple(self._origins)

    def peer_frontier(self, peer: Pid, peer_site_id: bytes) -> dict[bytes, FrontierEntry]:
        """Outbound progress toward the peer incarnation ``(peer, peer_site_id)`` per origin."""
        self._check_open()
        rows = self._conn.execute(
            "SELECT origin_site_id, synced_at, eligible FROM __chrysalis_frontiers_v5 "
            "WHERE peer_pid = ? AND peer_site_id = ? ORDER BY origin_site_id",
            (peer.raw, bytes(peer_site_id)),
        ).fetchall()
        return {site: FrontierEntry(int(at), bool(ok)) for site, at, ok in rows}

    def add_change_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback()`` after every commit that added to the change log; returns a
        function that removes it. Callbacks run after the data is durable; an exception from
        one propagates to the committer (after the commit)."""
        self._listeners.append(callback)

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return remove

    def close(self) -> None:
        """Roll back any open transaction and close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._busy = None
        self._listeners.clear()
        self._conn.close()

    def __enter__(self) -> Replica:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Replica {self._path!r} site={self._site_id.hex()} {state}>"

    # ----------------------------------------------------------------------------------------
    # Internals shared with the transaction and the session

    def _check_open(self) -> None:
        if self._closed:
            raise ReplicaClosedError(f"replica {self._path!r} is closed")

    def _schema(self, table: str) -> TableSchema:
        schema = self._schemas.get(table)
        if schema is None:
            raise MissingSchemaError(f"no local schema for table {quote(table)}")
        return schema

    def _acquire(self) -> None:
        if self._busy is not None:
            raise ReplicaBusyError("a replica transaction is already open")
        if self._conn.in_transaction:
            raise ReplicaBusyError("the connection is inside a transaction begun outside")

    def _release(self, holder: object) -> None:
        if self._busy is holder:
            self._busy = None

    def _changed(self) -> None:
        self._epoch += 1
        for callback in list(self._listeners):
            callback()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """An internal write transaction under the apply lock (``BEGIN IMMEDIATE``)."""
        self._check_open()
        self._acquire()
        token = object()
        self._busy = token
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            self._release(token)

    def _change_marker(self) -> tuple[int, int]:
        """A value that changes whenever the change log may have grown: own commits and
        applies, plus commits by other connections (``PRAGMA data_version``)."""
        self._check_open()
        (data_version,) = self._conn.execute("PRAGMA data_version").fetchone()
        return self._epoch, int(data_version)

    def _refresh_origins(self) -> None:
        rows = self._conn.execute(
            "SELECT position, site_id FROM __chrysalis_origins_v1 WHERE position > ? "
            "ORDER BY position",
            (self._last_position,),
        ).fetchall()
        for position, site in rows:
            if (
                not isinstance(site, bytes)
                or len(site) != SITE_ID_LEN
                or position <= self._last_position
                or site in self._origin_positions
            ):
                raise CorruptMetadataError(
                    f"origin registry entry {position} ({quote(site)}) is invalid"
                )
            self._origins.append(site)
            self._positions.append(position)
            self._origin_positions[site] = position
            self._last_position = position

    def _origins_after(self, position: int) -> list[bytes]:
        """Origin sites registered after ``position`` (refreshing from the database first)."""
        self._refresh_origins()
        return self._origins[bisect.bisect_right(self._positions, position) :]

    @property
    def _origin_position(self) -> int:
        """The position of the newest registered origin."""
        return self._last_position

    def _register_origins(self, sites: Iterable[bytes]) -> None:
        missing = sorted(set(sites) - self._origin_positions.keys())
        if missing:
            with self._write() as conn:
                conn.executemany(_sql.INSERT_ORIGIN, [(s,) for s in missing])
            self._refresh_origins()

    def _attach_session(self, peer: bytes, session: object) -> None:
        self._check_open()
        if peer in self._sessions:
            raise DuplicatePeerError(f"a session with peer {peer.hex()} is already live")
        self._sessions[peer] = session

    def _detach_session(self, peer: bytes, session: object) -> None:
        if self._sessions.get(peer) is session:
            del self._sessions[peer]

    def _load_peer_state(self, peer: bytes, peer_site: bytes) -> _PeerState:
        """The durable outbound state of one peer incarnation (only this replica's sessions
        write it, so two plain reads are consistent)."""
        self._check_open()
        conn = self._conn
        row = conn.execute(
            "SELECT origin_position, eligibility_mode FROM __chrysalis_peer_state_v1 "
            "WHERE peer_pid = ? AND peer_site_id = ?",
            (peer, peer_site),
        ).fetchone()
        if row is None:
            return _PeerState(0, None, frozenset())
        try:
            mode = EligibilityMode(row[1])
        except ValueError:
            raise CorruptMetadataError(f"eligibility mode {quote(row[1])} is invalid") from None
        flag = 1 if mode is EligibilityMode.ALLOW else 0
        sites = conn.execute(
            "SELECT origin_site_id FROM __chrysalis_frontiers_v5 "
            "WHERE peer_pid = ? AND peer_site_id = ? AND eligible = ?",
            (peer, peer_site, flag),
        ).fetchall()
        return _PeerState(int(row[0]), mode, frozenset(s for (s,) in sites))

    def _reconcile_frontier(
        self,
        peer: bytes,
        peer_site: bytes,
        eligibility: Mapping[bytes, bool],
        origin_position: int,
        mode: EligibilityMode,
    ) -> None:
        with self._write() as conn:
            conn.executemany(
                _sql.UPSERT_FRONTIER_ELIGIBLE,
                [(peer, peer_site, site, int(ok)) for site, ok in sorted(eligibility.items())],
            )
            conn.execute(_sql.UPSERT_PEER_STATE, (peer, peer_site, origin_position, int(mode)))

    def _record_ack(self, peer: bytes, peer_site: bytes, advances: Mapping[bytes, int]) -> None:
        with self._write() as conn:
            conn.executemany(
                _sql.ADVANCE_FRONTIER,
                [(peer, peer_site, site, version) for site, version in sorted(advances.items())],
            )

    def _select_for_peer(self, peer: bytes, peer_site: bytes) -> _Selection:
        """The next batch toward a peer: whole (site, version) groups in origin-tuple order,
        at most ``MAX_BATCH_ROWS`` changes (unless the first group alone is larger) and
        ``MAX_BATCH_BYTES`` encoded bytes. ``complete`` is false when changes were left out."""
        self._check_open()
        if self._busy is not None:
            raise ReplicaBusyError("a replica transaction is open")
        encoded: list[bytes] = []
        tables: set[str] = set()
        advances: dict[bytes, int] = {}
        total_bytes = 0
        group: list[bytes] = []
        group_tables: set[str] = set()
        group_key: tuple[bytes, int] | None = None
        group_bytes = 0
        complete = True

        def take_group() -> bool:
            nonlocal total_bytes
            if encoded and (
                total_bytes + group_bytes > MAX_BATCH_BYTES
                or len(encoded) + len(group) > MAX_BATCH_ROWS
            ):
                return False
            assert group_key is not None
            encoded.extend(group)
            tables.update(group_tables)
            advances[group_key[0]] = group_key[1]
            total_bytes += group_bytes
            return True

        cursor = self._conn.execute(_sql.SELECT_FOR_PEER, (peer, peer_site))
        try:
            for site, version, seq, table, key_blob, row_blob in cursor:
                if (site, version) != group_key:
                    if group and not take_group():
                        complete = False
                        break
                    group, group_tables, group_key, group_bytes = [], set(), (site, version), 0
                change = encode_change_parts(table, key_blob, row_blob, version, site, seq)
                group.append(change)
                group_tables.add(table)
                group_bytes += len(change)
                if group_bytes > MAX_BATCH_BYTES:
                    if not encoded:
                        raise ChangeVersionTooLargeError(
                            f"version {version} of site {site.hex()} holds more than "
                            f"{MAX_BATCH_BYTES} bytes of changes"
                        )
                    complete = False
                    break
                if encoded and len(encoded) + len(group) > MAX_BATCH_ROWS:
                    complete = False
                    break
            else:
                if group and not take_group():
                    complete = False
        finally:
            cursor.close()
        return _Selection(tuple(encoded), frozenset(tables), advances, complete)


def _check_table(conn: sqlite3.Connection, schema: TableSchema) -> None:
    """The table created by ``create_sql`` must have exactly the declared columns and a
    unique primary key (the PRIMARY KEY, or a UNIQUE index on exactly those columns)."""
    info = conn.execute(f'PRAGMA table_info("{schema.table}")').fetchall()
    if not info:
        raise InvalidSchemaError(f"create_sql did not create table {quote(schema.table)}")
    actual = {str(r[1]).lower() for r in info}
    declared = {c.lower() for c in schema.columns}
    if actual != declared:
        raise InvalidSchemaError(
            f"table {quote(schema.table)} has columns {sorted(actual)}, "
            f"the schema declares {sorted(declared)}"
        )
    key = {k.lower() for k in schema.primary_key}
    if {str(r[1]).lower() for r in info if r[5]} == key:
        return
    for index in conn.execute(f'PRAGMA index_list("{schema.table}")').fetchall():
        if index[2]:  # unique
            name = str(index[1]).replace('"', '""')
            cols = conn.execute(f'PRAGMA index_info("{name}")').fetchall()
            if {str(c[2]).lower() for c in cols if c[2] is not None} == key and len(cols) == len(
                key
            ):
                return
    raise InvalidSchemaError(
        f"primary key {list(schema.primary_key)} of {quote(schema.table)} is neither the "
        "table's PRIMARY KEY nor covered by a UNIQUE index"
    )


def _check_origin(change: Change) -> bytes:
    if not isinstance(change, Change):
        raise InvalidBatchError(f"not a Change: {type(change).__name__}")
    site = change.site_id
    if not isinstance(site, bytes) or len(site) != SITE_ID_LEN:
        raise InvalidBatchError(f"origin site id {quote(site)} is not 16 bytes")
    if not isinstance(change.db_version, int) or change.db_version <= 0:
        raise InvalidBatchError(f"origin version {quote(change.db_version)} is not positive")
    if not isinstance(change.seq, int) or change.seq < 0:
        raise InvalidBatchError(f"origin sequence number {quote(change.seq)} is negative")
    return site


def _write_rows(conn: sqlite3.Connection, writes: Sequence[tuple[TableSchema, Change]]) -> None:
    """Apply winning changes to their tables in order; each run of consecutive changes that
    use one statement (same table, same kind) is one ``executemany``."""
    start = 0
    while start < len(writes):
        schema, first = writes[start]
        is_delete = first.row is None
        stop = start + 1
        while stop < len(writes):
            other_schema, other = writes[stop]
            if other_schema is not schema or (other.row is None) != is_delete:
                break
            stop += 1
        run = writes[start:stop]
        try:
            if is_delete:
                conn.executemany(schema.delete_sql, [c.key for _, c in run])
            else:
                conn.executemany(schema.upsert_sql, [c.row for _, c in run if c.row is not None])
        except sqlite3.Error as exc:
            raise _to_sql_error(exc, f"applying a change to {quote(schema.table)}") from None
        start = stop


def _check_received(schema: TableSchema, change: Change, row_blob: bytes | None) -> None:
    """Validate a change decoded from the wire against its schema, given its row as received.

    The decoder only produces ``int``, ``float``, ``str``, ``bytes`` and ``None``, so the key
    matches the row's key exactly when the types match and the values are equal (floats by
    their bit pattern, so that ``0.0`` and ``-0.0`` stay different): the same test as
    comparing encodings, without encoding anything."""
    key = change.key
    if len(key) != len(schema.primary_key):
        raise InvalidMutationError(
            f"change of {quote(schema.table)} has {len(key)} key values, "
            f"the table has {len(schema.primary_key)} key columns"
        )
    if any(v is None for v in key):
        raise InvalidMutationError(f"change of {quote(schema.table)} has a NULL key value")
    row = change.row
    if (row is None) != (row_blob is None):
        raise InvalidBatchError("a received change and its encoding disagree")
    if row is None:
        return
    if len(row) != len(schema.columns):
        raise InvalidMutationError(
            f"change of {quote(schema.table)} has {len(row)} row values, "
            f"the table has {len(schema.columns)} columns"
        )
    for j, i in enumerate(schema.key_indexes):
        a, b = key[j], row[i]
        if type(a) is not type(b) or (
            _F64.pack(a) != _F64.pack(b) if isinstance(a, float) else a != b
        ):
            raise InvalidMutationError(
                f"change of {quote(schema.table)} has a key that differs from its row's key"
            )


def _check_change(schema: TableSchema, change: Change) -> tuple[bytes, bytes | None]:
    """Validate a received change against its schema; returns its encoded key and row."""
    key = change.key
    if len(key) != len(schema.primary_key):
        raise InvalidMutationError(
            f"change of {quote(schema.table)} has {len(key)} key values, "
            f"the table has {len(schema.primary_key)} key columns"
        )
    if any(v is None for v in key):
        raise InvalidMutationError(f"change of {quote(schema.table)} has a NULL key value")
    try:
        key_blob = encode_values(key)
        if change.row is None:
            return key_blob, None
        row = change.row
        if len(row) != len(schema.columns):
            raise InvalidMutationError(
                f"change of {quote(schema.table)} has {len(row)} row values, "
                f"the table has {len(schema.columns)} columns"
            )
        row_key_blob, row_blob = encode_row_and_key(row, schema.key_indexes)
        if row_key_blob != key_blob:
            raise InvalidMutationError(
                f"change of {quote(schema.table)} has a key that differs from its row's key"
            )
        return key_blob, row_blob
    except CodecError as exc:
        raise InvalidMutationError(f"change of {quote(schema.table)}: {exc}") from None
