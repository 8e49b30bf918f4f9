"""Exception types raised by the chrysalis wire types.

Why a module of its own: every wire type (PIDs, link IDs, connection IDs, datagram addresses)
validates untrusted input, and callers need one small, documented set of exception types to
catch. The hierarchy is:

- ``WireFormatError(ValueError)``: base for every malformed-input error of this package.

  - ``InvalidLengthError``: a fixed-size value got the wrong number of bytes.
  - ``HexParseError``: a textual form was rejected; subclasses name the type being parsed
    (``PidParseError``, ``LinkIdParseError``, ``ConnectionIdParseError``, ``PidPrefixError``).
  - ``ConnectionIdError``: a connection-ID suffix, key or nonce is out of range.
  - ``AddressError``: a ``DatagramAddr`` scheme, encoding or text form is invalid.

- ``PidLookupError(LookupError)``: expanding a PID prefix against a directory failed
  (``PidNotFoundError`` or ``PidAmbiguousError``).

Messages quote offending input truncated to a few dozen characters, so hostile input never
produces a huge message. Every exception pickles back to an equal exception (they may cross
process boundaries in the actor runtime).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chrysalis.core._pid import Pid

__all__ = [
    "AddressError",
    "ConnectionIdError",
    "ConnectionIdParseError",
    "HexParseError",
    "InvalidLengthError",
    "LinkIdParseError",
    "PidAmbiguousError",
    "PidLookupError",
    "PidNotFoundError",
    "PidParseError",
    "PidPrefixError",
    "PidPrefixErrorKind",
    "WireFormatError",
    "quote_input",
]

_QUOTE_LIMIT = 40


def quote_input(text: str | bytes, limit: int = _QUOTE_LIMIT) -> str:
    """Return ``repr`` of at most ``limit`` leading items of ``text``, marking truncation.

    Used in every error message so that hostile input cannot make messages unbounded.
    """
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} long)"


class WireFormatError(ValueError):
    """Base class of every malformed-input error raised by ``chrysalis.core`` wire types."""


class InvalidLengthError(WireFormatError):
    """A fixed-size wire value was given the wrong number of bytes.

    Attributes: ``type_name`` (the type being built), ``expected`` and ``actual`` byte counts.
    """

    def __init__(self, type_name: str, expected: int, actual: int) -> None:
        super().__init__(f"{type_name} needs exactly {expected} bytes, got {actual}")
        self.type_name = type_name
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.type_name, self.expected, self.actual))


class HexParseError(WireFormatError):
    """A textual (hexadecimal) form was rejected.

    Attributes: ``text`` (the offending input, truncated to a bounded length) and ``reason``
    (what was wrong). Subclasses identify the type being parsed.
    """

    type_name = "value"

    def __init__(self, text: str, reason: str) -> None:
        quoted = quote_input(text)
        super().__init__(f"invalid {self.type_name} text {quoted}: {reason}")
        self.text = text[: _QUOTE_LIMIT * 2]
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.text, self.reason))


class PidParseError(HexParseError):
    """``Pid.parse`` got something other than exactly 32 ASCII hex digits."""

    type_name = "PID"


class LinkIdParseError(HexParseError):
    """``LinkId.parse`` got something other than exactly 32 ASCII hex digits."""

    type_name = "link ID"


class ConnectionIdParseError(HexParseError):
    """``ConnectionId.parse`` got something other than exactly 40 ASCII hex digits."""

    type_name = "connection ID"


class PidPrefixErrorKind(enum.Enum):
    """Why a PID prefix was rejected (mirrors the reference implementation's error kinds)."""

    EMPTY = "empty"
    TOO_LONG = "too long"
    INVALID_HEX = "invalid hex"


class PidPrefixError(HexParseError):
    """``PidPrefix.parse`` rejected its input; ``kind`` says why (a ``PidPrefixErrorKind``)."""

    type_name = "PID prefix"

    def __init__(self, text: str, reason: str, kind: PidPrefixErrorKind) -> None:
        super().__init__(text, reason)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.text, self.reason, self.kind))


class ConnectionIdError(WireFormatError):
    """A connection-ID suffix, issued key or initial nonce is out of its documented range."""


class AddressError(WireFormatError):
    """A ``DatagramAddr`` scheme, opaque encoding or text form is invalid, or an accessor was
    used on an address of another scheme (for example ``to_sockaddr()`` on a unixgram address).
    """


class PidLookupError(LookupError):
    """Expanding a PID prefix against a set of candidate PIDs did not give exactly one PID.

    Attribute: ``prefix`` (the ``PidPrefix`` text that was expanded).
    """

    def __init__(self, prefix: str, message: str) -> None:
        super().__init__(message)
        self.prefix = prefix


class PidNotFoundError(PidLookupError):
    """No candidate PID matches the prefix."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix, f"no PID matches prefix {prefix!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.prefix,))


class PidAmbiguousError(PidLookupError):
    """More than one distinct candidate PID matches the prefix.

    Attributes: ``matches`` (a tuple of distinct matching PIDs in candidate order, at most
    ``MATCH_LIMIT`` of them) and ``truncated`` (true when more matches existed than were kept;
    expansion stops scanning candidates at that point). The message lists a few of them.
    """

    MATCH_LIMIT = 16
    _SHOWN = 4

    def __init__(self, prefix: str, matches: tuple[Pid, ...], truncated: bool) -> None:
        shown = ", ".join(str(pid) for pid in matches[: self._SHOWN])
        more = len(matches) > self._SHOWN or truncated
        count = f"more than {len(matches)}" if truncated else str(len(matches))
        suffix = ", ..." if more else ""
        super().__init__(
            prefix, f"prefix {prefix!r} is ambiguous: {count} PIDs match ({shown}{suffix})"
        )
        self.matches = matches
        self.truncated = truncated

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.prefix, self.matches, self.truncated))
