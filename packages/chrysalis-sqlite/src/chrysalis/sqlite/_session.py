"""``ReplicaSession``: one replication session over one ordered byte stream, as a pure class.

Theory of operation
-------------------
A session joins two replicas over one reliable, ordered, bidirectional stream (in production a
link-local QUIC stream between adjacent Chrysalis nodes, selected by ``chrysalis.sql.v5``). Both
directions are symmetric and run at once; each side is a *sender* of its own batches and a
*receiver* of the peer's. The class never touches the stream: the adapter feeds received bytes
to ``receive_data`` (and ``receive_eof``), calls ``poll()`` when the replica reports a local
change, when the local scope changed, and every ``POLL_INTERVAL`` seconds (which catches
commits by other processes on the same database file), and writes out ``data_to_send()`` after
every call. Nothing here imports sockets, event loops or clocks.

Handshake. Each side first sends ``Hello{site id, scope}``; the first inbound message must be
``Hello`` (else ``MISSING_HELLO``) and there is only one (``UNEXPECTED_HELLO``). The scope pair is
validated (``validate_scope_pair``). The side then loads its durable outbound state for the peer
*incarnation* ``(peer PID, peer site id)`` and sends one ``Schema{table, digest}`` per local
table. Received digests must match local descriptors (``SchemaConflictError``; an unknown table
is ``MissingSchemaError``); SQL never crosses. Changes of a table are sent only after the peer
announced that table.

Apply lock. Work that touches the database waits while the application holds a replica
transaction (the reference's async apply lock): received bytes stay buffered, bounded by
``MAX_DEFERRED_BYTES``, and the next call after the transaction handles them.

Receiving. ``BeginBatch`` opens a batch, each ``BatchChunk`` is applied in its own transaction
(``Replica.apply_changes``: recorded under the original origin tuple, last-writer-wins), and
``CommitBatch`` closes it and answers ``Ack{id}``: by then every chunk is durable. ``Schema``,
``Synchronized``, ``BeginBatch`` and ``Hello`` are not allowed inside a batch. ``Synchronized``
marks the peer as having nothing more to send.

Sending (``_send_next``). At most one batch is in flight. When there may be new changes
(a marker built from the replica's own commit counter and ``PRAGMA data_version``), or the
scopes changed, the sender reconciles the durable frontier (which origins the link carries, from
``outbound_eligibility``), selects whole ``(origin, version)`` groups after each eligible origin's
acknowledged version (at most ``MAX_BATCH_ROWS`` changes and ``MAX_BATCH_BYTES`` bytes), packs
them greedily into chunks of about ``CHUNK_TARGET_BYTES`` and sends ``BeginBatch``, the chunks and
``CommitBatch``. The per-origin frontier advances **only when the matching ``Ack`` arrives**; a
session that ends earlier leaves it where it was, so the next session resends the batch and the
receiver's log discards the duplicates. When nothing is left, it sends ``Synchronized`` once.

Relaying is implicit: received changes land in the local log with their origin tuple and
register their origin site; every other session of the replica sees them through its marker and
forwards them where its scope allows.

Deviation from the reference: the reference's selector shortcut compares the replica's clock
with the clock value at the last complete selection. A relayed change whose version is below
the local clock does not move the clock, so that shortcut can miss it; this port uses the
change marker instead, which moves on every log insertion.

The inbound transition table is ``SESSION_TRANSITIONS`` (state, message type) -> next state;
anything missing from it is a ``RemoteProtocolError``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from chrysalis.core import Pid
from chrysalis.sqlite._errors import (
    FrameTooLargeError,
    MissingSchemaError,
    RemoteProtocolError,
    RemoteProtocolErrorKind,
    ReplicaBusyError,
    SchemaConflictError,
    SessionClosedError,
    quote,
)
from chrysalis.sqlite._protocol import (
    MAX_CHUNK_CHANGES,
    MAX_FRAME_BYTES,
    Ack,
    BatchChunk,
    BeginBatch,
    CommitBatch,
    FrameDecoder,
    Hello,
    Message,
    Schema,
    Scope,
    Synchronized,
    encode_message,
    frame_batch_chunk,
)
from chrysalis.sqlite._replica import Replica
from chrysalis.sqlite._scope import (
    SITE_ID_LEN,
    EligibilityMode,
    SitePublisher,
    SiteScope,
    outbound_eligibility,
    update_peer_scope,
    validate_scope_pair,
)

__all__ = [
    "CHUNK_TARGET_BYTES",
    "MAX_DEFERRED_BYTES",
    "POLL_INTERVAL",
    "SESSION_TRANSITIONS",
    "ReplicaSession",
    "SessionState",
    "SessionStatistics",
    "pack_batch_chunks",
]

POLL_INTERVAL: Final = 0.25
"""Seconds between the adapter's periodic ``poll()`` calls (catches other processes' writes)."""

CHUNK_TARGET_BYTES: Final = 1024 * 1024
"""Target size of one ``BatchChunk`` frame body (a single larger change gets its own chunk)."""

MAX_DEFERRED_BYTES: Final = MAX_FRAME_BYTES + 4
"""Most received bytes a session buffers while the application holds the apply lock."""

_CHUNK_OVERHEAD: Final = 5  # tag and change count of a BatchChunk body


class SessionState(enum.Enum):
    """Inbound protocol state of a session."""

    AWAIT_HELLO = "await-hello"
    """Our Hello is sent; the peer's has not arrived."""
    READY = "ready"
    """Handshake done, no inbound batch open."""
    IN_BATCH = "in-batch"
    """The peer opened a batch (between ``BeginBatch`` and ``CommitBatch``)."""
    CLOSED = "closed"
    """Ended cleanly (end of stream or ``close()``)."""
    FAILED = "failed"
    """Ended by an error; ``error`` holds it."""


