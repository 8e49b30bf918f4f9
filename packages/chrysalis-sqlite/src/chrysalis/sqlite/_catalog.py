"""``ReplicaCatalog``: what a replica knows about its registered tables, in one place.

Why a module of its own: the replica (apply, selection, collection, fold) and its
transactions (capture, commit) both need the same per-table facts, and the transaction used
to read them from the replica's private members, which made ``_replica`` and
``_transaction`` import each other. The catalog owns them; ``Replica`` builds it on open and
hands it to each ``ReplicaTransaction``, so the transaction module knows the catalog, never
the replica. What it holds:

- ``schemas``: the registered ``TableSchema`` by table name;
- ``clocks``: per table, its clock statements (``_sql.ClockSql``, the key columns typed with
  the table's affinities), and ``gc_sql``, the collector's statements over that clock;
- the key kinds the capture paths choose by: ``text_keyed`` (one key column whose affinity
  keeps TEXT as it is), ``stable_rows`` (per column, the value types stored exactly as given;
  absent for a table with an INTEGER PRIMARY KEY) and ``unique_keys`` (the tables whose key
  is still unique, checked again when ``PRAGMA schema_version`` moves), and ``json_capture``
  (whether this SQLite has ``json_each``);
- ``local_origin``: this replica's own position in the origin registry.

Nothing here opens, begins or commits anything: ``create_tables`` runs inside the opening
transaction the replica began, and ``unique_keys`` reads on the connection it is given.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from chrysalis.sqlite import _sql
from chrysalis.sqlite._errors import InvalidSchemaError, MissingSchemaError, quote
from chrysalis.sqlite._schema import TableSchema

__all__ = ["ReplicaCatalog"]


class ReplicaCatalog:
    """The registered tables of one replica and what it derives from them.

    ``ReplicaCatalog(schemas)`` checks the schemas (non-empty, ``TableSchema`` instances,
    table names unique ignoring case: ``InvalidSchemaError``); ``create_tables(conn)`` then
    creates the tables and their clock tables and fills in the clocks and key kinds, and the
    replica sets ``local_origin`` once its origin registry is read."""

    __slots__ = (
        "checked_schema_version",
        "clocks",
        "gc_sql",
        "json_capture",
        "local_origin",
        "schemas",
        "schemas_view",
        "stable_rows",
        "text_keyed",
        "unique",
    )

    def __init__(self, schemas: Iterable[TableSchema]) -> None:
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
        self.schemas: Final[dict[str, TableSchema]] = by_name
        """The registered schemas by table name."""
        self.schemas_view: Final[Mapping[str, TableSchema]] = MappingProxyType(by_name)
        """``schemas``, read-only (what ``Replica.schemas`` returns)."""
        self.clocks: Final[dict[str, _sql.ClockSql]] = {}
        """Per registered table, its clock statements."""
        self.gc_sql: Final[dict[str, _sql.GcSql]] = {}
        """Per registered table, the collector's statements."""
        self.text_keyed: Final[set[str]] = set()
        """Tables with one key column whose affinity keeps TEXT as it is (the captures' fast
        path)."""
        self.stable_rows: Final[dict[str, tuple[frozenset[type], ...]]] = {}
        """Per table, per column: the value types stored exactly as given (``tx.upsert`` then
        needs no ``RETURNING``); absent for a table with an INTEGER PRIMARY KEY."""
        self.json_capture = False
        """Whether this SQLite has ``json_each`` (the captures' JSON path)."""
        self.checked_schema_version = -1
        """The ``PRAGMA schema_version`` at which ``unique`` was computed (a commit that sees
        another one checks the tables again, see ``unique_keys``)."""
        self.unique: frozenset[str] = frozenset()
        """The tables whose key was found unique at ``checked_schema_version``."""
        self.local_origin = 0
        """This replica's position in the origin registry (set by the replica on open)."""

    def create_tables(self, conn: sqlite3.Connection) -> None:
        """Inside the opening transaction: run every schema's ``create_sql``, check each table
        (``InvalidSchemaError``, see ``_check_table``), create its clock table and record its
        clock statements and key kinds."""
        self.json_capture = _has_json(conn)
        for schema in self.schemas.values():
            try:
                conn.execute(schema.create_sql)
            except (sqlite3.Error, sqlite3.Warning) as exc:
                raise InvalidSchemaError(
                    f"create_sql of {quote(schema.table)} failed: {exc}"
                ) from None
            _check_table(conn, schema)
            clock = _clock_for(conn, schema)
            stable = _stable_row(conn, schema)
            if stable is not None:
                self.stable_rows[schema.table] = stable
            for statement in (*clock.ddl, clock.normalize[0]):
                conn.execute(statement)
            self.clocks[schema.table] = clock
            self.gc_sql[schema.table] = _sql.gc_sql(clock)
            if len(clock.json_types) == 1 and str in clock.json_types[0]:
                self.text_keyed.add(schema.table)

    def schema(self, table: str) -> TableSchema:
        """The schema of ``table`` (``MissingSchemaError`` if it is not registered)."""
        schema = self.schemas.get(table)
        if schema is None:
            raise MissingSchemaError(f"no local schema for table {quote(table)}")
        return schema

    def unique_keys(self, conn: sqlite3.Connection) -> frozenset[str]:
        """The tables whose key is still unique under binary comparison (checked again when
        ``PRAGMA schema_version`` moved: the application may replace a table after open).

        Why: the commit's fast path writes clock entries with one join of the keys with the
        table and trusts its change count; only a unique key makes that count the number of
        rows found. For other tables the commit counts the rows first (``NonUniqueKeyError``).
        """
        (version,) = conn.execute("PRAGMA schema_version").fetchone()
        if version != self.checked_schema_version:
            unique = set()
            for schema in self.schemas.values():
                try:
                    _check_table(conn, schema)
                except InvalidSchemaError:
                    continue
                unique.add(schema.table)
            self.unique = frozenset(unique)
            self.checked_schema_version = version
        return self.unique


