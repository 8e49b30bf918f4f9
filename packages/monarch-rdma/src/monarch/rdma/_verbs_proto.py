"""The ibverbs provider's queue-pair handshake messages and memory-region bookkeeping (sans-IO).

Why here, before the provider exists: the part of the ``ibverbs`` provider that needs no device
is pure data and can be written and tested now. Two processes connect a reliable-connected (RC)
queue pair by exchanging, over ordinary actor messages, what each side's QP is (``QpInfo``:
port LID, GID, QP number, packet sequence number, path MTU); the owner of a buffer publishes its
memory region (``RegionInfo``: address, length, remote key). Then the reader posts RDMA READ or
WRITE work requests without the owner's CPU.

The codec is bytes in, message out: ``encode(message)`` and ``decode(data)``; every field is
range-checked on both sides and any malformed input raises ``HandshakeError`` (a
``ValueError``), never another exception. Messages are frozen, slotted dataclasses.

``RegionTable`` is the owner's bookkeeping of registered regions by remote key: it answers
whether an incoming access ``(rkey, offset, length)`` is inside a live registration.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAGIC",
    "MTU_BYTES",
    "VERSION",
    "ConnectAccept",
    "ConnectReject",
    "ConnectRequest",
    "HandshakeError",
    "Message",
    "QpInfo",
    "RegionInfo",
    "RegionTable",
    "decode",
    "encode",
]

MAGIC: Final = b"MRV"
VERSION: Final = 1
#: Path MTU enum values of ibverbs (IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5) and their sizes.
MTU_BYTES: Final = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
MAX_REASON: Final = 1024

_U8 = 0xFF
_U16 = 0xFFFF
_U24 = 0xFFFFFF
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF


class HandshakeError(ValueError):
    """Malformed handshake bytes, or a message field out of its range."""


def _check(name: str, value: int, bound: int, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= bound:
        raise HandshakeError(f"{name} must be an int in [{low}, {bound}], got {value!r}")


@dataclass(frozen=True, slots=True)
class QpInfo:
    """One side's queue pair: ``lid`` (port LID, 0 on RoCE), ``gid`` (16 bytes), ``qp_num``
    and ``psn`` (24-bit), ``mtu`` (an ibverbs path-MTU enum, 1..5), ``port`` and
    ``gid_index``."""

    lid: int
    gid: bytes
    qp_num: int
    psn: int
    mtu: int
    port: int
    gid_index: int

    def __post_init__(self) -> None:
        _check("lid", self.lid, _U16)
        if not isinstance(self.gid, bytes) or len(self.gid) != 16:
            raise HandshakeError(f"gid must be 16 bytes, got {self.gid!r}")
        _check("qp_num", self.qp_num, _U24)
        _check("psn", self.psn, _U24)
        if self.mtu not in MTU_BYTES:
            raise HandshakeError(f"mtu must be one of {sorted(MTU_BYTES)}, got {self.mtu!r}")
        _check("port", self.port, _U8, 1)
        _check("gid_index", self.gid_index, _U8)


@dataclass(frozen=True, slots=True)
class RegionInfo:
    """A registered memory region as its owner publishes it: ``address``, ``length`` (bytes,
    at least 1) and ``rkey``."""

    address: int
    length: int
    rkey: int

    def __post_init__(self) -> None:
        _check("address", self.address, _U64)
        _check("length", self.length, _U64, 1)
        _check("rkey", self.rkey, _U32)
        if self.address + self.length - 1 > _U64:
            raise HandshakeError("region wraps around the address space")


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """The reader's offer: its ``request`` number (u32) and QP."""

    request: int
    qp: QpInfo

    def __post_init__(self) -> None:
        _check("request", self.request, _U32)


@dataclass(frozen=True, slots=True)
class ConnectAccept:
    """The owner's answer to ``request``: its QP and the buffer's region."""

    request: int
    qp: QpInfo
    region: RegionInfo

    def __post_init__(self) -> None:
        _check("request", self.request, _U32)


@dataclass(frozen=True, slots=True)
class ConnectReject:
    """The owner refuses ``request``, saying why (UTF-8, at most ``MAX_REASON`` bytes)."""

    request: int
    reason: str

    def __post_init__(self) -> None:
        _check("request", self.request, _U32)
        if not isinstance(self.reason, str) or len(self.reason.encode()) > MAX_REASON:
            raise HandshakeError(f"reason must be text of at most {MAX_REASON} bytes")


