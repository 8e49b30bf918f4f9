"""Exception types of ``chrysalis.sqlite``.

Why one module: replication validates three kinds of untrusted or fallible input (local table
descriptors and captures, bytes from a peer, and the peer's protocol behaviour), and callers need
one small documented hierarchy to catch. Every error derives from ``ReplicationError``:

- ``InvalidSchemaError``: a ``TableSchema`` or the table its SQL created is unusable.
- ``InvalidMutationError``: a capture or a received change breaks a row rule
  (``MissingRowError``, ``NonUniqueKeyError`` and ``TransactionTooLargeError`` refine it).
- ``MissingSchemaError``: a change or a peer names a table with no local descriptor.
- ``InvalidBatchError``: a received change has an impossible origin tuple.
- ``ReplicaBusyError`` / ``ReplicaClosedError``: the replica cannot take the call now.
- ``CorruptMetadataError``: the ``__chrysalis_*`` tables hold values no replica writes.
- ``CodecError``: bytes on the v5 stream are malformed or over a limit
  (``FrameTooLargeError``, ``TruncatedFrameError``).
- ``SiteScopeError``: a site scope is invalid or an update breaks the scope rules (``kind``).
- ``SessionError``: a replication session must end (``RemoteProtocolError`` with a ``kind``,
  ``SchemaConflictError``, ``DuplicatePeerError``, ``ChangeVersionTooLargeError``,
  ``SessionClosedError``, ``StalePeerError``, ``ClockBoundError``).

Messages quote offending input truncated to a bounded length, so hostile input never produces a
huge message, and every exception pickles back to an equal-looking exception.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "ChangeVersionTooLargeError",
    "ClockBoundError",
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
    "StalePeerError",
    "TransactionTooLargeError",
    "TruncatedFrameError",
    "quote",
]

_QUOTE_LIMIT = 40


def quote(value: object, limit: int = _QUOTE_LIMIT) -> str:
    """``repr`` of ``value`` cut to about ``limit`` characters (bounded error messages)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


class ReplicationError(Exception):
    """Base class of every error raised by ``chrysalis.sqlite``."""


class InvalidSchemaError(ReplicationError, ValueError):
    """A table descriptor is invalid (identifiers, keys, SQL) or the table its ``create_sql``
    produced does not have the declared columns and primary key."""


class InvalidMutationError(ReplicationError, ValueError):
    """A captured or received mutation breaks a row rule: wrong key arity, a NULL key, a row of
    the wrong length, a value SQLite cannot hold, or a key that differs from the row's key."""


class MissingRowError(InvalidMutationError):
    """``capture_upsert`` found no row with the given key inside the transaction."""


class NonUniqueKeyError(InvalidMutationError):
    """``capture_upsert`` found more than one row for the key: the declared primary key is not
    unique in the table."""


class TransactionTooLargeError(InvalidMutationError):
    """One transaction captured more mutations, or more encoded bytes, than one replicated
    version may hold (``MAX_CHANGES_PER_VERSION`` / ``MAX_VERSION_BYTES``)."""


class MissingSchemaError(ReplicationError, LookupError):
    """A change or a peer's schema digest names a table with no local ``TableSchema``."""


class InvalidBatchError(ReplicationError, ValueError):
    """A received change has an impossible origin tuple (site id not 16 bytes, version not
    positive, negative sequence number)."""


class ReplicaBusyError(ReplicationError, RuntimeError):
    """A replica transaction is already open: the apply lock is held. Replica transactions do
    not nest, and sessions must not be fed while the application holds a transaction."""


class ReplicaClosedError(ReplicationError, RuntimeError):
    """The replica (or its database connection) was closed."""


class CorruptMetadataError(ReplicationError):
    """The ``__chrysalis_*`` metadata tables hold values that no replica writes (for example a
    site id that is not 16 bytes, or an origin registry whose positions do not increase)."""


class CodecError(ReplicationError, ValueError):
    """Bytes of the ``chrysalis.sql.v5`` stream are malformed (unknown tag, trailing bytes,
    invalid UTF-8, a count over its limit), or a message cannot be encoded within the limits."""


class FrameTooLargeError(CodecError):
    """A frame body is longer than ``MAX_FRAME_BYTES``; raised as soon as the length prefix is
    read, before any of the body is buffered, and by the encoder before anything is written."""


class TruncatedFrameError(CodecError):
    """The stream ended in the middle of a frame (a clean end has no partial frame)."""


class SiteScopeErrorKind(enum.Enum):
    """Why a site scope, a scope pair or a scope update was rejected."""

    INVALID_SITE_ID = "site id is not 16 bytes"
    TOO_MANY_SITES = "too many site ids"
    OWN_SITE_MISSING = "the scope does not contain its own site"
    PEER_SITE_MISSING = "the peer's scope does not contain the peer's site"
    COMPLEMENT_IS_DERIVED = "a complement scope cannot be set explicitly"
    UNANCHORED_COMPLEMENT = "both sides advertise a complement scope"
    SITE_SCOPE_CHANGED = "the scope changed between explicit and complement"
    SITE_GENERATION_REGRESSED = "the explicit scope generation went down"
    CONFLICTING_SITE_GENERATION = "the same generation arrived with different sites"
    GENERATION_EXHAUSTED = "the scope generation cannot grow any further"


