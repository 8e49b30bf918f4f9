"""The message envelope and its stream framing (sans-IO).

Why: every actor message, reply, spawn and supervision event is one ``Envelope``: a msgspec
struct naming the sender and target (PID plus actor path), the endpoint, a per-sender sequence
number, the reply port, the cast point of the receiver, the pickle stream of the user's values
and the sizes of its out-of-band buffers. Being plain data, it crosses any transport, and the
design's addressing (an actor is (PID, actor path); a port is (PID, actor path, index)) is all it
needs.

Frames on a byte stream::

    u32 header_len | u64 body_len | header: msgpack(Envelope) | body: buffer 0 | buffer 1 | ...

``encode_frame`` returns the pieces as a list (for ``writelines``/``sendmsg``: the buffers are
not copied into the frame). ``FrameDecoder`` is a pure state machine: ``receive_data(bytes)``
then ``next_message()`` until it returns ``None`` (needs more data). Limits are checked as soon
as the 12-byte prefix is known, so an oversize or malformed frame raises ``FrameError`` before
any memory is reserved for it; after an error the decoder stays failed (the bounded framing is
``chrysalis.core.framing.LengthPrefixDecoder``'s, with this prefix as its header).

Nothing here imports sockets, asyncio or a clock.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

import msgspec

from chrysalis.core.framing import LengthPrefixDecoder
from monarch.actor._base.codec import KIND_READONLY, MAX_BUFFERS, ReceivedBuffer
from monarch.actor._base.errors import FrameError, MessageTooLargeError
from monarch.actor._base.shape import MAX_DIMS

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FLAG_EXPLICIT_PORT",
    "FRAME_PREFIX",
    "MAX_NAME_CHARS",
    "ActorAddr",
    "CastInfo",
    "Envelope",
    "FrameDecoder",
    "FrameLimits",
    "MessageKind",
    "PortAddr",
    "check_size",
    "decode_header",
    "encode_frame",
]

#: Default bound on one frame (header plus buffers): Monarch's ``codec_max_frame_length``.
DEFAULT_MAX_FRAME_BYTES = 10 * 1024**3
#: Longest actor path, endpoint name or dimension label on the wire.
MAX_NAME_CHARS = 1024

FRAME_PREFIX = struct.Struct(">IQ")

_Pid = Annotated[bytes, msgspec.Meta(min_length=16, max_length=16)]
_Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
_Index = Annotated[int, msgspec.Meta(ge=-1, le=2**62)]
_Size = Annotated[int, msgspec.Meta(ge=0, le=2**62)]


class MessageKind(enum.IntEnum):
    """What an envelope asks the receiving process to do."""

    CALL = 1
    """Run ``endpoint`` on the target actor; reply to ``reply_port`` if there is one."""
    PORT_VALUE = 2
    """Deliver a value to port ``port`` of the target actor."""
    PORT_ERROR = 3
    """Deliver an exception to port ``port`` of the target actor."""
    SPAWN = 4
    """Create the actor ``target.path`` on the target process; reply when constructed."""
    STOP = 5
    """Stop the target actor gracefully after the messages already queued; reply when done."""
    STOP_PROC = 6
    """Stop every actor of the target process, then the process; reply when done."""
    SUPERVISION = 7
    """A ``FailureEvent`` (msgpack in ``payload``) for the owner of a failed actor."""
    UNDELIVERABLE = 8
    """A bounced envelope (msgpack in ``payload``) returned to its sender."""


class ActorAddr(msgspec.Struct, frozen=True, array_like=True):
    """Address of an actor: the 16-byte PID of its process and its path inside it."""

    pid: _Pid
    path: _Name


class PortAddr(msgspec.Struct, frozen=True, array_like=True):
    """Address of a port: the owning actor's address and the port's index in its process."""

    pid: _Pid
    path: _Name
    index: _Size

    @property
    def actor(self) -> ActorAddr:
        """The owning actor."""
        return ActorAddr(self.pid, self.path)


class CastInfo(msgspec.Struct, frozen=True, array_like=True):
    """The receiver's position within the slice that was messaged (``current_rank()``)."""

    labels: Annotated[tuple[_Name, ...], msgspec.Meta(max_length=MAX_DIMS)]
    sizes: Annotated[tuple[_Size, ...], msgspec.Meta(max_length=MAX_DIMS)]
    rank: _Size


