"""The runtime-neutral byte-stream type: what every Chrysalis stream speaks under either runtime.

Why one type: the nameserver links, the node's link sessions, the echo service, the CLI and the
SQLite replication sessions all move bytes over "a stream" and used to take it as ``Any`` (or
guess its vocabulary with ``hasattr``). ``ByteStream`` names the one vocabulary they use: the
asyncio ``StreamReader``/``StreamWriter`` verbs plus QUIC's ``abort``, with the same meaning on
asyncio and on trio. ``chrysalis.quic``'s ``AsyncioStream`` and ``TrioStream`` both implement
it (statically and at run time: it is ``runtime_checkable``), so ``Node.dial``/``Node.accept``
return a ``ByteStream`` whichever runtime runs the node; test doubles (the nameserver's
``MemoryByteStream``) implement it too.

Errors: the ``ByteStream`` verbs raise the Chrysalis errors under both runtimes
(``StreamResetError``, ``ConnectionLostError``, ``StreamClosedError``, ``WriteBufferFullError``,
``IncompleteReadError``...); ``TrioStream``'s trio verbs (``send_all``, ``receive_some``...)
keep translating them to trio's exceptions. This module is pure typing: it imports neither
asyncio nor trio.
"""

from __future__ import annotations

from typing import Final, Protocol, runtime_checkable

__all__ = ["MAX_READ_ALL", "ByteStream"]

MAX_READ_ALL: Final = 64 * 1024 * 1024
"""Most bytes ``read()`` / ``read(-1)`` (everything until EOF) gathers on a QUIC stream
(``ReadLimitError`` beyond it)."""


@runtime_checkable
class ByteStream(Protocol):
    """An ordered, reliable, half-closeable byte stream, the same under asyncio and trio.

    Reading: ``read(n)`` returns up to ``n`` bytes as soon as any are buffered (``n < 0``:
    everything until EOF) and ``b""`` at EOF; ``read_exactly(n)`` returns exactly ``n`` bytes
    or raises an ``EOFError`` (``chrysalis.quic.IncompleteReadError`` on a QUIC stream, with
    ``partial``) when the peer finished first. Writing: ``write`` queues bytes without
    waiting (the stream's own write buffer bounds it); ``drain`` waits until the written
    bytes are admitted; ``write_eof`` ends our direction (FIN, idempotent). Ending:
    ``close(error_code)`` ends our direction and stops the peer's (STOP_SENDING);
    ``abort(error_code)`` resets both at once; ``wait_closed`` waits until the stream is
    fully finished. Peer identity is not part of the type: ``Node.accept`` returns it with
    the stream, and the QUIC adapters' streams also have ``peer`` and ``stream_id``.
    """

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (``n < 0``: everything until EOF); ``b""`` at EOF."""
        ...

    async def read_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; an ``EOFError`` (with ``partial``) at an earlier EOF."""
        ...

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` (non-blocking; the write buffer is bounded)."""
        ...

    async def drain(self) -> None:
        """Wait until every written byte was admitted."""
        ...

    def write_eof(self) -> None:
        """End our direction after every written byte (idempotent)."""
        ...

    def close(self, error_code: int = 0) -> None:
        """End our direction and stop the peer's with ``error_code`` (idempotent)."""
        ...

    def abort(self, error_code: int = 0) -> None:
        """Reset both directions with ``error_code``."""
        ...

    async def wait_closed(self) -> None:
        """Wait until the stream is finished (every byte acknowledged, or the connection
        gone)."""
        ...
