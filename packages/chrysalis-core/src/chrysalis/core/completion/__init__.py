"""The runtime-neutral completion model of Chrysalis (spec "chrysalis-transport-core").

Applications hand *owned* buffers and commands to a driver (the single owner of protocol
state, possibly on its own thread) through bounded, non-blocking queues; the driver hands the
same buffers back in completions through a second bounded queue. Nothing here imports asyncio
or trio: wakeups go through the ``Notifier`` protocol, and ``Wakeup`` lets threads, asyncio
tasks and trio tasks wait on those signals (the runtime-specific code loads on first use).

Guarantees:

1. Every accepted operation or command produces exactly one terminal completion (unless the
   driver drops its queue with ``SubmissionReceiver.discard``, which releases everything).
2. A completion credit is reserved at admission and freed only when the application consumes
   the completion; unsolicited lifecycle events draw on a separate event-credit pool.
3. Every submitted buffer comes back (or is released) exactly once; refusals return it intact.
4. Every queue, pool and budget is bounded; a blocked submitter waits on the release of the
   exact bound that blocked it instead of spinning.

Building blocks: ``bounded_queue`` (MPSC), ``CompletionCredits``, ``ByteBudget`` with
``RetainedBytes`` / ``PostedBuffer``, the local ids, ``EndpointSubmissionQueue`` (commands and
stream operations in one FIFO), ``completion_queue`` and ``EndpointChannels`` (all of it wired
together for one endpoint).
"""

from __future__ import annotations

from chrysalis.core.completion._budget import (
    BudgetStatistics,
    ByteBudget,
    ByteReservation,
    BytesLike,
    PostedBuffer,
    RetainedBytes,
)
from chrysalis.core.completion._completion import (
    AbortStarted,
    AuthenticationFailed,
    CloseQueued,
    CommandCompletion,
    CommandError,
    CommandFailed,
    CommandResult,
    Completion,
    CompletionReceiver,
    CompletionSender,
    ConnectionClosed,
    ConnectionCreated,
    ConnectionEstablished,
    ControlOutcome,
    DiscardCompletion,
    DriverStopped,
    FinishCompletion,
    IncomingStream,
    LeasedCompletion,
    ReceiveCompletion,
    ReceiveStatus,
    ResetCompletion,
    SendCompletion,
    SendOutcome,
    ShutdownStarted,
    StopCompletion,
    StreamClosed,
    StreamOpened,
    completion_queue,
)
from chrysalis.core.completion._credit import (
    EVENT_CREDIT_CAPACITY,
    CompletionCredits,
    CreditPermit,
    CreditStatistics,
)
from chrysalis.core.completion._endpoint import EndpointChannels
from chrysalis.core.completion._errors import (
    BlockReason,
    BufferCapacityError,
    CompletionModelError,
    CompletionQueueClosed,
    CompletionQueueFull,
    ExceedsBudget,
    IdExhausted,
    InvalidReceiveBuffer,
    QueueClosed,
    QueueEmpty,
    QueueExhausted,
    QueueFull,
    SubmissionClosed,
    SubmissionRejected,
    TooManyWaiters,
    TryCompleteError,
    WouldBlock,
)
from chrysalis.core.completion._ids import (
    ConnectionRef,
    ConnectionRefAllocator,
    DriverId,
    DriverIdAllocator,
    OperationId,
    RequestId,
    StreamRef,
    next_driver_id,
)
from chrysalis.core.completion._notify import NOOP_NOTIFIER, NoopNotifier, Notifier
from chrysalis.core.completion._queue import (
    QueueReceiver,
    QueueSender,
    QueueStatistics,
    bounded_queue,
)
from chrysalis.core.completion._submission import (
    CancelRequest,
    CommandReceipt,
    CommandSender,
    CommandSubmission,
    DiscardSubmission,
    EndpointSubmission,
    EndpointSubmissionQueue,
    FinishSubmission,
    OperationCancellation,
    ReceiveOptions,
    ReceiveSubmission,
    ResetSubmission,
    SendSubmission,
    StopSubmission,
    StreamSubmission,
    StreamSubmitter,
    SubmissionLimits,
    SubmissionReceipt,
    SubmissionReceiver,
    SubmissionStatistics,
)
from chrysalis.core.completion._wakeup import Wakeup, WakeupStatistics

__all__ = [
    "EVENT_CREDIT_CAPACITY",
    "NOOP_NOTIFIER",
    "AbortStarted",
    "AuthenticationFailed",
    "BlockReason",
    "BudgetStatistics",
    "BufferCapacityError",
    "ByteBudget",
    "ByteReservation",
    "BytesLike",
    "CancelRequest",
    "CloseQueued",
    "CommandCompletion",
    "CommandError",
    "CommandFailed",
    "CommandReceipt",
    "CommandResult",
    "CommandSender",
    "CommandSubmission",
    "Completion",
    "CompletionCredits",
    "CompletionModelError",
    "CompletionQueueClosed",
    "CompletionQueueFull",
    "CompletionReceiver",
    "CompletionSender",
    "ConnectionClosed",
    "ConnectionCreated",
    "ConnectionEstablished",
    "ConnectionRef",
    "ConnectionRefAllocator",
    "ControlOutcome",
    "CreditPermit",
    "CreditStatistics",
    "DiscardCompletion",
    "DiscardSubmission",
    "DriverId",
    "DriverIdAllocator",
    "DriverStopped",
    "EndpointChannels",
    "EndpointSubmission",
    "EndpointSubmissionQueue",
    "ExceedsBudget",
    "FinishCompletion",
    "FinishSubmission",
    "IdExhausted",
    "IncomingStream",
    "InvalidReceiveBuffer",
    "LeasedCompletion",
    "NoopNotifier",
    "Notifier",
    "OperationCancellation",
    "OperationId",
    "PostedBuffer",
    "QueueClosed",
    "QueueEmpty",
    "QueueExhausted",
    "QueueFull",
    "QueueReceiver",
    "QueueSender",
    "QueueStatistics",
    "ReceiveCompletion",
    "ReceiveOptions",
    "ReceiveStatus",
    "ReceiveSubmission",
    "RequestId",
    "ResetCompletion",
    "ResetSubmission",
    "RetainedBytes",
    "SendCompletion",
    "SendOutcome",
    "SendSubmission",
    "ShutdownStarted",
    "StopCompletion",
    "StopSubmission",
    "StreamClosed",
    "StreamOpened",
    "StreamRef",
    "StreamSubmission",
    "StreamSubmitter",
    "SubmissionClosed",
    "SubmissionLimits",
    "SubmissionReceipt",
    "SubmissionReceiver",
    "SubmissionRejected",
    "SubmissionStatistics",
    "TooManyWaiters",
    "TryCompleteError",
    "Wakeup",
    "WakeupStatistics",
    "WouldBlock",
    "bounded_queue",
    "completion_queue",
    "next_driver_id",
]
