"""``chrysalis.core.framing.LengthPrefixDecoder``: frames survive any fragmentation, a too-large
prefix is refused before its body is buffered, an end inside a frame is told apart from a clean
end, and every error poisons the decoder."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core.framing import (
    DEFAULT_PREFIX_SIZE,
    FrameBufferFull,
    FrameError,
    FrameTooLarge,
    LengthPrefixDecoder,
    TruncatedFrame,
)


def frame(body: bytes, prefix_size: int = DEFAULT_PREFIX_SIZE) -> bytes:
    return len(body).to_bytes(prefix_size, "big") + body


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(cut % (len(data) + 1) for cut in cuts), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


@settings(max_examples=200, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=250), max_size=12),
    prefix_size=st.integers(1, 4),
    cuts=st.lists(st.integers(0, 10_000), max_size=16),
)
def test_frames_round_trip_under_any_fragmentation(
    bodies: list[bytes], prefix_size: int, cuts: list[int]
) -> None:
    stream = b"".join(frame(body, prefix_size) for body in bodies)
    decoder = LengthPrefixDecoder(250, prefix_size=prefix_size)
    received: list[bytes] = []
    fed = 0
    for piece in pieces(stream, cuts):
        decoder.feed(piece)
        fed += len(piece)
        while (body := decoder.next_frame()) is not None:
            received.append(body)
        assert decoder.buffered <= fed  # never more than what arrived
    decoder.end_of_stream()
    assert received == bodies
    assert decoder.buffered == 0


@settings(max_examples=100, deadline=None)
@given(
    max_body=st.integers(0, 1000),
    excess=st.integers(1, 1 << 20),
    cuts=st.lists(st.integers(0, 3), max_size=3),
)
def test_a_too_large_prefix_is_refused_before_its_body_arrives(
    max_body: int, excess: int, cuts: list[int]
) -> None:
    decoder = LengthPrefixDecoder(max_body)
    prefix = (max_body + excess).to_bytes(4, "big")
    parts = pieces(prefix, cuts)
    for part in parts[:-1]:  # an incomplete prefix asks for more
        decoder.feed(part)
        assert decoder.next_frame() is None
    decoder.feed(parts[-1])
    with pytest.raises(FrameTooLarge, match=f"{max_body + excess} bytes exceeds {max_body}"):
        decoder.next_frame()
    error = decoder.error
    assert isinstance(error, FrameTooLarge)
    assert decoder.buffered == 0  # the buffer is released
    for call in (lambda: decoder.feed(b"body"), decoder.next_frame, decoder.end_of_stream):
        with pytest.raises(FrameTooLarge) as again:
            call()
        assert again.value is error  # poisoned: the same error every time


@settings(max_examples=100, deadline=None)
@given(bodies=st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=5), data=st.data())
def test_an_end_inside_a_frame_is_truncation_and_between_frames_is_clean(
    bodies: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(frame(body) for body in bodies)
    boundaries = {0}
    for body in bodies:
        boundaries.add(max(boundaries) + 4 + len(body))
    cut = data.draw(st.integers(0, len(stream)))
    decoder = LengthPrefixDecoder(40)
    decoder.feed(stream[:cut])
    while decoder.next_frame() is not None:
        pass
    if cut in boundaries:
        decoder.end_of_stream()
        assert decoder.error is None
    else:
        with pytest.raises(TruncatedFrame, match="stream ended inside a frame"):
            decoder.end_of_stream()
        with pytest.raises(TruncatedFrame):
            decoder.next_frame()


@settings(max_examples=100, deadline=None)
@given(garbage=st.lists(st.binary(max_size=64), max_size=8))
def test_arbitrary_bytes_give_frames_or_a_frame_error_never_a_crash(
    garbage: list[bytes],
) -> None:
    decoder = LengthPrefixDecoder(16, buffer_limit=64)
    try:
        for piece in garbage:
            decoder.feed(piece)
            while decoder.next_frame() is not None:
                pass
            assert decoder.buffered <= 64
        decoder.end_of_stream()
    except FrameError:
        pass


def test_protocol_errors_come_from_its_factories_and_poison() -> None:
    class Big(Exception):
        pass

    class Short(Exception):
        pass

    decoder = LengthPrefixDecoder(
        8,
        prefix_size=2,
        too_large=lambda length, limit: Big(length, limit),
        truncated=lambda pending: Short(pending),
    )
    decoder.feed(b"\x00\x09")
    with pytest.raises(Big) as big:
        decoder.next_frame()
    assert big.value.args == (9, 8)
    short = LengthPrefixDecoder(8, truncated=lambda pending: Short(pending))
    short.feed(b"\x00\x00\x00\x02a")
    assert short.next_frame() is None
    with pytest.raises(Short) as caught:
        short.end_of_stream()
    assert caught.value.args == (5,)


def test_poison_records_a_body_error_of_the_protocol() -> None:
    decoder = LengthPrefixDecoder(8)
    decoder.feed(frame(b"bad") + frame(b"good"))
    assert decoder.next_frame() == b"bad"
    failure = ValueError("a malformed body")
    with pytest.raises(ValueError, match="malformed"):
        decoder.poison(failure)
    assert decoder.error is failure
    assert decoder.buffered == 0
    with pytest.raises(ValueError, match="malformed"):
        decoder.next_frame()  # the good frame behind it is gone with the stream


def test_feed_beyond_the_buffer_limit_takes_nothing_and_keeps_the_decoder() -> None:
    decoder = LengthPrefixDecoder(4, buffer_limit=8)
    decoder.feed(frame(b"ab"))
    with pytest.raises(FrameBufferFull, match="8-byte bound"):
        decoder.feed(b"x" * 3)
    assert decoder.error is None
    assert decoder.buffered == 6
    assert decoder.next_frame() == b"ab"
    decoder.feed(frame(b"abcd"))
    assert decoder.next_frame() == b"abcd"


def test_consumed_frames_are_compacted_and_partial_frames_kept() -> None:
    decoder = LengthPrefixDecoder(8)
    for index in range(1000):  # frame n+1's first half arrives with frame n's end
        body = index.to_bytes(2, "big")
        encoded = frame(body)
        decoder.feed(encoded[:3])
        if index:
            assert decoder.next_frame() == (index - 1).to_bytes(2, "big")
        assert decoder.next_frame() is None
        decoder.feed(encoded[3:])
        assert decoder.buffered == len(encoded)
    assert decoder.next_frame() == (999).to_bytes(2, "big")
    assert decoder.buffered == 0


def test_peek_length_and_max_body() -> None:
    decoder = LengthPrefixDecoder(10)
    assert decoder.max_body == 10
    assert decoder.peek_length() is None
    decoder.feed(b"\x00\x00\x00\x03ab")
    assert decoder.peek_length() == 3
    assert decoder.next_frame() is None
    decoder.feed(b"c")
    assert decoder.next_frame() == b"abc"
    assert decoder.next_frame() is None


@pytest.mark.parametrize(
    ("max_body", "options"),
    [
        (-1, {}),
        (256, {"prefix_size": 1}),
        (10, {"prefix_size": 0}),
        (10, {"prefix_size": 9}),
        (10, {"prefix_size": True}),
        (10, {"buffer_limit": 13}),
        (10, {"prefix_size": 65, "length_of": lambda buffer, offset: 0}),
    ],
)
def test_bad_bounds_are_refused(max_body: int, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        LengthPrefixDecoder(max_body, **options)


# --- a protocol header of its own (``length_of``) and frames parsed in place (``next_parsed``) ---

_HEADER = struct.Struct(">BHI")  # kind, then two part lengths: the body is both parts


class Malformed(Exception):
    pass


def header_length(buffer: bytearray, offset: int) -> int:
    kind, first, second = _HEADER.unpack_from(buffer, offset)
    if kind != 7:
        raise Malformed(f"kind {kind}")
    return int(first + second)


def two_part(first: bytes, second: bytes) -> bytes:
    return _HEADER.pack(7, len(first), len(second)) + first + second


def split(frame_view: memoryview) -> tuple[bytes, bytes]:
    _kind, first, _second = _HEADER.unpack_from(frame_view)
    body = frame_view[_HEADER.size :]
    return bytes(body[:first]), bytes(body[first:])


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.tuples(st.binary(max_size=90), st.binary(max_size=90)), max_size=10),
    cuts=st.lists(st.integers(0, 10_000), max_size=16),
)
def test_a_protocol_header_round_trips_under_any_fragmentation(
    parts: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(two_part(a, b) for a, b in parts)
    calls = 0

    def counted(buffer: bytearray, offset: int) -> int:
        nonlocal calls
        calls += 1
        return header_length(buffer, offset)

    decoder = LengthPrefixDecoder(180, prefix_size=_HEADER.size, length_of=counted)
    received: list[tuple[bytes, bytes]] = []
    for piece in pieces(stream, cuts):
        decoder.feed(piece)
        while (message := decoder.next_parsed(split)) is not None:
            received.append(message)
    decoder.end_of_stream()
    assert received == parts
    assert calls == len(parts)  # each header is parsed once, however many pieces it took
    assert decoder.buffered == 0


def test_a_protocol_header_over_the_bound_is_refused_before_its_body() -> None:
    decoder = LengthPrefixDecoder(100, prefix_size=_HEADER.size, length_of=header_length)
    decoder.feed(_HEADER.pack(7, 60, 41)[:4])
    assert decoder.peek_length() is None
    decoder.feed(_HEADER.pack(7, 60, 41)[4:] + b"x" * 50)
    with pytest.raises(FrameTooLarge, match="101 bytes exceeds 100"):
        decoder.next_parsed(split)
    assert decoder.buffered == 0
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"more")


def test_a_malformed_header_or_body_poisons_with_the_protocols_error() -> None:
    decoder = LengthPrefixDecoder(100, prefix_size=_HEADER.size, length_of=header_length)
    decoder.feed(_HEADER.pack(3, 0, 0))
    with pytest.raises(Malformed, match="kind 3") as caught:
        decoder.next_parsed(split)
    with pytest.raises(Malformed) as again:
        decoder.next_frame()
    assert again.value is caught.value

    def refuse(frame_view: memoryview) -> None:
        raise Malformed(f"body of {frame_view.nbytes} bytes")

    parsed = LengthPrefixDecoder(100, prefix_size=_HEADER.size, length_of=header_length)
    parsed.feed(two_part(b"ab", b"c") + two_part(b"", b""))
    with pytest.raises(Malformed, match="body of 10 bytes"):
        parsed.next_parsed(refuse)
    assert parsed.buffered == 0
    with pytest.raises(Malformed, match="body of 10 bytes"):
        parsed.next_parsed(split)


def test_the_frame_view_is_released_after_parse() -> None:
    """``next_parsed`` lends a view of its buffer: once ``parse`` returned the buffer can grow
    and be compacted again (a view still held would make ``feed`` fail)."""
    decoder = LengthPrefixDecoder(100, prefix_size=_HEADER.size, length_of=header_length)
    for index in range(50):
        decoder.feed(two_part(bytes([index]) * 3, b"z") + two_part(b"", b"")[:3])
        assert decoder.next_parsed(lambda view: view.nbytes) == _HEADER.size + 4
        decoder.feed(two_part(b"", b"")[3:])
        assert decoder.next_parsed(split) == (b"", b"")
    assert decoder.buffered == 0

    def keep(view: memoryview) -> memoryview:
        return view[:1]  # a parser that wrongly keeps a piece of the view

    decoder.feed(two_part(b"a", b"") + b"\x07")
    kept = decoder.next_parsed(keep)
    assert kept is not None
    with pytest.raises(BufferError):
        decoder.feed(b"x" * 100)
    kept.release()
    decoder.feed(b"\x00\x00\x00\x00\x00\x00")
    assert decoder.next_parsed(split) == (b"", b"")
