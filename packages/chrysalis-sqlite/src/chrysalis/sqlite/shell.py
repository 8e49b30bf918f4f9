"""The core of ``chrysalis sqlite``: a shell on a node's database (upper spec 6.6).

Why a separate core: the command-line tool only reads lines and prints; everything that decides
what a line means and what comes back lives here, as plain functions over a ``sqlite3``
connection that return values (result sets, table names, schema text, per-peer replication
status) plus one formatter, so it is testable without a terminal and reusable by other front
ends.

- ``split_statements`` cuts input into complete statements with SQLite's own
  ``sqlite3.complete_statement``, so ``;`` inside strings, comments and trigger bodies does not
  end a statement.
- ``ShellSession`` is the interactive state: ``feed(line)`` accumulates input until a statement
  is complete (``prompt`` says ``sqlite> `` or ``   ...> ``), runs meta-commands (``.help``,
  ``.tables``, ``.schema [TABLE]``, ``.status``, ``.exit``/``.quit``; only at the start of a
  statement and only ``.`` followed by a letter, so ``.5 + 1;`` stays SQL) and returns the text
  to print. SQL errors print as ``Error: ...`` and the shell continues.
- Output format: per result set a tab-separated header row and tab-separated rows, with a blank
  line between sets. ``NULL``, integers, reals, text with ``\\`` tab, newline and carriage return
  escaped, blobs as ``x'hex'``.
- ``replication_status`` reads the durable per-peer state the sessions keep (eligibility mode
  and, per origin, the acknowledged version and how many rows it still has to send), so
  it works on a database file whether or not its node is running; ``gc_status`` adds the
  garbage collector's state (tombstones held, pending versions, peers, what was collected).

Bounds: one statement's text is at most ``MAX_STATEMENT_BYTES``; a result set returns at most
``max_rows`` rows (``truncated`` says more existed). Writes made here bypass replication
(open read-only with ``connect(path, read_only=True)`` to prevent them).
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, final

from chrysalis.core import Pid
from chrysalis.sqlite._replica import Replica
from chrysalis.sqlite._scope import EligibilityMode
from chrysalis.sqlite._sql import CLOCK_PREFIX, KNOWN_PEER_SITES, SELECT_COLLECTED
from chrysalis.sqlite._values import SqlValue

__all__ = [
    "DEFAULT_MAX_ROWS",
    "MAX_STATEMENT_BYTES",
    "PROMPT",
    "PROMPT_CONTINUE",
    "GcStatus",
    "OriginProgress",
    "PeerReplicationStatus",
    "ResultSet",
    "ShellError",
    "ShellOutcome",
    "ShellSession",
    "connect",
    "format_gc_status",
    "format_result_sets",
    "format_status",
    "format_value",
    "gc_status",
    "query",
    "replication_status",
    "schema",
    "split_statements",
    "tables",
]

PROMPT: Final = "sqlite> "
"""The prompt at the start of a statement."""
PROMPT_CONTINUE: Final = "   ...> "
"""The prompt while a statement is incomplete."""
MAX_STATEMENT_BYTES: Final = 1024 * 1024
"""Most characters of pending (incomplete) input or of one statement."""
DEFAULT_MAX_ROWS: Final = 10_000
"""Rows one result set returns by default."""

HELP: Final = """\
.exit                  Exit the shell
.help                  Show this message
.quit                  Exit the shell
.schema ?TABLE?        Show the CREATE statements (of TABLE only)
.status                Replication status per peer, then garbage collection
.tables                List tables and views"""


class ShellError(ValueError):
    """Input the shell refuses: a statement over ``MAX_STATEMENT_BYTES``, an unknown
    meta-command, or text with no complete statement where one is required."""


@final
@dataclass(frozen=True, slots=True)
class ResultSet:
    """The outcome of one statement: ``columns`` (empty for statements without results),
    ``rows`` (at most the row limit) and whether more rows existed (``truncated``)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[SqlValue, ...], ...]
    truncated: bool = False


@final
@dataclass(frozen=True, slots=True)
class OriginProgress:
    """Outbound progress toward one peer for one origin site.

    ``synced_at``: the highest version of the origin the peer acknowledged; ``latest``: the
    highest version of it that still wins a row here; ``pending``: rows whose winning change
    is of this origin and after ``synced_at``, which the peer has yet to acknowledge (0 when
    the origin is not ``eligible`` on this link).
    """

    origin_site_id: bytes
    eligible: bool
    synced_at: int
    latest: int
    pending: int