class Envelope(msgspec.Struct, frozen=True, array_like=True):
    """One message. ``payload`` is the pickle stream; buffers travel beside the header.

    ``port`` is the target port index for port messages and -1 otherwise; ``sequence`` counts
    the sender's messages (per sending actor, monotonic).
    """

    kind: MessageKind
    sender: ActorAddr
    target: ActorAddr
    port: _Index
    endpoint: _Name
    sequence: _Size
    reply_port: PortAddr | None
    cast: CastInfo | None
    payload: bytes
    buffer_sizes: Annotated[tuple[_Size, ...], msgspec.Meta(max_length=MAX_BUFFERS)] = ()
    buffer_kinds: Annotated[bytes, msgspec.Meta(max_length=MAX_BUFFERS)] = b""
    flags: _Size = 0
    #: The caller's span for tracing (16-byte trace id + 8-byte span id), or empty.
    trace: Annotated[bytes, msgspec.Meta(max_length=24)] = b""


#: ``Envelope.flags`` bit: the callee takes an explicit reply port (``as_endpoint`` methods).
FLAG_EXPLICIT_PORT = 1


@dataclass(frozen=True, slots=True)
class FrameLimits:
    """Bounds enforced by the framing: bytes per frame (header plus buffers), buffers per frame."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_buffers: int = MAX_BUFFERS

    def __post_init__(self) -> None:
        if self.max_frame_bytes < FRAME_PREFIX.size or self.max_buffers < 0:
            raise ValueError(f"invalid frame limits {self!r}")


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Envelope)


def decode_header(header: memoryview, max_buffers: int) -> Envelope:
    """Decode a frame's envelope and check its buffer table (kinds and sizes agree, at most
    ``max_buffers``): the part every frame reader shares (this module's ``FrameDecoder`` and
    the direct lanes' reader); the body's length is each reader's own check."""
    try:
        envelope = _DECODER.decode(header)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError(f"malformed envelope: {exc}") from None
    sizes = envelope.buffer_sizes
    if len(envelope.buffer_kinds) != len(sizes):
        raise FrameError("buffer kinds and sizes disagree")
    if len(sizes) > max_buffers:
        raise FrameError(f"frame carries {len(sizes)} buffers (limit {max_buffers})")
    return envelope


def check_size(header_bytes: int, buffer_bytes: int, nbuffers: int, limits: FrameLimits) -> None:
    """Raise ``MessageTooLargeError`` if a message of these sizes would exceed ``limits``."""
    if nbuffers > limits.max_buffers:
        raise MessageTooLargeError(
            f"message carries {nbuffers} buffers; the limit is {limits.max_buffers}"
        )
    total = FRAME_PREFIX.size + header_bytes + buffer_bytes
    if total > limits.max_frame_bytes:
        raise MessageTooLargeError(
            f"message of {total} bytes exceeds the frame limit of {limits.max_frame_bytes} bytes"
        )


def encode_frame(
    envelope: Envelope,
    buffers: Sequence[memoryview | ReceivedBuffer] = (),
    limits: FrameLimits = FrameLimits(),
) -> list[memoryview | ReceivedBuffer]:
    """The frame for ``envelope`` and its ``buffers`` as a list of pieces (buffers not copied).

    ``envelope.buffer_sizes`` must match ``buffers``; raises ``MessageTooLargeError`` when the
    frame would exceed ``limits`` and ``ValueError`` on a size mismatch.
    """
    if not buffers and not envelope.buffer_sizes and not envelope.buffer_kinds:
        # The common small message (a call's arguments, a reply): header only.
        header = _ENCODER.encode(envelope)
        if FRAME_PREFIX.size + len(header) > limits.max_frame_bytes:
            check_size(len(header), 0, 0, limits)  # raises MessageTooLargeError
        return [FRAME_PREFIX.pack(len(header), 0), header]
    sizes = tuple([memoryview(b).nbytes for b in buffers]) if buffers else ()
    if sizes != envelope.buffer_sizes or len(envelope.buffer_kinds) != len(sizes):
        raise ValueError(
            f"envelope announces buffers {envelope.buffer_sizes} but {sizes} were given"
        )
    header = _ENCODER.encode(envelope)
    body = sum(sizes)
    check_size(len(header), body, len(sizes), limits)
    if len(header) > 0xFFFFFFFF:
        raise MessageTooLargeError(f"envelope header of {len(header)} bytes exceeds 4 GiB")
    return [FRAME_PREFIX.pack(len(header), body), header, *buffers]


def _frame_length(buffer: bytearray, offset: int) -> int:
    """Header plus body bytes of the frame whose prefix is at ``offset``."""
    header_len, body_len = FRAME_PREFIX.unpack_from(buffer, offset)
    if header_len == 0:
        raise FrameError("frame has an empty header")
    return int(header_len + body_len)


def _frame_too_large(length: int, max_body: int) -> FrameError:
    return FrameError(
        f"frame of {FRAME_PREFIX.size + length} bytes exceeds the limit of "
        f"{FRAME_PREFIX.size + max_body}"
    )


class FrameDecoder:
    """Bytes in, ``(Envelope, buffers)`` out, for one direction of a stream.

    ``receive_data`` appends bytes; ``next_message`` returns the next complete message or
    ``None`` when more data is needed. Buffers come back receiver-owned: ``bytes`` for buffers
    that were read-only at the sender, ``bytearray`` otherwise. Any violation of the format or of
    ``limits`` raises ``FrameError``, and every later call raises it again. The framing is
    ``chrysalis.core.framing.LengthPrefixDecoder`` (this module's 12-byte prefix is its header,
    checked as soon as it is received); this class checks and decodes the frames, copying each
    buffer once, straight out of the received bytes.
    """

    __slots__ = ("_frames", "_limits", "_parse")

    def __init__(self, limits: FrameLimits = FrameLimits()) -> None:
        self._limits = limits
        self._frames = LengthPrefixDecoder(
            limits.max_frame_bytes - FRAME_PREFIX.size,
            prefix_size=FRAME_PREFIX.size,
            length_of=_frame_length,
            too_large=_frame_too_large,
        )
        self._parse = self._decode

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as messages."""
        return self._frames.buffered

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes (an empty chunk is allowed and does nothing)."""
        frames = self._frames
        frames.feed(data)
        frames.peek_length()  # a bad prefix fails now, before its frame is buffered

    def next_message(self) -> tuple[Envelope, list[ReceivedBuffer]] | None:
        """The next complete message, or ``None`` if more data is needed."""
        return self._frames.next_parsed(self._parse)

    def _decode(self, frame: memoryview) -> tuple[Envelope, list[ReceivedBuffer]]:
        header_len, body_len = FRAME_PREFIX.unpack_from(frame)
        start = FRAME_PREFIX.size
        with frame[start : start + header_len] as header:
            envelope = decode_header(header, self._limits.max_buffers)
        sizes = envelope.buffer_sizes
        if not sizes:
            if body_len:
                raise FrameError(f"buffer sizes add up to 0, body has {body_len}")
            return envelope, []
        if sum(sizes) != body_len:
            raise FrameError(f"buffer sizes add up to {sum(sizes)}, body has {body_len}")
        buffers: list[ReceivedBuffer] = []
        offset = start + header_len
        for size, kind in zip(sizes, envelope.buffer_kinds, strict=True):
            with frame[offset : offset + size] as piece:
                buffers.append(bytes(piece) if kind & KIND_READONLY else bytearray(piece))
            offset += size
        return envelope, buffers