Message = ConnectRequest | ConnectAccept | ConnectReject

_HEADER = struct.Struct("!3sBBI")  # magic, version, kind, request
_QP = struct.Struct("!H16sIIBBB")
_REGION = struct.Struct("!QQI")
_REASON = struct.Struct("!H")
_KINDS: Final = {ConnectRequest: 1, ConnectAccept: 2, ConnectReject: 3}


def _encode_qp(qp: QpInfo) -> bytes:
    return _QP.pack(qp.lid, qp.gid, qp.qp_num, qp.psn, qp.mtu, qp.port, qp.gid_index)


def encode(message: Message) -> bytes:
    """The bytes of ``message`` (validated when it was built)."""
    header = _HEADER.pack(MAGIC, VERSION, _KINDS[type(message)], message.request)
    if isinstance(message, ConnectRequest):
        return header + _encode_qp(message.qp)
    if isinstance(message, ConnectAccept):
        region = message.region
        return (
            header
            + _encode_qp(message.qp)
            + _REGION.pack(region.address, region.length, region.rkey)
        )
    reason = message.reason.encode()
    return header + _REASON.pack(len(reason)) + reason


def _decode_qp(data: bytes, at: int) -> QpInfo:
    lid, gid, qp_num, psn, mtu, port, gid_index = _QP.unpack_from(data, at)
    return QpInfo(lid, gid, qp_num, psn, mtu, port, gid_index)


def decode(data: bytes) -> Message:
    """The message in ``data`` (exactly one); ``HandshakeError`` for anything malformed."""
    try:
        magic, version, kind, request = _HEADER.unpack_from(data, 0)
    except struct.error:
        raise HandshakeError(f"handshake message too short ({len(data)} bytes)") from None
    if magic != MAGIC:
        raise HandshakeError("not a monarch-rdma verbs handshake message")
    if version != VERSION:
        raise HandshakeError(f"handshake version {version} (this side speaks {VERSION})")
    at = _HEADER.size
    if kind == 1:
        expected = at + _QP.size
    elif kind == 2:
        expected = at + _QP.size + _REGION.size
    elif kind == 3:
        if len(data) < at + _REASON.size:
            raise HandshakeError("truncated reject")
        (length,) = _REASON.unpack_from(data, at)
        expected = at + _REASON.size + length
    else:
        raise HandshakeError(f"unknown handshake message kind {kind}")
    if len(data) != expected:
        raise HandshakeError(f"handshake message of kind {kind}: {len(data)} bytes, not {expected}")
    if kind == 1:
        return ConnectRequest(request, _decode_qp(data, at))
    if kind == 2:
        region = RegionInfo(*_REGION.unpack_from(data, at + _QP.size))
        return ConnectAccept(request, _decode_qp(data, at), region)
    try:
        reason = data[at + _REASON.size :].decode()
    except UnicodeDecodeError:
        raise HandshakeError("reject reason is not UTF-8") from None
    return ConnectReject(request, reason)


class RegionTable:
    """The owner's registered regions by remote key (at most ``limit`` of them)."""

    def __init__(self, limit: int = 65536) -> None:
        self._limit = limit
        self._regions: dict[int, RegionInfo] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def add(self, region: RegionInfo) -> None:
        """Record a registration; ``ValueError`` for a key in use or a full table."""
        if region.rkey in self._regions:
            raise ValueError(f"remote key {region.rkey:#x} is already registered")
        if len(self._regions) >= self._limit:
            raise ValueError(f"at most {self._limit} regions may be registered")
        self._regions[region.rkey] = region

    def remove(self, rkey: int) -> RegionInfo | None:
        """Forget a registration (``None`` if it was not there)."""
        return self._regions.pop(rkey, None)

    def allows(self, rkey: int, offset: int, length: int) -> bool:
        """Whether ``length`` bytes at ``offset`` of region ``rkey`` are inside a live
        registration."""
        region = self._regions.get(rkey)
        return region is not None and 0 <= offset and 0 <= length <= region.length - offset
