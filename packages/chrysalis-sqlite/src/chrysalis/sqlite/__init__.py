"""Replicated SQLite with row-level last-writer-wins convergence (``chrysalis.sql.v5``).

Applications register trusted ``TableSchema`` descriptors, write through
``Replica.transaction()`` and capture each full-row upsert or delete in the same transaction.
Replicas exchange the captured changes over ``ReplicaSession`` (a pure protocol state machine:
bytes in, bytes out) and converge deterministically: per row, the change with the greatest
``(version, site id, seq)`` wins, whatever order changes arrive in. Peers exchange schema digests,
never SQL. ``chrysalis.sqlite.testing`` joins sessions of many replicas in memory.

This facade is the only supported import location; the ``_``-prefixed modules behind it carry
no stability promise.
"""

from __future__ import annotations

from chrysalis.sqlite._clock import DEFAULT_MAX_CLOCK_DRIFT, MAX_ACCEPTED_VERSION, hlc_version
from chrysalis.sqlite._errors import (
    ChangeVersionTooLargeError,
    ClockBoundError,
    CodecError,
    CorruptMetadataError,
    DuplicatePeerError,
    FrameTooLargeError,
    InvalidBatchError,
    InvalidMutationError,
    InvalidSchemaError,
    MissingRowError,
    MissingSchemaError,
    NonUniqueKeyError,
    RemoteProtocolError,
    RemoteProtocolErrorKind,
    ReplicaBusyError,
    ReplicaClosedError,
    ReplicationError,
    SchemaConflictError,
    SessionClosedError,
    SessionError,
    SiteScopeError,
    SiteScopeErrorKind,
    StalePeerError,
    TransactionTooLargeError,
    TruncatedFrameError,
)
from chrysalis.sqlite._protocol import (
    MAX_CHUNK_CHANGES,
    MAX_FRAME_BYTES,
    PROTOCOL_ID,
    Ack,
    BatchChunk,
    BeginBatch,
    Change,
    CommitBatch,
    EncodedChange,
    FrameDecoder,
    Hello,
    Message,
    Schema,
    Scope,
    Synchronized,
    decode_body,
    encode_change,
    encode_message,
)
from chrysalis.sqlite._replica import (
    MAX_BATCH_BYTES,
    MAX_BATCH_ROWS,
    ApplyOutcome,
    FrontierEntry,
    GarbageCollection,
    Replica,
)
from chrysalis.sqlite._schema import SCHEMA_HASH_LEN, TableSchema
from chrysalis.sqlite._scope import (
    SITE_ID_LEN,
    EligibilityMode,
    SitePublisher,
    SiteScope,
    SiteSet,
    SubtreeScopeAggregator,
    outbound_eligibility,
    update_peer_scope,
    validate_scope_pair,
)
from chrysalis.sqlite._session import (
    CHUNK_TARGET_BYTES,
    MAX_DEFERRED_BYTES,
    POLL_INTERVAL,
    SESSION_TRANSITIONS,
    ReplicaSession,
    SessionState,
    SessionStatistics,
    pack_batch_chunks,
)
from chrysalis.sqlite._transaction import (
    MAX_CHANGES_PER_VERSION,
    MAX_VERSION_BYTES,
    ReplicaTransaction,
    TransactionBehavior,
)
from chrysalis.sqlite._values import MAX_BYTES, MAX_VALUES, SqlValue, decode_values, encode_values

__all__ = [
    "CHUNK_TARGET_BYTES",
    "DEFAULT_MAX_CLOCK_DRIFT",
    "MAX_ACCEPTED_VERSION",
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
    "Ack",
    "ApplyOutcome",
    "BatchChunk",
    "BeginBatch",
    "Change",
    "ChangeVersionTooLargeError",
    "ClockBoundError",
    "CodecError",
    "CommitBatch",
    "CorruptMetadataError",
    "DuplicatePeerError",
    "EligibilityMode",
    "EncodedChange",
    "FrameDecoder",
    "FrameTooLargeError",
    "FrontierEntry",
    "GarbageCollection",
    "Hello",
    "InvalidBatchError",
    "InvalidMutationError",
    "InvalidSchemaError",
    "Message",
    "MissingRowError",
    "MissingSchemaError",
    "NonUniqueKeyError",
    "RemoteProtocolError",
    "RemoteProtocolErrorKind",
    "Replica",
    "ReplicaBusyError",
    "ReplicaClosedError",
    "ReplicaSession",
    "ReplicaTransaction",
    "ReplicationError",
    "Schema",
    "SchemaConflictError",
    "Scope",
    "SessionClosedError",
    "SessionError",
    "SessionState",
    "SessionStatistics",
    "SitePublisher",
    "SiteScope",
    "SiteScopeError",
    "SiteScopeErrorKind",
    "SiteSet",
    "SqlValue",
    "StalePeerError",
    "SubtreeScopeAggregator",
    "Synchronized",
    "TableSchema",
    "TransactionBehavior",
    "TransactionTooLargeError",
    "TruncatedFrameError",
    "decode_body",
    "decode_values",
    "encode_change",
    "encode_message",
    "encode_values",
    "hlc_version",
    "outbound_eligibility",
    "pack_batch_chunks",
    "update_peer_scope",
    "validate_scope_pair",
]

# The public classes present themselves as this facade's (reprs, pickles, documentation), not
# as the private modules that define them.
for _name in __all__:
    _public = globals()[_name]
    if isinstance(_public, type) and _public.__module__.startswith(f"{__name__}._"):
        _public.__module__ = __name__
del _name, _public