@final
@dataclass(frozen=True, slots=True)
class PeerReplicationStatus:
    """The durable replication state toward one peer incarnation ``(peer, peer_site_id)``."""

    peer: Pid
    peer_site_id: bytes
    mode: EligibilityMode
    origins: tuple[OriginProgress, ...]

    @property
    def pending(self) -> int:
        """Changes not yet acknowledged by this peer, over every eligible origin."""
        return sum(o.pending for o in self.origins)


def connect(path: str, *, read_only: bool = False, timeout: float = 5.0) -> sqlite3.Connection:
    """A connection to the database at ``path`` in autocommit mode (``read_only`` opens it
    with ``mode=ro``; a missing file is then an error instead of a new database)."""
    if read_only:
        return sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, timeout=timeout, isolation_level=None
        )
    return sqlite3.connect(path, timeout=timeout, isolation_level=None)


def _conn(source: sqlite3.Connection | Replica) -> sqlite3.Connection:
    return source.connection if isinstance(source, Replica) else source


def split_statements(text: str) -> tuple[list[str], str]:
    """Cut ``text`` into complete statements; returns ``(statements, remainder)``.

    A statement ends at a ``;`` where ``sqlite3.complete_statement`` says the text so far is
    complete; the incomplete rest is returned as ``remainder`` (whitespace-only: ``""``).
    ``ShellError`` when a statement or the remainder exceeds ``MAX_STATEMENT_BYTES``.
    """
    statements: list[str] = []
    start = 0
    position = text.find(";")
    while position >= 0:
        candidate = text[start : position + 1]
        if len(candidate) > MAX_STATEMENT_BYTES:
            raise ShellError(f"a statement is longer than {MAX_STATEMENT_BYTES} characters")
        if sqlite3.complete_statement(candidate):
            if candidate.strip() != ";":
                statements.append(candidate.strip())
            start = position + 1
        position = text.find(";", position + 1)
    remainder = text[start:]
    if len(remainder) > MAX_STATEMENT_BYTES:
        raise ShellError(f"a statement is longer than {MAX_STATEMENT_BYTES} characters")
    return statements, remainder if remainder.strip() else ""