class SiteScopeError(ReplicationError, ValueError):
    """A site scope is invalid, or a scope pair or update breaks the rules; ``kind`` says which
    (a ``SiteScopeErrorKind``) and ``detail`` adds context."""

    def __init__(self, kind: SiteScopeErrorKind, detail: str = "") -> None:
        super().__init__(kind, detail)
        self.kind = kind
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}" if self.detail else self.kind.value

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.detail))


class SessionError(ReplicationError):
    """A replication session must end. The replica's data and metadata stay consistent: every
    chunk is applied in its own transaction, and frontiers move only on acknowledgement."""


class RemoteProtocolErrorKind(enum.Enum):
    """How the peer broke the session protocol."""

    MISSING_HELLO = "the first message was not Hello"
    UNEXPECTED_HELLO = "a second Hello arrived"
    UNEXPECTED_BATCH = "a batch message arrived out of place"
    UNEXPECTED_ACK = "an Ack does not match the batch in flight"
    SCHEMA_CHANGED = "a table's schema digest changed during the session"
    INVALID_SITE_ID = "the peer's site id is not 16 bytes"
    SAME_SITE = "the peer has our own site id"


class RemoteProtocolError(SessionError):
    """The peer sent something the protocol does not allow at this point; ``kind`` says what
    (a ``RemoteProtocolErrorKind``) and ``detail`` adds context."""

    def __init__(self, kind: RemoteProtocolErrorKind, detail: str = "") -> None:
        super().__init__(kind, detail)
        self.kind = kind
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}" if self.detail else self.kind.value

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.kind, self.detail))


class SchemaConflictError(SessionError):
    """The peer's digest for a table differs from ours: the two replicas disagree about the
    table's definition, so no change of it may cross. Attributes: ``table``, ``local_hash`` and
    ``peer_hash`` (32-byte SHA-256 digests)."""

    def __init__(self, table: str, local_hash: bytes, peer_hash: bytes) -> None:
        super().__init__(table, local_hash, peer_hash)
        self.table = table
        self.local_hash = local_hash
        self.peer_hash = peer_hash

    def __str__(self) -> str:
        return (
            f"schema conflict on table {quote(self.table)}: local digest "
            f"{self.local_hash.hex()[:16]}..., peer digest {self.peer_hash.hex()[:16]}..."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.table, self.local_hash, self.peer_hash))


class DuplicatePeerError(SessionError):
    """The replica already has a live session with this peer PID."""


class ChangeVersionTooLargeError(SessionError):
    """One (origin site, version) group of changes is larger than one batch may be, so
    it can never be sent."""


class ClockBoundError(SessionError):
    """A received change's version is above what this replica accepts (``MAX_ACCEPTED_VERSION``,
    and for a replica given a ``clock``, ``max_clock_drift`` seconds ahead of its local time):
    accepting it would raise the clock toward the end of SQLite's integers, where local writes
    stop. The whole chunk is refused, so nothing of it is applied or relayed; a session ends
    with this error, naming the peer. Attributes: ``origin_site``, ``version``, ``bound``,
    ``reason`` (which bound), and where a session received it ``peer_site`` and ``peer`` (the
    peer's PID as text)."""

    def __init__(
        self,
        origin_site: bytes,
        version: int,
        bound: int,
        reason: str,
        peer_site: bytes | None = None,
        peer: str | None = None,
    ) -> None:
        super().__init__(origin_site, version, bound, reason, peer_site, peer)
        self.origin_site = origin_site
        self.version = version
        self.bound = bound
        self.reason = reason
        self.peer_site = peer_site
        self.peer = peer

    def __str__(self) -> str:
        if self.peer_site is None:
            who = "a change"
        else:
            pid = "" if self.peer is None else f"{self.peer} "
            who = f"peer {pid}(site {self.peer_site.hex()}) sent a change"
        return (
            f"{who} of origin {self.origin_site.hex()} at version {self.version}, above "
            f"{self.bound}, the most this replica accepts ({self.reason}): refused with the "
            "rest of its chunk, nothing of it applied or relayed (that peer's clock is broken "
            "or hostile)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.origin_site, self.version, self.bound, self.reason, self.peer_site, self.peer),
        )


class SessionClosedError(SessionError):
    """The session already ended (closed locally, by end of stream, or by an error)."""


class StalePeerError(SessionError):
    """The peer may hold rows whose deletions this replica collected (see
    ``Replica.collect_garbage``): syncing with it could resurrect deleted rows here and, where
    other replicas still hold the tombstones, leave replicas disagreeing forever. Raised for a
    peer site this replica forgot (``Replica.forget_peer_site``), and for a change from a peer
    site first seen after a collection that upserts a row this replica has no entry for (or
    only a tombstone the upsert would beat) at a version at or below what was collected then.
    The peer must be rebuilt: a new, empty database (a new site id) that syncs before it
    writes."""
