"""``chrysalis.quic.ByteStream``: the runtime-neutral stream type that the asyncio and the trio
adapters' streams both implement, statically (mypy checks ``_as_byte_streams``) and at run time
(``isinstance``), with the same behaviour and the same Chrysalis errors under both runtimes.
One scenario, written against ``ByteStream`` only, runs on each runtime."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from chrysalis.quic import (
    MAX_READ_ALL,
    AsyncioStream,
    ByteStream,
    IncompleteReadError,
    StreamResetError,
    TrioStream,
)
from chrysalis.quic.testing import connected_stream_pair, open_endpoint_pair


def _as_byte_streams(
    asyncio_stream: AsyncioStream, trio_stream: TrioStream
) -> tuple[ByteStream, ByteStream]:
    """Never called: mypy --strict proves both adapter streams are ``ByteStream``s."""
    return asyncio_stream, trio_stream


async def _read_to_the_end(stream: ByteStream) -> None:
    while await stream.read(100):
        pass
    raise AssertionError("the stream read as a clean EOF")


async def _scenario(expected_type: type) -> None:
    """Every ``ByteStream`` verb over real QUIC streams of the running runtime."""
    async with open_endpoint_pair() as (first, second):
        opened: ByteStream
        accepted: ByteStream
        opened, accepted = await connected_stream_pair(first, second)
        assert isinstance(opened, expected_type)
        assert isinstance(opened, ByteStream)
        assert isinstance(accepted, ByteStream)

        # write / drain / read_exactly / read, then FIN both ways.
        opened.write(b"hello")
        opened.write(bytearray(b" wor"))
        opened.write(memoryview(b"ld"))
        await opened.drain()
        assert await accepted.read_exactly(5) == b"hello"
        assert await accepted.read_exactly(6) == b" world"
        assert await accepted.read(0) == b""
        opened.write_eof()
        opened.write_eof()  # idempotent
        assert await accepted.read(10) == b""
        accepted.write(b"bye")
        accepted.write_eof()
        assert await opened.read() == b"bye"  # n < 0: everything until EOF
        await opened.wait_closed()
        await accepted.wait_closed()

        # read_exactly at an earlier EOF: Chrysalis's IncompleteReadError, an EOFError.
        opened, accepted = await connected_stream_pair(first, second)
        opened.write(b"ab")
        opened.write_eof()
        with pytest.raises(IncompleteReadError) as short:
            await accepted.read_exactly(3)
        assert isinstance(short.value, EOFError)
        assert short.value.partial == b"ab"
        assert short.value.expected == 3
        accepted.close()

        # abort resets: the peer's read raises Chrysalis's StreamResetError on both runtimes.
        opened, accepted = await connected_stream_pair(first, second)
        opened.write(b"partial")
        opened.abort(42)
        with pytest.raises(StreamResetError) as reset:
            await _read_to_the_end(accepted)
        assert reset.value.error_code == 42
        accepted.abort()


def _run_asyncio(main: Callable[[], Awaitable[Any]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main(), 10.0)

    asyncio.run(bounded())


def _run_trio(main: Callable[[], Awaitable[Any]]) -> None:
    async def bounded() -> None:
        with trio.fail_after(10.0):
            await main()

    trio.run(bounded)


def test_an_asyncio_stream_is_a_byte_stream() -> None:
    _run_asyncio(lambda: _scenario(AsyncioStream))


def test_a_trio_stream_is_a_byte_stream_with_the_same_errors() -> None:
    _run_trio(lambda: _scenario(TrioStream))


def test_closing_a_trio_stream_as_a_byte_stream_closes_its_trio_side() -> None:
    async def main() -> None:
        async with open_endpoint_pair() as (first, second):
            opened, accepted = await connected_stream_pair(first, second)
            assert isinstance(opened, TrioStream)
            opened.close(7)
            with pytest.raises(trio.ClosedResourceError):
                await opened.send_all(b"x")
            with pytest.raises(trio.ClosedResourceError):
                await opened.receive_some(1)
            assert await accepted.receive_some(1) == b""  # the FIN arrived
            await accepted.aclose()

    _run_trio(main)


def test_other_objects_are_not_byte_streams() -> None:
    assert not isinstance(object(), ByteStream)
    assert not isinstance(b"bytes", ByteStream)
    assert MAX_READ_ALL == 64 * 1024 * 1024
