"""Completions (spec 4.6): what the driver hands back, and the queue it hands them through.

Why: the application never waits on the driver directly. Every accepted operation or command
produces exactly one terminal completion, and the driver also emits unsolicited lifecycle
events. Each completion is queued together with the credit permit that reserved its slot
(a ``LeasedCompletion``), and the credit stays held until the application consumes the
completion. So credits bound accepted work *and* the buffers it retains end to end, and the
driver can never be forced to drop a completion: when the queue is full ``complete_nowait``
hands both the completion and the permit back and the driver stages them.

Completions are frozen, slotted dataclasses. Outcomes are enums; codes that only exist for
some outcomes (``acknowledged_through``, reset/stop codes) are separate optional fields that
are validated against the outcome.

Consuming: ``pop_nowait`` / ``await pop()`` release the lease at once; ``pop_leased_nowait`` /
``await pop_leased()`` keep it (and a received buffer's posted-byte reservation) until
``release()`` or the end of a ``with`` block. ``discard()`` (the spec's "drop the completion
queue") releases everything still queued, posted-receive budgets included.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias, final

from chrysalis.core._pid import Pid
from chrysalis.core.completion._budget import PostedBuffer
from chrysalis.core.completion._credit import CreditPermit
from chrysalis.core.completion._errors import (
    CompletionQueueClosed,
    CompletionQueueFull,
    QueueClosed,
    QueueEmpty,
    QueueExhausted,
    QueueFull,
)
from chrysalis.core.completion._ids import (
    ConnectionRef,
    DriverId,
    OperationId,
    RequestId,
    StreamRef,
)
from chrysalis.core.completion._notify import NOOP_NOTIFIER, Notifier, _fanout
from chrysalis.core.completion._queue import (
    QueueReceiver,
    QueueSender,
    QueueStatistics,
    _discard_when_dropped,
    bounded_queue,
)
from chrysalis.core.completion._wakeup import Wakeup

if TYPE_CHECKING:  # ``_submission`` imports this module
    from chrysalis.core.completion._submission import ReceiveSubmission

__all__ = [
    "AbortStarted",
    "AuthenticationFailed",
    "CloseQueued",
    "CommandCompletion",
    "CommandError",
    "CommandFailed",
    "CommandResult",
    "Completion",
    "CompletionReceiver",
    "CompletionSender",
    "ConnectionClosed",
    "ConnectionCreated",
    "ConnectionEstablished",
    "ControlOutcome",
    "DiscardCompletion",
    "DriverStopped",
    "FinishCompletion",
    "IncomingStream",
    "LeasedCompletion",
    "ReceiveCompletion",
    "ReceiveStatus",
    "ResetCompletion",
    "SendCompletion",
    "SendOutcome",
    "ShutdownStarted",
    "StopCompletion",
    "StreamClosed",
    "StreamOpened",
    "completion_queue",
]

QUIC_VARINT_MAX = (1 << 62) - 1
"""Largest QUIC error code or stream offset (a QUIC variable-length integer)."""

MAX_DETAIL_CHARS = 1024
"""Longest ``CommandFailed.detail`` message."""


def _check_code(name: str, value: int | None) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= QUIC_VARINT_MAX:
        raise ValueError(f"{name} must be in 0..{QUIC_VARINT_MAX}, got {value}")


def _check_count(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


# --- command results ---------------------------------------------------------------------


class CommandError(enum.Enum):
    """Why a command failed."""

    WRONG_ROLE = "wrong_role"
    """The command does not apply to this endpoint's role (for example connect on a server)."""
    UNKNOWN_CONNECTION = "unknown_connection"
    """The connection handle names no live connection."""
    INVALID_ARGUMENT = "invalid_argument"
    """An argument was rejected (for example an unknown stream or a bad server name)."""
    DRIVER_STOPPED = "driver_stopped"
    """The driver stopped before executing the command."""
    TRANSPORT = "transport"
    """The transport layer failed; ``CommandFailed.detail`` says how."""