def query(
    source: sqlite3.Connection | Replica,
    sql: str,
    *,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> list[ResultSet]:
    """Run every statement of ``sql`` in order; one ``ResultSet`` per statement.

    The text must end with a complete statement (``ShellError`` otherwise; a trailing
    statement without ``;`` is completed). ``sqlite3.Error`` from a statement propagates (the
    earlier statements have run). At most ``max_rows`` rows are kept per set.
    """
    if max_rows < 0:
        raise ValueError("max_rows must not be negative")
    statements, remainder = split_statements(sql)
    if remainder:
        more, rest = split_statements(remainder + ";")
        if rest:
            raise ShellError("incomplete SQL statement")
        statements.extend(more)
    conn = _conn(source)
    results: list[ResultSet] = []
    for statement in statements:
        cursor = conn.execute(statement)
        try:
            if cursor.description is None:
                results.append(ResultSet((), ()))
                continue
            columns = tuple(str(d[0]) for d in cursor.description)
            fetched = cursor.fetchmany(max_rows + 1) if max_rows else cursor.fetchmany(1)
            truncated = len(fetched) > max_rows
            kept = tuple(tuple(row) for row in fetched[:max_rows])
            results.append(ResultSet(columns, kept, truncated))
        finally:
            cursor.close()
    return results


def tables(source: sqlite3.Connection | Replica) -> list[str]:
    """Names of the tables and views not named ``sqlite_%``, sorted (``.tables``); the
    replication metadata tables (``__chrysalis_*``) are included."""
    rows = _conn(source).execute(
        "SELECT name FROM sqlite_schema WHERE type IN ('table', 'view') "
        "AND name NOT LIKE 'sqlite_%' ORDER BY name"
    )
    return [str(name) for (name,) in rows]


def schema(source: sqlite3.Connection | Replica, table: str | None = None) -> list[str]:
    """The ``CREATE`` statements (each ending in ``;``) of every object not named
    ``sqlite_%``, or only of ``table`` and its indexes and triggers (``.schema [TABLE]``;
    the name compares case-insensitively)."""
    sql = "SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'"
    params: tuple[str, ...] = ()
    if table is not None:
        sql += " AND lower(tbl_name) = lower(?)"
        params = (table,)
    sql += " ORDER BY tbl_name, type DESC, name"
    return [f"{text};" for (text,) in _conn(source).execute(sql, params)]


def replication_status(
    source: sqlite3.Connection | Replica, *, max_peers: int = 1024
) -> list[PeerReplicationStatus]:
    """Per peer incarnation: eligibility mode and per-origin progress (see
    ``PeerReplicationStatus``), ordered by peer PID; at most ``max_peers`` peers.

    Local versions whose clock entries are not yet written (pending a fold, see
    ``chrysalis.sqlite``): a ``Replica`` outside a transaction folds them first; on a plain
    connection (the shell's, possibly read-only) their listed keys are counted as they are,
    a row written by several pending versions once per version."""
    if isinstance(source, Replica) and not source.in_transaction:
        source._fold_all()
    conn = _conn(source)
    # per origin site: its newest version still winning a row, and per clock table the
    # (origin position, version) of every entry (the clock layout: see ``chrysalis.sqlite``)
    positions = dict(
        conn.execute("SELECT site_id, position FROM __chrysalis_origins_v1").fetchall()
    )
    clocks = [
        str(name)
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND substr(name, 1, ?) = ?",
            (len(CLOCK_PREFIX), CLOCK_PREFIX),
        )
    ]
    latest: dict[int, int] = {}
    for name in clocks:
        quoted = '"' + name.replace('"', '""') + '"'
        for position, version in conn.execute(
            f"SELECT _origin, MAX(_version) FROM {quoted} GROUP BY _origin"
        ):
            latest[position] = max(latest.get(position, 0), int(version))
    # pending local versions: above the fold mark (a database without one has none)
    local, folded = -1, 0
    if conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = '__chrysalis_folded_v1'"
    ).fetchone():
        row = conn.execute(
            "SELECT o.position, f.folded_through FROM __chrysalis_replica_v1 AS r "
            "JOIN __chrysalis_origins_v1 AS o ON o.site_id = r.site_id "
            "CROSS JOIN __chrysalis_folded_v1 AS f"
        ).fetchone()
        if row is not None:
            local, folded = int(row[0]), int(row[1])
            (newest,) = conn.execute(
                "SELECT max(db_version) FROM __chrysalis_versions_v1 "
                "WHERE origin = ? AND db_version > ?",
                (local, folded),
            ).fetchone()
            if newest is not None:
                latest[local] = max(latest.get(local, 0), int(newest))

    def pending_after(position: int, synced_at: int) -> int:
        count = 0
        if position == local:
            (n,) = conn.execute(
                "SELECT count(*) FROM __chrysalis_versions_v1 AS v, json_each(CASE WHEN "
                "typeof(v.keys) = 'text' THEN v.keys ELSE '[]' END) AS j "
                "WHERE v.origin = ? AND v.db_version > max(?, ?) AND j.type != 'null'",
                (local, synced_at, folded),
            ).fetchone()
            count += int(n)
        for name in clocks:
            quoted = '"' + name.replace('"', '""') + '"'
            (n,) = conn.execute(
                f"SELECT COUNT(*) FROM {quoted} WHERE _origin = ? AND _version > ?",
                (position, synced_at),
            ).fetchone()
            count += int(n)
        return count

    peers = conn.execute(
        "SELECT peer_pid, peer_site_id, eligibility_mode FROM __chrysalis_peer_state_v1 "
        "ORDER BY peer_pid, peer_site_id LIMIT ?",
        (max_peers,),
    ).fetchall()
    statuses: list[PeerReplicationStatus] = []
    for peer_pid, peer_site, mode in peers:
        origins: list[OriginProgress] = []
        frontier = conn.execute(
            "SELECT origin_site_id, synced_at, eligible FROM __chrysalis_frontiers_v5 "
            "WHERE peer_pid = ? AND peer_site_id = ? ORDER BY origin_site_id",
            (peer_pid, peer_site),
        ).fetchall()
        for origin, synced_at, eligible in frontier:
            position = positions.get(origin)
            pending = 0
            if eligible and position is not None:
                pending = pending_after(position, synced_at)
            origins.append(
                OriginProgress(
                    bytes(origin),
                    bool(eligible),
                    int(synced_at),
                    latest.get(position, 0) if position is not None else 0,
                    pending,
                )
            )
        statuses.append(
            PeerReplicationStatus(
                Pid(bytes(peer_pid)), bytes(peer_site), EligibilityMode(mode), tuple(origins)
            )
        )
    return statuses


