"""The asyncio nameserver layer over in-memory streams: the service serves child links
(commit before ack, routes before ack, revocation on every exit path), parent links replicate
recursively and rewrite answers one hop at a time, and the manager reconnects and stops on
terminal rejections."""

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
    EnumerationPage,
    EnumerationStale,
    Found,
    Hello,
    LinkState,
    Locator,
    MemoryByteStream,
    NameserverService,
    NamespaceConfig,
    NotFound,
    NsFrameStream,
    ParentLink,
    ParentLinkManager,
    ParentStatus,
    ParentStatusKind,
    ProcEntry,
    Reject,
    RejectCode,
    SnapshotBegin,
    SnapshotChunk,
    TerminalRejection,
    VersionRange,
    Welcome,
    memory_stream_pair,
)


def run(main: Callable[[], Awaitable[Any]], timeout: float = 5) -> Any:
    return asyncio.run(asyncio.wait_for(main(), timeout))


def pid(n: int) -> Pid:
    return Pid(bytes([n]) * 16)


def addr(n: int) -> DatagramAddr:
    return DatagramAddr.udp(f"10.0.0.{n}", 4000 + n)


class Node:
    """A service with its own entry (locator 10.0.0.n) and router."""

    def __init__(self, n: int) -> None:
        self.pid = pid(n)
        self.address = addr(n)
        self.router = Router()
        self.service = NameserverService(self.pid, router=self.router)
        self.service.set_local_entry(
            ProcEntry(self.pid, f"n{n}", locators=(Locator(self.address),))
        )
        self.tasks: list[asyncio.Task[None]] = []

    def serve(self, child: Node, link: LinkId, upstream: Any = None) -> MemoryByteStream:
        """Start serving ``child`` on a fresh memory stream; return the child's end."""
        ours, theirs = memory_stream_pair()
        task = asyncio.get_running_loop().create_task(
            self.service.serve(link, child.pid, ours, upstream)
        )
        self.tasks.append(task)
        return theirs


async def eventually(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)


async def link_up(parent: Node, child: Node, n: int, upstream: Any = None) -> ParentLink:
    stream = parent.serve(child, LinkId(bytes([n]) * 16), upstream)
    link = ParentLink.spawn(parent.pid, parent.address, stream, child.service)
    await link.wait_active()
    return link


def test_serves_publication_resolution_and_eof_cleanup() -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        link = await link_up(root, leaf, 9)
        entry = root.service.get(leaf.pid)
        assert entry is not None
        assert entry.locators == (Locator(leaf.address),)
        # The route was projected before the acknowledgement made the link active.
        route = root.router.get(leaf.pid)
        assert route is not None
        assert route.destination == leaf.address
        assert route.is_active
        assert root.service.child_links() == {leaf.pid: LinkId(bytes([9]) * 16)}
        answer = await link.resolve(root.pid, Consistency.REFRESH)
        assert isinstance(answer, Found)
        assert answer.entry.locators == (Locator(root.address),)
        await link.shutdown()
        await eventually(lambda: root.service.get(leaf.pid) is None)
        assert route.gate is not None
        assert not route.gate.is_active
        assert root.router.get(leaf.pid) is None
        assert root.service.child_links() == {}

    run(main)


def test_recursively_replicates_resolves_and_withdraws_subtree() -> None:
    async def main() -> None:
        root, middle, leaf = Node(1), Node(2), Node(3)
        upper = await link_up(root, middle, 1)
        lower = await link_up(middle, leaf, 2, upstream=upper)
        # The root sees the leaf through the middle's locator.
        await eventually(lambda: root.service.get(leaf.pid) is not None)
        seen = root.service.get(leaf.pid)
        assert seen is not None
        assert seen.locators == (Locator(middle.address),)
        assert root.router.get(leaf.pid) is not None
        # The leaf resolves the root through the middle: rewritten to its one next hop.
        answer = await lower.resolve(root.pid, Consistency.REFRESH)
        assert isinstance(answer, Found)
        assert answer.entry.locators == (Locator(middle.address, 0),)
        # A miss goes to the root and comes back NotFound at the root's revision.
        missing = await lower.resolve(pid(77), Consistency.REFRESH)
        assert isinstance(missing, NotFound)
        assert missing.revision.authority == root.pid
        # Refresh enumeration from the leaf is the root's view, rewritten to the middle.
        page = await lower.enumerate(None, 0, Consistency.REFRESH)
        assert isinstance(page, EnumerationPage)
        assert {e.pid for e in page.entries} == {root.pid, middle.pid, leaf.pid}
        assert all(e.locators == (Locator(middle.address, 0),) for e in page.entries)
        # Withdrawal propagates upward.
        await lower.shutdown()
        await eventually(lambda: root.service.get(leaf.pid) is None)
        assert root.router.get(leaf.pid) is None
        await upper.shutdown()

    run(main)