@dataclass(frozen=True, slots=True)
class ConnectionCreated:
    """Command result: a connection state machine exists (the handshake is not done yet)."""

    connection: ConnectionRef


@dataclass(frozen=True, slots=True)
class StreamOpened:
    """Command result: a local stream was opened."""

    stream: StreamRef


@dataclass(frozen=True, slots=True)
class CloseQueued:
    """Command result: closing the connection was queued."""

    connection: ConnectionRef


@dataclass(frozen=True, slots=True)
class ShutdownStarted:
    """Command result: graceful shutdown began."""


@dataclass(frozen=True, slots=True)
class AbortStarted:
    """Command result: abort began."""


@dataclass(frozen=True, slots=True)
class CommandFailed:
    """Command result: the command failed with ``error``; ``detail`` is a short message."""

    error: CommandError
    detail: str = ""

    def __post_init__(self) -> None:
        if len(self.detail) > MAX_DETAIL_CHARS:
            raise ValueError(f"detail longer than {MAX_DETAIL_CHARS} characters")


CommandResult: TypeAlias = (
    ConnectionCreated | StreamOpened | CloseQueued | ShutdownStarted | AbortStarted | CommandFailed
)
"""The result of a command."""


# --- outcomes ------------------------------------------------------------------------------


class SendOutcome(enum.Enum):
    """How a send ended."""

    ACKNOWLEDGED = "acknowledged"
    """The peer acknowledged the bytes (``acknowledged_through`` is the cumulative offset)."""
    REJECTED = "rejected"
    """The send half was already finishing or terminal."""
    ABANDONED = "abandoned"
    """The stream, connection or driver died first."""


class ReceiveStatus(enum.Enum):
    """How a receive (or discard) ended."""

    DATA = "data"
    """``min_bytes`` arrived; the stream is still open."""
    FIN = "fin"
    """The peer finished the stream (any bytes before FIN are included)."""
    RESET = "reset"
    """The peer reset the stream; ``error_code`` is its code."""
    CLOSED = "closed"
    """The stream or connection is closed (or the stream was already reclaimed)."""
    CANCELLED = "cancelled"
    """The posted receive was cancelled before anything else ended it."""
    STOPPED = "stopped"
    """This side sent STOP_SENDING; ``error_code`` is the code used."""


_STATUS_WITH_CODE = frozenset({ReceiveStatus.RESET, ReceiveStatus.STOPPED})


def _check_status_code(status: ReceiveStatus, error_code: int | None) -> None:
    _check_code("error_code", error_code)
    if (status in _STATUS_WITH_CODE) != (error_code is not None):
        raise ValueError(f"error_code is required exactly for RESET and STOPPED, not {status}")


class ControlOutcome(enum.Enum):
    """How a finish, reset or stop ended."""

    COMPLETE = "complete"
    """The control action was applied."""
    REJECTED = "rejected"
    """The stream half was already terminal."""
    ABANDONED = "abandoned"
    """The stream, connection or driver died first."""


# --- completions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandCompletion:
    """The terminal completion of the command identified by ``request``."""

    request: RequestId
    result: CommandResult


@dataclass(frozen=True, slots=True)
class ConnectionEstablished:
    """Event: the handshake completed and the peer was authenticated.

    ``local_pid`` is the routing PID that prefixes our source connection IDs on this connection
    (``Pid.LINK_LOCAL`` for a link-local endpoint); ``peer_pid`` is derived from the peer's
    certificate.
    """

    connection: ConnectionRef
    local_pid: Pid
    peer_pid: Pid


@dataclass(frozen=True, slots=True)
class AuthenticationFailed:
    """Event: the peer's identity was rejected.

    ``expected`` is the requested PID (outbound connections only); ``actual`` is the PID of the
    presented certificate, or None when no trusted certificate was presented. ``reason`` says
    in words what did not match (the presented certificate's subject and PID, and why it was
    refused); it takes no part in equality.
    """

    connection: ConnectionRef
    expected: Pid | None
    actual: Pid | None
    reason: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class IncomingStream:
    """Event: a peer-initiated bidirectional stream became readable."""

    stream: StreamRef


