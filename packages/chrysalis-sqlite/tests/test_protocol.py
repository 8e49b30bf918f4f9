"""The v5 codec: value lists, messages, framing limits and the resumable frame reader."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.sqlite import (
    MAX_CHUNK_CHANGES,
    MAX_FRAME_BYTES,
    MAX_VALUES,
    PROTOCOL_ID,
    Ack,
    BatchChunk,
    BeginBatch,
    Change,
    CodecError,
    CommitBatch,
    FrameDecoder,
    FrameTooLargeError,
    Hello,
    Message,
    Schema,
    Scope,
    SiteScope,
    SiteSet,
    Synchronized,
    TruncatedFrameError,
    decode_body,
    decode_values,
    encode_change,
    encode_message,
    encode_values,
)

_PROPERTY = settings(max_examples=150, deadline=None)

sql_values = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)
value_lists = st.lists(sql_values, max_size=6).map(tuple)
site_ids = st.binary(min_size=16, max_size=16)
changes = st.builds(
    Change,
    table=st.text(min_size=1, max_size=10),
    key=value_lists,
    row=st.none() | value_lists,
    db_version=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    site_id=site_ids,
    seq=st.integers(min_value=0, max_value=2**63 - 1),
)
scopes = st.one_of(
    st.just(SiteScope.complement()),
    st.builds(
        lambda gen, ids: SiteScope.explicit(SiteSet(gen, ids)),
        st.integers(min_value=0, max_value=2**64 - 1),
        st.lists(site_ids, max_size=4),
    ),
)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Hello, site_id=site_ids, scope=scopes),
    st.builds(Scope, scope=scopes),
    st.builds(BeginBatch, batch_id=u64),
    st.builds(BatchChunk, changes=st.lists(changes, max_size=4).map(tuple)),
    st.just(CommitBatch()),
    st.builds(Ack, batch_id=u64),
    st.builds(Schema, table=st.text(max_size=10), schema_hash=st.binary(min_size=32, max_size=32)),
    st.just(Synchronized()),
)


def test_protocol_selector_is_sixteen_ascii_bytes() -> None:
    assert PROTOCOL_ID == b"chrysalis.sql.v5"
    assert len(PROTOCOL_ID) == 16


@_PROPERTY
@given(value_lists)
def test_value_lists_round_trip_and_encoding_is_canonical(values: tuple[object, ...]) -> None:
    encoded = encode_values(values)
    decoded = decode_values(encoded)
    assert decoded == values
    assert [type(v) for v in decoded] == [type(v) for v in values]
    assert encode_values(decoded) == encoded


def test_value_encoding_matches_the_documented_layout() -> None:
    encoded = encode_values([None, 7, 7.0, "é", b"\x00\xff"])
    assert encoded == (
        b"\x00\x00\x00\x05"
        + b"\x00"
        + b"\x01"
        + struct.pack(">q", 7)
        + b"\x02"
        + struct.pack(">d", 7.0)
        + b"\x03\x00\x00\x00\x02"
        + "é".encode()
        + b"\x04\x00\x00\x00\x02\x00\xff"
    )
    # INTEGER 7 and REAL 7.0 are different keys
    assert encode_values([7]) != encode_values([7.0])


def test_nan_keeps_its_bit_pattern() -> None:
    (value,) = decode_values(encode_values([math.nan]))
    assert isinstance(value, float)
    assert math.isnan(value)


def test_value_encoder_rejects_what_sqlite_cannot_hold() -> None:
    with pytest.raises(CodecError, match="64 bits"):
        encode_values([2**63])
    with pytest.raises(CodecError, match="not an SQLite value"):
        encode_values([[1, 2]])
    with pytest.raises(CodecError, match="not valid Unicode"):
        encode_values(["\ud800"])
    with pytest.raises(CodecError, match="exceeds the limit"):
        encode_values([None] * (MAX_VALUES + 1))
    assert decode_values(encode_values([True, bytearray(b"x")])) == (1, b"x")


def test_value_decoder_rejects_unknown_tags_truncation_and_trailing_bytes() -> None:
    with pytest.raises(CodecError, match="unknown SQLite value tag 9"):
        decode_values(b"\x00\x00\x00\x01\x09")
    with pytest.raises(CodecError, match="past the end"):
        decode_values(b"\x00\x00\x00\x01\x01\x00")
    with pytest.raises(CodecError, match="trailing"):
        decode_values(encode_values([1]) + b"\x00")
    with pytest.raises(CodecError, match="exceeds the limit"):
        decode_values(struct.pack(">I", MAX_VALUES + 1))
    with pytest.raises(CodecError, match="UTF-8"):
        decode_values(b"\x00\x00\x00\x01\x03\x00\x00\x00\x01\xff")


def _same(a: Message, b: Message) -> bool:
    # NaN-free strategies, so structural equality is exact
    return a == b


@_PROPERTY
@given(messages)
def test_messages_round_trip(message: Message) -> None:
    frame = encode_message(message)
    (length,) = struct.unpack_from(">I", frame)
    assert length == len(frame) - 4
    assert _same(decode_body(frame[4:]), message)


@_PROPERTY
@given(st.lists(messages, min_size=1, max_size=6), st.data())
def test_messages_round_trip_over_fragmentable_stream(
    batch: list[Message], data: st.DataObject
) -> None:
    stream = b"".join(encode_message(m) for m in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    received: list[Message] = []
    start = 0
    for end in [*cuts, len(stream)]:
        decoder.feed(stream[start:end])
        start = end
        while (message := decoder.next_message()) is not None:
            received.append(message)
    decoder.end_of_stream()
    assert received == batch
    assert decoder.buffered == 0


def test_cancelled_receive_resumes_partial_frame() -> None:
    frame = encode_message(Ack(42))
    decoder = FrameDecoder()
    decoder.feed(frame[:3])
    assert decoder.next_message() is None  # an interrupted read keeps its partial prefix
    decoder.feed(frame[3:7])
    assert decoder.next_message() is None
    assert decoder.buffered == 7
    decoder.feed(frame[7:])
    assert decoder.next_message() == Ack(42)
    assert decoder.next_message() is None


def test_clean_eof_and_truncation_are_distinct() -> None:
    clean = FrameDecoder()
    clean.feed(encode_message(Synchronized()))
    assert clean.next_message() == Synchronized()
    clean.end_of_stream()  # between frames: fine

    empty = FrameDecoder()
    empty.end_of_stream()  # zero bytes: a clean end

    in_prefix = FrameDecoder()
    in_prefix.feed(b"\x00\x00")
    with pytest.raises(TruncatedFrameError):
        in_prefix.end_of_stream()

    in_body = FrameDecoder()
    in_body.feed(encode_message(Ack(1))[:-1])
    assert in_body.next_message() is None
    with pytest.raises(TruncatedFrameError):
        in_body.end_of_stream()


def test_rejects_oversized_frame_before_reading_its_body() -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">I", MAX_FRAME_BYTES + 1))  # only the prefix has arrived
    with pytest.raises(FrameTooLargeError):
        decoder.next_message()
    with pytest.raises(FrameTooLargeError):  # the decoder stays poisoned
        decoder.feed(b"more")
    small = FrameDecoder(max_frame_bytes=16)
    small.feed(encode_message(Hello(b"s" * 16, SiteScope.complement())))
    with pytest.raises(FrameTooLargeError):
        small.next_message()


def test_rejects_trailing_and_unknown_data() -> None:
    with pytest.raises(CodecError, match="trailing"):
        decode_body(encode_message(Ack(5))[4:] + b"\x00")
    with pytest.raises(CodecError, match="unknown message tag 99"):
        decode_body(b"\x63")
    with pytest.raises(CodecError, match="unknown message tag 0"):
        decode_body(b"\x00")
    with pytest.raises(CodecError, match="past the end"):
        decode_body(b"")
    with pytest.raises(CodecError, match="unknown scope kind"):
        decode_body(b"\x02\x07")
    change = encode_change(Change("t", (1,), None, 1, b"s" * 16, 0))
    body = bytearray(b"\x04\x00\x00\x00\x01" + change)
    body[5 + 4 + 1 + 4 + 9] = 7  # the kind byte after table "t" and key [1]
    with pytest.raises(CodecError, match="unknown change kind"):
        decode_body(bytes(body))
    with pytest.raises(CodecError, match="32"):
        decode_body(b"\x07" + b"\x00\x00\x00\x01t" + b"\x00\x00\x00\x03abc")
    with pytest.raises(CodecError, match="UTF-8"):
        decode_body(b"\x07" + b"\x00\x00\x00\x01\xff" + b"\x00\x00\x00\x20" + b"h" * 32)
    over = struct.pack(">BI", 4, MAX_CHUNK_CHANGES + 1)
    with pytest.raises(CodecError, match="exceeds the limit"):
        decode_body(over)
    with pytest.raises(CodecError, match="invalid scope"):
        decode_body(b"\x02\x00" + b"\x00" * 8 + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x02ab")


def test_decoder_errors_poison_the_stream() -> None:
    decoder = FrameDecoder()
    decoder.feed(b"\x00\x00\x00\x01\x63" + encode_message(Ack(1)))
    with pytest.raises(CodecError):
        decoder.next_message()
    with pytest.raises(CodecError):
        decoder.next_message()


def test_encoder_enforces_the_same_limits() -> None:
    with pytest.raises(CodecError, match="u64"):
        encode_message(Ack(-1))
    with pytest.raises(CodecError, match="u64"):
        encode_message(BeginBatch(2**64))
    with pytest.raises(CodecError, match="32 bytes"):
        encode_message(Schema("t", b"short"))
    with pytest.raises(CodecError, match="i64"):
        encode_change(Change("t", (1,), None, 2**63, b"s" * 16, 0))
    with pytest.raises(CodecError, match="not valid Unicode"):
        encode_change(Change("\ud800", (1,), None, 1, b"s" * 16, 0))
    big = b"x" * (MAX_FRAME_BYTES // 2)
    with pytest.raises(FrameTooLargeError):
        encode_message(BatchChunk((Change("t", (big,), (big, big), 1, b"s" * 16, 0),)))


def test_change_layout_matches_the_specification() -> None:
    change = Change("t", (1,), (1, "x"), 3, b"S" * 16, 2)
    assert encode_change(change) == (
        b"\x00\x00\x00\x01t"
        + encode_values([1])
        + b"\x01"
        + encode_values([1, "x"])
        + struct.pack(">q", 3)
        + b"\x00\x00\x00\x10"
        + b"S" * 16
        + struct.pack(">q", 2)
    )
    delete = encode_change(Change("t", (1,), None, 3, b"S" * 16, 2))
    assert delete[5 + 13] == 0  # kind byte: DELETE, no row follows
    assert len(delete) == len(encode_change(change)) - len(encode_values([1, "x"]))


@_PROPERTY
@given(st.lists(changes, max_size=6).map(tuple))
def test_kept_encodings_are_the_canonical_value_lists(chunk: tuple[Change, ...]) -> None:
    """A receiver logs a change's key and row as received: they must be exactly the encoding
    of the decoded values, for every value type."""
    decoder = FrameDecoder(keep_encodings=True)
    decoder.feed(encode_message(BatchChunk(chunk)) + encode_message(Ack(1)))
    received = decoder.next_message()
    assert isinstance(received, BatchChunk)
    assert _same(received, BatchChunk(chunk))
    encodings = decoder.chunk_encodings
    assert encodings is not None
    assert encodings == [
        (encode_values(c.key), None if c.row is None else encode_values(c.row))
        for c in received.changes
    ]
    assert decoder.next_message() == Ack(1)
    assert decoder.chunk_encodings is None  # only for the chunk just returned
    plain = FrameDecoder()  # without keep_encodings nothing is kept
    plain.feed(encode_message(BatchChunk(chunk)))
    assert plain.next_message() is not None
    assert plain.chunk_encodings is None


def test_every_truncation_of_a_chunk_is_a_codec_error() -> None:
    chunk = BatchChunk(
        (
            Change("notes", ("k",), ("k", 1, 2.5, b"\x00", None), 7, b"s" * 16, 3),
            Change("notes", (1,), None, 8, b"t" * 16, 0),
        )
    )
    body = encode_message(chunk)[4:]
    assert decode_body(body) == chunk
    for end in range(len(body)):
        with pytest.raises(CodecError):
            decode_body(body[:end])
    with pytest.raises(CodecError, match="table name"):
        decode_body(b"\x04\x00\x00\x00\x01\x00\x00\x00\x02\xff\xfe")
