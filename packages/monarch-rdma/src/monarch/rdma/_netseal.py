"""The TLS data lane's bulk path: TLS 1.3 authenticates and keys, AES-256-GCM records carry.

Why: Python's ``ssl`` on a socket returns one 16 KiB TLS record per ``recv_into`` (an
``SSL_read`` with its system calls per record, about 4,100 per 64 MiB), which held the TLS lane
to 590-880 MB/s here while AES-256-GCM runs at 5-13 GB/s on one core. So a TLS data connection
uses TLS 1.3 only to authenticate the owner (its certificate pinned by the connecting side)
and to exchange one fresh AES-256-GCM key and nonce prefix per direction (``_netwire``'s
``SealHello``, inside TLS); then the same TCP connection carries records of up to
``SEAL_MAX_RECORD`` (256 KiB) sealed with ``cryptography``'s ``AESGCM`` (which releases the
GIL): two ``recv_into`` per record (head, then body) and one ``decrypt_into``, 256 records per
64 MiB instead of 4,100. The record
layout, nonces and associated data are ``_netwire``'s (version 1).

A record's plaintext is verified before any of it reaches the caller's memory: it is decrypted
into a buffer of the stream and copied out only when its tag checked, so a tampered record
writes nothing into a destination (AES-GCM is a stream cipher: decrypting a forged record in
place would flip the bits an attacker chose before the tag failed). A record that fails is a
``WireError`` and the connection is unusable from then on (the lane closes it). Memory: three
buffers of a record each per connection (768 KiB), nothing else.

``SealedStream`` offers the subset of a socket's interface the lanes use (``sendall``,
``recv_into``, ``settimeout``, ``close``; ``raw`` is the TCP socket, which a cancellation shuts
down), so the lanes' request/reply protocol runs over it unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import ssl
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from monarch.rdma._netwire import (
    SEAL_HEAD_SIZE,
    SEAL_HELLO_SIZE,
    SEAL_KEY_SIZE,
    SEAL_MAX_RECORD,
    SEAL_PREFIX_SIZE,
    SEAL_TAG_SIZE,
    SealHello,
    WireError,
    decode_seal_head,
    decode_seal_hello,
    encode_seal_head,
    encode_seal_hello,
    seal_aad,
    seal_nonce,
)

__all__ = ["SealedStream", "TruncatedRecord", "client_handshake", "server_handshake"]

_HANDSHAKE_READ: Final = 16384
#: Records one direction may seal with one key (nonces never repeat; far beyond any transfer).
_MAX_RECORDS: Final = (1 << 64) - 1


class TruncatedRecord(WireError):
    """The connection ended inside a sealed record (cut, or the peer died mid-send)."""


def _flush(raw: socket.socket, outgoing: ssl.MemoryBIO) -> None:
    data = outgoing.read()
    if data:
        raw.sendall(data)


def _drive(raw: socket.socket, obj: ssl.SSLObject, incoming: ssl.MemoryBIO,
           outgoing: ssl.MemoryBIO) -> None:  # fmt: skip
    while True:
        try:
            obj.do_handshake()
        except ssl.SSLWantReadError:
            _flush(raw, outgoing)
            _feed(raw, incoming)
        else:
            _flush(raw, outgoing)
            return


def _feed(raw: socket.socket, incoming: ssl.MemoryBIO) -> None:
    data = raw.recv(_HANDSHAKE_READ)
    if not data:
        raise ConnectionResetError("the peer closed the connection during the TLS handshake")
    incoming.write(data)


def _read_hello(raw: socket.socket, obj: ssl.SSLObject, incoming: ssl.MemoryBIO) -> SealHello:
    got = bytearray()
    while len(got) < SEAL_HELLO_SIZE:
        try:
            piece = obj.read(SEAL_HELLO_SIZE - len(got))
        except ssl.SSLWantReadError:
            _feed(raw, incoming)
            continue
        if not piece:
            raise ConnectionResetError("the peer ended TLS before its seal hello")
        got += piece
    if incoming.pending:  # the peer sends nothing more in TLS: the records follow in the clear
        raise WireError("TLS bytes after the seal hello")
    return decode_seal_hello(got)


def _fresh() -> SealHello:
    return SealHello(secrets.token_bytes(SEAL_KEY_SIZE), secrets.token_bytes(SEAL_PREFIX_SIZE))


def client_handshake(raw: socket.socket, context: ssl.SSLContext,
                     fingerprint: bytes) -> SealedStream:  # fmt: skip
    """TLS 1.3 over ``raw``; the owner's certificate must hash (SHA-256) to ``fingerprint``
    (``ssl.SSLError`` otherwise, before anything is sent); then the hellos."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_side=False)
    _drive(raw, obj, incoming, outgoing)
    der = obj.getpeercert(binary_form=True) or b""
    if not hmac.compare_digest(hashlib.sha256(der).digest(), fingerprint):
        raise ssl.SSLError("the owner's TLS certificate is not the one in its key")
    mine = _fresh()
    obj.write(encode_seal_hello(mine))
    _flush(raw, outgoing)
    return SealedStream(raw, mine, _read_hello(raw, obj, incoming))


