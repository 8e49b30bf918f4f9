"""``ReplicaTransaction``: the application's write path, with explicit capture.

Why explicit capture: the stdlib ``sqlite3`` exposes no session/changeset API, and triggers
would capture writes the application never meant to replicate. So the application runs its own
SQL in a replica transaction and names the rows it changed (``capture_upsert`` /
``capture_delete``). ``commit`` then, in the *same* SQLite transaction, bumps the logical clock
to a new version ``V`` and lists the keys ``V`` wrote (``__chrysalis_versions_v1``); each
captured row's clock entry becomes the origin tuple ``(V, local site, seq)`` (``seq``: the
capture's index in the transaction; the last capture of a row wins). Application rows, clock
and list commit or roll back together.

Why captures are only remembered until the commit (issue 6): the clock layout keeps no copy of
a row, so a capture needs only the row's key. The commit checks a table's captured upserts
with one aggregate query over the keys as JSON joined with the table (see ``_sql``): rows
found (``MissingRowError``, ``NonUniqueKeyError``) and their size (the byte bound), the errors
a read-back used to raise at capture time, now raised by ``commit``, which then rolls the whole
transaction back. A capture costs one Python call and no SQL. The upserts' clock entries are
not written at commit: a later fold writes them from the list (``_fold.fold``), since the
entry's B-tree insert cost as much as the application's own insert; deletes write their
tombstones at commit. Keys JSON cannot name exactly (``7`` captured on a TEXT key, BLOBs) and
tables whose key is not known unique take the earlier path: the entries are written at commit,
after folding the pending versions.

Each transaction is bounded (``MAX_CHANGES_PER_VERSION`` mutations, ``MAX_VERSION_BYTES``
encoded bytes, checked with an upper bound of the rows' encodings) so that one version always
fits one outbound batch.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from types import NoneType, TracebackType
from typing import Final, Literal, Protocol

from chrysalis.sqlite import _sql
from chrysalis.sqlite._catalog import ReplicaCatalog
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
from chrysalis.sqlite._fold import fold
from chrysalis.sqlite._schema import TableSchema
from chrysalis.sqlite._scope import SITE_ID_LEN
from chrysalis.sqlite._values import MAX_BYTES, SqlValue, encode_values

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

_ROW_CHECKS_CACHE: Final = 256
"""Most column type patterns whose compiled ``tx.upsert`` row writer the process keeps."""

_ESCAPED_ASCII: Final = bytes(range(0x20)) + b'\x7f\\"'
"""ASCII characters a key text cannot hold as they are in ``_json_array``'s quick JSON:
the unprintable ones (as ``str.isprintable`` says), the backslash and the quote."""

_first: Final = itemgetter(0)
"""A captured key's first value (a C call per key, cheaper than a comprehension)."""

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1


