"""Parent/child link identity: ``LinkId``, ``LinkSide`` and ``LinkContext``.

Why: a process PID names a certificate, but the nameserver also needs to name one particular
*incarnation* of an adjacent parent<->child link (a reconnect is a new link even between the
same two PIDs). The parent allocates a fresh 16-byte ``LinkId`` per link; link-local protocol
handlers receive a ``LinkContext`` = (link, authenticated peer PID, side where the peer sits).
These are plain values; allocation (randomness) is the caller's job, so this module stays pure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import final

from chrysalis.core._errors import LinkIdParseError
from chrysalis.core._pid import LINK_ID_LEN, Pid, _FixedBytes

__all__ = ["LinkContext", "LinkId", "LinkSide"]


@final
class LinkId(_FixedBytes):
    """The one-shot, parent-allocated identity of a parent<->child link: 16 opaque bytes.

    Same value semantics as ``Pid``: ``LinkId(data)`` needs exactly ``LINK_ID_LEN`` bytes
    (``TypeError`` / ``InvalidLengthError``), bytewise equality/hash/order, ``str`` and
    ``hex()`` give 32 lowercase hex digits, ``LinkId.parse`` is the inverse (raising
    ``LinkIdParseError``). A ``LinkId`` never equals a ``Pid`` with the same bytes.
    """

    __slots__ = ()
    _LEN = LINK_ID_LEN
    _PARSE_ERROR = LinkIdParseError

    def __new__(cls, data: bytes | bytearray | memoryview) -> LinkId:
        return cls._from_trusted(cls._coerce(data))

    @classmethod
    def parse(cls, text: str) -> LinkId:
        """Parse exactly 32 ASCII hex digits (either case); ``LinkIdParseError`` otherwise."""
        return cls._from_trusted(cls._parse_hex(text))

    def __repr__(self) -> str:
        return f"LinkId({self._raw.hex()!r})"


class LinkSide(enum.Enum):
    """Where the *peer* of a link sits relative to the local process."""

    PARENT = "parent"
    """The peer is our parent (we are the child end of the link)."""
    CHILD = "child"
    """The peer is our child (we are the parent end of the link)."""

    @property
    def opposite(self) -> LinkSide:
        """The side as seen from the peer's end of the same link."""
        return LinkSide.CHILD if self is LinkSide.PARENT else LinkSide.PARENT


@dataclass(frozen=True, slots=True)
class LinkContext:
    """What a link-local protocol handler learns about the link it serves.

    Fields: ``link`` (this link incarnation), ``peer`` (the peer's authenticated PID) and
    ``side`` (where the peer sits). Construction checks the field types (``TypeError``).
    """

    link: LinkId
    peer: Pid
    side: LinkSide

    def __post_init__(self) -> None:
        if not isinstance(self.link, LinkId):
            raise TypeError(f"LinkContext.link must be a LinkId, not {type(self.link).__name__}")
        if not isinstance(self.peer, Pid):
            raise TypeError(f"LinkContext.peer must be a Pid, not {type(self.peer).__name__}")
        if not isinstance(self.side, LinkSide):
            raise TypeError(f"LinkContext.side must be a LinkSide, not {type(self.side).__name__}")
