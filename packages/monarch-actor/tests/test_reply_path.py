"""The client's reply path and the call path's fast cases (issue 23): a one-reply port leaves
the port table in the lookup that routes its reply, before the caller can see the result;
header-only frames and the out-of-band scan keep their checks."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from monarch.actor._base import codec as _codec
from monarch.actor._base.envelope import (
    FRAME_PREFIX,
    ActorAddr,
    Envelope,
    FrameDecoder,
    FrameLimits,
    MessageKind,
    encode_frame,
)
from monarch.actor._base.errors import FrameError, MessageTooLargeError
from monarch.actor._base.future import _Cell
from monarch.actor._runtime.client import client
from monarch.actor._runtime.sinks import GatherSink, OneSink, Reply
from monarch.actor._transport import node as _node
from monarch.actor._transport.lane import ZERO_SHM_HEAD
from monarch.actor._transport.lane_proto import LaneDecoder

PID = bytes(range(16))


def reply(value: int, rank: int = 0) -> Reply:
    data = _codec.encode(value)
    return Reply(True, data.data, [], b"", rank)


def test_one_reply_port_is_closed_before_its_future_completes() -> None:
    runtime: Any = client().runtime
    assert runtime.root is not None
    cell: _Cell[Reply] = _Cell()
    seen: list[bool] = []
    port = runtime.open_port(runtime.root, OneSink(cell))
    # Runs in the completing thread, as the caller's wake-up does: the port is gone already.
    cell.add_done_callback(lambda: seen.append(port.index in runtime._ports))
    assert port.index in runtime._ports
    runtime._deliver_port(port.index, reply(41))
    assert seen == [False]
    ok, got = cell.outcome()
    assert ok
    assert _codec.decode(got.payload) == 41
    # A second reply to that port is dropped: the first completion stands.
    runtime._deliver_port(port.index, reply(42))
    assert _codec.decode(cell.outcome()[1].payload) == 41


def test_gather_port_still_closes_through_its_closer() -> None:
    runtime: Any = client().runtime
    cell: _Cell[list[Reply]] = _Cell()
    seen: list[bool] = []
    port = runtime.open_port(runtime.root, GatherSink(2, cell))
    cell.add_done_callback(lambda: seen.append(port.index in runtime._ports))
    runtime._deliver_port(port.index, reply(1, rank=1))
    assert port.index in runtime._ports
    assert not cell.done()
    runtime._deliver_port(port.index, reply(0, rank=0))
    assert seen == [False]
    assert [_codec.decode(r.payload) for r in cell.outcome()[1]] == [0, 1]


def test_abandoned_one_reply_port_fails_its_future() -> None:
    runtime: Any = client().runtime
    cell: _Cell[Reply] = _Cell()
    port = runtime.open_port(runtime.root, OneSink(cell))
    runtime._ports[port.index].abandon(RuntimeError("gone"))
    runtime.close_port(port.index)
    ok, exc = cell.outcome()
    assert not ok
    assert isinstance(exc, RuntimeError)
    assert port.index not in runtime._ports


def envelope(payload: bytes, sizes: tuple[int, ...] = (), kinds: bytes = b"") -> Envelope:
    return Envelope(
        MessageKind.PORT_VALUE,
        ActorAddr(PID, "a"),
        ActorAddr(PID, "b"),
        3,
        "",
        1,
        None,
        None,
        payload,
        sizes,
        kinds,
    )


def test_header_only_frame_round_trips_and_is_bounded_exactly() -> None:
    env = envelope(b"r" * 50)
    pieces = encode_frame(env)
    size = sum(len(p) for p in pieces)
    decoder = FrameDecoder()
    decoder.receive_data(b"".join(bytes(p) for p in pieces))
    assert decoder.next_message() == (env, [])
    assert size > FRAME_PREFIX.size
    encode_frame(env, [], FrameLimits(max_frame_bytes=size))  # exactly at the bound: fits
    with pytest.raises(MessageTooLargeError, match="exceeds"):
        encode_frame(env, [], FrameLimits(max_frame_bytes=size - 1))


def test_frame_announcing_buffers_it_was_not_given_is_refused() -> None:
    with pytest.raises(ValueError, match="announces"):
        encode_frame(envelope(b"", (3,), b"\x00"))
    with pytest.raises(ValueError, match="announces"):
        encode_frame(envelope(b"", (), b"\x00"))


def test_scan_skips_empty_containers_but_not_what_follows_them() -> None:
    big = b"x" * _codec.OOB_THRESHOLD
    assert not _codec._needs_persistent(((1, "a", None), {}), 3)
    assert _codec._needs_persistent(((), {}, [big]), 3)
    assert _codec._needs_persistent(({}, (), (memoryview(b"v"),)), 3)
    assert _codec._needs_persistent(((), {"k": big}), 3)
    # Only the first 64 items of a sequence are scanned, long or short.
    assert not _codec._needs_persistent([0] * 64 + [big], 3)
    assert _codec._needs_persistent([0] * 63 + [big], 3)
    payload = _codec.encode(((), {}, [big]))
    assert payload.buffers
    assert _codec.decode(payload.data, payload.buffers, payload.kinds) == (
        (),
        {},
        [big],
    )


def test_small_call_payload_is_a_full_payload() -> None:
    payload = _codec.encode(((7, "s"), {}))
    assert type(payload) is _codec.Payload
    assert payload.buffers == ()
    assert payload.kinds == b""
    assert payload.nbytes == len(payload.data)
    assert _codec.decode(payload.data, payload.buffers, payload.kinds) == ((7, "s"), {})
    with pytest.raises(AttributeError):
        payload.data = b""  # type: ignore[misc]
    # A native out-of-band buffer on the same path still travels out of band.
    big = bytearray(_codec.OOB_THRESHOLD)
    native = _codec.encode(((pickle.PickleBuffer(big),), {}))
    assert len(native.buffers) == 1
    assert len(native.kinds) == 1


def lane_messages(data: bytes) -> list[tuple[Envelope, list[Any], list[Any]]]:
    decoder = LaneDecoder(FrameLimits())
    out: list[tuple[Envelope, list[Any], list[Any]]] = []
    while data:
        view = decoder.get_buffer()
        n = min(len(view), len(data))
        view[:n] = data[:n]
        view.release()
        data = data[n:]
        decoder.buffer_updated(n)
        while (message := decoder.next_message()) is not None:
            out.append(message)
    return out


def test_small_header_only_frame_goes_on_a_lane_as_one_piece() -> None:
    small, large = envelope(b"s" * 100), envelope(b"L" * (_node._JOIN_MAX + 1))
    buffered = envelope(b"b", (3,), b"\x00")
    one = _node._lane_pieces(encode_frame(small))
    assert len(one) == 1
    assert len(_node._lane_pieces(encode_frame(large))) == 3  # not copied: head, prefix, header
    assert len(_node._lane_pieces(encode_frame(buffered, [memoryview(b"abc")]))) == 4
    stream = b"".join(
        bytes(p)
        for pieces in (
            one,
            _node._lane_pieces(encode_frame(large)),
            _node._lane_pieces(encode_frame(buffered, [memoryview(b"abc")])),
        )
        for p in pieces
    )
    got = lane_messages(stream)
    assert [m[0] for m in got] == [small, large, buffered]
    assert got[2][1] == [bytearray(b"abc")]


def test_lane_fast_path_keeps_the_frame_checks() -> None:
    small = envelope(b"s" * 100)
    frame = b"".join(bytes(p) for p in _node._lane_pieces(encode_frame(small)))
    # Over the decoder's frame bound: refused, not decoded.
    decoder = LaneDecoder(FrameLimits(max_frame_bytes=len(frame) - 4))
    view = decoder.get_buffer()
    view[: len(frame)] = frame
    view.release()
    decoder.buffer_updated(len(frame))
    with pytest.raises(FrameError, match="exceeds"):
        decoder.next_message()
    # An empty header: refused.
    with pytest.raises(FrameError, match="empty header"):
        lane_messages(ZERO_SHM_HEAD + FRAME_PREFIX.pack(0, 0) + b"x" * 8)
    # Zero-length buffers (no body, but a buffer table): decoded by the full path.
    empty_buffer = envelope(b"z", (0,), b"\x00")
    pieces = _node._lane_pieces(encode_frame(empty_buffer, [memoryview(b"")]))
    got = lane_messages(b"".join(bytes(p) for p in pieces))
    assert [m[0] for m in got] == [empty_buffer]
    assert got[0][1] == [bytearray()]
