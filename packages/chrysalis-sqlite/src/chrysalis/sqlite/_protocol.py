"""The ``chrysalis.sql.v5`` stream protocol: messages, their codec and a resumable frame reader.

Why a hand-written codec: the byte layout must match the reference implementation exactly
(wire compatibility with Rust replicas), so every field is written with ``struct`` in a fixed,
documented order rather than by a generic serializer. Messages themselves are frozen, slotted
``msgspec.Struct`` records.

Framing: ``u32 BE body_len`` (at most ``MAX_FRAME_BYTES``, checked as soon as the four prefix
bytes are known, before any body is buffered), then the body: ``u8 tag`` and the fields.
Decoding rejects trailing bytes, unknown tags, invalid UTF-8 and counts over their limits with
``CodecError``. Encoding enforces the same limits, so an encoder never produces a frame a
decoder would refuse. The stream is reliable and ordered; a clean end of stream has no partial
frame, any other end is ``TruncatedFrameError``.

Primitives (big-endian): counts are u32; ``bytes`` is a u32 length (at most ``MAX_BYTES``) and
raw bytes; ``string`` is ``bytes`` holding UTF-8; i64/u64 are 8 bytes. A ``Change`` is
``string table ‖ values key ‖ u8 kind (0 DELETE, 1 UPSERT followed by values row) ‖ i64
db_version ‖ bytes site_id ‖ i64 seq``. A scope is ``u8 0`` (explicit) ``‖ u64 generation ‖
u32 count ‖ count x bytes site`` or ``u8 1`` (complement of the peer).

| tag | message      | fields                              |
|-----|--------------|-------------------------------------|
| 1   | Hello        | bytes site_id, scope                |
| 2   | Scope        | scope                               |
| 3   | BeginBatch   | u64 batch_id                        |
| 4   | BatchChunk   | u32 count (≤ 65 536) + changes      |
| 5   | CommitBatch  | none                                |
| 6   | Ack          | u64 batch_id                        |
| 7   | Schema       | string table, bytes hash (32 bytes) |
| 8   | Synchronized | none                                |

This module is pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

import msgspec

from chrysalis.core.framing import LengthPrefixDecoder
from chrysalis.sqlite._errors import (
    CodecError,
    FrameTooLargeError,
    SiteScopeError,
    TruncatedFrameError,
    quote,
)
from chrysalis.sqlite._scope import SiteScope, SiteSet
from chrysalis.sqlite._values import MAX_BYTES, MAX_VALUES, SqlValue, encode_values, read_values

__all__ = [
    "MAX_CHUNK_CHANGES",
    "MAX_FRAME_BYTES",
    "PROTOCOL_ID",
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
    "Synchronized",
    "decode_body",
    "encode_change",
    "encode_change_parts",
    "encode_message",
    "frame_batch_chunk",
]

PROTOCOL_ID: Final = b"chrysalis.sql.v5"
"""The 16-byte link-local protocol selector of SQLite replication."""

MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
"""Longest frame body."""

MAX_CHUNK_CHANGES: Final = 65_536
"""Most changes in one ``BatchChunk``."""

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_U64_MAX: Final = 2**64 - 1

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_TAG_U64 = struct.Struct(">BQ")
_FRAME_TAG = struct.Struct(">IB")
_CHUNK_HEAD = struct.Struct(">IBI")
_I64_U32 = struct.Struct(">qI")

_TABLE_FIELD_CACHE: Final = 256
_TABLE_FIELDS: dict[str, bytes] = {}
"""Encoded ``string`` fields of table names seen by ``encode_change_parts`` (bounded)."""

EncodedChange = tuple[bytes, bytes | None]
"""A received change's key and row value lists exactly as they were on the wire (``None``: a
delete). The value-list encoding is canonical, so these are the bytes a re-encoding gives."""

_HELLO, _SCOPE, _BEGIN, _CHUNK, _COMMIT, _ACK, _SCHEMA, _SYNCHRONIZED = range(1, 9)
_DELETE, _UPSERT = 0, 1


class Change(msgspec.Struct, frozen=True, gc=False):
    """One replicated row mutation, with its origin tuple.

    ``key`` holds the primary-key values, ``row`` every column (in the table's ``columns``
    order) for an upsert or ``None`` for a delete. ``(db_version, site_id, seq)`` is the origin
    tuple: the origin replica's logical version, its 16-byte site id, and the mutation's index
    within that version. Last writer wins on that tuple, compared lexicographically.
    """

    table: str
    key: tuple[SqlValue, ...]
    row: tuple[SqlValue, ...] | None
    db_version: int
    site_id: bytes
    seq: int

    @property
    def is_delete(self) -> bool:
        """Whether the change deletes the row."""
        return self.row is None


class Hello(msgspec.Struct, frozen=True, gc=False):
    """First message of each direction: the sender's site id and its current scope."""

    site_id: bytes
    scope: SiteScope


