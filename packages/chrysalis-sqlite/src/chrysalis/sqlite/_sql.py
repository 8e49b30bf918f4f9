"""SQL of the ``__chrysalis_*`` metadata tables and the statements that maintain them.

Why a module of its own: the layout is a compatibility surface (it matches the reference
implementation table for table, so a database file can move between implementations), and both
the capture path (``ReplicaTransaction``) and the replica's apply/selection paths use these
statements. Keeping every metadata statement in one place keeps them consistent with the DDL.
Nothing here runs SQL; it only defines it.

Why the apply statements (``*_INCOMING``) go through a scratch table: a received chunk holds
thousands of changes, so each change's values are bound once (into the ``TEMP`` stage), and the
duplicate check, the winner lookup and the log and winner writes are set operations on it.

Why the local-commit statements look the way they do (``INSERT_LOCAL_CHANGES``,
``RESOLVE_LOCAL_VERSION``): a local commit writes one change-log row and one winner per captured
mutation, and through ``sqlite3`` the fixed cost of each bound statement step (binding six
parameters, one VM run, the Python-to-C crossing) was as large as the B-tree insert itself. So
the change log is written with multi-row ``VALUES`` statements of ``LOCAL_CHUNK_SIZES`` rows
(site id, version and first sequence number bound once per statement, three values per row),
and the winners are not bound at all: ``RESOLVE_LOCAL_VERSION`` copies them from the log rows
the commit just appended, in sequence order, in one statement. Every SQL text is a constant, so
``sqlite3``'s statement cache prepares each one once per connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "ADVANCE_CLOCK",
    "ADVANCE_FRONTIER",
    "BUMP_CLOCK",
    "CLEAR_INCOMING",
    "DROP_INCOMING",
    "INCOMING_DDL",
    "INSERT_LOCAL_CHANGES",
    "INSERT_ORIGIN",
    "LOG_INCOMING",
    "LOCAL_CHUNK_SIZES",
    "METADATA_DDL",
    "RESOLVE_INCOMING",
    "RESOLVE_LOCAL_VERSION",
    "SELECT_FOR_PEER",
    "SELECT_INCOMING",
    "STAGE_INCOMING",
    "UPSERT_FRONTIER_ELIGIBLE",
    "UPSERT_PEER_STATE",
]

METADATA_DDL: Final = (
    """CREATE TABLE IF NOT EXISTS __chrysalis_replica_v1 (
        singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
        site_id BLOB NOT NULL CHECK (length(site_id) = 16),
        db_version INTEGER NOT NULL CHECK (db_version >= 0))""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_changes_v1 (
        site_id BLOB NOT NULL,
        db_version INTEGER NOT NULL CHECK (db_version > 0),
        seq INTEGER NOT NULL CHECK (seq >= 0),
        table_name TEXT NOT NULL,
        key_values BLOB NOT NULL,
        row_values BLOB,
        PRIMARY KEY (site_id, db_version, seq)) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS __chrysalis_resolved_rows_v2 (
        table_name TEXT NOT NULL,
        key_values BLOB NOT NULL,
        db_version INTEGER NOT NULL CHECK (db_version > 0),
        site_id BLOB NOT NULL,
        seq INTEGER NOT NULL CHECK (seq >= 0),
        deleted INTEGER NOT NULL CHECK (deleted IN (0, 1)),
        PRIMARY KEY (table_name, key_values)) WITHOUT ROWID""",
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

BUMP_CLOCK: Final = (
    "UPDATE __chrysalis_replica_v1 SET db_version = db_version + 1 WHERE singleton = 1 "
    "RETURNING db_version"
)
ADVANCE_CLOCK: Final = (
    "UPDATE __chrysalis_replica_v1 SET db_version = MAX(db_version, ?) WHERE singleton = 1"
)
LOCAL_CHUNK_SIZES: Final = (32, 16, 8, 4, 2, 1)
"""Rows per ``INSERT_LOCAL_CHANGES`` statement, largest first: a commit of ``n`` mutations
takes ``n // 32`` full statements and at most five more (the binary digits of ``n % 32``)."""


def _insert_local_changes(rows: int) -> str:
    values = ", ".join(
        f"(?1, ?2, ?3 + {i}, ?{4 + 3 * i}, ?{5 + 3 * i}, ?{6 + 3 * i})" for i in range(rows)
    )
    return (
        "INSERT INTO __chrysalis_changes_v1 "
        f"(site_id, db_version, seq, table_name, key_values, row_values) VALUES {values}"
    )


INSERT_LOCAL_CHANGES: Final[Mapping[int, str]] = MappingProxyType(
    {rows: _insert_local_changes(rows) for rows in LOCAL_CHUNK_SIZES}
)
"""Per chunk size, the statement that appends that many local mutations to the change log.

Parameters: ``site_id, db_version, first seq`` and then ``table_name, key_values, row_values``
per mutation; row ``i`` gets ``seq = first seq + i``. A plain ``INSERT`` (no ``OR IGNORE``): a
local version is new (the clock is above every logged version), so a conflict means the
metadata is corrupt and must abort the commit."""

