"""The public API of ``chrysalis.sqlite`` is exactly what the facade declares."""

from __future__ import annotations

import importlib
import pickle

import chrysalis.sqlite
import chrysalis.sqlite.testing

EXPECTED = {
    # limits and constants
    "CHUNK_TARGET_BYTES",
    "DEFAULT_MAX_CLOCK_DRIFT",
    "MAX_ACCEPTED_VERSION",
    "hlc_version",
    "ClockBoundError",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ROWS",
    "MAX_BYTES",
    "MAX_CHANGES_PER_VERSION",
    "MAX_CHUNK_CHANGES",
    "MAX_DEFERRED_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_VALUES",
    "MAX_VERSION_BYTES",
    "POLL_INTERVAL",
    "PROTOCOL_ID",
    "SCHEMA_HASH_LEN",
    "SESSION_TRANSITIONS",
    "SITE_ID_LEN",
    # storage
    "ApplyOutcome",
    "FrontierEntry",
    "GarbageCollection",
    "Replica",
    "ReplicaTransaction",
    "TableSchema",
    "TransactionBehavior",
    # values and protocol
    "Ack",
    "BatchChunk",
    "BeginBatch",
    "Change",
    "CommitBatch",
    "EncodedChange",
    "FrameDecoder",
    "Hello",
    "Message",
    "Schema",
    "Scope",
    "SqlValue",
    "StalePeerError",
    "Synchronized",
    "decode_body",
    "decode_values",
    "encode_change",
    "encode_message",
    "encode_values",
    # scopes
    "EligibilityMode",
    "SitePublisher",
    "SiteScope",
    "SiteSet",
    "SubtreeScopeAggregator",
    "outbound_eligibility",
    "update_peer_scope",
    "validate_scope_pair",
    # session
    "ReplicaSession",
    "SessionState",
    "SessionStatistics",
    "pack_batch_chunks",
    # errors
    "ChangeVersionTooLargeError",
    "CodecError",
    "CorruptMetadataError",
    "DuplicatePeerError",
    "FrameTooLargeError",
    "InvalidBatchError",
    "InvalidMutationError",
    "InvalidSchemaError",
    "MissingRowError",
    "MissingSchemaError",
    "NonUniqueKeyError",
    "RemoteProtocolError",
    "RemoteProtocolErrorKind",
    "ReplicaBusyError",
    "ReplicaClosedError",
    "ReplicationError",
    "SchemaConflictError",
    "SessionClosedError",
    "SessionError",
    "SiteScopeError",
    "SiteScopeErrorKind",
    "TransactionTooLargeError",
    "TruncatedFrameError",
}


def test_package_imports_and_declares_all() -> None:
    module = importlib.import_module("chrysalis.sqlite")
    assert isinstance(module.__all__, list)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_namespace_package_has_no_init() -> None:
    namespace = importlib.import_module("chrysalis")
    assert getattr(namespace, "__file__", None) is None


def test_public_api_is_exactly_the_declared_set() -> None:
    assert set(chrysalis.sqlite.__all__) == EXPECTED
    assert len(chrysalis.sqlite.__all__) == len(EXPECTED)
    assert set(chrysalis.sqlite.testing.__all__) == {
        "NetworkLink",
        "NotSettledError",
        "ReplicaNetwork",
    }


def test_public_classes_claim_the_facade_as_their_module() -> None:
    for name in chrysalis.sqlite.__all__:
        value = getattr(chrysalis.sqlite, name)
        if isinstance(value, type):
            assert value.__module__ == "chrysalis.sqlite", name


def test_errors_and_messages_pickle() -> None:
    from chrysalis.sqlite import (
        Change,
        ClockBoundError,
        RemoteProtocolError,
        RemoteProtocolErrorKind,
        SchemaConflictError,
        SiteScopeError,
        SiteScopeErrorKind,
    )

    for error in (
        RemoteProtocolError(RemoteProtocolErrorKind.UNEXPECTED_ACK, "Ack 3"),
        SchemaConflictError("t", b"a" * 32, b"b" * 32),
        SiteScopeError(SiteScopeErrorKind.OWN_SITE_MISSING, "x"),
        ClockBoundError(b"o" * 16, 2**63 - 1, 2**62, "MAX_ACCEPTED_VERSION", b"p" * 16, "pid"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
    change = Change("t", (1,), None, 1, b"s" * 16, 0)
    assert pickle.loads(pickle.dumps(change)) == change
