"""``chrysalis.nameserver.runtime`` and the I/O layer under trio: the same tasks, deadlines and
races on both runtimes, and a three-level tree (service, parent links, manager, child link
server) replicating and resolving over in-memory streams inside a trio nursery."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.datagram import Router
from chrysalis.nameserver import (
    ChildLinkServer,
    Consistency,
    Found,
    LinkState,
    Locator,
    NameserverService,
    NamespaceConfig,
    ParentLink,
    ParentLinkManager,
    ParentStatusKind,
    ProcEntry,
    RejectCode,
    TrioSpawner,
    memory_stream_pair,
)
from chrysalis.nameserver.runtime import (
    AsyncioSpawner,
    Spawner,
    current_library,
    fail_after,
    is_cancellation,
    join_shielded,
    new_event,
    race,
    sleep,
)

trio = pytest.importorskip("trio")


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


LIBRARIES = pytest.mark.parametrize("library", ["asyncio", "trio"])


@LIBRARIES
def test_tasks_record_errors_and_cancel_and_join(library: str) -> None:
    async def main(spawner: Spawner) -> None:
        assert current_library() == library

        async def fail() -> None:
            raise ValueError("boom")

        failed = spawner.spawn(fail, log=False)
        await failed.join()
        assert failed.done
        assert isinstance(failed.error, ValueError)

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


def pid(n: int) -> Pid:
    return Pid(bytes([n]) * 16)


def make_service(n: int) -> NameserverService:
    service = NameserverService(pid(n), router=Router())
    address = DatagramAddr.udp(f"10.0.0.{n}", 4000 + n)
    service.set_local_entry(ProcEntry(pid(n), f"n{n}", locators=(Locator(address),)))
    return service


class MemoryAcceptor:
    """Child streams handed to a ``ChildLinkServer`` (the parent's end of each pair)."""

    def __init__(self) -> None:
        self.items: list[tuple[Pid, Any]] = []
        self.event = trio.Event()

    def offer(self, peer: Pid, stream: Any) -> None:
        self.items.append((peer, stream))
        self.event.set()

    async def accept(self) -> tuple[Pid, Any]:
        while not self.items:
            self.event = trio.Event()
            await self.event.wait()
        return self.items.pop(0)


def test_trio_tree_replicates_resolves_and_withdraws_over_memory_streams() -> None:
    async def main() -> None:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                spawner = TrioSpawner(nursery)
                services = {n: make_service(n) for n in (1, 2, 3)}
                acceptors = {n: MemoryAcceptor() for n in (1, 2)}
                servers = {
                    1: ChildLinkServer.spawn(services[1], acceptors[1], spawner=spawner),
                }

                def dialer(parent: int, child: int) -> Any:
                    async def dial(address: DatagramAddr, pinned: Pid | None) -> tuple[Pid, Any]:
                        ours, theirs = memory_stream_pair()
                        acceptors[parent].offer(pid(child), ours)
                        return pid(parent), theirs

                    return dial

                address = DatagramAddr.udp("10.0.0.1", 4001)
                config = NamespaceConfig((address,), pid(1), retry_delay=0.05)
                middle = ParentLinkManager.spawn(services[2], config, dialer(1, 2), spawner=spawner)
                servers[2] = ChildLinkServer.spawn(
                    services[2], acceptors[2], upstream=middle, spawner=spawner
                )
                config = NamespaceConfig((address,), pid(2), retry_delay=0.05)
                leaf = ParentLinkManager.spawn(services[3], config, dialer(2, 3), spawner=spawner)
                status = await leaf.wait_connected()
                assert status.kind is ParentStatusKind.CONNECTED
                while services[1].get(pid(3)) is None:
                    await trio.sleep(0.001)
                answer = await leaf.resolve(pid(1), Consistency.REFRESH)
                assert isinstance(answer, Found)
                seen = services[1].get(pid(3))
                assert seen is not None
                assert seen.locators == services[2].local_entry.locators  # type: ignore[union-attr]
                await leaf.shutdown()
                while services[1].get(pid(3)) is not None:
                    await trio.sleep(0.001)
                await middle.shutdown()
                for server in servers.values():
                    await server.shutdown()
                assert services[1].get(pid(2)) is None
                assert services[1].child_links() == {}
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_trio_needs_an_explicit_spawner() -> None:
    async def main() -> None:
        service = make_service(1)
        with pytest.raises(RuntimeError, match="TrioSpawner"):
            ChildLinkServer.spawn(service, MemoryAcceptor())

    trio.run(main)


def test_link_ids_are_fresh_for_each_trio_child() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server = ChildLinkServer.spawn(
                make_service(1), MemoryAcceptor(), spawner=TrioSpawner(nursery)
            )
            first, second = server.allocate_link(), server.allocate_link()
            assert first != second
            assert isinstance(first, LinkId)
            await server.shutdown()

    trio.run(main)


def test_trio_supersede_idle_timeout_and_keepalives() -> None:
    """Issue 15 under trio: a restarted child's new link supersedes the stale one (which is
    told), a silent stream is closed after the idle timeout, and keepalives keep a quiet
    link open."""

    async def main() -> None:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                spawner = TrioSpawner(nursery)
                root = NameserverService(pid(1), router=Router(), idle_timeout=0.3)
                root.set_local_entry(
                    ProcEntry(pid(1), "n1", locators=(Locator(DatagramAddr.udp("10.0.0.1", 1)),))
                )
                acceptor = MemoryAcceptor()
                server = ChildLinkServer.spawn(root, acceptor, spawner=spawner)
                address = DatagramAddr.udp("10.0.0.1", 4001)

                def connect(service: NameserverService) -> ParentLink:
                    ours, theirs = memory_stream_pair()
                    acceptor.offer(service.authority, ours)
                    return ParentLink.spawn(
                        pid(1), address, theirs, service, spawner=spawner, keepalive_interval=0.05
                    )

                stale = connect(make_service(2))
                await stale.wait_active()
                silent, _theirs = memory_stream_pair()
                acceptor.offer(pid(3), silent)
                fresh = connect(make_service(2))  # the same identity, restarted
                await fresh.wait_active()
                status = await stale.wait_closed()
                assert status.state is LinkState.REJECTED
                assert status.code is RejectCode.ALREADY_LINKED
                assert root.get(pid(2)) is not None
                while server.active_links > 1:  # the silent stream times out; not `fresh`
                    await trio.sleep(0.01)
                closed = False
                with trio.move_on_after(0.4):  # past the idle timeout: keepalives keep it
                    await fresh.wait_closed()
                    closed = True
                assert not closed
                assert fresh.status.state is LinkState.ACTIVE
                assert root.child_links() == {pid(2): fresh.status.link}
                await fresh.shutdown()
                await server.shutdown()
                nursery.cancel_scope.cancel()

    trio.run(main)
