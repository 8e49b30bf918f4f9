"""QUIC connection IDs that route by PID, and ``target_pid``.

Why: Chrysalis forwards QUIC datagrams without decrypting them. Every connection ID it issues
or chooses is 20 bytes (the QUIC v1 maximum)::

    byte offset:  0 ............ 15 | 16 ........ 19
    content:      destination PID    | suffix, u32 big-endian

Forwarders read only the PID prefix of the first packet's destination CID (``target_pid``);
only the terminating endpoint reads the suffix. Suffixes of CIDs an endpoint issues itself
("connection keys") have the top bit clear; the client-chosen Initial DCID carries a nonce with
the top bit set (``INITIAL_SUFFIX_FLAG``), so the two kinds never collide on one endpoint. The
CID is not authenticated: a false PID only misdirects a datagram, the TLS handshake proves
identity. This module is pure and ``target_pid`` is on the per-datagram hot path: it never
raises for any bytes input and does a constant amount of work.
"""

from __future__ import annotations

from typing import Any, final

from chrysalis.core._errors import ConnectionIdError, ConnectionIdParseError
from chrysalis.core._pid import PID_LEN, Pid, _FixedBytes, _pid_from_trusted

__all__ = ["CID_LEN", "INITIAL_SUFFIX_FLAG", "ConnectionId", "target_pid"]

CID_LEN = 20
"""Bytes in every Chrysalis QUIC connection ID."""

INITIAL_SUFFIX_FLAG = 0x8000_0000
"""Top suffix bit: set for client Initial nonces, clear for endpoint-issued connection keys."""

_SUFFIX_LIMIT = 1 << 32
_KEY_LIMIT = 1 << 31


def _check_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return value


@final
class ConnectionId(_FixedBytes):
    """A 20-byte QUIC connection ID: destination PID followed by a u32 big-endian suffix.

    ``ConnectionId(pid, suffix)`` accepts any suffix in ``0 .. 2**32 - 1``;
    ``ConnectionId.issued`` and ``ConnectionId.initial`` build the two kinds the endpoint uses.
    Out-of-range values raise ``ConnectionIdError``; ``from_bytes`` of anything but 20 bytes
    raises ``InvalidLengthError``. Value semantics as ``Pid`` (ordered by the 20 bytes);
    ``str`` is 40 lowercase hex digits and ``ConnectionId.parse`` the inverse.
    """

    __slots__ = ()
    _LEN = CID_LEN
    _PARSE_ERROR = ConnectionIdParseError

    def __new__(cls, pid: Pid, suffix: int) -> ConnectionId:
        if pid.__class__ is not Pid:
            raise TypeError(f"ConnectionId needs a Pid, not {type(pid).__name__}")
        suffix = _check_int(suffix, "ConnectionId suffix")
        if not 0 <= suffix < _SUFFIX_LIMIT:
            raise ConnectionIdError(f"ConnectionId suffix must fit in a u32, got {suffix}")
        return cls._from_trusted(pid.raw + suffix.to_bytes(4, "big"))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> ConnectionId:
        """Wrap exactly 20 bytes (``InvalidLengthError`` otherwise; any suffix is accepted)."""
        return cls._from_trusted(cls._coerce(data))

    @classmethod
    def parse(cls, text: str) -> ConnectionId:
        """Parse exactly 40 ASCII hex digits; ``ConnectionIdParseError`` otherwise."""
        return cls._from_trusted(cls._parse_hex(text))

    @classmethod
    def issued(cls, pid: Pid, key: int) -> ConnectionId:
        """A CID issued by the endpoint ``pid`` itself, with connection key ``1 <= key < 2**31``.

        The top suffix bit stays clear. Allocating keys (a counter from 1, never reused) is the
        endpoint's job; an out-of-range key raises ``ConnectionIdError``.
        """
        key = _check_int(key, "connection key")
        if not 1 <= key < _KEY_LIMIT:
            raise ConnectionIdError(f"connection key must be in 1..2**31-1, got {key}")
        return cls(pid, key)

    @classmethod
    def initial(cls, pid: Pid, nonce: int) -> ConnectionId:
        """A client Initial DCID towards ``pid`` with nonce ``1 <= nonce < 2**31``.

        The stored suffix is ``nonce | INITIAL_SUFFIX_FLAG``; an out-of-range nonce raises
        ``ConnectionIdError``.
        """
        nonce = _check_int(nonce, "initial nonce")
        if not 1 <= nonce < _KEY_LIMIT:
            raise ConnectionIdError(f"initial nonce must be in 1..2**31-1, got {nonce}")
        return cls(pid, nonce | INITIAL_SUFFIX_FLAG)

    @property
    def pid(self) -> Pid:
        """The destination PID (the first 16 bytes)."""
        return Pid._from_trusted(self._raw[:PID_LEN])

    @property
    def suffix(self) -> int:
        """The u32 suffix (the last 4 bytes, big-endian), flag bit included."""
        return int.from_bytes(self._raw[PID_LEN:], "big")

    @property
    def is_initial(self) -> bool:
        """True when the suffix has ``INITIAL_SUFFIX_FLAG`` set (a client Initial DCID)."""
        return self._raw[PID_LEN] >= 0x80

    def __repr__(self) -> str:
        return f"ConnectionId({self.pid!r}, 0x{self.suffix:08x})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ConnectionId.from_bytes, (self._raw,))


