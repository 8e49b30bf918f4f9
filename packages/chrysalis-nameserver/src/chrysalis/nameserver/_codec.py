"""The nameserver frame codec, ``NsCodec`` (spec 1.2, 1.3).

Why this shape: the nameserver stream is the lease on everything a child publishes, and the
peer at the other end is not trusted. So the codec is exact and bounded:

* a frame is ``u32 BE body_len`` + body, body = ``u8 wire_version`` ``u8 tag`` fields; every
  integer is big-endian and fixed-width (no varints), so the encoding is canonical;
* every limit of the spec is enforced both when encoding and when decoding (frame size, string
  and address lengths, list counts); the length prefix is checked before a body byte is
  buffered or allocated, and list counts before their items are read;
* decoding arbitrary bytes raises only ``CodecError`` subclasses, never anything else;
* labels are written in key order and re-validated (grammar, duplicates) when read; trailing
  bytes after a message are an error.

``NsCodec.encode`` / ``NsCodec.decode`` work on whole frames. An ``NsCodec`` instance is the
incremental stream decoder of the I/O layer: ``feed(data)`` bytes as they arrive, then call
``next_message()`` until it returns ``None``; ``end_of_input()`` marks the end of the stream,
after which a partial frame is a ``TruncatedFrame`` and an empty buffer a clean end. The codec
only checks structure; direction and ordering belong to the sessions. No I/O here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final, final

from chrysalis.core import PID_LEN, AddressError, DatagramAddr, LinkId, Pid
from chrysalis.core.framing import LengthPrefixDecoder
from chrysalis.nameserver._errors import (
    CodecError,
    DecoderBufferFull,
    FieldTooLarge,
    FrameTooLarge,
    InvalidAddress,
    InvalidEnumValue,
    InvalidFrameLength,
    InvalidLabel,
    InvalidUtf8,
    InvalidVersionRange,
    LabelError,
    LabelErrorKind,
    TooManyItems,
    TrailingBytes,
    TruncatedFrame,
    UnexpectedEof,
    UnknownMessageTag,
    UnsupportedWireVersion,
)
from chrysalis.nameserver._labels import (
    MAX_LABEL_KEY_LEN,
    MAX_LABEL_VALUE_LEN,
    Labels,
    validate_label_key,
    validate_label_value,
)
from chrysalis.nameserver._protocol import (
    FRAME_PREFIX_LEN,
    MAX_ADDRESS_LEN,
    MAX_ENTRIES_PER_FRAME,
    MAX_FRAME_BODY,
    MAX_LABELS_PER_ENTRY,
    MAX_LOCATORS_PER_ENTRY,
    MAX_REMOVALS_PER_FRAME,
    MAX_SCHEME_LEN,
    MAX_SERVER_NAME_LEN,
    MIN_FRAME_BODY,
    WIRE_VERSION,
    CacheUpdate,
    Consistency,
    Delta,
    Enumerate,
    EnumerateResult,
    EnumerationCursor,
    EnumerationPage,
    EnumerationResult,
    EnumerationStale,
    Found,
    Hello,
    Locator,
    NotFound,
    NsMessage,
    ProcEntry,
    PublicationAck,
    Reject,
    RejectCode,
    ResnapshotRequired,
    Resolution,
    Resolve,
    ResolveResult,
    Revision,
    SnapshotBegin,
    SnapshotChunk,
    SnapshotEnd,
    VersionRange,
    Welcome,
)

__all__ = ["DEFAULT_BUFFER_LIMIT", "NsCodec"]

DEFAULT_BUFFER_LIMIT: Final = 2 * (FRAME_PREFIX_LEN + MAX_FRAME_BODY)
"""Default bound on the bytes an ``NsCodec`` buffers (two maximal frames)."""

_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_HEAD: Final = struct.Struct(">IBB")

_FOUND: Final = 1
_NOT_FOUND: Final = 2
_PAGE: Final = 1
_STALE: Final = 2
_NO_CURSOR: Final = 0
_CURSOR: Final = 1

# --------------------------------------------------------------------------------------------
# Encoding


def _utf8(text: str, limit: int, what: str) -> bytes:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidUtf8(f"{what} cannot be encoded as UTF-8") from exc
    if len(data) > limit:
        raise FieldTooLarge(f"{what} is {len(data)} bytes, at most {limit} allowed")
    return data


def _count(n: int, limit: int, what: str) -> None:
    if n > limit:
        raise TooManyItems(f"{n} {what}, at most {limit} allowed")


def _put_revision(buf: bytearray, revision: Revision) -> None:
    buf += revision.authority.raw
    buf += _U64.pack(revision.value)


def _put_entry(buf: bytearray, entry: ProcEntry) -> None:
    buf += entry.pid.raw
    name = _utf8(entry.tls_server_name, MAX_SERVER_NAME_LEN, "tls server name")
    buf += _U16.pack(len(name))
    buf += name
    items = entry.labels.sorted_items()
    _count(len(items), MAX_LABELS_PER_ENTRY, "labels")
    buf += _U32.pack(len(items))
    for key, value in items:
        raw_key = _utf8(key, MAX_LABEL_KEY_LEN, "label key")
        raw_value = _utf8(value, MAX_LABEL_VALUE_LEN, "label value")
        buf += _U16.pack(len(raw_key))
        buf += raw_key
        buf += _U16.pack(len(raw_value))
        buf += raw_value
    _count(len(entry.locators), MAX_LOCATORS_PER_ENTRY, "locators")
    buf += _U32.pack(len(entry.locators))
    for locator in entry.locators:
        address = locator.address
        scheme = _utf8(address.scheme, MAX_SCHEME_LEN, "address scheme")
        opaque = address.opaque
        if len(opaque) > MAX_ADDRESS_LEN:
            raise FieldTooLarge(f"address is {len(opaque)} bytes, at most {MAX_ADDRESS_LEN}")
        buf += _U32.pack(locator.priority)
        buf += _U16.pack(len(scheme))
        buf += scheme
        buf += _U32.pack(len(opaque))
        buf += opaque
        _check_size(buf)


def _check_size(buf: bytearray) -> None:
    body = len(buf) - FRAME_PREFIX_LEN
    if body > MAX_FRAME_BODY:
        raise FrameTooLarge(f"frame body exceeds {MAX_FRAME_BODY} bytes")


def _put_entries(buf: bytearray, entries: tuple[ProcEntry, ...]) -> None:
    _count(len(entries), MAX_ENTRIES_PER_FRAME, "entries")
    buf += _U32.pack(len(entries))
    for entry in entries:
        _put_entry(buf, entry)
        _check_size(buf)


def _put_pids(buf: bytearray, pids: tuple[Pid, ...]) -> None:
    _count(len(pids), MAX_REMOVALS_PER_FRAME, "removals")
    buf += _U32.pack(len(pids))
    for pid in pids:
        buf += pid.raw


def _put_cursor(buf: bytearray, cursor: EnumerationCursor | None) -> None:
    if cursor is None:
        buf += _U8.pack(_NO_CURSOR)
        return
    buf += _U8.pack(_CURSOR)
    _put_revision(buf, cursor.revision)
    buf += cursor.after.raw


def _put_resolution(buf: bytearray, resolution: Resolution) -> None:
    if isinstance(resolution, Found):
        buf += _U8.pack(_FOUND)
        _put_entry(buf, resolution.entry)
        _put_revision(buf, resolution.revision)
    else:
        buf += _U8.pack(_NOT_FOUND)
        buf += resolution.pid.raw
        _put_revision(buf, resolution.revision)
        buf += _U64.pack(resolution.valid_for_millis)


def _put_fields(buf: bytearray, message: NsMessage) -> None:
    if isinstance(message, Hello):
        buf += _U16.pack(message.versions.min)
        buf += _U16.pack(message.versions.max)
        buf += message.child.raw
    elif isinstance(message, Welcome):
        buf += _U16.pack(message.version)
        buf += message.parent.raw
        buf += message.link.raw
    elif isinstance(message, Reject):
        buf += _U8.pack(message.code)
    elif isinstance(message, SnapshotBegin):
        buf += _U64.pack(message.snapshot)
        buf += _U64.pack(message.base_sequence)
    elif isinstance(message, SnapshotChunk):
        buf += _U64.pack(message.snapshot)
        buf += _U32.pack(message.chunk)
        _put_entries(buf, message.entries)
    elif isinstance(message, SnapshotEnd):
        buf += _U64.pack(message.snapshot)
        buf += _U32.pack(message.chunks)
    elif isinstance(message, Delta):
        buf += _U64.pack(message.sequence)
        _put_entries(buf, message.upserts)
        _put_pids(buf, message.removals)
    elif isinstance(message, ResnapshotRequired):
        buf += _U64.pack(message.expected_sequence)
    elif isinstance(message, Resolve):
        buf += _U64.pack(message.request)
        buf += message.pid.raw
        buf += _U8.pack(message.consistency)
    elif isinstance(message, ResolveResult):
        buf += _U64.pack(message.request)
        _put_resolution(buf, message.resolution)
    elif isinstance(message, CacheUpdate):
        _put_resolution(buf, message.resolution)
    elif isinstance(message, PublicationAck):
        buf += _U64.pack(message.sequence)
    elif isinstance(message, Enumerate):
        buf += _U64.pack(message.request)
        buf += _U8.pack(message.consistency)
        _put_cursor(buf, message.cursor)
        buf += _U32.pack(message.limit)
    elif isinstance(message, EnumerateResult):
        buf += _U64.pack(message.request)
        result = message.result
        if isinstance(result, EnumerationPage):
            buf += _U8.pack(_PAGE)
            _put_entries(buf, result.entries)
            _put_revision(buf, result.revision)
            _put_cursor(buf, result.next)
        else:
            buf += _U8.pack(_STALE)
            _put_revision(buf, result.current)
    else:
        raise TypeError(f"not a nameserver message: {type(message).__name__}")


def encode_message(message: NsMessage) -> bytes:
    """Encode ``message`` as one complete frame (prefix included)."""
    tag = getattr(type(message), "TAG", None)
    if not isinstance(tag, int):
        raise TypeError(f"not a nameserver message: {type(message).__name__}")
    buf = bytearray(_HEAD.size)
    _put_fields(buf, message)
    _check_size(buf)
    _HEAD.pack_into(buf, 0, len(buf) - FRAME_PREFIX_LEN, WIRE_VERSION, tag)
    return bytes(buf)


def entry_wire_size(entry: ProcEntry) -> int:
    """Bytes ``entry`` takes inside a frame (exact for encodable entries)."""
    size = PID_LEN + 2 + len(entry.tls_server_name.encode("utf-8", "surrogatepass")) + 4 + 4
    for key, value in entry.labels.sorted_items():
        size += 4 + len(key.encode("utf-8", "surrogatepass"))
        size += len(value.encode("utf-8", "surrogatepass"))
    for locator in entry.locators:
        address = locator.address
        size += 10 + len(address.scheme.encode("utf-8", "surrogatepass")) + len(address.opaque)
    return size


# --------------------------------------------------------------------------------------------
# Decoding


@final
class _Reader:
    """A cursor over one frame body; every read past the end raises ``UnexpectedEof``."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.end = len(data)

    def take(self, n: int) -> bytes:
        start = self.pos
        stop = start + n
        if stop > self.end:
            raise UnexpectedEof(f"field of {n} bytes runs past the end of the frame body")
        self.pos = stop
        return self.data[start:stop]

    def _unpack(self, fmt: struct.Struct) -> int:
        start = self.pos
        stop = start + fmt.size
        if stop > self.end:
            raise UnexpectedEof(f"{fmt.size}-byte integer runs past the end of the frame body")
        self.pos = stop
        value: int = fmt.unpack_from(self.data, start)[0]
        return value

    def u8(self) -> int:
        return self._unpack(_U8)

    def u16(self) -> int:
        return self._unpack(_U16)

    def u32(self) -> int:
        return self._unpack(_U32)

    def u64(self) -> int:
        return self._unpack(_U64)

    def pid(self) -> Pid:
        return Pid(self.take(PID_LEN))

    def text(self, n: int, limit: int, what: str) -> str:
        if n > limit:
            raise FieldTooLarge(f"{what} is {n} bytes, at most {limit} allowed")
        raw = self.take(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidUtf8(f"{what} is not valid UTF-8") from exc

    def count(self, limit: int, what: str) -> int:
        n = self.u32()
        if n > limit:
            raise TooManyItems(f"{n} {what}, at most {limit} allowed")
        return n


def _read_version(r: _Reader, what: str) -> int:
    value = r.u16()
    if value == 0:
        raise InvalidVersionRange(f"{what} is 0")
    return value


def _read_revision(r: _Reader) -> Revision:
    authority = r.pid()
    return Revision(authority, r.u64())


def _read_labels(r: _Reader) -> Labels:
    n = r.count(MAX_LABELS_PER_ENTRY, "labels")
    pairs: dict[str, str] = {}
    for _ in range(n):
        key = r.text(r.u16(), MAX_LABEL_KEY_LEN, "label key")
        value = r.text(r.u16(), MAX_LABEL_VALUE_LEN, "label value")
        try:
            validate_label_key(key)
            validate_label_value(key, value)
            if key in pairs:
                raise LabelError(LabelErrorKind.DUPLICATE_KEY, key)
        except LabelError as exc:
            raise InvalidLabel(str(exc)) from exc
        pairs[key] = value
    if not pairs:
        return Labels.EMPTY
    return Labels._from_sorted(tuple(sorted(pairs.items())))


def _read_locator(r: _Reader) -> Locator:
    priority = r.u32()
    scheme = r.text(r.u16(), MAX_SCHEME_LEN, "address scheme")
    n = r.u32()
    if n > MAX_ADDRESS_LEN:
        raise FieldTooLarge(f"address is {n} bytes, at most {MAX_ADDRESS_LEN} allowed")
    opaque = r.take(n)
    try:
        address = DatagramAddr(scheme, opaque)
    except AddressError as exc:
        raise InvalidAddress(str(exc)) from exc
    return Locator(address, priority)


def _read_entry(r: _Reader) -> ProcEntry:
    pid = r.pid()
    name = r.text(r.u16(), MAX_SERVER_NAME_LEN, "tls server name")
    labels = _read_labels(r)
    n = r.count(MAX_LOCATORS_PER_ENTRY, "locators")
    locators = tuple(_read_locator(r) for _ in range(n))
    return ProcEntry(pid, name, labels, locators)


def _read_entries(r: _Reader) -> tuple[ProcEntry, ...]:
    n = r.count(MAX_ENTRIES_PER_FRAME, "entries")
    return tuple(_read_entry(r) for _ in range(n))


def _read_pids(r: _Reader) -> tuple[Pid, ...]:
    n = r.count(MAX_REMOVALS_PER_FRAME, "removals")
    return tuple(r.pid() for _ in range(n))


def _read_cursor(r: _Reader) -> EnumerationCursor | None:
    flag = r.u8()
    if flag == _NO_CURSOR:
        return None
    if flag != _CURSOR:
        raise InvalidEnumValue(f"cursor flag {flag} is neither 0 nor 1")
    revision = _read_revision(r)
    return EnumerationCursor(revision, r.pid())


def _read_consistency(r: _Reader) -> Consistency:
    value = r.u8()
    try:
        return Consistency(value)
    except ValueError:
        raise InvalidEnumValue(f"consistency {value} is unknown") from None


def _read_resolution(r: _Reader) -> Resolution:
    kind = r.u8()
    if kind == _FOUND:
        entry = _read_entry(r)
        return Found(entry, _read_revision(r))
    if kind == _NOT_FOUND:
        pid = r.pid()
        revision = _read_revision(r)
        return NotFound(pid, revision, r.u64())
    raise InvalidEnumValue(f"resolution kind {kind} is unknown")


def _read_enumeration(r: _Reader) -> EnumerationResult:
    kind = r.u8()
    if kind == _PAGE:
        entries = _read_entries(r)
        revision = _read_revision(r)
        return EnumerationPage(entries, revision, _read_cursor(r))
    if kind == _STALE:
        return EnumerationStale(_read_revision(r))
    raise InvalidEnumValue(f"enumeration result kind {kind} is unknown")


def _hello(r: _Reader) -> Hello:
    low = _read_version(r, "version range min")
    high = _read_version(r, "version range max")
    if low > high:
        raise InvalidVersionRange(f"version range min {low} is above max {high}")
    return Hello(VersionRange(low, high), r.pid())


def _welcome(r: _Reader) -> Welcome:
    version = _read_version(r, "welcome version")
    parent = r.pid()
    return Welcome(version, parent, LinkId(r.take(PID_LEN)))


def _reject(r: _Reader) -> Reject:
    value = r.u8()
    try:
        return Reject(RejectCode(value))
    except ValueError:
        raise InvalidEnumValue(f"reject code {value} is unknown") from None


def _snapshot_begin(r: _Reader) -> SnapshotBegin:
    snapshot = r.u64()
    return SnapshotBegin(snapshot, r.u64())


def _snapshot_chunk(r: _Reader) -> SnapshotChunk:
    snapshot = r.u64()
    chunk = r.u32()
    return SnapshotChunk(snapshot, chunk, _read_entries(r))


def _snapshot_end(r: _Reader) -> SnapshotEnd:
    snapshot = r.u64()
    return SnapshotEnd(snapshot, r.u32())


def _delta(r: _Reader) -> Delta:
    sequence = r.u64()
    upserts = _read_entries(r)
    return Delta(sequence, upserts, _read_pids(r))


def _resolve(r: _Reader) -> Resolve:
    request = r.u64()
    pid = r.pid()
    return Resolve(request, pid, _read_consistency(r))


def _resolve_result(r: _Reader) -> ResolveResult:
    request = r.u64()
    return ResolveResult(request, _read_resolution(r))


def _enumerate(r: _Reader) -> Enumerate:
    request = r.u64()
    consistency = _read_consistency(r)
    cursor = _read_cursor(r)
    return Enumerate(request, consistency, cursor, r.u32())


def _enumerate_result(r: _Reader) -> EnumerateResult:
    request = r.u64()
    return EnumerateResult(request, _read_enumeration(r))


_DECODERS: Final[dict[int, Callable[[_Reader], NsMessage]]] = {
    Hello.TAG: _hello,
    Welcome.TAG: _welcome,
    Reject.TAG: _reject,
    SnapshotBegin.TAG: _snapshot_begin,
    SnapshotChunk.TAG: _snapshot_chunk,
    SnapshotEnd.TAG: _snapshot_end,
    Delta.TAG: _delta,
    ResnapshotRequired.TAG: lambda r: ResnapshotRequired(r.u64()),
    Resolve.TAG: _resolve,
    ResolveResult.TAG: _resolve_result,
    CacheUpdate.TAG: lambda r: CacheUpdate(_read_resolution(r)),
    PublicationAck.TAG: lambda r: PublicationAck(r.u64()),
    Enumerate.TAG: _enumerate,
    EnumerateResult.TAG: _enumerate_result,
}


def _check_body_length(body_len: int) -> None:
    if body_len > MAX_FRAME_BODY:
        raise FrameTooLarge(f"declared frame body of {body_len} bytes exceeds {MAX_FRAME_BODY}")
    if body_len < MIN_FRAME_BODY:
        raise InvalidFrameLength(f"declared frame body of {body_len} bytes is below 2")


def decode_body(body: bytes) -> NsMessage:
    """Decode one frame body (wire version, tag, fields; no prefix)."""
    if len(body) > MAX_FRAME_BODY:
        raise FrameTooLarge(f"frame body of {len(body)} bytes exceeds {MAX_FRAME_BODY}")
    r = _Reader(body)
    version = r.u8()
    tag = r.u8()
    if version != WIRE_VERSION:
        raise UnsupportedWireVersion(f"wire version {version}, expected {WIRE_VERSION}")
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise UnknownMessageTag(f"message tag {tag} is unknown")
    message = decoder(r)
    if r.pos != r.end:
        raise TrailingBytes(f"{r.end - r.pos} bytes follow the message")
    return message


def decode_frame(frame: bytes | bytearray | memoryview) -> NsMessage:
    """Decode exactly one complete frame (prefix included)."""
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise TypeError(f"frame must be bytes-like, not {type(frame).__name__}")
    n = len(frame)
    if n < FRAME_PREFIX_LEN:
        raise UnexpectedEof(f"frame of {n} bytes is shorter than its length prefix")
    (body_len,) = _U32.unpack_from(frame, 0)
    _check_body_length(body_len)
    if body_len != n - FRAME_PREFIX_LEN:
        raise InvalidFrameLength(
            f"prefix declares {body_len} body bytes, {n - FRAME_PREFIX_LEN} supplied"
        )
    return decode_body(bytes(frame[FRAME_PREFIX_LEN:]))


# --------------------------------------------------------------------------------------------
# The stream codec


@final
class NsCodec:
    """Bounded, deterministic codec of nameserver frames; an instance decodes one stream.

    Whole frames: ``NsCodec.encode(message) -> bytes`` (raises ``FieldTooLarge``,
    ``TooManyItems``, ``FrameTooLarge`` or ``InvalidUtf8`` for unencodable values) and
    ``NsCodec.decode(frame) -> NsMessage`` (raises ``CodecError`` subclasses only).

    Streams: ``feed(data)`` appends received bytes (``DecoderBufferFull`` if more than
    ``buffer_limit`` bytes would be buffered; the data is then not taken), ``next_message()``
    returns the next complete message or ``None`` when no complete frame is buffered, and
    ``end_of_input()`` records the end of the stream. After the end, ``next_message()`` still
    returns buffered complete frames, then raises ``TruncatedFrame`` if a partial frame remains;
    ``finished`` is true at a clean end. A declared length over ``MAX_FRAME_BODY`` is rejected
    as soon as its four prefix bytes arrive, before any body byte is buffered. After any decode
    error the stream is unusable: every later ``feed`` / ``next_message`` raises the same error.
    """

    __slots__ = ("_buffer_limit", "_eof", "_frames")

    def __init__(self, *, buffer_limit: int = DEFAULT_BUFFER_LIMIT) -> None:
        if not isinstance(buffer_limit, int) or buffer_limit < FRAME_PREFIX_LEN + MAX_FRAME_BODY:
            raise ValueError(
                f"buffer_limit must be at least one maximal frame "
                f"({FRAME_PREFIX_LEN + MAX_FRAME_BODY} bytes), got {buffer_limit!r}"
            )
        self._buffer_limit = buffer_limit
        self._frames = LengthPrefixDecoder(
            MAX_FRAME_BODY, prefix_size=FRAME_PREFIX_LEN, too_large=_declared_too_large
        )
        self._eof = False

    encode = staticmethod(encode_message)
    decode = staticmethod(decode_frame)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as messages."""
        return self._frames.buffered

    @property
    def finished(self) -> bool:
        """True once the input ended cleanly and every complete frame was returned."""
        return self._eof and self.buffered == 0 and self._frames.error is None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes; see the class docstring for the bounds."""
        error = self._frames.error
        if error is not None:
            raise error
        if self._eof:
            raise RuntimeError("NsCodec.feed after end_of_input")
        if not data:
            return
        if self.buffered + len(data) > self._buffer_limit:
            raise DecoderBufferFull(
                f"{self.buffered} bytes buffered, {len(data)} more would exceed the "
                f"{self._buffer_limit}-byte bound"
            )
        self._frames.feed(data)
        self._peek_body_len()

    def end_of_input(self) -> None:
        """Record that the stream ended (idempotent)."""
        self._eof = True

    def next_message(self) -> NsMessage | None:
        """The next complete message, or ``None`` when no complete frame is buffered."""
        body = self._frames.next_frame() if self._peek_body_len() is not None else None
        if body is None:
            available = self.buffered
            if self._eof and available:
                self._frames.poison(
                    TruncatedFrame(f"stream ended inside a frame ({available} bytes buffered)")
                )
            return None
        try:
            return decode_body(body)
        except CodecError as exc:
            self._frames.poison(exc)

    def _peek_body_len(self) -> int | None:
        """The next frame's declared body length once its prefix is known; the shared decoder
        refuses one over ``MAX_FRAME_BODY``, this codec one below ``MIN_FRAME_BODY``."""
        body_len = self._frames.peek_length()
        if body_len is not None and body_len < MIN_FRAME_BODY:
            self._frames.poison(
                InvalidFrameLength(f"declared frame body of {body_len} bytes is below 2")
            )
        return body_len


def _declared_too_large(body_len: int, max_body: int) -> FrameTooLarge:
    return FrameTooLarge(f"declared frame body of {body_len} bytes exceeds {max_body}")
