"""The echo service shared by ``chrysalis serve/join --echo`` and the scale workers
(``chrysalis.node._echo``): the raw echo, the FIN on every outcome, and the accept loop's
bound on streams served at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.node._echo import echo_raw, serve_stream, serve_streams


class FakeStream:
    """An accepted ``ByteStream``: reads what the peer sent (then EOF), records what is
    written."""

    def __init__(self, data: bytes, *, fail_read: bool = False) -> None:
        self.reader = asyncio.StreamReader()
        self.reader.feed_data(data)
        self.reader.feed_eof()
        self.written = bytearray()
        self.eof = False
        self.reads: list[int] = []
        self.fail_read = fail_read

    async def read(self, n: int = -1) -> bytes:
        if self.fail_read:
            raise ConnectionResetError("peer reset the stream")
        self.reads.append(n)
        return await self.reader.read(n)

    async def read_exactly(self, n: int) -> bytes:
        return await self.reader.readexactly(n)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.eof, "write after FIN"
        self.written += data

    def write_eof(self) -> None:
        self.eof = True

    async def drain(self) -> None:
        return None

    def close(self, error_code: int = 0) -> None:
        self.eof = True

    def abort(self, error_code: int = 0) -> None:
        self.eof = True

    async def wait_closed(self) -> None:
        return None


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=4096), chunk=st.integers(1, 512), first=st.binary(max_size=3))
def test_raw_echo_returns_every_byte_in_order(data: bytes, chunk: int, first: bytes) -> None:
    async def go() -> FakeStream:
        stream = FakeStream(data)  # its reader belongs to this loop
        await serve_stream(stream, lambda s: echo_raw(s, first, chunk))
        return stream

    stream = asyncio.run(go())
    assert bytes(stream.written) == first + data
    assert stream.eof
    assert all(n == chunk for n in stream.reads)  # never more than one chunk in flight


def test_a_failing_handler_still_ends_its_stream() -> None:
    async def go() -> FakeStream:
        stream = FakeStream(b"x", fail_read=True)
        await serve_stream(stream, echo_raw)  # does not raise
        return stream

    stream = asyncio.run(go())
    assert stream.eof
    assert stream.written == b""


class FakeNode:
    """Hands out queued streams from ``accept``; counts how many were taken."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[Any] = asyncio.Queue()
        self.accepted = 0

    async def accept(self) -> tuple[object, Any]:
        stream = await self.incoming.get()
        self.accepted += 1
        return b"peer", stream


async def _until(condition: Any, timeout: float = 5.0) -> None:
    """Yield to the loop until ``condition()`` holds (bounded: fails after ``timeout``)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0)


def test_service_serves_at_most_limit_streams_at_once_and_frees_slots() -> None:
    async def go() -> None:
        node = FakeNode()
        gates = [asyncio.Event() for _ in range(3)]
        running: list[int] = []
        done: list[int] = []

        async def handle(stream: Any) -> None:
            running.append(stream)
            await gates[stream].wait()
            done.append(stream)

        service = asyncio.create_task(serve_streams(node, handle, limit=2))
        for index in range(3):
            node.incoming.put_nowait(index)
        await _until(lambda: len(running) == 2)
        for _ in range(20):  # the third stays in the queue while both slots are taken
            await asyncio.sleep(0)
        assert node.accepted == 2
        assert running == [0, 1]
        gates[0].set()
        await _until(lambda: running == [0, 1, 2])
        gates[1].set()
        gates[2].set()
        await _until(lambda: len(done) == 3)
        service.cancel()
        with pytest.raises(asyncio.CancelledError):
            await service

    asyncio.run(go())


def test_cancelling_the_service_cancels_the_streams_it_serves() -> None:
    async def go() -> None:
        node = FakeNode()
        started = asyncio.Event()
        cancelled = asyncio.Event()

        async def handle(stream: Any) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        service = asyncio.create_task(serve_streams(node, handle, limit=4))
        node.incoming.put_nowait(FakeStream(b""))
        async with asyncio.timeout(5):
            await started.wait()
        service.cancel()
        with pytest.raises(asyncio.CancelledError):
            await service
        async with asyncio.timeout(5):
            await cancelled.wait()

    asyncio.run(go())


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        asyncio.run(serve_streams(FakeNode(), echo_raw, limit=0))
