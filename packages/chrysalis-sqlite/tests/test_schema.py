"""Trusted table descriptors: identifier and key rules, the digest recipe, generated SQL and
the check of the table a descriptor created."""

from __future__ import annotations

import hashlib
import struct

import pytest

from chrysalis.sqlite import InvalidSchemaError, Replica, TableSchema

CREATE = "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, author TEXT, body TEXT)"


def _notes() -> TableSchema:
    return TableSchema("notes", CREATE, ["id", "author", "body"], ["id"])


def _reference_digest(table: str, columns: list[str], pk: list[str], sql: str) -> bytes:
    """The recipe of the specification, written out independently of the implementation."""

    def field(text: str) -> bytes:
        return struct.pack(">Q", len(text.encode())) + text.encode()

    blob = b"chrysalis-schema-v1" + field(table)
    blob += struct.pack(">Q", len(columns)) + b"".join(field(c) for c in columns)
    blob += struct.pack(">Q", len(pk)) + b"".join(field(c) for c in pk)
    blob += field(sql)
    return hashlib.sha256(blob).digest()


def test_schema_hash_follows_the_documented_recipe() -> None:
    schema = _notes()
    expected = _reference_digest("notes", ["id", "author", "body"], ["id"], CREATE)
    assert schema.schema_hash == expected
    assert len(schema.schema_hash) == 32


def test_schema_hash_covers_every_part_of_the_descriptor() -> None:
    base = _notes().schema_hash
    variants = [
        TableSchema("notes2", CREATE.replace("notes", "notes2"), ["id", "author", "body"], ["id"]),
        TableSchema("notes", CREATE, ["id", "body", "author"], ["id"]),
        TableSchema("notes", CREATE, ["id", "author", "body"], ["author"]),
        TableSchema("notes", CREATE + " ", ["id", "author", "body"], ["id"]),
    ]
    digests = {v.schema_hash for v in variants}
    assert base not in digests
    assert len(digests) == len(variants)


def test_schema_rejects_untrusted_identifiers_and_keys() -> None:
    bad_names = ["", "1abc", "_x", 'a"b', "a b", "naïve", "x" * 129, "a;drop"]
    for name in bad_names:
        with pytest.raises(InvalidSchemaError):
            TableSchema(name, CREATE, ["id"], ["id"])
        with pytest.raises(InvalidSchemaError):
            TableSchema("notes", CREATE, ["id", name], ["id"])
    with pytest.raises(InvalidSchemaError, match="empty"):
        TableSchema("notes", "   ", ["id"], ["id"])
    with pytest.raises(InvalidSchemaError, match="no columns"):
        TableSchema("notes", CREATE, [], ["id"])
    with pytest.raises(InvalidSchemaError, match="no primary key"):
        TableSchema("notes", CREATE, ["id"], [])
    with pytest.raises(InvalidSchemaError, match="repeats"):
        TableSchema("notes", CREATE, ["id", "ID"], ["id"])
    with pytest.raises(InvalidSchemaError, match="repeats"):
        TableSchema("notes", CREATE, ["id", "a"], ["id", "id"])
    with pytest.raises(InvalidSchemaError, match="not a column"):
        TableSchema("notes", CREATE, ["id"], ["other"])
    with pytest.raises(InvalidSchemaError, match="sequences"):
        TableSchema("notes", CREATE, "id", ["id"])


def test_generated_sql_quotes_identifiers_and_binds_values() -> None:
    schema = TableSchema(
        "pairs",
        "CREATE TABLE IF NOT EXISTS pairs (a INTEGER, b TEXT, v BLOB, PRIMARY KEY (a, b))",
        ["a", "b", "v"],
        ["a", "b"],
    )
    assert schema.select_row_sql == 'SELECT "a", "b", "v" FROM "pairs" WHERE "a" = ? AND "b" = ?'
    assert schema.delete_sql == 'DELETE FROM "pairs" WHERE "a" = ? AND "b" = ?'
    assert schema.upsert_sql == (
        'INSERT INTO "pairs" ("a", "b", "v") VALUES (?, ?, ?) '
        'ON CONFLICT ("a", "b") DO UPDATE SET "v" = excluded."v"'
    )
    assert schema.key_of((1, "x", b"v")) == (1, "x")
    keys_only = TableSchema(
        "tags", "CREATE TABLE IF NOT EXISTS tags (tag TEXT PRIMARY KEY)", ["tag"], ["tag"]
    )
    assert keys_only.upsert_sql.endswith("DO NOTHING")


def test_schemas_are_immutable_and_compare_by_descriptor() -> None:
    a, b = _notes(), _notes()
    assert a == b
    assert hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.table = "other"  # type: ignore[misc]


def test_replica_checks_the_table_the_descriptor_created() -> None:
    missing_column = TableSchema("notes", CREATE, ["id", "author"], ["id"])
    with pytest.raises(InvalidSchemaError, match="columns"):
        Replica(":memory:", [missing_column])
    not_unique = TableSchema(
        "loose", "CREATE TABLE IF NOT EXISTS loose (id TEXT, v TEXT)", ["id", "v"], ["id"]
    )
    with pytest.raises(InvalidSchemaError, match="UNIQUE"):
        Replica(":memory:", [not_unique])
    wrong_table = TableSchema("notes", "CREATE TABLE IF NOT EXISTS other (id TEXT)", ["id"], ["id"])
    with pytest.raises(InvalidSchemaError, match="did not create"):
        Replica(":memory:", [wrong_table])
    broken = TableSchema("notes", "CREATE TABLE nonsense (", ["id"], ["id"])
    with pytest.raises(InvalidSchemaError, match="failed"):
        Replica(":memory:", [broken])
    unique_index = TableSchema(
        "idx",
        "CREATE TABLE IF NOT EXISTS idx (id TEXT, v TEXT, UNIQUE (id))",
        ["id", "v"],
        ["id"],
    )
    with Replica(":memory:", [unique_index]) as replica:
        assert "idx" in replica.schemas


def test_replica_needs_unique_non_empty_schemas() -> None:
    with pytest.raises(InvalidSchemaError, match="at least one"):
        Replica(":memory:", [])
    with pytest.raises(InvalidSchemaError, match="twice"):
        Replica(":memory:", [_notes(), _notes()])
