"""Exceptions of the completion model, and the block reasons of a refused submission.

Why one module: every admission path hands the caller's allocation back when it refuses work,
so every refusal is an exception that *carries* what was refused (``item``, ``returned``,
``completion`` and ``permit``). Catching code never loses a buffer or a credit. The hierarchy:

- ``CompletionModelError``: base of every error raised by ``chrysalis.core.completion``.

  - ``QueueFull`` / ``QueueClosed``: a bounded queue refused ``item`` (it is returned).
  - ``QueueEmpty``: nothing to pop right now; ``QueueExhausted``: nothing will ever come.
  - ``SubmissionRejected``: a submission was refused; ``returned`` is the caller's value.

    - ``WouldBlock``: a bound is reached right now (``reason``); wait on ``released`` since
      ``epoch`` and retry.
    - ``SubmissionClosed``: the driver no longer admits work.
    - ``InvalidReceiveBuffer``: a posted buffer has less spare capacity than ``min_bytes``.
    - ``ExceedsBudget``: the request is larger than the whole budget and can never fit.

  - ``TryCompleteError``: the driver could not queue a completion; it gets back both the
    ``completion`` and the ``permit`` (``CompletionQueueFull``, ``CompletionQueueClosed``).
  - ``BufferCapacityError``: a driver tried to append past a posted buffer's capacity.
  - ``IdExhausted``: an identifier counter ran out (never reused, so this is terminal).
  - ``TooManyWaiters``: a ``Wakeup`` reached its bound on waiting coroutines.

These exceptions hold live, process-local objects (buffers, permits); they are not meant to be
pickled.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from chrysalis.core.completion._credit import CreditPermit
    from chrysalis.core.completion._wakeup import Wakeup

__all__ = [
    "BlockReason",
    "BufferCapacityError",
    "CompletionModelError",
    "CompletionQueueClosed",
    "CompletionQueueFull",
    "ExceedsBudget",
    "IdExhausted",
    "InvalidReceiveBuffer",
    "QueueClosed",
    "QueueEmpty",
    "QueueExhausted",
    "QueueFull",
    "SubmissionClosed",
    "SubmissionRejected",
    "TooManyWaiters",
    "TryCompleteError",
    "WouldBlock",
]

T = TypeVar("T")


class BlockReason(enum.Enum):
    """Why a submission could not be admitted right now.

    Sends may block on QUEUE_FULL, COMPLETION_FULL or RETAINED_BYTES; receives on QUEUE_FULL,
    COMPLETION_FULL or POSTED_BYTES; commands and control operations (finish, discard, reset,
    stop) on QUEUE_FULL or COMPLETION_FULL.
    """

    QUEUE_FULL = "queue_full"
    """The submission queue holds ``queue_capacity`` waiting items."""
    COMPLETION_FULL = "completion_full"
    """Every completion credit is held by an accepted, not yet consumed operation."""
    RETAINED_BYTES = "retained_bytes"
    """The retained-send byte budget cannot hold this payload right now."""
    POSTED_BYTES = "posted_bytes"
    """The posted-receive byte budget cannot hold this buffer's capacity right now."""


class CompletionModelError(Exception):
    """Base class of every error raised by ``chrysalis.core.completion``."""


class QueueFull(CompletionModelError, Generic[T]):
    """A bounded queue is at capacity; ``item`` is the refused item, handed back."""

    def __init__(self, item: T) -> None:
        super().__init__("queue is full")
        self.item = item


class QueueClosed(CompletionModelError, Generic[T]):
    """A bounded queue no longer admits items; ``item`` is the refused item, handed back."""

    def __init__(self, item: T) -> None:
        super().__init__("queue is closed")
        self.item = item


class QueueEmpty(CompletionModelError):
    """Nothing is queued right now (more may arrive)."""


class QueueExhausted(CompletionModelError):
    """The queue is empty and closed for good: nothing will ever arrive."""


class SubmissionRejected(CompletionModelError, Generic[T]):
    """A submission was refused; ``returned`` is the caller's value, intact.

    ``returned`` is the payload for a send (the very object passed in), the bytearray for a
    receive, the command for a command, and ``None`` for a control operation.
    """

    def __init__(self, message: str, returned: T) -> None:
        super().__init__(message)
        self.returned = returned


class WouldBlock(SubmissionRejected[T]):
    """A bound is reached right now. Wait on ``released`` since ``epoch``, then retry.

    ``epoch`` was read *before* the failed check, so ``released.wait(epoch)`` (or
    ``await released.wait_async(epoch)``) cannot miss a release that happened in between.
    """

    def __init__(self, reason: BlockReason, returned: T, released: Wakeup, epoch: int) -> None:
        super().__init__(f"would block: {reason.value}", returned)
        self.reason = reason
        self.released = released
        self.epoch = epoch


class SubmissionClosed(SubmissionRejected[T]):
    """The driver's submission queue is closed (shut down, aborted or dropped)."""

    def __init__(self, returned: T) -> None:
        super().__init__("submission queue is closed", returned)


class InvalidReceiveBuffer(SubmissionRejected[bytearray]):
    """A posted buffer's spare capacity (``capacity - len(buffer)``) is below ``min_bytes``.

    ``returned`` is the bytearray, unchanged; ``capacity`` and ``options`` are the caller's.
    """

    def __init__(self, returned: bytearray, capacity: int, options: object) -> None:
        spare = capacity - len(returned)
        super().__init__(f"posted buffer has {spare} spare bytes, fewer than needed", returned)
        self.capacity = capacity
        self.options = options


class ExceedsBudget(SubmissionRejected[T]):
    """``nbytes`` is larger than the whole budget (``budget_capacity``): it can never fit.

    ``reason`` names the budget (RETAINED_BYTES or POSTED_BYTES). Waiting would never help,
    so this is raised instead of ``WouldBlock``.
    """

    def __init__(self, reason: BlockReason, returned: T, nbytes: int, budget_capacity: int) -> None:
        super().__init__(
            f"{nbytes} bytes exceed the whole {reason.value} budget of {budget_capacity}",
            returned,
        )
        self.reason = reason
        self.nbytes = nbytes
        self.budget_capacity = budget_capacity


class TryCompleteError(CompletionModelError):
    """The driver could not queue a completion; both ``completion`` and ``permit`` come back."""

    def __init__(self, message: str, completion: object, permit: CreditPermit) -> None:
        super().__init__(message)
        self.completion = completion
        self.permit = permit


class CompletionQueueFull(TryCompleteError):
    """The completion queue is at capacity; stage the completion and retry later."""

    def __init__(self, completion: object, permit: CreditPermit) -> None:
        super().__init__("completion queue is full", completion, permit)


class CompletionQueueClosed(TryCompleteError):
    """The application closed or dropped the completion queue."""

    def __init__(self, completion: object, permit: CreditPermit) -> None:
        super().__init__("completion queue is closed", completion, permit)


class BufferCapacityError(CompletionModelError):
    """An append would grow a posted buffer past its reserved capacity."""


class IdExhausted(CompletionModelError):
    """An identifier counter reached its maximum; identifiers are never reused."""


class TooManyWaiters(CompletionModelError):
    """A ``Wakeup`` already has its maximum number of waiting coroutines."""

    def __init__(self, max_waiters: int) -> None:
        super().__init__(f"more than {max_waiters} coroutines waiting on one Wakeup")
        self.max_waiters = max_waiters
