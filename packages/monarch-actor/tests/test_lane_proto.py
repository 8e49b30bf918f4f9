"""The sans-IO half of direct lanes: control frames on the envelope stream, lane frames, proofs."""

from __future__ import annotations

import itertools
import os
from typing import Annotated, Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.quic.testing import issue_identity
from monarch.actor._base.envelope import (
    FRAME_PREFIX,
    ActorAddr,
    Envelope,
    FrameDecoder,
    FrameLimits,
    MessageKind,
    encode_frame,
)
from monarch.actor._base.errors import FrameError
from monarch.actor._transport.lane_proto import (
    CONTEXT_ACCEPTOR,
    CONTEXT_DIALER,
    FEATURE_LEND,
    Auth,
    ControlSplitter,
    Hello,
    LaneDecoder,
    Offer,
    Refuse,
    Switch,
    decode_control,
    encode_control,
    lane_prefix,
    lent_prefix,
    proof_bytes,
    sign,
    verify_signature,
)

A, B = b"\x01" * 16, b"\x02" * 16


def make_envelope(seq: int, sizes: tuple[int, ...] = (), payload: bytes = b"p") -> Envelope:
    return Envelope(
        MessageKind.CALL, ActorAddr(A, "root"), ActorAddr(B, "a"), -1, "ep", seq, None, None,
        payload, sizes, bytes(i % 2 for i in range(len(sizes))),
    )  # fmt: skip


def buffers_for(sizes: tuple[int, ...], seed: int) -> list[bytes]:
    return [(bytes([(seed + i) % 251, i]) * (size // 2 + 1))[:size] for i, size in enumerate(sizes)]


def lane_frame(envelope: Envelope, buffers: list[bytes]) -> bytes:
    return lane_prefix(()) + b"".join(bytes(p) for p in encode_frame(envelope, buffers))


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def feed_lane(decoder: LaneDecoder, data: bytes) -> list[tuple[Envelope, list[Any], list[Any]]]:
    out = []
    pos = 0
    while pos < len(data):
        view = decoder.get_buffer()
        n = min(view.nbytes, len(data) - pos)
        view[:n] = data[pos : pos + n]
        view.release()
        decoder.buffer_updated(n)
        pos += n
        while (message := decoder.next_message()) is not None:
            out.append(message)
    return out


_sizes = st.lists(st.sampled_from([0, 1, 7, 4096, 70_000, 300_000]), max_size=3).map(tuple)


@settings(max_examples=25, deadline=None)
@given(
    frames=st.lists(
        st.tuples(_sizes, st.binary(min_size=1, max_size=2000)), min_size=1, max_size=5
    ),
    cuts=st.lists(st.integers(0, 2_000_000), max_size=12),
)
def test_lane_frames_round_trip_in_any_chunking(
    frames: list[tuple[tuple[int, ...], bytes]], cuts: list[int]
) -> None:
    sent = [(make_envelope(i, sizes, payload), buffers_for(sizes, i)) for i, (sizes, payload) in
            enumerate(frames)]  # fmt: skip
    data = b"".join(lane_frame(env, bufs) for env, bufs in sent)
    decoder = LaneDecoder(FrameLimits())
    got = []
    for piece in chunks(data, cuts):
        got.extend(feed_lane(decoder, piece))
    assert [env for env, _b, _s in got] == [env for env, _ in sent]
    for (_env, buffers, shm), (env, expected) in zip(got, sent, strict=True):
        assert shm == []
        assert [bytes(b) for b in buffers] == expected
        for buffer, kind in zip(buffers, env.buffer_kinds, strict=True):
            if not kind & 1:  # writable at the sender: writable here (read-only ones may be too)
                assert isinstance(buffer, bytearray)


def test_a_long_header_is_received_beyond_the_chunk() -> None:
    env = make_envelope(0, (), b"h" * 600_000)
    decoder = LaneDecoder(FrameLimits(), chunk=64 * 1024)
    got = feed_lane(decoder, lane_frame(env, []))
    assert got[0][0] == env


def test_shared_memory_buffers_claim_descriptors_in_order() -> None:
    env = make_envelope(0, (5, 3))
    body = b"abc"  # buffer 1 inline, buffer 0 as a descriptor (slot 9)
    header = msgspec.msgpack.encode(env)
    data = lane_prefix([(0, 9)]) + FRAME_PREFIX.pack(len(header), len(body)) + header + body
    decoder = LaneDecoder(FrameLimits())
    r, w = os.pipe()
    decoder.add_fds([r])
    (message,) = feed_lane(decoder, data)
    _env, buffers, shm = message
    assert buffers[0] is None
    assert bytes(buffers[1]) == b"abc"
    assert shm == [(0, r, 5, 9)]
    os.close(r)
    os.close(w)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"Z\x00\x00" + b"\x00" * 12, "unknown lane frame type"),
        (lane_prefix(()) + FRAME_PREFIX.pack(0, 0), "empty header"),
        (lane_prefix(()) + FRAME_PREFIX.pack(10, 1 << 40), "exceeds the limit"),
        (lane_prefix(()) + FRAME_PREFIX.pack(3, 0) + b"\xc1\xc1\xc1", "malformed envelope"),
    ],
)
def test_hostile_lane_bytes_are_a_frame_error_and_the_decoder_stays_failed(
    data: bytes, error: str
) -> None:
    decoder = LaneDecoder(FrameLimits())
    with pytest.raises(FrameError, match=error):
        feed_lane(decoder, data)
    with pytest.raises(FrameError):
        decoder.next_message()