def test_enumeration_pages_are_stable_and_stale_cursors_rejected() -> None:
    async def main() -> None:
        root, a, b = Node(1), Node(2), Node(3)
        first = await link_up(root, a, 1)
        page = await first.enumerate(None, 1, Consistency.CACHED)
        assert isinstance(page, EnumerationPage)
        assert len(page.entries) == 1
        assert page.next is not None
        await link_up(root, b, 2)  # a new revision
        stale = await first.enumerate(page.next, 1, Consistency.CACHED)
        assert isinstance(stale, EnumerationStale)

    run(main)


def test_identity_mismatch_sends_reject_and_installs_no_link() -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        stream = root.serve(leaf, LinkId(b"\x01" * 16))
        frames = NsFrameStream(stream)
        await frames.send(Hello(VersionRange(1, 3), pid(99)))  # not the authenticated peer
        reply = await frames.receive()
        assert reply == Reject(RejectCode.IDENTITY_MISMATCH)
        assert await frames.receive() is None
        assert root.service.revision().value == 0
        assert root.service.child_links() == {}

    run(main)


@pytest.mark.parametrize("failure", ["protocol", "truncated", "abort"])
def test_link_failures_revoke_committed_publications(failure: str) -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        stream = root.serve(leaf, LinkId(b"\x01" * 16))
        frames = NsFrameStream(stream)
        await frames.send(Hello(VersionRange(1, 3), leaf.pid))
        welcome = await frames.receive()
        assert isinstance(welcome, Welcome)
        assert root.service.child_links() == {leaf.pid: welcome.link}
        if failure == "protocol":
            await frames.send(welcome)  # a parent->child message from the child
        elif failure == "truncated":
            stream.write(b"\x00\x00")
            stream.write_eof()
        else:
            stream.abort()
        await eventually(lambda: root.service.child_links() == {})
        await asyncio.gather(*root.tasks)

    run(main)


def test_rejected_publication_sends_no_ack_and_removes_link() -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        stream = root.serve(leaf, LinkId(b"\x01" * 16))
        frames = NsFrameStream(stream)
        await frames.send(Hello(VersionRange(1, 3), leaf.pid))
        assert isinstance(await frames.receive(), Welcome)
        entry = ProcEntry(leaf.pid, "x", locators=(Locator(leaf.address),))
        await frames.send(SnapshotChunk(1, 0, (entry,)))  # no SnapshotBegin: WrongSnapshot
        # No acknowledgement: the child is told the publication was refused, then the end.
        assert await frames.receive() == Reject(RejectCode.UNAVAILABLE)
        assert await frames.receive() is None
        await eventually(lambda: root.service.child_links() == {})
        assert root.service.get(leaf.pid) is None

    run(main)