@dataclass(frozen=True, slots=True)
class SendCompletion:
    """The terminal completion of a send of ``nbytes`` bytes.

    ``acknowledged_through`` (the cumulative acknowledged stream offset) is set exactly when
    ``outcome`` is ACKNOWLEDGED.
    """

    operation: OperationId
    stream: StreamRef
    nbytes: int
    outcome: SendOutcome
    acknowledged_through: int | None = None

    def __post_init__(self) -> None:
        _check_count("nbytes", self.nbytes)
        _check_code("acknowledged_through", self.acknowledged_through)
        if (self.outcome is SendOutcome.ACKNOWLEDGED) != (self.acknowledged_through is not None):
            raise ValueError("acknowledged_through is required exactly for ACKNOWLEDGED")


@dataclass(frozen=True, slots=True)
class ReceiveCompletion:
    """The terminal completion of a posted receive: the same buffer comes back.

    ``buffer`` is the caller's bytearray (the same object). Bytes present when it was posted
    are preserved; ``data()`` covers only what the driver appended (``start`` to ``end``, a
    snapshot taken when the completion was built). ``error_code`` is set exactly for RESET
    and STOPPED.
    """

    operation: OperationId
    stream: StreamRef
    posted: PostedBuffer = field(repr=False, compare=False)
    status: ReceiveStatus
    error_code: int | None = None
    end: int = field(init=False)

    def __post_init__(self) -> None:
        _check_status_code(self.status, self.error_code)
        object.__setattr__(self, "end", len(self.posted.buffer))

    @property
    def buffer(self) -> bytearray:
        """The caller's bytearray, handed back."""
        return self.posted._buffer  # the slot behind ``PostedBuffer.buffer``: one call less

    @property
    def start(self) -> int:
        """Where the appended bytes begin (the length of the preserved prefix)."""
        return self.posted.start

    def data(self) -> memoryview:
        """A view of only the appended bytes.

        A memoryview pins the bytearray's size while it exists: release it (or use it in a
        ``with`` block) before resizing the buffer.
        """
        return memoryview(self.posted.buffer)[self.posted.start : self.end]


