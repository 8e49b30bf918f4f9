"""``ReplicationTopology`` on real ``Node``s over an in-process carrier: a 5-node tree with
writes on every node converges everywhere, subtree scopes propagate upward, sessions restart
when a nameserver link is replaced, membership changes shrink and grow scopes, and the parent
refuses session streams that do not name the child's current link (spec 4.4)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from chrysalis.core import LinkContext, LinkId, LinkSide, Pid
from chrysalis.datagram import InprocNetwork
from chrysalis.node import SESSION_VERSION, JoinSettings, Node
from chrysalis.quic.testing import issue_identity
from chrysalis.sqlite import Replica, ReplicaSession, SitePublisher, TableSchema
from chrysalis.sqlite._topology import (
    SQLITE_LINK_PROTOCOL,
    ReplicationTopology,
    pump_session,
)

NOTES = TableSchema(
    "notes",
    "CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, author TEXT, body TEXT)",
    columns=["id", "author", "body"],
    primary_key=["id"],
)


def run(main: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    return asyncio.run(asyncio.wait_for(main(), timeout))


async def eventually(predicate: Callable[[], bool], timeout: float = 8.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


def rows(replica: Replica) -> set[tuple[Any, ...]]:
    return set(replica.connection.execute("SELECT id, author, body FROM notes").fetchall())


def write(replica: Replica, key: str, author: str, body: str) -> None:
    with replica.transaction() as tx:
        tx.upsert("notes", (key, author, body))


class Member:
    """One node of a test tree with its replica and topology."""

    node: Node

    def __init__(self, net: InprocNetwork, name: str, parent: Member | Node | None) -> None:
        self.name = name
        settings = None
        if parent is not None:
            up = parent.node if isinstance(parent, Member) else parent
            settings = JoinSettings(up.local_addr, up.pid, retry_delay=0.05)
        self.node = Node(issue_identity(), carrier=net.bind(), parent=settings)
        self.replica = Replica(":memory:", [NOTES])
        self.topology = ReplicationTopology(
            self.node, self.replica, retry_delay=0.05, poll_interval=0.05, handshake_timeout=2.0
        )

    async def enter(self, stack: AsyncExitStack) -> Member:
        stack.callback(self.replica.close)
        await stack.enter_async_context(self.node)
        await stack.enter_async_context(self.topology)
        await self.node.wait_connected()
        return self

    @property
    def site(self) -> bytes:
        return self.replica.site_id


def explicit_sites(topology: ReplicationTopology) -> set[bytes]:
    sites = topology.upstream_scope.sites
    assert sites is not None
    return set(sites.site_ids)


async def tree(net: InprocNetwork, stack: AsyncExitStack) -> dict[str, Member]:
    """root <- a <- a1, root <- b <- b1."""
    members: dict[str, Member] = {}
    for name, parent in (("root", None), ("a", "root"), ("b", "root"), ("a1", "a"), ("b1", "b")):
        up = members[parent] if parent is not None else None
        members[name] = await Member(net, name, up).enter(stack)
    return members


def test_five_node_tree_converges_with_writes_on_every_node() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            m = await tree(net, stack)
            expected: set[tuple[Any, ...]] = set()
            for round_ in range(3):
                for name, member in m.items():
                    key = f"{name}-{round_}"
                    write(member.replica, key, name, f"note {round_}")
                    expected.add((key, name, f"note {round_}"))
                await asyncio.sleep(0.01)
            # one row written concurrently everywhere: last-writer-wins picks one winner
            for name, member in m.items():
                write(member.replica, "shared", name, "contended")
            await eventually(lambda: all(rows(x.replica) >= expected for x in m.values()))
            await eventually(lambda: len({frozenset(rows(x.replica)) for x in m.values()}) == 1)
            assert len(rows(m["root"].replica)) == len(expected) + 1
            # subtree scopes propagated up the tree
            assert explicit_sites(m["a"].topology) == {m["a"].site, m["a1"].site}
            assert explicit_sites(m["b"].topology) == {m["b"].site, m["b1"].site}
            assert explicit_sites(m["root"].topology) == {x.site for x in m.values()}
            root_links = m["root"].topology.links()
            assert {s.peer for s in root_links} == {m["a"].node.pid, m["b"].node.pid}
            assert all(s.side is LinkSide.CHILD for s in root_links)
            a_links = m["a"].topology.links()
            assert [s.side for s in a_links] == [LinkSide.PARENT, LinkSide.CHILD]
            assert a_links[0].peer == m["root"].node.pid
            # the parent link's session runs on the nameserver link of the manager
            manager = m["a"].node.parent_manager
            assert manager is not None
            assert a_links[0].link == manager.status.link
            assert all(x.topology.session_errors == 0 for x in m.values())

    run(main)


def test_parent_link_session_restarts_when_the_nameserver_link_is_replaced() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            root = await Member(net, "root", None).enter(stack)
            child = await Member(net, "child", root).enter(stack)
            write(child.replica, "before", "child", "1")
            await eventually(lambda: ("before", "child", "1") in rows(root.replica))
            manager = child.node.parent_manager
            assert manager is not None
            old_link = manager.status.link
            started = child.topology.sessions_started
            current = manager.current_link
            assert current is not None
            await current.shutdown()  # the manager reconnects under a new link id
            await eventually(
                lambda: (
                    manager.status.link not in (None, old_link)
                    and [s.link for s in child.topology.links()] == [manager.status.link]
                )
            )
            assert child.topology.sessions_started > started
            await eventually(
                lambda: [s.link for s in root.topology.links()] == [manager.status.link]
            )
            write(child.replica, "after", "child", "2")
            write(root.replica, "down", "root", "3")
            await eventually(lambda: ("after", "child", "2") in rows(root.replica))
            await eventually(lambda: ("down", "root", "3") in rows(child.replica))
            # the root admitted the new link while dropping the old one's session: the new
            # session waited for the stale one instead of failing on the duplicate peer
            assert root.topology.session_errors == 0
            assert child.topology.session_errors == 0

    run(main)


def test_membership_changes_shrink_and_grow_the_upstream_scope() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            root = await Member(net, "root", None).enter(stack)
            mid = await Member(net, "mid", root).enter(stack)
            async with AsyncExitStack() as leaf_stack:
                leaf = await Member(net, "leaf", mid).enter(leaf_stack)
                await eventually(lambda: explicit_sites(mid.topology) == {mid.site, leaf.site})
                write(leaf.replica, "leaf-row", "leaf", "x")
                await eventually(lambda: ("leaf-row", "leaf", "x") in rows(root.replica))
                grown = mid.topology.upstream_scope.sites
                assert grown is not None
            # the leaf left: its site leaves mid's subtree scope with a new generation
            await eventually(lambda: explicit_sites(mid.topology) == {mid.site})
            shrunk = mid.topology.upstream_scope.sites
            assert shrunk is not None
            assert shrunk.generation > grown.generation
            # the root's session with mid sees the new scope
            await eventually(
                lambda: any(
                    s.peer_scope is not None
                    and s.peer_scope.sites is not None
                    and set(s.peer_scope.sites.site_ids) == {mid.site}
                    for s in root.topology.links()
                )
            )
            newcomer = await Member(net, "newcomer", mid).enter(stack)
            write(newcomer.replica, "new-row", "newcomer", "y")
            await eventually(lambda: ("new-row", "newcomer", "y") in rows(root.replica))
            await eventually(lambda: ("leaf-row", "leaf", "x") in rows(newcomer.replica))
            assert explicit_sites(mid.topology) == {mid.site, newcomer.site}

    run(main)


def test_parent_drops_streams_that_do_not_name_the_current_link() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            root = await Member(net, "root", None).enter(stack)
            child = await Member(net, "child", root).enter(stack)
            await eventually(lambda: len(root.topology.links()) == 1)
            node = child.node
            # a link id the root never allocated: dropped without the ack byte
            stream = await node.dial_link_local(
                root.node.pid, root.node.local_addr, SQLITE_LINK_PROTOCOL
            )
            stream.write(LinkId(b"\x77" * 16).raw)
            async with asyncio.timeout(5):
                assert await stream.read(1) == b""
            # the current link, but a session already runs on it: dropped as well
            manager = node.parent_manager
            assert manager is not None
            assert manager.status.link is not None
            stream = await node.dial_link_local(
                root.node.pid, root.node.local_addr, SQLITE_LINK_PROTOCOL
            )
            stream.write(manager.status.link.raw)
            async with asyncio.timeout(5):
                assert await stream.read(1) == b""
            assert len(root.topology.links()) == 1
            assert SESSION_VERSION == 1

    run(main)


def test_a_parent_without_the_protocol_refuses_and_the_link_is_given_up() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            root = Node(issue_identity(), carrier=net.bind())  # no topology on the root
            await stack.enter_async_context(root)
            child = await Member(net, "child", root).enter(stack)
            manager = child.node.parent_manager
            assert manager is not None
            sessions = child.topology.link_sessions
            await eventually(lambda: manager.status.link in sessions.refused_links)
            assert sessions.failure is None
            assert child.topology.links() == ()
            assert child.topology.sessions_started == 0

    run(main)


def test_sessions_wait_for_the_start_and_end_with_the_close() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            root = await Member(net, "root", None).enter(stack)
            child = Member(net, "child", root)
            stack.callback(child.replica.close)
            await stack.enter_async_context(child.node)
            await child.node.wait_connected()
            # the node admitted the link, but the topology has not started: no replication
            await eventually(
                lambda: child.node.link_sessions(SQLITE_LINK_PROTOCOL).sessions_started > 0
            )
            await asyncio.sleep(0.1)
            assert child.topology.links() == ()
            write(child.replica, "early", "child", "1")
            await child.topology.start()
            await eventually(lambda: ("early", "child", "1") in rows(root.replica))
            await eventually(lambda: len(child.topology.links()) == 1)
            await child.topology.aclose()
            assert child.topology.links() == ()
            write(child.replica, "late", "child", "2")
            await asyncio.sleep(0.3)  # several retry delays: the node reopens, we end it
            assert ("late", "child", "2") not in rows(root.replica)
            assert child.topology.links() == ()
            assert child.topology.session_errors == 0

    run(main)


def test_a_reconnected_childs_new_session_waits_for_its_stale_one() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            root = await Member(net, "root", None).enter(stack)
            peer = Pid(b"\x05" * 16)
            old, new = LinkId(b"\x01" * 16), LinkId(b"\x02" * 16)

            def pipe() -> _Pipe:
                ours, theirs = _Pipe(), _Pipe()
                ours.peer, theirs.peer = theirs, ours
                return ours

            # what the node does: the old link's session still runs when the new one is admitted
            stale = asyncio.ensure_future(
                root.topology._session(LinkContext(old, peer, LinkSide.CHILD), pipe())
            )
            await eventually(lambda: [s.link for s in root.topology.links()] == [old])
            fresh = asyncio.ensure_future(
                root.topology._session(LinkContext(new, peer, LinkSide.CHILD), pipe())
            )
            await asyncio.sleep(0.1)
            assert [s.link for s in root.topology.links()] == [old]  # waiting, not failing
            stale.cancel()  # the node drops the old link's session
            await asyncio.gather(stale, return_exceptions=True)
            await eventually(lambda: [s.link for s in root.topology.links()] == [new])
            assert root.topology.session_errors == 0
            fresh.cancel()
            await asyncio.gather(fresh, return_exceptions=True)
            assert root.topology.links() == ()

    run(main)


def test_topology_refuses_a_second_registration_on_one_node() -> None:
    node = Node(issue_identity(), carrier=InprocNetwork().bind())
    replica = Replica(":memory:", [NOTES])
    try:
        ReplicationTopology(node, replica)
        with pytest.raises(ValueError, match="already registered"):
            ReplicationTopology(node, replica)
    finally:
        replica.close()
        node._carrier.shutdown()  # type: ignore[union-attr]


class _Pipe:
    """One direction-pair of an in-memory ``ByteStream`` for ``pump_session``."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue()
        self.peer: _Pipe | None = None
        self.aborted = False
        self.finished = False

    async def read(self, n: int = -1) -> bytes:
        return await self.inbox.get()

    async def read_exactly(self, n: int) -> bytes:
        raise NotImplementedError  # pump_session reads what arrives

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self.peer is not None
        self.peer.inbox.put_nowait(bytes(data))

    async def drain(self) -> None:
        return None

    def write_eof(self) -> None:
        self.finished = True
        assert self.peer is not None
        self.peer.inbox.put_nowait(b"")

    def abort(self, error_code: int = 0) -> None:
        self.aborted = True
        assert self.peer is not None
        self.peer.inbox.put_nowait(b"")

    def close(self, error_code: int = 0) -> None:
        self.write_eof()

    async def wait_closed(self) -> None:
        return None


