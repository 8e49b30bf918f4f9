"""The two runtimes a ``Node`` runs under (asyncio and trio) behind one small interface, so that
each Node scenario is written once and runs under both (``test_node.py``).

Why a helper and not two copies: the scenarios are the same; only the runtime's plumbing
differs (``asyncio.run`` vs ``trio.run``, tasks vs nurseries, ``asyncio.timeout`` vs
``trio.fail_after``) and the stream API (asyncio streams ``read`` / ``write`` / ``drain`` /
``write_eof``, trio streams ``receive_some`` / ``send_all`` / ``send_eof``). Two copies drift:
a check added to one runtime's test was missing from the other's. Every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

from chrysalis.node import Node

__all__ = [
    "AsyncioRuntime",
    "Event",
    "Runtime",
    "Spawner",
    "TrioRuntime",
    "directory_until",
    "eventually",
]


class Event(Protocol):
    """What ``asyncio.Event`` and ``trio.Event`` have in common."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    async def wait(self) -> Any: ...


class Spawner(Protocol):
    """Starts background work that ends (cancelled) when its ``background()`` block does."""

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...


class Runtime:
    """One runtime's plumbing and stream calls (see the module docstring)."""

    name = ""

    def run(self, main: Callable[[], Awaitable[object]], timeout: float = 20.0) -> None:
        """Run ``main`` to completion under this runtime, failing after ``timeout`` seconds."""
        raise NotImplementedError

    def event(self) -> Event:
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        raise NotImplementedError

    async def sleep_forever(self) -> None:
        """Wait until cancelled (a handler that stays until its link ends)."""
        await self.sleep(math.inf)

    def bounded(self, seconds: float) -> AbstractAsyncContextManager[None]:
        """A block that fails (the runtime's timeout error) after ``seconds``."""
        raise NotImplementedError

    def background(self) -> AbstractAsyncContextManager[Spawner]:
        """A block whose spawned work is cancelled when it ends; a failure of that work
        (other than the cancellation) fails the block."""
        raise NotImplementedError

    async def send(self, stream: Any, data: bytes) -> None:
        raise NotImplementedError

    async def send_eof(self, stream: Any) -> None:
        raise NotImplementedError

    async def receive_some(self, stream: Any, max_bytes: int) -> bytes:
        raise NotImplementedError

    async def receive_all(self, stream: Any) -> bytes:
        """Everything until the peer's FIN."""
        data = b""
        while chunk := await self.receive_some(stream, 64 * 1024):
            data += chunk
        return data

    async def receive_exactly(self, stream: Any, count: int) -> bytes:
        """Exactly ``count`` bytes (``EOFError`` if the stream ends first)."""
        data = b""
        while len(data) < count:
            chunk = await self.receive_some(stream, count - len(data))
            if not chunk:
                raise EOFError(f"stream ended after {len(data)} of {count} bytes")
            data += chunk
        return data


class _AsyncioSpawner:
    def __init__(self) -> None:
        self.tasks: list[asyncio.Future[object]] = []

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        self.tasks.append(asyncio.ensure_future(fn(*args)))


class AsyncioRuntime(Runtime):
    name = "asyncio"

    def run(self, main: Callable[[], Awaitable[object]], timeout: float = 20.0) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(timeout):
                await main()

        asyncio.run(bounded())

    def event(self) -> Event:
        return asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        if math.isinf(seconds):
            await asyncio.Event().wait()
        await asyncio.sleep(seconds)

    @asynccontextmanager
    async def bounded(self, seconds: float) -> AsyncIterator[None]:
        async with asyncio.timeout(seconds):
            yield

    @asynccontextmanager
    async def background(self) -> AsyncIterator[Spawner]:
        spawner = _AsyncioSpawner()
        try:
            yield spawner
        finally:
            for task in spawner.tasks:
                task.cancel()
            outcomes = await asyncio.gather(*spawner.tasks, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):  # CancelledError is a BaseException
                raise outcome

    async def send(self, stream: Any, data: bytes) -> None:
        stream.write(data)
        await stream.drain()

    async def send_eof(self, stream: Any) -> None:
        stream.write_eof()

    async def receive_some(self, stream: Any, max_bytes: int) -> bytes:
        return bytes(await stream.read(max_bytes))


class _TrioSpawner:
    def __init__(self, nursery: Any) -> None:
        self._nursery = nursery

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        self._nursery.start_soon(fn, *args)


class TrioRuntime(Runtime):
    name = "trio"

    def __init__(self) -> None:
        import trio

        self._trio = trio

    def run(self, main: Callable[[], Awaitable[object]], timeout: float = 20.0) -> None:
        trio = self._trio

        async def bounded() -> None:
            with trio.fail_after(timeout):
                await main()

        trio.run(bounded)

    def event(self) -> Event:
        event: Event = self._trio.Event()
        return event

    async def sleep(self, seconds: float) -> None:
        await self._trio.sleep(seconds)

    @asynccontextmanager
    async def bounded(self, seconds: float) -> AsyncIterator[None]:
        with self._trio.fail_after(seconds):
            yield

    @asynccontextmanager
    async def background(self) -> AsyncIterator[Spawner]:
        async with self._trio.open_nursery() as nursery:
            yield _TrioSpawner(nursery)
            nursery.cancel_scope.cancel()

    async def send(self, stream: Any, data: bytes) -> None:
        await stream.send_all(data)

    async def send_eof(self, stream: Any) -> None:
        await stream.send_eof()

    async def receive_some(self, stream: Any, max_bytes: int) -> bytes:
        return bytes(await stream.receive_some(max_bytes))


async def directory_until(
    runtime: Runtime, node: Node, predicate: Callable[[], bool], timeout: float = 5.0
) -> None:
    """Wait until ``predicate`` (about ``node``'s nameserver directory and the routes it
    projects) holds, failing after ``timeout`` seconds. No polling: the predicate is checked
    again each time the directory commits a change (``NameserverService.revisions``)."""
    watch = node.nameserver.revisions
    async with runtime.bounded(timeout):
        seen = watch.version  # taken before the check: a change in between is not missed
        while not predicate():
            seen = await watch.wait_change(seen)


async def eventually(runtime: Runtime, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` every 10 ms until it holds, failing after ``timeout`` seconds.

    Only for node state that offers no event to wait on: the outcome of a link session
    (``LinkSessions.refused_links``, ``LinkSessions.failure``: set by the session task, with no
    change notification; ``test_node.py``), and a parent manager's status. Anything the
    nameserver directory reflects waits with ``directory_until`` instead (a route's removal,
    which follows its gate's fence)."""
    async with runtime.bounded(timeout):
        while not predicate():
            await runtime.sleep(0.01)
