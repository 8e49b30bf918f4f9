"""Errors of the actor runtime, their categories and causal chains.

Why a module of its own: failures cross process boundaries. An endpoint that raises on one
process surfaces as an ``ActorError`` at the caller; an actor that dies surfaces as a
``MeshFailure`` at its owner and a ``SupervisionError`` at every caller still waiting on it.
All three are built from one plain-data record, ``FailureEvent`` (a msgspec struct), so what
travels on the wire is data, never a live exception object the receiver might fail to rebuild.

Categories (Monarch 0.2.0 release notes: "errors are categorized (user, system,
infrastructure)" with "causal chaining" and the "first triggering event" surfaced):

- ``user``: user code failed: an endpoint, ``__init__``, ``__supervise__`` or ``__cleanup__``
  raised, or the user called ``abort()``.
- ``system``: the runtime refused or lost a message for a reason it understands: the actor is
  stopped, unknown, its mailbox is full, a supervision event went unhandled.
- ``infrastructure``: something under the runtime failed: a process died, a link went away.

A ``FailureEvent`` carries its ``cause`` (bounded to ``MAX_CHAIN`` links), so an owner that fails
because it did not handle a child's failure reports the whole chain, and ``root_cause()`` returns
the first triggering event. Its ``actor`` is the readable creation chain
(``<root>.<mymod.Trainer trainers{'gpus': 1/2}>``); ``actor_id`` links it to the internal
identifier (``path@pid``, as ``current_actor_name()`` prints it) and ``proc`` names the process
(its label) where the event was made, so a structured log line can be joined with the runtime's
own records.

``error_category(exc)`` classifies any exception the runtime hands to a user or counts in its
metrics: the category an error carries, else ``infrastructure`` for OS and connection errors,
``system`` for cancellation, ``user`` for everything else.

Codec and framing errors (``CodecError`` and subclasses) are ``ValueError`` subclasses: they are
raised for malformed or oversize input, never anything else.
"""

from __future__ import annotations

import enum
import traceback
from typing import Any

import msgspec

__all__ = [
    "MAX_CHAIN",
    "ActorError",
    "CodecError",
    "ErrorCategory",
    "FailureEvent",
    "FrameError",
    "MeshFailure",
    "MessageTooLargeError",
    "PortClosedError",
    "PortOverflowError",
    "SupervisionError",
    "error_category",
    "format_remote_traceback",
]

#: Longest causal chain kept in a ``FailureEvent`` (older links are dropped).
MAX_CHAIN = 16
#: Longest traceback text kept in a ``FailureEvent`` (characters; the tail is kept).
MAX_TRACEBACK_CHARS = 16_384

_REMOTE_HEADER = "Traceback of where the remote call failed (most recent call last):"


class ErrorCategory(enum.StrEnum):
    """Who is to blame for a failure."""

    USER = "user"
    SYSTEM = "system"
    INFRASTRUCTURE = "infrastructure"


class FailureEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Plain-data description of one failure, as it travels between processes.

    ``kind`` is ``"failed"`` (the actor died), ``"stopped"`` (it was stopped gracefully and can
    no longer be messaged), ``"unhealthy"`` (a message reached an actor already known to have
    failed; the original failure is the ``cause``) or ``"undeliverable"``. ``actor_id``
    (``path@pid``) and ``proc`` (the label of the process that made the event) are empty when
    unknown; they were added after the first fields, so older peers simply omit them.
    """

    category: str
    kind: str
    actor: str
    mesh_name: str
    rank: int
    reason: str
    traceback: str = ""
    cause: FailureEvent | None = None
    actor_id: str = ""
    proc: str = ""

    def chain(self) -> list[FailureEvent]:
        """This event followed by its causes, newest first."""
        out: list[FailureEvent] = []
        event: FailureEvent | None = self
        while event is not None and len(out) < MAX_CHAIN:
            out.append(event)
            event = event.cause
        return out

    def root_cause(self) -> FailureEvent:
        """The first triggering event of the chain."""
        return self.chain()[-1]

    def headline(self) -> str:
        """One line naming the actor and what happened to it."""
        if self.kind == "stopped":
            return f"actor mesh {self.mesh_name!r} ({self.actor}) is stopped: {self.reason}"
        if self.kind == "unhealthy":
            return f"actor {self.actor} is unhealthy with reason: {self.reason}"
        if self.kind == "undeliverable":
            return f"message to {self.actor} could not be delivered: {self.reason}"
        return f"The actor {self.actor} and all its descendants have failed: {self.reason}"

    def report(self) -> str:
        """Human-readable report of the whole chain, including remote tracebacks."""
        parts: list[str] = []
        for depth, event in enumerate(self.chain()):
            prefix = "" if depth == 0 else "Caused by: "
            parts.append(f"{prefix}{event.headline()} [{event.category}]")
            if event.traceback:
                parts.append(event.traceback.rstrip("\n"))
        return "\n".join(parts)

    def with_cause(self, cause: FailureEvent | None) -> FailureEvent:
        """A copy of this event with ``cause`` attached (chain trimmed to ``MAX_CHAIN``)."""
        return msgspec.structs.replace(self, cause=_trim(cause, MAX_CHAIN - 1))


def _trim(event: FailureEvent | None, keep: int) -> FailureEvent | None:
    if event is None or keep <= 0:
        return None
    return msgspec.structs.replace(event, cause=_trim(event.cause, keep - 1))


def format_remote_traceback(exc: BaseException) -> str:
    """Format ``exc`` with its chained causes, flagging the header as the remote call site.

    The text is bounded to ``MAX_TRACEBACK_CHARS`` (the tail, where the raise is, is kept).
    """
    text = "".join(traceback.format_exception(exc))
    text = text.replace("Traceback (most recent call last):", _REMOTE_HEADER)
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "... (traceback truncated)\n" + text[-MAX_TRACEBACK_CHARS:]
    return text


class ActorError(Exception):
    """An endpoint raised an ordinary ``Exception`` while the caller waited for a reply.

    ``exception`` is the original exception (unpickled on the caller), ``message`` says which
    call failed ("Actor call <actor>.<method> failed."), ``exception_formatted`` is the remote
    traceback including chained ``__cause__``/``__context__`` sections. ``str()`` is the message,
    a newline and that traceback. The actor survives; no supervision event is generated.
    Category: ``user``.
    """

    category = ErrorCategory.USER

    def __init__(
        self,
        exception: BaseException,
        message: str = "A remote actor call has failed.",
        exception_formatted: str | None = None,
    ) -> None:
        super().__init__(message)
        self.exception = exception
        self.message = message
        self.exception_formatted = (
            exception_formatted
            if exception_formatted is not None
            else format_remote_traceback(exception)
        )

    def __str__(self) -> str:
        return f"{self.message}\n{self.exception_formatted}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.exception, self.message, self.exception_formatted))


class SupervisionError(RuntimeError):
    """The target actor died, was stopped, or is known to be unhealthy.

    ``str()`` is ``"Endpoint call <mesh>.<method>() failed, <report>"`` when ``endpoint`` is set
    (it is settable), else the report. ``event`` is the ``FailureEvent`` behind it (``None`` for
    errors raised locally without one); ``category`` and ``root_cause`` come from the event.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        event: FailureEvent | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.event = event
        self.endpoint = endpoint
        self._message = message if message is not None else (event.report() if event else "")
        super().__init__(self._message)

    @property
    def category(self) -> ErrorCategory:
        """Category of the event (``system`` when there is none)."""
        return ErrorCategory(self.event.category) if self.event else ErrorCategory.SYSTEM

    @property
    def root_cause(self) -> FailureEvent | None:
        """First triggering event of the causal chain."""
        return self.event.root_cause() if self.event else None

    def __str__(self) -> str:
        if self.endpoint:
            return f"Endpoint call {self.endpoint}() failed, {self._message}"
        return self._message

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_supervision_error,
            (
                self._message,
                msgspec.msgpack.encode(self.event) if self.event else b"",
                self.endpoint,
            ),
        )


