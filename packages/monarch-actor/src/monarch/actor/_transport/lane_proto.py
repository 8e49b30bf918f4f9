"""Direct lanes, the sans-IO part: negotiation messages, proofs and the lane framing.

Why lanes: the universal path between two Monarch processes is a Chrysalis QUIC stream
(authenticated, routable through the namespace tree) but pure-Python QUIC costs about 1 ms per
round trip and moves tens of MB/s. Two processes that can reach each other directly negotiate,
over that stream, a *lane*: a Unix stream socket on one host, mutually authenticated TLS over TCP
across hosts. Everything here is pure (no sockets, no clock): the I/O lives in ``lane``.

Negotiation (sender A, receiver B, on A's envelope stream to B; the stream's otherwise unused
reverse direction carries B's answers). Control messages are frames whose 12-byte envelope
prefix has ``header_len == 0`` (never a valid envelope frame) and whose body is a msgpack
``Control`` value:

1. A writes ``Hello`` (its host key, a nonce, the lane kinds it accepts, and the optional
   features it understands, ``features``) right after the stream magic, and keeps sending
   envelopes on the stream meanwhile.
2. B answers ``Offer``: the lane kind (``unix`` when the host keys match, ``tcp`` otherwise, ``""``
   for none), where to connect, its own nonce and a single-use token.
3. A connects and proves its identity on the lane with ``Auth``: token, certificate chain and a
   signature of both nonces, both PIDs and the token under a context string (``proof_bytes``).
   B checks the token, verifies the chain against the cluster roots, that the leaf's PID is the
   stream's authenticated peer, and the signature, then proves itself the same way with the other
   context string. Over TCP the TLS handshake has already verified both certificates against the
   roots and the PIDs are taken from the TLS leaves; the ``Auth`` exchange then binds the lane to
   the negotiation (token) and repeats the proof.
4. A writes ``Switch`` on the QUIC stream after the last envelope it sent there and writes every
   later envelope on the lane. B reads nothing from the lane until its stream reader reached the
   ``Switch``: per-sender order holds across the change of path.

Lane frames: ``u8 type ('E') | u16 nshm | nshm x (u16 buffer index, u32 slot) | envelope frame``
where the envelope frame is the stream frame of ``_base.envelope``
(``u32 header_len | u64 body_len | header | inline buffers``) whose body holds only the buffers
that travel inline; the others arrive as descriptors (``shm``), in order, and the receiver
acknowledges their slot numbers. A frame of type ``'L'`` (only to a receiver that asked for
them, ``shm.PeerReader``) carries ``u64 address`` after each entry's slot instead: buffers lent
out of the sender's memory, no descriptors (``shm.LENT`` set in every slot number, and only
there). ``LaneDecoder`` reads frames with ``get_buffer``/
``buffer_updated`` (large buffers are received straight into their final ``bytearray``), takes
the shared-memory descriptors passed beside the bytes in order, and enforces the frame limits
before reserving memory.

Features (``Hello.features``, version 1 throughout): names of optional behaviour the sender
understands; a receiver uses one only where the sender named it and ignores names it does not
know. ``FEATURE_LEND``: the sender understands the receiver's request to lend (an
acknowledgement value, ``lane``) and lends its large ``bytes`` once asked, where its own
setting allows it (it names the feature only then). A receiver never sends that request to a
sender that did not name it. ``features`` is an optional trailing field of the array-encoded
``Hello``: the decoder of the first version-1 release (no such field) skips extra trailing
elements, so it accepts a ``Hello`` with features, and a ``Hello`` of that release (no
features) decodes here with ``features == ()``: no lending on that lane, slots as before.
(A ``Hello`` without features still ends with an empty list, skipped the same way.) At most 32
names; a longer list, or anything but strings, makes the ``Hello`` malformed. A later optional
field goes after ``features`` in the same way; no version change is needed for one.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import struct
from collections.abc import Sequence
from typing import Annotated, Any, Final

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa

from monarch.actor._base.codec import KIND_READONLY
from monarch.actor._base.envelope import FRAME_PREFIX, Envelope, FrameLimits, decode_header
from monarch.actor._base.errors import FrameError
from monarch.actor._transport.shm import LENT

__all__ = [
    "CONTEXT_ACCEPTOR",
    "CONTEXT_DIALER",
    "FEATURE_LEND",
    "LANE_TYPE_ENVELOPE",
    "LANE_TYPE_LENT",
    "MAX_CONTROL_BYTES",
    "Auth",
    "Control",
    "ControlSplitter",
    "Hello",
    "LaneDecoder",
    "Offer",
    "Refuse",
    "Switch",
    "decode_control",
    "encode_control",
    "encode_handshake",
    "host_key",
    "lane_prefix",
    "lent_prefix",
    "proof_bytes",
    "sign",
    "verify_signature",
]

#: Largest control message body (a certificate chain of a few kilobytes in practice).
MAX_CONTROL_BYTES: Final = 640 * 1024
LANE_TYPE_ENVELOPE: Final = 0x45  # "E"
LANE_TYPE_LENT: Final = 0x4C  # "L"
CONTEXT_DIALER: Final = b"monarch lane v1: dialer proof"
CONTEXT_ACCEPTOR: Final = b"monarch lane v1: acceptor proof"
_LANE_HEAD = struct.Struct(">BH")
_SHM_ENTRY = struct.Struct(">HI")
_LENT_ENTRY = struct.Struct(">HIQ")
_SLOT: Final = 0xFFFF_FFFF  # a slot number out of a decoder's shm value (lent: address above)
_PLAIN_HEAD = _LANE_HEAD.size + FRAME_PREFIX.size  # a lane frame's head without slots
_HANDSHAKE_PREFIX = struct.Struct(">I")
#: ``Hello.features``: the sender lends its large ``bytes`` when its receiver asks.
FEATURE_LEND: Final = "lend"
_DIRECT_MIN: Final = 64 * 1024

_Nonce = Annotated[bytes, msgspec.Meta(min_length=16, max_length=64)]
_Token = Annotated[bytes, msgspec.Meta(min_length=16, max_length=16)]
_Short = Annotated[str, msgspec.Meta(max_length=256)]


class Hello(msgspec.Struct, tag="hello", array_like=True, frozen=True):
    """A -> B on the stream: A's host key, nonce, the lane kinds it accepts and the features it
    understands (``FEATURE_LEND``; a trailing field with a default, which a version-1 peer
    without it skips and omits: module docstring)."""

    version: int
    host: Annotated[bytes, msgspec.Meta(max_length=128)]
    nonce: _Nonce
    kinds: Annotated[tuple[_Short, ...], msgspec.Meta(max_length=4)]
    features: Annotated[tuple[_Short, ...], msgspec.Meta(max_length=32)] = ()


class Offer(msgspec.Struct, tag="offer", array_like=True, frozen=True):
    """B -> A on the stream's reverse direction: the lane to dial (``kind == ""``: none)."""

    kind: _Short
    address: _Short
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)]
    nonce: _Nonce
    token: _Token


