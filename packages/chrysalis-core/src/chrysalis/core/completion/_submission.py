"""Submissions (spec 4.4, 4.5): admitting commands and stream operations into one FIFO.

Why: the application hands *owned* work to a driver that may run on another thread. Admission
is where every bound is enforced, in a fixed order, and every refusal hands the caller's value
back intact (the exception's ``returned``), so nothing is lost and nothing grows without bound:

- send: payload larger than the whole retained budget -> ``ExceedsBudget``; completion credit
  -> ``WouldBlock(COMPLETION_FULL)``; reserve ``len(payload)`` -> ``WouldBlock(RETAINED_BYTES)``;
  allocate the operation id and push -> ``WouldBlock(QUEUE_FULL)`` or ``SubmissionClosed``.
- receive: spare capacity ``capacity - len(buffer) < min_bytes`` -> ``InvalidReceiveBuffer``;
  capacity larger than the whole posted budget -> ``ExceedsBudget``; credit ->
  ``COMPLETION_FULL``; reserve ``capacity`` -> ``POSTED_BYTES``; id and push.
- finish, discard, reset, stop and commands: credit, then id and push.

Two capacities are deliberately distinct: the queue bounds *waiting* items, credits bound
accepted items over their whole life (until the application consumes the completion).

Commands and stream submissions share **one** FIFO and **one** credit pool (the endpoint
submission queue). So a terminal command (shutdown or abort, sent with
``submit_and_close_nowait``) is processed after everything submitted before it, and afterwards
both senders see ``SubmissionClosed``.

Fix of the reference's busy-spin: a ``WouldBlock`` names the ``Wakeup`` that the blocking
resource signals on release (queue slot, credit, retained bytes, posted bytes) and the epoch
read before the failed check. The awaitable twins (``send``, ``receive``, ``submit``, ...) wait
on exactly that wakeup and retry, and stop with ``SubmissionClosed`` once admission closed.

Cancellation of a posted receive is idempotent: the first ``cancel()`` sets the flag the driver
consults and queues a hint on a side queue. The driver drains hints before submissions; the
outcome is linearized by the driver, which builds exactly one ``ReceiveCompletion`` per receive.
The side queue holds only hints of *uncompleted* receives: completing (or discarding) a receive
removes its pending hint, so stale hints never accumulate. Each uncompleted receive holds a
completion credit, so the queue can never hold more hints than the credit capacity, and a hint
is never dropped for lack of room (the capacity check stays as a guard against a driver that
releases a receive's permit before completing it).
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar, final

from chrysalis.core.completion._budget import (
    BudgetStatistics,
    ByteBudget,
    BytesLike,
    PostedBuffer,
    RetainedBytes,
    _readonly_view,
)
from chrysalis.core.completion._completion import (
    CommandCompletion,
    CommandResult,
    ControlOutcome,
    DiscardCompletion,
    FinishCompletion,
    ReceiveCompletion,
    ReceiveStatus,
    ResetCompletion,
    SendCompletion,
    SendOutcome,
    StopCompletion,
    _make_receive_completion,
    _make_send_completion,
    _slot_setter,
)
from chrysalis.core.completion._credit import CompletionCredits, CreditPermit, CreditStatistics
from chrysalis.core.completion._errors import (
    BlockReason,
    ExceedsBudget,
    InvalidReceiveBuffer,
    QueueClosed,
    QueueFull,
    SubmissionClosed,
    WouldBlock,
)
from chrysalis.core.completion._ids import (
    U64_MAX,
    DriverId,
    OperationId,
    RequestId,
    StreamRef,
    _Counter,
    _operation_id,
)
from chrysalis.core.completion._notify import NOOP_NOTIFIER, Notifier
from chrysalis.core.completion._queue import (
    QueueReceiver,
    QueueSender,
    QueueStatistics,
    _discard_when_dropped,
    bounded_queue,
)
from chrysalis.core.completion._wakeup import Wakeup

__all__ = [
    "CancelRequest",
    "CommandReceipt",
    "CommandSender",
    "CommandSubmission",
    "DiscardSubmission",
    "EndpointSubmission",
    "EndpointSubmissionQueue",
    "FinishSubmission",
    "OperationCancellation",
    "ReceiveOptions",
    "ReceiveSubmission",
    "ResetSubmission",
    "SendSubmission",
    "StopSubmission",
    "StreamSubmission",
    "StreamSubmitter",
    "SubmissionLimits",
    "SubmissionReceipt",
    "SubmissionReceiver",
    "SubmissionStatistics",
]

C = TypeVar("C")
R = TypeVar("R")

DEFAULT_QUEUE_CAPACITY = 4096
DEFAULT_RETAINED_SEND_BYTES = 256 * 1024 * 1024
DEFAULT_POSTED_RECEIVE_BYTES = 256 * 1024 * 1024
QUIC_VARINT_MAX = (1 << 62) - 1


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def _check_varint(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value <= QUIC_VARINT_MAX:
        raise ValueError(f"{name} must be in 0..{QUIC_VARINT_MAX}, got {value}")


@dataclass(frozen=True, slots=True)
class SubmissionLimits:
    """Bounds of one endpoint's submission side (all must be at least 1).

    Attributes:
        queue_capacity: submissions (commands and stream operations) waiting at once.
        retained_send_bytes: payload bytes held by sends until they are released.
        posted_receive_bytes: capacity bytes held by posted receive buffers.
    """

    queue_capacity: int = DEFAULT_QUEUE_CAPACITY
    retained_send_bytes: int = DEFAULT_RETAINED_SEND_BYTES
    posted_receive_bytes: int = DEFAULT_POSTED_RECEIVE_BYTES

    def __post_init__(self) -> None:
        _check_positive("queue_capacity", self.queue_capacity)
        _check_positive("retained_send_bytes", self.retained_send_bytes)
        _check_positive("posted_receive_bytes", self.posted_receive_bytes)


@dataclass(frozen=True, slots=True)
class ReceiveOptions:
    """Options of a posted receive: complete once at least ``min_bytes`` (>= 1) arrived."""

    min_bytes: int = 1

    def __post_init__(self) -> None:
        _check_positive("min_bytes", self.min_bytes)


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A cancellation hint for the driver: the receive ``operation`` on ``stream``."""

    operation: OperationId
    stream: StreamRef


