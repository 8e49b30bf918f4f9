"""The echo service behind ``chrysalis serve --echo`` / ``join --echo`` (what ``chrysalis ping``
talks to) and the scale tool's workers.

Why one module: both serve every stream opened to a node with a small echo handler, and both
need the same guarantees, so they share one accept loop rather than two copies that drift
apart. The guarantees: at most ``limit`` streams are served at once (the rest wait in the
transport's bounded accept queue, so a flood of streams costs bounded memory); a broken or
hostile stream ends itself with a FIN and a debug log line, never the service; every stream
the service still serves is cancelled when the service is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

from chrysalis.quic import ByteStream

__all__ = [
    "ECHO_CHUNK",
    "MAX_ECHO_STREAMS",
    "Acceptor",
    "StreamHandler",
    "echo_raw",
    "serve_stream",
    "serve_streams",
]

_log = logging.getLogger("chrysalis.echo")

ECHO_CHUNK: Final = 64 * 1024
"""Largest read of the raw echo (what is echoed is never buffered beyond one read)."""
MAX_ECHO_STREAMS: Final = 256
"""Echo streams served at once; more wait in ``accept`` (the transport bounds its queue)."""

StreamHandler = Callable[[ByteStream], Awaitable[None]]
"""Serves one accepted stream (reads it, writes the answer); the caller sends the FIN."""


class Acceptor(Protocol):
    """What the service needs of a node (``chrysalis.node.Node`` is one)."""

    async def accept(self) -> tuple[object, ByteStream]:
        """The next stream another process opened, with the opener's PID."""
        ...


async def echo_raw(stream: ByteStream, first: bytes = b"", chunk: int = ECHO_CHUNK) -> None:
    """Write back ``first`` and then every byte read from ``stream`` until its end, waiting
    for each write to drain before reading more (so the echo holds at most one chunk)."""
    data = first or await stream.read(chunk)
    while data:
        stream.write(data)
        await stream.drain()
        data = await stream.read(chunk)


async def serve_stream(stream: ByteStream, handle: StreamHandler) -> None:
    """Serve ``stream`` with ``handle``, then end it (FIN). An exception from the handler (a
    peer that went away, a truncated or hostile request) ends the stream too, and is only
    logged at debug level: one bad stream must not stop a service serving many."""
    try:
        await handle(stream)
        stream.write_eof()
    except Exception as exc:
        _log.debug("echo stream ended: %s", exc)
        with contextlib.suppress(Exception):
            stream.write_eof()


async def serve_streams(
    node: Acceptor, handle: StreamHandler, limit: int = MAX_ECHO_STREAMS
) -> None:
    """Accept every stream opened to ``node`` and serve each in its own task
    (:func:`serve_stream`), at most ``limit`` at once; runs until cancelled, and then cancels
    the streams it still serves."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    slots = asyncio.Semaphore(limit)
    tasks: set[asyncio.Task[None]] = set()

    async def serve(stream: ByteStream) -> None:
        try:
            await serve_stream(stream, handle)
        finally:
            slots.release()

    try:
        while True:
            await slots.acquire()
            try:
                _peer, stream = await node.accept()
            except BaseException:
                slots.release()
                raise
            task = asyncio.create_task(serve(stream))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