class Scope(msgspec.Struct, frozen=True, gc=False):
    """The sender's scope changed."""

    scope: SiteScope


class BeginBatch(msgspec.Struct, frozen=True, gc=False):
    """A batch of changes follows, identified by ``batch_id`` (u64)."""

    batch_id: int


class BatchChunk(msgspec.Struct, frozen=True, gc=False):
    """Part of the open batch: at most ``MAX_CHUNK_CHANGES`` changes, applied atomically."""

    changes: tuple[Change, ...]


class CommitBatch(msgspec.Struct, frozen=True, gc=False):
    """The open batch is complete; the receiver acknowledges it."""


class Ack(msgspec.Struct, frozen=True, gc=False):
    """Every chunk of batch ``batch_id`` is durably applied."""

    batch_id: int


class Schema(msgspec.Struct, frozen=True, gc=False):
    """The sender's digest of its descriptor for ``table`` (32 bytes, never SQL)."""

    table: str
    schema_hash: bytes


class Synchronized(msgspec.Struct, frozen=True, gc=False):
    """The sender has nothing more to send right now."""


Message = Hello | Scope | BeginBatch | BatchChunk | CommitBatch | Ack | Schema | Synchronized
"""Any message of the v5 protocol."""


# --------------------------------------------------------------------------------------------
# Encoding


def _check_u64(what: str, value: int) -> int:
    if not isinstance(value, int) or not 0 <= value <= _U64_MAX:
        raise CodecError(f"{what} {quote(value)} is not a u64")
    return value


def _check_i64(what: str, value: int) -> int:
    if not isinstance(value, int) or not _I64_MIN <= value <= _I64_MAX:
        raise CodecError(f"{what} {quote(value)} is not an i64")
    return value


