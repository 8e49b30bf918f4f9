"""The ``chrysalis sqlite`` shell core: query a node's database, list tables and schema, and
report replication status per peer (read from the database alone, so it works on a file whose
node is not running).
"""

from __future__ import annotations

from chrysalis.sqlite._shell import (
    DEFAULT_MAX_ROWS,
    MAX_STATEMENT_BYTES,
    PROMPT,
    PROMPT_CONTINUE,
    GcStatus,
    OriginProgress,
    PeerReplicationStatus,
    ResultSet,
    ShellError,
    ShellOutcome,
    ShellSession,
    connect,
    format_gc_status,
    format_result_sets,
    format_status,
    format_value,
    gc_status,
    query,
    replication_status,
    schema,
    split_statements,
    tables,
)

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
