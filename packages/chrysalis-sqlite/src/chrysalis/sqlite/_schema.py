"""Trusted table descriptors (``TableSchema``) and the SQL generated from them.

Why descriptors: a replica never runs SQL it received from a peer. Each application registers,
locally, the tables it replicates: name, ``CREATE TABLE`` statement, column list and primary key.
Peers exchange only a digest of each descriptor (``schema_hash``); a digest mismatch ends the
session before any change crosses. Every statement the replica runs on an application table is
generated here from validated identifiers, always double-quoted, with values bound as
parameters, so neither a descriptor nor a received change can inject SQL.

The digest is SHA-256 over: ASCII ``chrysalis-schema-v1``; u64 BE length and bytes of the table
name; u64 BE column count, then u64 BE length and bytes of each column; u64 BE primary-key count,
then u64 BE length and bytes of each key column; u64 BE length and bytes of ``create_sql``.
This module is pure: no I/O.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from chrysalis.sqlite._errors import InvalidSchemaError, quote

__all__ = ["MAX_COLUMNS", "MAX_IDENTIFIER_LEN", "SCHEMA_HASH_LEN", "TableSchema"]

MAX_IDENTIFIER_LEN: Final = 128
"""Longest table or column name accepted."""

MAX_COLUMNS: Final = 2000
"""Most columns in one table (SQLite's default ``SQLITE_MAX_COLUMN``)."""

MAX_CREATE_SQL_LEN: Final = 1024 * 1024
"""Longest ``create_sql`` accepted (bytes of UTF-8)."""

SCHEMA_HASH_LEN: Final = 32
"""Bytes in a schema digest (SHA-256)."""

_HASH_DOMAIN = b"chrysalis-schema-v1"
_U64 = struct.Struct(">Q")


def _check_identifier(what: str, name: object) -> str:
    if not isinstance(name, str):
        raise InvalidSchemaError(f"{what} must be a str, not {type(name).__name__}")
    if not name:
        raise InvalidSchemaError(f"{what} is empty")
    if len(name) > MAX_IDENTIFIER_LEN:
        raise InvalidSchemaError(f"{what} {quote(name)} is longer than {MAX_IDENTIFIER_LEN}")
    if not (name.isascii() and name[0].isalpha() and all(c.isalnum() or c == "_" for c in name)):
        raise InvalidSchemaError(
            f"{what} {quote(name)} must be ASCII letters, digits or '_', starting with a letter"
        )
    return name


def _quoted(name: str) -> str:
    return f'"{name}"'  # identifiers were validated: no quote can occur inside


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A trusted, locally registered description of one replicated table.

    ``table`` and every column are identifiers (non-empty ASCII letters, digits and ``_``,
    starting with a letter). ``columns`` lists every column of the table in the order rows are
    captured and sent; ``primary_key`` is a non-empty subset of them, in key order, and must be
    the table's PRIMARY KEY or covered by a UNIQUE index (checked when a replica opens).
    ``create_sql`` is one statement, run on every open, so it should be
    ``CREATE TABLE IF NOT EXISTS ...``. Any violation raises ``InvalidSchemaError``.

    ``schema_hash`` is the 32-byte digest peers compare; the other attributes hold the SQL the
    replica generates for the table.
    """

    table: str
    create_sql: str
    columns: tuple[str, ...]
    primary_key: tuple[str, ...]
    schema_hash: bytes = field(init=False, repr=False, compare=False)
    key_indexes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    select_row_sql: str = field(init=False, repr=False, compare=False)
    upsert_sql: str = field(init=False, repr=False, compare=False)
    upsert_returning_sql: str = field(init=False, repr=False, compare=False)
    delete_sql: str = field(init=False, repr=False, compare=False)

    def __init__(
        self, table: str, create_sql: str, columns: Sequence[str], primary_key: Sequence[str]
    ) -> None:
        table = _check_identifier("table name", table)
        if not isinstance(create_sql, str) or not create_sql.strip():
            raise InvalidSchemaError(f"create_sql of table {quote(table)} is empty")
        if len(create_sql.encode("utf-8", "surrogatepass")) > MAX_CREATE_SQL_LEN:
            raise InvalidSchemaError(f"create_sql of table {quote(table)} is too long")
        if isinstance(columns, str) or isinstance(primary_key, str):
            raise InvalidSchemaError("columns and primary_key must be sequences of names")
        cols = tuple(_check_identifier("column name", c) for c in columns)
        pk = tuple(_check_identifier("primary key column", c) for c in primary_key)
        if not cols:
            raise InvalidSchemaError(f"table {quote(table)} has no columns")
        if len(cols) > MAX_COLUMNS:
            raise InvalidSchemaError(f"table {quote(table)} has more than {MAX_COLUMNS} columns")
        if not pk:
            raise InvalidSchemaError(f"table {quote(table)} has no primary key")
        for what, names in (("column", cols), ("primary key column", pk)):
            folded = [n.lower() for n in names]  # SQLite identifiers are case-insensitive
            if len(set(folded)) != len(folded):
                raise InvalidSchemaError(f"table {quote(table)} repeats a {what}")
        folded_cols = [c.lower() for c in cols]
        missing = [k for k in pk if k.lower() not in folded_cols]
        if missing:
            raise InvalidSchemaError(
                f"primary key column {quote(missing[0])} is not a column of {quote(table)}"
            )
        set_ = object.__setattr__
        set_(self, "table", table)
        set_(self, "create_sql", create_sql)
        set_(self, "columns", cols)
        set_(self, "primary_key", pk)
        set_(self, "schema_hash", _digest(table, cols, pk, create_sql))
        set_(self, "key_indexes", tuple(folded_cols.index(k.lower()) for k in pk))
        qt = _quoted(table)
        col_list = ", ".join(_quoted(c) for c in cols)
        where = " AND ".join(f"{_quoted(k)} = ?" for k in pk)
        set_(self, "select_row_sql", f"SELECT {col_list} FROM {qt} WHERE {where}")
        updates = [c for c in cols if c.lower() not in {k.lower() for k in pk}]
        conflict = ", ".join(_quoted(k) for k in pk)
        placeholders = ", ".join("?" for _ in cols)
        if updates:
            assignments = ", ".join(f"{_quoted(c)} = excluded.{_quoted(c)}" for c in updates)
            action = f"DO UPDATE SET {assignments}"
        else:
            action = "DO NOTHING"
        set_(
            self,
            "upsert_sql",
            f"INSERT INTO {qt} ({col_list}) VALUES ({placeholders}) "
            f"ON CONFLICT ({conflict}) {action}",
        )
        set_(self, "upsert_returning_sql", f"{self.upsert_sql} RETURNING {col_list}")
        set_(self, "delete_sql", f"DELETE FROM {qt} WHERE {where}")

    def key_of(self, row: Sequence[object]) -> tuple[object, ...]:
        """The primary-key values of a full ``row`` (in ``columns`` order)."""
        return tuple(row[i] for i in self.key_indexes)


def _digest(table: str, columns: tuple[str, ...], pk: tuple[str, ...], create_sql: str) -> bytes:
    h = hashlib.sha256(_HASH_DOMAIN)

    def put(text: str) -> None:
        raw = text.encode("utf-8", "surrogatepass")
        h.update(_U64.pack(len(raw)))
        h.update(raw)

    put(table)
    h.update(_U64.pack(len(columns)))
    for column in columns:
        put(column)
    h.update(_U64.pack(len(pk)))
    for column in pk:
        put(column)
    put(create_sql)
    return h.digest()
