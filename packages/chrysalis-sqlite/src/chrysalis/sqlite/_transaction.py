"""``ReplicaTransaction``: the application's write path, with explicit capture.

Why explicit capture: the stdlib ``sqlite3`` exposes no session/changeset API, and triggers
would capture writes the application never meant to replicate. So the application runs its own
SQL in a replica transaction and names the rows it changed: ``capture_upsert`` reads the full
row back inside the same transaction (so the captured row is exactly what was stored), and
``capture_delete`` records the key. ``commit`` then, in the *same* SQLite transaction, bumps the
logical clock to a new version ``V``, appends one change-log record per mutation with the
origin tuple ``(V, local site, seq)`` and records that tuple as the row's current winner.
Application rows, log, clock and winners therefore commit or roll back together.

Each transaction is bounded (``MAX_CHANGES_PER_VERSION`` mutations, ``MAX_VERSION_BYTES``
encoded bytes) so that one version always fits one outbound batch.

Why the capture path is shaped for speed: capture overhead is measured against plain inserts
(``benchmarks/sqlite_capture.py``). Per captured row the irreducible work is the read-back (or
``RETURNING``) and the encoding; everything else is batched. Captures are kept as one flat
list ``[table, key, row, table, key, row, ...]`` (no per-row record objects), and ``commit``
appends them to the change log with multi-row ``INSERT`` statements of constant SQL text, then
derives every row winner from those log rows in one ``INSERT ... SELECT`` (see ``_sql``). The
statements and their order are an implementation detail: what commits is exactly one log row
and one winner per mutation, numbered in capture order, as before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Final, Literal

from chrysalis.sqlite import _sql
from chrysalis.sqlite._errors import (
    CodecError,
    CorruptMetadataError,
    InvalidMutationError,
    MissingRowError,
    NonUniqueKeyError,
    ReplicaClosedError,
    TransactionTooLargeError,
    quote,
)
from chrysalis.sqlite._schema import TableSchema
from chrysalis.sqlite._scope import SITE_ID_LEN
from chrysalis.sqlite._values import SqlValue, encode_row_and_key, encode_values

if TYPE_CHECKING:
    from chrysalis.sqlite._replica import Replica

__all__ = [
    "MAX_CHANGES_PER_VERSION",
    "MAX_VERSION_BYTES",
    "ReplicaTransaction",
    "TransactionBehavior",
    "check_key",
]

MAX_CHANGES_PER_VERSION: Final = 4096
"""Most mutations one transaction may capture (one version group always fits one batch)."""

MAX_VERSION_BYTES: Final = 4 * 1024 * 1024
"""Most encoded bytes the mutations of one transaction may take."""

TransactionBehavior = Literal["DEFERRED", "IMMEDIATE", "EXCLUSIVE"]
"""How a replica transaction begins (SQLite's ``BEGIN`` modes)."""

_CHANGE_OVERHEAD: Final = 4 + 1 + 8 + 4 + SITE_ID_LEN + 8
"""Encoded bytes of a change besides its table name, key and row (see ``encode_change``)."""

_MAX_CAPTURE_ITEMS: Final = 3 * MAX_CHANGES_PER_VERSION
"""``MAX_CHANGES_PER_VERSION`` in entries of the flattened capture list."""


class ReplicaTransaction:
    """One SQLite transaction of a ``Replica``, holding the replica's apply lock.

    Run application SQL with ``execute`` / ``executemany`` (or on ``connection``), and name
    every replicated row it changed with ``capture_upsert`` (after the write) or
    ``capture_delete``. ``commit()`` makes the application writes, the change-log records, the
    new logical version and the row winners durable together, and returns the version (``None``
    when nothing was captured). ``rollback()`` discards everything. As a context manager it
    commits on normal exit and rolls back on an exception. At most
    ``MAX_CHANGES_PER_VERSION`` mutations and ``MAX_VERSION_BYTES`` encoded bytes may be
    captured (``TransactionTooLargeError``).
    """

    __slots__ = ("_bytes", "_captures", "_conn", "_cursor", "_open", "_replica", "version")

    def __init__(self, replica: Replica, conn: sqlite3.Connection) -> None:
        self._replica = replica
        self._conn = conn
        self._cursor = conn.cursor()  # reused by every capture (no cursor object per row)
        # ``table, key_blob, row_blob`` per mutation, flattened (``row_blob`` None: a delete)
        self._captures: list[str | bytes | None] = []
        self._bytes = 0
        self._open = True
        self.version: int | None = None
        """The version this transaction committed (``None`` before, or with no captures)."""

    @property
    def connection(self) -> sqlite3.Connection:
        """The underlying connection (inside this transaction until it ends)."""
        return self._conn

    @property
    def is_open(self) -> bool:
        """Whether the transaction can still be used."""
        return self._open

    @property
    def pending_mutations(self) -> int:
        """Mutations captured so far."""
        return len(self._captures) // 3

    def _check_open(self) -> None:
        if not self._open:
            raise ReplicaClosedError("the replica transaction has already ended")

    def execute(
        self, sql: str, parameters: Sequence[object] | Mapping[str, object] = ()
    ) -> sqlite3.Cursor:
        """Run one application statement inside the transaction."""
        self._check_open()
        return self._conn.execute(sql, parameters)

    def executemany(
        self, sql: str, parameters: Iterable[Sequence[object] | Mapping[str, object]]
    ) -> sqlite3.Cursor:
        """Run one application statement for each parameter set, inside the transaction."""
        self._check_open()
        return self._conn.executemany(sql, parameters)

    def capture_upsert(self, table: str, key: Sequence[object]) -> None:
        """Capture the current full row of ``table`` with primary key ``key``.

        The row is read inside this transaction, so it is exactly what the transaction wrote.
        The captured key is taken from the stored row (its stored types). Raises
        ``MissingSchemaError``, ``InvalidMutationError`` (key arity, NULL key, value SQLite
        cannot hold), ``MissingRowError``, ``NonUniqueKeyError`` or
        ``TransactionTooLargeError``.
        """
        self._check_open()
        schema = self._replica._schema(table)
        params = check_key(schema, key)
        cursor = self._cursor
        cursor.execute(schema.select_row_sql, params)
        rows = cursor.fetchmany(2)
        if not rows:
            raise MissingRowError(f"no row of {quote(table)} has key {quote(params)}")
        if len(rows) > 1:
            raise NonUniqueKeyError(f"several rows of {quote(table)} have key {quote(params)}")
        self._capture_row(schema, rows[0])

    def upsert(self, table: str, row: Sequence[object]) -> tuple[SqlValue, ...]:
        """Write the full ``row`` of ``table`` (insert, or update on a key conflict) and capture
        it, in one statement; returns the row as stored (after SQLite's type affinity, with an
        ``INTEGER PRIMARY KEY`` given as ``None`` filled in).

        Equivalent to an application upsert followed by ``capture_upsert``. ``row`` lists every
        column in ``columns`` order. Raises what ``capture_upsert`` raises,
        ``InvalidMutationError`` for a row of the wrong length, and ``sqlite3`` errors from the
        write itself.
        """
        self._check_open()
        schema = self._replica._schema(table)
        if len(row) != len(schema.columns):
            raise InvalidMutationError(
                f"table {quote(table)} has {len(schema.columns)} columns, got {len(row)} values"
            )
        cursor = self._cursor
        cursor.execute(schema.upsert_returning_sql, row)
        stored = cursor.fetchone()
        if stored is None:  # a keys-only table whose row already existed (DO NOTHING)
            stored = self._conn.execute(schema.select_row_sql, schema.key_of(row)).fetchone()
            if stored is None:
                raise MissingRowError(f"the upsert into {quote(table)} left no row")
        return self._capture_row(schema, stored)

    def delete(self, table: str, key: Sequence[object]) -> bool:
        """Delete the row of ``table`` with primary key ``key`` and capture the deletion;
        returns whether a row was there. The deletion is captured either way, so it also wins
        over older concurrent upserts of that key elsewhere."""
        self._check_open()
        schema = self._replica._schema(table)
        params = check_key(schema, key)
        deleted = self._conn.execute(schema.delete_sql, params).rowcount > 0
        self._capture_key(schema, params)
        return deleted

    def _capture_row(self, schema: TableSchema, row: tuple[SqlValue, ...]) -> tuple[SqlValue, ...]:
        for i in schema.key_indexes:
            if row[i] is None:
                raise InvalidMutationError(f"the stored key of {quote(schema.table)} is NULL")
        try:
            key_blob, row_blob = encode_row_and_key(row, schema.key_indexes)
        except CodecError as exc:
            msg = f"row of {quote(schema.table)} cannot be replicated: {exc}"
            raise InvalidMutationError(msg) from None
        self._push(schema.table, key_blob, row_blob)
        return row

    def capture_delete(self, table: str, key: Sequence[object]) -> None:
        """Capture the deletion of the row of ``table`` with primary key ``key``.

        The application deletes the row itself (before or after this call, in the same
        transaction). Raises ``MissingSchemaError``, ``InvalidMutationError`` or
        ``TransactionTooLargeError``.
        """
        self._check_open()
        schema = self._replica._schema(table)
        self._capture_key(schema, check_key(schema, key))

    def _capture_key(self, schema: TableSchema, key: tuple[object, ...]) -> None:
        try:
            key_blob = encode_values(key)
        except CodecError as exc:
            msg = f"key of {quote(schema.table)} cannot be replicated: {exc}"
            raise InvalidMutationError(msg) from None
        self._push(schema.table, key_blob, None)

    def _push(self, table: str, key_blob: bytes, row_blob: bytes | None) -> None:
        captures = self._captures
        size = _CHANGE_OVERHEAD + len(table) + len(key_blob) + len(row_blob or b"")
        if len(captures) >= _MAX_CAPTURE_ITEMS:
            raise TransactionTooLargeError(
                f"a transaction may capture at most {MAX_CHANGES_PER_VERSION} mutations"
            )
        if self._bytes + size > MAX_VERSION_BYTES:
            raise TransactionTooLargeError(
                f"a transaction may capture at most {MAX_VERSION_BYTES} encoded bytes"
            )
        self._bytes += size
        captures += (table, key_blob, row_blob)

    def commit(self) -> int | None:
        """Commit; returns the new logical version, or ``None`` when nothing was captured.

        On any error the transaction is rolled back and the error re-raised.
        """
        self._check_open()
        conn = self._conn
        captures = self._captures
        try:
            if not captures:
                conn.execute("COMMIT")
            else:
                (version,) = conn.execute(_sql.BUMP_CLOCK).fetchone()
                site = self._replica.site_id
                _append_local_changes(conn, site, version, captures)
                conn.execute(_sql.RESOLVE_LOCAL_VERSION, (site, version))
                conn.execute("COMMIT")
                self.version = version
        except BaseException:
            self._end(rollback=True)
            raise
        self._end(rollback=False)
        if captures:
            self._replica._changed()
        return self.version

    def rollback(self) -> None:
        """Discard the transaction (application writes and captures). Idempotent."""
        if self._open:
            self._end(rollback=True)

    def _end(self, *, rollback: bool) -> None:
        self._open = False
        self._captures = []
        self._cursor.close()
        try:
            if rollback and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        finally:
            self._replica._release(self)

    def __enter__(self) -> ReplicaTransaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            if self._open:
                self.commit()
        else:
            self.rollback()


def _append_local_changes(
    conn: sqlite3.Connection, site: bytes, version: int, captures: list[str | bytes | None]
) -> None:
    """Append the flattened ``captures`` to the change log as ``(site, version, 0..n-1)``, in
    chunks of ``_sql.LOCAL_CHUNK_SIZES`` rows, largest first."""
    count = len(captures) // 3
    seq = 0
    try:
        for size in _sql.LOCAL_CHUNK_SIZES:
            sql = _sql.INSERT_LOCAL_CHANGES[size]
            while count - seq >= size:
                conn.execute(sql, [site, version, seq, *captures[3 * seq : 3 * (seq + size)]])
                seq += size
    except sqlite3.IntegrityError as exc:
        raise CorruptMetadataError(
            f"local version {version} is already in the change log (the clock is behind the "
            f"log): {exc}"
        ) from None


def check_key(schema: TableSchema, key: Sequence[object]) -> tuple[object, ...]:
    """``key`` as a tuple of bind parameters, after checking its arity and that no value is
    NULL (``InvalidMutationError``)."""
    if type(key) is tuple:
        params: tuple[object, ...] = key
    elif isinstance(key, str | bytes) or not isinstance(key, Sequence):
        raise InvalidMutationError(f"key of {quote(schema.table)} must be a sequence of values")
    else:
        params = tuple(key)
    if len(params) != len(schema.primary_key):
        raise InvalidMutationError(
            f"table {quote(schema.table)} has {len(schema.primary_key)} key columns, "
            f"got {len(params)} key values"
        )
    if None in params:
        raise InvalidMutationError(f"key of {quote(schema.table)} contains NULL")
    return params
