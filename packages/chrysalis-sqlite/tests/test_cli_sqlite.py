"""``chrysalis sqlite DB ACTION``: the CLI of chrysalis-node over this package's shell core."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from chrysalis.node._cli import main
from chrysalis.sqlite import Replica, TableSchema

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, body TEXT)",
    columns=["id", "body"],
    primary_key=["id"],
)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "node.db"
    replica = Replica(str(path), [NOTES])
    with replica.transaction() as tx:
        tx.upsert("notes", ("a", "hello"))
        tx.upsert("notes", ("b", "world"))
    replica.close()
    return path


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_query_prints_the_rows(database: Path) -> None:
    code, text = run("sqlite", str(database), "query", "SELECT id, body FROM notes ORDER BY id")
    assert code == 0
    assert "hello" in text
    assert "world" in text
    assert text.index("hello") < text.index("world")


def test_tables_lists_application_and_metadata_tables(database: Path) -> None:
    code, text = run("sqlite", str(database), "tables")
    assert code == 0
    lines = text.split()
    assert "notes" in lines
    assert any(line.startswith("__chrysalis_") for line in lines)


def test_schema_of_one_table(database: Path) -> None:
    code, text = run("sqlite", str(database), "schema", "notes")
    assert code == 0
    assert "CREATE TABLE" in text
    assert "notes" in text


def test_status_reads_the_database_alone(database: Path) -> None:
    code, _text = run("sqlite", str(database), "status")
    assert code == 0


def test_query_is_read_only_unless_asked(
    database: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = run("sqlite", str(database), "query", "DELETE FROM notes")
    assert code == 1
    assert "readonly" in capsys.readouterr().err.replace(" ", "").lower()
    code, text = run("sqlite", str(database), "query", "SELECT count(*) FROM notes")
    assert code == 0
    assert "2" in text


def test_missing_database_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = run("sqlite", str(tmp_path / "absent.db"), "tables")
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("chrysalis: error: no database at")
    assert len(err.splitlines()) == 1
