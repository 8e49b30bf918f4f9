"""Process identities: ``Pid`` and ``PidPrefix``.

Why this shape: a PID is the routing key of every datagram (the first 16 bytes of each QUIC
connection ID) and the authenticated identity of a peer (the first 16 bytes of the SHA-256 of
its TLS leaf certificate). It is built on hot paths (once per received datagram by
``target_pid``), so the class is a thin, slotted, immutable wrapper over a ``bytes`` object:
equality, hashing and ordering are plain bytewise comparisons of that object, and the trusted
constructor ``Pid._from_trusted`` skips validation for callers that already sliced exactly 16
bytes.

``_FixedBytes`` is the shared private base of the fixed-size opaque values of this package
(``Pid``, ``LinkId``, ``ConnectionId``). Values of different concrete classes never compare
equal, even with the same bytes.

``PidPrefix`` is the human lookup form: 1 to 32 hex digits, matched at nibble granularity.
This module is pure: no I/O, no clocks.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any, ClassVar, NoReturn, Self, cast, final

from chrysalis.core._errors import (
    HexParseError,
    InvalidLengthError,
    PidAmbiguousError,
    PidNotFoundError,
    PidParseError,
    PidPrefixError,
    PidPrefixErrorKind,
)

__all__ = ["LINK_ID_LEN", "PID_LEN", "Pid", "PidPrefix"]

PID_LEN = 16
"""Bytes in a PID."""

LINK_ID_LEN = 16
"""Bytes in a nameserver link ID."""

_BytesLike = bytes | bytearray | memoryview


class _FixedBytes:
    """Private base: an immutable, hashable, bytewise-ordered wrapper over fixed-size bytes.

    Subclasses set ``_LEN`` (byte count), ``_PARSE_ERROR`` (their ``HexParseError`` subclass)
    and ``__slots__ = ()``. Comparisons only succeed between instances of the same class.
    """

    __slots__ = ("_raw",)
    _raw: bytes
    _LEN: ClassVar[int]
    _PARSE_ERROR: ClassVar[type[HexParseError]]

    @classmethod
    def _from_trusted(cls, raw: bytes) -> Self:
        """Wrap ``raw`` without validation. ``raw`` must be a ``bytes`` of exactly ``_LEN``."""
        self = object.__new__(cls)
        _set_raw(self, raw)
        return self

    @classmethod
    def _coerce(cls, data: object) -> bytes:
        """Validate a bytes-like value of exactly ``_LEN`` bytes and return it as ``bytes``."""
        if type(data) is not bytes:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(
                    f"{cls.__name__} needs a bytes-like value, not {type(data).__name__}"
                )
            data = bytes(data)
        raw = data
        if len(raw) != cls._LEN:
            raise InvalidLengthError(cls.__name__, cls._LEN, len(raw))
        return raw

    @classmethod
    def _parse_hex(cls, text: str) -> bytes:
        """Decode exactly ``2 * _LEN`` ASCII hex digits (either case) or raise ``_PARSE_ERROR``."""
        if not isinstance(text, str):
            raise TypeError(f"{cls.__name__}.parse needs a str, not {type(text).__name__}")
        digits = 2 * cls._LEN
        if len(text) == digits and _HEX_RUN.fullmatch(text) is not None:
            return bytes.fromhex(text)
        if len(text) != digits:
            reason = f"expected exactly {digits} hex digits, got {len(text)} characters"
        else:
            bad = next(i for i, ch in enumerate(text) if ch not in _HEX_DIGITS)
            reason = f"character {text[bad]!r} at position {bad} is not a hex digit"
        raise cls._PARSE_ERROR(text, reason)

    @property
    def raw(self) -> bytes:
        """The wrapped bytes (also available as ``bytes(value)``)."""
        return self._raw

    def hex(self) -> str:
        """The bytes as lowercase hexadecimal digits, two per byte (same as ``str(value)``)."""
        return self._raw.hex()

    def __bytes__(self) -> bytes:
        return self._raw

    def __str__(self) -> str:
        return self._raw.hex()

    def __hash__(self) -> int:
        return hash(self._raw)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._raw == other._raw
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._raw != other._raw
        return NotImplemented

    def __lt__(self, other: Self) -> bool:
        if other.__class__ is self.__class__:
            return self._raw < other._raw
        return NotImplemented

    def __le__(self, other: Self) -> bool:
        if other.__class__ is self.__class__:
            return self._raw <= other._raw
        return NotImplemented

    def __gt__(self, other: Self) -> bool:
        if other.__class__ is self.__class__:
            return self._raw > other._raw
        return NotImplemented

    def __ge__(self, other: Self) -> bool:
        if other.__class__ is self.__class__:
            return self._raw >= other._raw
        return NotImplemented

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self._raw,))

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: object) -> Self:
        return self


_set_raw = cast(Any, _FixedBytes.__dict__["_raw"]).__set__
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]+")


@final
class Pid(_FixedBytes):
    """A process identity: exactly 16 opaque bytes.

    ``Pid(data)`` accepts any bytes-like value of exactly ``PID_LEN`` bytes (``TypeError`` for
    anything else than bytes/bytearray/memoryview, ``InvalidLengthError`` for a wrong length).
    Equality, hashing and ordering are bytewise. ``str(pid)`` / ``pid.hex()`` are 32 lowercase
    hex digits; ``Pid.parse`` is the inverse. ``Pid.LINK_LOCAL`` (all zeros) is reserved for the
    link-local protocol mux and is never published or routed.
    """

    __slots__ = ()
    _LEN = PID_LEN
    _PARSE_ERROR = PidParseError
    LINK_LOCAL: ClassVar[Pid]

    def __new__(cls, data: bytes | bytearray | memoryview) -> Pid:
        self = object.__new__(cls)
        _set_raw(self, cls._coerce(data))
        return self

    @classmethod
    def parse(cls, text: str) -> Pid:
        """Parse exactly 32 ASCII hex digits (either case); ``PidParseError`` otherwise.

        The all-zero PID parses (it is ``Pid.LINK_LOCAL``); callers that must refuse it (for
        example a join token's authority) check ``is_link_local`` themselves.
        """
        return cls._from_trusted(cls._parse_hex(text))

    @classmethod
    def from_certificate(cls, der: bytes | bytearray | memoryview) -> Pid:
        """Derive a PID from a DER-encoded leaf certificate: ``SHA-256(der)[:16]``.

        No other input (key, chain, time) takes part. The certificate is not parsed here.
        """
        return cls._from_trusted(hashlib.sha256(der).digest()[:PID_LEN])

    @property
    def is_link_local(self) -> bool:
        """True for the reserved all-zero PID (``Pid.LINK_LOCAL``)."""
        return self._raw == _ZERO_PID

    def __repr__(self) -> str:
        return f"Pid({self._raw.hex()!r})"


_ZERO_PID = bytes(PID_LEN)
Pid.LINK_LOCAL = Pid._from_trusted(_ZERO_PID)
_new_object = object.__new__


def _pid_from_trusted(raw: bytes) -> Pid:
    """Hot-path twin of ``Pid._from_trusted``: ``raw`` must be exactly 16 ``bytes``."""
    pid: Pid = _new_object(Pid)
    _set_raw(pid, raw)
    return pid


@final
class PidPrefix:
    """A PID prefix for human lookup: 1 to 32 hex digits, matched at nibble granularity.

    ``PidPrefix(text)`` (or ``PidPrefix.parse(text)``) accepts either case and raises
    ``PidPrefixError`` with ``kind`` EMPTY, TOO_LONG (more than 32 characters) or INVALID_HEX,
    checked in that order. ``str(prefix)`` is lowercase. Internally the digits are stored as 16
    bytes plus a digit count; an odd count keeps its last digit in the high nibble.
    Immutable, hashable (two prefixes are equal when they have the same digits), picklable.
    """

    __slots__ = ("_digits", "_raw")
    _raw: bytes
    _digits: int

    MAX_DIGITS: ClassVar[int] = 2 * PID_LEN

    def __new__(cls, text: str) -> PidPrefix:
        if not isinstance(text, str):
            raise TypeError(f"PidPrefix needs a str, not {type(text).__name__}")
        if not text:
            raise PidPrefixError(text, "no hex digits", PidPrefixErrorKind.EMPTY)
        if len(text) > cls.MAX_DIGITS:
            raise PidPrefixError(
                text,
                f"at most {cls.MAX_DIGITS} hex digits allowed, got {len(text)} characters",
                PidPrefixErrorKind.TOO_LONG,
            )
        if _HEX_RUN.fullmatch(text) is None:
            bad = next(i for i, ch in enumerate(text) if ch not in _HEX_DIGITS)
            raise PidPrefixError(
                text,
                f"character {text[bad]!r} at position {bad} is not a hex digit",
                PidPrefixErrorKind.INVALID_HEX,
            )
        padded = text + "0" * (cls.MAX_DIGITS - len(text))
        return cls._make(bytes.fromhex(padded), len(text))

    @classmethod
    def _make(cls, raw: bytes, digits: int) -> PidPrefix:
        self = object.__new__(cls)
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_digits", digits)
        return self

    @classmethod
    def parse(cls, text: str) -> PidPrefix:
        """Same as ``PidPrefix(text)``."""
        return cls(text)

    @classmethod
    def from_pid(cls, pid: Pid, digits: int = 2 * PID_LEN) -> PidPrefix:
        """The first ``digits`` (1..32) hex digits of ``pid`` as a prefix."""
        if not isinstance(pid, Pid):
            raise TypeError(f"PidPrefix.from_pid needs a Pid, not {type(pid).__name__}")
        if not 1 <= digits <= cls.MAX_DIGITS:
            raise ValueError(f"digits must be in 1..{cls.MAX_DIGITS}, got {digits}")
        whole, odd = divmod(digits, 2)
        raw = pid.raw[:whole]
        if odd:
            raw += bytes((pid.raw[whole] & 0xF0,))
        return cls._make(raw + bytes(PID_LEN - len(raw)), digits)

    @property
    def digits(self) -> int:
        """Number of hex digits in the prefix (1..32)."""
        return self._digits

    def matches(self, pid: Pid) -> bool:
        """True when ``str(pid)`` starts with ``str(self)``.

        Compares the ``digits // 2`` whole bytes, then (odd digit count) the high nibble of the
        next byte.
        """
        if pid.__class__ is not Pid:
            raise TypeError(f"PidPrefix.matches needs a Pid, not {type(pid).__name__}")
        whole, odd = divmod(self._digits, 2)
        raw = pid._raw
        if raw[:whole] != self._raw[:whole]:
            return False
        return not odd or (raw[whole] >> 4) == (self._raw[whole] >> 4)

    def to_pid(self) -> Pid | None:
        """The full PID for a 32-digit prefix, else ``None``."""
        if self._digits == self.MAX_DIGITS:
            return Pid._from_trusted(self._raw)
        return None

    def expand(self, candidates: Iterable[Pid]) -> Pid:
        """Return the one distinct PID among ``candidates`` that this prefix matches.

        Raises ``PidNotFoundError`` when none matches and ``PidAmbiguousError`` when several
        distinct PIDs match (duplicates of one PID are not ambiguous). The ambiguous error keeps
        at most ``PidAmbiguousError.MATCH_LIMIT`` matches; scanning stops once more than that
        many were seen, so memory stays bounded for any candidate iterable.
        """
        limit = PidAmbiguousError.MATCH_LIMIT
        found: list[Pid] = []
        seen: set[Pid] = set()
        for pid in candidates:
            if self.matches(pid) and pid not in seen:
                if len(found) == limit:
                    raise PidAmbiguousError(str(self), tuple(found), True)
                found.append(pid)
                seen.add(pid)
        if not found:
            raise PidNotFoundError(str(self))
        if len(found) > 1:
            raise PidAmbiguousError(str(self), tuple(found), False)
        return found[0]

    def __str__(self) -> str:
        return self._raw.hex()[: self._digits]

    def __repr__(self) -> str:
        return f"PidPrefix({str(self)!r})"

    def __hash__(self) -> int:
        return hash((self._digits, self._raw))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PidPrefix):
            return self._digits == other._digits and self._raw == other._raw
        return NotImplemented

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("PidPrefix is immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("PidPrefix is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (PidPrefix, (str(self),))

    def __copy__(self) -> PidPrefix:
        return self

    def __deepcopy__(self, memo: object) -> PidPrefix:
        return self