@dataclass(frozen=True, slots=True)
class SubmissionReceipt:
    """Proof of admission of a stream operation; ``cancellation`` only for receives."""

    operation: OperationId
    cancellation: OperationCancellation | None = None


@dataclass(frozen=True, slots=True)
class CommandReceipt:
    """Proof of admission of a command; its completion carries the same ``request``."""

    request: RequestId


@dataclass(frozen=True, slots=True)
class SubmissionStatistics:
    """A snapshot of an endpoint submission queue and the bounds it draws on."""

    queue: QueueStatistics
    credits: CreditStatistics
    retained: BudgetStatistics
    posted: BudgetStatistics
    pending_cancellations: int


# --- submissions (what the driver pops) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendSubmission:
    """Send ``payload`` on ``stream``, ordered after the stream's previous sends.

    The driver owns ``payload`` (release it, and every view split from it, once the bytes are
    acknowledged or abandoned) and ``permit`` (pass it to ``CompletionSender.complete_nowait``).
    """

    operation: OperationId
    stream: StreamRef
    payload: RetainedBytes
    permit: CreditPermit

    def complete(
        self, outcome: SendOutcome, acknowledged_through: int | None = None
    ) -> SendCompletion:
        """Build this send's terminal completion."""
        if acknowledged_through is None:
            if outcome is not SendOutcome.ACKNOWLEDGED:
                return _make_send_completion(
                    self.operation, self.stream, len(self.payload), outcome, None
                )
        elif (
            outcome is SendOutcome.ACKNOWLEDGED
            and type(acknowledged_through) is int
            and 0 <= acknowledged_through <= QUIC_VARINT_MAX
        ):
            return _make_send_completion(
                self.operation, self.stream, len(self.payload), outcome, acknowledged_through
            )
        # Invalid arguments: the validating constructor says what is wrong.
        return SendCompletion(
            self.operation, self.stream, len(self.payload), outcome, acknowledged_through
        )


@dataclass(frozen=True, slots=True)
class ReceiveSubmission:
    """Receive into ``posted`` (appending into its spare capacity) on ``stream``."""

    operation: OperationId
    stream: StreamRef
    posted: PostedBuffer
    options: ReceiveOptions
    cancellation: OperationCancellation
    permit: CreditPermit

    def complete(self, status: ReceiveStatus, error_code: int | None = None) -> ReceiveCompletion:
        """Build this receive's terminal completion (later cancels no longer reach the driver).

        The driver linearizes the outcome: if ``cancellation.cancelled`` was seen before any
        other outcome it completes with CANCELLED, otherwise with what happened first.
        """
        self.cancellation._finish()
        if error_code is None and status in _STATUS_WITHOUT_CODE:
            return _make_receive_completion(self.operation, self.stream, self.posted, status)
        return ReceiveCompletion(self.operation, self.stream, self.posted, status, error_code)


@dataclass(frozen=True, slots=True)
class FinishSubmission:
    """Send FIN on ``stream`` after its preceding sends."""

    operation: OperationId
    stream: StreamRef
    permit: CreditPermit

    def complete(self, outcome: ControlOutcome) -> FinishCompletion:
        """Build this finish's terminal completion."""
        return FinishCompletion(self.operation, self.stream, outcome)


