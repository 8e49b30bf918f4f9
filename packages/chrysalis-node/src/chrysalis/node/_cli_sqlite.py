"""``chrysalis sqlite DB ACTION``: a shell on a node's database. The shell core lives in
``chrysalis.sqlite.shell``; chrysalis-sqlite sits above chrysalis-node in the package graph, so
``chrysalis.node._cli`` imports this module only for ``sqlite`` and reports a missing
chrysalis-sqlite as one line."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from typing import Any, TextIO

from chrysalis.node._cli import CliError, _emit, _emit_lines
from chrysalis.sqlite import shell

__all__ = ["sqlite_command"]


def sqlite_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run one ``sqlite`` action (``shell`` when none is given); its exit code."""
    path = str(args.database)
    if not Path(path).exists():
        raise CliError(f"no database at {path}")
    action = args.sqlite_command or "shell"
    writable = action == "shell" or bool(getattr(args, "write", False))
    try:
        conn = shell.connect(path, read_only=not writable)
        try:
            if action == "query":
                results = shell.query(conn, args.sql)
                if args.json:
                    _emit(out, json.dumps([_result_record(result) for result in results]))
                else:
                    _emit(out, shell.format_result_sets(results))
            elif action == "tables":
                names = shell.tables(conn)
                if args.json:
                    _emit(out, json.dumps(names))
                else:
                    _emit_lines(out, names)
            elif action == "schema":
                statements = shell.schema(conn, args.table)
                if args.json:
                    _emit(out, json.dumps(statements))
                else:
                    _emit_lines(out, statements)
            elif action == "status":
                statuses = shell.replication_status(conn)
                if args.json:
                    _emit(out, json.dumps([_status_record(status) for status in statuses]))
                else:
                    _emit(out, shell.format_status(statuses))
            else:
                session = shell.ShellSession(conn)
                while True:
                    try:
                        line = input(session.prompt)
                    except EOFError:
                        return 0
                    outcome, text = session.feed(line)
                    if text:
                        _emit(out, text)
                    if outcome is shell.ShellOutcome.EXIT:
                        return 0
        finally:
            conn.close()
    except shell.ShellError as exc:
        raise CliError(str(exc)) from exc
    except sqlite3.Error as exc:
        raise CliError(f"sqlite: {exc}") from exc
    return 0


def _json_value(value: object) -> object:
    """A SQL value as JSON: BLOBs as ``{"hex": "..."}``, everything else as is."""
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    return value


def _result_record(result: Any) -> dict[str, Any]:
    """The JSON shape of one ``chrysalis.sqlite.shell.ResultSet``."""
    return {
        "columns": list(result.columns),
        "rows": [[_json_value(value) for value in row] for row in result.rows],
        "truncated": bool(result.truncated),
    }


def _status_record(status: Any) -> dict[str, Any]:
    """The JSON shape of one ``chrysalis.sqlite.shell.PeerReplicationStatus``."""
    return {
        "peer": status.peer.hex(),
        "peer_site_id": status.peer_site_id.hex(),
        "mode": status.mode.name.lower(),
        "pending": status.pending,
        "origins": [
            {
                "origin_site_id": origin.origin_site_id.hex(),
                "eligible": origin.eligible,
                "synced_at": origin.synced_at,
                "latest": origin.latest,
                "pending": origin.pending,
            }
            for origin in status.origins
        ],
    }