@final
@dataclass(frozen=True, slots=True)
class GcStatus:
    """The garbage collector's view of a database (see ``Replica.collect_garbage``).

    ``tombstones``: clock entries of deleted rows still held; ``version_rows``: rows of
    ``__chrysalis_versions_v1``; ``pending_versions``: local version rows above the fold mark
    (bounded by ``MAX_PENDING_VERSIONS`` plus a fold step); ``peers`` / ``forgotten``: peer
    sites that bound collection / that were forgotten (refused); ``collected``: per origin
    site, the greatest tombstone version collected (rows deleted at or below it may be gone
    without trace)."""

    tombstones: int
    version_rows: int
    pending_versions: int
    peers: int
    forgotten: int
    collected: dict[bytes, int]


def gc_status(source: sqlite3.Connection | Replica) -> GcStatus:
    """``GcStatus`` read from the database alone (a full count of each clock table's
    tombstones: an administrative query, not one for a hot path). A database no release
    with the collector has opened reports zeros."""
    conn = _conn(source)
    present = {
        str(name)
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE '\\_\\_chrysalis%' "
            "ESCAPE '\\'"
        )
    }
    tombstones = 0
    for name in sorted(n for n in present if n.startswith(CLOCK_PREFIX)):
        quoted = '"' + name.replace('"', '""') + '"'
        (n,) = conn.execute(f"SELECT count(*) FROM {quoted} WHERE _deleted = 1").fetchone()
        tombstones += int(n)
    (version_rows,) = conn.execute("SELECT count(*) FROM __chrysalis_versions_v1").fetchone()
    pending = 0
    if "__chrysalis_folded_v1" in present:
        (pending,) = conn.execute(
            "SELECT count(*) FROM __chrysalis_versions_v1 WHERE origin = (SELECT o.position "
            "FROM __chrysalis_replica_v1 AS r JOIN __chrysalis_origins_v1 AS o "
            "ON o.site_id = r.site_id) AND db_version > "
            "(SELECT folded_through FROM __chrysalis_folded_v1)"
        ).fetchone()
    peers = forgotten = 0
    collected: dict[bytes, int] = {}
    if "__chrysalis_gc_peers_v1" in present:
        (peers,) = conn.execute(f"SELECT count(*) FROM ({KNOWN_PEER_SITES})").fetchone()
        (forgotten,) = conn.execute(
            "SELECT count(*) FROM __chrysalis_gc_peers_v1 WHERE forgotten = 1"
        ).fetchone()
        collected = {bytes(s): int(v) for s, v in conn.execute(SELECT_COLLECTED)}
    return GcStatus(
        int(tombstones), int(version_rows), int(pending), int(peers), int(forgotten), collected
    )


def format_gc_status(status: GcStatus) -> str:
    """``gc_status`` as tab-separated ``name\\tvalue`` lines, then one
    ``collected\\t<origin>\\t<version>`` line per origin."""
    lines = [
        f"tombstones\t{status.tombstones}",
        f"version_rows\t{status.version_rows}",
        f"pending_versions\t{status.pending_versions}",
        f"gc_peers\t{status.peers}",
        f"forgotten_peers\t{status.forgotten}",
    ]
    lines += [f"collected\t{site.hex()}\t{v}" for site, v in sorted(status.collected.items())]
    return "\n".join(lines)