@dataclass(frozen=True, slots=True)
class DiscardSubmission:
    """Consume up to ``max_bytes`` received bytes of ``stream`` without copying them out."""

    operation: OperationId
    stream: StreamRef
    max_bytes: int
    permit: CreditPermit

    def complete(
        self, nbytes: int, status: ReceiveStatus, error_code: int | None = None
    ) -> DiscardCompletion:
        """Build this discard's terminal completion."""
        return DiscardCompletion(self.operation, self.stream, nbytes, status, error_code)


@dataclass(frozen=True, slots=True)
class ResetSubmission:
    """Reset the send half of ``stream`` with ``error_code`` after its preceding sends."""

    operation: OperationId
    stream: StreamRef
    error_code: int
    permit: CreditPermit

    def complete(self, outcome: ControlOutcome) -> ResetCompletion:
        """Build this reset's terminal completion."""
        return ResetCompletion(self.operation, self.stream, outcome)


@dataclass(frozen=True, slots=True)
class StopSubmission:
    """Send STOP_SENDING with ``error_code`` on ``stream`` after its preceding receives."""

    operation: OperationId
    stream: StreamRef
    error_code: int
    permit: CreditPermit

    def complete(self, outcome: ControlOutcome) -> StopCompletion:
        """Build this stop's terminal completion."""
        return StopCompletion(self.operation, self.stream, outcome)


@dataclass(frozen=True, slots=True)
class CommandSubmission(Generic[C]):
    """A driver command (its type is chosen by the driver package) and its credit."""

    request: RequestId
    command: C
    permit: CreditPermit

    def complete(self, result: CommandResult) -> CommandCompletion:
        """Build this command's terminal completion."""
        return CommandCompletion(self.request, result)


StreamSubmission: TypeAlias = (
    SendSubmission
    | ReceiveSubmission
    | FinishSubmission
    | DiscardSubmission
    | ResetSubmission
    | StopSubmission
)
"""Any stream operation."""

EndpointSubmission: TypeAlias = CommandSubmission[C] | StreamSubmission
"""One item of the endpoint's shared FIFO."""


_STATUS_WITHOUT_CODE: frozenset[ReceiveStatus] = frozenset(
    {ReceiveStatus.DATA, ReceiveStatus.FIN, ReceiveStatus.CLOSED, ReceiveStatus.CANCELLED}
)
"""Receive outcomes that carry no error code (the fast completion path)."""

# One submission and one receipt are made per stream operation. Frozen dataclasses set every
# field through ``object.__setattr__``; the submitter's values are valid by construction, so
# these builders set the slots through their descriptors (about twice as fast). Each is equal
# to calling the class.
_new = object.__new__
_ss_fields = tuple(
    _slot_setter(SendSubmission, name) for name in ("operation", "stream", "payload", "permit")
)
_rs_fields = tuple(
    _slot_setter(ReceiveSubmission, name)
    for name in ("operation", "stream", "posted", "options", "cancellation", "permit")
)
_receipt_operation = _slot_setter(SubmissionReceipt, "operation")
_receipt_cancellation = _slot_setter(SubmissionReceipt, "cancellation")


def _send_submission(
    operation: OperationId, stream: StreamRef, payload: RetainedBytes, permit: CreditPermit
) -> SendSubmission:
    submission: SendSubmission = _new(SendSubmission)
    set_operation, set_stream, set_payload, set_permit = _ss_fields
    set_operation(submission, operation)
    set_stream(submission, stream)
    set_payload(submission, payload)
    set_permit(submission, permit)
    return submission


def _receive_submission(
    operation: OperationId,
    stream: StreamRef,
    posted: PostedBuffer,
    options: ReceiveOptions,
    cancellation: OperationCancellation,
    permit: CreditPermit,
) -> ReceiveSubmission:
    submission: ReceiveSubmission = _new(ReceiveSubmission)
    set_operation, set_stream, set_posted, set_options, set_cancellation, set_permit = _rs_fields
    set_operation(submission, operation)
    set_stream(submission, stream)
    set_posted(submission, posted)
    set_options(submission, options)
    set_cancellation(submission, cancellation)
    set_permit(submission, permit)
    return submission


def _receipt(
    operation: OperationId, cancellation: OperationCancellation | None = None
) -> SubmissionReceipt:
    receipt: SubmissionReceipt = _new(SubmissionReceipt)
    _receipt_operation(receipt, operation)
    _receipt_cancellation(receipt, cancellation)
    return receipt


def _release_submission(submission: CommandSubmission[Any] | StreamSubmission) -> None:
    """Release everything a never-executed submission owns."""
    if isinstance(submission, SendSubmission):
        submission.payload.release()
    elif isinstance(submission, ReceiveSubmission):
        submission.cancellation._finish()
        submission.posted.release()
    submission.permit.release()


# --- shared core ---------------------------------------------------------------------------