def _bytes_field(what: str, value: bytes) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise CodecError(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > MAX_BYTES:
        raise CodecError(f"{what} of {len(value)} bytes exceeds {MAX_BYTES}")
    return _U32.pack(len(value)) + bytes(value)


def _string_field(what: str, value: str) -> bytes:
    if not isinstance(value, str):
        raise CodecError(f"{what} must be str, not {type(value).__name__}")
    try:
        raw = value.encode()
    except UnicodeEncodeError:
        raise CodecError(f"{what} {quote(value)} is not valid Unicode") from None
    return _bytes_field(what, raw)


def _encode_scope(scope: SiteScope) -> bytes:
    if not isinstance(scope, SiteScope):
        raise CodecError(f"scope must be a SiteScope, not {type(scope).__name__}")
    sites = scope.sites
    if sites is None:
        return b"\x01"
    parts = [_TAG_U64.pack(0, _check_u64("scope generation", sites.generation))]
    parts.append(_U32.pack(len(sites.site_ids)))
    for site in sites.site_ids:
        parts.append(_U32.pack(len(site)))
        parts.append(site)
    return b"".join(parts)


def encode_change_parts(
    table: str, key_blob: bytes, row_blob: bytes | None, db_version: int, site_id: bytes, seq: int
) -> bytes:
    """Encode a change whose key and row are already value-list blobs (as stored in the log).

    This is the sender's per-change cost (every selected log row goes through it), so the
    table-name field is cached per name and the common case is one ``join``; anything unusual
    takes the checked path and its ``CodecError``."""
    head = _TABLE_FIELDS.get(table) if type(table) is str else None
    if head is None:
        head = _string_field("table name", table)
        if len(_TABLE_FIELDS) < _TABLE_FIELD_CACHE:
            _TABLE_FIELDS[table] = head
    if (
        type(db_version) is int
        and type(seq) is int
        and type(site_id) is bytes
        and _I64_MIN <= db_version <= _I64_MAX
        and _I64_MIN <= seq <= _I64_MAX
        and len(site_id) <= MAX_BYTES
    ):
        tail = _I64_U32.pack(db_version, len(site_id))
        if row_blob is None:
            return b"".join((head, key_blob, b"\x00", tail, site_id, _I64.pack(seq)))
        return b"".join((head, key_blob, b"\x01", row_blob, tail, site_id, _I64.pack(seq)))
    parts = [head, key_blob]
    if row_blob is None:
        parts.append(b"\x00")
    else:
        parts.append(b"\x01")
        parts.append(row_blob)
    parts.append(_I64.pack(_check_i64("db_version", db_version)))
    parts.append(_bytes_field("site id", site_id))
    parts.append(_I64.pack(_check_i64("seq", seq)))
    return b"".join(parts)


def encode_change(change: Change) -> bytes:
    """Encode one change (without framing); ``CodecError`` if a field is out of its limits."""
    row = None if change.row is None else encode_values(change.row)
    return encode_change_parts(
        change.table, encode_values(change.key), row, change.db_version, change.site_id, change.seq
    )


def _frame(body: bytes) -> bytes:
    if len(body) > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"frame body of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _U32.pack(len(body)) + body


def frame_batch_chunk(encoded_changes: Sequence[bytes]) -> bytes:
    """A complete ``BatchChunk`` frame from already encoded changes (see ``encode_change``)."""
    count = len(encoded_changes)
    if count > MAX_CHUNK_CHANGES:
        raise CodecError(f"chunk of {count} changes exceeds {MAX_CHUNK_CHANGES}")
    size = 5 + sum(len(c) for c in encoded_changes)
    if size > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"frame body of {size} bytes exceeds {MAX_FRAME_BYTES}")
    return b"".join([_CHUNK_HEAD.pack(size, _CHUNK, count), *encoded_changes])


def encode_message(message: Message) -> bytes:
    """Encode ``message`` as one complete frame (length prefix included).

    Raises ``CodecError`` (``FrameTooLargeError`` for the body size) if any field or count is
    outside the protocol's limits; nothing partial is ever returned.
    """
    if isinstance(message, BatchChunk):
        return frame_batch_chunk([encode_change(c) for c in message.changes])
    if isinstance(message, Hello):
        body = b"".join(
            [
                _U8.pack(_HELLO),
                _bytes_field("site id", message.site_id),
                _encode_scope(message.scope),
            ]
        )
    elif isinstance(message, Scope):
        body = _U8.pack(_SCOPE) + _encode_scope(message.scope)
    elif isinstance(message, BeginBatch):
        body = _TAG_U64.pack(_BEGIN, _check_u64("batch id", message.batch_id))
    elif isinstance(message, CommitBatch):
        body = _U8.pack(_COMMIT)
    elif isinstance(message, Ack):
        body = _TAG_U64.pack(_ACK, _check_u64("batch id", message.batch_id))
    elif isinstance(message, Schema):
        if not isinstance(message.schema_hash, bytes) or len(message.schema_hash) != 32:
            raise CodecError("a schema hash must be exactly 32 bytes")
        body = b"".join(
            [
                _U8.pack(_SCHEMA),
                _string_field("table name", message.table),
                _bytes_field("schema hash", message.schema_hash),
            ]
        )
    elif isinstance(message, Synchronized):
        body = _U8.pack(_SYNCHRONIZED)
    else:
        raise CodecError(f"not a v5 message: {type(message).__name__}")
    return _frame(body)


# --------------------------------------------------------------------------------------------
# Decoding


