"""End-to-end model check of one endpoint's completion model (``EndpointChannels``).

An application submits commands and stream operations, a model driver pops, executes,
cancels and completes them (staging completions when the queue is full), and the application
consumes completions with and without leases; the driver may drop its queue and the
application may drop the completion queue. Checked after every step and at the end:

- no completion is lost or duplicated: every accepted operation or command gets exactly one
  terminal completion, unless the driver discarded it while queued, or the application
  dropped the completion queue before it could be delivered;
- every buffer comes back exactly once (posted buffers are the same objects, prefixes kept);
- queue capacity, credits, event credits and both byte budgets are never exceeded, and their
  usage equals what the model says is held;
- the driver pops submissions in admission order (one FIFO for commands and stream work).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chrysalis.core.completion import (
    BlockReason,
    CommandCompletion,
    CommandError,
    CommandFailed,
    CommandSubmission,
    Completion,
    CompletionQueueClosed,
    CompletionQueueFull,
    ConnectionRef,
    ControlOutcome,
    CreditPermit,
    DiscardCompletion,
    DiscardSubmission,
    DriverId,
    EndpointChannels,
    EndpointSubmission,
    ExceedsBudget,
    FinishCompletion,
    FinishSubmission,
    IncomingStream,
    InvalidReceiveBuffer,
    LeasedCompletion,
    OperationCancellation,
    OperationId,
    QueueEmpty,
    QueueExhausted,
    ReceiveCompletion,
    ReceiveOptions,
    ReceiveStatus,
    ReceiveSubmission,
    RequestId,
    ResetCompletion,
    ResetSubmission,
    RetainedBytes,
    SendCompletion,
    SendOutcome,
    SendSubmission,
    ShutdownStarted,
    StopCompletion,
    StopSubmission,
    StreamRef,
    SubmissionClosed,
    SubmissionLimits,
    WouldBlock,
)

DRIVER = DriverId(1)
STREAM = StreamRef(ConnectionRef(DRIVER, 1), 0)
QUEUE = 3
RETAINED = 16
POSTED = 16
CREDITS = 4
EVENTS = 2
COMPLETION_QUEUE = 3

Key = OperationId | RequestId | str
OPERATION_COMPLETIONS = (
    SendCompletion,
    ReceiveCompletion,
    DiscardCompletion,
    FinishCompletion,
    ResetCompletion,
    StopCompletion,
)


@dataclass
class Accepted:
    """What the model knows about one accepted submission."""

    kind: str
    nbytes: int = 0  # send payload length or posted capacity
    buffer: bytearray | None = None
    prefix: bytes = b""
    cancellation: OperationCancellation | None = None
    appended: bytearray = field(default_factory=bytearray)
    credit_held: bool = True
    bytes_held: bool = False


class EndpointMachine(RuleBasedStateMachine):
    threadsafe = True

    def __init__(self) -> None:
        super().__init__()
        self.ch = EndpointChannels[str](
            DRIVER,
            SubmissionLimits(QUEUE, RETAINED, POSTED),
            completion_credits=CREDITS,
            event_credits=EVENTS,
            completion_queue_capacity=COMPLETION_QUEUE,
            threadsafe=self.threadsafe,
        )
        self.accepted: dict[Key, Accepted] = {}
        self.admission: list[Key] = []  # admitted, not yet popped (FIFO model)
        self.admitting = True
        self.at_driver: list[EndpointSubmission[str]] = []
        self.views: list[tuple[Key, list[RetainedBytes]]] = []
        self.staged: list[tuple[Completion, CreditPermit, Key]] = []
        self.leases: list[tuple[LeasedCompletion, Key]] = []
        self.delivered: Counter[Key] = Counter()
        self.discarded: set[Key] = set()
        self.dropped: set[Key] = set()
        self.events = 0
        self.next_event = 0
        self.completions_open = True

    # --- helpers ------------------------------------------------------------------------

    def _credits_held(self) -> int:
        return sum(1 for a in self.accepted.values() if a.credit_held)

    def _check_refusal(self, exc: Exception, returned: object) -> None:
        """A refusal hands back the caller's object and changes no accounting."""
        if isinstance(exc, WouldBlock):
            assert exc.returned is returned
            if exc.reason is BlockReason.COMPLETION_FULL:
                assert self._credits_held() == CREDITS
            elif exc.reason is BlockReason.QUEUE_FULL:
                assert len(self.admission) == QUEUE
        elif isinstance(exc, SubmissionClosed):
            assert exc.returned is returned
            assert not self.admitting
        else:
            assert isinstance(exc, ExceedsBudget | InvalidReceiveBuffer)
            assert exc.returned is returned

    # --- application: submissions -------------------------------------------------------

    @rule(size=st.integers(0, RETAINED + 2))
    def submit_send(self, size: int) -> None:
        payload = bytes(range(size))
        try:
            receipt = self.ch.streams.send_nowait(STREAM, payload)
        except (WouldBlock, SubmissionClosed, ExceedsBudget) as exc:
            self._check_refusal(exc, payload)
            if isinstance(exc, WouldBlock) and exc.reason is BlockReason.RETAINED_BYTES:
                assert self.ch.submissions.retained_budget.used + size > RETAINED
            return
        assert self.admitting
        self.accepted[receipt.operation] = Accepted("send", size, bytes_held=True)
        self.admission.append(receipt.operation)

    @rule(
        prefix=st.binary(max_size=3),
        extra=st.integers(0, POSTED),
        min_bytes=st.integers(1, 4),
    )
    def submit_receive(self, prefix: bytes, extra: int, min_bytes: int) -> None:
        buffer = bytearray(prefix)
        capacity = len(prefix) + extra
        try:
            receipt = self.ch.streams.receive_nowait(
                STREAM, buffer, capacity, ReceiveOptions(min_bytes)
            )
        except (WouldBlock, SubmissionClosed, ExceedsBudget, InvalidReceiveBuffer) as exc:
            self._check_refusal(exc, buffer)
            assert buffer == prefix
            if isinstance(exc, InvalidReceiveBuffer):
                assert extra < min_bytes
            return
        assert extra >= min_bytes
        self.accepted[receipt.operation] = Accepted(
            "receive",
            capacity,
            buffer=buffer,
            prefix=prefix,
            cancellation=receipt.cancellation,
            bytes_held=True,
        )
        self.admission.append(receipt.operation)

    @rule(kind=st.sampled_from(["finish", "discard", "reset", "stop"]))
    def submit_control(self, kind: str) -> None:
        streams = self.ch.streams
        try:
            if kind == "finish":
                receipt = streams.finish_nowait(STREAM)
            elif kind == "discard":
                receipt = streams.discard_nowait(STREAM, 8)
            elif kind == "reset":
                receipt = streams.reset_nowait(STREAM, 5)
            else:
                receipt = streams.stop_nowait(STREAM, 6)
        except (WouldBlock, SubmissionClosed) as exc:
            self._check_refusal(exc, None)
            return
        self.accepted[receipt.operation] = Accepted(kind)
        self.admission.append(receipt.operation)

    @rule(terminal=st.booleans())
    def submit_command(self, terminal: bool) -> None:
        command = "shutdown" if terminal else "connect"
        try:
            if terminal:
                receipt = self.ch.commands.submit_and_close_nowait(command)
            else:
                receipt = self.ch.commands.submit_nowait(command)
        except (WouldBlock, SubmissionClosed) as exc:
            self._check_refusal(exc, command)
            return
        self.accepted[receipt.request] = Accepted(command)
        self.admission.append(receipt.request)
        if terminal:
            self.admitting = False

    @precondition(lambda self: self._live_cancellations())
    @rule(index=st.integers(0, 50))
    def cancel_receive(self, index: int) -> None:
        live = self._live_cancellations()
        cancellation = live[index % len(live)]
        first = not cancellation.cancelled
        assert cancellation.cancel() is first
        assert cancellation.cancel() is False

    def _live_cancellations(self) -> list[OperationCancellation]:
        return [
            a.cancellation
            for a in self.accepted.values()
            if a.cancellation is not None and a.bytes_held
        ]

    # --- driver -------------------------------------------------------------------------

    @rule(limit=st.integers(1, 3))
    def driver_pop(self, limit: int) -> None:
        self.ch.submissions.drain_cancellations(10)
        items = self.ch.submissions.drain(limit)
        for item in items:
            key = item.request if isinstance(item, CommandSubmission) else item.operation
            assert key == self.admission.pop(0), "submissions must pop in admission order"
            self.at_driver.append(item)
        assert len(items) == min(limit, len(items) + len(self.admission))

    @precondition(lambda self: self.at_driver)
    @rule(
        index=st.integers(0, 10),
        incoming=st.binary(max_size=8),
        keep_views=st.booleans(),
        split=st.integers(0, 8),
    )
    def driver_complete(self, index: int, incoming: bytes, keep_views: bool, split: int) -> None:
        item = self.at_driver.pop(index % len(self.at_driver))
        completion: Completion
        if isinstance(item, CommandSubmission):
            key: Key = item.request
            if item.command == "shutdown":
                completion = item.complete(ShutdownStarted())
            else:
                completion = item.complete(CommandFailed(CommandError.UNKNOWN_CONNECTION))
        elif isinstance(item, SendSubmission):
            key = item.operation
            payload = item.payload
            completion = item.complete(SendOutcome.ACKNOWLEDGED, len(payload))
            if keep_views:  # the QUIC stack keeps views for retransmission
                head = payload.split_to(min(split, len(payload)))
                self.views.append((key, [head, payload]))
            else:
                payload.release()
                self.accepted[key].bytes_held = False
        elif isinstance(item, ReceiveSubmission):
            key = item.operation
            if item.cancellation.cancelled:
                completion = item.complete(ReceiveStatus.CANCELLED)
            else:
                chunk = incoming[: item.posted.spare]
                item.posted.append(chunk)
                self.accepted[key].appended += chunk
                status = (
                    ReceiveStatus.DATA
                    if item.posted.appended >= item.options.min_bytes
                    else ReceiveStatus.FIN
                )
                completion = item.complete(status)
        elif isinstance(item, DiscardSubmission):
            key = item.operation
            completion = item.complete(0, ReceiveStatus.FIN)
        else:
            assert isinstance(item, FinishSubmission | ResetSubmission | StopSubmission)
            key = item.operation
            completion = item.complete(ControlOutcome.COMPLETE)
        self._deliver(completion, item.permit, key)

    def _deliver(self, completion: Completion, permit: CreditPermit, key: Key) -> None:
        refused: CompletionQueueFull | CompletionQueueClosed | None = None
        try:
            self.ch.completion_sender.complete_nowait(completion, permit)
        except (CompletionQueueFull, CompletionQueueClosed) as exc:
            refused = exc
        if refused is None:
            return
        assert refused.completion is completion
        assert refused.permit is permit
        if isinstance(refused, CompletionQueueFull):
            assert self.completions_open
            self.staged.append((completion, permit, key))
            return
        # The application is gone: the driver drops the completion and its ownership.
        assert not self.completions_open
        if isinstance(completion, ReceiveCompletion):
            completion.posted.release()
            self.accepted[key].bytes_held = False
        permit.release()
        self._drop(key)

    def _drop(self, key: Key) -> None:
        if isinstance(key, str):
            self.events -= 1
            return
        self.dropped.add(key)
        self.accepted[key].credit_held = False

    @precondition(lambda self: self.staged)
    @rule()
    def driver_flush_staged(self) -> None:
        staged, self.staged = self.staged, []
        for completion, permit, key in staged:
            self._deliver(completion, permit, key)

    @rule()
    def driver_event(self) -> None:
        permit = self.ch.event_credits.try_acquire()
        if permit is None:
            assert self.events == EVENTS
            return
        self.events += 1
        self.next_event += 1
        self._deliver(IncomingStream(STREAM), permit, f"event-{self.next_event}")

    @precondition(lambda self: self.views)
    @rule(index=st.integers(0, 10))
    def driver_release_views(self, index: int) -> None:
        key, views = self.views.pop(index % len(self.views))
        views[0].release()
        assert self.accepted[key].bytes_held  # one view is still alive
        assert not views[1].reservation.released
        views[1].release()
        self.accepted[key].bytes_held = False

    @rule()
    def driver_close(self) -> None:
        self.ch.submissions.close()
        self.admitting = False

    @rule()
    def driver_discard(self) -> None:
        discarded = self.ch.submissions.discard()
        keys = [d.request if isinstance(d, CommandSubmission) else d.operation for d in discarded]
        assert keys == self.admission
        for key in keys:
            self.discarded.add(key)
            self.accepted[key].credit_held = False
            self.accepted[key].bytes_held = False
        self.admission.clear()
        self.admitting = False

    # --- application: completions -------------------------------------------------------

    def _check_delivery(self, completion: Completion) -> Key:
        key = self._key_of(completion)
        if key == "event":
            return key
        self.delivered[key] += 1
        assert self.delivered[key] == 1, "duplicated completion"
        accepted = self.accepted[key]
        if isinstance(completion, ReceiveCompletion):
            assert completion.buffer is accepted.buffer
            assert bytes(completion.buffer[: len(accepted.prefix)]) == accepted.prefix
            assert bytes(completion.data()) == bytes(accepted.appended)
            if completion.status is ReceiveStatus.CANCELLED:
                assert accepted.cancellation is not None
                assert accepted.cancellation.cancelled
        if isinstance(completion, SendCompletion):
            assert completion.nbytes == accepted.nbytes
        return key

    def _consumed(self, key: Key, completion: Completion) -> None:
        if key == "event":
            self.events -= 1
            return
        accepted = self.accepted[key]
        accepted.credit_held = False
        if isinstance(completion, ReceiveCompletion):
            accepted.bytes_held = False

    @rule(leased=st.booleans())
    def app_pop(self, leased: bool) -> None:
        try:
            if leased:
                lease = self.ch.completions.pop_leased_nowait()
            else:
                completion = self.ch.completions.pop_nowait()
        except (QueueEmpty, QueueExhausted):
            assert len(self.ch.completions) == 0
            return
        if leased:
            key = self._check_delivery(lease.completion)
            self.leases.append((lease, key))
        else:
            key = self._check_delivery(completion)
            self._consumed(key, completion)

    @precondition(lambda self: self.leases)
    @rule(index=st.integers(0, 10))
    def app_release_lease(self, index: int) -> None:
        lease, key = self.leases.pop(index % len(self.leases))
        completion = lease.release()
        self._consumed(key, completion)
        lease.release()  # harmless

    @rule()
    def app_drop_completion_queue(self) -> None:
        for completion in self.ch.completions.discard():
            key = self._key_of(completion)
            if key == "event":
                self.events -= 1
            else:
                self._drop(key)
                if isinstance(completion, ReceiveCompletion):
                    self.accepted[key].bytes_held = False
        self.completions_open = False
        staged, self.staged = self.staged, []
        for completion, permit, key in staged:
            self._deliver(completion, permit, key)

    def _key_of(self, completion: Completion) -> Key:
        if isinstance(completion, IncomingStream):
            return "event"
        if isinstance(completion, CommandCompletion):
            return completion.request
        assert isinstance(completion, OPERATION_COMPLETIONS)
        return completion.operation

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def bounds_and_accounting_hold(self) -> None:
        stats = self.ch.submissions.statistics()
        assert stats.queue.length == len(self.admission) <= QUEUE
        assert stats.credits.in_use == self._credits_held() <= CREDITS
        assert self.ch.event_credits.in_use == self.events <= EVENTS
        retained = sum(
            a.nbytes for a in self.accepted.values() if a.kind == "send" and a.bytes_held
        )
        posted = sum(
            a.nbytes for a in self.accepted.values() if a.kind == "receive" and a.bytes_held
        )
        assert stats.retained.used == retained <= RETAINED
        assert stats.posted.used == posted <= POSTED
        assert len(self.ch.completions) <= COMPLETION_QUEUE
        assert all(count == 1 for count in self.delivered.values())

    def teardown(self) -> None:
        """Run everything to the end; then every accepted item is accounted for exactly once."""
        for _ in range(1000):
            pending = self.admission or self.at_driver or self.staged or self.views
            if not pending and len(self.ch.completions) == 0:
                break
            if self.admission:
                self.driver_pop(3)
            while self.at_driver:
                self.driver_complete(0, b"tail", False, 0)
            if self.views:
                self.driver_release_views(0)
            while len(self.ch.completions):
                self.app_pop(False)
            if self.staged:
                self.driver_flush_staged()
        while self.leases:
            self.app_release_lease(0)
        for key in self.accepted:
            outcomes = self.delivered[key] + (key in self.discarded) + (key in self.dropped)
            assert outcomes == 1, f"{key} ended {outcomes} times"
        assert self.ch.credits.in_use == 0
        assert self.ch.event_credits.in_use == 0
        assert self.ch.submissions.retained_budget.used == 0
        assert self.ch.submissions.posted_budget.used == 0


TestEndpointMachine = EndpointMachine.TestCase
TestEndpointMachine.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)


class SingleThreadedEndpointMachine(EndpointMachine):
    """The same model with ``threadsafe=False`` (the inline drivers' lock-free paths): one
    thread drives both sides, so every guarantee above must hold unchanged."""

    threadsafe = False


TestSingleThreadedEndpointMachine = SingleThreadedEndpointMachine.TestCase
TestSingleThreadedEndpointMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