@final
class _SubmissionCore:
    """State shared by the senders and the receiver of one endpoint submission queue."""

    __slots__ = (
        "cancel_capacity",
        "cancel_lock",
        "cancel_open",
        "cancellations",
        "credits",
        "driver",
        "notifier",
        "operations",
        "posted",
        "requests",
        "retained",
        "single",
        "space",
    )

    def __init__(
        self,
        driver: DriverId,
        limits: SubmissionLimits,
        credits: CompletionCredits,
        notifier: Notifier,
        threadsafe: bool = True,
    ) -> None:
        self.driver = driver
        self.credits = credits
        self.notifier = notifier
        self.single = not threadsafe
        self.space = Wakeup(threadsafe=threadsafe)
        self.retained = ByteBudget(
            limits.retained_send_bytes, name="retained-send", threadsafe=threadsafe
        )
        self.posted = ByteBudget(
            limits.posted_receive_bytes, name="posted-receive", threadsafe=threadsafe
        )
        self.operations = _Counter("OperationId", U64_MAX, threadsafe=threadsafe)
        self.requests = _Counter("RequestId", U64_MAX, threadsafe=threadsafe)
        self.cancel_lock = threading.Lock()
        # Pending hints by operation, oldest first (a dict, so that finishing a receive removes
        # its hint in O(1)).
        self.cancellations: dict[OperationId, CancelRequest] = {}
        self.cancel_capacity = credits.capacity
        self.cancel_open = True

    def wake_blocked(self) -> None:
        """Wake every submitter waiting on a bound, so it observes that admission closed."""
        self.space.notify()
        self.credits.released.notify()
        self.retained.released.notify()
        self.posted.released.notify()

    def check_stream(self, stream: StreamRef) -> None:
        if not isinstance(stream, StreamRef):
            raise TypeError(f"stream must be a StreamRef, not {type(stream).__name__}")
        driver = stream.connection.driver
        if driver is not self.driver and driver != self.driver:  # identity: the common case
            raise ValueError(f"{stream} belongs to another driver than {self.driver}")