class _Reader:
    """Sequential reads over one complete frame body; running past the end is a CodecError."""

    __slots__ = ("data", "offset")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def _need(self, n: int, what: str) -> int:
        start = self.offset
        if start + n > len(self.data):
            raise CodecError(f"{what} runs past the end of the message")
        self.offset = start + n
        return start

    def u8(self, what: str) -> int:
        return self.data[self._need(1, what)]

    def u32(self, what: str) -> int:
        return int(_U32.unpack_from(self.data, self._need(4, what))[0])

    def u64(self, what: str) -> int:
        return int(_U64.unpack_from(self.data, self._need(8, what))[0])

    def i64(self, what: str) -> int:
        return int(_I64.unpack_from(self.data, self._need(8, what))[0])

    def raw_bytes(self, what: str) -> bytes:
        length = self.u32(what)
        if length > MAX_BYTES:
            raise CodecError(f"{what} of {length} bytes exceeds {MAX_BYTES}")
        start = self._need(length, what)
        return self.data[start : start + length]

    def string(self, what: str) -> str:
        raw = self.raw_bytes(what)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise CodecError(f"{what} {quote(raw)} is not valid UTF-8") from None

    def count(self, what: str, limit: int) -> int:
        n = self.u32(what)
        if n > limit:
            raise CodecError(f"{what} of {n} exceeds the limit of {limit}")
        return n

    def scope(self) -> SiteScope:
        kind = self.u8("scope kind")
        if kind == 1:
            return SiteScope.complement()
        if kind != 0:
            raise CodecError(f"unknown scope kind {kind}")
        generation = self.u64("scope generation")
        n = self.count("scope site count", MAX_VALUES)
        sites = [self.raw_bytes("scope site id") for _ in range(n)]
        try:
            return SiteScope.explicit(SiteSet(generation, sites))
        except SiteScopeError as exc:
            raise CodecError(f"invalid scope: {exc}") from None

    def changes(self, count: int, encodings: list[EncodedChange] | None) -> tuple[Change, ...]:
        """Decode ``count`` changes; with ``encodings``, also append each change's key and
        row value lists as received (slices of the body, see ``FrameDecoder``).

        One loop with the reads inlined: a chunk holds thousands of changes and this is the
        receiver's per-change cost. The checks are those of the field readers above."""
        data = self.data
        offset = self.offset
        end = len(data)
        changes: list[Change] = []
        append = changes.append
        tables: dict[bytes, str] = {}
        for _ in range(count):
            if offset + 4 > end:
                raise CodecError("table name runs past the end of the message")
            (length,) = _U32.unpack_from(data, offset)
            if length > MAX_BYTES:
                raise CodecError(f"table name of {length} bytes exceeds {MAX_BYTES}")
            start = offset + 4
            offset = start + length
            if offset > end:
                raise CodecError("table name runs past the end of the message")
            raw = data[start:offset]
            table = tables.get(raw)
            if table is None:
                try:
                    table = raw.decode()
                except UnicodeDecodeError:
                    raise CodecError(f"table name {quote(raw)} is not valid UTF-8") from None
                tables[raw] = table
            start = offset
            key, offset = read_values(data, offset)
            key_blob = data[start:offset]
            if offset >= end:
                raise CodecError("change kind runs past the end of the message")
            kind = data[offset]
            offset += 1
            row: tuple[SqlValue, ...] | None
            if kind == _UPSERT:
                start = offset
                row, offset = read_values(data, offset)
                row_blob: bytes | None = data[start:offset]
            elif kind == _DELETE:
                row = row_blob = None
            else:
                raise CodecError(f"unknown change kind {kind}")
            if offset + 12 > end:
                what = "db_version" if offset + 8 > end else "site id"
                raise CodecError(f"{what} runs past the end of the message")
            db_version, length = _I64_U32.unpack_from(data, offset)
            if length > MAX_BYTES:
                raise CodecError(f"site id of {length} bytes exceeds {MAX_BYTES}")
            start = offset + 12
            offset = start + length
            if offset > end:
                raise CodecError("site id runs past the end of the message")
            site_id = data[start:offset]
            if offset + 8 > end:
                raise CodecError("seq runs past the end of the message")
            (seq,) = _I64.unpack_from(data, offset)
            offset += 8
            append(Change(table, key, row, db_version, site_id, seq))
            if encodings is not None:
                encodings.append((key_blob, row_blob))
        self.offset = offset
        return tuple(changes)


def decode_body(body: bytes) -> Message:
    """Decode one frame body (tag and fields, without the length prefix).

    Raises ``CodecError`` for an empty body, an unknown tag, a field running past the end,
    trailing bytes, invalid UTF-8 or a count over its limit.
    """
    return _decode_body(body, None)


