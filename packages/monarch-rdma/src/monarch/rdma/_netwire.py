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
    "SEAL_HEAD_SIZE",
    "SEAL_HELLO_SIZE",
    "SEAL_KEY_SIZE",
    "SEAL_MAGIC",
    "SEAL_MAX_RECORD",
    "SEAL_PREFIX_SIZE",
    "SEAL_TAG_SIZE",
    "SEAL_VERSION",
    "SECRET_SIZE",
    "Op",
    "Reply",
    "Request",
    "SealHello",
    "WireError",
    "decode_reply",
    "decode_request",
    "decode_seal_head",
    "decode_seal_hello",
    "encode_error",
    "encode_ok",
    "encode_request",
    "encode_seal_head",
    "encode_seal_hello",
    "seal_aad",
    "seal_nonce",
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


# -- the sealed record layer of the TLS data lane (version 1) ------------------------------------
#
# A TLS data connection starts as TLS 1.3 (the owner's certificate pinned by the connecting side)
# and carries exactly two TLS application messages, one each way: ``SEAL_HELLO`` (``"MRNS"``,
# the version, the sender's fresh AES-256-GCM key for what it will send and a 4-byte nonce
# prefix). The TLS session then ends without further records (the owner sends no session
# tickets) and the same TCP connection carries *sealed records* both ways, each
#
#     version (1 byte) | reserved (3 bytes, zero) | length (u32) || ciphertext (length) | tag (16)
#
# sealed with the key of its direction: nonce = prefix (4) | record number (u64, from 0, never
# sent), associated data = the 8-byte head | record number (u64) | stream offset (u64, the
# bytes of plaintext sent before this record on this direction). So a record cannot be
# reordered, replayed, dropped (the next one fails), moved to another connection or
# direction (another key), nor its length or place changed. The plaintext stream they carry is
# the lanes' protocol above (request headers, reply heads, data), byte for byte.

SEAL_MAGIC: Final = b"MRNS"
SEAL_VERSION: Final = 1
SEAL_KEY_SIZE: Final = 32
SEAL_PREFIX_SIZE: Final = 4
SEAL_TAG_SIZE: Final = 16
#: The largest plaintext of one sealed record.
SEAL_MAX_RECORD: Final = 256 << 10
_HELLO: Final = struct.Struct(">4sB32s4s")
_SEAL_HEAD: Final = struct.Struct(">B3xI")
_SEAL_AAD: Final = struct.Struct(">B3xIQQ")
_NONCE: Final = struct.Struct(">4sQ")
SEAL_HELLO_SIZE: Final = _HELLO.size
SEAL_HEAD_SIZE: Final = _SEAL_HEAD.size


@dataclass(frozen=True, slots=True)
class SealHello:
    """One side's key and nonce prefix for the records it sends."""

    key: bytes
    prefix: bytes


def encode_seal_hello(hello: SealHello) -> bytes:
    """The hello message (sent inside TLS)."""
    if len(hello.key) != SEAL_KEY_SIZE or len(hello.prefix) != SEAL_PREFIX_SIZE:
        raise WireError("a seal hello carries a 32-byte key and a 4-byte nonce prefix")
    return _HELLO.pack(SEAL_MAGIC, SEAL_VERSION, hello.key, hello.prefix)


def decode_seal_hello(data: bytes | bytearray | memoryview) -> SealHello:
    """Decode a hello (``WireError`` for another length, magic or version)."""
    if len(data) != SEAL_HELLO_SIZE:
        raise WireError(f"a seal hello is {SEAL_HELLO_SIZE} bytes, got {len(data)}")
    magic, version, key, prefix = _HELLO.unpack(data)
    if magic != SEAL_MAGIC:
        raise WireError(f"not a monarch.rdma sealed lane (magic {bytes(magic)!r})")
    if version != SEAL_VERSION:
        raise WireError(f"sealed lane version {version}; this side speaks {SEAL_VERSION}")
    return SealHello(bytes(key), bytes(prefix))


def encode_seal_head(length: int) -> bytes:
    """The clear head of a record of ``length`` plaintext bytes."""
    if not 0 < length <= SEAL_MAX_RECORD:
        raise WireError(f"a sealed record holds 1 to {SEAL_MAX_RECORD} bytes, not {length}")
    return _SEAL_HEAD.pack(SEAL_VERSION, length)


def decode_seal_head(data: bytes | bytearray | memoryview) -> int:
    """The plaintext length a record head announces (``WireError`` when malformed)."""
    if len(data) != SEAL_HEAD_SIZE:
        raise WireError(f"a sealed record head is {SEAL_HEAD_SIZE} bytes, got {len(data)}")
    version, length = _SEAL_HEAD.unpack(data)
    if version != SEAL_VERSION or bytes(data[1:4]) != b"\0\0\0":
        raise WireError(f"a sealed record head of version {version} (expected {SEAL_VERSION})")
    if not 0 < length <= SEAL_MAX_RECORD:
        raise WireError(f"a sealed record of {length} bytes (1 to {SEAL_MAX_RECORD})")
    return int(length)


def seal_nonce(prefix: bytes, number: int) -> bytes:
    """The nonce of record ``number`` (unique per key: a connection's records are counted)."""
    return _NONCE.pack(prefix, number)


def seal_aad(length: int, number: int, offset: int) -> bytes:
    """The associated data of record ``number`` of ``length`` bytes at stream ``offset``."""
    return _SEAL_AAD.pack(SEAL_VERSION, length, number, offset)
