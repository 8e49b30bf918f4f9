"""``Wakeup``: lost-wakeup safety and waiting from threads, asyncio and trio, including
producer threads handing items to consumers that wait through it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from chrysalis.core.completion import (
    NOOP_NOTIFIER,
    NoopNotifier,
    Notifier,
    QueueFull,
    QueueReceiver,
    QueueSender,
    TooManyWaiters,
    Wakeup,
    bounded_queue,
)

N_ITEMS = 2000


def test_noop_notifier_satisfies_the_protocol() -> None:
    assert isinstance(NOOP_NOTIFIER, Notifier)
    assert isinstance(Wakeup(), Notifier)
    NoopNotifier().notify()


def test_wait_returns_at_once_when_the_epoch_already_moved() -> None:
    wakeup = Wakeup()
    seen = wakeup.epoch()
    wakeup.notify()  # lands between "check" and "sleep"
    assert wakeup.wait(seen, timeout=10) is True


def test_wait_times_out_without_a_notification() -> None:
    wakeup = Wakeup()
    started = time.monotonic()
    assert wakeup.wait(wakeup.epoch(), timeout=0.02) is False
    assert time.monotonic() - started < 2
    assert wakeup.statistics().thread_waiters == 0


def test_notify_from_another_thread_wakes_a_sleeping_thread() -> None:
    wakeup = Wakeup()
    seen = wakeup.epoch()
    timer = threading.Timer(0.01, wakeup.notify)
    timer.start()
    try:
        assert wakeup.wait(seen, timeout=5) is True
    finally:
        timer.cancel()
    assert wakeup.statistics().epoch == seen + 1


def test_max_waiters_bounds_suspended_coroutines() -> None:
    wakeup = Wakeup(max_waiters=1)

    async def main() -> None:
        seen = wakeup.epoch()
        first = asyncio.ensure_future(wakeup.wait_async(seen))
        await asyncio.sleep(0)
        with pytest.raises(TooManyWaiters):
            await wakeup.wait_async(seen)
        wakeup.notify()
        await asyncio.wait_for(first, 5)

    asyncio.run(main())
    with pytest.raises(ValueError):
        Wakeup(max_waiters=0)


def test_wait_async_outside_an_event_loop_is_an_error() -> None:
    coroutine = Wakeup().wait_async(0)
    with pytest.raises(RuntimeError):
        coroutine.send(None)
    coroutine.close()


def _produce(tx: QueueSender[int], space: Wakeup, count: int) -> None:
    """Push 1..count, waiting on ``space`` whenever the queue is full, then close."""
    for item in range(1, count + 1):
        while True:
            seen = space.epoch()
            try:
                tx.try_push(item)
                break
            except QueueFull:
                space.wait(seen, timeout=5)
    tx.close()


def _queue_pair(arrived: Wakeup, space: Wakeup) -> tuple[QueueSender[int], QueueReceiver[int]]:
    tx: QueueSender[int]
    rx: QueueReceiver[int]
    tx, rx = bounded_queue(16, arrived, space_notifier=space)
    return tx, rx


def test_thread_producer_and_thread_consumer_exchange_every_item() -> None:
    arrived, space = Wakeup(), Wakeup()
    tx, rx = _queue_pair(arrived, space)
    producer = threading.Thread(target=_produce, args=(tx, space, N_ITEMS))
    producer.start()
    received: list[int] = []
    while True:
        seen = arrived.epoch()
        batch = rx.drain(64)
        received.extend(batch)
        if batch:
            continue
        if rx.is_closed():
            break
        assert arrived.wait(seen, timeout=5), "lost wakeup"
    producer.join(timeout=5)
    assert received == list(range(1, N_ITEMS + 1))


def test_asyncio_consumer_receives_every_item_from_a_producer_thread() -> None:
    arrived, space = Wakeup(), Wakeup()
    tx, rx = _queue_pair(arrived, space)

    async def consume() -> list[int]:
        received: list[int] = []
        while True:
            seen = arrived.epoch()
            batch = rx.drain(64)
            received.extend(batch)
            if batch:
                continue
            if rx.is_closed():
                return received
            await asyncio.wait_for(arrived.wait_async(seen), 5)

    producer = threading.Thread(target=_produce, args=(tx, space, N_ITEMS))
    producer.start()
    received = asyncio.run(consume())
    producer.join(timeout=5)
    assert received == list(range(1, N_ITEMS + 1))
    assert arrived.statistics().async_waiters == 0


def test_trio_consumer_receives_every_item_from_a_producer_thread() -> None:
    trio = pytest.importorskip("trio")
    arrived, space = Wakeup(), Wakeup()
    tx, rx = _queue_pair(arrived, space)

    async def consume() -> list[int]:
        received: list[int] = []
        while True:
            seen = arrived.epoch()
            batch = rx.drain(64)
            received.extend(batch)
            if batch:
                continue
            if rx.is_closed():
                return received
            with trio.fail_after(5):
                await arrived.wait_async(seen)

    producer = threading.Thread(target=_produce, args=(tx, space, N_ITEMS))
    producer.start()
    received = trio.run(consume)
    producer.join(timeout=5)
    assert received == list(range(1, N_ITEMS + 1))
    assert arrived.statistics().async_waiters == 0


def test_asyncio_tasks_exchange_items_through_the_loop_thread() -> None:
    arrived, space = Wakeup(), Wakeup()
    tx, rx = _queue_pair(arrived, space)

    async def produce() -> None:
        for item in range(1, N_ITEMS + 1):
            while True:
                seen = space.epoch()
                try:
                    tx.try_push(item)
                    break
                except QueueFull:
                    await space.wait_async(seen)
        tx.close()

    async def consume() -> list[int]:
        received: list[int] = []
        while True:
            seen = arrived.epoch()
            item = rx.try_pop()
            if item is not None:
                received.append(item)
                continue
            if rx.is_closed():
                return received
            await arrived.wait_async(seen)

    async def main() -> list[int]:
        producer = asyncio.ensure_future(produce())
        received = await asyncio.wait_for(consume(), 10)
        await producer
        return received

    assert asyncio.run(main()) == list(range(1, N_ITEMS + 1))


def test_cancelled_asyncio_wait_leaves_no_waiter() -> None:
    wakeup = Wakeup()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(wakeup.wait_async(wakeup.epoch()), 0.01)
        assert wakeup.statistics().async_waiters == 0

    asyncio.run(main())


def test_cancelled_trio_wait_leaves_no_waiter() -> None:
    trio = pytest.importorskip("trio")
    wakeup = Wakeup()

    async def main() -> None:
        with trio.move_on_after(0.01) as scope:
            await wakeup.wait_async(wakeup.epoch())
        assert scope.cancelled_caught
        assert wakeup.statistics().async_waiters == 0

    trio.run(main)


def test_trio_wait_is_a_checkpoint_even_when_the_epoch_moved() -> None:
    trio = pytest.importorskip("trio")
    wakeup = Wakeup()

    async def main() -> None:
        seen = wakeup.epoch()
        wakeup.notify()
        with trio.CancelScope() as scope:
            scope.cancel()
            await wakeup.wait_async(seen)
        assert scope.cancelled_caught

    trio.run(main)


def test_notify_after_the_loop_closed_is_harmless() -> None:
    wakeup = Wakeup()

    async def register() -> None:
        task = asyncio.ensure_future(wakeup.wait_async(wakeup.epoch()))
        await asyncio.sleep(0)
        assert wakeup.statistics().async_waiters == 1
        # Leave the task pending: asyncio.run cancels it when main returns.
        del task

    asyncio.run(register())
    wakeup.notify()  # the waiter's loop is closed; nothing must raise


def test_one_notification_wakes_every_waiter() -> None:
    wakeup = Wakeup()

    async def main() -> None:
        seen = wakeup.epoch()
        waiters = [asyncio.ensure_future(wakeup.wait_async(seen)) for _ in range(5)]
        await asyncio.sleep(0)
        assert wakeup.statistics().async_waiters == 5
        threading.Thread(target=wakeup.notify).start()
        await asyncio.wait_for(asyncio.gather(*waiters), 5)

    asyncio.run(main())
