"""The bounded MPSC queue (spec 4.2): bounds, ownership on refusal, edge-triggered wakeups,
lifecycle, and a stateful model check."""

from __future__ import annotations

import threading
from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from chrysalis.core.completion import (
    CompletionModelError,
    QueueClosed,
    QueueFull,
    QueueReceiver,
    QueueSender,
    bounded_queue,
)


class CountingNotifier:
    """Counts notifications (thread-safe enough for these tests: only one writer at a time)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def notify(self) -> None:
        with self._lock:
            self.count += 1


def test_notifier_coalesces_until_the_queue_becomes_empty() -> None:
    notifier = CountingNotifier()
    tx: QueueSender[int]
    rx: QueueReceiver[int]
    tx, rx = bounded_queue(4, notifier)
    tx.try_push(1)
    tx.try_push(2)
    assert notifier.count == 1
    assert rx.try_pop() == 1
    tx.try_push(3)
    assert notifier.count == 1  # still non-empty: no new edge
    assert rx.try_pop() == 2
    assert rx.try_pop() == 3
    assert rx.try_pop() is None
    tx.try_push(4)
    assert notifier.count == 2


def test_full_queue_returns_the_item() -> None:
    tx: QueueSender[object]
    rx: QueueReceiver[object]
    tx, rx = bounded_queue(1)
    tx.try_push("first")
    item = object()
    with pytest.raises(QueueFull) as info:
        tx.try_push(item)
    assert info.value.item is item
    assert len(rx) == 1


def test_closed_queue_returns_the_item_and_keeps_accepted_items() -> None:
    tx: QueueSender[str]
    rx: QueueReceiver[str]
    tx, rx = bounded_queue(4)
    tx.try_push("accepted")
    rx.close()
    with pytest.raises(QueueClosed) as info:
        tx.try_push("late")
    assert info.value.item == "late"
    assert rx.try_pop() == "accepted"
    assert rx.is_closed()


def test_push_and_close_accepts_the_terminal_item_and_rejects_later_ones() -> None:
    notifier = CountingNotifier()
    tx: QueueSender[str]
    rx: QueueReceiver[str]
    tx, rx = bounded_queue(4, notifier)
    tx.try_push("work")
    tx.try_push_and_close("shutdown")
    assert notifier.count == 2  # the first edge, and the terminal push always notifies
    with pytest.raises(QueueClosed):
        tx.try_push("after")
    assert rx.drain(10) == ["work", "shutdown"]
    assert rx.is_closed()


def test_push_and_close_on_a_full_queue_leaves_admission_open() -> None:
    tx: QueueSender[str]
    rx: QueueReceiver[str]
    tx, rx = bounded_queue(1)
    tx.try_push("a")
    with pytest.raises(QueueFull):
        tx.try_push_and_close("terminal")
    assert rx.is_admitting()
    rx.try_pop()
    tx.try_push_and_close("terminal")
    assert not rx.is_admitting()


def test_discard_closes_and_hands_back_queued_items() -> None:
    notifier = CountingNotifier()
    space = CountingNotifier()
    tx: QueueSender[int]
    rx: QueueReceiver[int]
    tx, rx = bounded_queue(3, notifier, space_notifier=space)
    for value in (1, 2, 3):
        tx.try_push(value)
    assert rx.discard() == [1, 2, 3]
    assert len(rx) == 0
    assert space.count == 1  # blocked senders are woken to observe the closure
    with pytest.raises(QueueClosed):
        tx.try_push(4)


def test_last_sender_close_changes_sequence_and_wakes_consumer() -> None:
    notifier = CountingNotifier()
    tx: QueueSender[int]
    rx: QueueReceiver[int]
    tx, rx = bounded_queue(2, notifier)
    second = tx.clone()
    before = rx.sequence()
    tx.close()
    assert rx.sequence() == before
    assert notifier.count == 0
    assert not rx.is_closed()
    second.close()
    assert rx.sequence() == before + 1
    assert notifier.count == 1
    assert rx.is_closed()
    second.close()  # idempotent
    assert rx.statistics().senders == 0


def test_space_notifier_fires_only_on_full_to_not_full() -> None:
    space = CountingNotifier()
    tx: QueueSender[int]
    rx: QueueReceiver[int]
    tx, rx = bounded_queue(2, space_notifier=space)
    tx.try_push(1)
    rx.try_pop()
    assert space.count == 0  # was not full
    tx.try_push(2)
    tx.try_push(3)
    rx.try_pop()
    assert space.count == 1
    rx.try_pop()
    assert space.count == 1


def test_none_cannot_be_queued() -> None:
    tx: QueueSender[object]
    tx, _ = bounded_queue(2)
    with pytest.raises(TypeError):
        tx.try_push(None)


def test_closed_sender_handle_cannot_push_or_clone() -> None:
    tx: QueueSender[int]
    tx, _ = bounded_queue(2)
    other = tx.clone()
    tx.close()
    with pytest.raises(QueueClosed):
        tx.try_push(1)
    with pytest.raises(CompletionModelError):
        tx.clone()
    other.try_push(1)


@pytest.mark.parametrize("capacity", [0, -1, 1 << 30])
def test_capacity_must_be_in_range(capacity: int) -> None:
    with pytest.raises(ValueError):
        bounded_queue(capacity)


def test_drain_respects_the_limit_and_order() -> None:
    tx: QueueSender[int]
    rx: QueueReceiver[int]
    tx, rx = bounded_queue(5)
    for value in range(5):
        tx.try_push(value)
    assert rx.drain(2) == [0, 1]
    assert rx.drain(0) == []
    assert rx.drain(10) == [2, 3, 4]
    with pytest.raises(ValueError):
        rx.drain(-1)


def test_sender_context_manager_drops_the_handle() -> None:
    tx: QueueSender[int]
    rx: QueueReceiver[int]
    tx, rx = bounded_queue(2)
    with tx as sender:
        sender.try_push(1)
    assert rx.statistics().senders == 0
    assert rx.try_pop() == 1
    assert rx.is_closed()


def test_concurrent_producers_never_exceed_capacity_or_lose_items() -> None:
    tx: QueueSender[tuple[int, int]]
    rx: QueueReceiver[tuple[int, int]]
    tx, rx = bounded_queue(8)
    producers = 3
    per_producer = 300
    received: list[tuple[int, int]] = []
    done = threading.Event()

    def produce(index: int, sender: QueueSender[tuple[int, int]]) -> None:
        sent = 0
        while sent < per_producer:
            try:
                sender.try_push((index, sent))
            except QueueFull:
                continue
            sent += 1
        sender.close()

    senders = [tx] + [tx.clone() for _ in range(producers - 1)]
    threads = [threading.Thread(target=produce, args=(i, s)) for i, s in enumerate(senders)]
    for thread in threads:
        thread.start()
    while not done.is_set():
        assert len(rx) <= rx.capacity
        item = rx.try_pop()
        if item is not None:
            received.append(item)
        elif rx.is_closed():
            done.set()
    for thread in threads:
        thread.join(timeout=5)
    assert len(received) == producers * per_producer
    for index in range(producers):
        mine = [n for (who, n) in received if who == index]
        assert mine == list(range(per_producer))  # FIFO per producer


class QueueMachine(RuleBasedStateMachine):
    """Model check: FIFO, bounds, item ownership, and edge-triggered notifications."""

    def __init__(self) -> None:
        super().__init__()
        self.notifier = CountingNotifier()
        self.space = CountingNotifier()
        self.capacity = 3
        self.tx: QueueSender[int]
        self.rx: QueueReceiver[int]
        self.tx, self.rx = bounded_queue(self.capacity, self.notifier, space_notifier=self.space)
        self.senders: list[QueueSender[int]] = [self.tx]
        self.model: deque[int] = deque()
        self.admitting = True
        self.live_senders = 1
        self.next_item = 1
        self.expected_notifies = 0
        self.expected_space = 0
        self.sequence = 0

    def _push(self, sender_index: int, terminal: bool) -> None:
        sender = self.senders[sender_index % len(self.senders)]
        item = self.next_item
        self.next_item += 1
        handle_open = not sender.is_closed()
        refused: QueueClosed[int] | QueueFull[int] | None = None
        try:
            if terminal:
                sender.try_push_and_close(item)
            else:
                sender.try_push(item)
        except (QueueClosed, QueueFull) as exc:
            refused = exc
        if isinstance(refused, QueueClosed):
            assert refused.item == item
            assert not (handle_open and self.admitting)
            return
        if isinstance(refused, QueueFull):
            assert refused.item == item
            assert len(self.model) == self.capacity
            return
        assert handle_open
        assert self.admitting
        assert len(self.model) < self.capacity
        if terminal:
            self.expected_notifies += 1
            self.expected_space += 1
            self.admitting = False
        elif not self.model:
            self.expected_notifies += 1
        self.model.append(item)
        self.sequence += 1

    @rule(sender=st.integers(0, 10))
    def push(self, sender: int) -> None:
        self._push(sender, terminal=False)

    @rule(sender=st.integers(0, 10))
    def push_and_close(self, sender: int) -> None:
        self._push(sender, terminal=True)

    @rule()
    def pop(self) -> None:
        was_full = len(self.model) == self.capacity
        item = self.rx.try_pop()
        if not self.model:
            assert item is None
            return
        assert item == self.model.popleft()
        if was_full:
            self.expected_space += 1

    @rule(limit=st.integers(0, 4))
    def drain(self, limit: int) -> None:
        was_full = len(self.model) == self.capacity
        items = self.rx.drain(limit)
        expected = [self.model.popleft() for _ in range(min(limit, len(self.model)))]
        assert items == expected
        if was_full and expected:
            self.expected_space += 1

    @precondition(lambda self: len(self.senders) < 6)
    @rule(sender=st.integers(0, 10))
    def clone(self, sender: int) -> None:
        source = self.senders[sender % len(self.senders)]
        try:
            clone = source.clone()
        except CompletionModelError:
            return
        self.senders.append(clone)
        self.live_senders += 1

    @rule(sender=st.integers(0, 10))
    def close_sender(self, sender: int) -> None:
        handle = self.senders[sender % len(self.senders)]
        was_open = handle._dropped is False
        handle.close()
        if was_open:
            self.live_senders -= 1
            if self.live_senders == 0:
                self.sequence += 1
                self.expected_notifies += 1

    @rule()
    def close_receiver(self) -> None:
        self.rx.close()
        self.admitting = False
        self.sequence += 1
        self.expected_notifies += 1
        self.expected_space += 1

    @rule()
    def discard(self) -> None:
        items = self.rx.discard()
        assert items == list(self.model)
        self.model.clear()
        self.admitting = False
        self.sequence += 1
        self.expected_notifies += 1
        self.expected_space += 1

    @invariant()
    def matches_model(self) -> None:
        stats = self.rx.statistics()
        assert stats.length == len(self.model) <= self.capacity
        assert stats.senders == self.live_senders
        assert stats.admitting == self.admitting
        assert stats.sequence == self.sequence
        assert self.notifier.count == self.expected_notifies
        assert self.space.count == self.expected_space
        assert self.rx.is_closed() == (
            not self.model and (self.live_senders == 0 or not self.admitting)
        )


TestQueueMachine = QueueMachine.TestCase
TestQueueMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
