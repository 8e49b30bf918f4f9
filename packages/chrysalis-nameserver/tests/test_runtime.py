"""``chrysalis.nameserver.runtime`` (a re-export of ``chrysalis.core.runtime``, whose own tests
cover tasks, deadlines and races on both runtimes) and the I/O layer under trio: a three-level
tree (service, parent links, manager, child link server) replicating and resolving over
in-memory streams inside a trio nursery."""

from __future__ import annotations

from typing import Any

import pytest

from chrysalis.core import DatagramAddr, LinkId, Pid
from chrysalis.core import runtime as core_runtime
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
    runtime,
)
from chrysalis.nameserver.runtime import (
    AsyncioSpawner,
    Spawner,
)

trio = pytest.importorskip("trio")


def test_the_module_re_exports_chrysalis_core_runtime() -> None:
    """The runtime services are ``chrysalis.core.runtime``'s (tested there, on both runtimes);
    this module keeps its old names pointing at the same objects."""
    assert runtime.current_library is core_runtime.current_async_library
    for name in runtime.__all__:
        if name != "current_library":
            assert getattr(runtime, name) is getattr(core_runtime, name), name
    assert (AsyncioSpawner, Spawner, TrioSpawner) == (
        core_runtime.AsyncioSpawner,
        core_runtime.Spawner,
        core_runtime.TrioSpawner,
    )


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
        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                spawner = TrioSpawner(nursery)
                # 1 s, well above the 0.05 s keepalives: at 0.3 s, this process held off the
                # CPU for 0.25 s (no keepalive sent meanwhile) idled the quiet link out
                root = NameserverService(pid(1), router=Router(), idle_timeout=1.0)
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
                with trio.move_on_after(1.3):  # past the idle timeout: keepalives keep it
                    await fresh.wait_closed()
                    closed = True
                assert not closed
                assert fresh.status.state is LinkState.ACTIVE
                assert root.child_links() == {pid(2): fresh.status.link}
                await fresh.shutdown()
                await server.shutdown()
                nursery.cancel_scope.cancel()

    trio.run(main)