def test_a_restarted_child_supersedes_its_stale_link() -> None:
    """Issue 15, item 3: the parent still serves the old link (its stream is not closed, as
    when the old process died inside the transport's idle timeout); the child restarted with
    the same identity connects again and is accepted, its subtree published, and the old
    link is fenced: its routes are gone and its late frames are refused."""

    async def main() -> None:
        root, leaf = Node(1), Node(2)
        old = await link_up(root, leaf, 1)
        old_route = root.router.get(leaf.pid)
        assert old_route is not None
        restarted = Node(2)
        stream = root.serve(restarted, LinkId(b"\x02" * 16))
        link = ParentLink.spawn(root.pid, root.address, stream, restarted.service)
        assert await link.wait_active() == LinkId(b"\x02" * 16)
        assert root.service.child_links() == {leaf.pid: LinkId(b"\x02" * 16)}
        assert root.service.get(leaf.pid) is not None
        route = root.router.get(leaf.pid)
        assert route is not None
        assert route is not old_route
        assert old_route.gate is not None
        assert not old_route.gate.is_active  # the old link's routes are fenced
        # The old link (were its process alive) is told, and ends for good.
        status = await old.wait_closed()
        assert status.state is LinkState.REJECTED
        assert status.code is RejectCode.ALREADY_LINKED
        assert root.service.child_links() == {leaf.pid: LinkId(b"\x02" * 16)}
        assert root.service.get(leaf.pid) is not None
        assert root.router.get(leaf.pid) is route

    run(main)


def test_a_late_frame_on_a_superseded_stream_is_refused() -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        ours, theirs = memory_stream_pair()
        frames = NsFrameStream(theirs)
        task = asyncio.get_running_loop().create_task(
            root.service.serve(LinkId(b"\x01" * 16), leaf.pid, ours)
        )
        await frames.send(Hello(VersionRange(1, 3), leaf.pid))
        assert isinstance(await frames.receive(), Welcome)
        fresh = await link_up(root, Node(2), 2)
        assert await frames.receive() == Reject(RejectCode.ALREADY_LINKED)
        frames.send_nowait(SnapshotBegin(1, 0))  # late: the old session is closed
        await asyncio.wait_for(task, 2)
        assert root.service.child_links() == {leaf.pid: LinkId(b"\x02" * 16)}
        assert fresh.status.state is LinkState.ACTIVE

    run(main)


def test_child_link_server_allocates_parent_scoped_monotonic_ids() -> None:
    async def main() -> None:
        root = Node(0xAB)
        queue: asyncio.Queue[tuple[Pid, MemoryByteStream]] = asyncio.Queue()

        class Acceptor:
            async def accept(self) -> tuple[Pid, MemoryByteStream]:
                return await queue.get()

        server = ChildLinkServer.spawn(root.service, Acceptor())
        first = server.allocate_link()
        assert first.raw == root.pid.raw[:8] + (1).to_bytes(8, "big")
        assert server.allocate_link().raw[8:] == (2).to_bytes(8, "big")
        leaf = Node(2)
        ours, theirs = memory_stream_pair()
        await queue.put((leaf.pid, ours))
        link = ParentLink.spawn(root.pid, root.address, theirs, leaf.service)
        link_id = await link.wait_active()
        assert link_id.raw == root.pid.raw[:8] + (3).to_bytes(8, "big")
        assert server.active_links == 1
        await server.shutdown()
        assert root.service.get(leaf.pid) is None
        await link.wait_closed()

    run(main)


class Dialer:
    """Dials a parent node in memory; can be told to refuse."""

    def __init__(self, parent: Node, child: Node, first_link: int = 1) -> None:
        self.parent, self.child = parent, child
        self.calls = 0
        self.links = first_link - 1
        self.refuse = 0

    async def __call__(self, address: DatagramAddr, pinned: Pid | None) -> tuple[Pid, Any]:
        self.calls += 1
        if self.refuse:
            self.refuse -= 1
            raise ConnectionRefusedError("down")
        self.links += 1
        return self.parent.pid, self.parent.serve(self.child, LinkId(bytes([self.links]) * 16))


def test_manager_discovers_pins_reconnects_and_routes_by_default() -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        dialer = Dialer(root, leaf)
        dialer.refuse = 1
        config = NamespaceConfig((root.address,), retry_delay=0.01)
        manager = ParentLinkManager.spawn(leaf.service, config, dialer, router=leaf.router)
        status = await manager.wait_connected()
        assert status.peer == root.pid
        assert manager.pinned == root.pid
        default = leaf.router.default_route
        assert default is not None
        assert default.destination == root.address
        # Kill the parent side: the manager fences the default route and reconnects.
        for task in root.tasks:
            task.cancel()
        await eventually(
            lambda: dialer.links == 2 and manager.status.kind is ParentStatusKind.CONNECTED
        )
        assert default.gate is not None
        assert not default.gate.is_active
        replacement = leaf.router.default_route
        assert replacement is not None
        assert replacement is not default
        answer = await manager.resolve(root.pid, Consistency.REFRESH)
        assert isinstance(answer, Found)
        await manager.shutdown()
        assert manager.status == ParentStatus(ParentStatusKind.STOPPED)
        assert leaf.router.default_route is None
        await eventually(lambda: root.service.get(leaf.pid) is None)

    run(main)


