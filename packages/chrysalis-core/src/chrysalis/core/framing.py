"""One bounded, resumable decoder of length-prefixed frames (sans-IO).

Why one: every Chrysalis and Monarch stream protocol frames its messages as
``[length prefix][body]`` and needs the same guarantees from its reader, which used to be
written once per protocol. ``LengthPrefixDecoder`` is that reader:

- **bounded before buffering**: the declared body length is checked as soon as the prefix's
  bytes are known, so a hostile prefix costs no more memory than the bytes actually fed; an
  optional ``buffer_limit`` bounds what ``feed`` accepts at all;
- **poisoned after an error**: a too-large prefix, a stream that ends inside a frame, or an
  error the protocol reports with ``poison`` (a malformed body) is raised again by every later
  call, and the buffer is released;
- **compaction by offset**: consumed frames advance an offset; the buffer is compacted only
  when the consumed part is at least half of it, so a burst of small frames is not an
  O(n^2) series of deletions.

Each protocol keeps its own header and errors: the prefix is ``prefix_size`` big-endian bytes
(1..8), or, with ``length_of``, a fixed-size header of the protocol's own (several fields, say)
from which ``length_of`` computes the body length; the exceptions raised for a too-large frame
and a truncated stream come from the ``too_large(length, max_body)`` and ``truncated(pending)``
factories (``FrameTooLarge`` and ``TruncatedFrame`` of this module by default). The body is
returned as ``bytes`` (``next_frame``), or handed to the protocol's parser as a view of the
buffered frame (``next_parsed``: no copy of the frame, for protocols that copy large pieces out
of it anyway); decoding it is the protocol's business. The prefix of the frame being received
is parsed once, not again on every ``feed``. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, NoReturn, TypeVar, final

__all__ = [
    "DEFAULT_PREFIX_SIZE",
    "MAX_HEADER_SIZE",
    "FrameBufferFull",
    "FrameError",
    "FrameTooLarge",
    "LengthPrefixDecoder",
    "TruncatedFrame",
]

DEFAULT_PREFIX_SIZE: Final = 4
"""Bytes of the big-endian length prefix unless told otherwise (a u32)."""
MAX_HEADER_SIZE: Final = 64
"""The longest protocol header ``length_of`` may read."""

T = TypeVar("T")


class FrameError(ValueError):
    """A length-prefixed stream is malformed or exceeds a bound."""


class FrameTooLarge(FrameError):
    """A prefix declares a body longer than the decoder's ``max_body``."""


class TruncatedFrame(FrameError):
    """The stream ended inside a frame (inside its prefix or its body)."""


class FrameBufferFull(FrameError):
    """``feed`` would hold more than ``buffer_limit`` bytes; the data was not taken (the
    decoder stays usable: consume frames, then feed again)."""


def _default_too_large(length: int, max_body: int) -> Exception:
    return FrameTooLarge(f"frame body of {length} bytes exceeds {max_body}")


def _default_truncated(pending: int) -> Exception:
    return TruncatedFrame(f"stream ended inside a frame ({pending} bytes pending)")