def test_pump_session_moves_rows_and_ends_cleanly_on_end_of_stream() -> None:
    async def main() -> None:
        left = Replica(":memory:", [NOTES])
        right = Replica(":memory:", [NOTES])
        a, b = _Pipe(), _Pipe()
        a.peer, b.peer = b, a
        sa = ReplicaSession(left, Pid(b"\x01" * 16), SitePublisher.local(left.site_id))
        sb = ReplicaSession(right, Pid(b"\x02" * 16), SitePublisher.local(right.site_id))
        wake = asyncio.Event()
        left.add_change_listener(wake.set)
        ta = asyncio.ensure_future(pump_session(sa, a, wake=wake, poll_interval=5.0))
        tb = asyncio.ensure_future(pump_session(sb, b, poll_interval=0.05))
        write(left, "k", "left", "v")  # delivered through the wake event, not the 5 s tick
        await eventually(lambda: ("k", "left", "v") in rows(right), timeout=2.0)
        a.inbox.put_nowait(b"")  # the peer ends its side: a clean end
        await asyncio.wait_for(ta, 2.0)
        assert a.finished
        assert not a.aborted
        await asyncio.wait_for(tb, 2.0)
        assert not sa.is_live
        assert not sb.is_live
        left.close()
        right.close()

    run(main)


def test_pump_session_aborts_the_stream_on_a_protocol_error() -> None:
    async def main() -> None:
        replica = Replica(":memory:", [NOTES])
        a, b = _Pipe(), _Pipe()
        a.peer, b.peer = b, a
        session = ReplicaSession(replica, Pid(b"\x01" * 16), SitePublisher.local(replica.site_id))
        task = asyncio.ensure_future(pump_session(session, a, poll_interval=0.05))
        a.inbox.put_nowait(b"\x00\x00\x00\x01\x63")  # a frame with an unknown tag
        with pytest.raises(Exception):  # noqa: B017 - the codec error type is the session's
            await asyncio.wait_for(task, 2.0)
        assert a.aborted
        assert not session.is_live
        # the replica accepts a new session for the same peer afterwards
        ReplicaSession(replica, Pid(b"\x01" * 16), SitePublisher.local(replica.site_id)).close()
        replica.close()

    run(main)