class Switch(msgspec.Struct, tag="switch", array_like=True, frozen=True):
    """A -> B on the stream: nothing more on this stream; continue on lane ``token``."""

    token: _Token


class Auth(msgspec.Struct, tag="auth", array_like=True, frozen=True):
    """Either way on the lane: token, certificate chain (leaf first, DER), signature."""

    token: _Token
    chain: Annotated[
        tuple[Annotated[bytes, msgspec.Meta(max_length=64 * 1024)], ...],
        msgspec.Meta(min_length=1, max_length=8),
    ]
    signature: Annotated[bytes, msgspec.Meta(max_length=2048)]


class Refuse(msgspec.Struct, tag="refuse", array_like=True, frozen=True):
    """On the lane: the handshake failed, and why."""

    reason: Annotated[str, msgspec.Meta(max_length=1024)]


Control = Hello | Offer | Switch | Auth | Refuse
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Control)


def encode_control(message: Control) -> bytes:
    """A control frame for the envelope stream (12-byte prefix with ``header_len == 0``)."""
    body = _ENCODER.encode(message)
    return FRAME_PREFIX.pack(0, len(body)) + body


def encode_handshake(message: Control) -> bytes:
    """A handshake message on a lane: ``u32 length | msgpack``."""
    body = _ENCODER.encode(message)
    return _HANDSHAKE_PREFIX.pack(len(body)) + body