def server_handshake(raw: socket.socket, context: ssl.SSLContext) -> SealedStream:
    """The owner's side of ``client_handshake`` (``context`` must send no session tickets)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_side=True)
    _drive(raw, obj, incoming, outgoing)
    theirs = _read_hello(raw, obj, incoming)
    mine = _fresh()
    obj.write(encode_seal_hello(mine))
    _flush(raw, outgoing)
    return SealedStream(raw, mine, theirs)


class SealedStream:
    """A byte stream of sealed records over ``raw`` (module docstring). ``send`` seals what this
    side sends, ``receive`` opens what the peer sends; ``record`` is the largest plaintext of a
    record this side seals. Not thread-safe: one connection, one thread at a time."""

    __slots__ = (
        "_cipher_in",
        "_in_number",
        "_in_offset",
        "_in_prefix",
        "_open",
        "_out",
        "_out_number",
        "_out_offset",
        "_out_prefix",
        "_plain",
        "_plain_end",
        "_plain_start",
        "_record",
        "_seal",
        "_stage",
        "raw",
    )

    def __init__(self, raw: socket.socket, send: SealHello, receive: SealHello,
                 record: int = SEAL_MAX_RECORD) -> None:  # fmt: skip
        if not 0 < record <= SEAL_MAX_RECORD:
            raise ValueError(f"a record holds 1 to {SEAL_MAX_RECORD} bytes, not {record}")
        self.raw = raw
        self._record = record
        self._seal = AESGCM(send.key)
        self._out_prefix = send.prefix
        self._out_number = self._out_offset = 0
        self._open = AESGCM(receive.key)
        self._in_prefix = receive.prefix
        self._in_number = self._in_offset = 0
        self._out = bytearray(SEAL_HEAD_SIZE + record + SEAL_TAG_SIZE)
        self._stage = bytearray(SEAL_MAX_RECORD + SEAL_TAG_SIZE)  # a received record, sealed
        self._cipher_in = memoryview(self._stage)
        self._plain = bytearray(SEAL_MAX_RECORD)  # ... and opened (verified)
        self._plain_start = self._plain_end = 0

    def settimeout(self, timeout: float | None) -> None:
        self.raw.settimeout(timeout)

    def close(self) -> None:
        self.raw.close()

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Seal ``data`` into records and send them."""
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        out = memoryview(self._out)
        total = view.nbytes
        for start in range(0, total, self._record):
            length = min(self._record, total - start)
            if self._out_number >= _MAX_RECORDS:
                raise WireError("this connection sealed all the records one key may seal")
            out[:SEAL_HEAD_SIZE] = encode_seal_head(length)
            end = SEAL_HEAD_SIZE + length + SEAL_TAG_SIZE
            self._seal.encrypt_into(
                seal_nonce(self._out_prefix, self._out_number),
                view[start : start + length],
                seal_aad(length, self._out_number, self._out_offset),
                out[SEAL_HEAD_SIZE:end],
            )
            self._out_number += 1
            self._out_offset += length
            self.raw.sendall(out[:end])

    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0) -> int:
        """Up to ``nbytes`` (all of ``buffer`` when 0) verified bytes into ``buffer``; 0 when the
        peer closed the connection between records. ``WireError`` for a record that fails its
        tag or is malformed (nothing of it is copied), ``TruncatedRecord`` for one cut short."""
        view = memoryview(buffer)
        wanted = nbytes or view.nbytes
        if wanted <= 0:
            return 0
        if self._plain_start == self._plain_end:
            length = self._next_record()
            if length == 0:
                return 0
            try:
                self._open.decrypt_into(
                    seal_nonce(self._in_prefix, self._in_number),
                    self._cipher_in[: length + SEAL_TAG_SIZE],
                    seal_aad(length, self._in_number, self._in_offset),
                    memoryview(self._plain)[:length],
                )
            except InvalidTag:
                raise WireError(
                    f"sealed record {self._in_number} failed authentication (tampered, "
                    "replayed or out of order): the connection is closed"
                ) from None
            self._in_number += 1
            self._in_offset += length
            self._plain_start, self._plain_end = 0, length
        k = min(wanted, self._plain_end - self._plain_start)
        view[:k] = memoryview(self._plain)[self._plain_start : self._plain_start + k]
        self._plain_start += k
        return k

    def _next_record(self) -> int:
        """Receive one whole sealed record into the stage; its plaintext length (0: clean end)."""
        head = bytearray(SEAL_HEAD_SIZE)
        got = self._fill(memoryview(head), allow_end=True)
        if got == 0:
            return 0
        length = decode_seal_head(head)
        self._fill(self._cipher_in[: length + SEAL_TAG_SIZE], allow_end=False)
        return length

    def _fill(self, view: memoryview, allow_end: bool) -> int:
        got, n = 0, view.nbytes
        while got < n:
            k = self.raw.recv_into(view[got:], n - got)
            if k == 0:
                if got == 0 and allow_end:
                    return 0
                raise TruncatedRecord("the connection ended inside a sealed record")
            got += k
        return got