RESOLVE_LOCAL_VERSION: Final = (
    "INSERT INTO __chrysalis_resolved_rows_v2 "
    "(table_name, key_values, db_version, site_id, seq, deleted) "
    "SELECT table_name, key_values, db_version, site_id, seq, row_values IS NULL "
    "FROM __chrysalis_changes_v1 WHERE site_id = ?1 AND db_version = ?2 ORDER BY seq "
    "ON CONFLICT (table_name, key_values) DO UPDATE SET db_version = excluded.db_version, "
    "site_id = excluded.site_id, seq = excluded.seq, deleted = excluded.deleted"
)
"""Record every change of the local version ``(site_id ?1, db_version ?2)`` as its row's
winner, in sequence order (so the last capture of a row in one transaction wins). A local
version is greater than every tuple already recorded, so no comparison is needed."""

INCOMING_DDL: Final = (
    "CREATE TEMP TABLE IF NOT EXISTS __chrysalis_incoming_v1 ("
    "i INTEGER PRIMARY KEY, site_id BLOB NOT NULL, db_version INTEGER NOT NULL, "
    "seq INTEGER NOT NULL, table_name TEXT NOT NULL, key_values BLOB NOT NULL, row_values BLOB)"
)
"""A per-connection scratch table (``TEMP``: never in the database file) holding each change
of the chunk being applied, as it will be logged. One join then answers "is it already
logged?" and "what is the row's current winner?" for the whole chunk, and the log rows and
winners are copied from it by ``INSERT ... SELECT`` (each change's values are bound once)."""
STAGE_INCOMING: Final = (
    "INSERT INTO temp.__chrysalis_incoming_v1 "
    "(i, site_id, db_version, seq, table_name, key_values, row_values) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
SELECT_INCOMING: Final = (
    "SELECT l.seq IS NOT NULL, r.db_version, r.site_id, r.seq "
    "FROM temp.__chrysalis_incoming_v1 AS s "
    "LEFT JOIN __chrysalis_changes_v1 AS l "
    "ON l.site_id = s.site_id AND l.db_version = s.db_version AND l.seq = s.seq "
    "LEFT JOIN __chrysalis_resolved_rows_v2 AS r "
    "ON r.table_name = s.table_name AND r.key_values = s.key_values "
    "ORDER BY s.i"
)
"""Per staged change, in chunk order: whether the log already holds its origin tuple, and the
recorded winner ``(db_version, site_id, seq)`` of its row (NULLs: none)."""
DROP_INCOMING: Final = "DELETE FROM temp.__chrysalis_incoming_v1 WHERE i = ?"
"""Drop one staged change (a duplicate before logging, a non-winner before resolving): in
the common case (every change new and winning) nothing is dropped, so nothing is bound."""
LOG_INCOMING: Final = (
    "INSERT OR IGNORE INTO __chrysalis_changes_v1 "
    "(site_id, db_version, seq, table_name, key_values, row_values) "
    "SELECT site_id, db_version, seq, table_name, key_values, row_values "
    "FROM temp.__chrysalis_incoming_v1 ORDER BY i"
)
"""Log every staged change (the caller dropped the duplicates first)."""
RESOLVE_INCOMING: Final = (
    "INSERT INTO __chrysalis_resolved_rows_v2 "
    "(table_name, key_values, db_version, site_id, seq, deleted) "
    "SELECT table_name, key_values, db_version, site_id, seq, row_values IS NULL "
    "FROM temp.__chrysalis_incoming_v1 WHERE true ORDER BY i "
    "ON CONFLICT (table_name, key_values) DO UPDATE SET db_version = excluded.db_version, "
    "site_id = excluded.site_id, seq = excluded.seq, deleted = excluded.deleted"
)
"""Record every staged change as its row's winner (the caller left one per row). ``WHERE
true`` keeps SQLite from reading ``ON CONFLICT`` as part of a join."""
CLEAR_INCOMING: Final = "DELETE FROM temp.__chrysalis_incoming_v1"

INSERT_ORIGIN: Final = "INSERT OR IGNORE INTO __chrysalis_origins_v1 (site_id) VALUES (?)"
SELECT_FOR_PEER: Final = (
    "SELECT c.site_id, c.db_version, c.seq, c.table_name, c.key_values, c.row_values "
    "FROM __chrysalis_frontiers_v5 AS f JOIN __chrysalis_changes_v1 AS c "
    "ON c.site_id = f.origin_site_id AND c.db_version > f.synced_at "
    "WHERE f.peer_pid = ? AND f.peer_site_id = ? AND f.eligible = 1 "
    "ORDER BY c.site_id, c.db_version, c.seq"
)
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
