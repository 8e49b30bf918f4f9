"""SQL of the ``__chrysalis_*`` metadata tables and the statements that maintain them.

Why a module of its own: the capture path (``ReplicaTransaction``), the replica's apply and
selection paths and the shell all read or write these tables, and keeping every metadata
statement next to the DDL keeps them consistent. Nothing here runs SQL; it only defines it.

The layout (issue 6, "clock layout"): the metadata is local storage, not the wire, so it keeps
only what the protocol's contracts need. Per replicated table ``T`` there is one clock table
``__chrysalis_clock_v1_T`` with one small row per row of ``T`` that was ever captured or
received: the row's key (in columns ``_k0 .. _kN`` declared with the same type affinity as
``T``'s key columns, so a key means the same row in both tables) and the origin tuple of the
change that currently wins it (``_version``, ``_origin``: the site's position in
``__chrysalis_origins_v1``, ``_seq``) plus ``_deleted`` (a tombstone). There is no change log
and no copy of the row: ``T`` itself holds the winning state, which a sender reads when it
builds a batch. ``__chrysalis_versions_v1`` lists, per origin, version and table, the keys the
version wrote: it answers "changes of this origin after that frontier" with one B-tree insert
per transaction, where an index over the clock entries would cost one per row.

Why the local-commit statements look the way they do: capture overhead is measured against
plain inserts, and through ``sqlite3`` every bound statement step costs about as much as the
B-tree insert itself. So a commit handles a table's captures with one statement per kind over
a JSON array of the captured keys (``json_each``: one bound parameter for the whole
transaction). In the common case (JSON keys, a key known unique) that is the aggregate
``measure`` / ``measure_values`` query, the deletes' tombstones (``capture_deletes``) and the
version's row; the upserts' entries are written later by ``fold`` from that row (the
deferred entries: see ``Replica._fold``). Otherwise (``ClockSql.capture_*``), the upserts'
statement joins the keys with ``T``, which
supplies the key as ``T`` stores it, and writes only rows whose values take at most a given
share of the byte bound: for a key known to be unique (``Replica._unique_keys``) its change
count then says at once that every captured row exists and that the transaction fits
(``ReplicaTransaction`` passes ``MAX_VERSION_BYTES`` divided by the number of captures). Only
when the count falls short does the commit run the aggregate query (``measure``: rows found and
their encoded size) to tell a missing row, a non-unique key, a version too large and rows
merely above their share apart. Only keys whose types the key columns' affinities keep as they
are take this path, so the key a JSON entry names is the key ``T`` stores; other keys (BLOB,
REAL, ``7`` for a TEXT key, texts with a NUL, where SQLite's JSON functions end a text) are
first put through a ``TEMP`` table with the same affinities (``normalize``) and written by the
per-row statements (``capture_*_one``). Every SQL text is fixed per table, so ``sqlite3``'s
statement cache prepares each once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "ADMIT_PEER",
    "ADVANCE_CLOCK",
    "ADVANCE_INBOUND",
    "COVERAGE",
    "GC_DDL",
    "HORIZON_MARK",
    "INSERT_MARK",
    "KNOWN_PEER_SITES",
    "LAST_MARK",
    "PENDING_BEYOND",
    "PRUNE_MARKS",
    "RECORD_COLLECTED",
    "SCAN_VERSIONS",
    "SELECT_COLLECTED",
    "SELECT_FILTER",
    "UPSERT_FILTER",
    "SELECT_PEER_GC",
    "GcSql",
    "gc_sql",
    "ADVANCE_FRONTIER",
    "BUMP_CLOCK",
    "CLOCK_STATE",
    "CLOCK_PREFIX",
    "COUNT_PENDING",
    "DELETE_VERSION",
    "FOLDED_DDL",
    "INIT_FOLDED",
    "PENDING_EXISTS",
    "SELECT_FOLDED",
    "SELECT_PENDING",
    "SET_FOLDED",
    "INSERT_VERSION",
    "SELECT_VERSIONS",
    "VERSIONS_DDL",
    "INSERT_ORIGIN",
    "LEGACY_TABLES",
    "METADATA_DDL",
    "UPSERT_FRONTIER_ELIGIBLE",
    "UPSERT_PEER_STATE",
    "ClockSql",
    "affinity",
    "clock_sql",
    "stable_row_types",
]

METADATA_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS __chrysalis_replica_v1 (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        site_id BLOB NOT NULL CHECK (length(site_id) = 16),
        db_version INTEGER NOT NULL CHECK (db_version >= 0))""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_origins_v1 (
        position INTEGER PRIMARY KEY,
        site_id BLOB NOT NULL UNIQUE)""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_peer_state_v1 (
        peer_pid BLOB NOT NULL,
        peer_site_id BLOB NOT NULL,
        origin_position INTEGER NOT NULL CHECK (origin_position >= 0),
        eligibility_mode INTEGER NOT NULL CHECK (eligibility_mode IN (0, 1)),
        PRIMARY KEY (peer_pid, peer_site_id)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_frontiers_v5 (
        peer_pid BLOB NOT NULL,
        peer_site_id BLOB NOT NULL,
        origin_site_id BLOB NOT NULL,
        synced_at INTEGER NOT NULL CHECK (synced_at >= 0),
        eligible INTEGER NOT NULL CHECK (eligible IN (0, 1)),
        PRIMARY KEY (peer_pid, peer_site_id, origin_site_id)) WITHOUT ROWID""",
)