def test_terminal_rejection_identifies_the_local_pid() -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        config = NamespaceConfig((root.address,), authority=root.pid, retry_delay=0.01)
        manager = ParentLinkManager.spawn(leaf.service, config, Dialer(root, leaf))
        await manager.wait_connected()
        twin = Node(2)  # another process with the same identity: it takes over
        twin_manager = ParentLinkManager.spawn(twin.service, config, Dialer(root, twin, 100))
        await twin_manager.wait_connected()
        await eventually(lambda: manager.status.kind is ParentStatusKind.FAILED)
        with pytest.raises(TerminalRejection) as info:
            await manager.wait_connected()
        assert str(info.value) == (
            f"parent rejected nameserver link for PID {leaf.pid.hex()}: already_linked"
            " (a newer connection with the same identity replaced this node's link)"
        )
        assert info.value.superseded
        assert manager.status.code is RejectCode.ALREADY_LINKED
        assert twin_manager.status.kind is ParentStatusKind.CONNECTED  # no flapping
        assert root.service.get(leaf.pid) is not None
        await twin_manager.shutdown()
        await manager.shutdown()

    run(main)


def test_a_terminal_rejection_before_connecting_keeps_the_reference_text() -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        config = NamespaceConfig((root.address,), authority=root.pid, retry_delay=0.01)

        async def dial(address: DatagramAddr, pinned: Pid | None) -> tuple[Pid, Any]:
            ours, theirs = memory_stream_pair()
            frames = NsFrameStream(ours)

            async def refuse() -> None:
                await frames.receive()
                await frames.send(Reject(RejectCode.ALREADY_LINKED))
                frames.finish()

            asyncio.get_running_loop().create_task(refuse())
            return root.pid, theirs

        manager = ParentLinkManager.spawn(leaf.service, config, dial)
        with pytest.raises(TerminalRejection) as info:
            await manager.wait_connected()
        assert str(info.value) == (
            f"parent rejected nameserver link for PID {leaf.pid.hex()}: already_linked"
        )
        assert not info.value.superseded

    run(main)


def test_namespace_configuration_requires_address_and_real_parent() -> None:
    with pytest.raises(ValueError, match="at least one"):
        NamespaceConfig(())
    with pytest.raises(ValueError, match="link-local"):
        NamespaceConfig((addr(1),), authority=Pid.LINK_LOCAL)


def test_an_idle_child_stream_is_closed_and_a_quiet_link_is_kept_alive() -> None:
    """Issue 15, item 6: a stream that says nothing (no Hello, or an abandoned link) is
    closed after the idle timeout; a ParentLink's keepalives keep a quiet link open."""

    async def main() -> None:
        root, leaf = Node(1), Node(2)
        # 1 s, well above the 0.05 s keepalives: at 0.3 s, this process held off the CPU for
        # 0.25 s (no keepalive sent meanwhile) idled the quiet link out
        root.service = NameserverService(root.pid, router=root.router, idle_timeout=1.0)
        root.service.set_local_entry(ProcEntry(root.pid, "n1", locators=(Locator(root.address),)))
        silent = NsFrameStream(root.serve(Node(3), LinkId(b"\x03" * 16)))
        quiet = ParentLink.spawn(
            root.pid,
            root.address,
            root.serve(leaf, LinkId(b"\x02" * 16)),
            leaf.service,
            keepalive_interval=0.05,
        )
        await quiet.wait_active()
        # The silent stream is closed by the parent (it never said Hello)...
        with pytest.raises(ConnectionResetError):
            await silent.receive()
        # ... while the quiet link, past another idle timeout, is still served.
        closed = asyncio.get_running_loop().create_task(quiet.wait_closed())
        done, _ = await asyncio.wait({closed}, timeout=1.3)
        assert not done
        assert quiet.status.state is LinkState.ACTIVE
        assert root.service.child_links() == {leaf.pid: LinkId(b"\x02" * 16)}
        closed.cancel()
        await quiet.shutdown()

    run(main, timeout=15)


