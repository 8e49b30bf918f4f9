"""Exception types of ``chrysalis.nameserver``.

Why one module: every layer of the nameserver validates untrusted input (frames from a peer,
publications from a child, answers from a parent) and callers need a small, documented set of
types to catch. The hierarchy is::

    NameserverError
    +-- CodecError (ValueError)          malformed or oversized frames, one subclass per reason
    +-- LabelError (ValueError)          a label key or value breaks the grammar; ``kind`` says how
    +-- ApplyError                       the directory refused a command; ``kind`` says why
    +-- CacheError                       the resolver cache refused an update; ``kind`` says why
    +-- SessionError                     a session contract was broken; ``kind`` says which
    |   +-- LocalProtocolError           ... by the local caller (driver bug, wrong call order)
    |   +-- RemoteProtocolError          ... by the peer (wrong message, wrong answer)
    |       +-- PublicationRejected      the child's publication was refused by the directory
    +-- RouteProjectionError             route projection misuse (a link opened twice, ...)

Local and remote protocol errors are different types (as in h11): a remote error means "tear
the link down, the peer misbehaved", a local error means "this program has a bug".
Messages never quote unbounded input.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chrysalis.core import Pid

__all__ = [
    "ApplyError",
    "ApplyErrorKind",
    "CacheError",
    "CacheErrorKind",
    "CodecError",
    "DecoderBufferFull",
    "FieldTooLarge",
    "FrameTooLarge",
    "InvalidAddress",
    "InvalidEnumValue",
    "InvalidFrameLength",
    "InvalidLabel",
    "InvalidUtf8",
    "InvalidVersionRange",
    "LabelError",
    "LabelErrorKind",
    "LocalProtocolError",
    "NameserverError",
    "PublicationRejected",
    "RemoteProtocolError",
    "RouteProjectionError",
    "SessionError",
    "SessionErrorKind",
    "TooManyItems",
    "TrailingBytes",
    "TruncatedFrame",
    "UnexpectedEof",
    "UnknownMessageTag",
    "UnsupportedWireVersion",
]


class NameserverError(Exception):
    """Base class of every error raised by ``chrysalis.nameserver``."""


# --------------------------------------------------------------------------------------------
# Codec


class CodecError(NameserverError, ValueError):
    """A frame could not be encoded or decoded. Decoding untrusted bytes raises only this type
    (one of its subclasses), never another exception."""


class UnexpectedEof(CodecError):
    """The input ended inside the 4-byte length prefix, or a field ran past the end of the
    frame body."""


class TruncatedFrame(CodecError):
    """A byte stream ended after a frame had started (inside its prefix or its body)."""


class InvalidFrameLength(CodecError):
    """The declared body length is below the minimum (2) or differs from the bytes supplied."""


class FrameTooLarge(CodecError):
    """A frame body exceeds ``MAX_FRAME_BODY``; on decode this is raised from the prefix alone,
    before any body byte is read or allocated."""


class FieldTooLarge(CodecError):
    """A string or byte field exceeds its length limit."""


class TooManyItems(CodecError):
    """A list (entries, removals, labels, locators) exceeds its count limit."""


class UnsupportedWireVersion(CodecError):
    """The frame's wire (framing) version is not ``WIRE_VERSION``."""


class UnknownMessageTag(CodecError):
    """The message tag names no known message."""


class InvalidEnumValue(CodecError):
    """A one-byte enumeration (consistency, reject code, result kind, cursor flag) has a value
    outside its set."""


class InvalidVersionRange(CodecError):
    """A protocol version is 0, or a version range has ``min > max``."""


class InvalidUtf8(CodecError):
    """A text field is not valid UTF-8."""


class InvalidLabel(CodecError):
    """A decoded label breaks the label grammar or repeats a key; ``__cause__`` is the
    ``LabelError``."""


class InvalidAddress(CodecError):
    """A decoded carrier address is not a valid ``DatagramAddr``; ``__cause__`` is the
    ``chrysalis.core.AddressError``."""