VERSIONS_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS __chrysalis_versions_v1 (
        origin INTEGER NOT NULL,
        db_version INTEGER NOT NULL CHECK (db_version > 0),
        table_name TEXT NOT NULL,
        keys NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS __chrysalis_versions_v1_by_origin "
    "ON __chrysalis_versions_v1 (origin, db_version)",
)
"""Which rows each version wrote: one row per (origin, version, table) written (or per
applied chunk), ``keys`` the written keys as a JSON array (TEXT; ``null`` entries are padding)
or, for keys JSON cannot carry exactly, concatenated v5 value lists (BLOB). This replaces an
index on the clock tables (one B-tree insert per transaction instead of one per row). An entry
whose row a later change won is dead; a row with only dead entries is deleted when a selection
finds it."""
INSERT_VERSION: Final = (
    "INSERT INTO __chrysalis_versions_v1 (origin, db_version, table_name, keys) VALUES (?, ?, ?, ?)"
)
SELECT_VERSIONS: Final = (
    "SELECT rowid, db_version, table_name, keys FROM __chrysalis_versions_v1 "
    "WHERE origin = ? AND db_version > ? ORDER BY db_version, rowid"
)
DELETE_VERSION: Final = "DELETE FROM __chrysalis_versions_v1 WHERE rowid = ?"

LEGACY_TABLES: Final = ("__chrysalis_changes_v1", "__chrysalis_resolved_rows_v2")
"""Tables of the earlier log layout (a change log with every row payload, and a winner
table). A database holding them is converted on open (``Replica._migrate``)."""

CLOCK_PREFIX: Final = "__chrysalis_clock_v1_"
"""Clock table of replicated table ``T``: ``CLOCK_PREFIX + T``."""