# Fast construction of the two per-operation completions. A frozen dataclass's generated
# ``__init__`` sets every field through ``object.__setattr__`` and then validates; the
# completions a driver builds from its own submissions are valid by construction once the
# caller's arguments were checked (``SendSubmission.complete``, ``ReceiveSubmission.complete``
# check them and fall back to the validating constructor otherwise), and one of each is made
# per stream operation. The slot descriptors' setters are about twice as fast.
_new = object.__new__


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The setter of a slotted field's descriptor (it bypasses a frozen class's guard)."""
    setter: Callable[[Any, Any], None] = getattr(cls, name).__set__
    return setter


_sc_operation = _slot_setter(SendCompletion, "operation")
_sc_stream = _slot_setter(SendCompletion, "stream")
_sc_nbytes = _slot_setter(SendCompletion, "nbytes")
_sc_outcome = _slot_setter(SendCompletion, "outcome")
_sc_through = _slot_setter(SendCompletion, "acknowledged_through")
_rc_operation = _slot_setter(ReceiveCompletion, "operation")
_rc_stream = _slot_setter(ReceiveCompletion, "stream")
_rc_posted = _slot_setter(ReceiveCompletion, "posted")
_rc_status = _slot_setter(ReceiveCompletion, "status")
_rc_code = _slot_setter(ReceiveCompletion, "error_code")
_rc_end = _slot_setter(ReceiveCompletion, "end")


def _make_send_completion(
    operation: OperationId,
    stream: StreamRef,
    nbytes: int,
    outcome: SendOutcome,
    acknowledged_through: int | None,
) -> SendCompletion:
    """``SendCompletion(...)`` without re-validation; equal to it when the arguments are valid
    (the caller checked them)."""
    completion: SendCompletion = _new(SendCompletion)
    _sc_operation(completion, operation)
    _sc_stream(completion, stream)
    _sc_nbytes(completion, nbytes)
    _sc_outcome(completion, outcome)
    _sc_through(completion, acknowledged_through)
    return completion


def _make_receive_completion(
    operation: OperationId, stream: StreamRef, posted: PostedBuffer, status: ReceiveStatus
) -> ReceiveCompletion:
    """``ReceiveCompletion(operation, stream, posted, status)`` without re-validation, for a
    status that carries no error code (the caller checked it)."""
    completion: ReceiveCompletion = _new(ReceiveCompletion)
    _rc_operation(completion, operation)
    _rc_stream(completion, stream)
    _rc_posted(completion, posted)
    _rc_status(completion, status)
    _rc_code(completion, None)
    _rc_end(completion, len(posted.buffer))
    return completion


@dataclass(frozen=True, slots=True)
class FinishCompletion:
    """The terminal completion of a finish (local FIN after the preceding sends)."""

    operation: OperationId
    stream: StreamRef
    outcome: ControlOutcome


@dataclass(frozen=True, slots=True)
class ResetCompletion:
    """The terminal completion of a reset (abort of the send half)."""

    operation: OperationId
    stream: StreamRef
    outcome: ControlOutcome


@dataclass(frozen=True, slots=True)
class StopCompletion:
    """The terminal completion of a stop (STOP_SENDING after the preceding receives)."""

    operation: OperationId
    stream: StreamRef
    outcome: ControlOutcome


@dataclass(frozen=True, slots=True)
class DiscardCompletion:
    """The terminal completion of a discard: ``nbytes`` received bytes were dropped.

    ``error_code`` is set exactly for RESET and STOPPED.
    """

    operation: OperationId
    stream: StreamRef
    nbytes: int
    status: ReceiveStatus
    error_code: int | None = None

    def __post_init__(self) -> None:
        _check_count("nbytes", self.nbytes)
        _check_status_code(self.status, self.error_code)


@dataclass(frozen=True, slots=True)
class StreamClosed:
    """Event: the stream's state was reclaimed; ``peer_reset_code`` if the peer reset it."""

    stream: StreamRef
    peer_reset_code: int | None = None

    def __post_init__(self) -> None:
        _check_code("peer_reset_code", self.peer_reset_code)


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """Event: the connection closed (after every completion of its operations).

    At most one of ``application_code`` (an application close code) and ``transport_code``
    (a QUIC transport error code) is set; neither for a silent close such as an idle timeout.
    """

    connection: ConnectionRef
    application_code: int | None = None
    transport_code: int | None = None

    def __post_init__(self) -> None:
        _check_code("application_code", self.application_code)
        _check_code("transport_code", self.transport_code)
        if self.application_code is not None and self.transport_code is not None:
            raise ValueError("a close has an application code or a transport code, not both")


@dataclass(frozen=True, slots=True)
class DriverStopped:
    """Event: the driver's last completion; every ownership has been returned."""

    driver: DriverId


Completion: TypeAlias = (
    CommandCompletion
    | ConnectionEstablished
    | AuthenticationFailed
    | IncomingStream
    | SendCompletion
    | ReceiveCompletion
    | FinishCompletion
    | ResetCompletion
    | StopCompletion
    | DiscardCompletion
    | StreamClosed
    | ConnectionClosed
    | DriverStopped
)
"""Everything a driver can emit."""


# --- leases and the completion queue -------------------------------------------------------


