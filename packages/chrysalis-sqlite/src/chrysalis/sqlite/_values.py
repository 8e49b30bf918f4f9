"""SQLite values and their wire encoding (the v5 value list).

Why a module of its own: the same byte encoding is used on the wire (inside ``Change``) and in
storage (the keys of ``__chrysalis_versions_v1`` rows that JSON cannot carry). A receiver
compares a change's key with its row's key as received, so the encoding must be canonical:
every value has exactly one encoding, and decoding then encoding gives back the same bytes
(``Integer 7`` and ``Real 7.0`` encode differently). Row identity in storage is the table's own
key comparison (the clock tables' key columns have the table's affinities).

Encoding (all integers big-endian): a value is ``u8 tag`` and a payload: 0 NULL (nothing),
1 INTEGER (i64), 2 REAL (the IEEE-754 bit pattern as u64), 3 TEXT (u32 length + UTF-8),
4 BLOB (u32 length + bytes). A value list is a u32 count (at most ``MAX_VALUES``) and the values.
This module is pure: no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from chrysalis.sqlite._errors import CodecError, quote

__all__ = [
    "MAX_BYTES",
    "MAX_VALUES",
    "SqlValue",
    "decode_values",
    "encode_row_and_key",
    "encode_values",
    "read_values",
]

SqlValue = None | int | float | str | bytes
"""A value SQLite can store: NULL, INTEGER (64-bit), REAL, TEXT or BLOB."""

MAX_VALUES: Final = 65_536
"""Most values in one value list."""

MAX_BYTES: Final = 16 * 1024 * 1024
"""Longest TEXT (in UTF-8 bytes) or BLOB value, and longest ``bytes`` field on the wire."""

_U32 = struct.Struct(">I")
_INT = struct.Struct(">Bq")
_REAL = struct.Struct(">Bd")
_TAG_LEN = struct.Struct(">BI")
_NULL = b"\x00"
_ONE = b"\x00\x00\x00\x01"
_I64_MIN = -(2**63)
_I64_MAX = 2**63 - 1


def encode_values(values: Sequence[object]) -> bytes:
    """Encode ``values`` as a value list.

    Accepts ``None``, ``int`` (including ``bool``, stored as 0/1 like ``sqlite3`` does), ``float``,
    ``str``, and bytes-like objects. Raises ``CodecError`` for other types, integers outside
    64 bits, strings that are not valid Unicode (lone surrogates), values over ``MAX_BYTES`` and
    lists over ``MAX_VALUES``.
    """
    count = len(values)
    if count > MAX_VALUES:
        raise CodecError(f"value list of {count} values exceeds the limit of {MAX_VALUES}")
    return _U32.pack(count) + b"".join(_encode_each(values))


def encode_row_and_key(row: Sequence[object], key_indexes: Sequence[int]) -> tuple[bytes, bytes]:
    """Encode a full ``row`` and its key (the values at ``key_indexes``) as two value lists,
    encoding each value once. Returns ``(key_blob, row_blob)``; errors as ``encode_values``."""
    count = len(row)
    if count > MAX_VALUES:
        raise CodecError(f"value list of {count} values exceeds the limit of {MAX_VALUES}")
    parts = _encode_each(row)
    if len(key_indexes) == 1:
        key_blob = _ONE + parts[key_indexes[0]]
    else:
        key_blob = _U32.pack(len(key_indexes)) + b"".join([parts[i] for i in key_indexes])
    return key_blob, _U32.pack(count) + b"".join(parts)


def _encode_each(values: Sequence[object]) -> list[bytes]:
    """Each value's encoding (tag and payload), in order.

    The sender encodes every row it sends (the clock layout keeps no encoded copy), so the
    exact types ``str`` and ``int`` are tested first by identity; other values, subclasses
    included, take the ``isinstance`` path."""
    parts: list[bytes] = []
    append = parts.append
    text, integer, pack_text, pack_int = str, int, _TAG_LEN.pack, _INT.pack
    for value in values:
        kind = type(value)
        if kind is text:
            try:
                raw = value.encode()  # type: ignore[attr-defined]
            except UnicodeEncodeError:
                raise CodecError(f"TEXT value {quote(value)} is not valid Unicode") from None
            if len(raw) > MAX_BYTES:
                raise CodecError(f"TEXT value of {len(raw)} bytes exceeds {MAX_BYTES}")
            append(pack_text(3, len(raw)) + raw)
        elif kind is integer:
            if not _I64_MIN <= value <= _I64_MAX:  # type: ignore[operator]
                raise CodecError(f"INTEGER {quote(value)} does not fit in 64 bits")
            append(pack_int(1, value))
        elif isinstance(value, str):
            try:
                raw = value.encode()
            except UnicodeEncodeError:
                raise CodecError(f"TEXT value {quote(value)} is not valid Unicode") from None
            if len(raw) > MAX_BYTES:
                raise CodecError(f"TEXT value of {len(raw)} bytes exceeds {MAX_BYTES}")
            append(_TAG_LEN.pack(3, len(raw)) + raw)
        elif isinstance(value, int):  # bool included: struct packs True as 1
            if not _I64_MIN <= value <= _I64_MAX:
                raise CodecError(f"INTEGER {quote(value)} does not fit in 64 bits")
            append(_INT.pack(1, value))
        elif value is None:
            append(_NULL)
        elif isinstance(value, float):
            append(_REAL.pack(2, value))
        elif isinstance(value, bytes | bytearray | memoryview):
            raw = bytes(value)
            if len(raw) > MAX_BYTES:
                raise CodecError(f"BLOB value of {len(raw)} bytes exceeds {MAX_BYTES}")
            append(_TAG_LEN.pack(4, len(raw)) + raw)
        else:
            raise CodecError(f"{type(value).__name__} is not an SQLite value: {quote(value)}")
    return parts


def read_values(data: bytes | memoryview, offset: int) -> tuple[tuple[SqlValue, ...], int]:
    """Decode one value list from ``data`` at ``offset``; returns the values and the offset just
    past them. Raises ``CodecError`` if the list runs past the end of ``data`` or is invalid."""
    end = len(data)
    if offset + 4 > end:
        raise CodecError("value list count runs past the end of the message")
    (count,) = _U32.unpack_from(data, offset)
    offset += 4
    if count > MAX_VALUES:
        raise CodecError(f"value list of {count} values exceeds the limit of {MAX_VALUES}")
    values: list[SqlValue] = []
    append = values.append
    for _ in range(count):
        if offset >= end:
            raise CodecError("value list runs past the end of the message")
        tag = data[offset]
        if tag == 1:
            if offset + 9 > end:
                raise CodecError("INTEGER value runs past the end of the message")
            append(_INT.unpack_from(data, offset)[1])
            offset += 9
        elif tag == 3 or tag == 4:
            if offset + 5 > end:
                raise CodecError("value length runs past the end of the message")
            length = _TAG_LEN.unpack_from(data, offset)[1]
            if length > MAX_BYTES:
                raise CodecError(f"value of {length} bytes exceeds {MAX_BYTES}")
            start = offset + 5
            offset = start + length
            if offset > end:
                raise CodecError("value runs past the end of the message")
            raw = bytes(data[start:offset])
            if tag == 4:
                append(raw)
            else:
                try:
                    append(raw.decode())
                except UnicodeDecodeError:
                    raise CodecError(f"TEXT value {quote(raw)} is not valid UTF-8") from None
        elif tag == 0:
            append(None)
            offset += 1
        elif tag == 2:
            if offset + 9 > end:
                raise CodecError("REAL value runs past the end of the message")
            append(_REAL.unpack_from(data, offset)[1])
            offset += 9
        else:
            raise CodecError(f"unknown SQLite value tag {tag}")
    return tuple(values), offset


def decode_values(data: bytes | memoryview) -> tuple[SqlValue, ...]:
    """Decode a complete value list; trailing bytes are a ``CodecError``."""
    values, offset = read_values(data, 0)
    if offset != len(data):
        raise CodecError(f"{len(data) - offset} trailing bytes after a value list")
    return values