class ReplicaTransaction:
    """One SQLite transaction of a ``Replica``, holding the replica's apply lock.

    Run application SQL with ``execute`` / ``executemany`` (or on ``connection``), and name
    every replicated row it changed with ``capture_upsert`` (after the write) or
    ``capture_delete``. ``commit()`` makes the application writes, the new logical version and
    the rows' clock entries durable together, and returns the version (``None`` when nothing
    was captured). ``rollback()`` discards everything. As a context manager it commits on
    normal exit and rolls back on an exception. At most ``MAX_CHANGES_PER_VERSION`` mutations
    (``TransactionTooLargeError`` from the capture) and ``MAX_VERSION_BYTES`` encoded bytes
    (from ``commit``) may be captured.
    """

    __slots__ = (
        "_catalog",
        "_changed",
        "_conn",
        "_deletes",
        "_fast",
        "_fast_table",
        "_hybrid_now",
        "_json",
        "_keys",
        "_open",
        "_plans",
        "_release",
        "_schemas",
        "_specialized",
        "_stable_rows",
        "_tables",
        "_text_keyed",
        "execute",
        "upsert",
        "version",
    )

    execute: _Execute
    """Run one application statement inside the transaction: ``tx.execute(sql,
    parameters=())``, positional arguments only; raises ``ReplicaClosedError`` once the
    transaction has ended.

    Why an attribute, not a method: it *is* the connection's own ``execute`` while the
    transaction is open (swapped for a function that raises when it ends), since a wrapper
    method's call cost about 0.3 µs per statement, a tenth of a plain insert."""

    upsert: _Upsert
    """Write the full ``row`` of ``table`` (insert, or update on a key conflict) and capture
    it: ``tx.upsert(table, row)``; returns the row as stored (after SQLite's type affinity,
    with an ``INTEGER PRIMARY KEY`` given as ``None`` filled in).

    Equivalent to an application upsert followed by ``capture_upsert``. ``row`` lists every
    column in ``columns`` order. Raises what ``capture_upsert`` raises,
    ``InvalidMutationError`` for a row of the wrong length, ``sqlite3`` errors from the write
    itself, and ``ReplicaClosedError`` once the transaction has ended.

    Why an attribute, not a method: once the transaction's captures are the fast ones (one
    table with one TEXT key, see ``capture_upsert``) and ``table``'s rows keep their value
    types, it is a function compiled for that table's column type pattern
    (``_fast_upserter``) that checks the row's types, runs the upsert and appends the key in
    one Python frame (the method and the row writer it called cost about 500 instructions
    per row more, a quarter of a plain insert); any other row, table or state goes to the
    general path (``_upsert_general``), and any change of the fast state (``_spill``, the
    end) puts the general path back."""

    def __init__(
        self,
        catalog: ReplicaCatalog,
        conn: sqlite3.Connection,
        *,
        hybrid_now: Callable[[], int],
        changed: Callable[[], None],
        release: Callable[[ReplicaTransaction], None],
    ) -> None:
        """Made by ``Replica.transaction()``, which has begun nothing yet: ``catalog`` is the
        replica's (its tables, clocks, key kinds and local origin), ``conn`` its connection;
        ``hybrid_now()`` gives the version a commit is at least, ``changed()`` runs after a
        commit that captured something, and ``release(tx)`` gives the apply lock back when
        the transaction ends."""
        self._catalog = catalog
        self._conn = conn
        self._hybrid_now = hybrid_now
        self._changed = changed
        self._release = release
        self._schemas = catalog.schemas
        self._text_keyed = catalog.text_keyed
        self._stable_rows = catalog.stable_rows
        # The fast captures (see ``capture_upsert``): while every capture of the transaction
        # is an upsert of one table with one TEXT key given as an ASCII ``str``, only the key
        # texts are kept, in order, and ``_fast_table`` names the table ("" otherwise, and
        # once the transaction has ended, so that the fast path's one comparison also
        # refuses a closed transaction). Any other capture moves them to the general lists.
        self._fast: list[str] = []
        self._fast_table = ""
        # the general lists, per capture in order: table name and key values; and which
        # captures are deletes
        self._tables: list[str] = []
        self._keys: list[tuple[SqlValue, ...]] = []
        self._deletes: set[int] = set()
        # per table ``tx.upsert`` wrote in this transaction: its row check, upsert statement
        # and key column (emptied when the transaction ends)
        self._plans: dict[str, _UpsertPlan] = {}
        self._specialized = False  # whether ``upsert`` is the fast table's compiled function
        self.upsert = self._upsert_general
        self._json = catalog.json_capture  # every key so far is TEXT or INTEGER
        self._open = True
        self.execute = conn.execute
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
        return len(self._keys) + len(self._fast)

    def _check_open(self) -> None:
        if not self._open:
            raise ReplicaClosedError("the replica transaction has already ended")

    def executemany(
        self, sql: str, parameters: Iterable[Sequence[object] | Mapping[str, object]]
    ) -> sqlite3.Cursor:
        """Run one application statement for each parameter set, inside the transaction."""
        self._check_open()
        return self._conn.executemany(sql, parameters)

    def capture_upsert(self, table: str, key: Sequence[object]) -> None:
        """Capture the row of ``table`` with primary key ``key`` as written by this
        transaction.

        Nothing is read now: ``commit`` records the row's key as stored (after type affinity)
        and raises ``MissingRowError`` if the row no longer exists then (unless a later
        ``capture_delete`` of the same key replaced this capture) or ``NonUniqueKeyError`` if
        the key finds several rows. Raises ``MissingSchemaError``, ``InvalidMutationError`` (key
        arity, NULL key, a value SQLite cannot hold) or ``TransactionTooLargeError`` at once.
        """
        # The fast path, a Python call per captured row and nothing else (every check here
        # is paid per row, so it is as few bytecodes as the checks allow): the table of the
        # transaction's fast captures (registered, one TEXT key column, the transaction open),
        # a one-value tuple (the unpacking checks the arity), an ASCII text (valid as it is;
        # a NUL in it is searched for at commit) and room for one more capture.
        if table == self._fast_table and type(key) is tuple:
            try:
                (value,) = key
            except ValueError:
                pass
            else:
                if type(value) is str and value.isascii():
                    fast = self._fast
                    if len(fast) < MAX_CHANGES_PER_VERSION:
                        fast.append(value)
                        return
        self._check_open()
        schema = self._catalog.schema(table)
        params = check_key(schema, key)
        value = params[0]
        if type(value) is str and self._start_fast(table):
            if not value.isascii():
                _check_text(schema, value)
            self._fast.append(value)
            return
        self._push(schema, params, False)

    def _start_fast(self, table: str) -> bool:
        """Whether a capture of ``table`` whose one key value is a text goes to the
        fast captures: it is the fast table, or nothing was captured yet and ``table`` has
        one TEXT key column (it then becomes the fast table). Called with the transaction
        open and ``table`` registered."""
        if table == self._fast_table:
            return len(self._fast) < MAX_CHANGES_PER_VERSION
        if self._fast_table or self._keys or not self._json or table not in self._text_keyed:
            return False
        self._fast_table = table
        return True

    def _spill(self) -> None:
        """Move the fast captures to the general lists and end the fast path for the rest of
        the transaction (a capture it cannot take, or a commit that needs the general
        path). In fast mode the general lists are empty, so the order is kept."""
        fast = self._fast
        if fast:
            self._tables = [self._fast_table] * len(fast)
            self._keys = [(value,) for value in fast]
            self._fast = []
        self._fast_table = ""
        if self._specialized:  # the compiled ``upsert`` appends to the old fast list
            self._specialized = False
            self.upsert = self._upsert_general

    def _upsert_general(self, table: str, row: Sequence[object]) -> tuple[SqlValue, ...]:
        """``upsert``'s general path (see ``upsert``): any table, row and state. Once a row
        has gone to the fast captures of ``table`` and the table has a compiled fast upserter,
        that becomes ``upsert`` for the rest of the fast mode."""
        try:
            write, sql, fast_upserter = self._plans[table]
        except KeyError:  # the first upsert of ``table`` in this transaction, or it ended
            write, sql, fast_upserter = self._plan(table)
        stored: tuple[SqlValue, ...] = tuple(row)  # type: ignore[arg-type]
        if write(self, stored, sql, table):  # stored exactly as given, and captured
            if fast_upserter is not None and table == self._fast_table and not self._specialized:
                self._specialized = True
                self.upsert = fast_upserter(
                    self._conn.execute, sql, self._fast, table, self._upsert_general
                )
            return stored
        stored = self._upsert_returning(table, stored)
        if table == self._fast_table:
            value = stored[self._schemas[table].key_indexes[0]]
            if type(value) is str:  # read back by ``sqlite3``: valid
                fast = self._fast
                if len(fast) < MAX_CHANGES_PER_VERSION:
                    fast.append(value)
                    return stored
        self._capture_stored(table, stored)
        return stored

    def _capture_stored(self, table: str, stored: tuple[SqlValue, ...]) -> None:
        """Capture the row ``upsert`` wrote (``stored``) when the fast captures cannot take it
        as they are: the first capture of the transaction, another key type or table."""
        schema = self._schemas[table]
        key = tuple(stored[i] for i in schema.key_indexes)
        if None in key:
            raise InvalidMutationError(f"the stored key of {quote(table)} is NULL")
        value = key[0]
        if type(value) is str and self._start_fast(table):
            if not value.isascii():
                _check_text(schema, value)
            self._fast.append(value)
            return
        self._push(schema, key, False)

    def _plan(self, table: str) -> _UpsertPlan:
        """``upsert``'s per-table plan for this transaction (checks that it is open and
        ``table`` registered): the row writer (the fast path for rows stored exactly as
        given, compiled per column type pattern, see ``_row_writer``) and the upsert
        statement."""
        self._check_open()
        schema = self._catalog.schema(table)
        stable = self._stable_rows.get(table)
        key_index = schema.key_indexes[0] if table in self._text_keyed else -1
        write = _never_exact if stable is None else _row_writer(stable, key_index)
        fast_upserter = None
        if stable is not None and key_index >= 0:
            fast_upserter = _fast_upserter(stable, key_index)
        plan = (write, schema.upsert_sql, fast_upserter)
        self._plans[table] = plan
        return plan

    def _upsert_returning(self, table: str, row: tuple[SqlValue, ...]) -> tuple[SqlValue, ...]:
        """``upsert``'s write of a row SQLite may store otherwise than given (or of the wrong
        length): the stored row read back with ``RETURNING``."""
        schema = self._schemas[table]
        if len(row) != len(schema.columns):
            raise InvalidMutationError(
                f"table {quote(table)} has {len(schema.columns)} columns, got {len(row)} values"
            )
        stored: tuple[SqlValue, ...] | None
        stored = self._conn.execute(schema.upsert_returning_sql, row).fetchone()
        if stored is None:  # a keys-only table whose row already existed (DO NOTHING)
            stored = self._conn.execute(schema.select_row_sql, schema.key_of(row)).fetchone()
            if stored is None:
                raise MissingRowError(f"the upsert into {quote(table)} left no row")
        return stored

    def delete(self, table: str, key: Sequence[object]) -> bool:
        """Delete the row of ``table`` with primary key ``key`` and capture the deletion;
        returns whether a row was there. The deletion is captured either way, so it also wins
        over older concurrent upserts of that key elsewhere."""
        self._check_open()
        schema = self._catalog.schema(table)
        params = check_key(schema, key)
        self._push(schema, params, True)  # checks the key before anything is deleted
        return self._conn.execute(schema.delete_sql, params).rowcount > 0

    def capture_delete(self, table: str, key: Sequence[object]) -> None:
        """Capture the deletion of the row of ``table`` with primary key ``key``.

        The application deletes the row itself (before or after this call, in the same
        transaction). Raises ``MissingSchemaError``, ``InvalidMutationError`` or
        ``TransactionTooLargeError``.
        """
        self._check_open()
        schema = self._catalog.schema(table)
        self._push(schema, check_key(schema, key), True)

    def _push(self, schema: TableSchema, key: tuple[object, ...], deleted: bool) -> None:
        """Check ``key`` and append the capture to the general lists (after the fast
        captures, moved there first)."""
        if self._fast_table:
            self._spill()
        keys = self._keys
        if len(keys) >= MAX_CHANGES_PER_VERSION:
            raise TransactionTooLargeError(
                f"a transaction may capture at most {MAX_CHANGES_PER_VERSION} mutations"
            )
        stable = self._catalog.clocks[schema.table].json_types
        for value, types in zip(key, stable, strict=True):
            kind = type(value)
            if kind is str:
                if not value.isascii():  # type: ignore[attr-defined]
                    _check_text(schema, value)  # type: ignore[arg-type]
                if "\0" in value:  # type: ignore[operator]
                    self._json = False  # SQLite's JSON functions end a text at a NUL
            elif kind is int:
                if not _I64_MIN <= value <= _I64_MAX:  # type: ignore[operator]
                    _invalid(schema, "integer out of 64-bit range")
            else:
                key = _check_other(schema, key)
                self._json = False
                break
            if kind not in types:
                self._json = False
        if deleted:
            self._deletes.add(len(keys))
        self._tables.append(schema.table)
        keys.append(key)  # type: ignore[arg-type]

    def commit(self) -> int | None:
        """Commit; returns the new logical version, or ``None`` when nothing was captured.

        Raises (after rolling everything back) ``MissingRowError`` for a captured upsert whose
        row is gone, ``NonUniqueKeyError``, ``TransactionTooLargeError`` when the captured rows
        may take more than ``MAX_VERSION_BYTES`` encoded, and ``CorruptMetadataError`` when a
        clock entry is newer than the new version (the clock is behind its entries). On any
        error the transaction is rolled back and the error re-raised.
        """
        self._check_open()
        conn = self._conn
        captured = bool(self._keys) or bool(self._fast)
        try:
            if captured:
                conn.execute(_sql.BUMP_CLOCK, (self._hybrid_now(),))
                self.version = self._write_clock()
            conn.execute("COMMIT")
        except BaseException:
            self.version = None
            self._end(rollback=True)
            raise
        self._end(rollback=False)
        if captured:
            self._changed()
        return self.version

    def _write_clock(self) -> int:
        """After ``BUMP_CLOCK``: list, per table, the keys the new version wrote
        (``__chrysalis_versions_v1``) and check the captures (rows present, keys unique, bytes
        bounded, the clock above its entries); returns the version. The rows' clock entries
        ``(version, local origin, seq)`` of upserts are written later by ``_fold.fold``
        (deferred); deletes' tombstones are written now.

        Only versions whose keys are listed as JSON (every key's type one its column's
        affinity keeps) in tables whose key is known unique are deferred: one aggregate query
        per table counts and measures the captured rows. Others write their entries here
        with the per-row or quota statements, after folding the pending versions (entries
        are written in version order), and move the fold mark to this version."""
        catalog = self._catalog
        origin = catalog.local_origin
        fast = self._fast
        if fast:  # the fast captures: upserts of one table with one TEXT key, as texts
            deferred = self._defer_text(self._schemas[self._fast_table], fast, origin)
            if deferred is not None:
                return deferred
            self._spill()  # a NUL in a key (``_json`` is off now), or a key not known unique
        conn = self._conn
        version, floor = conn.execute(_sql.CLOCK_STATE, (origin,)).fetchone()
        _check_clock(version, floor)
        tables, keys, delete_seqs = self._tables, self._keys, self._deletes
        n = len(keys)
        if self._json:
            table = tables[0]
            if (
                not delete_seqs
                and tables.count(table) == n
                and table in catalog.unique_keys(conn)
                and self._defer_one_table(self._schemas[table], version, origin)
            ):
                return int(version)
            self._check_nul()
        if not self._json:
            self._normalize_keys()
        names = set(tables)
        # the common case: one table, upserts only, each row captured once
        simple = len(names) == 1 and not delete_seqs and len(set(keys)) == n
        last: dict[tuple[str, tuple[SqlValue, ...]], int] = {}
        if not simple:
            # the last capture of each (table, key) stands for the row; earlier ones are dropped
            last = dict(zip(zip(tables, keys, strict=True), range(n), strict=True))
        total = 0
        captures = n if simple else len(last)
        unique = catalog.unique_keys(conn)
        defer = self._json and names <= unique
        if not defer:
            fold(conn, catalog, None)
        estimated: list[tuple[TableSchema, _sql.ClockSql, list[int], str | None]] = []
        for table in sorted(names):
            schema = self._schemas[table]
            clock = catalog.clocks[table]
            width = len(schema.primary_key)
            upserts: list[int] = []
            deletes: list[int] = []
            if simple:
                upserts = list(range(n))
            else:
                for (name, _), seq in last.items():
                    if name == table:
                        (deletes if seq in delete_seqs else upserts).append(seq)
                upserts.sort()
                deletes.sort()
            json_ok = self._json
            if upserts:
                entries = self._entries(upserts, width) if json_ok else None
                if defer:
                    total += self._measure(schema, clock, upserts, entries, version)
                else:
                    bound, exact = self._write_upserts(
                        schema, clock, version, origin, upserts, entries, captures, table in unique
                    )
                    total += bound
                    if not exact:
                        estimated.append((schema, clock, upserts, entries))
            if deletes:  # tombstones are written now, deferred or not (no lookup, and rare)
                entries = self._entries(deletes, width) if json_ok else None
                total += self._write_deletes(schema, clock, version, origin, deletes, entries)
            if total > MAX_VERSION_BYTES and estimated:
                # a share-based bound is too coarse here: measure those rows exactly
                for schema_, clock_, seqs_, entries_ in estimated:
                    total -= len(seqs_) * (MAX_VERSION_BYTES // captures)
                    total += self._measure(schema_, clock_, seqs_, entries_, version)
                estimated.clear()
            if total > MAX_VERSION_BYTES:
                raise TransactionTooLargeError(
                    f"a transaction may capture at most {MAX_VERSION_BYTES} encoded bytes "
                    f"(its rows may take up to {total})"
                )
            if json_ok:
                written: str | bytes = (
                    entries  # type: ignore[assignment]
                    if not deletes or not upserts
                    else self._entries(sorted(upserts + deletes), width)
                )
            else:
                written = b"".join(encode_values(keys[seq]) for seq in sorted(upserts + deletes))
            conn.execute(_sql.INSERT_VERSION, (origin, version, table, written))
        if not defer:
            conn.execute(_sql.SET_FOLDED, (version,))
        return int(version)

    def _defer_one_table(self, schema: TableSchema, version: int, origin: int) -> bool:
        """``_write_clock``'s common case, deferred: upserts of one table with a key known
        unique, every key listed as JSON. A row captured more than once is listed (and
        measured) once per capture: the fold gives it its last capture's entry, and the
        sender sends it once. Returns ``False``, having run nothing, when a key turns out to
        hold a NUL (the captures' fast path leaves that check to here: the keys cannot be
        listed as JSON then). Raises what ``_measure`` raises, and
        ``TransactionTooLargeError``."""
        keys = self._keys
        if schema.table in self._text_keyed:  # every key one ``str`` here
            return self._defer_text(schema, list(map(_first, keys)), origin) is not None
        n = len(keys)
        clock = self._catalog.clocks[schema.table]
        entries = self._entries(range(n), len(schema.primary_key))
        total = self._measure(schema, clock, range(n), entries, version)
        if total > MAX_VERSION_BYTES:
            raise TransactionTooLargeError(
                f"a transaction may capture at most {MAX_VERSION_BYTES} encoded bytes "
                f"(its rows may take up to {total})"
            )
        self._conn.execute(_sql.INSERT_VERSION, (origin, version, schema.table, entries))
        return True

    def _defer_text(self, schema: TableSchema, values: list[str], origin: int) -> int | None:
        """``_defer_one_table`` for a table with one TEXT key column, its keys ``values``
        (the fast captures, or the general lists' keys), after ``BUMP_CLOCK``; returns the
        version. The keys' bytes are counted in Python, so the query reads only the other
        columns, and the same query reads the clock and the schema version (see
        ``ClockSql.measure_values``). Returns ``None``, having written nothing, when a key
        holds a NUL (SQLite's JSON functions end a text there) or the table's key is not
        known unique (the schema changed)."""
        n = len(values)
        joined = '","'.join(values)
        if "\0" in joined:
            self._json = False
            return None
        entries = _json_array(values, joined)  # type: ignore[arg-type]
        key_bytes = len(joined if joined.isascii() else joined.encode()) - 3 * (n - 1)
        catalog = self._catalog
        table = schema.table
        found, size, version, floor, schema_version = self._conn.execute(
            catalog.clocks[table].measure_values, (entries, origin)
        ).fetchone()
        _check_clock(version, floor)
        if schema_version == catalog.checked_schema_version:
            unique = catalog.unique
        else:  # the application changed the schema: check the keys again
            unique = catalog.unique_keys(self._conn)
        if table not in unique:
            return None
        if found != n:
            self._spill()  # the general lists name each capture's key
            self._explain_mismatch(schema, range(n), version)
        total = n * _per_row(schema) + int(size) + 2 * key_bytes
        if total > MAX_VERSION_BYTES:
            raise TransactionTooLargeError(
                f"a transaction may capture at most {MAX_VERSION_BYTES} encoded bytes "
                f"(its rows may take up to {total})"
            )
        self._conn.execute(_sql.INSERT_VERSION, (origin, version, table, entries))
        return int(version)

    def _check_nul(self) -> None:
        """Stop listing the keys as JSON if a text key holds a NUL (SQLite's JSON functions
        end a text there). Why here and not at the capture: ``capture_upsert``'s and
        ``upsert``'s fast path skip the search (a tenth of their cost), and while the keys
        are JSON every key of a TEXT-keyed table is one ``str``, so one search of them all
        at commit says the same."""
        text_keyed = self._text_keyed
        for table, key in zip(self._tables, self._keys, strict=True):
            if table in text_keyed and type(key[0]) is str and "\0" in key[0]:
                self._json = False
                return

    def _normalize_keys(self) -> None:
        """Replace every captured key by the values its table stores for it (type affinity
        applied, through the table's ``TEMP`` key table), so that keys captured with
        different types for one row are recognised as one row."""
        conn = self._conn
        keys = self._keys
        by_table: dict[str, list[int]] = {}
        for seq, table in enumerate(self._tables):
            by_table.setdefault(table, []).append(seq)
        for table, seqs in by_table.items():
            _, insert, take = self._catalog.clocks[table].normalize
            conn.executemany(insert, [(seq, *keys[seq]) for seq in seqs])
            for seq, *values in conn.execute(take).fetchall():
                keys[seq] = tuple(values)

    def _entries(self, seqs: Sequence[int], width: int) -> str:
        """The JSON array of ``ClockSql``: key ``seq`` at index ``seq``, ``null`` elsewhere."""
        keys = self._keys
        entries: list[object]
        if width == 1:
            if len(seqs) == len(keys):
                return _json_array([k[0] for k in keys])
            entries = [None] * (seqs[-1] + 1)
            for seq in seqs:
                entries[seq] = keys[seq][0]
        else:
            entries = [None] * (seqs[-1] + 1)
            for seq in seqs:
                entries[seq] = list(keys[seq])
        return json.dumps(entries, separators=(",", ":"))

    def _write_upserts(
        self,
        schema: TableSchema,
        clock: _sql.ClockSql,
        version: int,
        origin: int,
        seqs: list[int],
        entries: str | None,
        captures: int,
        unique: bool,
    ) -> tuple[int, bool]:
        """Write the clock entries of the captured upserts ``seqs`` of ``schema`` (``entries``:
        their JSON array, or ``None`` for the per-row statements); returns an upper bound of
        their encoded size and whether it was measured (``False``: the bound is their share,
        ``len(seqs)`` of ``captures``, of ``MAX_VERSION_BYTES``). ``unique``: whether the
        table's key is known to be unique (else the rows are counted first)."""
        conn = self._conn
        keys = self._keys
        n = len(seqs)
        per_row = _per_row(schema)
        if entries is not None and unique:
            # The fast path: one statement writes the entry of every row that exists and
            # whose values take at most an equal share of the byte bound (the join supplies
            # the stored key). When it writes them all, every row was found, once, and the
            # rows fit their share: no second lookup per row.
            quota = MAX_VERSION_BYTES // captures
            params = (version, origin, entries, quota - per_row)
            written = conn.execute(clock.capture_upserts, params).rowcount
            if written == n:
                return n * quota, False
            total = self._measure(schema, clock, seqs, entries, version)
        else:
            written = 0
            total = self._measure(schema, clock, seqs, entries, version)
        if total > MAX_VERSION_BYTES:
            return total, True  # the caller raises TransactionTooLargeError
        if entries is not None:
            # rows above their share, but the version fits: write those
            params = (version, origin, entries, _I64_MAX)
            written += conn.execute(clock.capture_upserts, params).rowcount
        else:
            for seq in seqs:
                cursor = conn.execute(clock.capture_upsert_one, (version, origin, seq, *keys[seq]))
                written += cursor.rowcount
        if written != n:
            self._explain_mismatch(schema, seqs, version)
        return total, True

    def _measure(
        self,
        schema: TableSchema,
        clock: _sql.ClockSql,
        seqs: Sequence[int],
        entries: str | None,
        version: int,
    ) -> int:
        """An upper bound of the encoded size of the captured upserts ``seqs`` of ``schema``
        (their keys as the JSON array ``entries``, or ``None`` for per-row statements); raises
        ``MissingRowError`` / ``NonUniqueKeyError`` unless exactly one row per capture is
        found."""
        conn = self._conn
        if entries is not None:
            found, size, key_size = conn.execute(clock.measure, (entries,)).fetchone()
        else:
            found, size, key_size = 0, 0.0, 0.0
            for seq in seqs:
                one = conn.execute(clock.measure_one, self._keys[seq]).fetchone()
                found += one[0]
                size += one[1]
                key_size += one[2]
        if found != len(seqs):
            self._explain_mismatch(schema, seqs, version)
        return len(seqs) * _per_row(schema) + int(size) + int(key_size)

    def _explain_mismatch(self, schema: TableSchema, seqs: Sequence[int], version: int) -> None:
        """Why the captured upserts of ``schema`` did not write one clock entry each."""
        conn = self._conn
        for seq in seqs:
            key = self._keys[seq]
            rows = conn.execute(schema.select_row_sql, key).fetchmany(2)
            if not rows:
                raise MissingRowError(f"no row of {quote(schema.table)} has key {quote(key)}")
            if len(rows) > 1:
                raise NonUniqueKeyError(
                    f"several rows of {quote(schema.table)} have key {quote(key)}"
                )
        raise CorruptMetadataError(
            f"a clock entry of {quote(schema.table)} is at or above the new local version "
            f"{version} (the clock is behind its entries)"
        )

    def _write_deletes(
        self,
        schema: TableSchema,
        clock: _sql.ClockSql,
        version: int,
        origin: int,
        seqs: list[int],
        entries: str | None,
    ) -> int:
        """Write the tombstones of the captured deletes ``seqs``; returns their encoded size."""
        conn = self._conn
        keys = self._keys
        if entries is not None:
            written = conn.execute(clock.capture_deletes, (version, origin, entries)).rowcount
        else:
            written = 0
            for seq in seqs:
                cursor = conn.execute(clock.capture_delete_one, (*keys[seq], version, origin, seq))
                written += cursor.rowcount
        if written != len(seqs):
            raise CorruptMetadataError(
                f"a clock entry of {quote(schema.table)} is at or above the new local version "
                f"{version} (the clock is behind its entries)"
            )
        return _deletes_size(schema, [keys[seq] for seq in seqs])

    def rollback(self) -> None:
        """Discard the transaction (application writes and captures). Idempotent."""
        if self._open:
            self._end(rollback=True)

    def _end(self, *, rollback: bool) -> None:
        self._open = False
        self.execute = _execute_ended
        self._tables, self._keys, self._deletes = [], [], set()
        self._fast, self._fast_table, self._plans = [], "", {}
        self._specialized = False
        self.upsert = _upsert_ended  # also ends the reference cycle of ``_upsert_general``
        try:
            if rollback and self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
        finally:
            self._release(self)

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


class _Execute(Protocol):
    """The shape of ``sqlite3.Connection.execute``."""

    def __call__(
        self, sql: str, parameters: Sequence[object] | Mapping[str, object] = ..., /
    ) -> sqlite3.Cursor: ...


def _execute_ended(
    sql: str, parameters: Sequence[object] | Mapping[str, object] = (), /
) -> sqlite3.Cursor:
    """``ReplicaTransaction.execute`` after the transaction ended."""
    raise ReplicaClosedError("the replica transaction has already ended")


class _Upsert(Protocol):
    """The shape of ``ReplicaTransaction.upsert``."""

    def __call__(self, table: str, row: Sequence[object]) -> tuple[SqlValue, ...]: ...


def _upsert_ended(table: str, row: Sequence[object]) -> tuple[SqlValue, ...]:
    """``ReplicaTransaction.upsert`` after the transaction ended."""
    raise ReplicaClosedError("the replica transaction has already ended")


_RowWriter = Callable[["ReplicaTransaction", tuple[SqlValue, ...], str, str], bool]
"""``upsert``'s compiled fast path for one table (see ``_row_writer``)."""

_FastUpserter = Callable[
    [Callable[[str, tuple[SqlValue, ...]], object], str, list[str], str, _Upsert], _Upsert
]
"""Makes ``upsert``'s one-frame fast path for a table (see ``_fast_upserter``)."""

_UpsertPlan = tuple[_RowWriter, str, _FastUpserter | None]
"""``ReplicaTransaction.upsert``'s per-table plan: the row writer, the upsert statement and
the maker of the fast upserter (``None``: the table's rows do not go to the fast captures)."""

_ROW_WRITERS: Final[dict[tuple[tuple[frozenset[type], ...], int], _RowWriter]] = {}
"""Compiled row writers by column type pattern and key column (``_row_writer``), at most
``_ROW_CHECKS_CACHE``."""

_FAST_UPSERTERS: Final[dict[tuple[tuple[frozenset[type], ...], int], _FastUpserter]] = {}
"""Compiled fast upserter makers by column type pattern and key column (``_fast_upserter``),
at most ``_ROW_CHECKS_CACHE``."""

_FIRST_TYPES: Final = (str, int, bytes, NoneType)
"""The order in which a compiled row check tries a column's types (the most common
first: one ``is`` comparison decides a text or an integer)."""


def _never_exact(tx: ReplicaTransaction, row: tuple[SqlValue, ...], sql: str, table: str) -> bool:
    """The row writer of a table no row of which is stored exactly as given (an ``INTEGER
    PRIMARY KEY`` fills in ``None``): every upsert reads its row back."""
    return False


def _row_writer(stable: tuple[frozenset[type], ...], key_index: int) -> _RowWriter:
    """``upsert``'s fast path for a table whose columns keep the value types ``stable``
    (``ReplicaCatalog.stable_rows``) and whose one TEXT key is column ``key_index`` (-1: another
    key): ``write(tx, row, sql, table)`` returns ``False``, having done nothing, unless
    ``row`` has ``len(stable)`` values each of a type its column keeps; then it runs ``sql``
    (the upsert, no ``RETURNING``: the row is stored as given), captures the key (appended
    to the fast captures, or through ``ReplicaTransaction._capture_stored``) and returns
    ``True``.

    Why compiled: it runs once per ``tx.upsert`` row, and a generic loop over the columns,
    or a cache keyed by the row's value types, cost as much again as the plain insert's
    Python. So it is generated for the column count (unpacking the row checks its length)
    with one ``type(v) is T`` test per column for the common type and a set lookup for the
    others, and takes the key from its variable. The source is built from column positions
    only, never from names or values. Writers are kept per pattern, a bounded number; past
    that one is compiled per transaction and table (correct, slower)."""
    writer = _ROW_WRITERS.get((stable, key_index))
    if writer is None:
        writer = _compile_row_writer(stable, key_index)
        if len(_ROW_WRITERS) < _ROW_CHECKS_CACHE:
            _ROW_WRITERS[(stable, key_index)] = writer
    return writer


def _type_tests(
    stable: tuple[frozenset[type], ...], key_index: int, namespace: dict[str, object]
) -> list[str]:
    """The compiled row checks' per-column type tests (``v0``, ``v1``, ...: the values),
    their types put in ``namespace``: one ``type(v) is T`` for the column's most common type
    and a set lookup for the others; the key column ``key_index`` (-1: none) must hold a
    text (what the fast captures take; a text key column keeps texts)."""
    tests = []
    for i, types in enumerate(stable):
        if i == key_index:
            tests.append(f"type(v{i}) is str")
            continue
        first = next((t for t in _FIRST_TYPES if t in types), None)
        if first is None:
            tests.append("False")
            continue
        namespace[f"f{i}"] = first
        namespace[f"s{i}"] = types - {first}
        if namespace[f"s{i}"]:
            tests.append(f"(type(v{i}) is f{i} or type(v{i}) in s{i})")
        else:
            tests.append(f"type(v{i}) is f{i}")
    return tests


def _fast_upserter(stable: tuple[frozenset[type], ...], key_index: int) -> _FastUpserter:
    """The maker of ``upsert``'s fast path for a table whose columns keep the value types
    ``stable`` and whose one TEXT key is column ``key_index``, while it is the transaction's
    fast table: ``make(execute, sql, fast, table, general)`` returns ``upsert(table, row)``,
    which, for ``table`` given as a tuple of ``len(stable)`` values each of a type its
    column keeps (the key a ``str``) and room in ``fast``, runs ``execute(sql, row)``,
    appends the key to ``fast`` (the transaction's fast captures) and returns ``row``; any
    other call goes to ``general`` (``_upsert_general``), before anything is written.

    Why: a row costs then one Python frame, its type tests and the statement; the checks
    are the row writer's (``_row_writer``), with the key column's test the fast captures'
    own (a text bound by ``sqlite3`` is valid, so no ``isascii``). Kept per pattern like the
    row writers, a bounded number."""
    maker = _FAST_UPSERTERS.get((stable, key_index))
    if maker is None:
        maker = _compile_fast_upserter(stable, key_index)
        if len(_FAST_UPSERTERS) < _ROW_CHECKS_CACHE:
            _FAST_UPSERTERS[(stable, key_index)] = maker
    return maker


def _compile_fast_upserter(stable: tuple[frozenset[type], ...], key_index: int) -> _FastUpserter:
    """Generate ``_fast_upserter``'s function (built from column positions only)."""
    names = [f"v{i}" for i in range(len(stable))]
    namespace: dict[str, object] = {"MAX": MAX_CHANGES_PER_VERSION}
    tests = _type_tests(stable, key_index, namespace)
    lines = [
        "def make(execute, sql, fast, TABLE, general):",
        "    append = fast.append",
        "    def upsert(table, row):",
        "        if table == TABLE and type(row) is tuple and len(fast) < MAX:",
        "            try:",
        f"                {', '.join(names)}, = row",
        "            except ValueError:",
        "                return general(table, row)",
        f"            if {' and '.join(tests)}:",
        "                execute(sql, row)",
        f"                append(v{key_index})",
        "                return row",
        "        return general(table, row)",
        "    return upsert",
        "",
    ]
    exec(compile("\n".join(lines), "<chrysalis.sqlite fast upserter>", "exec"), namespace)
    maker: _FastUpserter = namespace["make"]  # type: ignore[assignment]
    return maker


def _compile_row_writer(stable: tuple[frozenset[type], ...], key_index: int) -> _RowWriter:
    """Generate ``_row_writer``'s function."""
    names = [f"v{i}" for i in range(len(stable))]
    namespace: dict[str, object] = {"MAX": MAX_CHANGES_PER_VERSION}
    tests = _type_tests(stable, -1, namespace)  # every column by its kept types
    lines = [
        "def write(tx, row, sql, table):",
        "    try:",
        f"        {', '.join(names)}, = row",
        "    except ValueError:",
        "        return False",
        f"    if not ({' and '.join(tests)}):",
        "        return False",
        "    tx.execute(sql, row)",
    ]
    if key_index >= 0:  # a text bound by ``sqlite3`` just now is valid: no ``isascii``
        lines += [
            f"    if table == tx._fast_table and type(v{key_index}) is str:",
            "        fast = tx._fast",
            "        if len(fast) < MAX:",
            f"            fast.append(v{key_index})",
            "            return True",
        ]
    lines += ["    tx._capture_stored(table, row)", "    return True", ""]
    exec(compile("\n".join(lines), "<chrysalis.sqlite row writer>", "exec"), namespace)
    writer: _RowWriter = namespace["write"]  # type: ignore[assignment]
    return writer


def _json_array(values: list[SqlValue], joined: str | None = None) -> str:
    """``values`` as a JSON array (``joined``: ``'","'.join(values)`` when the caller has it).
    Why not just ``json.dumps``: for a hundred short texts it costs more than the commit's
    other Python together; texts that need no escaping (no quote, backslash or unprintable
    character) are joined as they are."""
    try:
        if joined is None:
            joined = '","'.join(values)  # type: ignore[arg-type]
    except TypeError:  # not only texts
        pass
    else:
        separators = 2 * (len(values) - 1)
        if joined.isascii():
            # one pass in C: deleting the unprintable characters, backslashes and quotes
            # removes exactly the separators' quotes when the texts need no escaping (four
            # times cheaper than ``isprintable`` and ``count``)
            raw = joined.encode("ascii")
            if len(raw.translate(None, _ESCAPED_ASCII)) == len(raw) - separators:
                return f'["{joined}"]'
        elif joined.isprintable() and "\\" not in joined and joined.count('"') == separators:
            return f'["{joined}"]'
    return json.dumps(values, separators=(",", ":"))


def _check_clock(version: int | float, floor: int | float) -> None:
    """Raise ``CorruptMetadataError`` unless the new local ``version`` is above ``floor`` (the
    fold mark and the newest local version listed). A clock already at ``2**63 - 1`` overflows
    into a REAL when the commit moves it (SQLite's integers end there): reported as that, with
    the versions as integers (a database whose clock a peer raised before accepted versions
    were bounded, see ``_clock``)."""
    if not isinstance(version, int) or version > _I64_MAX:
        raise CorruptMetadataError(
            f"the clock overflowed: the new local version would be {_integer(version)}, past "
            f"{_I64_MAX}, the greatest integer SQLite stores (a peer raised this replica's "
            "clock to the top before received versions were bounded: see MAX_ACCEPTED_VERSION)"
        )
    if version <= floor:
        raise CorruptMetadataError(
            f"the new local version {version} is not above version {_integer(floor)}, "
            "already written or pending: the clock is behind its entries"
        )


def _integer(value: int | float) -> str:
    """A version as an integer in a message, even where SQLite returned it as a REAL."""
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value))
    return str(value)


