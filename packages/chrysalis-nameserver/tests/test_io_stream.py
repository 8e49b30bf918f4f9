"""``NsFrameStream`` moves nameserver messages over a fragmenting byte stream with the codec's
bounds: a clean end is ``None``, an end inside a frame is ``TruncatedFrame``."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chrysalis.nameserver
import chrysalis.quic
from chrysalis.core import Pid
from chrysalis.nameserver import (
    MAX_FRAME_BODY,
    ByteStream,
    Consistency,
    FrameTooLarge,
    Hello,
    NsCodec,
    NsFrameStream,
    NsMessage,
    Resolve,
    TruncatedFrame,
    VersionRange,
    as_byte_stream,
    memory_stream_pair,
)
from chrysalis.quic import IncompleteReadError


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(main(), 5))


def test_messages_round_trip_over_fragmentable_byte_stream() -> None:
    async def main() -> None:
        a, b = memory_stream_pair(fragment=8)
        sender, receiver = NsFrameStream(a), NsFrameStream(b)
        messages: list[NsMessage] = [
            Hello(VersionRange(1, 3), Pid(b"\x02" * 16)),
            Resolve(7, Pid(b"\x03" * 16), Consistency.REFRESH),
        ]
        for message in messages:
            await sender.send(message)
        sender.finish()
        assert [await receiver.receive(), await receiver.receive()] == messages
        assert await receiver.receive() is None

    run(main)


def test_clean_end_of_stream_is_not_a_truncated_frame() -> None:
    async def main() -> None:
        a, b = memory_stream_pair()
        a.write_eof()
        assert await NsFrameStream(b).receive() is None

    run(main)


@pytest.mark.parametrize("cut", [2, 6])
def test_partial_prefix_or_body_is_rejected(cut: int) -> None:
    async def main() -> None:
        a, b = memory_stream_pair()
        frame = NsCodec.encode(Resolve(1, Pid(b"\x05" * 16), Consistency.CACHED))
        a.write(frame[:cut])
        a.write_eof()
        with pytest.raises(TruncatedFrame):
            await NsFrameStream(b).receive()

    run(main)


def test_oversized_body_is_rejected_from_prefix() -> None:
    async def main() -> None:
        a, b = memory_stream_pair()
        a.write(struct.pack(">I", MAX_FRAME_BODY + 1))
        with pytest.raises(FrameTooLarge):
            await NsFrameStream(b).receive()

    run(main)


@settings(max_examples=100, deadline=None)
@given(
    requests=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8),
    fragment=st.integers(1, 64),
)
def test_any_fragmentation_preserves_message_order(requests: list[int], fragment: int) -> None:
    async def main() -> None:
        a, b = memory_stream_pair(fragment=fragment)
        sent = [Resolve(r, Pid(b"\x07" * 16), Consistency.CACHED) for r in requests]
        sender, receiver = NsFrameStream(a), NsFrameStream(b)
        for message in sent:
            sender.send_nowait(message)
        sender.finish()
        got: list[NsMessage] = []
        while (received := await receiver.receive()) is not None:
            got.append(received)
        assert got == sent

    run(main)


def test_the_stream_type_is_chrysalis_quics_byte_stream_and_memory_ends_are_ones() -> None:
    assert chrysalis.nameserver.ByteStream is chrysalis.quic.ByteStream
    a, b = memory_stream_pair()
    ends: tuple[ByteStream, ByteStream] = (a, b)  # statically too (mypy --strict)
    assert all(isinstance(end, ByteStream) for end in ends)
    assert as_byte_stream(a) is a


def test_a_non_stream_is_refused_with_a_type_error() -> None:
    with pytest.raises(TypeError, match="is not a byte stream"):
        as_byte_stream(object())
    with pytest.raises(TypeError, match="is not a byte stream"):
        NsFrameStream(cast(Any, b"not a stream"))


def test_memory_read_exactly_waits_for_every_byte_and_fails_at_an_early_end() -> None:
    async def main() -> None:
        a, b = memory_stream_pair(fragment=1)
        a.write(b"abc")
        assert await b.read_exactly(2) == b"ab"  # two fragments
        a.write_eof()
        with pytest.raises(IncompleteReadError) as short:
            await b.read_exactly(2)
        assert short.value.partial == b"c"
        a.close()
        await a.wait_closed()

    run(main)