_S = SessionState
SESSION_TRANSITIONS: Final[Mapping[tuple[SessionState, type[Message]], SessionState]] = (
    MappingProxyType(
        {
            (_S.AWAIT_HELLO, Hello): _S.READY,
            (_S.READY, Schema): _S.READY,
            (_S.READY, Scope): _S.READY,
            (_S.READY, BeginBatch): _S.IN_BATCH,
            (_S.READY, Ack): _S.READY,
            (_S.READY, Synchronized): _S.READY,
            (_S.IN_BATCH, BatchChunk): _S.IN_BATCH,
            (_S.IN_BATCH, CommitBatch): _S.READY,
            (_S.IN_BATCH, Scope): _S.IN_BATCH,
            (_S.IN_BATCH, Ack): _S.IN_BATCH,
        }
    )
)
"""Every allowed inbound (state, message type) pair and the state it leads to."""


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    """Counters of one session (an immutable snapshot)."""

    bytes_received: int
    bytes_sent: int
    batches_sent: int
    batches_acked: int
    changes_sent: int
    batches_received: int
    changes_received: int
    changes_logged: int
    changes_applied: int


@dataclass(frozen=True, slots=True)
class _InFlight:
    batch_id: int
    advances: Mapping[bytes, int]
    observed: tuple[int, int] | None
    changes: int


def pack_batch_chunks(
    encoded_changes: Sequence[bytes], target_bytes: int = CHUNK_TARGET_BYTES
) -> list[bytes]:
    """Pack encoded changes, in order, into complete ``BatchChunk`` frames.

    Greedy: a chunk takes changes while its body (5 bytes of tag and count included) stays
    within ``target_bytes`` and ``MAX_CHUNK_CHANGES``; a change is never split, so one larger
    change gets a chunk of its own. A change that cannot fit in any frame raises
    ``FrameTooLargeError``.
    """
    frames: list[bytes] = []
    chunk: list[bytes] = []
    size = _CHUNK_OVERHEAD
    for change in encoded_changes:
        if _CHUNK_OVERHEAD + len(change) > MAX_FRAME_BYTES:
            raise FrameTooLargeError(
                f"one change of {len(change)} bytes cannot fit in a {MAX_FRAME_BYTES}-byte frame"
            )
        if chunk and (size + len(change) > target_bytes or len(chunk) >= MAX_CHUNK_CHANGES):
            frames.append(frame_batch_chunk(chunk))
            chunk, size = [], _CHUNK_OVERHEAD
        chunk.append(change)
        size += len(change)
    if chunk:
        frames.append(frame_batch_chunk(chunk))
    return frames


