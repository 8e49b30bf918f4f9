"""``chrysalis.core.runtime``: the same library detection, events, tasks, deadlines and races
on asyncio and on trio, and trio never imported by the module itself."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable

import pytest

from chrysalis.core import runtime
from chrysalis.core.runtime import (
    AsyncioSpawner,
    Event,
    Spawner,
    TrioSpawner,
    current_async_library,
    default_spawner,
    fail_after,
    is_cancellation,
    join_shielded,
    monotonic,
    monotonic_millis,
    new_event,
    race,
    run_in_thread,
    sleep,
)

trio = pytest.importorskip("trio")

LIBRARIES = pytest.mark.parametrize("library", ["asyncio", "trio"])


def run_on(library: str, main: Callable[[Spawner], Awaitable[None]]) -> None:
    """Run ``main(spawner)`` on ``library`` within 5 s."""
    if library == "asyncio":

        async def on_asyncio() -> None:
            async with asyncio.timeout(5):
                await main(AsyncioSpawner())

        asyncio.run(on_asyncio())
        return

    async def on_trio() -> None:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                await main(TrioSpawner(nursery))
                nursery.cancel_scope.cancel()

    trio.run(on_trio)


def test_every_public_name_exists() -> None:
    for name in runtime.__all__:
        assert hasattr(runtime, name), name


def test_importing_the_module_does_not_import_trio() -> None:
    code = (
        "import sys, chrysalis.core.runtime as r; "
        "assert 'trio' not in sys.modules; "
        "r.is_cancellation(ValueError()); assert 'trio' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_current_async_library_outside_both_names_the_caller() -> None:
    with pytest.raises(RuntimeError, match="spawning needs a running asyncio or trio task"):
        current_async_library("spawning")


@LIBRARIES
def test_detection_events_clock_and_threads(library: str) -> None:
    async def main(spawner: Spawner) -> None:
        assert current_async_library() == library
        event: Event = new_event()
        assert not event.is_set()
        spawner.spawn(_set_later, event)
        await event.wait()
        assert event.is_set()
        before = monotonic()
        await sleep(0.01)
        assert monotonic() >= before
        assert monotonic_millis() >= int(before * 1000)
        assert await run_in_thread(sum, [1, 2, 3]) == 6
        assert default_spawner(spawner) is spawner

    run_on(library, main)


async def _set_later(event: Event) -> None:
    await sleep(0)
    event.set()


def test_trio_needs_an_explicit_spawner() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match="TrioSpawner"):
            default_spawner(None)

    trio.run(main)


def test_asyncio_default_spawner() -> None:
    async def main() -> None:
        assert isinstance(default_spawner(None), AsyncioSpawner)

    asyncio.run(main())


@LIBRARIES
def test_tasks_record_errors_and_cancel_and_join(library: str) -> None:
    async def main(spawner: Spawner) -> None:
        async def fail() -> None:
            raise ValueError("boom")

        failed = spawner.spawn(fail, log=False)
        await failed.join()
        assert failed.done
        assert isinstance(failed.error, ValueError)
        assert not is_cancellation(ValueError())

        started = new_event()
        cancelled: list[bool] = []

        async def forever() -> None:
            started.set()
            try:
                await sleep(60)
            except BaseException as exc:
                cancelled.append(is_cancellation(exc))
                raise

        waiting = spawner.spawn(forever)
        await started.wait()
        waiting.cancel()
        await join_shielded([waiting])
        assert waiting.done
        assert waiting.error is None
        assert cancelled == [True]

    run_on(library, main)


@LIBRARIES
def test_race_returns_with_the_first_and_raises_its_failure(library: str) -> None:
    async def main(spawner: Spawner) -> None:
        stopped: list[str] = []

        async def slow() -> None:
            try:
                await sleep(60)
            finally:
                stopped.append("slow")

        async def quick() -> None:
            await sleep(0)

        await race(spawner, slow, quick)
        assert stopped == ["slow"]

        async def broken() -> None:
            raise KeyError("first")

        with pytest.raises(KeyError, match="first"):
            await race(spawner, slow, broken)
        assert stopped == ["slow", "slow"]

    run_on(library, main)


@LIBRARIES
def test_fail_after_raises_timeout_error(library: str) -> None:
    async def main(spawner: Spawner) -> None:
        with pytest.raises(TimeoutError):
            await fail_after(0.01, lambda: sleep(60))
        assert await fail_after(1, lambda: _value(7)) == 7

    run_on(library, main)


async def _value(value: int) -> int:
    await sleep(0)
    return value
