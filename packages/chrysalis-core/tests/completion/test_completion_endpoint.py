"""A driver on its own OS thread and an application on asyncio or trio, wired through
``EndpointChannels``: blocked submitters wait on the exact bound (queue slot, credit, retained
bytes) instead of spinning, the driver stages completions when the completion queue is full,
and every send gets exactly one completion before the terminal ``DriverStopped``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest

from chrysalis.core.completion import (
    CommandCompletion,
    CommandSubmission,
    Completion,
    CompletionQueueClosed,
    CompletionQueueFull,
    ConnectionRef,
    CreditPermit,
    DriverId,
    DriverStopped,
    EndpointChannels,
    QueueExhausted,
    SendCompletion,
    SendOutcome,
    SendSubmission,
    ShutdownStarted,
    StreamRef,
    SubmissionLimits,
    Wakeup,
)

DRIVER = DriverId(8)
STREAM = StreamRef(ConnectionRef(DRIVER, 1), 0)
SENDS = 300
PAYLOAD = b"0123456789abcdef"


def _channels() -> EndpointChannels[str]:
    return EndpointChannels[str](
        DRIVER,
        SubmissionLimits(queue_capacity=4, retained_send_bytes=48, posted_receive_bytes=64),
        completion_credits=6,
        event_credits=2,
        completion_queue_capacity=2,
        driver_notifier=Wakeup(),
    )


def _run_driver(ch: EndpointChannels[str], errors: list[BaseException]) -> None:
    """A minimal driver: acknowledge sends, answer shutdown, stop when admission closed."""
    wakeup = ch.driver_notifier
    assert isinstance(wakeup, Wakeup)
    staged: list[tuple[Completion, CreditPermit]] = []
    acknowledged = 0
    try:
        while True:
            seen = wakeup.epoch()
            progressed = False
            while staged:
                completion, permit = staged[0]
                try:
                    ch.completion_sender.complete_nowait(completion, permit)
                except CompletionQueueFull:
                    break
                staged.pop(0)
                progressed = True
            if not staged:
                for item in ch.submissions.drain(8):
                    progressed = True
                    if isinstance(item, SendSubmission):
                        acknowledged += len(item.payload)
                        item.payload.release()
                        staged.append(
                            (item.complete(SendOutcome.ACKNOWLEDGED, acknowledged), item.permit)
                        )
                    elif isinstance(item, CommandSubmission):
                        staged.append((item.complete(ShutdownStarted()), item.permit))
                    else:  # pragma: no cover - this test submits nothing else
                        raise AssertionError(item)
            if not staged and ch.submissions.is_closed():
                event_permit = ch.event_credits.try_acquire()
                if event_permit is not None:
                    try:
                        ch.completion_sender.complete_nowait(DriverStopped(DRIVER), event_permit)
                    except CompletionQueueFull:
                        event_permit.release()
                    except CompletionQueueClosed:
                        event_permit.release()
                        return
                    else:
                        ch.completion_sender.close()
                        return
            if not progressed and not wakeup.wait(seen, timeout=5):
                raise AssertionError("driver starved: lost wakeup")
    except BaseException as exc:  # surfaced by the test thread
        errors.append(exc)


def _check(completions: list[Completion], ch: EndpointChannels[str]) -> None:
    sends = [c for c in completions if isinstance(c, SendCompletion)]
    assert [c.operation.sequence for c in sends] == sorted(c.operation.sequence for c in sends)
    assert len({c.operation for c in sends}) == SENDS
    assert all(c.outcome is SendOutcome.ACKNOWLEDGED for c in sends)
    assert sends[-1].acknowledged_through == SENDS * len(PAYLOAD)
    # One FIFO: the shutdown submitted after every send completes after all of them.
    assert len(completions) == SENDS + 2
    shutdown = completions[-2]
    assert isinstance(shutdown, CommandCompletion)
    assert shutdown.result == ShutdownStarted()
    assert completions[-1] == DriverStopped(DRIVER)
    assert ch.credits.in_use == 0
    assert ch.event_credits.in_use == 0
    assert ch.submissions.retained_budget.used == 0


def _scenario(
    ch: EndpointChannels[str],
) -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[list[Completion]]]]:
    async def produce() -> None:
        for _ in range(SENDS):
            await ch.streams.send(STREAM, PAYLOAD)
        await ch.commands.submit_and_close("shutdown")

    async def consume() -> list[Completion]:
        seen: list[Completion] = []
        while True:
            try:
                seen.append(await ch.completions.pop())
            except QueueExhausted:
                return seen

    return produce, consume


def test_asyncio_application_with_a_driver_thread_loses_nothing() -> None:
    ch = _channels()
    errors: list[BaseException] = []
    driver = threading.Thread(target=_run_driver, args=(ch, errors))
    driver.start()
    produce, consume = _scenario(ch)

    async def main() -> list[Completion]:
        consumer = asyncio.ensure_future(consume())
        await asyncio.wait_for(produce(), 10)
        return await asyncio.wait_for(consumer, 10)

    completions = asyncio.run(main())
    driver.join(timeout=5)
    assert not errors
    _check(completions, ch)


def test_trio_application_with_a_driver_thread_loses_nothing() -> None:
    trio = pytest.importorskip("trio")
    ch = _channels()
    errors: list[BaseException] = []
    driver = threading.Thread(target=_run_driver, args=(ch, errors))
    driver.start()
    produce, consume = _scenario(ch)
    result: list[Completion] = []

    async def main() -> None:
        async def run_consumer() -> None:
            result.extend(await consume())

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_consumer)
                await produce()

    trio.run(main)
    driver.join(timeout=5)
    assert not errors
    _check(result, ch)
