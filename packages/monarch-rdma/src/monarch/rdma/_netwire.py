"""The ``net`` provider's lane protocol (sans-IO): requests and replies on a data connection.

A data connection (an abstract Unix socket within a host, TLS over TCP across hosts) carries
one request at a time, each a fixed 45-byte header::

    magic "MRN1" | op (1 byte) | region (u64) | offset (u64) | length (u64) | secret (16 bytes)

``READ`` asks for ``length`` bytes of region ``region`` from ``offset``; ``WRITE`` is followed
by exactly ``length`` bytes to store there; ``DROP`` releases the region (offset and length 0).
The owner answers every request with a 9-byte reply head, ``status (1 byte) | length (u64)``:
``OK`` and, for a read, the ``length`` bytes of data right after it (zero for the others);
``ERROR`` and a UTF-8 message of ``length`` bytes (at most ``MAX_MESSAGE``). A write refused by
the owner (unknown region, wrong secret, range outside the region, read-only memory) has its
payload read and discarded first, so the connection stays in step and is reused.

Everything here is pure: bytes in, values out; any malformed input is a ``WireError``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAGIC",
    "MAX_MESSAGE",
    "REPLY_SIZE",
    "REQUEST_SIZE",
    "SECRET_SIZE",
    "Op",
    "Reply",
    "Request",
    "WireError",
    "decode_reply",
    "decode_request",
    "encode_error",
    "encode_ok",
    "encode_request",
]

MAGIC: Final = b"MRN1"
SECRET_SIZE: Final = 16
MAX_MESSAGE: Final = 4096
_U64: Final = (1 << 64) - 1
_REQUEST: Final = struct.Struct(">4sBQQQ16s")
_REPLY: Final = struct.Struct(">BQ")
REQUEST_SIZE: Final = _REQUEST.size
REPLY_SIZE: Final = _REPLY.size
_OK: Final = 0
_ERROR: Final = 1


class WireError(ValueError):
    """Malformed bytes on a data connection (the connection is then closed)."""


class Op(enum.IntEnum):
    """What a request asks for."""

    READ = 1
    WRITE = 2
    DROP = 3


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded request header."""

    op: Op
    region: int
    offset: int
    length: int
    secret: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    """One decoded reply head: ``ok`` and the length of what follows (data or a message)."""

    ok: bool
    length: int


def encode_request(op: Op, region: int, offset: int, length: int, secret: bytes) -> bytes:
    """The header of one request (``WireError`` for values the format cannot carry)."""
    if not all(0 <= value <= _U64 for value in (region, offset, length)):
        raise WireError(f"request fields out of range ({region=}, {offset=}, {length=})")
    if len(secret) != SECRET_SIZE:
        raise WireError(f"the secret is {SECRET_SIZE} bytes, got {len(secret)}")
    return _REQUEST.pack(MAGIC, int(Op(op)), region, offset, length, secret)


def decode_request(data: bytes | bytearray | memoryview) -> Request:
    """Decode a ``REQUEST_SIZE``-byte header."""
    if len(data) != REQUEST_SIZE:
        raise WireError(f"a request header is {REQUEST_SIZE} bytes, got {len(data)}")
    magic, op, region, offset, length, secret = _REQUEST.unpack(data)
    if magic != MAGIC:
        raise WireError(f"not a monarch.rdma data connection (magic {bytes(magic)!r})")
    try:
        kind = Op(op)
    except ValueError:
        raise WireError(f"unknown request op {op}") from None
    if kind is Op.DROP and (offset or length):
        raise WireError("a drop request carries no range")
    return Request(kind, region, offset, length, bytes(secret))


def encode_ok(length: int = 0) -> bytes:
    """A success reply head; ``length`` bytes of read data follow it."""
    if not 0 <= length <= _U64:
        raise WireError(f"reply length {length} out of range")
    return _REPLY.pack(_OK, length)


def encode_error(message: str) -> bytes:
    """A failure reply: head and message (cut to ``MAX_MESSAGE`` bytes)."""
    body = message.encode("utf-8", "replace")[:MAX_MESSAGE]
    return _REPLY.pack(_ERROR, len(body)) + body


def decode_reply(data: bytes | bytearray | memoryview) -> Reply:
    """Decode a ``REPLY_SIZE``-byte reply head."""
    if len(data) != REPLY_SIZE:
        raise WireError(f"a reply head is {REPLY_SIZE} bytes, got {len(data)}")
    status, length = _REPLY.unpack(data)
    if status == _OK:
        return Reply(True, length)
    if status == _ERROR:
        if length > MAX_MESSAGE:
            raise WireError(f"an error message of {length} bytes (at most {MAX_MESSAGE})")
        return Reply(False, length)
    raise WireError(f"unknown reply status {status}")