class TrailingBytes(CodecError):
    """Bytes remain in the frame body after the message."""


class DecoderBufferFull(CodecError):
    """``NsCodec.feed`` was given more bytes than its buffer bound; drain ``next_message``
    after every ``feed``."""


# --------------------------------------------------------------------------------------------
# Labels


class LabelErrorKind(enum.Enum):
    """Why a label key or value was rejected (mirrors the reference ``labels.rs`` kinds)."""

    EMPTY_NAME = "empty name"
    NAME_TOO_LONG = "name too long"
    INVALID_NAME = "invalid name"
    EMPTY_PREFIX = "empty prefix"
    PREFIX_TOO_LONG = "prefix too long"
    INVALID_PREFIX = "invalid prefix"
    VALUE_TOO_LONG = "value too long"
    INVALID_VALUE = "invalid value"
    DUPLICATE_KEY = "duplicate key"
    TOO_MANY_LABELS = "too many labels"
    """Not in the reference's kinds: more labels than one entry can carry on the wire (256)."""


_QUOTE = 40


def _quote(text: str) -> str:
    if len(text) <= _QUOTE:
        return repr(text)
    return f"{text[:_QUOTE]!r}... ({len(text)} long)"


class LabelError(NameserverError, ValueError):
    """A label key or value is invalid.

    Attributes: ``kind`` (a ``LabelErrorKind``), ``key`` (the offending key, truncated) and
    ``value`` (the offending value, truncated, or ``None`` for key errors).
    """

    def __init__(self, kind: LabelErrorKind, key: str, value: str | None = None) -> None:
        subject = f"label key {_quote(key)}"
        if value is not None:
            subject += f" value {_quote(value)}"
        if kind is LabelErrorKind.TOO_MANY_LABELS:
            subject = key  # the count and the limit, not a key
        super().__init__(f"{kind.value}: {subject}")
        self.kind = kind
        self.key = key[: 2 * _QUOTE]
        self.value = None if value is None else value[: 2 * _QUOTE]

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_label_error, (self.kind, self.key, self.value, str(self)))


def _rebuild_label_error(
    kind: LabelErrorKind, key: str, value: str | None, message: str
) -> LabelError:
    error = LabelError(kind, key, value)
    error.args = (message,)
    return error


# --------------------------------------------------------------------------------------------
# Directory


class ApplyErrorKind(enum.Enum):
    """Why the authoritative directory refused a command (spec 2.1)."""

    RESERVED_PID = "reserved pid"
    LINK_ALREADY_EXISTS = "link already exists"
    CHILD_ALREADY_LINKED = "child already linked"
    UNKNOWN_LINK = "unknown link"
    CONFLICTING_REPLAY = "conflicting replay"
    WRONG_SNAPSHOT = "wrong snapshot"
    SNAPSHOT_IN_PROGRESS = "snapshot in progress"
    STALE_PUBLICATION_SEQUENCE = "stale publication sequence"
    UNEXPECTED_SNAPSHOT_CHUNK = "unexpected snapshot chunk"
    INCOMPLETE_SNAPSHOT = "incomplete snapshot"
    DUPLICATE_PID = "duplicate pid"
    PID_OWNED_BY_ANOTHER_LINK = "pid owned by another link"
    AUTHORITY_PID = "authority pid"
    PID_NOT_OWNED_BY_LINK = "pid not owned by link"
    PID_BOTH_UPSERTED_AND_REMOVED = "pid both upserted and removed"
    COUNTER_EXHAUSTED = "counter exhausted"
    CAPACITY_EXCEEDED = "capacity exceeded"
    """Not in the reference: a configured bound (links, entries, staged entries) was hit."""