def _decode_body(body: bytes, encodings: list[EncodedChange] | None) -> Message:
    reader = _Reader(body)
    tag = reader.u8("message tag")
    message: Message
    if tag == _CHUNK:
        n = reader.count("chunk change count", MAX_CHUNK_CHANGES)
        message = BatchChunk(reader.changes(n, encodings))
    elif tag == _HELLO:
        site_id = reader.raw_bytes("site id")
        message = Hello(site_id, reader.scope())
    elif tag == _SCOPE:
        message = Scope(reader.scope())
    elif tag == _BEGIN:
        message = BeginBatch(reader.u64("batch id"))
    elif tag == _COMMIT:
        message = CommitBatch()
    elif tag == _ACK:
        message = Ack(reader.u64("batch id"))
    elif tag == _SCHEMA:
        table = reader.string("table name")
        schema_hash = reader.raw_bytes("schema hash")
        if len(schema_hash) != 32:
            raise CodecError(f"schema hash of {len(schema_hash)} bytes (must be 32)")
        message = Schema(table, schema_hash)
    elif tag == _SYNCHRONIZED:
        message = Synchronized()
    else:
        raise CodecError(f"unknown message tag {tag}")
    if reader.offset != len(body):
        raise CodecError(f"{len(body) - reader.offset} trailing bytes after a message")
    return message


class FrameDecoder:
    """Resumable reader of v5 frames from a byte stream fed in arbitrary pieces.

    ``feed`` appends bytes; ``next_message`` returns the next complete message or ``None`` when
    more bytes are needed (a partial frame stays buffered across calls, so an interrupted
    receive loses nothing). A length prefix over ``max_frame_bytes`` raises
    ``FrameTooLargeError`` as soon as its four bytes are known, before any body is buffered
    beyond what was fed. ``end_of_stream`` checks that the stream ended between frames
    (``TruncatedFrameError`` otherwise). After any error the decoder is poisoned and keeps
    raising it (and releases its buffer). The framing is ``chrysalis.core.framing``'s
    ``LengthPrefixDecoder``; this class decodes the bodies.
    """

    __slots__ = ("_encodings", "_frames", "_keep")

    def __init__(
        self, max_frame_bytes: int = MAX_FRAME_BYTES, *, keep_encodings: bool = False
    ) -> None:
        if not 1 <= max_frame_bytes <= MAX_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be in 1..{MAX_FRAME_BYTES}")
        self._frames = LengthPrefixDecoder(
            max_frame_bytes, too_large=_frame_too_large, truncated=_truncated_frame
        )
        self._keep = keep_encodings
        self._encodings: list[EncodedChange] | None = None

    @property
    def chunk_encodings(self) -> list[EncodedChange] | None:
        """With ``keep_encodings``: for the ``BatchChunk`` ``next_message`` returned last, each
        change's key and row value lists as received (``None`` after any other message, or
        without ``keep_encodings``). A receiver checks keys against rows with these
        instead of encoding the decoded values again."""
        return self._encodings

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as messages."""
        return self._frames.buffered

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes."""
        self._frames.feed(data)

    def next_message(self) -> Message | None:
        """The next complete message, or ``None`` if the buffered bytes end mid-frame."""
        body = self._frames.next_frame()
        if body is None:
            return None
        encodings: list[EncodedChange] | None = [] if self._keep else None
        self._encodings = None
        try:
            message = _decode_body(body, encodings)
        except CodecError as exc:
            self._frames.poison(exc)
        if type(message) is BatchChunk:
            self._encodings = encodings
        return message

    def end_of_stream(self) -> None:
        """Declare the end of the stream: fine between frames, ``TruncatedFrameError`` inside
        one (including inside the length prefix)."""
        self._frames.end_of_stream()


def _frame_too_large(length: int, max_frame: int) -> FrameTooLargeError:
    return FrameTooLargeError(f"frame body of {length} bytes exceeds {max_frame}")


def _truncated_frame(pending: int) -> TruncatedFrameError:
    return TruncatedFrameError(f"stream ended inside a frame ({pending} bytes pending)")