def _deletes_size(schema: TableSchema, keys: list[tuple[SqlValue, ...]]) -> int:
    """Encoded bytes of deletes of ``schema`` with these keys."""
    size = sum(len(encode_values(key)) for key in keys)
    return len(keys) * (_CHANGE_OVERHEAD + len(schema.table)) + size


def _per_row(schema: TableSchema) -> int:
    """Encoded bytes of an upsert of ``schema`` besides its values' lengths as BLOBs: per
    value at most 9 (a number's text is longer than its encoding's payload, a text's or
    blob's is exact), per list 4."""
    columns = len(schema.columns) + len(schema.primary_key)
    return _CHANGE_OVERHEAD + len(schema.table) + 8 + 9 * columns


def _invalid(schema: TableSchema, why: str) -> None:
    raise InvalidMutationError(f"key of {quote(schema.table)} cannot be replicated: {why}")


def _check_text(schema: TableSchema, value: str) -> None:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        _invalid(schema, "text that is not valid Unicode")
    else:
        if size > MAX_BYTES:
            _invalid(schema, "text too long")


def _check_other(schema: TableSchema, key: tuple[object, ...]) -> tuple[SqlValue, ...]:
    """A key with values other than TEXT and INTEGER, checked by encoding it (bytes-like values
    become ``bytes``)."""
    values = tuple(bytes(v) if isinstance(v, bytearray | memoryview) else v for v in key)
    try:
        encode_values(values)
    except CodecError as exc:
        _invalid(schema, str(exc))
    return values  # type: ignore[return-value]


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