def test_an_abandoned_established_link_is_closed_and_revoked() -> None:
    async def main() -> None:
        root, leaf = Node(1), Node(2)
        root.service = NameserverService(root.pid, router=root.router, idle_timeout=0.2)
        root.service.set_local_entry(ProcEntry(root.pid, "n1", locators=(Locator(root.address),)))
        link = ParentLink.spawn(
            root.pid,
            root.address,
            root.serve(leaf, LinkId(b"\x02" * 16)),
            leaf.service,
            keepalive_interval=None,  # an old child that sends no keepalives, gone quiet
        )
        await link.wait_active()
        assert root.service.get(leaf.pid) is not None
        await eventually(lambda: root.service.get(leaf.pid) is None)
        assert root.service.child_links() == {}
        assert root.router.get(leaf.pid) is None
        await link.wait_closed()

    run(main)


def test_idle_timeout_is_validated() -> None:
    with pytest.raises(ValueError, match="idle_timeout"):
        NameserverService(pid(1), idle_timeout=0)
    NameserverService(pid(1), idle_timeout=None)


def test_a_lost_link_counts_as_rejoining_until_its_child_is_back_or_the_grace_ends() -> None:
    """A link that ends uncleanly (its QUIC connection idled out while a process was starved)
    revokes the child's entries, but the child counts as ``rejoining`` (callers may wait for
    it) until its new snapshot is committed, for ``rejoin_grace`` at most; a child joining
    (admitted, snapshot pending) counts too; a clean end and unknown PIDs never do."""

    async def main() -> None:
        now = [100.0]
        root, leaf = Node(1), Node(2)
        root.service = NameserverService(
            root.pid, router=root.router, rejoin_grace=5.0, clock=lambda: now[0]
        )
        root.service.set_local_entry(ProcEntry(root.pid, "n1", locators=(Locator(root.address),)))
        rejoining = root.service.rejoining
        assert not rejoining(pid(77))  # never seen

        async def connect(n: int) -> tuple[ParentLink, MemoryByteStream]:
            stream = root.serve(leaf, LinkId(bytes([n]) * 16))
            link = ParentLink.spawn(root.pid, root.address, stream, leaf.service)
            await link.wait_active()
            assert not rejoining(leaf.pid)  # published
            return link, stream

        # Lost: the child's stream is reset, not finished.
        link, stream = await connect(1)
        stream.abort()
        await eventually(lambda: root.service.get(leaf.pid) is None)
        assert rejoining(leaf.pid)
        assert not rejoining(pid(77))
        await link.wait_closed()
        # Joining again: admitted, its snapshot not committed yet.
        frames = NsFrameStream(root.serve(leaf, LinkId(b"\x02" * 16)))
        await frames.send(Hello(VersionRange(1, 3), leaf.pid))
        assert isinstance(await frames.receive(), Welcome)
        assert root.service.get(leaf.pid) is None
        assert rejoining(leaf.pid)
        frames.abort()
        await eventually(lambda: root.service.child_links() == {})
        # Back: published again on a new link.
        link, stream = await connect(3)
        # A clean end (the child stopped) is forgotten at once.
        await link.shutdown()
        await eventually(lambda: root.service.get(leaf.pid) is None)
        assert not rejoining(leaf.pid)
        # Lost again, then not back within the grace.
        link, stream = await connect(4)
        stream.abort()
        await eventually(lambda: root.service.get(leaf.pid) is None)
        now[0] += 4.9
        assert rejoining(leaf.pid)
        now[0] += 0.2
        assert not rejoining(leaf.pid)
        await link.wait_closed()
        await asyncio.gather(*root.tasks)

    run(main)


def test_rejoin_grace_is_validated() -> None:
    with pytest.raises(ValueError, match="rejoin_grace"):
        NameserverService(pid(1), rejoin_grace=-1)