@final
class LeasedCompletion:
    """A completion together with the credit permit that reserved its slot.

    The credit (and, for a ``ReceiveCompletion``, the buffer's posted-receive reservation)
    stays held until ``release()``; releasing twice is harmless. ``with lease as completion:``
    releases at the end of the block.
    """

    __slots__ = ("_completion", "_permit")

    def __init__(self, completion: Completion, permit: CreditPermit) -> None:
        self._completion = completion
        self._permit = permit

    @property
    def completion(self) -> Completion:
        """The completion."""
        return self._completion

    @property
    def permit(self) -> CreditPermit:
        """The credit permit held by this lease."""
        return self._permit

    @property
    def released(self) -> bool:
        """True once the lease was released."""
        return self._permit.released

    def release(self) -> Completion:
        """Release the credit and any posted-receive reservation; return the completion."""
        completion = self._completion
        if isinstance(completion, ReceiveCompletion):
            completion.posted.release()
        self._permit.release()
        return completion

    def __enter__(self) -> Completion:
        return self._completion

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"LeasedCompletion({self._completion!r}, released={self.released})"


# A lease built through its slots' setters (no ``__init__`` frame): one per completion.
_lc_completion = _slot_setter(LeasedCompletion, "_completion")
_lc_permit = _slot_setter(LeasedCompletion, "_permit")


def completion_queue(
    capacity: int,
    notifier: Notifier = NOOP_NOTIFIER,
    *,
    space_notifier: Notifier = NOOP_NOTIFIER,
    threadsafe: bool = True,
) -> tuple[CompletionSender, CompletionReceiver]:
    """Create a completion queue; return the driver's sender and the application's receiver.

    Args:
        capacity: the most queued completions (a driver stages the rest).
        notifier: the consumer's notifier, signalled on the empty -> non-empty transition and
            on lifecycle changes (the receiver's own ``arrived`` wakeup is always signalled).
        space_notifier: the driver's notifier, signalled on the full -> not-full transition
            so it can retry staged completions.
        threadsafe: False promises that the driver and the application use the queue from
            one thread (see ``EndpointChannels``): the hot paths then skip their locks.
    """
    arrived = Wakeup(threadsafe=threadsafe)
    sender: QueueSender[LeasedCompletion]
    receiver: QueueReceiver[LeasedCompletion]
    sender, receiver = bounded_queue(
        capacity, _fanout(notifier, arrived), space_notifier=space_notifier, threadsafe=threadsafe
    )
    return CompletionSender(sender), CompletionReceiver(receiver, arrived)


