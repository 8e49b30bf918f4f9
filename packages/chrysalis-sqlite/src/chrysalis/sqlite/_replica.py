"""``Replica``: replicated SQLite on a stdlib ``sqlite3`` connection, with row-level LWW.

Why a replica owns its connection: replication state (site id, logical clock, per-row clocks,
origins, per-peer frontiers) lives in the same SQLite database as the application's tables, so
every write to it can share a transaction with the data it describes. The application writes
through ``Replica.transaction()`` (see ``_transaction``).

Metadata lives in ordinary tables, created on open. The layout is local storage, not the wire
(issue 6, see ``_sql``): what peers exchange, the LWW order ``(version, site id, seq)``, the
per-origin frontiers and the origin identities are the protocol's; how a replica remembers
them is not, and this one keeps only what those contracts need:

- ``__chrysalis_replica_v1``: the singleton ``(site_id, db_version)``; the site id is 16 random
  bytes chosen on first open, ``db_version`` is the Lamport clock.
- ``__chrysalis_clock_v1_<table>``: per replicated table, one entry per row ever written or
  received: the row's key and the origin tuple of the change that wins it (the origin as its
  registry position), and whether that change is a delete (a tombstone). The table itself
  holds the winning row; no copy of it is kept.
- ``__chrysalis_versions_v1``: per (origin, version, table), the keys that version wrote; how
  a sender finds "the changes of an origin after a frontier" without an index on every entry,
  and, for local versions above the fold mark ``__chrysalis_folded_v1``, the list of entries
  still to write (the upserts' entries are written after the commit: see ``_fold``).
- ``__chrysalis_origins_v1``: an append-only registry of every origin site seen, with strictly
  increasing positions (sessions discover new origins incrementally by position).
- ``__chrysalis_peer_state_v1`` / ``__chrysalis_frontiers_v5``: per peer incarnation
  ``(peer PID, peer site)``, the outbound eligibility mode and, per origin, the highest version
  the peer acknowledged (``synced_at``) and whether the origin is eligible on that link.

Why only the winning state is kept (and sent): under row-level last-writer-wins a row's value
everywhere ends as that of its greatest change, and a change that lost here can never win
anywhere this replica forwards it to, because the change that beat it travels the same links
(or came from the peer's side of the tree, which then holds it already). So a relay forwards,
per row, only the latest change it holds, with its *original* origin tuple; a change replaced
before it was sent is never sent. The per-origin frontiers keep their meaning: "every change
of this origin up to ``synced_at`` is held by the peer, or replaced there by a greater one".

Remote changes (``apply_changes``) are applied one chunk per transaction: a change equal to its
row's recorded winner is a duplicate and skipped, the clock advances to at least every
version received, and a change is written only if its tuple is greater than the winner's.
Receipt order therefore never decides a winner.

Garbage collection (``collect_garbage``, issue 6): tombstones go once every known peer site
holds them (acknowledged from us, or sent to us: ``__chrysalis_gc_inbound_v1``) and they are
older than a retention horizon (wall time passed in, turned into a version by recorded marks);
version rows go once their version wins none of their keys. Peers that could bring a
collected row back (a forgotten site, or a site first seen after a collection sending an old
row the collected-rows filter may hold) are refused with ``StalePeerError``. Commits keep the
pending (unfolded) backlog bounded (``MAX_PENDING_VERSIONS``, see ``_changed``).

Databases of the earlier layout (a change log ``__chrysalis_changes_v1`` with every row's
payload, and ``__chrysalis_resolved_rows_v2`` with each row's winner) are converted on open,
in the opening transaction: each winner becomes a clock entry, and the old tables are dropped
(see ``_migrate``; one that cannot be converted is refused with ``CorruptMetadataError`` and
left as it was).

Concurrency: one replica is one connection, used from one thread. The "apply lock" of the
reference is the rule that replica transactions do not nest: while the application holds
``transaction()``, anything else that needs the lock (another transaction, a session applying
or selecting changes) raises ``ReplicaBusyError`` instead of interleaving. Other processes may
open the same database file; their commits are noticed through ``PRAGMA data_version``.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import math
import os
import sqlite3
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Final

from chrysalis.core import Pid
from chrysalis.sqlite import _sql
from chrysalis.sqlite._catalog import ReplicaCatalog
from chrysalis.sqlite._clock import DEFAULT_MAX_CLOCK_DRIFT, MAX_ACCEPTED_VERSION, hlc_version
from chrysalis.sqlite._errors import (
    ChangeVersionTooLargeError,
    ClockBoundError,
    CodecError,
    CorruptMetadataError,
    DuplicatePeerError,
    InvalidBatchError,
    InvalidMutationError,
    ReplicaBusyError,
    ReplicaClosedError,
    StalePeerError,
    quote,
)
from chrysalis.sqlite._fold import SET_FOLDED_TO_CLOCK, fold
from chrysalis.sqlite._protocol import Change, EncodedChange, encode_change_parts
from chrysalis.sqlite._schema import TableSchema
from chrysalis.sqlite._scope import SITE_ID_LEN, EligibilityMode
from chrysalis.sqlite._transaction import ReplicaTransaction, TransactionBehavior
from chrysalis.sqlite._values import (
    SqlValue,
    decode_values,
    encode_row_and_key,
    encode_values,
    read_values,
)

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ROWS",
    "ApplyOutcome",
    "FrontierEntry",
    "GarbageCollection",
    "Replica",
]

MAX_BATCH_ROWS: Final = 4096
"""Most changes in one outbound batch (unless its single version group is larger)."""

MAX_BATCH_BYTES: Final = 4 * 1024 * 1024
"""Most encoded change bytes in one outbound batch; one larger version group is an error."""

_F64 = struct.Struct(">d")

FOLD_STEP_KEYS: Final = MAX_BATCH_ROWS
"""Most keys (about: whole versions are folded) one fold transaction writes entries for,
besides the version that reaches it, so that folding a long backlog never holds the write
lock for long (see ``Replica._fold``)."""

FOLD_INLINE_ROWS: Final = 64
"""Most pending version rows ``apply_changes`` folds inside its own transaction (more are
folded first in steps of their own, so that one apply never holds the write lock long)."""

MAX_PENDING_VERSIONS: Final = 256
"""Most local versions a commit leaves pending above the fold mark: the commit that finds a
listed version further above it folds one bounded step (``FOLD_STEP_KEYS``) in a write
transaction of its own, after its own commit, so that a replica that runs no session (no
``Ack`` or apply to fold in) keeps a bounded backlog (see ``Replica._changed``)."""

GC_BUDGET: Final = 4096
"""Default most keys (about: whole version rows) one ``collect_garbage`` call examines."""

GC_FILTER_BITS: Final = 1 << 19
"""Size of the collected-rows Bloom filter (64 KiB): with ``_FILTER_HASHES`` hashes, about
1 % false positives at 50 000 collected rows, 8 % at 100 000 (a false positive refuses a
newcomer's change of a row that was never collected: loud, never silent)."""

_FILTER_HASHES: Final = 4

_MARKS_PER_RETENTION: Final = 8
"""Horizon marks kept per retention span (a new mark once the newest is older than
``retention / _MARKS_PER_RETENTION``): the horizon lags the retention by at most that much."""


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """What ``Replica.apply_changes`` did with one chunk of changes.

    ``received``: changes in the chunk. ``logged``: changes that were not duplicates (a
    duplicate equals the origin tuple its row's winner already has, and is skipped).
    ``applied``: changes that won last-writer-wins and were written to their table;
    ``logged - applied`` lost to a greater winner. (The name is the earlier layout's, which
    logged every change; without a log, a replay of a change that has lost since is counted
    as a losing change, not as a duplicate.)
    """

    received: int
    logged: int
    applied: int

    @property
    def duplicates(self) -> int:
        """Changes equal to their row's recorded winner."""
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
class GarbageCollection:
    """What one ``Replica.collect_garbage`` call did.

    ``tombstones``: clock entries of deleted rows removed. ``version_rows``:
    ``__chrysalis_versions_v1`` rows removed (every key they list won by a later change, or
    collected). ``examined``: keys looked at (about; bounded by the budget). ``wrapped``: the
    scan reached the last version row and starts again from the first next time (so a call
    sequence with ``wrapped`` true has looked at every row once). ``horizon``: the version at
    or below which tombstones were old enough (``retention``) to be collected this time.
    """

    tombstones: int
    version_rows: int
    examined: int
    wrapped: bool
    horizon: int


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


@dataclass(slots=True)
class _Batch:
    """An outbound batch being selected."""

    encoded: list[bytes] = field(default_factory=list)
    tables: set[str] = field(default_factory=set)
    advances: dict[bytes, int] = field(default_factory=dict)
    dead: list[int] = field(default_factory=list)
    size: int = 0

    def take(self, site: bytes, version: int, group: list[tuple[int, str, bytes]]) -> bool:
        """Add one whole version group (``(seq, table, encoded change)`` entries) if it fits;
        an empty group (every entry dead) just moves the origin's advance past it."""
        group_bytes = sum(len(e) for _, _, e in group)
        encoded = self.encoded
        if group_bytes > MAX_BATCH_BYTES and not encoded:
            raise ChangeVersionTooLargeError(
                f"version {version} of site {site.hex()} holds more than "
                f"{MAX_BATCH_BYTES} bytes of changes"
            )
        if encoded and (
            self.size + group_bytes > MAX_BATCH_BYTES or len(encoded) + len(group) > MAX_BATCH_ROWS
        ):
            return False
        group.sort()
        seen: set[int] = set()
        for seq, table, change in group:
            if seq not in seen:  # one entry per (version, seq), however it was found
                seen.add(seq)
                encoded.append(change)
                self.tables.add(table)
                self.size += len(change)
        self.advances[site] = version
        return True


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

    Received versions are bounded (``ClockBoundError`` beyond, see ``_clock``): at most
    ``MAX_ACCEPTED_VERSION``, and, given ``clock`` (wall time in seconds, e.g. ``time.time``:
    passed in, the core reads no clock), at most ``hlc_version(now + max_clock_drift)``; such
    a replica's commits are then at least ``hlc_version(now)`` (a hybrid logical clock).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        schemas: Iterable[TableSchema],
        *,
        timeout: float = 5.0,
        site_id: bytes | None = None,
        clock: Callable[[], float] | None = None,
        max_clock_drift: float = DEFAULT_MAX_CLOCK_DRIFT,
    ) -> None:
        if (
            isinstance(max_clock_drift, bool)
            or not isinstance(max_clock_drift, (int, float))
            or not math.isfinite(max_clock_drift)
            or max_clock_drift < 0
        ):
            raise ValueError("max_clock_drift must be a finite, non-negative number of seconds")
        self._clock = clock
        self._max_clock_drift = float(max_clock_drift)
        # the registered tables, their clocks, key kinds and the local origin (shared with
        # every transaction: see ``_catalog``)
        self._catalog = ReplicaCatalog(schemas)
        if site_id is not None and (not isinstance(site_id, bytes) or len(site_id) != SITE_ID_LEN):
            raise ValueError("site_id must be exactly 16 bytes")
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
        self._site_at: dict[int, bytes] = {}
        self._last_position = 0
        self._gc_rowid = 0  # where the collector's scan of the version rows resumes
        try:
            self._site_id = self._initialise(site_id)
            self._refresh_origins()
            self._catalog.local_origin = self._origin_positions[self._site_id]
            self._fold_all()  # versions a crash left pending (durable since their commit)
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    def _initialise(self, requested_site: bytes | None) -> bytes:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            legacy = {
                str(name)
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_schema WHERE type = 'table' AND name IN (?, ?)",
                    _sql.LEGACY_TABLES,
                )
            }
            for statement in (
                *_sql.METADATA_DDL,
                *_sql.VERSIONS_DDL,
                _sql.FOLDED_DDL,
                *_sql.GC_DDL,
            ):
                conn.execute(statement)
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
            self._catalog.create_tables(conn)
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
            conn.execute(_sql.INIT_FOLDED)
            if legacy:
                self._migrate(conn, legacy)
                conn.execute(SET_FOLDED_TO_CLOCK)
            self._unique_keys()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return site

    def _migrate(self, conn: sqlite3.Connection, legacy: set[str]) -> None:
        """Convert the earlier layout (a change log and a winner table) to clock entries,
        inside the opening transaction (any failure leaves the database as it was).

        The winner table holds exactly what the clock layout keeps: per row, the winning
        origin tuple and whether it is a delete; the tables hold the rows. So each winner
        becomes a clock entry and is listed under its version in ``__chrysalis_versions_v1``;
        frontiers keep their meaning. A winner of a table this replica does not register
        cannot be converted (its key columns' affinities are unknown): that is refused."""
        winners_table, log_table = "__chrysalis_resolved_rows_v2", "__chrysalis_changes_v1"
        if winners_table not in legacy:
            raise CorruptMetadataError(
                f"the database holds {log_table} without {winners_table}: its metadata cannot "
                "be converted to this release's layout"
            )
        winners = conn.execute(
            "SELECT table_name, key_values, db_version, site_id, seq, deleted "
            f"FROM {winners_table} ORDER BY site_id, db_version, seq"
        ).fetchall()
        unknown = sorted({str(t) for t, *_ in winners} - self._catalog.schemas.keys())
        if unknown:
            raise CorruptMetadataError(
                f"the database's earlier metadata has rows of {', '.join(map(quote, unknown))}, "
                "which this replica does not register: register every table to convert it"
            )
        conn.executemany(_sql.INSERT_ORIGIN, [(site,) for site in sorted({w[3] for w in winners})])
        positions = dict(conn.execute("SELECT site_id, position FROM __chrysalis_origins_v1"))
        entries: dict[str, list[tuple[object, ...]]] = {}
        listed: dict[tuple[int, int, str], list[tuple[tuple[SqlValue, ...], bytes]]] = {}
        for table, key_blob, version, site, seq, deleted in winners:
            try:
                key = decode_values(key_blob)
            except CodecError as exc:
                raise CorruptMetadataError(f"a key of {quote(table)} is invalid: {exc}") from None
            position = positions[site]
            entries.setdefault(table, []).append((*key, version, position, seq, deleted))
            listed.setdefault((position, version, table), []).append((key, key_blob))
        for table, rows in entries.items():
            conn.executemany(self._catalog.clocks[table].write, rows)
        conn.executemany(
            _sql.INSERT_VERSION,
            [
                (
                    position,
                    version,
                    table,
                    _version_keys(keys, self._catalog.clocks[table].json_types),
                )
                for (position, version, table), keys in listed.items()
            ],
        )
        for name in sorted(legacy):
            conn.execute(f'DROP TABLE "{name}"')

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
        return self._catalog.schemas_view

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
        transaction = ReplicaTransaction(
            self._catalog,
            self._conn,
            hybrid_now=self._hybrid_now,
            changed=self._changed,
            release=self._release,
        )
        self._busy = transaction
        try:
            self._conn.execute(f"BEGIN {behavior}")
        except BaseException:
            self._busy = None
            raise
        return transaction

    def apply_changes(self, changes: Iterable[Change]) -> ApplyOutcome:
        """Apply remote changes atomically (one transaction) under last-writer-wins.

        Each change is validated, recorded under its original origin tuple (duplicates are
        skipped), advances the clock, and is written to its table only if its
        ``(db_version, site_id, seq)`` beats the row's recorded winner. On any error nothing
        of the chunk is kept. Raises ``MissingSchemaError``, ``InvalidBatchError``,
        ``InvalidMutationError`` or ``ReplicaBusyError``.
        """
        return self._apply(list(changes), None)

    def _apply(
        self,
        chunk: Sequence[Change],
        encodings: Sequence[EncodedChange] | None,
        source: bytes | None = None,
        floor: int = 0,
        peer: str | None = None,
    ) -> ApplyOutcome:
        """``apply_changes``, optionally with each change's key and row value lists as
        received (``FrameDecoder.chunk_encodings``), which the key check then uses instead of
        encoding the decoded values again.

        The chunk is validated in Python first; then, per change in chunk order, one clock
        lookup gives its row's winner (a row met earlier in the chunk uses the winner the
        chunk gave it), the last-writer-wins decisions are made in Python (exactly as applying
        the changes one by one would), the table writes run in chunk order, each run of one
        statement as one ``executemany``, and each row's final winner is written to its clock
        entry with one ``executemany`` per table.

        Pending local versions are folded inside the apply transaction (a remote change must
        be compared with the entry a pending local write gives its row); a backlog of more
        than ``FOLD_INLINE_ROWS`` version rows is first folded in bounded steps of their own.

        ``source``: the peer site the chunk came from (a session's); the same transaction
        records, per origin, the greatest version received from it (what the collector knows
        the peer holds). ``floor``: an upsert of a row with no clock entry here (or only a
        tombstone it would beat), at a version at or below it, of a row the collected-rows
        filter says may have been collected, is
        refused with ``StalePeerError`` (a peer first seen after tombstones up to ``floor``
        were collected: see ``collect_garbage``).

        Every change's version must be at most the accepted bound (``_check_bound``), else the
        whole chunk is refused with ``ClockBoundError`` (naming ``source`` and ``peer``, the
        peer's PID as text, where given) before anything of it is written.
        """
        self._fold_backlog(FOLD_INLINE_ROWS)
        try:
            with self._write() as conn:
                origins = {_check_origin(c) for c in chunk}
                self._check_bound(chunk, source, peer)
                if encodings is not None and len(encodings) != len(chunk):
                    raise ValueError("one encoding per change is required")
                items: list[tuple[TableSchema, Change, bytes]] = []
                for i, change in enumerate(chunk):
                    schema = self._catalog.schema(change.table)
                    if encodings is None:
                        key_blob, _ = _check_change(schema, change)
                    else:
                        key_blob, row_blob = encodings[i]
                        _check_received(schema, change, row_blob)
                    items.append((schema, change, key_blob))
                if origins - self._origin_positions.keys():
                    conn.executemany(_sql.INSERT_ORIGIN, [(s,) for s in sorted(origins)])
                    self._refresh_origins()  # positions of the new origins, for their entries
                if items:
                    self._fold(conn, None)
                logged, applied = self._apply_items(conn, items, floor) if items else (0, 0)
                if source is not None and chunk:
                    received: dict[int, int] = {}
                    for change in chunk:
                        position = self._origin_positions[change.site_id]
                        received[position] = max(received.get(position, 0), change.db_version)
                    conn.executemany(
                        _sql.ADVANCE_INBOUND,
                        [(source, p, v) for p, v in sorted(received.items())],
                    )
                if items:
                    conn.execute(_sql.ADVANCE_CLOCK, (max(c.db_version for c in chunk),))
                    # nothing is pending and every entry is at or below the clock
                    conn.execute(SET_FOLDED_TO_CLOCK)
        except BaseException:
            self._reload_origins()  # positions read inside a rolled-back transaction
            raise
        if applied:
            self._changed()
        return ApplyOutcome(len(chunk), logged, applied)

    def _apply_items(
        self,
        conn: sqlite3.Connection,
        items: Sequence[tuple[TableSchema, Change, bytes]],
        floor: int = 0,
    ) -> tuple[int, int]:
        """Resolve and write validated changes; returns ``(new, applied)``. Runs inside the
        caller's write transaction.

        Per change, in chunk order: its row's current winner (the clock entry, or the change
        of this chunk that won the row before it); a change equal to the winner is a
        duplicate, one below it loses, one above it wins. The winners are written to their
        tables in chunk order and each row's final winner to its clock entry."""
        clocks = self._catalog.clocks
        site_at = self._site_at
        # per row met in this chunk: its winner so far, and whether that winner is a delete
        tracked: dict[tuple[str, bytes], tuple[tuple[int, bytes, int], bool]] = {}
        filter_bits: bytearray | None = None
        final: dict[tuple[str, bytes], tuple[TableSchema, Change, bytes]] = {}
        writes: list[tuple[TableSchema, Change]] = []
        new = 0
        for schema, change, key_blob in items:
            row_id = (schema.table, key_blob)
            current: tuple[int, bytes, int] | None
            if row_id in tracked:
                current, dead = tracked[row_id]
            else:
                found = conn.execute(clocks[schema.table].winner, change.key).fetchone()
                current, dead = None, True
                if found is not None:
                    site = site_at.get(found[1])
                    if site is None:
                        raise CorruptMetadataError(
                            f"a clock entry of {quote(schema.table)} names origin {found[1]}, "
                            "which the origin registry lacks"
                        )
                    current, dead = (found[0], site, found[2]), bool(found[3])
            candidate = (change.db_version, change.site_id, change.seq)
            if current is not None:
                if candidate == current:
                    tracked[row_id] = (current, dead)
                    continue  # a duplicate
                if candidate < current:
                    tracked[row_id] = (current, dead)
                    new += 1
                    continue  # loses to the recorded winner
            if (
                dead
                and change.row is not None
                and change.db_version <= floor
                and _maybe_collected(
                    filter_bits := filter_bits or self._load_filter(conn),
                    schema.table,
                    change.key,
                )
            ):
                # An upsert that would bring a row back, from a peer first seen after
                # collections, at a version a collected tombstone may beat. Here the row has
                # no entry, or only a tombstone older than the upsert: that can only be an
                # older delete a newcomer sent after the collection (every known peer held
                # the collected tombstone or something newer), so it proves nothing.
                raise StalePeerError(
                    f"a change of {quote(schema.table)} at version {change.db_version} "
                    f"of site {change.site_id.hex()} names a row this replica has no entry "
                    "for (or only an older tombstone) and may have deleted and collected, "
                    "from a peer first seen after deletions through version "
                    f"{floor} were collected here: it may be a deleted row coming back; "
                    "rebuild that replica (a new, empty database that syncs before it writes)"
                )
            new += 1
            tracked[row_id] = (candidate, change.row is None)
            final[row_id] = (schema, change, key_blob)
            writes.append((schema, change))
        _write_rows(conn, writes)
        positions = self._origin_positions
        by_table: dict[str, list[tuple[object, ...]]] = {}
        by_version: dict[tuple[int, int, str], list[tuple[tuple[SqlValue, ...], bytes]]] = {}
        for schema, change, key_blob in final.values():
            position = positions[change.site_id]
            by_table.setdefault(schema.table, []).append(
                (*change.key, change.db_version, position, change.seq, int(change.row is None))
            )
            by_version.setdefault((position, change.db_version, schema.table), []).append(
                (change.key, key_blob)
            )
        stable = {table: clocks[table].json_types for table in by_table}
        for table, entries in by_table.items():
            conn.executemany(clocks[table].write, entries)
        conn.executemany(
            _sql.INSERT_VERSION,
            [
                (position, version, table, _version_keys(written, stable[table]))
                for (position, version, table), written in by_version.items()
            ],
        )
        return new, len(writes)

    def _hybrid_now(self) -> int:
        """The hybrid-logical-clock version of the time now, which a commit's version is at
        least (0 for a replica without a clock: a plain Lamport clock)."""
        return 0 if self._clock is None else hlc_version(self._clock())

    def _check_bound(self, chunk: Sequence[Change], source: bytes | None, peer: str | None) -> None:
        """Refuse the chunk (``ClockBoundError``) if a change's version is above the most this
        replica accepts: ``MAX_ACCEPTED_VERSION``, and with a clock the hybrid version of
        ``max_clock_drift`` seconds past the time now (see ``_clock``)."""
        if not chunk:
            return
        highest = max(chunk, key=lambda c: c.db_version)
        bound, reason = MAX_ACCEPTED_VERSION, "MAX_ACCEPTED_VERSION, 2**62"
        if self._clock is not None:
            ahead = hlc_version(self._clock() + self._max_clock_drift)
            if ahead < bound:
                bound = ahead
                reason = (
                    f"the hybrid clock's version of local time plus max_clock_drift, "
                    f"{self._max_clock_drift:g} s"
                )
        if highest.db_version > bound:
            raise ClockBoundError(highest.site_id, highest.db_version, bound, reason, source, peer)

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

    def collect_garbage(
        self, *, now: float, retention: float, budget: int = GC_BUDGET
    ) -> GarbageCollection:
        """Remove metadata no replica can need any more, examining at most about ``budget``
        keys (whole version rows) in one write transaction; returns what was removed.

        Removed: the tombstone of a deleted row (its clock entry, whose only job is to make
        older upserts of the row lose) once no older change of the row can still arrive, and
        every ``__chrysalis_versions_v1`` row whose keys its version no longer wins. A
        tombstone of origin ``O`` at version ``v`` goes when all of these hold:

        - ``v`` is at or below the horizon: the clock this replica had ``retention`` seconds
          before ``now`` (wall time passed in, as recorded by earlier calls; ``retention`` 0:
          the clock now), which protects peers this replica does not know yet;
        - every peer site this replica knows (any session, any incarnation; not forgotten),
          other than ``O`` itself, holds ``O`` up to ``v``: it acknowledged ``O`` at or past
          ``v`` from us, or sent us ``O``'s changes at or past ``v``. Such a peer's winner
          for the row is the tombstone or a greater change, and it sends only its winners
          (whatever it sent before its Ack or before that change reached us first, on the same
          ordered stream, and lost to the tombstone here);
        - for a local tombstone, its version is folded (a pending version still needs its
          tombstone to tell its delete from its upserts; each call folds one bounded step
          first).

        A peer site first seen later may hold a row whose tombstone went: its upserts of rows
        this replica has no entry for (or only a tombstone older than the upsert, which only
        such a peer's older delete can have left), at versions up to what had been collected,
        of rows a
        Bloom filter of the collected rows says may be among them, are refused
        (``StalePeerError``), as is a session with a site dropped by ``forget_peer_site``.

        The scan resumes where the previous call stopped (``wrapped``: it reached the end).
        Raises ``ReplicaBusyError`` while a replica transaction is open.
        """
        self._check_open()
        if not math.isfinite(now) or not math.isfinite(retention) or retention < 0:
            raise ValueError("now must be finite and retention finite and not negative")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise ValueError("budget must be a positive integer")
        tombstones = version_rows = examined = 0
        wrapped = False
        with self._write() as conn:
            self._refresh_origins()
            (clock,) = conn.execute(
                "SELECT db_version FROM __chrysalis_replica_v1 WHERE singleton = 1"
            ).fetchone()
            horizon = self._horizon(conn, float(now), float(retention), int(clock))
            if self._pending():
                self._fold(conn, FOLD_STEP_KEYS)  # one bounded step: folded tombstones may go
            (folded,) = conn.execute(_sql.SELECT_FOLDED).fetchone()
            safe = self._safe_through(conn, horizon, int(folded))
            collected: dict[int, int] = {}
            filter_bits: bytearray | None = None
            rows = conn.execute(_sql.SCAN_VERSIONS, (self._gc_rowid, budget)).fetchall()
            done = 0
            for rowid, origin, version, table, keys in rows:
                if examined >= budget:
                    break
                done += 1
                self._gc_rowid = rowid
                gc = self._catalog.gc_sql.get(table)
                if gc is None or (origin == self._catalog.local_origin and version > folded):
                    examined += 1
                    continue  # an unregistered table's, or a pending local version
                live, listed = self._gc_live(conn, gc, keys, origin, version)
                examined += max(1, listed)
                doomed = (
                    [key for key, deleted in live if deleted]
                    if version <= safe.get(origin, 0)
                    else []
                )
                if doomed:
                    conn.executemany(gc.collect, [(*key, origin, version) for key in doomed])
                    filter_bits = filter_bits or self._load_filter(conn)
                    for key in doomed:
                        for bit in _filter_bits(table, key):
                            filter_bits[bit >> 3] |= 1 << (bit & 7)
                    tombstones += len(doomed)
                    collected[origin] = max(collected.get(origin, 0), version)
                if len(doomed) == len(live):
                    conn.execute(_sql.DELETE_VERSION, (rowid,))
                    version_rows += 1
            if done == len(rows) and len(rows) < budget:
                self._gc_rowid = 0
                wrapped = True
            conn.executemany(_sql.RECORD_COLLECTED, sorted(collected.items()))
            if filter_bits is not None:
                conn.execute(_sql.UPSERT_FILTER, (bytes(filter_bits),))
        return GarbageCollection(tombstones, version_rows, examined, wrapped, horizon)

    def forget_peer_site(self, peer_site_id: bytes) -> bool:
        """Stop waiting for a peer site that will not come back (a decommissioned replica):
        its frontiers, peer states and received-version records are dropped, so it no longer
        holds tombstones back, and a later session with that site is refused with
        ``StalePeerError`` (it may hold rows whose deletions were collected meanwhile; a
        replica rebuilt from an empty database has a new site id). Returns whether the site
        was known."""
        site = bytes(peer_site_id)
        if len(site) != SITE_ID_LEN:
            raise ValueError("peer_site_id must be exactly 16 bytes")
        with self._write() as conn:
            (known,) = conn.execute(
                f"SELECT count(*) FROM ({_sql.KNOWN_PEER_SITES}) WHERE peer_site_id = ?",
                (site,),
            ).fetchone()
            for table in (
                "__chrysalis_frontiers_v5",
                "__chrysalis_peer_state_v1",
                "__chrysalis_gc_inbound_v1",
            ):
                conn.execute(f"DELETE FROM {table} WHERE peer_site_id = ?", (site,))
            conn.execute(
                "INSERT INTO __chrysalis_gc_peers_v1 (peer_site_id, floor, forgotten) "
                "VALUES (?, 0, 1) ON CONFLICT (peer_site_id) DO UPDATE SET forgotten = 1",
                (site,),
            )
        return bool(known)

    def _admit_peer(self, peer_site: bytes) -> int:
        """Record a peer site as known when a session learns it (``Hello``); returns its
        floor (the greatest tombstone version collected before it was first seen: see
        ``_apply``). A forgotten site is refused."""
        with self._write() as conn:
            conn.execute(_sql.ADMIT_PEER, (peer_site,))
            floor, forgotten = conn.execute(_sql.SELECT_PEER_GC, (peer_site,)).fetchone()
        if forgotten:
            raise StalePeerError(
                f"peer site {peer_site.hex()} was forgotten (Replica.forget_peer_site): it may "
                "hold rows whose deletions were collected since; rebuild it from a new, empty "
                "database"
            )
        return int(floor)

    def _load_filter(self, conn: sqlite3.Connection) -> bytearray:
        """The collected-rows Bloom filter (all zeros before the first collection)."""
        row = conn.execute(_sql.SELECT_FILTER).fetchone()
        if row is None:
            return bytearray(GC_FILTER_BITS // 8)
        bits = row[0]
        if not isinstance(bits, bytes) or len(bits) != GC_FILTER_BITS // 8:
            raise CorruptMetadataError("the collected-rows filter has the wrong size")
        return bytearray(bits)

    def _horizon(self, conn: sqlite3.Connection, now: float, retention: float, clock: int) -> int:
        """The version horizon for ``retention`` seconds before ``now``: the clock recorded
        by the newest mark at least that old (0 if none yet; the clock itself for a zero
        retention). Marks older than that one are pruned, and a new mark is recorded once the
        newest is ``retention / _MARKS_PER_RETENTION`` old, so the table stays small."""
        mark = conn.execute(_sql.HORIZON_MARK, (now - retention,)).fetchone()
        horizon = clock if retention == 0 else (int(mark[1]) if mark else 0)
        if mark is not None:
            conn.execute(_sql.PRUNE_MARKS, (mark[0],))
        (last,) = conn.execute(_sql.LAST_MARK).fetchone()
        if last is None or now - float(last) >= retention / _MARKS_PER_RETENTION:
            conn.execute(_sql.INSERT_MARK, (now,))
        return min(horizon, clock)

    def _safe_through(self, conn: sqlite3.Connection, horizon: int, folded: int) -> dict[int, int]:
        """Per origin position, the greatest tombstone version that may be collected: the
        horizon, lowered to what every known peer site (other than the origin) holds of that
        origin, and for the local origin to the fold mark."""
        known = {bytes(s) for (s,) in conn.execute(_sql.KNOWN_PEER_SITES)}
        cover: dict[tuple[bytes, int], int] = {}
        for site, position, through in conn.execute(_sql.COVERAGE):
            pair = (bytes(site), int(position))
            cover[pair] = max(cover.get(pair, 0), int(through))
        safe: dict[int, int] = {}
        for position in self._positions:
            origin_site = self._site_at[position]
            limit = min(horizon, folded) if position == self._catalog.local_origin else horizon
            for site in known:
                if site != origin_site:
                    limit = min(limit, cover.get((site, position), 0))
            safe[position] = limit
        return safe

    def _gc_live(
        self, conn: sqlite3.Connection, gc: _sql.GcSql, keys: object, origin: int, version: int
    ) -> tuple[list[tuple[tuple[SqlValue, ...], bool]], int]:
        """The entries of one version row that its version still wins, as ``(key, deleted)``,
        and how many keys the row lists (about, for JSON: what the budget counts)."""
        if isinstance(keys, str):
            rows = conn.execute(gc.live_json, (keys, origin, version)).fetchall()
            listed = keys.count(",") + 1
        elif isinstance(keys, bytes):
            rows = []
            offset = listed = 0
            while offset < len(keys):
                key, offset = read_values(keys, offset)
                rows += conn.execute(gc.live_one, (*key, origin, version)).fetchall()
                listed += 1
        else:
            raise CorruptMetadataError(f"a version row holds keys of type {type(keys).__name__}")
        return [(tuple(row[:-1]), bool(row[-1])) for row in rows], listed

    def add_change_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback()`` after every commit that captured or applied a change; returns a
        function that removes it. Callbacks run after the data is durable; an exception from
        one propagates to the committer (after the commit)."""
        self._listeners.append(callback)

        def remove() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return remove

    def close(self) -> None:
        """Fold pending local versions (unless a transaction is open), roll back any open
        transaction and close the connection. Idempotent.

        A fold that fails here (the database locked by another process past the timeout, a
        read-only file) is left for the next open: the pending versions are durable."""
        if self._closed:
            return
        if self._busy is None and not self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._fold_all()
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

    def _unique_keys(self) -> frozenset[str]:
        """The tables whose key is still unique (``ReplicaCatalog.unique_keys``)."""
        return self._catalog.unique_keys(self._conn)

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
        conn = self._conn
        if (
            self._busy is None
            and not conn.in_transaction
            and conn.execute(
                _sql.PENDING_BEYOND, (self._catalog.local_origin, MAX_PENDING_VERSIONS)
            ).fetchone()
            is not None
        ):
            # the pending backlog crossed its bound (no session folds it): one bounded step,
            # after the application's commit; a locked database leaves it for the next commit
            with contextlib.suppress(sqlite3.OperationalError), self._write() as write:
                self._fold(write, FOLD_STEP_KEYS)
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
        """A value that changes whenever there may be new changes to send: own commits and
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
            self._site_at[position] = site
            self._last_position = position

    def _reload_origins(self) -> None:
        """Forget the in-memory origin registry and read it again (after a rollback)."""
        self._origins, self._positions = [], []
        self._origin_positions, self._site_at = {}, {}
        self._last_position = 0
        if not self._closed:
            self._refresh_origins()

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
        """Advance the frontiers an ``Ack`` confirms; the same transaction folds a step of
        pending local versions (written while the batch was in flight), so that a streaming
        sender's next selection needs no write transaction (and no ``fsync``) of its own."""
        with self._write() as conn:
            conn.executemany(
                _sql.ADVANCE_FRONTIER,
                [(peer, peer_site, site, version) for site, version in sorted(advances.items())],
            )
            if self._pending():
                self._fold(conn, FOLD_STEP_KEYS)

    def _pending(self) -> bool:
        """Whether local versions are waiting to be folded (one index lookup)."""
        return (
            self._conn.execute(_sql.PENDING_EXISTS, (self._catalog.local_origin,)).fetchone()
            is not None
        )

    def _fold_backlog(self, keep: int) -> None:
        """Fold pending local versions in bounded steps (``_fold_all``) while more than
        ``keep`` version rows are pending (one index range count)."""
        self._check_open()
        while True:
            (rows,) = self._conn.execute(
                _sql.COUNT_PENDING, (self._catalog.local_origin, keep + 1)
            ).fetchone()
            if rows <= keep:
                return
            with self._write() as conn:
                if self._fold(conn, FOLD_STEP_KEYS):
                    return

    def _fold_all(self) -> None:
        """Fold every pending local version, ``FOLD_STEP_KEYS`` keys per write transaction
        (nothing happens, and no transaction begins, when none is pending)."""
        self._check_open()
        while self._pending():
            with self._write() as conn:
                if self._fold(conn, FOLD_STEP_KEYS):
                    return

    def _fold(self, conn: sqlite3.Connection, budget: int | None) -> bool:
        """Write the clock entries of pending local versions inside the caller's write
        transaction, at most about ``budget`` keys (``None``: all); returns whether none is
        left pending (see ``_fold.fold``)."""
        return fold(conn, self._catalog, budget)

    def _select_for_peer(self, peer: bytes, peer_site: bytes) -> _Selection:
        """The next batch toward a peer: whole (site, version) groups in origin-tuple order,
        at most ``MAX_BATCH_ROWS`` changes (unless the first group alone is larger) and
        ``MAX_BATCH_BYTES`` encoded bytes. ``complete`` is false when changes were left out.

        A version's changes are the rows it wrote (``__chrysalis_versions_v1``) whose clock
        entry it still holds; their values are read from the table itself (the clock layout
        keeps no copy), all inside one read transaction so that entries and rows come from one
        snapshot. A row gone from its table is sent as a delete. Version rows found to hold
        no live entry are deleted afterwards (nothing can revive them).

        Pending local versions (above the fold mark, read in the selection's snapshot) are
        selected without folding them, so that a selection never needs a write transaction
        (and, on a file, its ``fsync``): a listed key is sent as the version's change unless
        its entry is newer (``ClockSql.select_pending``). A row written by several pending
        versions is then sent once per version, all with the row as it is now: the receiver
        keeps the last, as a fold would. Pending rows are never taken for dead."""
        self._check_open()
        if self._busy is not None:
            raise ReplicaBusyError("a replica transaction is open")
        conn = self._conn
        if conn.in_transaction:
            raise ReplicaBusyError("the connection is inside a transaction begun outside")
        frontier = conn.execute(
            "SELECT origin_site_id, synced_at FROM __chrysalis_frontiers_v5 "
            "WHERE peer_pid = ? AND peer_site_id = ? AND eligible = 1 ORDER BY origin_site_id",
            (peer, peer_site),
        ).fetchall()
        batch = _Batch()
        complete = True
        conn.execute("BEGIN")
        try:
            self._refresh_origins()
            (folded,) = conn.execute(_sql.SELECT_FOLDED).fetchone()
            for site, synced_at in frontier:
                position = self._origin_positions.get(site)
                if position is None:
                    continue  # no entry can name an origin the registry lacks
                above = folded if position == self._catalog.local_origin else None
                if not self._select_origin(site, position, synced_at, batch, above):
                    complete = False
                    break
        finally:
            conn.execute("COMMIT")
        if batch.dead and self._busy is None:
            with self._write() as write:
                write.executemany(_sql.DELETE_VERSION, [(rowid,) for rowid in batch.dead])
        return _Selection(tuple(batch.encoded), frozenset(batch.tables), batch.advances, complete)

    def _select_origin(
        self, site: bytes, position: int, synced_at: int, batch: _Batch, folded: int | None
    ) -> bool:
        """Add the whole version groups of one origin after ``synced_at`` to ``batch``;
        returns false when the batch is full (changes were left out). ``folded``: for the
        local origin, the fold mark (versions above it are pending)."""
        cursor = self._conn.execute(_sql.SELECT_VERSIONS, (position, synced_at))
        try:
            group: list[tuple[int, str, bytes]] = []
            group_version = 0
            for rowid, version, table, keys in cursor:
                pending = folded is not None and version > folded
                if version != group_version:
                    if group_version and not batch.take(site, group_version, group):
                        return False
                    group, group_version = [], version
                entries = self._live_entries(table, keys, position, version, site, pending)
                if not entries and not pending:
                    batch.dead.append(rowid)
                group.extend(entries)
            if group_version and not batch.take(site, group_version, group):
                return False
        finally:
            cursor.close()
        return True

    def _live_entries(
        self,
        table: str,
        keys: str | bytes,
        position: int,
        version: int,
        site: bytes,
        pending: bool = False,
    ) -> list[tuple[int, str, bytes]]:
        """The entries of one ``__chrysalis_versions_v1`` row that its version still wins,
        each as ``(seq, table, encoded change)`` (``pending``: a local version not folded
        yet, whose keys are JSON)."""
        clock = self._catalog.clocks.get(table)
        if clock is None:
            return []  # a table no longer registered: nothing of it can be sent
        conn = self._conn
        if isinstance(keys, str):
            select = clock.select_pending if pending else clock.select_json
            rows = conn.execute(select, (keys, position, version)).fetchall()
        elif isinstance(keys, bytes):
            rows = []
            offset = 0
            while offset < len(keys):
                key, offset = read_values(keys, offset)
                rows += conn.execute(clock.select_one, (*key, position, version)).fetchall()
        else:
            raise CorruptMetadataError(f"a version row holds keys of type {type(keys).__name__}")
        return [
            (row[0], table, self._encode_entry(table, row, version, site, row[0])) for row in rows
        ]

    def _encode_entry(
        self, table: str, row: tuple[SqlValue, ...], version: int, site: bytes, seq: int
    ) -> bytes:
        """One selected clock entry as an encoded ``Change``: ``row`` is ``(seq, deleted,
        present, clock key..., table row...)``."""
        schema = self._catalog.schemas[table]
        width = len(schema.primary_key)
        if row[1] or not row[2]:
            key_blob = encode_values(row[3 : 3 + width])
            return encode_change_parts(table, key_blob, None, version, site, seq)
        # the key sent is the table row's own (the clock key compares equal to it)
        key_blob, row_blob = encode_row_and_key(row[3 + width :], schema.key_indexes)
        return encode_change_parts(table, key_blob, row_blob, version, site, seq)


def _filter_bits(table: str, key: Sequence[SqlValue]) -> list[int]:
    """The Bloom filter bits of one row: ``_FILTER_HASHES`` positions taken from a BLAKE2b
    digest of the table name and the key's canonical encoding."""
    digest = hashlib.blake2b(
        table.encode() + b"\0" + encode_values(tuple(key)), digest_size=4 * _FILTER_HASHES
    ).digest()
    return [
        int.from_bytes(digest[4 * i : 4 * i + 4], "big") % GC_FILTER_BITS
        for i in range(_FILTER_HASHES)
    ]


def _maybe_collected(bits: bytearray, table: str, key: Sequence[SqlValue]) -> bool:
    """Whether the row may have been collected (false: certainly never)."""
    return all(bits[b >> 3] & (1 << (b & 7)) for b in _filter_bits(table, key))


def _version_keys(
    written: Sequence[tuple[tuple[SqlValue, ...], bytes]], stable: tuple[frozenset[type], ...]
) -> str | bytes:
    """The ``keys`` of a ``__chrysalis_versions_v1`` row: a JSON array when every key value
    has a type its column's affinity keeps (scalars for one key column), else the
    concatenated value lists (also for a text with a NUL, where SQLite's JSON functions would
    end it)."""
    if all(
        type(v) in t and not (type(v) is str and "\0" in v)
        for key, _ in written
        for v, t in zip(key, stable, strict=True)
    ):
        if all(len(key) == 1 for key, _ in written):
            return json.dumps([key[0] for key, _ in written], separators=(",", ":"))
        return json.dumps([list(key) for key, _ in written], separators=(",", ":"))
    return b"".join(blob for _, blob in written)


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