@final
class LengthPrefixDecoder:
    """Frames ``[prefix_size-byte big-endian length][body]`` from bytes fed in any pieces.

    ``feed(data)`` appends bytes; ``next_frame()`` returns the next complete body or ``None``
    when more bytes are needed (a partial frame stays buffered); ``end_of_stream()`` checks
    that the stream ended between frames. See the module docstring for the bounds and errors.

    Args:
        max_body: the longest body a prefix may declare (``too_large`` beyond it).
        prefix_size: bytes of the length prefix (1..8), or of the protocol's header (1..64)
            with ``length_of``.
        buffer_limit: the most bytes ``feed`` may leave buffered (``FrameBufferFull``
            otherwise); ``None`` for no limit beyond ``max_body`` checks. At least one
            maximal frame.
        too_large: ``(declared length, max_body) -> exception`` for a too-large prefix.
        truncated: ``(pending bytes) -> exception`` for an end inside a frame.
        length_of: ``(buffer, offset) -> body length`` of the header at ``offset`` (its
            ``prefix_size`` bytes are buffered; ``struct.unpack_from`` reads it without a copy).
            An exception it raises (a malformed header) poisons the decoder. ``None``: the
            prefix is a big-endian unsigned integer.
    """

    __slots__ = (
        "_buffer",
        "_buffer_limit",
        "_error",
        "_length",
        "_length_of",
        "_max_body",
        "_offset",
        "_prefix",
        "_too_large",
        "_truncated",
    )

    def __init__(
        self,
        max_body: int,
        *,
        prefix_size: int = DEFAULT_PREFIX_SIZE,
        buffer_limit: int | None = None,
        too_large: Callable[[int, int], Exception] = _default_too_large,
        truncated: Callable[[int], Exception] = _default_truncated,
        length_of: Callable[[bytearray, int], int] | None = None,
    ) -> None:
        most = 8 if length_of is None else MAX_HEADER_SIZE
        if isinstance(prefix_size, bool) or not 1 <= prefix_size <= most:
            raise ValueError(f"prefix_size must be in 1..{most}, got {prefix_size!r}")
        if isinstance(max_body, bool) or max_body < 0:
            raise ValueError(f"max_body must be at least 0, got {max_body!r}")
        if length_of is None and max_body >= 1 << (8 * prefix_size):
            raise ValueError(f"max_body must fit a {prefix_size}-byte prefix, got {max_body!r}")
        if buffer_limit is not None and buffer_limit < prefix_size + max_body:
            raise ValueError(
                f"buffer_limit must hold one maximal frame ({prefix_size + max_body} bytes), "
                f"got {buffer_limit!r}"
            )
        self._max_body = max_body
        self._prefix = prefix_size
        self._buffer_limit = buffer_limit
        self._too_large = too_large
        self._truncated = truncated
        self._length_of = length_of
        self._buffer = bytearray()
        self._offset = 0
        self._length = -1  # the body length of the frame at ``_offset`` once parsed
        self._error: BaseException | None = None

    @property
    def max_body(self) -> int:
        """The longest body a prefix may declare."""
        return self._max_body

    @property
    def buffered(self) -> int:
        """Bytes fed and not yet returned as frames (0 once poisoned)."""
        return len(self._buffer) - self._offset

    @property
    def error(self) -> BaseException | None:
        """The error this decoder is poisoned with, if any."""
        return self._error

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes (the poisoning error again after an error;
        ``FrameBufferFull`` beyond ``buffer_limit``, without taking ``data``)."""
        if self._error is not None:
            raise self._error
        if not data:
            return
        if self._buffer_limit is not None and self.buffered + len(data) > self._buffer_limit:
            raise FrameBufferFull(
                f"{self.buffered} bytes buffered, {len(data)} more would exceed the "
                f"{self._buffer_limit}-byte bound"
            )
        if self._offset and self._offset * 2 >= len(self._buffer):
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    def peek_length(self) -> int | None:
        """The body length the next frame declares once its prefix is buffered (``None``
        before); poisons the decoder with ``too_large`` beyond ``max_body`` (and with
        ``length_of``'s error for a malformed header)."""
        if self._error is not None:
            raise self._error
        length = self._length
        if length >= 0:
            return length
        start = self._offset
        if len(self._buffer) - start < self._prefix:
            return None
        if self._length_of is None:
            length = int.from_bytes(self._buffer[start : start + self._prefix], "big")
        else:
            try:
                length = self._length_of(self._buffer, start)
            except Exception as exc:
                self.poison(exc)
        if length > self._max_body:
            self.poison(self._too_large(length, self._max_body))
        self._length = length
        return length

    def next_frame(self) -> bytes | None:
        """The next complete body, or ``None`` if the buffered bytes end mid-frame."""
        length = self._length
        if length < 0:  # the prefix is not parsed yet (or the decoder is poisoned)
            peeked = self.peek_length()
            if peeked is None:
                return None
            length = peeked
        start = self._offset + self._prefix
        stop = start + length
        buffer = self._buffer
        if stop > len(buffer):
            return None
        body = bytes(buffer[start:stop])
        self._length = -1
        if stop == len(buffer):
            buffer.clear()
            self._offset = 0
        else:
            self._offset = stop
        return body

    def next_parsed(self, parse: Callable[[memoryview], T]) -> T | None:
        """``parse(frame)`` for the next complete frame, or ``None`` if the buffered bytes end
        mid-frame.

        ``frame`` is a view of the whole frame, prefix (or header) included, into the
        decoder's buffer, valid only during the call: ``parse`` reads it (never writes) and
        copies out what it keeps; a view of it still held when ``parse`` returns makes the next
        ``feed`` fail. Whatever ``parse`` raises poisons the decoder (a malformed body)."""
        length = self._length
        buffer = self._buffer
        start = self._offset
        if length < 0:  # the prefix is not parsed yet (or the decoder is poisoned)
            if self._error is not None:
                raise self._error
            if len(buffer) - start < self._prefix:
                return None
            peeked = self.peek_length()
            assert peeked is not None
            length = peeked
        stop = start + self._prefix + length
        if stop > len(buffer):
            return None
        frame = memoryview(buffer)[start:stop]
        try:
            result = parse(frame)
        except Exception as exc:
            frame.release()
            self.poison(exc)
        frame.release()
        self._length = -1
        if stop == len(buffer):
            buffer.clear()
            self._offset = 0
        else:
            self._offset = stop
        return result

    def end_of_stream(self) -> None:
        """Declare the end of the stream: fine between frames, ``truncated`` inside one
        (including inside the prefix)."""
        if self._error is not None:
            raise self._error
        pending = self.buffered
        if pending:
            self.poison(self._truncated(pending))

    def poison(self, error: BaseException) -> NoReturn:
        """Poison the decoder with ``error`` (a protocol's own body error, say) and raise it:
        every later call raises it again; the buffer is released."""
        self._error = error
        self._buffer = bytearray()
        self._offset = 0
        self._length = -1
        raise error
