"""``EndpointChannels``: the completion model of one endpoint, wired together.

Why: a driver package (QUIC, io_uring, ...) and its runtime adapter always need the same set:
one completion credit pool shared by admission and consumption, a separate event-credit pool
for unsolicited lifecycle events, the endpoint submission FIFO and the completion queue, with
the notifiers connected so that each side is woken exactly by what it waits for:

- the driver's notifier hears submissions, cancellations, lifecycle changes, completion-queue
  space (full -> not-full) and event-credit releases (it may have staged events);
- the application waits on ``completions.arrived`` and, when a submission blocks, on the
  ``WouldBlock.released`` wakeup of the bound that blocked it.

By default the completion queue can hold one completion per credit of both pools, so the driver
only stages a completion when it is short of a credit, never because the queue is full.
"""

from __future__ import annotations

from typing import Generic, TypeVar, final

from chrysalis.core.completion._completion import (
    CompletionReceiver,
    CompletionSender,
    completion_queue,
)
from chrysalis.core.completion._credit import EVENT_CREDIT_CAPACITY, CompletionCredits
from chrysalis.core.completion._ids import DriverId
from chrysalis.core.completion._notify import NOOP_NOTIFIER, Notifier
from chrysalis.core.completion._submission import (
    CommandSender,
    EndpointSubmissionQueue,
    StreamSubmitter,
    SubmissionLimits,
    SubmissionReceiver,
)
from chrysalis.core.completion._wakeup import Wakeup

__all__ = ["DEFAULT_COMPLETION_CREDITS", "EndpointChannels"]

C = TypeVar("C")

DEFAULT_COMPLETION_CREDITS = 8192
"""Default completion credits (the reference's completion capacity)."""


@final
class EndpointChannels(Generic[C]):
    """All queues, pools and budgets of one endpoint, connected.

    Application side: ``commands``, ``streams``, ``completions``.
    Driver side: ``submissions``, ``completion_sender``, ``event_credits``, ``driver_notifier``.
    Shared: ``credits`` (completion credits).

    Usage: ``channels = EndpointChannels[MyCommand](driver_id)``.

    Args:
        driver: the driver identity stamped on every id.
        limits: submission queue capacity and byte budgets.
        completion_credits: the completion credit pool's capacity.
        event_credits: the event credit pool's capacity.
        completion_queue_capacity: defaults to ``completion_credits + event_credits``.
        driver_notifier: how to wake the driver; a new ``Wakeup`` when omitted.
        consumer_notifier: an extra notifier for the application (``completions.arrived``
            is always signalled).
        threadsafe: True (the default) lets the driver run on its own thread. False is a
            promise that the driver and the application use every channel from one thread
            (an inline driver on the application's event loop): the per-operation paths
            (admission, credits, budgets, queue push and drain, wakeups) then skip their
            locks, which cost about as much as a few Python calls each and are taken about
            a dozen times per stream operation. Thread-blocking waits are then unsupported.
    """

    __slots__ = (
        "commands",
        "completion_sender",
        "completions",
        "credits",
        "driver",
        "driver_notifier",
        "event_credits",
        "streams",
        "submissions",
    )

    def __init__(
        self,
        driver: DriverId,
        limits: SubmissionLimits | None = None,
        *,
        completion_credits: int = DEFAULT_COMPLETION_CREDITS,
        event_credits: int = EVENT_CREDIT_CAPACITY,
        completion_queue_capacity: int | None = None,
        driver_notifier: Notifier | None = None,
        consumer_notifier: Notifier = NOOP_NOTIFIER,
        threadsafe: bool = True,
    ) -> None:
        notifier: Notifier = (
            Wakeup(threadsafe=threadsafe) if driver_notifier is None else driver_notifier
        )
        self.driver = driver
        self.driver_notifier = notifier
        self.credits = CompletionCredits(
            completion_credits, name="completion", threadsafe=threadsafe
        )
        self.event_credits = CompletionCredits(
            event_credits, notifier, name="event", threadsafe=threadsafe
        )
        queue: EndpointSubmissionQueue[C] = EndpointSubmissionQueue(
            driver,
            SubmissionLimits() if limits is None else limits,
            self.credits,
            notifier,
            threadsafe=threadsafe,
        )
        self.commands: CommandSender[C] = queue.commands
        self.streams: StreamSubmitter = queue.streams
        self.submissions: SubmissionReceiver[C] = queue.receiver
        capacity = (
            completion_credits + event_credits
            if completion_queue_capacity is None
            else completion_queue_capacity
        )
        sender, receiver = completion_queue(
            capacity, consumer_notifier, space_notifier=notifier, threadsafe=threadsafe
        )
        self.completion_sender: CompletionSender = sender
        self.completions: CompletionReceiver = receiver