_LONG_HEADER_BIT = 0x80
_LONG_DCID_LEN_OFFSET = 5
_LONG_DCID_OFFSET = 6
_SHORT_DCID_OFFSET = 1
_from_trusted = _pid_from_trusted


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    """``data`` as a flat sequence of unsigned bytes: the view itself when it already is one,
    else a byte-format cast of it (C-contiguous data), else a copy (other strided data)."""
    view = memoryview(data)
    if view.ndim == 1 and view.format == "B":
        return view
    if view.c_contiguous:
        try:
            return view.cast("B")
        except (TypeError, ValueError):
            pass
    return view.tobytes()


def target_pid(datagram: bytes | bytearray | memoryview) -> Pid | None:
    """The destination PID of the first QUIC packet in a UDP payload, or ``None``.

    Short header (``byte[0] & 0x80 == 0``): the DCID starts at offset 1 (its length is
    implicit, always 20 in Chrysalis). Long header: ``byte[5]`` is the DCID length and must be
    exactly 20; the DCID starts at offset 6. The PID is the DCID's first 16 bytes. Returns
    ``None`` for an empty or too-short datagram or a long header with another DCID length.

    Never raises for bytes-like input and always reads *bytes*: a memoryview of another item
    format (``'I'``, ``'<B'``, ...) or of several dimensions is read as its underlying bytes
    (a cast, or for non-contiguous data a copy). For ``bytes``, ``bytearray`` and 1-D
    ``'B'`` views nothing beyond the first 22 bytes is read.
    """
    if type(datagram) is memoryview:
        if datagram.ndim != 1 or datagram.format != "B":
            datagram = _as_bytes(datagram)
    elif type(datagram) is not bytes and type(datagram) is not bytearray:
        datagram = _as_bytes(datagram)
    n = len(datagram)
    if n == 0:
        return None
    if datagram[0] & _LONG_HEADER_BIT:
        if n < _LONG_DCID_OFFSET + PID_LEN or datagram[_LONG_DCID_LEN_OFFSET] != CID_LEN:
            return None
        return _from_trusted(bytes(datagram[_LONG_DCID_OFFSET : _LONG_DCID_OFFSET + PID_LEN]))
    if n < _SHORT_DCID_OFFSET + PID_LEN:
        return None
    return _from_trusted(bytes(datagram[_SHORT_DCID_OFFSET : _SHORT_DCID_OFFSET + PID_LEN]))