def _has_json(conn: sqlite3.Connection) -> bool:
    """Whether this SQLite has ``json_each`` (the capture fast path; built in since 3.38)."""
    try:
        conn.execute("SELECT value FROM json_each('[1]')").fetchall()
    except sqlite3.Error:
        return False
    return True


def _stable_row(
    conn: sqlite3.Connection, schema: TableSchema
) -> tuple[frozenset[type], ...] | None:
    """Per column of ``schema`` (in its order), the value types its affinity keeps as they
    are; ``None`` when the table has an INTEGER PRIMARY KEY (SQLite fills in a NULL)."""
    info = {
        str(r[1]).lower(): (str(r[2] or ""), int(r[5]))
        for r in conn.execute(f'PRAGMA table_info("{schema.table}")').fetchall()
    }
    if sum(1 for _, pk in info.values() if pk) == 1 and any(
        pk and declared.upper() == "INTEGER" for declared, pk in info.values()
    ):
        return None
    return _sql.stable_row_types(tuple(_sql.affinity(info[c.lower()][0]) for c in schema.columns))


def _clock_for(conn: sqlite3.Connection, schema: TableSchema) -> _sql.ClockSql:
    """The clock statements of ``schema``, its key columns typed with the table's affinities."""
    declared = {
        str(r[1]).lower(): str(r[2] or "")
        for r in conn.execute(f'PRAGMA table_info("{schema.table}")').fetchall()
    }
    key_types = tuple(_sql.affinity(declared[k.lower()]) for k in schema.primary_key)
    return _sql.clock_sql(schema.table, schema.columns, schema.primary_key, key_types)


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
    unique = {str(r[1]).lower() for r in info if r[5]} == key
    for index in conn.execute(f'PRAGMA index_list("{schema.table}")').fetchall():
        if index[2]:  # unique
            name = str(index[1]).replace('"', '""')
            cols = [c for c in conn.execute(f'PRAGMA index_xinfo("{name}")') if c[5]]
            if {str(c[2]).lower() for c in cols if c[2] is not None} == key and len(cols) == len(
                key
            ):
                unique = True
                for c in cols:
                    if str(c[4]).upper() != "BINARY":
                        _refuse_collation(schema, str(c[2]), f"index {index[1]}", str(c[4]))
    if not unique:
        raise InvalidSchemaError(
            f"primary key {list(schema.primary_key)} of {quote(schema.table)} is neither the "
            "table's PRIMARY KEY nor covered by a UNIQUE index"
        )
    table = schema.table.replace('"', '""')
    for column in schema.primary_key:
        # the column's own collation (what ``key = ?`` compares with), seen through a compound
        # SELECT, whose column takes the collation of its leftmost part: distinct texts that
        # the collation equates collapse (NOCASE, RTRIM)
        probe = " UNION ".join(f"SELECT '{t}'" for t in _COLLATION_PROBE)
        (distinct,) = conn.execute(
            f'SELECT count(*) FROM (SELECT "{column}" FROM "{table}" WHERE 0 UNION {probe})'
        ).fetchone()
        if distinct != len(_COLLATION_PROBE):
            _refuse_collation(schema, column, "the column", "not BINARY")


_COLLATION_PROBE: Final = ("a", "A", "a ", "b")
"""Texts that only a collation other than BINARY equates (NOCASE: ``a``/``A``; RTRIM:
``a``/``a ``)."""


def _refuse_collation(schema: TableSchema, column: str, where: str, collation: str) -> None:
    raise InvalidSchemaError(
        f"key column {quote(column)} of {quote(schema.table)} compares with collation "
        f"{collation} ({where}); replicated keys must compare as BINARY, since texts the "
        "collation equates would be one row of the table but different rows to replication"
    )