FOLDED_DDL: Final = """CREATE TABLE IF NOT EXISTS __chrysalis_folded_v1 (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        folded_through INTEGER NOT NULL CHECK (folded_through >= 0))"""
"""The fold watermark (see ``ReplicaTransaction`` and ``Replica._fold``): every local version
up to ``folded_through`` has its clock entries written; the local versions above it listed in
``__chrysalis_versions_v1`` are *pending*, their entries not yet written. A commit writes only
its version's row (the pending list is that table itself, durable in the same transaction);
whoever next needs the entries writes them ("folds"), in version order, and moves the mark."""
INIT_FOLDED: Final = (
    "INSERT OR IGNORE INTO __chrysalis_folded_v1 (singleton, folded_through) "
    "SELECT 1, db_version FROM __chrysalis_replica_v1 WHERE singleton = 1"
)
"""A database without the mark (new, or of a release that wrote every entry at commit) has
nothing pending: the mark starts at the clock."""
SELECT_FOLDED: Final = "SELECT folded_through FROM __chrysalis_folded_v1 WHERE singleton = 1"
SET_FOLDED: Final = "UPDATE __chrysalis_folded_v1 SET folded_through = ? WHERE singleton = 1"
PENDING_EXISTS: Final = (
    "SELECT 1 FROM __chrysalis_versions_v1 WHERE origin = ? AND db_version > "
    "(SELECT folded_through FROM __chrysalis_folded_v1 WHERE singleton = 1) LIMIT 1"
)
COUNT_PENDING: Final = (
    "SELECT count(*) FROM (SELECT 1 FROM __chrysalis_versions_v1 WHERE origin = ?1 AND "
    "db_version > (SELECT folded_through FROM __chrysalis_folded_v1 WHERE singleton = 1) "
    "LIMIT ?2)"
)
SELECT_PENDING: Final = (
    "SELECT db_version, table_name, keys FROM __chrysalis_versions_v1 WHERE origin = ? AND "
    "db_version > (SELECT folded_through FROM __chrysalis_folded_v1 WHERE singleton = 1) "
    "ORDER BY db_version, rowid"
)

BUMP_CLOCK: Final = (
    "UPDATE __chrysalis_replica_v1 SET db_version = max(db_version + 1, ?) WHERE singleton = 1"
)
"""A commit's first statement: the clock moves to the new local version, one past the clock
or, for a replica given a wall clock, the hybrid version of the time now (the parameter; 0
without one: see ``_clock``), whichever is greater. Why no
``RETURNING``: through ``sqlite3`` it cost about 40 000 instructions per commit (its rows go
through a temporary table), four times a plain statement; the new version is read by the
commit's next query (``CLOCK_STATE``, or ``ClockSql.measure_commit``)."""


def _clock_floor(origin: str) -> str:
    """The greater of the fold mark and the newest version of the local origin (the
    parameter ``origin``) listed: both index lookups."""
    return (
        "max((SELECT folded_through FROM __chrysalis_folded_v1 WHERE singleton = 1), "
        "ifnull((SELECT max(db_version) FROM __chrysalis_versions_v1 "
        f"WHERE origin = {origin}), 0))"
    )


CLOCK_STATE: Final = (
    f"SELECT db_version, {_clock_floor('?')} FROM __chrysalis_replica_v1 WHERE singleton = 1"
)
"""After ``BUMP_CLOCK``: the new local version, and the greater of the fold mark and the
newest local version listed (parameter: the local origin's position): a new version at or
below it means the clock is behind entries written or pending (corrupt metadata)."""
ADVANCE_CLOCK: Final = (
    "UPDATE __chrysalis_replica_v1 SET db_version = MAX(db_version, ?) WHERE singleton = 1"
)


def affinity(declared: str) -> str:
    """SQLite's type affinity of a column declared as ``declared`` (the rules of section 3.1
    of SQLite's datatype documentation), as a type name with exactly that affinity."""
    upper = declared.upper()
    if "INT" in upper:
        return "INTEGER"
    if "CHAR" in upper or "CLOB" in upper or "TEXT" in upper:
        return "TEXT"
    if "BLOB" in upper or not upper.strip():
        return "BLOB"
    if "REAL" in upper or "FLOA" in upper or "DOUB" in upper:
        return "REAL"
    return "NUMERIC"


_JSON_STABLE: Final = {
    "TEXT": frozenset({str}),
    "INTEGER": frozenset({int}),
    "NUMERIC": frozenset({int}),
    "REAL": frozenset[type](),
    "BLOB": frozenset({str, int}),
}
"""Per key affinity, the Python types whose values the affinity leaves as they are: only keys
of these types take the JSON statements, since a value read from ``json_each`` gets no
affinity when it is compared (``7`` would not find the TEXT row ``'7'``)."""


_ROW_STABLE: Final[dict[str, frozenset[type]]] = {
    "TEXT": frozenset({str, bytes, type(None)}),
    "INTEGER": frozenset({int, bytes, type(None)}),
    "NUMERIC": frozenset({int, bytes, type(None)}),
    "REAL": frozenset({bytes, type(None)}),
    "BLOB": frozenset({str, int, bytes, type(None)}),
}
"""Per column affinity, the Python types SQLite stores exactly as given (floats never: NaN is
stored as NULL, and INTEGER/NUMERIC affinities turn integral reals into integers)."""