def format_value(value: SqlValue) -> str:
    """One value as the shell prints it (``NULL``, numbers, escaped text, ``x'hex'``)."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"x'{value.hex()}'"
    if isinstance(value, str):
        return (
            value.replace("\\", "\\\\")
            .replace("\t", "\\t")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
    return repr(value) if isinstance(value, float) else str(value)


def format_result_sets(results: Iterable[ResultSet]) -> str:
    """Tab-separated header and rows per result set with columns, a blank line between sets
    (sets without columns print nothing); no trailing newline."""
    blocks: list[str] = []
    for result in results:
        if not result.columns:
            continue
        lines = ["\t".join(format_value(c) for c in result.columns)]
        lines.extend("\t".join(format_value(v) for v in row) for row in result.rows)
        if result.truncated:
            lines.append(f"... (more than {len(result.rows)} rows)")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def format_status(statuses: Sequence[PeerReplicationStatus]) -> str:
    """``replication_status`` as a tab-separated table: one row per (peer, origin)."""
    header = "peer\tpeer_site\tmode\torigin\teligible\tsynced_at\tlatest\tpending"
    lines = [header]
    for status in statuses:
        for origin in status.origins:
            lines.append(
                f"{status.peer.hex()}\t{status.peer_site_id.hex()}\t{status.mode.name.lower()}\t"
                f"{origin.origin_site_id.hex()}\t{int(origin.eligible)}\t{origin.synced_at}\t"
                f"{origin.latest}\t{origin.pending}"
            )
    return "\n".join(lines)


class ShellOutcome(enum.Enum):
    """What ``ShellSession.feed`` asks the front end to do next."""

    CONTINUE = "continue"
    """Print the output (if any) and read the next line."""
    EXIT = "exit"
    """Print the output (if any) and stop."""


@final
class ShellSession:
    """The interactive shell's state over one connection (see the module docstring).

    ``feed(line)`` returns ``(outcome, text)``: the text to print (possibly empty) and whether
    to continue. ``prompt`` is the prompt for the next line; ``pending`` the incomplete input.
    """

    __slots__ = ("_buffer", "_conn", "_max_rows")

    def __init__(
        self, source: sqlite3.Connection | Replica, *, max_rows: int = DEFAULT_MAX_ROWS
    ) -> None:
        self._conn = _conn(source)
        self._buffer = ""
        self._max_rows = max_rows

    @property
    def prompt(self) -> str:
        """``PROMPT`` at the start of a statement, ``PROMPT_CONTINUE`` inside one."""
        return PROMPT_CONTINUE if self._buffer else PROMPT

    @property
    def pending(self) -> str:
        """Input read but not yet run (an incomplete statement)."""
        return self._buffer

    def feed(self, line: str) -> tuple[ShellOutcome, str]:
        """Handle one input line (without its newline)."""
        if not self._buffer:
            stripped = line.strip()
            if len(stripped) >= 2 and stripped[0] == "." and stripped[1].isalpha():
                return self._meta(stripped)
        text = f"{self._buffer}\n{line}" if self._buffer else line
        try:
            statements, self._buffer = split_statements(text)
        except ShellError as exc:
            self._buffer = ""
            return ShellOutcome.CONTINUE, f"Error: {exc}"
        outputs: list[str] = []
        for statement in statements:
            try:
                rendered = format_result_sets(query(self._conn, statement, max_rows=self._max_rows))
            except (sqlite3.Error, sqlite3.Warning, ShellError) as exc:
                rendered = f"Error: {exc}"
            if rendered:
                outputs.append(rendered)
        return ShellOutcome.CONTINUE, "\n\n".join(outputs)

    def _meta(self, command: str) -> tuple[ShellOutcome, str]:
        name, _, argument = command.partition(" ")
        argument = argument.strip()
        try:
            if name in (".exit", ".quit"):
                return ShellOutcome.EXIT, ""
            if name == ".help":
                return ShellOutcome.CONTINUE, HELP
            if name == ".tables":
                return ShellOutcome.CONTINUE, "\n".join(tables(self._conn))
            if name == ".schema":
                return ShellOutcome.CONTINUE, "\n".join(schema(self._conn, argument or None))
            if name == ".status":
                peers = format_status(replication_status(self._conn))
                return ShellOutcome.CONTINUE, peers + "\n\n" + format_gc_status(
                    gc_status(self._conn)
                )
        except (sqlite3.Error, sqlite3.Warning) as exc:
            return ShellOutcome.CONTINUE, f"Error: {exc}"
        return ShellOutcome.CONTINUE, f'Error: unknown command "{name}"; enter ".help"'
