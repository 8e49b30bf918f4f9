"""The actor mailbox (``_runtime.cell._Mailbox``): a sync actor's thread sleeps on a doorbell
that ``put`` rings once per sleep; order, bounds and supervision-first taking hold."""

from __future__ import annotations

import threading
from typing import cast

from monarch.actor._base.envelope import Envelope
from monarch.actor._runtime.cell import _BATCH_BYTES, _FlushItem, _InitItem, _Item, _Mailbox

T = 5.0  # every wait here is bounded by this many seconds


def _flush(log: list[int], n: int) -> _FlushItem:
    return _FlushItem(lambda: log.append(n))


class _Sized(_InitItem):
    """A queued message of ``nbytes`` bytes (no envelope needed for the mailbox's bounds)."""

    __slots__ = ()

    def __init__(self, nbytes: int) -> None:
        self.env = cast(Envelope, None)
        self.buffers = []
        self.nbytes = nbytes


def _take(box: _Mailbox, out: list[_Item], n: int, done: threading.Event) -> None:
    for _ in range(n):
        out.append(box.get())
    done.set()


def test_a_sleeping_get_wakes_for_each_put_in_order() -> None:
    box = _Mailbox(capacity=10_000, max_bytes=1 << 20)
    got: list[_Item] = []
    done = threading.Event()
    log: list[int] = []
    items = [_flush(log, n) for n in range(2000)]
    thread = threading.Thread(target=_take, args=(box, got, len(items), done))
    thread.start()
    try:
        for item in items:  # the taker sleeps between many of these, and races the others
            assert box.put(item)
    finally:
        assert done.wait(T), f"get() missed a wake-up: {len(got)} of {len(items)} taken"
        thread.join(T)
    assert got == items
    assert len(box) == 0


def test_get_takes_queued_items_without_sleeping_and_a_spare_ring_is_harmless() -> None:
    box = _Mailbox(capacity=10, max_bytes=1 << 20)
    log: list[int] = []
    first, second = _flush(log, 1), _flush(log, 2)
    box.put(first)
    box.put(second)
    assert box.get() is first
    assert box.get() is second
    # A get left by an exception after it said it sleeps: the next put rings a doorbell
    # nobody waits on. Later gets still see every item once, and a second ring is absorbed.
    box._sleeping = True
    third = _flush(log, 3)
    box.put(third)
    assert box.get() is third
    box._sleeping = True
    fourth = _flush(log, 4)
    box.put(fourth)
    box._sleeping = True
    fifth = _flush(log, 5)
    box.put(fifth)  # the doorbell is open already: no error
    assert [box.get(), box.get()] == [fourth, fifth]
    assert len(box) == 0


def test_take_supervision_while_the_taker_sleeps_does_not_lose_later_items() -> None:
    box = _Mailbox(capacity=10, max_bytes=1 << 20)
    got: list[_Item] = []
    done = threading.Event()
    thread = threading.Thread(target=_take, args=(box, got, 1, done))
    thread.start()
    try:
        assert box.take_supervision() == []  # replaces nothing; the deque stays
        item = _flush([], 0)
        box.put(item)
    finally:
        assert done.wait(T)
        thread.join(T)
    assert got == [item]


def test_batching_only_while_small_calls_are_queued() -> None:
    box = _Mailbox(capacity=10, max_bytes=1 << 30)
    assert not box.batching()  # nothing queued: the reply goes now
    box.put(_Sized(100))
    assert box.batching()
    box.put(_Sized(_BATCH_BYTES))
    assert not box.batching()  # a large call queued: its turn is far off
    box.get()
    assert not box.batching()
    box.get()
    assert not box.batching()
    assert box.nbytes == 0
    box.put(_Sized(_BATCH_BYTES - 1))
    assert box.batching()