def stable_row_types(affinities: tuple[str, ...]) -> tuple[frozenset[type], ...]:
    """Per column, the value types a row can be written with and read back unchanged."""
    return tuple(_ROW_STABLE[a] for a in affinities)


@dataclass(frozen=True, slots=True)
class ClockSql:
    """The statements of one table's clock table (see the module docstring).

    ``json_types``: per key column, the value types the JSON statements may carry (see
    ``_JSON_STABLE``). ``normalize``: a per-connection ``TEMP`` table with the key columns'
    affinities (DDL), an insert (row number, key values) and a delete that returns the stored
    values: other keys make this round trip first, so that a key means one row whatever type
    it was captured with.

    Parameters, in order: ``capture_upserts`` / ``capture_deletes``: version, origin
    position, JSON array (entry ``i``: the key of capture ``seq = i``, ``null`` for captures
    of other statements; a key is a scalar for one key column, an array otherwise), and for
    ``capture_upserts`` the most bytes a row's values (key values counted twice, as lengths
    as BLOBs) may take to be written (rows above it, and missing rows, are skipped).
    ``capture_upsert_one``: version, origin, seq, key values. ``capture_delete_one``: key
    values, version, origin, seq. ``write``: key values, version, origin, seq, deleted.
    ``winner``: key values (returns the entry's version, origin, seq and deleted flag).
    ``fold``: version, origin position, the JSON array of a pending version's row in
    ``__chrysalis_versions_v1``: writes each listed key's entry
    ``(version, origin, position in the array)`` as an upsert, unless an equal or greater
    entry is there (a delete's tombstone is written at commit, see ``Replica._fold``).
    ``measure`` (the
    JSON array) / ``measure_one`` (key values):
    ``(rows found, total length as BLOBs of their values, the same of their key values)``,
    which counts missing rows and bounds the encoded size; ``measure_values`` (the JSON
    array, the local origin's position): the same without the key columns, whose size the
    caller knows (a TEXT key: its UTF-8 length, without reading it back), followed by what
    the commit's other checks need, so that a commit runs one query where it ran three:
    the clock (the new version after ``BUMP_CLOCK``), the floor it must be above (see
    ``CLOCK_STATE``) and ``PRAGMA schema_version`` (whether the keys' uniqueness must be
    checked again). ``select_json`` (a JSON array of
    keys, origin, version) / ``select_one`` (key values, origin, version): the entries among
    those keys that the version still wins, as rows ``(seq, deleted, present, clock key
    values..., row values...)``; ``select_pending`` (the same parameters): the same for a
    pending version, whose upserts have no entry yet: a listed key wins unless its entry is
    newer (its own tombstone, written at commit, is its entry). The local-capture statements
    update an existing clock row only with a greater ``(version, seq)`` (the last capture of
    a row wins, and a clock behind its rows writes nothing, which the commit reports as
    corrupt metadata).
    """

    table: str
    clock: str
    key_types: tuple[str, ...]
    json_types: tuple[frozenset[type], ...]
    ddl: tuple[str, ...]
    capture_upserts: str
    capture_deletes: str
    capture_upsert_one: str
    capture_delete_one: str
    write: str
    winner: str
    select_json: str
    select_pending: str
    select_one: str
    fold: str
    measure: str
    measure_one: str
    measure_values: str
    normalize: tuple[str, str, str]


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def clock_sql(
    table: str, columns: tuple[str, ...], primary_key: tuple[str, ...], key_types: tuple[str, ...]
) -> ClockSql:
    """The clock statements of ``table`` whose key columns have the affinities
    ``key_types`` (see ``affinity``)."""
    name = CLOCK_PREFIX + table
    clock = _q(name)
    qt = _q(table)
    keys = [f"_k{i}" for i in range(len(primary_key))]
    key_list = ", ".join(keys)
    meta = "_version, _origin, _seq, _deleted"
    row_size = (
        "("
        + " + ".join(
            f"ifnull(length(CAST(t.{_q(c)} AS BLOB)), 0)" for c in (*columns, *primary_key)
        )
        + ")"
    )
    size = (
        " + ".join(f"total(length(CAST(t.{_q(c)} AS BLOB)))" for c in columns)
        + ", "
        + " + ".join(f"total(length(CAST(t.{_q(c)} AS BLOB)))" for c in primary_key)
    )
    ddl = (
        f"CREATE TABLE IF NOT EXISTS {clock} ("
        + "".join(f"{k} {t} NOT NULL, " for k, t in zip(keys, key_types, strict=True))
        + "_version INTEGER NOT NULL CHECK (_version > 0), _origin INTEGER NOT NULL, "
        "_seq INTEGER NOT NULL CHECK (_seq >= 0), "
        "_deleted INTEGER NOT NULL CHECK (_deleted IN (0, 1)), "
        f"PRIMARY KEY ({key_list})) WITHOUT ROWID",
    )
    assign = (
        "_version = excluded._version, _origin = excluded._origin, _seq = excluded._seq, "
        "_deleted = excluded._deleted"
    )
    newer = (
        "WHERE excluded._version > _version OR "
        "(excluded._version = _version AND excluded._seq > _seq)"
    )
    conflict = f"ON CONFLICT ({key_list}) DO UPDATE SET {assign}"
    if len(keys) == 1:
        json_parts = ["j.value"]
    else:
        json_parts = [f"json_extract(j.value, '$[{i}]')" for i in range(len(keys))]
    t_keys = [f"t.{_q(k)}" for k in primary_key]
    join_json = " AND ".join(f"{t} = {j}" for t, j in zip(t_keys, json_parts, strict=True))
    join_bound = " AND ".join(f"{t} = ?" for t in t_keys)
    join_clock = " AND ".join(f"{t} = c.{k}" for t, k in zip(t_keys, keys, strict=True))
    placeholders = ", ".join("?" for _ in keys)
    cols = ", ".join(f"t.{_q(c)}" for c in columns)
    return ClockSql(
        table=table,
        clock=name,
        key_types=key_types,
        json_types=tuple(_JSON_STABLE[t] for t in key_types),
        ddl=ddl,
        capture_upserts=(
            f"INSERT INTO {clock} ({key_list}, {meta}) "
            f"SELECT {', '.join(t_keys)}, ?1, ?2, j.key, 0 FROM json_each(?3) AS j "
            f"CROSS JOIN {qt} AS t ON {join_json} "
            f"WHERE j.type != 'null' AND {row_size} <= ?4 {conflict} {newer}"
        ),
        capture_deletes=(
            f"INSERT INTO {clock} ({key_list}, {meta}) "
            f"SELECT {', '.join(json_parts)}, ?1, ?2, j.key, 1 FROM json_each(?3) AS j "
            f"WHERE j.type != 'null' {conflict} {newer}"
        ),
        capture_upsert_one=(
            f"INSERT INTO {clock} ({key_list}, {meta}) "
            f"SELECT {', '.join(t_keys)}, ?, ?, ?, 0 FROM {qt} AS t "
            f"WHERE {join_bound} {conflict} {newer}"
        ),
        capture_delete_one=(
            f"INSERT INTO {clock} ({key_list}, {meta}) VALUES ({placeholders}, ?, ?, ?, 1) "
            f"{conflict} {newer}"
        ),
        write=(
            f"INSERT INTO {clock} ({key_list}, {meta}) VALUES ({placeholders}, ?, ?, ?, ?) "
            f"{conflict}"
        ),
        winner=(
            f"SELECT _version, _origin, _seq, _deleted FROM {clock} WHERE "
            + " AND ".join(f"{k} = ?" for k in keys)
        ),
        select_json=(
            f"SELECT c._seq, c._deleted, t.{_q(primary_key[0])} IS NOT NULL, "
            f"{', '.join('c.' + k for k in keys)}, {cols} "
            f"FROM json_each(?1) AS j JOIN {clock} AS c ON "
            + " AND ".join(f"c.{k} = {j}" for k, j in zip(keys, json_parts, strict=True))
            + f" LEFT JOIN {qt} AS t ON {join_clock} "
            "WHERE j.type != 'null' AND c._origin = ?2 AND c._version = ?3"
        ),
        select_pending=(
            f"SELECT j.key, ifnull(c._version = ?3 AND c._deleted, 0), "
            f"t.{_q(primary_key[0])} IS NOT NULL, {', '.join(json_parts)}, {cols} "
            f"FROM json_each(?1) AS j LEFT JOIN {clock} AS c ON "
            + " AND ".join(f"c.{k} = {j}" for k, j in zip(keys, json_parts, strict=True))
            + f" LEFT JOIN {qt} AS t ON {join_json} "
            "WHERE j.type != 'null' AND (c._version IS NULL OR c._version < ?3 OR "
            "(c._version = ?3 AND c._origin = ?2 AND c._seq = j.key))"
        ),
        fold=(
            f"INSERT INTO {clock} ({key_list}, {meta}) "
            f"SELECT {', '.join(json_parts)}, ?1, ?2, j.key, 0 FROM json_each(?3) AS j "
            f"WHERE j.type != 'null' {conflict} {newer}"
        ),
        select_one=(
            f"SELECT c._seq, c._deleted, t.{_q(primary_key[0])} IS NOT NULL, "
            f"{', '.join('c.' + k for k in keys)}, {cols} "
            f"FROM {clock} AS c LEFT JOIN {qt} AS t ON {join_clock} WHERE "
            + " AND ".join(f"c.{k} = ?" for k in keys)
            + " AND c._origin = ? AND c._version = ?"
        ),
        measure=(
            f"SELECT count(*), {size} FROM json_each(?1) AS j JOIN {qt} AS t ON {join_json} "
            "WHERE j.type != 'null'"
        ),
        measure_one=f"SELECT count(*), {size} FROM {qt} AS t WHERE {join_bound}",
        measure_values=(
            "SELECT count(*), "
            + (
                " + ".join(
                    f"total(length(CAST(t.{_q(c)} AS BLOB)))"
                    for c in columns
                    if c not in primary_key
                )
                or "0"
            )
            + ", (SELECT db_version FROM __chrysalis_replica_v1 WHERE singleton = 1), "
            + _clock_floor("?2")
            + ", (SELECT schema_version FROM pragma_schema_version)"
            # no ``j.type != 'null'`` filter: its array has no ``null`` (every capture is
            # listed), and a ``null`` would join no row anyway; the filter cost a tenth of the
            # query
            + f" FROM json_each(?1) AS j CROSS JOIN {qt} AS t ON {join_json}"
        ),
        normalize=(
            f"CREATE TEMP TABLE IF NOT EXISTS {_q('__chrysalis_keys_v1_' + table)} ("
            + ", ".join(f"{k} {t}" for k, t in zip(keys, key_types, strict=True))
            + ")",
            f"INSERT INTO temp.{_q('__chrysalis_keys_v1_' + table)} (rowid, {key_list}) "
            f"VALUES (?, {placeholders})",
            f"DELETE FROM temp.{_q('__chrysalis_keys_v1_' + table)} RETURNING rowid, {key_list}",
        ),
    )