def _rebuild_supervision_error(
    message: str, event: bytes, endpoint: str | None
) -> SupervisionError:
    decoded = msgspec.msgpack.decode(event, type=FailureEvent) if event else None
    return SupervisionError(message, event=decoded, endpoint=endpoint)


class MeshFailure:
    """One failed rank of a mesh this actor owns, as given to ``__supervise__``.

    ``mesh_name`` is the owned mesh's internal name (compare with ``await mesh._name``),
    ``crashed_ranks`` the failed rank, ``report()`` the human-readable chain. ``mesh`` is
    ``None`` (as in the reference). Not picklable.
    """

    __slots__ = ("_event",)

    def __init__(self, event: FailureEvent) -> None:
        self._event = event

    @property
    def mesh_name(self) -> str:
        """Internal name of the failed mesh."""
        return self._event.mesh_name

    @property
    def mesh(self) -> None:
        """Always ``None``; kept for compatibility."""
        return None

    @property
    def crashed_ranks(self) -> list[int]:
        """The failed rank (one ``MeshFailure`` per rank)."""
        return [self._event.rank]

    @property
    def event(self) -> FailureEvent:
        """The underlying plain-data event."""
        return self._event

    @property
    def category(self) -> ErrorCategory:
        """Category of the failure."""
        return ErrorCategory(self._event.category)

    def report(self) -> str:
        """Human-readable report including the causal chain."""
        return self._event.report()

    def __str__(self) -> str:
        return (
            f"MeshFailure(mesh_name={self.mesh_name}, crashed_ranks={self.crashed_ranks}, "
            f"event={self._event.headline()})"
        )

    __repr__ = __str__

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("MeshFailure is not picklable")


class CodecError(ValueError):
    """Base of malformed-input errors of the message codec and framing. Category: ``system``."""

    category = ErrorCategory.SYSTEM


class FrameError(CodecError):
    """A stream frame is malformed or exceeds a configured bound."""


class MessageTooLargeError(CodecError):
    """An outgoing message exceeds the configured frame bound (raised at the sender).

    Category ``user``: the program asked to send more than the configured bound allows.
    """

    category = ErrorCategory.USER


class PortClosedError(RuntimeError):
    """A message was sent on, or received from, a port that is closed. Category: ``system``."""

    category = ErrorCategory.SYSTEM


class PortOverflowError(RuntimeError):
    """A port receiver's bounded queue overflowed; messages were dropped. Category: ``system``."""

    category = ErrorCategory.SYSTEM


def error_category(exc: BaseException) -> ErrorCategory:
    """The category of ``exc``: its own ``category`` if it carries one (every error of this
    module does), ``infrastructure`` for ``OSError`` (connections, files, timeouts of the OS),
    ``system`` for cancellation, ``user`` otherwise (an exception raised by user code)."""
    own = getattr(exc, "category", None)
    if isinstance(own, ErrorCategory):
        return own
    if isinstance(own, str) and own in _CATEGORIES:
        return ErrorCategory(own)
    if isinstance(exc, OSError):  # ConnectionError, TimeoutError, BrokenPipeError, ...
        return ErrorCategory.INFRASTRUCTURE
    if type(exc).__name__ == "CancelledError":  # asyncio's and concurrent.futures'
        return ErrorCategory.SYSTEM
    return ErrorCategory.USER


_CATEGORIES = frozenset(str(c) for c in ErrorCategory)