class ApplyError(NameserverError):
    """A directory command failed; the directory is unchanged.

    Attributes: ``kind`` (an ``ApplyErrorKind``), ``pid`` (the offending PID, when one is
    involved), ``expected`` / ``actual`` (chunk or sequence numbers, when relevant).
    """

    def __init__(
        self,
        kind: ApplyErrorKind,
        detail: str = "",
        *,
        pid: Pid | None = None,
        expected: int | None = None,
        actual: int | None = None,
    ) -> None:
        message = kind.value
        if detail:
            message += f": {detail}"
        if pid is not None:
            message += f" (pid {pid})"
        super().__init__(message)
        self.kind = kind
        self.detail = detail
        self.pid = pid
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_apply_error,
            (self.kind, self.detail, self.pid, self.expected, self.actual),
        )


def _rebuild_apply_error(
    kind: ApplyErrorKind,
    detail: str,
    pid: Pid | None,
    expected: int | None,
    actual: int | None,
) -> ApplyError:
    return ApplyError(kind, detail, pid=pid, expected=expected, actual=actual)


# --------------------------------------------------------------------------------------------
# Cache


class CacheErrorKind(enum.Enum):
    """Why the resolver cache refused an update (spec 2.2)."""

    RESERVED_PID = "reserved pid"
    AUTHORITY_MISMATCH = "authority mismatch"
    CONFLICTING_REVISION = "conflicting revision"
    DEADLINE_OVERFLOW = "deadline overflow"


class CacheError(NameserverError):
    """A resolver-cache operation failed; ``kind`` is a ``CacheErrorKind``. The cache is
    unchanged."""

    def __init__(self, kind: CacheErrorKind, detail: str = "") -> None:
        super().__init__(f"{kind.value}: {detail}" if detail else kind.value)
        self.kind = kind
        self.detail = detail

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.kind, self.detail))


# --------------------------------------------------------------------------------------------
# Sessions


class SessionErrorKind(enum.Enum):
    """Which session contract was broken (spec 3.1, 3.2, 3.5)."""

    RESERVED_PID = "reserved pid"
    CLOSED = "session closed"
    COMMIT_PENDING = "commit pending"
    NO_PENDING_COMMIT = "no pending commit"
    UNEXPECTED_EFFECTS = "unexpected effects"
    NOT_ACTIVE = "not active"
    UNEXPECTED_MESSAGE = "unexpected message"
    DUPLICATE_REQUEST = "duplicate request"
    UNKNOWN_REQUEST = "unknown request"
    UNKNOWN_ENUMERATION_REQUEST = "unknown enumeration request"
    RESOLUTION_PID_MISMATCH = "resolution pid mismatch"
    TOO_MANY_REQUESTS = "too many pending requests"
    PARENT_MISMATCH = "parent mismatch"
    UNSUPPORTED_VERSION = "unsupported version"
    HELLO_ALREADY_SENT = "hello already sent"
    PUBLICATION_REJECTED = "publication rejected"
    REMOVAL_FAILED = "link removal failed"
    UNEXPECTED_ACK = "unexpected acknowledgement"
    EXPORT_TOO_LARGE = "export too large"


class SessionError(NameserverError):
    """A session contract was broken; ``kind`` is a ``SessionErrorKind``."""

    def __init__(self, kind: SessionErrorKind, detail: str = "") -> None:
        super().__init__(f"{kind.value}: {detail}" if detail else kind.value)
        self.kind = kind
        self.detail = detail

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.kind, self.detail))


class LocalProtocolError(SessionError):
    """The local caller broke the session contract (a driver bug): wrong call order, a
    duplicate request id, effects that do not match the commit, use after close."""


class RemoteProtocolError(SessionError):
    """The peer broke the protocol: a message out of place, an answer to no request, a wrong
    parent or version. The link should be torn down."""


class PublicationRejected(RemoteProtocolError):
    """The directory refused the child's publication; ``cause`` (also ``__cause__``) is the
    ``ApplyError``. Every rejected publication ends the link."""

    def __init__(self, cause: ApplyError) -> None:
        super().__init__(SessionErrorKind.PUBLICATION_REJECTED, str(cause))
        self.cause = cause
        self.__cause__ = cause

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.cause,))


class RouteProjectionError(NameserverError):
    """Route projection was misused: a link opened twice, or a change applied to the route
    session of another link."""
