"""Nameserver frames over an ordered byte stream (the I/O edge of spec 1.2 and 3.3).

Why a separate module: the service, the parent link and their tests all move ``NsMessage``
values over *some* reliable byte stream (a QUIC stream in production, an in-memory pipe in
tests). ``NsFrameStream`` is the one place that turns stream bytes into messages with the
bounded incremental ``NsCodec`` and messages into frames, so every reader enforces the same
limits (a declared body above 4 MiB is rejected before it is buffered; a stream that ends
inside a frame is a ``TruncatedFrame``, distinct from a clean end).

The stream contract is ``chrysalis.quic.ByteStream`` (re-exported here as ``ByteStream``), the
runtime-neutral vocabulary that both ``AsyncioStream`` and ``TrioStream`` implement: ``read(n)``,
``read_exactly``, ``write``, ``drain``, ``write_eof``, ``close``, ``abort``, ``wait_closed``; so
the frame layer is the same under asyncio and trio. ``memory_stream_pair`` gives two connected
in-memory ``ByteStream`` ends (asyncio or trio) with a bounded buffer and optional
fragmentation, for tests.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Final, final

from chrysalis.nameserver._codec import DEFAULT_BUFFER_LIMIT, NsCodec
from chrysalis.nameserver._protocol import NsMessage
from chrysalis.nameserver.runtime import Event, new_event, sleep
from chrysalis.quic import ByteStream, IncompleteReadError

__all__ = [
    "DEFAULT_READ_SIZE",
    "ByteStream",
    "MemoryByteStream",
    "NsFrameStream",
    "as_byte_stream",
    "memory_stream_pair",
]

DEFAULT_READ_SIZE: Final = 64 * 1024
"""Bytes asked of the stream per read."""
_MEMORY_CAPACITY: Final = 1 << 20


def as_byte_stream(stream: object) -> ByteStream:
    """``stream`` itself when it is a ``ByteStream`` (a ``chrysalis.quic`` stream of either
    runtime, a ``MemoryByteStream``...); ``TypeError`` for anything else."""
    if isinstance(stream, ByteStream):
        return stream
    raise TypeError(f"{type(stream).__name__} is not a byte stream")


@final
class NsFrameStream:
    """Nameserver messages over one ``ByteStream``.

    ``receive()`` returns the next message or ``None`` at a clean end of stream; it raises
    ``CodecError`` subclasses for malformed input (``TruncatedFrame`` for a stream that ends
    inside a frame) and whatever the stream raises for transport failures. ``send(message)``
    encodes (``CodecError`` for an unencodable value), writes and drains. ``finish()`` sends
    FIN; ``abort()`` resets both directions. Not safe for concurrent ``receive`` calls;
    concurrent ``send`` calls are fine (each frame is written whole).
    """

    __slots__ = ("_codec", "_read_size", "_stream")

    def __init__(
        self,
        stream: ByteStream,
        *,
        read_size: int = DEFAULT_READ_SIZE,
        buffer_limit: int = DEFAULT_BUFFER_LIMIT,
    ) -> None:
        if not isinstance(read_size, int) or read_size < 1:
            raise ValueError(f"read_size must be a positive int, got {read_size!r}")
        self._stream = as_byte_stream(stream)
        self._read_size = read_size
        self._codec = NsCodec(buffer_limit=buffer_limit)

    @property
    def stream(self) -> ByteStream:
        """The byte stream below."""
        return self._stream

    async def receive(self) -> NsMessage | None:
        """The next message, ``None`` at a clean end of stream."""
        codec = self._codec
        while True:
            message = codec.next_message()
            if message is not None:
                return message
            if codec.finished:
                return None
            data = await self._stream.read(self._read_size)
            if data:
                codec.feed(data)
            else:
                codec.end_of_input()

    async def send(self, message: NsMessage) -> None:
        """Write one frame and wait until the stream admitted it."""
        self._stream.write(NsCodec.encode(message))
        await self._stream.drain()

    def send_nowait(self, message: NsMessage) -> None:
        """Write one frame without waiting (the stream's own write buffer bounds it)."""
        self._stream.write(NsCodec.encode(message))

    def finish(self) -> None:
        """Send FIN after every written frame (idempotent)."""
        with contextlib.suppress(Exception):  # a dead stream has nothing left to finish
            self._stream.write_eof()

    def abort(self) -> None:
        """Reset the stream in both directions."""
        with contextlib.suppress(Exception):  # a dead stream is already aborted
            self._stream.abort(0)


@final
class _Pipe:
    """One direction of a memory stream: bounded bytes plus end-of-stream. The reader waits
    on a fresh event of the running library (asyncio or trio) that any change sets."""

    __slots__ = ("buffered", "chunks", "eof", "reset", "waiter")

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.eof = False
        self.reset = False
        self.waiter: Event | None = None

    def wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.set()

    async def wait(self) -> None:
        if self.waiter is None:
            self.waiter = new_event()
        await self.waiter.wait()


@final
class MemoryByteStream:
    """One end of an in-memory ``ByteStream`` pair (see ``memory_stream_pair``).

    Writes beyond ``capacity`` unread bytes raise ``BufferError``; reads return at most
    ``fragment`` bytes at a time (to exercise frame reassembly). ``abort`` makes the peer's
    reads raise ``ConnectionResetError``; writing after ``write_eof`` raises ``BrokenPipeError``.
    ``wait_closed`` returns at once (nothing is in flight).
    """

    __slots__ = ("_capacity", "_fragment", "_incoming", "_outgoing", "_write_closed")

    def __init__(self, incoming: _Pipe, outgoing: _Pipe, capacity: int, fragment: int) -> None:
        self._incoming = incoming
        self._outgoing = outgoing
        self._capacity = capacity
        self._fragment = fragment
        self._write_closed = False

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (at most ``fragment``); ``b""`` at end of stream."""
        pipe = self._incoming
        while True:
            if pipe.reset:
                raise ConnectionResetError("the peer aborted the stream")
            if pipe.chunks:
                limit = self._fragment if n < 0 else min(n, self._fragment)
                chunk = pipe.chunks.popleft()
                if len(chunk) > limit:
                    pipe.chunks.appendleft(chunk[limit:])
                    chunk = chunk[:limit]
                pipe.buffered -= len(chunk)
                return chunk
            if pipe.eof:
                return b""
            await pipe.wait()

    async def read_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; ``chrysalis.quic.IncompleteReadError`` at an earlier end."""
        data = b""
        while len(data) < n:
            chunk = await self.read(n - len(data))
            if not chunk:
                raise IncompleteReadError(data, n)
            data += chunk
        return data

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` for the peer."""
        if self._write_closed:
            raise BrokenPipeError("write after write_eof")
        pipe = self._outgoing
        if pipe.reset:
            raise ConnectionResetError("the stream was aborted")
        if pipe.buffered + len(data) > self._capacity:
            raise BufferError(f"memory stream holds at most {self._capacity} unread bytes")
        if data:
            pipe.chunks.append(bytes(data))
            pipe.buffered += len(data)
            pipe.wake()

    async def drain(self) -> None:
        """Memory writes are admitted at once."""
        await sleep(0)

    def write_eof(self) -> None:
        """End our direction (idempotent)."""
        self._write_closed = True
        self._outgoing.eof = True
        self._outgoing.wake()

    def close(self, error_code: int = 0) -> None:
        """``write_eof``."""
        self.write_eof()

    def abort(self, error_code: int = 0) -> None:
        """Reset both directions: the peer's reads and writes raise."""
        self._write_closed = True
        for pipe in (self._incoming, self._outgoing):
            pipe.reset = True
            pipe.chunks.clear()
            pipe.buffered = 0
            pipe.wake()

    async def wait_closed(self) -> None:
        """Memory bytes need no acknowledgement."""
        await sleep(0)


def memory_stream_pair(
    *, capacity: int = _MEMORY_CAPACITY, fragment: int = DEFAULT_READ_SIZE
) -> tuple[MemoryByteStream, MemoryByteStream]:
    """Two connected in-memory stream ends (asyncio or trio)."""
    if capacity < 1 or fragment < 1:
        raise ValueError("capacity and fragment must be positive")
    forward, backward = _Pipe(), _Pipe()
    return (
        MemoryByteStream(backward, forward, capacity, fragment),
        MemoryByteStream(forward, backward, capacity, fragment),
    )
