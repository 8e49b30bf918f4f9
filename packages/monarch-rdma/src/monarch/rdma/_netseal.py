"""The TLS data lane's bulk path: TLS 1.3 authenticates and keys, AES-256-GCM records carry.

Why: Python's ``ssl`` on a socket returns one 16 KiB TLS record per ``recv_into`` (an
``SSL_read`` with its system calls per record, about 4,100 per 64 MiB), which held the TLS lane
to 590-880 MB/s here while AES-256-GCM runs at 5-13 GB/s on one core. So a TLS data connection
uses TLS 1.3 only to authenticate the owner (its certificate pinned by the connecting side)
and to exchange one fresh AES-256-GCM key and nonce prefix per direction (``_netwire``'s
``SealHello``, inside TLS); then the same TCP connection carries records of up to
``SEAL_MAX_RECORD`` (256 KiB) sealed with ``cryptography``'s ``AESGCM`` (which releases the
GIL; its ``encrypt_into``/``decrypt_into`` need ``cryptography`` 47 or later): 256 records per
64 MiB instead of 4,100. The record layout, nonces and associated data are ``_netwire``'s
(version 1).

Per record, as few steps as the format allows: the receiver reads a record's rest together
with the next record's head when it has come (``recv_into`` for at most a head's 8 bytes beyond
the record, so nothing else is ever carried over), so back-to-back records cost one
``recv_into`` each, not a head's and then the body's; a small head that precedes data (a
read's reply head, a write's request header) is still a record of its own but leaves in the
same ``sendall`` as the data's first record (``send_headed``); the socket's timeout is set only
when it changes (each ``settimeout`` is a system call), so nothing else may change the raw
socket's timeout once a stream wraps it.

A record's plaintext is verified before any of it reaches the caller's memory: it is decrypted
in place in the stream's receive buffer and copied out only when its tag checked, so a
tampered record writes nothing into a destination (AES-GCM is a stream cipher:
``decrypt_into`` a destination leaves there the forged plaintext, bits an attacker chose, when
the tag fails; checked with ``cryptography`` 50). A record that fails is a ``WireError`` and
the connection is unusable from then on (the lane closes it): any exception out of the receive or
the send path (a forged record, a timeout or a cut mid-record, a failed send) leaves the stream
out of step with the peer, so every later ``recv_into``/``sendall`` raises a ``WireError`` at
once, without touching the socket. Memory: two buffers of a record
each per connection (about 516 KiB), nothing else.

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

__all__ = [
    "SEAL_HEADED",
    "SealedStream",
    "TruncatedRecord",
    "client_handshake",
    "server_handshake",
]

_HANDSHAKE_READ: Final = 16384
#: Records one direction may seal with one key (nonces never repeat; far beyond any transfer).
_MAX_RECORDS: Final = (1 << 64) - 1
#: The largest head ``SealedStream.send_headed`` seals into a record of its own in front of the
#: data (64 pipelined request headers); a larger one is sent as records of its own.
SEAL_HEADED: Final = 4096
_HEADED: Final = SEAL_HEAD_SIZE + SEAL_HEADED + SEAL_TAG_SIZE
#: The fewest bytes of a record: its head, a byte of plaintext and the tag.
_SMALLEST: Final = SEAL_HEAD_SIZE + 1 + SEAL_TAG_SIZE
#: The plaintext of the records this side seals (at most ``SEAL_MAX_RECORD``, what a peer takes).
_RECORD = SEAL_MAX_RECORD


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
    return SealedStream(raw, mine, _read_hello(raw, obj, incoming), _RECORD)


def server_handshake(raw: socket.socket, context: ssl.SSLContext) -> SealedStream:
    """The owner's side of ``client_handshake`` (``context`` must send no session tickets)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_side=True)
    _drive(raw, obj, incoming, outgoing)
    theirs = _read_hello(raw, obj, incoming)
    mine = _fresh()
    obj.write(encode_seal_hello(mine))
    _flush(raw, outgoing)
    return SealedStream(raw, mine, theirs, _RECORD)