@final
class CompletionSender:
    """The driver's end of a completion queue. Thread-safe; ``clone()`` for more producers."""

    __slots__ = ("_sender",)

    def __init__(self, sender: QueueSender[LeasedCompletion]) -> None:
        self._sender = sender

    @property
    def capacity(self) -> int:
        """The most queued completions."""
        return self._sender.capacity

    def complete_nowait(self, completion: Completion, permit: CreditPermit) -> None:
        """Queue ``completion`` leased with ``permit``.

        Raises ``CompletionQueueFull`` or ``CompletionQueueClosed``, both carrying the
        completion and the permit back. ``ValueError`` if the permit was already released or
        already backs a queued completion (a permit backs at most one completion).
        """
        sender = self._sender
        core = sender._core
        if core.single and permit._pool._single:
            # One thread (``threadsafe=False``): lease and push inline, without the locks and
            # three calls of the general path below; the same checks, the same outcomes.
            if permit._released or permit._leased:
                raise ValueError("a permit that is released or already leased cannot lease this")
            if sender._dropped or not core.admitting:
                raise CompletionQueueClosed(completion, permit)
            items = core.items
            if len(items) >= core.capacity:
                raise CompletionQueueFull(completion, permit)
            permit._leased = True
            lease: LeasedCompletion = _new(LeasedCompletion)
            _lc_completion(lease, completion)
            _lc_permit(lease, permit)
            was_empty = not items
            items.append(lease)
            core.sequence += 1
            if was_empty:
                core.notifier.notify()
            return
        if not permit._lease():
            raise ValueError("a permit that is released or already leased cannot lease this")
        try:
            sender.try_push(LeasedCompletion(completion, permit))
        except QueueFull:
            permit._unlease()
            raise CompletionQueueFull(completion, permit) from None
        except QueueClosed:
            permit._unlease()
            raise CompletionQueueClosed(completion, permit) from None

    def deliver_nowait(self, submission: ReceiveSubmission, data: bytes) -> bool:
        """Complete a posted receive with ``data`` in one step: append the bytes to its
        buffer, finish the receive and queue its ``DATA`` completion leased with the
        submission's permit, exactly as ``posted.append(data)``, ``submission.complete(DATA)``
        and ``complete_nowait`` would.

        Why: in a request/response exchange the reader's receive is already posted when the
        bytes arrive and they satisfy it; doing the three steps here builds the completion
        and the lease without a dozen property and helper calls (on the path from a datagram
        to the woken reader).

        Returns False, with nothing changed, when the receive was cancelled, ``data`` does not
        fit the buffer's spare capacity, or the buffer would still hold fewer than
        ``min_bytes`` appended bytes: the driver then takes its general path. Otherwise True,
        or ``CompletionQueueFull`` / ``CompletionQueueClosed`` carrying the completion and
        the permit back like ``complete_nowait`` (the bytes are then already appended and the
        receive finished: stage or release the completion).
        """
        cancellation = submission.cancellation
        if cancellation._requested:
            return False
        posted = submission.posted
        buffer = posted._buffer
        end = len(buffer) + len(data)
        if end > posted._capacity or end - posted._start < submission.options.min_bytes:
            return False
        buffer += data  # in place: the caller's bytearray
        if cancellation._core.single:
            cancellation._finished = True  # as ``_finish``: nothing requested (checked above)
        else:
            cancellation._finish()
        completion: ReceiveCompletion = _new(ReceiveCompletion)
        _rc_operation(completion, submission.operation)
        _rc_stream(completion, submission.stream)
        _rc_posted(completion, posted)
        _rc_status(completion, ReceiveStatus.DATA)
        _rc_code(completion, None)
        _rc_end(completion, end)
        permit = submission.permit
        sender = self._sender
        core = sender._core
        items = core.items
        if (
            core.single
            and permit._pool._single
            and not (permit._released or permit._leased or sender._dropped)
            and core.admitting
            and len(items) < core.capacity
        ):
            # ``complete_nowait``'s one-thread path, inline (one call less per delivery);
            # every other case (a refusal included) goes through it.
            permit._leased = True
            lease: LeasedCompletion = _new(LeasedCompletion)
            _lc_completion(lease, completion)
            _lc_permit(lease, permit)
            was_empty = not items
            items.append(lease)
            core.sequence += 1
            if was_empty:
                core.notifier.notify()
            return True
        self.complete_nowait(completion, permit)
        return True

    def clone(self) -> CompletionSender:
        """Return another sender handle of the same queue."""
        return CompletionSender(self._sender.clone())

    def close(self) -> None:
        """Drop this handle; after the last one the receiver sees the end once drained."""
        self._sender.close()

    def is_closed(self) -> bool:
        """True when this handle was closed or the application closed the queue."""
        return self._sender.is_closed()


def _discard_completions(receiver: QueueReceiver[LeasedCompletion]) -> list[Completion]:
    """Close the queue and release every queued lease (``CompletionReceiver.discard``)."""
    return [lease.release() for lease in receiver.discard()]