def test_an_oversize_lane_prefix_is_refused_before_its_body_is_received() -> None:
    """The head alone (lane type, no descriptors, 12-byte envelope prefix) is enough to refuse a
    frame over the limit: no byte of its body was fed, nothing is reserved for it, and the
    decoder stays failed."""
    decoder = LaneDecoder(FrameLimits(max_frame_bytes=4096))
    head = lane_prefix(()) + FRAME_PREFIX.pack(100, 1 << 30)
    assert feed_lane(decoder, head[:5]) == []  # part of the head: wait
    with pytest.raises(FrameError, match="exceeds the limit of 4096"):
        feed_lane(decoder, head[5:])
    with pytest.raises(FrameError, match="exceeds"):
        decoder.get_buffer()
    with pytest.raises(FrameError, match="exceeds"):
        decoder.next_message()


def test_a_frame_naming_a_missing_descriptor_is_refused() -> None:
    env = make_envelope(0, (5,))
    header = msgspec.msgpack.encode(env)
    data = lane_prefix([(0, 1)]) + FRAME_PREFIX.pack(len(header), 0) + header
    with pytest.raises(FrameError, match="descriptors did not come"):
        feed_lane(LaneDecoder(FrameLimits()), data)
    data = lane_prefix([(3, 1)]) + FRAME_PREFIX.pack(len(header), 5) + header + b"xxxxx"
    with pytest.raises(FrameError, match="does not carry"):
        feed_lane(LaneDecoder(FrameLimits()), data)
    data = lane_prefix([(0, 1), (0, 2)]) + FRAME_PREFIX.pack(len(header), 0) + header
    with pytest.raises(FrameError, match="twice"):
        feed_lane(LaneDecoder(FrameLimits()), data)


def test_lent_buffers_are_accepted_only_when_asked_for_and_claim_no_descriptor() -> None:
    """A frame of lent buffers names each one's address (no descriptor): refused by a decoder
    that did not ``accept_lent``; the slot number must say lent in such a frame, and only
    there."""
    env = make_envelope(0, (5, 3))
    body = b"abc"  # buffer 1 inline, buffer 0 lent
    header = msgspec.msgpack.encode(env)
    tail = FRAME_PREFIX.pack(len(header), len(body)) + header + body
    data = lent_prefix([(0, 0x4000_0009, 0x1234_5678_9ABC)]) + tail
    with pytest.raises(FrameError, match="unknown lane frame type 76"):
        feed_lane(LaneDecoder(FrameLimits()), data)
    decoder = LaneDecoder(FrameLimits())
    decoder.accept_lent()
    r, w = os.pipe()
    decoder.add_fds([r])  # a descriptor passed meanwhile stays for the next descriptor frame
    (message,) = feed_lane(decoder, data)
    _env, buffers, shm = message
    assert buffers[0] is None
    assert bytes(buffers[1]) == b"abc"
    assert shm == [(0, 0x1234_5678_9ABC, 5, 0x4000_0009)]
    assert decoder.pending_fds == 1
    decoder.close()
    os.close(w)
    for bad, error in [
        (lent_prefix([(0, 9, 0x1000)]), "lent buffer with slot 0x9"),
        (lent_prefix([(0, 0x4000_0009, 0)]), "lent buffer with slot"),
        (lane_prefix([(0, 0x4000_0009)]), "says lent"),
    ]:
        decoder = LaneDecoder(FrameLimits())
        decoder.accept_lent()
        with pytest.raises(FrameError, match=error):
            feed_lane(decoder, bad + tail)


def test_too_many_pending_descriptors_fail_the_lane() -> None:
    decoder = LaneDecoder(FrameLimits(), max_fds=2)
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(3)]
    with pytest.raises(FrameError, match="descriptors in flight"):
        decoder.add_fds(fds)
    decoder.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(0, 10_000), max_size=10))
def test_control_frames_are_split_from_envelopes_in_stream_order(cuts: list[int]) -> None:
    hello = Hello(1, b"host", b"n" * 32, ("unix",))
    envs = [make_envelope(i, (4096,) if i % 2 else ()) for i in range(4)]
    parts = [encode_control(hello)]
    for i, env in enumerate(envs):
        parts.append(
            b"".join(bytes(p) for p in encode_frame(env, buffers_for(env.buffer_sizes, i)))
        )
    parts.append(encode_control(Switch(b"t" * 16)))
    data = b"".join(parts)
    splitter = ControlSplitter(FrameDecoder())
    got = []
    for piece in chunks(data, cuts):
        got.extend(splitter.feed(piece))
    assert got[0] == hello
    assert got[-1] == Switch(b"t" * 16)
    assert [m[0] for m in got[1:-1]] == envs