@final
class OperationCancellation:
    """Cancels one posted receive. Thread-safe, idempotent.

    ``cancel()`` returns True only the first time. The receive then completes *either* with
    ``ReceiveStatus.CANCELLED`` *or* with whatever outcome won first, never both, and the
    buffer always comes back.
    """

    __slots__ = ("_core", "_finished", "_operation", "_requested", "_stream")

    def __init__(self, core: _SubmissionCore, operation: OperationId, stream: StreamRef) -> None:
        self._core = core
        self._operation = operation
        self._stream = stream
        self._requested = False
        self._finished = False

    @property
    def operation(self) -> OperationId:
        """The receive this cancels."""
        return self._operation

    @property
    def stream(self) -> StreamRef:
        """The stream of the receive."""
        return self._stream

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` was called (the flag the driver consults)."""
        return self._requested

    def cancel(self) -> bool:
        """Request cancellation; True the first time. Notifies the driver.

        If the receive already completed this only records the request. Otherwise the hint is
        queued for the driver (never dropped: see the module docstring for why the side queue
        always has room) until the driver drains it or the receive completes.
        """
        core = self._core
        with core.cancel_lock:
            if self._requested:
                return False
            self._requested = True
            hint = (
                not self._finished
                and core.cancel_open
                and len(core.cancellations) < core.cancel_capacity
            )
            if hint:
                core.cancellations[self._operation] = CancelRequest(self._operation, self._stream)
        if hint:
            core.notifier.notify()
        return True

    def _finish(self) -> None:
        core = self._core
        if core.single:
            self._finished = True
            if self._requested:
                core.cancellations.pop(self._operation, None)
            return
        with core.cancel_lock:
            self._finished = True
            if self._requested:
                core.cancellations.pop(self._operation, None)  # the hint is stale now

    def __repr__(self) -> str:
        return f"OperationCancellation({self._operation}, cancelled={self._requested})"


async def _admit(sender: QueueSender[Any], attempt: Callable[[], R]) -> R:
    """Retry ``attempt`` until admitted, waiting on the blocking resource's release."""
    while True:
        try:
            return attempt()
        except WouldBlock as exc:
            if sender.is_closed():
                raise SubmissionClosed(exc.returned) from None
            await exc.released.wait_async(exc.epoch)


# --- senders -------------------------------------------------------------------------------


def _undo_send(retained: RetainedBytes, permit: CreditPermit) -> None:
    """Give back what a send that was not queued holds."""
    retained.release()
    permit.release()


def _undo_receive(submission: ReceiveSubmission) -> None:
    """Give back what a receive that was not queued holds."""
    submission.cancellation._finish()
    submission.posted.release()
    submission.permit.release()


@final
class StreamSubmitter:
    """Admits stream operations (send, receive, finish, discard, reset, stop). Thread-safe.

    Each ``*_nowait`` method either admits the operation and returns a ``SubmissionReceipt``
    or raises one of ``WouldBlock``, ``SubmissionClosed``, ``ExceedsBudget`` or
    ``InvalidReceiveBuffer`` with the caller's value in ``returned``. The awaitable twins
    (asyncio or trio) wait for the blocking bound to be released and retry; they return once
    the operation is *admitted*, not when it completes.

    ``clone()`` makes another counted handle sharing the operation-id counter; ``close()``
    drops this handle.
    """

    __slots__ = ("_core", "_sender")

    def __init__(self, core: _SubmissionCore, sender: QueueSender[Any]) -> None:
        self._core = core
        self._sender = sender

    @property
    def driver(self) -> DriverId:
        """The driver this submitter feeds."""
        return self._core.driver

    # Lost-wakeup safety: a ``WouldBlock`` carries the epoch of its bound's wakeup taken
    # *before* the attempt that failed, so that a release racing with the attempt makes the
    # wait return at once. With ``threadsafe=False`` nothing runs between the attempt and a
    # snapshot taken after it (one thread), so the snapshot is taken only on failure: two
    # Python calls less per bound per admitted operation.

    def _push(
        self, submission: StreamSubmission, returned: object, undo: Callable[[], object]
    ) -> None:
        core = self._core
        space = core.space
        seen = 0 if core.single else space.epoch()
        try:
            self._sender.try_push(submission)
        except QueueFull:
            undo()
            if core.single:
                seen = space.epoch()
            raise WouldBlock(BlockReason.QUEUE_FULL, returned, space, seen) from None
        except QueueClosed:
            undo()
            raise SubmissionClosed(returned) from None

    def _credit(self, returned: object) -> CreditPermit:
        core = self._core
        credits = core.credits
        if core.single:
            permit = credits.try_acquire()
            if permit is None:
                released = credits.released
                raise WouldBlock(BlockReason.COMPLETION_FULL, returned, released, released.epoch())
            return permit
        seen = credits.released.epoch()
        permit = credits.try_acquire()
        if permit is None:
            raise WouldBlock(BlockReason.COMPLETION_FULL, returned, credits.released, seen)
        return permit

    def send_nowait(self, stream: StreamRef, payload: BytesLike) -> SubmissionReceipt:
        """Admit a send of ``payload`` (ownership passes to the driver until released)."""
        core = self._core
        if type(stream) is not StreamRef or stream.connection.driver is not core.driver:
            core.check_stream(stream)  # the full check (and its error) off the common path
        view = _readonly_view(payload)
        nbytes = view.nbytes
        retained_budget = core.retained
        if nbytes > retained_budget._capacity:
            raise ExceedsBudget(
                BlockReason.RETAINED_BYTES, payload, nbytes, retained_budget.capacity
            )
        # One thread: take the credit inline; a refusal (and every threadsafe admission)
        # goes through ``_credit``, which raises the ``WouldBlock``.
        permit = core.credits.try_acquire() if core.single else None
        if permit is None:
            permit = self._credit(payload)
        seen = 0 if core.single else retained_budget.released.epoch()
        retained = retained_budget._try_retain_view(payload, view)
        if retained is None:
            permit.release()
            if core.single:
                seen = retained_budget.released.epoch()
            raise WouldBlock(BlockReason.RETAINED_BYTES, payload, retained_budget.released, seen)
        operation = _operation_id(core.driver, core.operations.next())
        self._push(
            _send_submission(operation, stream, retained, permit),
            payload,
            functools.partial(_undo_send, retained, permit),
        )
        return _receipt(operation)

    def send_direct_nowait(self, stream: StreamRef, payload: BytesLike) -> SendSubmission | None:
        """Admit a send for the driver to execute at once instead of queueing it (a send lane).

        Why: on one thread (``threadsafe=False``) a driver that is handed a small send while
        nothing waits in the queue can execute it on the spot, without the push, the
        notification and the drain that only carry it to that same driver.

        Admission is ``send_nowait``'s: the stream check, one completion credit, the payload's
        bytes retained against the budget and a fresh operation id, so budgets and credits
        are accounted exactly as for a queued send; the caller (the driver, on the channels'
        one thread) must execute the returned submission at once, exactly as one it popped
        (its completion releases the retained bytes and the credit). Returns None, having
        taken nothing, whenever the queued path must be used instead: thread-safe channels;
        anything queued ahead of it (a submission or a cancellation hint: the driver takes
        those first, so executing this one now could overtake them); admission closed or
        this handle dropped; a bound that refuses (``send_nowait`` then raises the
        ``WouldBlock``, ``ExceedsBudget`` or ``SubmissionClosed`` the caller waits on).
        """
        core = self._core
        if not core.single or core.cancellations:
            return None
        sender = self._sender
        queue = sender._core
        if queue.items or not queue.admitting or sender._dropped:
            return None
        if type(stream) is not StreamRef or stream.connection.driver is not core.driver:
            core.check_stream(stream)  # the full check (and its error) off the common path
        view = memoryview(payload) if type(payload) is bytes else _readonly_view(payload)
        retained_budget = core.retained
        if view.nbytes > retained_budget._capacity:
            return None
        permit = core.credits.try_acquire()
        if permit is None:
            return None
        retained = retained_budget._try_retain_view(payload, view)
        if retained is None:
            permit.release()
            return None
        operation = _operation_id(core.driver, core.operations.next())
        return _send_submission(operation, stream, retained, permit)

    def receive_nowait(
        self,
        stream: StreamRef,
        buffer: bytearray,
        capacity: int,
        options: ReceiveOptions = ReceiveOptions(),
    ) -> SubmissionReceipt:
        """Admit a receive appending into ``buffer`` up to ``capacity`` total bytes.

        The whole ``capacity`` is reserved against the posted-receive budget. The receipt's
        ``cancellation`` cancels the receive.
        """
        core = self._core
        if type(stream) is not StreamRef or stream.connection.driver is not core.driver:
            core.check_stream(stream)  # the full check (and its error) off the common path
        if not isinstance(buffer, bytearray):
            raise TypeError(f"a posted buffer must be a bytearray, not {type(buffer).__name__}")
        if not isinstance(capacity, int) or isinstance(capacity, bool):
            raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
        if capacity - len(buffer) < options.min_bytes:
            raise InvalidReceiveBuffer(buffer, capacity, options)
        posted_budget = core.posted
        if capacity > posted_budget._capacity:
            raise ExceedsBudget(BlockReason.POSTED_BYTES, buffer, capacity, posted_budget.capacity)
        permit = core.credits.try_acquire() if core.single else None  # as in ``send_nowait``
        if permit is None:
            permit = self._credit(buffer)
        seen = 0 if core.single else posted_budget.released.epoch()
        posted = posted_budget._try_post_checked(buffer, capacity)  # checked above
        if posted is None:
            permit.release()
            if core.single:
                seen = posted_budget.released.epoch()
            raise WouldBlock(BlockReason.POSTED_BYTES, buffer, posted_budget.released, seen)
        operation = _operation_id(core.driver, core.operations.next())
        cancellation = OperationCancellation(core, operation, stream)
        submission = _receive_submission(operation, stream, posted, options, cancellation, permit)
        self._push(submission, buffer, functools.partial(_undo_receive, submission))
        return _receipt(operation, cancellation)

    def _control(
        self, stream: StreamRef, build: Callable[[OperationId, CreditPermit], StreamSubmission]
    ) -> SubmissionReceipt:
        core = self._core
        core.check_stream(stream)
        permit = self._credit(None)
        operation = _operation_id(core.driver, core.operations.next())
        self._push(build(operation, permit), None, permit.release)
        return SubmissionReceipt(operation)

    def finish_nowait(self, stream: StreamRef) -> SubmissionReceipt:
        """Admit a FIN on ``stream`` (after its preceding sends)."""
        return self._control(stream, lambda op, permit: FinishSubmission(op, stream, permit))

    def discard_nowait(self, stream: StreamRef, max_bytes: int) -> SubmissionReceipt:
        """Admit discarding up to ``max_bytes`` (>= 1) received bytes of ``stream``."""
        _check_positive("max_bytes", max_bytes)
        return self._control(
            stream, lambda op, permit: DiscardSubmission(op, stream, max_bytes, permit)
        )

    def reset_nowait(self, stream: StreamRef, error_code: int) -> SubmissionReceipt:
        """Admit a reset of ``stream``'s send half (bytes already accepted stay accepted)."""
        _check_varint("error_code", error_code)
        return self._control(
            stream, lambda op, permit: ResetSubmission(op, stream, error_code, permit)
        )

    def stop_nowait(self, stream: StreamRef, error_code: int) -> SubmissionReceipt:
        """Admit STOP_SENDING on ``stream`` (after its preceding receives and discards)."""
        _check_varint("error_code", error_code)
        return self._control(
            stream, lambda op, permit: StopSubmission(op, stream, error_code, permit)
        )

    async def send(self, stream: StreamRef, payload: BytesLike) -> SubmissionReceipt:
        """Wait until the send is admitted (see ``send_nowait``)."""
        return await _admit(self._sender, lambda: self.send_nowait(stream, payload))

    async def receive(
        self,
        stream: StreamRef,
        buffer: bytearray,
        capacity: int,
        options: ReceiveOptions = ReceiveOptions(),
    ) -> SubmissionReceipt:
        """Wait until the receive is admitted (see ``receive_nowait``)."""
        return await _admit(
            self._sender, lambda: self.receive_nowait(stream, buffer, capacity, options)
        )

    async def finish(self, stream: StreamRef) -> SubmissionReceipt:
        """Wait until the finish is admitted."""
        return await _admit(self._sender, lambda: self.finish_nowait(stream))

    async def discard(self, stream: StreamRef, max_bytes: int) -> SubmissionReceipt:
        """Wait until the discard is admitted."""
        return await _admit(self._sender, lambda: self.discard_nowait(stream, max_bytes))

    async def reset(self, stream: StreamRef, error_code: int) -> SubmissionReceipt:
        """Wait until the reset is admitted."""
        return await _admit(self._sender, lambda: self.reset_nowait(stream, error_code))

    async def stop(self, stream: StreamRef, error_code: int) -> SubmissionReceipt:
        """Wait until the stop is admitted."""
        return await _admit(self._sender, lambda: self.stop_nowait(stream, error_code))

    def clone(self) -> StreamSubmitter:
        """Return another handle (sharing the operation-id counter)."""
        return StreamSubmitter(self._core, self._sender.clone())

    def close(self) -> None:
        """Drop this handle (idempotent)."""
        self._sender.close()

    def is_closed(self) -> bool:
        """True when this handle was closed or the queue no longer admits work."""
        return self._sender.is_closed()


@final
class CommandSender(Generic[C]):
    """Admits driver commands of type ``C`` into the endpoint FIFO. Thread-safe.

    ``submit_nowait`` raises ``WouldBlock`` (QUEUE_FULL or COMPLETION_FULL) or
    ``SubmissionClosed`` with the command in ``returned``. ``submit_and_close_nowait`` admits
    a terminal command and closes admission for every sender of the endpoint.
    """

    __slots__ = ("_core", "_sender")

    def __init__(self, core: _SubmissionCore, sender: QueueSender[Any]) -> None:
        self._core = core
        self._sender = sender

    @property
    def driver(self) -> DriverId:
        """The driver this sender feeds."""
        return self._core.driver

    def _submit(self, command: C, *, terminal: bool) -> CommandReceipt:
        core = self._core
        credits = core.credits
        seen = credits.released.epoch()
        permit = credits.try_acquire()
        if permit is None:
            raise WouldBlock(BlockReason.COMPLETION_FULL, command, credits.released, seen)
        request = RequestId(core.driver, core.requests.next())
        submission = CommandSubmission(request, command, permit)
        space = core.space
        seen = space.epoch()
        try:
            if terminal:
                self._sender.try_push_and_close(submission)
            else:
                self._sender.try_push(submission)
        except QueueFull:
            permit.release()
            raise WouldBlock(BlockReason.QUEUE_FULL, command, space, seen) from None
        except QueueClosed:
            permit.release()
            raise SubmissionClosed(command) from None
        if terminal:
            core.wake_blocked()
        return CommandReceipt(request)

    def submit_nowait(self, command: C) -> CommandReceipt:
        """Admit ``command``; its completion carries the receipt's ``request``."""
        return self._submit(command, terminal=False)

    def submit_and_close_nowait(self, command: C) -> CommandReceipt:
        """Admit a terminal ``command`` (shutdown, abort) and close admission atomically."""
        return self._submit(command, terminal=True)

    async def submit(self, command: C) -> CommandReceipt:
        """Wait until ``command`` is admitted."""
        return await _admit(self._sender, lambda: self._submit(command, terminal=False))

    async def submit_and_close(self, command: C) -> CommandReceipt:
        """Wait until the terminal ``command`` is admitted, then admission is closed."""
        return await _admit(self._sender, lambda: self._submit(command, terminal=True))

    def clone(self) -> CommandSender[C]:
        """Return another handle (sharing the request-id counter)."""
        return CommandSender(self._core, self._sender.clone())

    def close(self) -> None:
        """Drop this handle (idempotent)."""
        self._sender.close()

    def is_closed(self) -> bool:
        """True when this handle was closed or the queue no longer admits work."""
        return self._sender.is_closed()


# --- receiver (driver side) ----------------------------------------------------------------


def _discard_submissions(
    core: _SubmissionCore, receiver: QueueReceiver[Any]
) -> list[EndpointSubmission[Any]]:
    """Close the queue and release everything queued (``SubmissionReceiver.discard``)."""
    items: list[EndpointSubmission[Any]] = receiver.discard()
    with core.cancel_lock:
        core.cancel_open = False
        core.cancellations.clear()
    for item in items:
        _release_submission(item)
    core.wake_blocked()
    return items


@final
class SubmissionReceiver(Generic[C]):
    """The driver's end of the endpoint submission queue. Thread-safe.

    Drain ``drain_cancellations`` before submissions. ``close()`` stops admission but keeps
    accepted work poppable; ``discard()`` (the spec's "drop the queue") closes and releases
    everything still queued: credits, retained bytes, posted buffers. Dropping the receiver
    does the same: once it is garbage-collected, ``discard()`` runs on a short-lived thread
    (so a driver that simply goes away never strands the application's credits and budgets;
    call ``discard()`` yourself for a prompt, deterministic release).
    """

    __slots__ = ("__weakref__", "_core", "_queue", "_receiver")

    def __init__(self, core: _SubmissionCore, receiver: QueueReceiver[Any]) -> None:
        self._core = core
        self._receiver = receiver
        # The queue's shared state, for the two lock-free answers a driver asks for on every
        # poll ("nothing queued", "still open") without a second call through the receiver.
        self._queue = receiver._core
        _discard_when_dropped(self, functools.partial(_discard_submissions, core, receiver))

    @property
    def driver(self) -> DriverId:
        """The driver this queue feeds."""
        return self._core.driver

    @property
    def retained_budget(self) -> ByteBudget:
        """The retained-send byte budget."""
        return self._core.retained

    @property
    def posted_budget(self) -> ByteBudget:
        """The posted-receive byte budget."""
        return self._core.posted

    @property
    def credits(self) -> CompletionCredits:
        """The completion credit pool shared with the completion side."""
        return self._core.credits

    def try_pop(self) -> EndpointSubmission[C] | None:
        """Remove and return the oldest submission, or None when the queue is empty."""
        item: EndpointSubmission[C] | None = self._receiver.try_pop()
        return item

    def drain(self, max_items: int) -> list[EndpointSubmission[C]]:
        """Remove and return up to ``max_items`` of the oldest submissions."""
        if not self._queue.items and max_items >= 0:
            return []  # empty: the receiver's own lock-free answer, one call less
        items: list[EndpointSubmission[C]] = self._receiver.drain(max_items)
        return items

    def drain_cancellations(self, max_items: int) -> list[CancelRequest]:
        """Remove and return up to ``max_items`` pending cancellation hints (oldest first)."""
        if max_items < 0:
            raise ValueError(f"max_items must be non-negative, got {max_items}")
        core = self._core
        if not core.cancellations:
            # The common case, without the lock: a hint added concurrently is simply taken by
            # the next drain, as if it had arrived just after this one.
            return []
        with core.cancel_lock:
            pending = core.cancellations
            taken = list(itertools.islice(pending, max_items))
            return [pending.pop(operation) for operation in taken]

    def close(self) -> None:
        """Stop admission (senders then see ``SubmissionClosed``); queued work stays."""
        self._receiver.close()
        self._core.wake_blocked()

    def discard(self) -> list[EndpointSubmission[C]]:
        """Close and release everything queued; return the released submissions."""
        items: list[EndpointSubmission[C]] = _discard_submissions(self._core, self._receiver)
        return items

    def sequence(self) -> int:
        """A counter bumped by every push, close and last-sender drop (sends admitted by
        ``send_direct_nowait`` are never pushed, so they do not count)."""
        return self._receiver.sequence()

    def is_closed(self) -> bool:
        """True when the queue is empty and nothing more can be admitted."""
        queue = self._queue
        if queue.admitting and queue.senders > 0:
            return False  # open (closing never reverts): the receiver's lock-free answer
        return self._receiver.is_closed()

    def __len__(self) -> int:
        return len(self._receiver)

    def statistics(self) -> SubmissionStatistics:
        """Return an immutable snapshot of the queue, credits and budgets."""
        core = self._core
        with core.cancel_lock:
            pending = len(core.cancellations)
        return SubmissionStatistics(
            queue=self._receiver.statistics(),
            credits=core.credits.statistics(),
            retained=core.retained.statistics(),
            posted=core.posted.statistics(),
            pending_cancellations=pending,
        )


@final
class EndpointSubmissionQueue(Generic[C]):
    """One endpoint's submission side: a command sender and a stream submitter sharing one
    FIFO and one credit pool, and the driver's receiver.

    Usage: ``queue = EndpointSubmissionQueue[MyCommand](driver, limits, credits, notifier)``,
    then hand ``queue.commands`` and ``queue.streams`` to the application and
    ``queue.receiver`` to the driver.

    Args:
        driver: the driver identity stamped on every operation and request id.
        limits: queue capacity and the two byte budgets.
        credits: the completion credit pool (shared with the completion queue's consumer).
        notifier: the driver's notifier (arrivals, cancellations, lifecycle changes).
        threadsafe: False promises that submitters and the driver run on one thread (see
            ``EndpointChannels``): the hot admission paths then skip their locks.
    """

    __slots__ = ("commands", "receiver", "streams")

    def __init__(
        self,
        driver: DriverId,
        limits: SubmissionLimits,
        credits: CompletionCredits,
        notifier: Notifier = NOOP_NOTIFIER,
        *,
        threadsafe: bool = True,
    ) -> None:
        core = _SubmissionCore(driver, limits, credits, notifier, threadsafe)
        sender: QueueSender[Any]
        receiver: QueueReceiver[Any]
        sender, receiver = bounded_queue(
            limits.queue_capacity, notifier, space_notifier=core.space, threadsafe=threadsafe
        )
        self.commands: CommandSender[C] = CommandSender(core, sender)
        self.streams = StreamSubmitter(core, sender.clone())
        self.receiver: SubmissionReceiver[C] = SubmissionReceiver(core, receiver)