INSERT_ORIGIN: Final = "INSERT OR IGNORE INTO __chrysalis_origins_v1 (site_id) VALUES (?)"
UPSERT_FRONTIER_ELIGIBLE: Final = (
    "INSERT INTO __chrysalis_frontiers_v5 "
    "(peer_pid, peer_site_id, origin_site_id, synced_at, eligible) VALUES (?, ?, ?, 0, ?) "
    "ON CONFLICT (peer_pid, peer_site_id, origin_site_id) DO UPDATE SET eligible = "
    "excluded.eligible"
)
ADVANCE_FRONTIER: Final = (
    "INSERT INTO __chrysalis_frontiers_v5 "
    "(peer_pid, peer_site_id, origin_site_id, synced_at, eligible) VALUES (?, ?, ?, ?, 1) "
    "ON CONFLICT (peer_pid, peer_site_id, origin_site_id) DO UPDATE SET synced_at = "
    "MAX(synced_at, excluded.synced_at)"
)
UPSERT_PEER_STATE: Final = (
    "INSERT INTO __chrysalis_peer_state_v1 "
    "(peer_pid, peer_site_id, origin_position, eligibility_mode) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (peer_pid, peer_site_id) DO UPDATE SET origin_position = "
    "excluded.origin_position, eligibility_mode = excluded.eligibility_mode"
)


