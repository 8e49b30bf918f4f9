"""The msgspec envelope and its stream framing: round trips, chunking, bounds, garbage."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monarch.actor._base.codec import KIND_READONLY
from monarch.actor._base.envelope import (
    FRAME_PREFIX,
    ActorAddr,
    CastInfo,
    Envelope,
    FrameDecoder,
    FrameLimits,
    MessageKind,
    PortAddr,
    encode_frame,
)
from monarch.actor._base.errors import FrameError, MessageTooLargeError

PID_A = bytes(range(16))
PID_B = bytes(range(16, 32))


def envelope(
    payload: bytes = b"p", buffers: tuple[bytes, ...] = (), kinds: bytes = b""
) -> Envelope:
    return Envelope(
        MessageKind.CALL,
        ActorAddr(PID_A, "root"),
        ActorAddr(PID_B, "trainer-1"),
        -1,
        "step",
        7,
        PortAddr(PID_A, "root", 3),
        CastInfo(("gpus",), (2,), 1),
        payload,
        tuple(len(b) for b in buffers),
        kinds or bytes(len(buffers)),
    )


def joined(pieces: list[bytes | memoryview | bytearray]) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def test_frame_round_trip_with_buffers() -> None:
    buffers = (b"abc", b"", b"defg")
    env = envelope(b"stream", buffers, bytes([KIND_READONLY, 0, 0]))
    decoder = FrameDecoder()
    decoder.receive_data(joined(encode_frame(env, [memoryview(b) for b in buffers])))
    message = decoder.next_message()
    assert message is not None
    got, got_buffers = message
    assert got == env
    assert got_buffers == [b"abc", bytearray(b""), bytearray(b"defg")]
    assert type(got_buffers[0]) is bytes
    assert type(got_buffers[2]) is bytearray
    assert decoder.next_message() is None
    assert decoder.buffered == 0


def test_encode_frame_does_not_copy_buffers() -> None:
    big = bytearray(1 << 16)
    pieces = encode_frame(envelope(b"", (bytes(big),)), [memoryview(big)])
    assert pieces[-1].obj is big  # type: ignore[union-attr]


def test_encode_frame_checks_announced_sizes() -> None:
    with pytest.raises(ValueError, match="announces"):
        encode_frame(envelope(b"", (b"abc",)), [memoryview(b"ab")])


def test_encode_frame_enforces_the_frame_limit() -> None:
    limits = FrameLimits(max_frame_bytes=200)
    with pytest.raises(MessageTooLargeError, match="exceeds"):
        encode_frame(envelope(b"x" * 300), [], limits)


@settings(max_examples=100, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=5),
    buffers=st.lists(st.binary(max_size=200), max_size=3),
    cuts=st.lists(st.integers(1, 97), max_size=40),
)
def test_any_chunking_of_a_stream_yields_the_same_messages(
    payloads: list[bytes], buffers: list[bytes], cuts: list[int]
) -> None:
    envs = [envelope(p, tuple(buffers)) for p in payloads]
    stream = b"".join(joined(encode_frame(e, [memoryview(b) for b in buffers])) for e in envs)
    decoder = FrameDecoder()
    out = []
    position = 0
    for cut in [*cuts, len(stream)]:
        decoder.receive_data(stream[position : position + cut])
        position += cut
        while (message := decoder.next_message()) is not None:
            out.append(message)
        if position >= len(stream):
            break
    assert [m[0] for m in out] == envs
    assert all([bytes(b) for b in m[1]] == buffers for m in out)


def test_oversize_frame_is_refused_from_its_prefix_alone() -> None:
    decoder = FrameDecoder(FrameLimits(max_frame_bytes=1024))
    with pytest.raises(FrameError, match="exceeds"):
        decoder.receive_data(FRAME_PREFIX.pack(10, 1 << 40))
    with pytest.raises(FrameError):
        decoder.receive_data(b"more")  # the decoder stays failed
    with pytest.raises(FrameError):
        decoder.next_message()


def test_empty_header_is_refused() -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError, match="empty header"):
        decoder.receive_data(FRAME_PREFIX.pack(0, 0))


def test_garbage_header_is_a_frame_error() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(FRAME_PREFIX.pack(4, 0) + b"\xc1\xc1\xc1\xc1")
    with pytest.raises(FrameError, match="malformed"):
        decoder.next_message()


def test_wrong_pid_length_is_a_frame_error() -> None:
    header = msgspec.msgpack.encode(
        [1, [b"short", "a"], [PID_B, "b"], -1, "", 0, None, None, b"", [], b"", 0]
    )
    decoder = FrameDecoder()
    decoder.receive_data(FRAME_PREFIX.pack(len(header), 0) + header)
    with pytest.raises(FrameError, match="malformed"):
        decoder.next_message()


def test_buffer_sizes_must_match_the_body() -> None:
    header = msgspec.msgpack.encode(envelope(b"", (b"abc",)))
    decoder = FrameDecoder()
    decoder.receive_data(FRAME_PREFIX.pack(len(header), 5) + header + b"abcde")
    with pytest.raises(FrameError, match="add up"):
        decoder.next_message()


def test_too_many_buffers_is_a_frame_error() -> None:
    env = envelope(b"", tuple(b"" for _ in range(5)))
    header = msgspec.msgpack.encode(env)
    decoder = FrameDecoder(FrameLimits(max_buffers=4))
    decoder.receive_data(FRAME_PREFIX.pack(len(header), 0) + header)
    with pytest.raises(FrameError, match="buffers"):
        decoder.next_message()


@settings(max_examples=150, deadline=None)
@given(garbage=st.binary(max_size=400))
def test_random_bytes_never_crash_the_decoder(garbage: bytes) -> None:
    decoder = FrameDecoder(FrameLimits(max_frame_bytes=4096))
    try:
        decoder.receive_data(garbage)
        while decoder.next_message() is not None:
            pass
    except FrameError:
        return
    assert decoder.buffered <= 4096
