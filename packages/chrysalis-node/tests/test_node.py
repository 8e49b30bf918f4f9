"""``Node`` end to end over in-process carriers: publication enables streams, a 3-level tree
resolves and echoes through the gateway, duplicates are rejected, discovery pins the parent,
link-local protocols coexist with the nameserver, and clean or hard child exits withdraw (hard
ones fence the routes before removing them)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from chrysalis.core import DatagramAddr, LinkContext, LinkSide, Pid
from chrysalis.datagram import DatagramSocketSet, InprocNetwork, UdpSocket, UnixDatagramSocket
from chrysalis.nameserver import Consistency, Found, Locator, ParentStatusKind, TerminalRejection
from chrysalis.node import JoinSettings, LinkSessionVersionError, Node, NodeError
from chrysalis.quic._transport import LinkProtocolId
from chrysalis.quic.testing import issue_identity


def run(main: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    return asyncio.run(asyncio.wait_for(main(), timeout))


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def withdrawn_from(parent: Node, pid: Pid) -> Callable[[], bool]:
    return lambda: parent.nameserver.get(pid) is None


def root(net: InprocNetwork) -> Node:
    return Node(issue_identity(), carrier=net.bind())


def child(net: InprocNetwork, parent: Node, *, pinned: bool = True, **kw: Any) -> Node:
    settings = JoinSettings(parent.local_addr, parent.pid if pinned else None, retry_delay=0.05)
    return Node(kw.pop("identity", None) or issue_identity(), carrier=net.bind(), parent=settings)


async def echo_once(node: Node) -> None:
    _peer, stream = await node.accept()
    data = await stream.read()
    stream.write(data[::-1])
    stream.write_eof()


async def round_trip(source: Node, target: Pid, payload: bytes) -> bytes:
    stream = await source.dial(target, Consistency.REFRESH)
    stream.write(payload)
    stream.write_eof()
    return bytes(await stream.read())


def test_child_publication_enables_application_stream_round_trip() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r) as c:
            status = await c.wait_connected()
            assert status is not None
            assert status.peer == r.pid
            assert r.router.get(c.pid) is not None
            task = asyncio.ensure_future(echo_once(c))
            assert await round_trip(r, c.pid, b"ping") == b"gnip"
            await task

    run(main)


def test_three_level_tree_resolves_and_echoes_between_every_pair() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            r = await stack.enter_async_context(root(net))
            g = await stack.enter_async_context(child(net, r))
            await g.wait_connected()
            leaf = await stack.enter_async_context(child(net, g))
            await leaf.wait_connected()
            await eventually(lambda: r.nameserver.get(leaf.pid) is not None)
            seen = r.nameserver.get(leaf.pid)
            assert seen is not None
            assert seen.locators == (Locator(g.local_addr, 0),)
            everyone = await leaf.enumerate(Consistency.REFRESH)
            assert {e.pid for e in everyone} == {r.pid, g.pid, leaf.pid}
            assert [e.pid for e in await leaf.enumerate(Consistency.CACHED)] == [leaf.pid]
            answer = await leaf.resolve(r.pid, Consistency.REFRESH)
            assert isinstance(answer, Found)
            assert await leaf.expand_pid(r.pid.hex()[:12]) == r.pid
            nodes = [r, g, leaf]
            for source in nodes:
                for target in nodes:
                    if source is target:
                        continue
                    task = asyncio.ensure_future(echo_once(target))
                    payload = f"{source.pid.hex()[:4]}->{target.pid.hex()[:4]}".encode()
                    assert await round_trip(source, target.pid, payload) == payload[::-1]
                    await task

    run(main)


def test_duplicate_child_pid_reports_terminal_parent_rejection() -> None:
    async def main() -> None:
        net = InprocNetwork()
        identity = issue_identity()
        async with root(net) as r, child(net, r, identity=identity) as first:
            await first.wait_connected()
            async with child(net, r, identity=identity) as twin:
                with pytest.raises(TerminalRejection, match="already_linked"):
                    await twin.wait_connected()
                manager = twin.parent_manager
                assert manager is not None
                assert manager.status.kind is ParentStatusKind.FAILED

    run(main)


def test_child_discovers_parent_identity_from_address() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r, pinned=False) as c:
            status = await c.wait_connected()
            assert status is not None
            assert status.peer == r.pid
            manager = c.parent_manager
            assert manager is not None
            assert manager.pinned == r.pid

    run(main)


def test_custom_link_local_protocol_coexists_with_nameserver() -> None:
    async def main() -> None:
        net = InprocNetwork()
        protocol = LinkProtocolId(b"test.custom.v1\0\0")
        seen: list[Pid] = []

        async def handler(peer: Pid, stream: Any) -> None:
            seen.append(peer)
            stream.write(await stream.readexactly(5))
            stream.write_eof()

        r = root(net)
        r.register_link_protocol(protocol, handler)
        with pytest.raises(ValueError, match="already registered"):
            r.register_link_protocol(protocol, handler)
        with pytest.raises(ValueError, match="already registered"):
            r.register_link_protocol(b"chrysalis.ns.v3\0", handler)
        async with r, child(net, r) as c:
            await c.wait_connected()
            stream = await c.dial_link_local(r.pid, r.local_addr, protocol)
            stream.write(b"hello")
            assert await stream.readexactly(5) == b"hello"
            assert seen == [c.pid]
            assert r.nameserver.get(c.pid) is not None  # the nameserver link is unaffected

    run(main)


def test_short_lived_children_are_withdrawn_after_clean_shutdown() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r:
            for _ in range(3):
                async with child(net, r) as c:
                    await c.wait_connected()
                    assert r.nameserver.get(c.pid) is not None
                await eventually(withdrawn_from(r, c.pid))
                assert r.router.get(c.pid) is None

    run(main)


def test_killing_a_childs_transport_fences_its_routes() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r:
            c = child(net, r)
            await c.__aenter__()
            try:
                await c.wait_connected()
                route = r.router.get(c.pid)
                assert route is not None
                assert route.gate is not None
                gate = route.gate
                assert gate.is_active
                # A hard stop: the child's transport aborts, nothing is finished cleanly.
                await c.transport.aclose(abort=True)
                # The parent fences first (the gate is closed) and removes the route after.
                await eventually(lambda: not gate.is_active, timeout=10)
                await eventually(lambda: r.router.get(c.pid) is None)
                assert r.nameserver.get(c.pid) is None
            finally:
                await c.aclose()

    run(main, timeout=30)


def test_dial_unknown_pid_reports_not_found() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r:
            with pytest.raises(NodeError, match="NotFound"):
                await r.dial(Pid(b"\x42" * 16))

    run(main)


def _udp() -> UdpSocket:
    return UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))


def _unix(path: Path) -> UnixDatagramSocket:
    return UnixDatagramSocket.bind(DatagramAddr.parse(f"unix://{path}"))


def test_node_serving_on_unix_while_joined_over_udp_takes_connections_from_everyone(
    tmp_path: Path,
) -> None:
    """Issue 5's mixed-carrier bug: B serves its child on Unix (its primary carrier) while it
    reaches its parent A over UDP; C serves on UDP while it reaches B over Unix. Each
    advertises the carrier of its parent link, so every process, the parents included (they
    dial the advertised address directly), gets answers on the path its requests took."""

    async def echo_forever(node: Node) -> None:
        while True:
            _peer, stream = await node.accept()
            stream.write(await stream.read())
            stream.write_eof()

    async def main() -> None:
        settings = {"retry_delay": 0.05}
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(
                Node(issue_identity(), carrier=DatagramSocketSet(_udp(), _unix(tmp_path / "a")))
            )
            b = await stack.enter_async_context(
                Node(
                    issue_identity(),
                    carrier=DatagramSocketSet(_unix(tmp_path / "b"), _udp()),
                    parent=JoinSettings(a.local_addr, a.pid, **settings),
                )
            )
            await b.wait_connected()
            assert b.local_addr.scheme == "unixgram"
            assert b.advertised_addr.scheme == "udp"
            c = await stack.enter_async_context(
                Node(
                    issue_identity(),
                    carrier=DatagramSocketSet(_udp(), _unix(tmp_path / "c")),
                    parent=JoinSettings(b.local_addr, b.pid, **settings),
                )
            )
            x = await stack.enter_async_context(
                Node(
                    issue_identity(),
                    carrier=DatagramSocketSet(_udp(), _unix(tmp_path / "x")),
                    parent=JoinSettings(a.local_addr, a.pid, **settings),
                )
            )
            await c.wait_connected()
            await x.wait_connected()
            assert c.advertised_addr.scheme == "unixgram"
            nodes = [a, b, c, x]
            await eventually(lambda: all(a.nameserver.get(n.pid) for n in nodes[1:]))
            a_view = a.nameserver.get(b.pid)
            assert a_view is not None
            assert a_view.locators == (Locator(b.advertised_addr, 0),)
            servers = [asyncio.ensure_future(echo_forever(n)) for n in nodes]
            try:
                for source in nodes:
                    for target in nodes:
                        if source is not target:
                            payload = f"{source.pid}->{target.pid}".encode()
                            async with asyncio.timeout(5):
                                echoed = await round_trip(source, target.pid, payload)
                            assert echoed == payload, (source.local_addr, target.local_addr)
            finally:
                for server in servers:
                    server.cancel()
                await asyncio.gather(*servers, return_exceptions=True)

    run(main, timeout=40)


SESSION_PROTOCOL = LinkProtocolId(b"test.session.v1\0")


def test_link_sessions_run_once_per_link_with_both_sides_and_restart() -> None:
    async def main() -> None:
        net = InprocNetwork()
        contexts: list[LinkContext] = []
        restarted = asyncio.Event()

        async def handler(context: LinkContext, stream: Any) -> None:
            contexts.append(context)
            if context.side is LinkSide.PARENT:
                stream.write(b"ping")
                await stream.drain()
                assert await stream.readexactly(4) == b"pong"
                if sum(c.side is LinkSide.PARENT for c in contexts) >= 2:
                    restarted.set()
                    await asyncio.Event().wait()  # stay until the link ends
            else:
                assert await stream.readexactly(4) == b"ping"
                stream.write(b"pong")
                await stream.drain()
                await stream.read()  # until the child ends the session

        r = root(net)
        r.register_link_session(SESSION_PROTOCOL, handler)
        with pytest.raises(ValueError, match="already registered"):
            r.register_link_session(b"chrysalis.ns.v3\0", handler)
        c = child(net, r)
        c.register_link_session(SESSION_PROTOCOL, handler, retry_delay=0.05)
        async with r, c:
            status = await c.wait_connected()
            assert status is not None
            assert status.link is not None
            async with asyncio.timeout(10):
                await restarted.wait()
            # The first session ended normally and was reopened on the same link.
            parent_side = [x for x in contexts if x.side is LinkSide.PARENT]
            child_side = [x for x in contexts if x.side is LinkSide.CHILD]
            assert {x.link for x in parent_side} == {status.link}
            assert {x.peer for x in parent_side} == {r.pid}
            assert {x.peer for x in child_side} == {c.pid}
            assert len(child_side) >= 2
            assert r.link_sessions(SESSION_PROTOCOL).active_links == {status.link}
            assert c.link_sessions(SESSION_PROTOCOL).failure is None

    run(main)


def test_link_session_refused_by_a_parent_without_the_protocol_is_given_up() -> None:
    async def main() -> None:
        net = InprocNetwork()
        ran: list[LinkContext] = []

        async def handler(context: LinkContext, stream: Any) -> None:
            ran.append(context)

        async with root(net) as r:
            c = child(net, r)
            c.register_link_session(SESSION_PROTOCOL, handler, retry_delay=0.05)
            async with c:
                status = await c.wait_connected()
                assert status is not None
                sessions = c.link_sessions(SESSION_PROTOCOL)
                await eventually(lambda: status.link in sessions.refused_links)
                assert ran == []

    run(main)


def test_link_session_version_mismatch_is_a_clear_error() -> None:
    async def main() -> None:
        net = InprocNetwork()

        async def future_parent(peer: Pid, stream: Any) -> None:
            await stream.readexactly(16)
            stream.write(bytes([2]))  # a parent speaking session handshake version 2
            await stream.drain()
            await stream.read()

        async def handler(context: LinkContext, stream: Any) -> None:
            raise AssertionError("a session must not run across a version mismatch")

        r = root(net)
        r.register_link_protocol(SESSION_PROTOCOL, future_parent)
        async with r:
            c = child(net, r)
            c.register_link_session(SESSION_PROTOCOL, handler, retry_delay=0.05)
            async with c:
                await c.wait_connected()
                sessions = c.link_sessions(SESSION_PROTOCOL)
                await eventually(lambda: sessions.failure is not None)
                assert isinstance(sessions.failure, LinkSessionVersionError)
                assert "handshake version 2, this node speaks 1" in str(sessions.failure)

    run(main)