# --------------------------------------------------------------------------------------------
# Garbage collection (issue 6: "clock-entry garbage collection"; see ``Replica.collect_garbage``)

GC_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS __chrysalis_gc_peers_v1 (
        peer_site_id BLOB PRIMARY KEY,
        floor INTEGER NOT NULL CHECK (floor >= 0),
        forgotten INTEGER NOT NULL DEFAULT 0 CHECK (forgotten IN (0, 1))) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_gc_inbound_v1 (
        peer_site_id BLOB NOT NULL,
        origin INTEGER NOT NULL,
        received_through INTEGER NOT NULL CHECK (received_through >= 0),
        PRIMARY KEY (peer_site_id, origin)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_gc_collected_v1 (
        origin INTEGER PRIMARY KEY,
        collected_through INTEGER NOT NULL CHECK (collected_through > 0))""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_gc_marks_v1 (
        at REAL PRIMARY KEY,
        clock INTEGER NOT NULL CHECK (clock >= 0)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_gc_filter_v1 (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        bits BLOB NOT NULL)""",
)
"""The garbage collector's durable state. ``gc_peers``: every peer site seen in a session
(``floor``: the greatest tombstone version collected before it was first seen; ``forgotten``:
dropped by ``Replica.forget_peer_site``, refused from then on). ``gc_inbound``: per peer site
and origin (registry position), the greatest version received from that peer (it held every
change of that origin up to there, or a greater one, since it sends per origin in version
order). ``gc_collected``: per origin, the greatest version of a tombstone collected.
``gc_marks``: ``(wall time passed in, clock)`` samples that turn a retention in seconds into
a version horizon. ``gc_filter``: a Bloom filter of every collected row (table and key),
which tells a row that may have been collected from one that certainly was not."""
SELECT_FILTER: Final = "SELECT bits FROM __chrysalis_gc_filter_v1 WHERE singleton = 1"
UPSERT_FILTER: Final = (
    "INSERT INTO __chrysalis_gc_filter_v1 (singleton, bits) VALUES (1, ?) "
    "ON CONFLICT (singleton) DO UPDATE SET bits = excluded.bits"
)
ADMIT_PEER: Final = (
    "INSERT OR IGNORE INTO __chrysalis_gc_peers_v1 (peer_site_id, floor) VALUES (?, "
    "ifnull((SELECT max(collected_through) FROM __chrysalis_gc_collected_v1), 0))"
)
SELECT_PEER_GC: Final = (
    "SELECT floor, forgotten FROM __chrysalis_gc_peers_v1 WHERE peer_site_id = ?"
)
ADVANCE_INBOUND: Final = (
    "INSERT INTO __chrysalis_gc_inbound_v1 (peer_site_id, origin, received_through) "
    "VALUES (?, ?, ?) ON CONFLICT (peer_site_id, origin) DO UPDATE SET received_through = "
    "MAX(received_through, excluded.received_through)"
)
KNOWN_PEER_SITES: Final = (
    "SELECT peer_site_id FROM __chrysalis_gc_peers_v1 WHERE forgotten = 0 "
    "UNION SELECT peer_site_id FROM __chrysalis_frontiers_v5 "
    "UNION SELECT peer_site_id FROM __chrysalis_gc_inbound_v1 "
    "EXCEPT SELECT peer_site_id FROM __chrysalis_gc_peers_v1 WHERE forgotten = 1"
)
"""Peer sites whose coverage bounds collection (a database of a release without
``gc_peers`` knows its peers from their frontiers)."""
COVERAGE: Final = (
    "SELECT f.peer_site_id, o.position, max(f.synced_at) FROM __chrysalis_frontiers_v5 AS f "
    "JOIN __chrysalis_origins_v1 AS o ON o.site_id = f.origin_site_id "
    "GROUP BY f.peer_site_id, o.position "
    "UNION ALL SELECT peer_site_id, origin, received_through FROM __chrysalis_gc_inbound_v1"
)
"""Per peer site and origin position, what the peer is known to hold: acknowledged
(frontiers, every incarnation of the site, eligible or not) or sent to us (``gc_inbound``);
the caller takes the maximum of the rows of one pair."""
RECORD_COLLECTED: Final = (
    "INSERT INTO __chrysalis_gc_collected_v1 (origin, collected_through) VALUES (?, ?) "
    "ON CONFLICT (origin) DO UPDATE SET collected_through = "
    "MAX(collected_through, excluded.collected_through)"
)
SELECT_COLLECTED: Final = (
    "SELECT o.site_id, c.collected_through FROM __chrysalis_gc_collected_v1 AS c "
    "JOIN __chrysalis_origins_v1 AS o ON o.position = c.origin ORDER BY o.site_id"
)
HORIZON_MARK: Final = (
    "SELECT at, clock FROM __chrysalis_gc_marks_v1 WHERE at <= ? ORDER BY at DESC LIMIT 1"
)
PRUNE_MARKS: Final = "DELETE FROM __chrysalis_gc_marks_v1 WHERE at < ?"
LAST_MARK: Final = "SELECT max(at) FROM __chrysalis_gc_marks_v1"
INSERT_MARK: Final = (
    "INSERT INTO __chrysalis_gc_marks_v1 (at, clock) SELECT ?, db_version "
    "FROM __chrysalis_replica_v1 WHERE singleton = 1 "
    "ON CONFLICT (at) DO UPDATE SET clock = excluded.clock"
)
SCAN_VERSIONS: Final = (
    "SELECT rowid, origin, db_version, table_name, keys FROM __chrysalis_versions_v1 "
    "WHERE rowid > ? ORDER BY rowid LIMIT ?"
)
PENDING_BEYOND: Final = (
    "SELECT 1 FROM __chrysalis_versions_v1 WHERE origin = ?1 AND db_version > "
    "(SELECT folded_through FROM __chrysalis_folded_v1 WHERE singleton = 1) + ?2 LIMIT 1"
)
"""Whether a local version more than ``?2`` above the fold mark is listed (one index seek):
how a commit notices that the pending backlog crossed its bound."""


@dataclass(frozen=True, slots=True)
class GcSql:
    """The collector's statements for one clock table. ``live_json`` (JSON array of keys,
    origin, version) / ``live_one`` (key values, origin, version): the entries among those keys
    that the version still wins, as ``(key values..., deleted)``. ``collect`` (key values,
    origin, version): delete that entry if it is still that version's tombstone.
    ``tombstones``: how many tombstones the table holds (a full scan: status only)."""

    live_json: str
    live_one: str
    collect: str
    tombstones: str


def gc_sql(clock: ClockSql) -> GcSql:
    """The collector's statements for the clock table of ``clock``."""
    name = _q(clock.clock)
    keys = [f"_k{i}" for i in range(len(clock.key_types))]
    if len(keys) == 1:
        json_parts = ["j.value"]
    else:
        json_parts = [f"json_extract(j.value, '$[{i}]')" for i in range(len(keys))]
    by_key = " AND ".join(f"{k} = ?" for k in keys)
    return GcSql(
        live_json=(
            f"SELECT {', '.join('c.' + k for k in keys)}, c._deleted FROM json_each(?1) AS j "
            f"JOIN {name} AS c ON "
            + " AND ".join(f"c.{k} = {j}" for k, j in zip(keys, json_parts, strict=True))
            + " WHERE j.type != 'null' AND c._origin = ?2 AND c._version = ?3"
        ),
        live_one=(
            f"SELECT {', '.join(keys)}, _deleted FROM {name} WHERE {by_key} "
            "AND _origin = ? AND _version = ?"
        ),
        collect=(
            f"DELETE FROM {name} WHERE {by_key} AND _origin = ? AND _version = ? AND _deleted = 1"
        ),
        tombstones=f"SELECT count(*) FROM {name} WHERE _deleted = 1",
    )
