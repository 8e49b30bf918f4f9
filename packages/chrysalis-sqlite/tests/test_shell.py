"""The ``chrysalis sqlite`` shell core: statement splitting, result formatting, meta-commands,
errors that do not end the shell, and per-peer replication status from the durable state."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import Pid
from chrysalis.sqlite import EligibilityMode, Replica, TableSchema
from chrysalis.sqlite.shell import (
    PROMPT,
    PROMPT_CONTINUE,
    ResultSet,
    ShellError,
    ShellOutcome,
    ShellSession,
    connect,
    format_result_sets,
    format_value,
    query,
    replication_status,
    schema,
    split_statements,
    tables,
)
from chrysalis.sqlite.testing import ReplicaNetwork

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, body TEXT)",
    columns=["id", "body"],
    primary_key=["id"],
)


def memory() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
    conn.execute("INSERT INTO t VALUES (1, 'x;y'), (2, NULL)")
    return conn


def test_values_print_as_null_numbers_escaped_text_and_hex_blobs() -> None:
    assert format_value(None) == "NULL"
    assert format_value(42) == "42"
    assert format_value(1.5) == "1.5"
    assert format_value("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"
    assert format_value(b"\x00\xff") == "x'00ff'"


def test_semicolons_inside_strings_and_trigger_bodies_do_not_end_statements() -> None:
    text = (
        "SELECT 'a;b';\n"
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET b = 'z'; DELETE FROM t; END;\n"
        "SELECT 1"
    )
    statements, remainder = split_statements(text)
    assert statements == [
        "SELECT 'a;b';",
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET b = 'z'; DELETE FROM t; END;",
    ]
    assert remainder == "\nSELECT 1"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet="ab;' \n\t\\", max_size=12), min_size=1, max_size=6))
def test_split_statements_recovers_every_statement_of_a_script(literals: list[str]) -> None:
    script_parts = ["SELECT '" + s.replace("'", "''") + "';" for s in literals]
    statements, remainder = split_statements(" ".join(script_parts))
    assert statements == script_parts
    assert remainder == ""
    conn = sqlite3.connect(":memory:")
    results = query(conn, " ".join(script_parts))
    assert [r.rows[0][0] for r in results] == literals


def test_query_runs_every_statement_and_formats_one_block_per_result_set() -> None:
    conn = memory()
    results = query(conn, "SELECT a, b FROM t ORDER BY a; UPDATE t SET a = a; SELECT 'x;y' AS s")
    assert results[0] == ResultSet(("a", "b"), ((1, "x;y"), (2, None)))
    assert results[1].columns == ()
    assert format_result_sets(results) == "a\tb\n1\tx;y\n2\tNULL\n\ns\nx;y"


def test_query_bounds_rows_and_reports_truncation() -> None:
    conn = memory()
    (result,) = query(conn, "SELECT a FROM t ORDER BY a", max_rows=1)
    assert result.rows == ((1,),)
    assert result.truncated
    assert "more than 1 rows" in format_result_sets([result])


def test_query_rejects_incomplete_sql_and_propagates_sql_errors() -> None:
    conn = memory()
    with pytest.raises(ShellError, match="incomplete"):
        query(conn, "SELECT 'unterminated")
    with pytest.raises(sqlite3.OperationalError):
        query(conn, "SELECT * FROM missing")


def test_tables_and_schema_list_user_and_metadata_objects(tmp_path: Path) -> None:
    replica = Replica(tmp_path / "db.sqlite", [NOTES])
    try:
        names = tables(replica)
        assert "notes" in names
        assert "__chrysalis_clock_v1_notes" in names
        assert not any(n.startswith("sqlite_") for n in names)
        assert schema(replica, "NOTES") == ["CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT);"]
        assert len(schema(replica)) >= len(names)
    finally:
        replica.close()


def test_shell_accumulates_lines_until_a_statement_is_complete() -> None:
    shell = ShellSession(memory())
    assert shell.prompt == PROMPT
    assert shell.feed("SELECT a") == (ShellOutcome.CONTINUE, "")
    assert shell.prompt == PROMPT_CONTINUE
    assert shell.feed("FROM t WHERE b = 'x;y';") == (ShellOutcome.CONTINUE, "a\n1")
    assert shell.prompt == PROMPT
    assert shell.pending == ""


def test_shell_meta_commands_only_at_statement_start() -> None:
    shell = ShellSession(memory())
    assert shell.feed(".tables") == (ShellOutcome.CONTINUE, "t")
    assert shell.feed(".schema t")[1] == "CREATE TABLE t (a INTEGER, b TEXT);"
    assert "Show this message" in shell.feed(".help")[1]
    # "." followed by a digit is SQL, and a "." line inside a statement is part of it
    assert shell.feed(".5 + 1;")[1] == 'Error: near ".5": syntax error'
    assert shell.feed("SELECT") == (ShellOutcome.CONTINUE, "")
    assert shell.feed(".5 + 1 AS x;") == (ShellOutcome.CONTINUE, "x\n1.5")
    assert shell.feed("SELECT 1 +") == (ShellOutcome.CONTINUE, "")
    assert shell.feed(".tables") == (ShellOutcome.CONTINUE, "")
    assert shell.pending == "SELECT 1 +\n.tables"
    assert shell.feed(";")[1].startswith("Error:")
    assert shell.feed(".nope")[1].startswith('Error: unknown command ".nope"')
    assert shell.feed(".quit") == (ShellOutcome.EXIT, "")
    assert shell.feed(".exit")[0] is ShellOutcome.EXIT


def test_shell_prints_errors_and_continues() -> None:
    shell = ShellSession(memory())
    outcome, text = shell.feed("SELECT * FROM missing; SELECT 7;")
    assert outcome is ShellOutcome.CONTINUE
    assert text == "Error: no such table: missing\n\n7\n7"
    assert shell.feed(".status")[1].startswith("Error: no such table")


def test_read_only_connection_refuses_writes(tmp_path: Path) -> None:
    Replica(tmp_path / "db.sqlite", [NOTES]).close()
    conn = connect(str(tmp_path / "db.sqlite"), read_only=True)
    try:
        shell = ShellSession(conn)
        assert shell.feed("INSERT INTO notes VALUES ('a', 'b');")[1].startswith("Error:")
        assert shell.feed("SELECT COUNT(*) AS n FROM notes;")[1] == "n\n0"
    finally:
        conn.close()


def test_replication_status_reports_per_peer_progress_and_pending_changes() -> None:
    network = ReplicaNetwork(seed=3)
    parent = Replica(":memory:", [NOTES])
    child = Replica(":memory:", [NOTES])
    try:
        network.add("parent", parent)
        network.add("child", child)
        network.connect("parent", "child")
        with parent.transaction() as tx:
            tx.upsert("notes", ("p1", "from parent"))
        with child.transaction() as tx:
            tx.upsert("notes", ("c1", "from child"))
        network.settle()
        (toward_child,) = replication_status(parent)
        assert toward_child.peer == network.pid("child")
        assert toward_child.peer_site_id == child.site_id
        assert toward_child.mode is EligibilityMode.BLOCK
        progress = {o.origin_site_id: o for o in toward_child.origins}
        assert progress[parent.site_id].eligible
        assert progress[parent.site_id].synced_at == progress[parent.site_id].latest == 1
        assert not progress[child.site_id].eligible  # split horizon: never sent back
        assert toward_child.pending == 0
        (toward_parent,) = replication_status(child)
        assert toward_parent.mode is EligibilityMode.ALLOW
        # a partition leaves a new write pending toward the peer
        network.cut("parent", "child")
        with parent.transaction() as tx:
            tx.upsert("notes", ("p2", "while cut"))
        (toward_child,) = replication_status(parent)
        assert toward_child.pending == 1
        assert isinstance(toward_child.peer, Pid)
        shell = ShellSession(parent)
        table = shell.feed(".status")[1].splitlines()
        assert table[0].startswith("peer\tpeer_site\tmode\torigin")
        assert f"{network.pid('child').hex()}\t{child.site_id.hex()}\tblock" in table[1]
        assert any(line.endswith("\t1\t1\t2\t1") for line in table[1:])
    finally:
        parent.close()
        child.close()