@final
class CompletionReceiver:
    """The application's end of a completion queue. Thread-safe.

    The spec's ``try_pop_leased()`` / ``try_pop()`` are ``pop_leased_nowait()`` /
    ``pop_nowait()`` here (trio naming: each has an awaitable twin). Dropping the receiver
    releases what is queued like ``discard()``: once it is garbage-collected, the discard runs
    on a short-lived thread (call ``discard()`` yourself for a prompt, deterministic release).
    """

    __slots__ = ("__weakref__", "_arrived", "_receiver")

    def __init__(self, receiver: QueueReceiver[LeasedCompletion], arrived: Wakeup) -> None:
        self._receiver = receiver
        self._arrived = arrived
        _discard_when_dropped(self, functools.partial(_discard_completions, receiver))

    @property
    def arrived(self) -> Wakeup:
        """Notified on the empty -> non-empty transition and on lifecycle changes."""
        return self._arrived

    @property
    def capacity(self) -> int:
        """The most queued completions."""
        return self._receiver.capacity

    def pop_leased_nowait(self) -> LeasedCompletion:
        """Return the oldest completion, still holding its credit.

        Raises ``QueueEmpty`` when nothing is queued, ``QueueExhausted`` when nothing will
        ever be queued again.
        """
        lease = self._receiver.try_pop()
        if lease is None:
            if self._receiver.is_closed():
                raise QueueExhausted("completion queue is closed and drained")
            raise QueueEmpty("no completion is queued")
        return lease

    def pop_nowait(self) -> Completion:
        """Return the oldest completion and release its lease at once (see
        ``pop_leased_nowait`` for the exceptions)."""
        return self.pop_leased_nowait().release()

    def drain_leased(self, max_items: int) -> list[LeasedCompletion]:
        """Return up to ``max_items`` of the oldest completions, leases held."""
        return self._receiver.drain(max_items)

    def drain_released(self, max_items: int) -> list[Completion]:
        """Remove up to ``max_items`` of the oldest completions, release their leases (the
        credit and a received buffer's posted reservation, oldest first) and return them:
        ``pop_nowait`` for each, in one call, except that an empty queue gives ``[]`` (as
        ``drain``). Why: a dispatcher that releases every lease
        before handling its completion saves two calls per completion."""
        if max_items < 0:
            raise ValueError(f"max_items must be non-negative, got {max_items}")
        core = self._receiver._core
        items = core.items
        if not items:
            return []  # as ``drain``: an item pushed concurrently is taken by the next call
        if core.single and len(items) <= max_items:
            # One thread: ``drain``'s path for a batch that takes everything, inline.
            was_full = len(items) >= core.capacity
            leases = list(items)
            items.clear()
            if was_full:
                core.space_notifier.notify()
        else:
            leases = self._receiver.drain(max_items)
        out: list[Completion] = []
        for lease in leases:
            completion = lease._completion
            if isinstance(completion, ReceiveCompletion):
                completion.posted._reservation.release()
            lease._permit.release()
            out.append(completion)
        return out

    async def pop_leased(self) -> LeasedCompletion:
        """Wait for the oldest completion (asyncio or trio), lease held.

        Raises ``QueueExhausted`` when the queue is closed and drained.
        """
        arrived = self._arrived
        while True:
            seen = arrived.epoch()
            try:
                return self.pop_leased_nowait()
            except QueueEmpty:
                pass
            await arrived.wait_async(seen)

    async def pop(self) -> Completion:
        """Wait for the oldest completion and release its lease at once."""
        lease = await self.pop_leased()
        return lease.release()

    def close(self) -> None:
        """Stop admission: the driver's next ``complete_nowait`` gets ``CompletionQueueClosed``.

        Queued completions stay poppable.
        """
        self._receiver.close()

    def discard(self) -> list[Completion]:
        """Close and release every queued completion (credits and posted-receive budgets).

        Returns the released completions, oldest first. This is the spec's "drop the queue".
        """
        return _discard_completions(self._receiver)

    def sequence(self) -> int:
        """A counter bumped by every push, close and last-sender drop."""
        return self._receiver.sequence()

    def is_closed(self) -> bool:
        """True when the queue is empty and no completion can arrive any more."""
        return self._receiver.is_closed()

    def __len__(self) -> int:
        return len(self._receiver)

    def statistics(self) -> QueueStatistics:
        """Return an immutable snapshot of the queue."""
        return self._receiver.statistics()