def test_control_only_splitter_refuses_envelopes_and_oversize_controls() -> None:
    env = make_envelope(0)
    with pytest.raises(FrameError, match="only control frames"):
        ControlSplitter().feed(b"".join(bytes(p) for p in encode_frame(env)))
    with pytest.raises(FrameError, match="control frame of"):
        ControlSplitter().feed(FRAME_PREFIX.pack(0, 10 << 20))
    with pytest.raises(FrameError, match="malformed lane control"):
        ControlSplitter().feed(FRAME_PREFIX.pack(0, 3) + b"\x93\x01\x02")
    offer = Offer("unix", "@x", 0, b"n" * 32, b"t" * 16)
    assert ControlSplitter().feed(encode_control(offer)) == [offer]


def test_proofs_bind_context_nonces_pids_and_token() -> None:
    identity = issue_identity()
    data = proof_bytes(CONTEXT_DIALER, b"a" * 32, b"b" * 32, A, B, b"t" * 16)
    signature = sign(identity.private_key, data)
    verify_signature(identity.leaf.public_key(), signature, data)
    for other in (
        proof_bytes(CONTEXT_ACCEPTOR, b"a" * 32, b"b" * 32, A, B, b"t" * 16),  # reflected
        proof_bytes(CONTEXT_DIALER, b"a" * 32, b"c" * 32, A, B, b"t" * 16),
        proof_bytes(CONTEXT_DIALER, b"a" * 32, b"b" * 32, B, A, b"t" * 16),
    ):
        with pytest.raises(FrameError, match="does not verify"):
            verify_signature(identity.leaf.public_key(), signature, other)
    with pytest.raises(FrameError, match="does not verify"):
        verify_signature(issue_identity().leaf.public_key(), signature, data)


class _HelloV1(msgspec.Struct, tag="hello", array_like=True, frozen=True):
    """``Hello`` exactly as the first version-1 release (before ``features``) defines it."""

    version: int
    host: Annotated[bytes, msgspec.Meta(max_length=128)]
    nonce: Annotated[bytes, msgspec.Meta(min_length=16, max_length=64)]
    kinds: Annotated[
        tuple[Annotated[str, msgspec.Meta(max_length=256)], ...], msgspec.Meta(max_length=4)
    ]


#: The control decoder of that release (its other messages are unchanged).
_V1_DECODER = msgspec.msgpack.Decoder(_HelloV1 | Offer | Switch | Auth | Refuse)
#: What that release writes for ``Hello(1, b"h" * 32, b"n" * 32, ("unix", "tcp"))``.
_V1_HELLO_BODY = bytes.fromhex(
    "95a568656c6c6f01c420" + "68" * 32 + "c420" + "6e" * 32 + "92a4756e6978a3746370"
)


def test_a_hello_of_the_first_version_1_release_is_accepted_without_features() -> None:
    """A ``Hello`` without the trailing ``features`` (a sender that does not know lending is
    negotiated) decodes, on the stream too, with no features: no request to lend."""
    assert msgspec.msgpack.encode(_HelloV1(1, b"h" * 32, b"n" * 32, ("unix", "tcp"))) == (
        _V1_HELLO_BODY
    )
    hello = decode_control(_V1_HELLO_BODY)
    assert hello == Hello(1, b"h" * 32, b"n" * 32, ("unix", "tcp"))
    assert isinstance(hello, Hello)
    assert hello.features == ()
    assert FEATURE_LEND not in hello.features
    framed = FRAME_PREFIX.pack(0, len(_V1_HELLO_BODY)) + _V1_HELLO_BODY
    assert ControlSplitter().feed(framed) == [hello]


def test_a_hello_with_features_is_accepted_by_a_first_version_1_release() -> None:
    """``features`` is a trailing field that release's decoder skips: it still reads the
    ``Hello`` (and answers it as before); this release reads the features, unknown ones too."""
    hello = Hello(1, b"h" * 32, b"n" * 32, ("unix",), (FEATURE_LEND, "a-later-feature"))
    body = encode_control(hello)[FRAME_PREFIX.size :]
    assert _V1_DECODER.decode(body) == _HelloV1(1, b"h" * 32, b"n" * 32, ("unix",))
    assert decode_control(body) == hello
    assert FEATURE_LEND in hello.features
    # Without features (lending off here) an empty trailing list, skipped the same way.
    bare = encode_control(Hello(1, b"h" * 32, b"n" * 32, ("unix", "tcp")))[FRAME_PREFIX.size :]
    assert _V1_DECODER.decode(bare) == _V1_DECODER.decode(_V1_HELLO_BODY)


def test_hello_features_are_bounded() -> None:
    many = tuple(f"f{i}" for i in range(33))
    body = msgspec.msgpack.encode(("hello", 1, b"h" * 32, b"n" * 32, ("unix",), many))
    with pytest.raises(FrameError, match="malformed lane control"):
        decode_control(body)
    body = msgspec.msgpack.encode(("hello", 1, b"h" * 32, b"n" * 32, ("unix",), 7))
    with pytest.raises(FrameError, match="malformed lane control"):
        decode_control(body)