def decode_control(body: bytes | memoryview) -> Control:
    """Decode one control body; ``FrameError`` when malformed."""
    try:
        return _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError(f"malformed lane control message: {exc}") from None


def handshake_length(prefix: bytes) -> int:
    """Body length announced by a 4-byte handshake prefix (bounded)."""
    (length,) = _HANDSHAKE_PREFIX.unpack(prefix)
    if not 0 < length <= MAX_CONTROL_BYTES:
        raise FrameError(f"lane handshake message of {length} bytes")
    return int(length)


def host_key() -> bytes:
    """What two processes share exactly when a Unix lane can join them: boot id plus network
    namespace (abstract Unix sockets are per network namespace)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as handle:
            boot = handle.read(64).strip()
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return b""
    return hashlib.sha256(boot + b"/" + str(netns).encode()).digest()


def proof_bytes(
    context: bytes, dialer_nonce: bytes, acceptor_nonce: bytes, dialer: bytes, acceptor: bytes,
    token: bytes,
) -> bytes:  # fmt: skip
    """What a lane proof signs: context, both nonces, both PIDs (dialer first) and the token."""
    parts = (context, dialer_nonce, acceptor_nonce, dialer, acceptor, token)
    return b"".join(len(p).to_bytes(2, "big") + p for p in parts)


def sign(private_key: Any, data: bytes) -> bytes:
    """Sign ``data`` with a leaf key (ECDSA/SHA-256, RSA-PSS/SHA-256, Ed25519, Ed448)."""
    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        return private_key.sign(data, ec.ECDSA(hashes.SHA256()))
    if isinstance(private_key, rsa.RSAPrivateKey):
        return private_key.sign(data, _pss(), hashes.SHA256())
    if isinstance(private_key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return private_key.sign(data)
    raise TypeError(f"cannot sign with a {type(private_key).__name__}")


def _pss() -> padding.PSS:
    return padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


def verify_signature(public_key: Any, signature: bytes, data: bytes) -> None:
    """``FrameError`` unless ``signature`` is ``data`` signed by ``public_key``'s private key."""
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, data, _pss(), hashes.SHA256())
        elif isinstance(public_key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
            public_key.verify(signature, data)
        else:
            raise FrameError(f"unsupported leaf key type {type(public_key).__name__}")
    except InvalidSignature:
        raise FrameError("the lane proof's signature does not verify") from None


class ControlSplitter:
    """Separates control frames from envelope frames on an envelope stream.

    ``feed(data)`` returns what became complete, in stream order: ``Control`` values and
    ``(Envelope, buffers)`` pairs. Envelope frames pass straight through to ``decoder`` (a
    ``FrameDecoder``, which enforces the frame limits), so an envelope's bytes are copied no more
    than before. Without a decoder any envelope frame is a ``FrameError``.
    """

    __slots__ = ("_decoder", "_passthrough", "_pending")

    def __init__(self, decoder: Any = None) -> None:
        self._decoder = decoder
        self._pending = bytearray()
        self._passthrough = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        out: list[Any] = []
        view = memoryview(data)
        pos, size = 0, view.nbytes
        while pos < size:
            if self._passthrough:
                n = min(self._passthrough, size - pos)
                self._decoder.receive_data(view[pos : pos + n])
                pos += n
                self._passthrough -= n
                while (message := self._decoder.next_message()) is not None:
                    out.append(message)
                continue
            pending = self._pending
            if len(pending) < FRAME_PREFIX.size:
                take = min(FRAME_PREFIX.size - len(pending), size - pos)
                pending += view[pos : pos + take]
                pos += take
                if len(pending) < FRAME_PREFIX.size:
                    break
            header_len, body_len = FRAME_PREFIX.unpack_from(pending)
            if header_len == 0:
                if body_len == 0 or body_len > MAX_CONTROL_BYTES:
                    raise FrameError(f"control frame of {body_len} bytes")
                take = min(FRAME_PREFIX.size + body_len - len(pending), size - pos)
                pending += view[pos : pos + take]
                pos += take
                if len(pending) == FRAME_PREFIX.size + body_len:
                    out.append(decode_control(bytes(pending[FRAME_PREFIX.size :])))
                    pending.clear()
                continue
            if self._decoder is None:
                raise FrameError("an envelope frame where only control frames may appear")
            self._passthrough = FRAME_PREFIX.size + header_len + body_len
            self._decoder.receive_data(pending)
            self._passthrough -= len(pending)
            pending.clear()
            while (message := self._decoder.next_message()) is not None:
                out.append(message)
        return out


def lane_prefix(shm: Sequence[tuple[int, int]]) -> bytes:
    """The lane-specific head of a frame: type and the ``(buffer index, slot)`` of each buffer
    that travels as a descriptor."""
    head = _LANE_HEAD.pack(LANE_TYPE_ENVELOPE, len(shm))
    for index, slot in shm:
        head += _SHM_ENTRY.pack(index, slot)
    return head


def lent_prefix(lent: Sequence[tuple[int, int, int]]) -> bytes:
    """The head of a frame whose large buffers are lent: type and the ``(buffer index, slot,
    address)`` of each."""
    head = _LANE_HEAD.pack(LANE_TYPE_LENT, len(lent))
    for index, slot, address in lent:
        head += _LENT_ENTRY.pack(index, slot, address)
    return head


class LaneDecoder:
    """Bytes (and passed descriptors) in, ``(Envelope, buffers, shm)`` out, for one lane.

    Use: ``view = get_buffer()``, receive into it, ``buffer_updated(n)``; descriptors received
    beside the bytes go to ``add_fds`` in arrival order; then ``next_message()`` until ``None``.
    ``shm`` lists ``(index, fd, size, slot)`` for the buffers of the message that arrived as
    descriptors (the caller reads them, owns the descriptors and acknowledges the slots), or,
    with ``lent`` (``accept_lent``), were lent: ``(index, address, size, slot)``, ``shm.LENT``
    set in the slot number and no descriptor. Any
    violation raises ``FrameError`` and the decoder stays failed; ``close()`` closes the
    descriptors it still holds.
    """

    __slots__ = (
        "_buf",
        "_dest",
        "_dest_index",
        "_dest_pos",
        "_direct",
        "_end",
        "_error",
        "_fds",
        "_frame",
        "_lent",
        "_limits",
        "_max_fds",
        "_start",
        "_view",
    )

    def __init__(self, limits: FrameLimits, max_fds: int = 1024, chunk: int = 256 * 1024) -> None:
        self._limits = limits
        self._max_fds = max_fds
        self._buf = bytearray(chunk)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._fds: collections.deque[int] = collections.deque()
        self._error: FrameError | None = None
        # A frame being filled in place: (shm indexes, header_len, body_len, header or envelope).
        self._frame: list[Any] | None = None
        self._dest: list[bytearray] = []
        self._dest_index = 0
        self._dest_pos = 0
        self._direct = False
        self._lent = False

    def accept_lent(self) -> None:
        """Accept frames of lent buffers from now on (the lane can read them)."""
        self._lent = True

    @property
    def pending_fds(self) -> int:
        """Descriptors received and not yet claimed by a frame."""
        return len(self._fds)

    def _fail(self, message: str) -> FrameError:
        self._error = FrameError(message)
        return self._error

    def add_fds(self, fds: Sequence[int]) -> None:
        """Descriptors that arrived with the bytes (owned by the decoder from now on)."""
        self._fds.extend(fds)
        if len(self._fds) > self._max_fds:
            raise self._fail(f"more than {self._max_fds} shared-memory descriptors in flight")

    def close(self) -> None:
        """Close every descriptor still held (idempotent)."""
        while self._fds:
            with contextlib.suppress(OSError):
                os.close(self._fds.popleft())

    def get_buffer(self) -> memoryview:
        """Where to receive the next bytes (non-empty)."""
        if self._error is not None:
            raise self._error
        self._direct = False
        if (
            self._frame is not None
            and self._start == self._end
            and self._dest_index < len(self._dest)
        ):
            dest = self._dest[self._dest_index]
            if len(dest) - self._dest_pos >= _DIRECT_MIN:
                self._direct = True
                return memoryview(dest)[self._dest_pos :]
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buf) - self._end < _DIRECT_MIN:
            # Move the unparsed tail to the front (it is shorter than one frame prefix plus a
            # header, or we are filling a destination and it is about to be consumed).
            tail = self._end - self._start
            self._view[:tail] = self._view[self._start : self._end]
            self._start, self._end = 0, tail
            if self._end == len(self._buf):  # a header longer than the chunk: grow
                self._buf.extend(bytes(len(self._buf)))
                self._view.release()
                self._view = memoryview(self._buf)
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        """``nbytes`` were written into the last ``get_buffer`` view."""
        if self._direct:
            self._dest_pos += nbytes
        else:
            self._end += nbytes

    def next_message(self) -> tuple[Envelope, list[Any], list[tuple[int, int, int, int]]] | None:
        """The next complete message or ``None`` (needs more bytes)."""
        if self._error is not None:
            raise self._error
        try:
            if self._frame is None:
                # nothing buffered (after the last message of a read): no parse call
                return self._parse_frame() if self._end - self._start >= 3 else None
            return self._fill()
        except FrameError as exc:
            self._error = exc
            raise

    def _parse_frame(self) -> tuple[Envelope, list[Any], list[tuple[int, int, int, int]]] | None:
        avail = self._end - self._start
        if avail < 3:
            return None
        start = self._start
        kind, nshm = _LANE_HEAD.unpack_from(self._buf, start)
        entry = _SHM_ENTRY
        if kind != LANE_TYPE_ENVELOPE:
            if kind != LANE_TYPE_LENT or not self._lent:
                raise FrameError(f"unknown lane frame type {kind}")
            entry = _LENT_ENTRY
        if not nshm and avail >= _PLAIN_HEAD:
            # The common small message (a call, a reply): no slots, no body, all here. Anything
            # else, or anything wrong, takes the full path below, which checks and reports it.
            header_len, body_len = FRAME_PREFIX.unpack_from(self._buf, start + 3)
            if (
                header_len
                and not body_len
                and avail >= _PLAIN_HEAD + header_len
                and FRAME_PREFIX.size + header_len <= self._limits.max_frame_bytes
            ):
                h0 = start + _PLAIN_HEAD
                envelope = decode_header(self._view[h0 : h0 + header_len], self._limits.max_buffers)
                if not envelope.buffer_sizes:
                    self._start = h0 + header_len
                    return envelope, [], []
        if nshm > self._limits.max_buffers:
            raise FrameError(f"frame claims {nshm} shared-memory buffers")
        head = 3 + entry.size * nshm + FRAME_PREFIX.size
        if avail < head:
            return None
        # index -> slot, or for a lent buffer slot | address << 32 (claimed without a descriptor)
        shm: dict[int, int] = {}
        for i in range(nshm):
            if entry is _SHM_ENTRY:
                index, slot = _SHM_ENTRY.unpack_from(self._buf, start + 3 + _SHM_ENTRY.size * i)
                if slot & LENT:
                    raise FrameError(f"a descriptor's slot number {slot:#x} says lent")
                shm[index] = slot
            else:
                index, slot, address = _LENT_ENTRY.unpack_from(
                    self._buf, start + 3 + _LENT_ENTRY.size * i
                )
                if not slot & LENT or not address:
                    raise FrameError(f"a lent buffer with slot {slot:#x} at {address:#x}")
                shm[index] = slot | address << 32
        if len(shm) != nshm:
            raise FrameError("a frame names one shared-memory buffer twice")
        header_len, body_len = FRAME_PREFIX.unpack_from(self._buf, start + 3 + entry.size * nshm)
        if header_len == 0:
            raise FrameError("frame has an empty header")
        if FRAME_PREFIX.size + header_len + body_len > self._limits.max_frame_bytes:
            raise FrameError(
                f"frame of {FRAME_PREFIX.size + header_len + body_len} bytes exceeds the limit "
                f"of {self._limits.max_frame_bytes}"
            )
        if avail >= head + header_len + body_len:  # all here: decode in place
            h0 = start + head
            envelope = self._envelope(self._view[h0 : h0 + header_len], shm, body_len)
            offset = h0 + header_len
            if not envelope.buffer_sizes:
                self._start = offset
                return envelope, [], []
            buffers: list[Any] = []
            claimed = self._claim(envelope, shm)
            for index, (size, kind_byte) in enumerate(
                zip(envelope.buffer_sizes, envelope.buffer_kinds, strict=True)
            ):
                if index in claimed:
                    buffers.append(None)
                    continue
                piece = self._view[offset : offset + size]
                buffers.append(bytes(piece) if kind_byte & KIND_READONLY else bytearray(piece))
                offset += size
            self._start = offset
            return (
                envelope,
                buffers,
                [(i, fd, envelope.buffer_sizes[i], shm[i] & _SLOT) for i, fd in claimed.items()],
            )
        if avail < head + header_len:
            if head + header_len > len(self._buf) // 2:
                # Receive a long header straight into its own buffer.
                self._frame = [shm, header_len, body_len, None]
                self._dest = [bytearray(header_len)]
                self._dest_index = 0
                self._copy_from_chunk(head)
                return self._fill()
            return None
        h0 = start + head
        envelope = self._envelope(self._view[h0 : h0 + header_len], shm, body_len)
        self._start = h0 + header_len
        self._begin_body(shm, envelope)
        return self._fill()

    def _copy_from_chunk(self, skip: int) -> None:
        self._start += skip
        self._drain_chunk()

    def _drain_chunk(self) -> None:
        while self._dest_index < len(self._dest):
            dest = self._dest[self._dest_index]
            if self._dest_pos == len(dest):
                self._dest_index += 1
                self._dest_pos = 0
                continue
            if self._start >= self._end:
                return
            n = min(len(dest) - self._dest_pos, self._end - self._start)
            dest[self._dest_pos : self._dest_pos + n] = self._view[self._start : self._start + n]
            self._dest_pos += n
            self._start += n

    def _envelope(self, header: memoryview, shm: dict[int, int], body_len: int) -> Envelope:
        envelope = decode_header(header, self._limits.max_buffers)
        sizes = envelope.buffer_sizes
        if not shm:  # the common case, kept cheap
            if sum(sizes) != body_len:
                raise FrameError(f"buffer sizes add up to {sum(sizes)}, body has {body_len}")
            return envelope
        if any(i >= len(sizes) or sizes[i] == 0 for i in shm):
            raise FrameError(f"frame names shared-memory buffers {tuple(shm)} it does not carry")
        inline = sum(s for i, s in enumerate(sizes) if i not in shm)
        if inline != body_len:
            raise FrameError(f"inline buffer sizes add up to {inline}, body has {body_len}")
        if FRAME_PREFIX.size + sum(sizes) > self._limits.max_frame_bytes:
            raise FrameError(f"frame of {sum(sizes)} buffer bytes exceeds the frame limit")
        return envelope

    def _claim(self, envelope: Envelope, shm: dict[int, int]) -> dict[int, int]:
        """Each shared buffer's descriptor, or a lent one's address (a frame is all one or all
        the other)."""
        if any(value & LENT for value in shm.values()):
            return {index: value >> 32 for index, value in shm.items()}
        if len(self._fds) < len(shm):
            raise FrameError("a frame names shared-memory buffers whose descriptors did not come")
        return {index: self._fds.popleft() for index in shm}

    def _begin_body(self, shm: dict[int, int], envelope: Envelope) -> None:
        self._frame = [shm, 0, 0, envelope]
        self._dest = [
            bytearray(size)
            for index, size in enumerate(envelope.buffer_sizes)
            if index not in shm and size
        ]
        self._dest_index = 0
        self._dest_pos = 0
        self._drain_chunk()

    def _fill(self) -> tuple[Envelope, list[Any], list[tuple[int, int, int, int]]] | None:
        frame = self._frame
        assert frame is not None
        self._drain_chunk()
        if frame[3] is None:  # a long header
            if self._dest_index < 1:
                return None
            header = self._dest[0]
            envelope = self._envelope(memoryview(header), frame[0], frame[2])
            self._begin_body(frame[0], envelope)
            frame = self._frame
            assert frame is not None
        if self._dest_index < len(self._dest):
            return None
        envelope = frame[3]
        shm = frame[0]
        self._frame = None
        claimed = self._claim(envelope, shm)
        filled = iter(self._dest)
        self._dest = []
        buffers: list[Any] = [
            None if index in claimed else (next(filled) if size else bytearray())
            for index, size in enumerate(envelope.buffer_sizes)
        ]
        sizes = envelope.buffer_sizes
        return envelope, buffers, [(i, fd, sizes[i], shm[i] & _SLOT) for i, fd in claimed.items()]
