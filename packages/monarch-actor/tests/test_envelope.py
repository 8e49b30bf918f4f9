"""The msgspec envelope and its stream framing: round trips, chunking, bounds, garbage."""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Sequence

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


def joined(pieces: Sequence[bytes | memoryview | bytearray | mmap.mmap]) -> bytes:
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


def test_an_oversize_prefix_is_refused_before_its_body_is_buffered() -> None:
    """The bound applies to the 12-byte prefix alone: bytes of the body that came with it are
    not kept, and nothing fed later is either."""
    decoder = FrameDecoder(FrameLimits(max_frame_bytes=4096))
    decoder.receive_data(FRAME_PREFIX.pack(100, 5000)[:7])  # part of the prefix: wait
    assert decoder.next_message() is None
    with pytest.raises(FrameError, match="frame of 5112 bytes exceeds the limit of 4096"):
        decoder.receive_data(FRAME_PREFIX.pack(100, 5000)[7:] + b"h" * 1000)
    assert decoder.buffered == 0
    with pytest.raises(FrameError, match="exceeds"):
        decoder.receive_data(b"b" * 1000)
    assert decoder.buffered == 0


def test_a_body_error_poisons_the_decoder() -> None:
    """After a malformed frame every call raises the same error, even for good bytes, and the
    buffered bytes (the good frame behind the bad one too) are released."""
    good = joined(encode_frame(envelope(b"ok")))
    decoder = FrameDecoder()
    decoder.receive_data(FRAME_PREFIX.pack(4, 0) + b"\xc1\xc1\xc1\xc1" + good)
    with pytest.raises(FrameError, match="malformed") as first:
        decoder.next_message()
    assert decoder.buffered == 0
    for call in (lambda: decoder.receive_data(good), decoder.next_message):
        with pytest.raises(FrameError) as again:
            call()
        assert again.value is first.value


_buffer_sets = st.lists(
    st.tuples(st.sampled_from([0, 1, 13, 4096, 70_000]), st.booleans()), max_size=3
)


@settings(max_examples=40, deadline=None)
@given(
    frames=st.lists(st.tuples(st.binary(max_size=64), _buffer_sets), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 300_000), max_size=12),
)
def test_messages_survive_every_split_point(
    frames: list[tuple[bytes, list[tuple[int, bool]]]], cuts: list[int]
) -> None:
    """Frames with buffers of every size (beyond one read too), split anywhere: the same
    envelopes and buffers come out, each buffer as the kind the sender announced."""
    sent = []
    for index, (payload, spec) in enumerate(frames):
        buffers = tuple(bytes([index, i]) * (size // 2) + bytes(size % 2) for i, (size, _) in
                        enumerate(spec))  # fmt: skip
        kinds = bytes(KIND_READONLY if readonly else 0 for _, readonly in spec)
        sent.append((envelope(payload, buffers, kinds), buffers))
    stream = b"".join(joined(encode_frame(e, [memoryview(b) for b in bufs])) for e, bufs in sent)
    points = sorted({cut % (len(stream) + 1) for cut in cuts} | {0, len(stream)})
    decoder = FrameDecoder()
    out = []
    for start, stop in itertools.pairwise(points):
        decoder.receive_data(memoryview(stream)[start:stop])
        while (message := decoder.next_message()) is not None:
            out.append(message)
    assert decoder.buffered == 0
    assert [m[0] for m in out] == [e for e, _ in sent]
    for (env, received), (_, expected) in zip(out, sent, strict=True):
        assert [bytes(b) for b in received] == list(expected)
        for buffer, kind in zip(received, env.buffer_kinds, strict=True):
            assert type(buffer) is (bytes if kind & KIND_READONLY else bytearray)