class SealedStream:
    """A byte stream of sealed records over ``raw`` (module docstring). ``send`` seals what this
    side sends, ``receive`` opens what the peer sends; ``record`` is the largest plaintext of a
    record this side seals. Not thread-safe: one connection, one thread at a time."""

    __slots__ = (
        "_ahead",
        "_broken",
        "_cipher_in",
        "_in_number",
        "_in_offset",
        "_in_prefix",
        "_open",
        "_out",
        "_out_number",
        "_out_offset",
        "_out_prefix",
        "_plain_end",
        "_plain_start",
        "_plain_view",
        "_record",
        "_seal",
        "_stage",
        "_timeout",
        "raw",
    )

    def __init__(self, raw: socket.socket, send: SealHello, receive: SealHello,
                 record: int = SEAL_MAX_RECORD) -> None:  # fmt: skip
        if not 0 < record <= SEAL_MAX_RECORD:
            raise ValueError(f"a record holds 1 to {SEAL_MAX_RECORD} bytes, not {record}")
        # The stream caches the timeout it set on ``raw`` (``settimeout``): once wrapped, ``raw``'s
        # timeout (``settimeout``/``setblocking``) must change only through this stream. What
        # else may be done to it: ``shutdown`` (a cancellation) and ``close``.
        self.raw = raw
        self._record = record
        #: Why the stream is out of step with its peer (an exception left the receive or the
        #: send path); None while it is usable.
        self._broken: str | None = None
        self._timeout: float | None = -1.0  # not set through this stream yet
        self._seal = AESGCM(send.key)
        self._out_prefix = send.prefix
        self._out_number = self._out_offset = 0
        self._open = AESGCM(receive.key)
        self._in_prefix = receive.prefix
        self._in_number = self._in_offset = 0
        # What this side seals: room for one small record (a request or reply head) right
        # before a whole one, so the two leave in one system call (``send_headed``).
        self._out = bytearray(_HEADED + SEAL_HEAD_SIZE + record + SEAL_TAG_SIZE)
        # A received record (head, ciphertext and tag) and up to a head's bytes of the next one
        # read with it (``_ahead`` of them, moved to the front once it is opened). A record is
        # opened in place: its plaintext replaces its ciphertext here, and is copied out only
        # once its tag checked.
        self._stage = bytearray(2 * SEAL_HEAD_SIZE + SEAL_MAX_RECORD + SEAL_TAG_SIZE)
        self._cipher_in = memoryview(self._stage)
        self._ahead = 0
        self._plain_view = self._cipher_in[SEAL_HEAD_SIZE:]
        self._plain_start = self._plain_end = 0

    def settimeout(self, timeout: float | None) -> None:
        if timeout != self._timeout:  # each call is a system call: only when it changes
            self.raw.settimeout(timeout)
            self._timeout = timeout

    def close(self) -> None:
        self.raw.close()

    def _unusable(self) -> WireError:
        return WireError(f"sealed stream unusable after an earlier failure: {self._broken}")

    def _fail(self, exc: BaseException) -> None:
        if self._broken is None:
            self._broken = f"{type(exc).__name__}: {exc}"

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Seal ``data`` into records and send them."""
        self.send_headed(b"", data)

    def send_headed(self, head: bytes | bytearray, data: bytes | bytearray | memoryview) -> None:
        """Seal and send ``head`` (at most ``SEAL_HEADED`` bytes; may be empty) then ``data``:
        the same plaintext stream as two ``sendall`` calls, but the head's record leaves in the
        same system call as the first record of ``data``."""
        if self._broken is not None:
            raise self._unusable()
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        try:
            self._send(head, view)
        except BaseException as exc:  # records may have left, or part of one: out of step
            self._fail(exc)
            raise

    def _send(self, head: bytes | bytearray, view: memoryview) -> None:
        out = memoryview(self._out)
        total = view.nbytes
        start = _HEADED  # where this system call's records begin in ``out``
        size = len(head)
        if size > SEAL_HEADED:  # records of its own
            self.send_headed(b"", head)
        elif size:
            start -= SEAL_HEAD_SIZE + size + SEAL_TAG_SIZE
            self._seal_one(head, size, out, start)
        if total == 0 and start < _HEADED:
            self.raw.sendall(out[start:_HEADED])
        record, offset = self._record, 0
        while offset < total:
            length = min(record, total - offset)
            end = self._seal_one(view[offset : offset + length], length, out, _HEADED)
            offset += length
            self.raw.sendall(out[start:end])
            start = _HEADED

    def _seal_one(self, plain: bytes | bytearray | memoryview, length: int, out: memoryview,
                  at: int) -> int:  # fmt: skip
        """Seal one record of ``length`` bytes into ``out`` at ``at``; where it ends there."""
        number = self._out_number
        if number >= _MAX_RECORDS:
            raise WireError("this connection sealed all the records one key may seal")
        body = at + SEAL_HEAD_SIZE
        end = body + length + SEAL_TAG_SIZE
        out[at:body] = encode_seal_head(length)
        self._seal.encrypt_into(
            seal_nonce(self._out_prefix, number),
            plain,
            seal_aad(length, number, self._out_offset),
            out[body:end],
        )
        self._out_number = number + 1
        self._out_offset += length
        return end

    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0) -> int:
        """Up to ``nbytes`` (all of ``buffer`` when 0) verified bytes into ``buffer``; 0 when the
        peer closed the connection between records. ``WireError`` for a record that fails its
        tag or is malformed (nothing of it is copied), ``TruncatedRecord`` for one cut short."""
        if self._broken is not None:
            raise self._unusable()
        view = memoryview(buffer)
        wanted = nbytes or view.nbytes
        if wanted <= 0:
            return 0
        start = self._plain_start
        if start == self._plain_end:
            try:
                length = self._open_next()
            except BaseException as exc:  # part of a record read, or one that failed: out of step
                self._fail(exc)
                raise
            if length == 0:
                return 0
            start = 0
        k = min(wanted, self._plain_end - start)
        view[:k] = self._plain_view[start : start + k]
        self._plain_start = start + k
        return k

    def _open_next(self) -> int:
        """Receive and open the next record (``_plain_view``); its length (0: a clean end).

        The record is opened in place: ``decrypt_into``'s output (``_plain_view[:length]``)
        aliases its input (``stage[SEAL_HEAD_SIZE:end]``) exactly, at the same address. That is
        what OpenSSL's GCM allows (in == out); an output shifted from its input by any other
        offset is not supported (``cryptography`` 50 fails it as ``InvalidTag``), so the two
        views must keep starting at the same byte (``test_decrypt_into_in_place``)."""
        stage = self._cipher_in
        have = self._ahead
        # The head, and what surely follows it (a record holds at least a byte and its tag).
        while have < SEAL_HEAD_SIZE:
            k = self.raw.recv_into(stage[have:_SMALLEST], _SMALLEST - have)
            if k == 0:
                if have == 0:
                    self._ahead = 0
                    return 0
                raise TruncatedRecord("the connection ended inside a sealed record")
            have += k
        length = decode_seal_head(stage[:SEAL_HEAD_SIZE])
        end = SEAL_HEAD_SIZE + length + SEAL_TAG_SIZE
        # The rest of the record, and at most the next record's head with it (never more, so
        # nothing but a head is ever carried over).
        while have < end:
            k = self.raw.recv_into(stage[have : end + SEAL_HEAD_SIZE], end + SEAL_HEAD_SIZE - have)
            if k == 0:
                raise TruncatedRecord("the connection ended inside a sealed record")
            have += k
        number = self._in_number
        try:
            self._open.decrypt_into(
                seal_nonce(self._in_prefix, number),
                stage[SEAL_HEAD_SIZE:end],
                seal_aad(length, number, self._in_offset),
                self._plain_view[:length],
            )
        except InvalidTag:
            raise WireError(
                f"sealed record {number} failed authentication (tampered, "
                "replayed or out of order): the connection is closed"
            ) from None
        self._ahead = have - end
        if self._ahead:
            stage[: self._ahead] = stage[end:have]
        self._in_number = number + 1
        self._in_offset += length
        self._plain_start, self._plain_end = 0, length
        return length