class ReplicaSession:
    """The v5 replication protocol for one peer over one ordered byte stream (sans-IO).

    ``ReplicaSession(replica, peer, publisher)`` registers the session with ``replica`` (one
    live session per peer PID: ``DuplicatePeerError``) and queues our ``Hello`` with the
    publisher's scope. ``publisher.own_site`` must be the replica's site id.

    Drive it with ``receive_data(bytes)``, ``receive_eof()`` and ``poll()``; after each call send
    ``data_to_send()`` on the stream. Any exception from these calls ends the session (state
    ``FAILED``, ``error`` set) and is re-raised; the adapter then closes the stream. The
    replica stays consistent: chunks are atomic and frontiers move only on ``Ack``. While the
    application holds a replica transaction (the apply lock), the session defers its work:
    input is buffered (bounded by ``MAX_DEFERRED_BYTES``) and handled by the next call after
    the transaction ends.
    """

    def __init__(
        self,
        replica: Replica,
        peer: Pid,
        publisher: SitePublisher,
        *,
        chunk_target_bytes: int = CHUNK_TARGET_BYTES,
    ) -> None:
        if not isinstance(peer, Pid):
            raise TypeError(f"peer must be a Pid, not {type(peer).__name__}")
        if publisher.own_site != replica.site_id:
            raise ValueError("the publisher speaks for another site than the replica")
        if not _CHUNK_OVERHEAD < chunk_target_bytes <= MAX_FRAME_BYTES:
            raise ValueError(f"chunk_target_bytes must be in 6..{MAX_FRAME_BYTES}")
        self._replica = replica
        self._peer = peer
        self._peer_raw = peer.raw
        self._publisher = publisher
        self._chunk_target = chunk_target_bytes
        replica._attach_session(self._peer_raw, self)
        self._state = SessionState.AWAIT_HELLO
        self._error: BaseException | None = None
        self._decoder = FrameDecoder(keep_encodings=True)
        self._outbox: list[bytes] = []
        self._eof = False
        # peer side
        self._peer_site: bytes | None = None
        self._gc_floor = 0
        self._peer_scope: SiteScope | None = None
        self._peer_schemas: dict[str, bytes] = {}
        self._peer_synchronized = False
        self._inbound_batch: int | None = None
        # our side
        self._local_scope = publisher.scope
        self._schemas_sent = False
        self._scope_changed = False
        self._frontier_dirty = True
        self._observed: tuple[int, int] | None = None
        self._origin_position = 0
        self._mode: EligibilityMode | None = None
        self._explicit: frozenset[bytes] = frozenset()
        self._next_batch_id = 1
        self._in_flight: _InFlight | None = None
        self._synchronized_sent = False
        # statistics
        self._bytes_received = 0
        self._bytes_sent = 0
        self._batches_sent = 0
        self._batches_acked = 0
        self._changes_sent = 0
        self._batches_received = 0
        self._changes_received = 0
        self._changes_logged = 0
        self._changes_applied = 0
        self._send(Hello(replica.site_id, self._local_scope))

    # ----------------------------------------------------------------------------------------
    # Inspection

    @property
    def state(self) -> SessionState:
        """The inbound protocol state."""
        return self._state

    @property
    def error(self) -> BaseException | None:
        """The error that ended the session, if one did."""
        return self._error

    @property
    def peer(self) -> Pid:
        """The peer's PID."""
        return self._peer

    @property
    def peer_site_id(self) -> bytes | None:
        """The peer's site id (``None`` before its Hello)."""
        return self._peer_site

    @property
    def peer_scope(self) -> SiteScope | None:
        """The peer's latest scope (``None`` before its Hello and after the session ends)."""
        return self._peer_scope

    @property
    def local_scope(self) -> SiteScope:
        """The scope we last advertised."""
        return self._local_scope

    @property
    def peer_synchronized(self) -> bool:
        """Whether the peer said ``Synchronized`` and sent nothing batch-related since."""
        return self._peer_synchronized

    @property
    def batch_in_flight(self) -> int | None:
        """The id of our batch awaiting its ``Ack``, if any."""
        return None if self._in_flight is None else self._in_flight.batch_id

    @property
    def is_live(self) -> bool:
        """Whether the session has not ended."""
        return self._state not in (SessionState.CLOSED, SessionState.FAILED)

    def statistics(self) -> SessionStatistics:
        """A snapshot of the session's counters."""
        return SessionStatistics(
            bytes_received=self._bytes_received,
            bytes_sent=self._bytes_sent,
            batches_sent=self._batches_sent,
            batches_acked=self._batches_acked,
            changes_sent=self._changes_sent,
            batches_received=self._batches_received,
            changes_received=self._changes_received,
            changes_logged=self._changes_logged,
            changes_applied=self._changes_applied,
        )

    # ----------------------------------------------------------------------------------------
    # Driving

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes received from the stream (any fragmentation); handle complete messages.

        While the replica's apply lock is held (an application transaction is open) the bytes
        are only buffered, up to ``MAX_DEFERRED_BYTES`` (``ReplicaBusyError`` beyond), and
        handled by a later ``receive_data`` or ``poll``.
        """
        self._check_live()
        self._bytes_received += len(data)
        try:
            self._decoder.feed(data)
            if self._replica.in_transaction and self._decoder.buffered > MAX_DEFERRED_BYTES:
                raise ReplicaBusyError(
                    f"more than {MAX_DEFERRED_BYTES} bytes arrived while a transaction was open"
                )
            self._work()
        except BaseException as exc:
            self._fail(exc)
            raise

    def receive_eof(self) -> None:
        """The peer ended the stream. Once every buffered message is handled, a clean end
        between frames closes the session; an end inside a frame raises
        ``TruncatedFrameError``."""
        self._check_live()
        self._eof = True
        try:
            self._work()
        except BaseException as exc:
            self._fail(exc)
            raise

    def poll(self) -> None:
        """Re-examine the local replica and scope: handle deferred input, then send a scope
        update, the next batch, or ``Synchronized``. Call on local-change notifications, scope
        changes and every ``POLL_INTERVAL`` seconds. A no-op while the apply lock is held."""
        self._check_live()
        try:
            self._work()
        except BaseException as exc:
            self._fail(exc)
            raise

    def data_to_send(self) -> bytes:
        """Bytes to write to the stream now (possibly empty); each call drains them."""
        if not self._outbox:
            return b""
        data = b"".join(self._outbox)
        self._outbox.clear()
        self._bytes_sent += len(data)
        return data

    def close(self) -> None:
        """End the session locally (idempotent). Unacknowledged batches stay unacknowledged."""
        if self.is_live:
            self._end(SessionState.CLOSED)

    # ----------------------------------------------------------------------------------------
    # Internals

    def _work(self) -> None:
        if self._replica.in_transaction:
            return  # the application holds the apply lock: defer everything
        while (message := self._decoder.next_message()) is not None:
            self._handle(message)
        if self._eof:
            self._decoder.end_of_stream()
            self._end(SessionState.CLOSED)
            return
        self._advance()

    def _check_live(self) -> None:
        if not self.is_live:
            raise SessionClosedError(f"the session is {self._state.value}") from self._error

    def _end(self, state: SessionState) -> None:
        self._state = state
        self._in_flight = None
        self._peer_scope = None
        self._peer_synchronized = False
        self._replica._detach_session(self._peer_raw, self)

    def _fail(self, exc: BaseException) -> None:
        if self.is_live:
            self._error = exc
            self._end(SessionState.FAILED)

    def _send(self, message: Message) -> None:
        self._outbox.append(encode_message(message))

    def _handle(self, message: Message) -> None:
        kind = type(message)
        next_state = SESSION_TRANSITIONS.get((self._state, kind))
        if next_state is None:
            if self._state is SessionState.AWAIT_HELLO:
                raise RemoteProtocolError(RemoteProtocolErrorKind.MISSING_HELLO, kind.__name__)
            if kind is Hello:
                raise RemoteProtocolError(RemoteProtocolErrorKind.UNEXPECTED_HELLO)
            raise RemoteProtocolError(
                RemoteProtocolErrorKind.UNEXPECTED_BATCH,
                f"{kind.__name__} in state {self._state.value}",
            )
        match message:
            case BatchChunk():
                self._on_chunk(message)
            case Ack():
                self._on_ack(message)
            case BeginBatch():
                self._on_begin(message)
            case CommitBatch():
                self._on_commit()
            case Hello():
                self._on_hello(message)
            case Schema():
                self._on_schema(message)
            case Scope():
                self._on_scope(message)
            case Synchronized():
                self._peer_synchronized = True
        self._state = next_state

    def _on_hello(self, message: Hello) -> None:
        site = message.site_id
        if len(site) != SITE_ID_LEN:
            raise RemoteProtocolError(RemoteProtocolErrorKind.INVALID_SITE_ID, quote(site))
        if site == self._replica.site_id:
            raise RemoteProtocolError(RemoteProtocolErrorKind.SAME_SITE, site.hex())
        validate_scope_pair(self._replica.site_id, self._local_scope, site, message.scope)
        # a forgotten site is refused; one first seen after a collection gets its floor
        self._gc_floor = self._replica._admit_peer(site)
        self._peer_site = site
        self._peer_scope = message.scope
        durable = self._replica._load_peer_state(self._peer_raw, site)
        self._origin_position = durable.origin_position
        self._mode = durable.mode
        self._explicit = durable.explicit_sites
        self._frontier_dirty = True
        self._observed = None

    def _on_schema(self, message: Schema) -> None:
        self._peer_synchronized = False
        local = self._replica.schemas.get(message.table)
        if local is None:
            raise MissingSchemaError(
                f"the peer replicates table {quote(message.table)}, which has no local schema"
            )
        if local.schema_hash != message.schema_hash:
            raise SchemaConflictError(message.table, local.schema_hash, message.schema_hash)
        recorded = self._peer_schemas.get(message.table)
        if recorded is not None and recorded != message.schema_hash:
            raise RemoteProtocolError(RemoteProtocolErrorKind.SCHEMA_CHANGED, message.table)
        self._peer_schemas[message.table] = message.schema_hash

    def _on_scope(self, message: Scope) -> None:
        self._peer_synchronized = False
        assert self._peer_site is not None
        new = update_peer_scope(self._peer_scope, message.scope)
        validate_scope_pair(self._replica.site_id, self._local_scope, self._peer_site, new)
        if new is not self._peer_scope:
            self._peer_scope = new
            self._scope_changed = True

    def _on_begin(self, message: BeginBatch) -> None:
        self._peer_synchronized = False
        self._inbound_batch = message.batch_id

    def _on_chunk(self, message: BatchChunk) -> None:
        # the changes' key and row value lists as received: checked without re-encoding
        outcome = self._replica._apply(
            message.changes,
            self._decoder.chunk_encodings,
            self._peer_site,
            self._gc_floor,
            str(self._peer),
        )
        self._changes_received += outcome.received
        self._changes_logged += outcome.logged
        self._changes_applied += outcome.applied

    def _on_commit(self) -> None:
        assert self._inbound_batch is not None
        self._batches_received += 1
        self._send(Ack(self._inbound_batch))
        self._inbound_batch = None

    def _on_ack(self, message: Ack) -> None:
        in_flight = self._in_flight
        if in_flight is None or in_flight.batch_id != message.batch_id:
            expected = "none" if in_flight is None else str(in_flight.batch_id)
            raise RemoteProtocolError(
                RemoteProtocolErrorKind.UNEXPECTED_ACK,
                f"Ack {message.batch_id}, in flight: {expected}",
            )
        assert self._peer_site is not None
        self._replica._record_ack(self._peer_raw, self._peer_site, in_flight.advances)
        if in_flight.observed is not None:
            self._observed = in_flight.observed
        self._in_flight = None
        self._batches_acked += 1

    def _advance(self) -> None:
        """After every event: local scope updates, schema announcements, scope refresh, then
        the outbound selector."""
        scope = self._publisher.scope
        if scope != self._local_scope:
            if self._peer_site is not None and self._peer_scope is not None:
                validate_scope_pair(self._replica.site_id, scope, self._peer_site, self._peer_scope)
            self._local_scope = scope
            self._scope_changed = True
            self._send(Scope(scope))
        if self._state is SessionState.AWAIT_HELLO:
            return
        if not self._schemas_sent:
            for schema in self._replica.schemas.values():
                self._send(Schema(schema.table, schema.schema_hash))
            self._schemas_sent = True
        if self._in_flight is None and self._scope_changed:
            self._scope_changed = False
            self._frontier_dirty = True
            self._observed = None
            self._synchronized_sent = False
        self._send_next()

    def _send_next(self) -> None:
        if self._in_flight is not None:
            return
        replica = self._replica
        peer_site = self._peer_site
        assert peer_site is not None
        assert self._peer_scope is not None
        marker = replica._change_marker()
        if not self._frontier_dirty and marker == self._observed:
            self._send_synchronized_once()
            return
        mode, sites = outbound_eligibility(self._local_scope, self._peer_scope)
        if self._frontier_dirty:
            replica._register_origins(sites)
        new_origins = replica._origins_after(self._origin_position)
        if self._frontier_dirty or new_origins:
            if mode != self._mode:
                affected = set(replica._origins_after(0))  # every origin
            else:
                affected = set(sites ^ self._explicit).union(new_origins)
            allow = mode is EligibilityMode.ALLOW
            eligibility = {s: (s in sites) == allow for s in affected}
            position = replica._origin_position
            replica._reconcile_frontier(self._peer_raw, peer_site, eligibility, position, mode)
            self._mode, self._explicit, self._origin_position = mode, sites, position
            self._frontier_dirty = False
        selection = replica._select_for_peer(self._peer_raw, peer_site)
        if not selection.tables <= self._peer_schemas.keys():
            return  # the peer has not announced every table yet; retry on a later event
        if not selection.encoded:
            self._observed = marker
            self._send_synchronized_once()
            return
        frames = pack_batch_chunks(selection.encoded, self._chunk_target)
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        self._send(BeginBatch(batch_id))
        self._outbox.extend(frames)
        self._send(CommitBatch())
        self._in_flight = _InFlight(
            batch_id,
            selection.advances,
            marker if selection.complete else None,
            len(selection.encoded),
        )
        self._synchronized_sent = False
        self._batches_sent += 1
        self._changes_sent += len(selection.encoded)

    def _send_synchronized_once(self) -> None:
        if not self._synchronized_sent:
            self._synchronized_sent = True
            self._send(Synchronized())

    def __repr__(self) -> str:
        return (
            f"<ReplicaSession peer={self._peer.hex()} state={self._state.value} "
            f"in_flight={self.batch_in_flight}>"
        )
