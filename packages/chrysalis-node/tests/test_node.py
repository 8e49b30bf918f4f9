"""``Node`` end to end over in-process carriers, each scenario under asyncio and under trio
(``node_runtimes``): publication enables streams, a 3-level tree resolves, enumerates and
echoes through the gateway, a second node with one identity supersedes the first, discovery
pins the parent, link-local protocols and link sessions coexist with the nameserver, clean or
hard child exits withdraw (hard ones fence the routes before removing them), and a node
serving one carrier while joined over another takes connections from everyone. Mixed
processes (trio here, asyncio in a ``chrysalis`` process) are in ``test_node_trio.py``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the shared runtime helper, by name
from node_runtimes import AsyncioRuntime, Runtime, TrioRuntime, directory_until, eventually

from chrysalis.core import DatagramAddr, LinkContext, LinkSide, Pid
from chrysalis.datagram import (
    DatagramSocketSet,
    InprocNetwork,
    UdpSocket,
    UnixDatagramSocket,
)
from chrysalis.nameserver import (
    Consistency,
    Found,
    Locator,
    ParentStatusKind,
    TerminalRejection,
)
from chrysalis.node import JoinSettings, LinkSessionVersionError, Node, NodeError
from chrysalis.node import _node as node_module
from chrysalis.quic import QuicConfig
from chrysalis.quic._transport import LinkProtocolId
from chrysalis.quic.testing import issue_identity


@pytest.fixture(params=["asyncio", "trio"])
def runtime(request: pytest.FixtureRequest) -> Runtime:
    """Every scenario runs once per runtime the node supports."""
    if request.param == "trio":
        pytest.importorskip("trio")
        return TrioRuntime()
    return AsyncioRuntime()


def withdrawn_from(parent: Node, pid: Pid) -> Callable[[], bool]:
    return lambda: parent.nameserver.get(pid) is None


def root(net: InprocNetwork) -> Node:
    return Node(issue_identity(), carrier=net.bind())


def child(net: InprocNetwork, parent: Node, *, pinned: bool = True, **kw: Any) -> Node:
    settings = JoinSettings(parent.local_addr, parent.pid if pinned else None, retry_delay=0.05)
    return Node(kw.pop("identity", None) or issue_identity(), carrier=net.bind(), parent=settings)


async def echo_forever(rt: Runtime, node: Node) -> None:
    """Answer every stream opened to ``node`` with its bytes reversed, one stream at a time."""
    while True:
        _peer, stream = await node.accept()
        data = await rt.receive_all(stream)
        await rt.send(stream, data[::-1])
        await rt.send_eof(stream)


async def round_trip(rt: Runtime, source: Node, target: Pid, payload: bytes) -> bytes:
    stream = await source.dial(target, Consistency.REFRESH)
    await rt.send(stream, payload)
    await rt.send_eof(stream)
    return await rt.receive_all(stream)


async def echo_between_every_pair(rt: Runtime, nodes: list[Node]) -> None:
    async with rt.background() as servers:
        for node in nodes:
            servers.spawn(echo_forever, rt, node)
        for source in nodes:
            for target in nodes:
                if source is not target:
                    payload = f"{source.pid}->{target.pid}".encode()
                    async with rt.bounded(5):
                        echoed = await round_trip(rt, source, target.pid, payload)
                    assert echoed == payload[::-1], (source.local_addr, target.local_addr)


def test_child_publication_enables_application_stream_round_trip(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r) as c:
            status = await c.wait_connected()
            assert status is not None
            assert status.peer == r.pid
            assert r.router.get(c.pid) is not None
            async with runtime.background() as servers:
                servers.spawn(echo_forever, runtime, c)
                servers.spawn(echo_forever, runtime, r)
                assert await round_trip(runtime, r, c.pid, b"down") == b"nwod"
                assert await round_trip(runtime, c, r.pid, b"up") == b"pu"
        assert r.transport.is_closed

    runtime.run(main)


def test_three_level_tree_resolves_and_echoes_between_every_pair(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            r = await stack.enter_async_context(root(net))
            g = await stack.enter_async_context(child(net, r))
            await g.wait_connected()
            leaf = await stack.enter_async_context(child(net, g))
            await leaf.wait_connected()
            await directory_until(runtime, r, lambda: r.nameserver.get(leaf.pid) is not None)
            seen = r.nameserver.get(leaf.pid)
            assert seen is not None
            assert seen.locators == (Locator(g.local_addr, 0),)
            everyone = await leaf.enumerate(Consistency.REFRESH)
            assert {e.pid for e in everyone} == {r.pid, g.pid, leaf.pid}
            assert [e.pid for e in await leaf.enumerate(Consistency.CACHED)] == [leaf.pid]
            answer = await leaf.resolve(r.pid, Consistency.REFRESH)
            assert isinstance(answer, Found)
            assert await leaf.expand_pid(r.pid.hex()[:12]) == r.pid
            await echo_between_every_pair(runtime, [r, g, leaf])

    runtime.run(main)


def test_a_second_node_with_one_identity_supersedes_and_clean_exits_are_withdrawn(
    runtime: Runtime,
) -> None:
    """Issue 15, item 3: a node (re)started with the identity of a node its parent still
    holds a link for is accepted and published; the old link is fenced and its node is told,
    with a ``TerminalRejection`` (no retry loop between the two)."""

    async def main() -> None:
        net = InprocNetwork()
        identity = issue_identity()
        async with root(net) as r:
            async with child(net, r, identity=identity) as first:
                await first.wait_connected()
                async with child(net, r, identity=identity) as twin:
                    await twin.wait_connected()
                    await directory_until(
                        runtime,
                        r,
                        lambda: (
                            (e := r.nameserver.get(twin.pid)) is not None
                            and e.locators == (Locator(twin.local_addr, 0),)
                        ),
                    )
                    # The old link is told after the twin is published: until then
                    # ``first`` is still connected, and ``wait_connected`` says so.
                    manager = first.parent_manager
                    assert manager is not None
                    await eventually(
                        runtime, lambda: manager.status.kind is ParentStatusKind.FAILED
                    )
                    with pytest.raises(TerminalRejection, match="already_linked") as info:
                        await first.wait_connected()
                    assert info.value.superseded
            await directory_until(runtime, r, withdrawn_from(r, first.pid))
            assert r.router.get(first.pid) is None

    runtime.run(main)


def test_child_discovers_parent_identity_from_address(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r, pinned=False) as c:
            status = await c.wait_connected()
            assert status is not None
            assert status.peer == r.pid
            manager = c.parent_manager
            assert manager is not None
            assert manager.pinned == r.pid

    runtime.run(main)


def test_custom_link_local_protocol_coexists_with_nameserver(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()
        protocol = LinkProtocolId(b"test.custom.v1\0\0")
        seen: list[Pid] = []

        async def handler(peer: Pid, stream: Any) -> None:
            seen.append(peer)
            await runtime.send(stream, await runtime.receive_exactly(stream, 5))
            await runtime.send_eof(stream)

        r = root(net)
        r.register_link_protocol(protocol, handler)
        with pytest.raises(ValueError, match="already registered"):
            r.register_link_protocol(protocol, handler)
        with pytest.raises(ValueError, match="already registered"):
            r.register_link_protocol(b"chrysalis.ns.v3\0", handler)
        async with r, child(net, r) as c:
            await c.wait_connected()
            stream = await c.dial_link_local(r.pid, r.local_addr, protocol)
            await runtime.send(stream, b"hello")
            assert await runtime.receive_exactly(stream, 5) == b"hello"
            assert seen == [c.pid]
            assert r.nameserver.get(c.pid) is not None  # the nameserver link is unaffected

    runtime.run(main)


def test_short_lived_children_are_withdrawn_after_clean_shutdown(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r:
            for _ in range(3):
                async with child(net, r) as c:
                    await c.wait_connected()
                    assert r.nameserver.get(c.pid) is not None
                await directory_until(runtime, r, withdrawn_from(r, c.pid))
                assert r.router.get(c.pid) is None

    runtime.run(main)


def test_killing_a_childs_transport_fences_its_routes(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r) as c:
            await c.wait_connected()
            route = r.router.get(c.pid)
            assert route is not None
            assert route.gate is not None
            gate = route.gate
            assert gate.is_active
            # A hard stop: the child's transport aborts, nothing is finished cleanly.
            await c.transport.aclose(abort=True)
            # The parent fences first (the gate is closed) and removes the route after: the
            # removal is a directory change (an event), and the gate is closed by then.
            await directory_until(runtime, r, lambda: r.router.get(c.pid) is None, timeout=10)
            assert not route.gate.is_active  # (``gate.is_active`` is narrowed to True above)
            assert r.nameserver.get(c.pid) is None

    runtime.run(main, timeout=30)


def test_dial_unknown_pid_reports_not_found(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r:
            with pytest.raises(NodeError, match="NotFound"):
                await r.dial(Pid(b"\x42" * 16))

    runtime.run(main)


async def lose_parent_link(runtime: Runtime, r: Node, c: Node) -> Any:
    """End ``c``'s nameserver link to ``r`` uncleanly (as when its QUIC connection idled out
    while one side was starved of CPU) and hold ``c``'s next dial of its parent until the
    returned event is set. Returns once ``r`` revoked ``c``'s entry."""
    manager = c.parent_manager
    assert manager is not None
    link = manager.current_link
    assert link is not None
    gate = runtime.event()
    dial = manager._dial

    async def held(address: DatagramAddr, pinned: Pid | None) -> tuple[Pid, Any]:
        await gate.wait()
        return await dial(address, pinned)

    manager._dial = held
    link._frames.abort()  # a reset, not a finished stream
    await directory_until(runtime, r, withdrawn_from(r, c.pid))
    return gate


def test_dial_waits_for_a_child_whose_link_was_lost_until_it_joins_again(
    runtime: Runtime,
) -> None:
    """The flake of a first call to a fresh worker ("PID ... is not found (NotFound)"): the
    worker's link was lost (an idled-out connection under CPU starvation) and its entry
    revoked, while the worker was alive and joining again. ``dial`` waits (bounded) for such a
    child instead of failing at once; an unknown PID still fails at once."""

    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r) as c:
            await c.wait_connected()
            gate = await lose_parent_link(runtime, r, c)
            assert r.nameserver.rejoining(c.pid)
            with pytest.raises(NodeError, match="NotFound"):  # not waited for: at once
                await r.dial(c.pid, rejoin_timeout=0)
            async with runtime.background() as tasks:
                tasks.spawn(echo_forever, runtime, c)

                async def rejoin_later() -> None:
                    await runtime.sleep(0.2)  # the child is slow to come back
                    gate.set()

                tasks.spawn(rejoin_later)
                async with runtime.bounded(5):
                    assert await round_trip(runtime, r, c.pid, b"back") == b"kcab"
                assert r.nameserver.get(c.pid) is not None
                with pytest.raises(NodeError, match="NotFound"):
                    await r.dial(Pid(b"\x42" * 16))

    runtime.run(main)


def test_dial_to_a_lost_child_that_does_not_join_again_fails_after_the_bound(
    runtime: Runtime,
) -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r) as c:
            await c.wait_connected()
            gate = await lose_parent_link(runtime, r, c)
            with pytest.raises(NodeError, match=r"NotFound\): .* did not join again within 0.3"):
                await r.dial(c.pid, rejoin_timeout=0.3)
            gate.set()

    runtime.run(main)


def test_the_default_dial_wait_covers_one_idle_timeout_of_the_child_noticing_late(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that was starved (or stopped) may notice its lost link up to one QUIC idle
    timeout late (on the qh3 engine the keepalives queued meanwhile restart its idle timer
    when it runs again; its deadline may fall after its parent's), so the
    default wait of ``dial`` is the idle timeout plus ``DEFAULT_REJOIN_TIMEOUT``: a child back
    after longer than ``DEFAULT_REJOIN_TIMEOUT`` alone is still reached (the CI flake of
    ``test_starved_worker``: 3 s of idle timeout, a 5 s wait, a loaded machine)."""
    monkeypatch.setattr(node_module, "DEFAULT_REJOIN_TIMEOUT", 0.2)

    async def main() -> None:
        net = InprocNetwork()
        quic = QuicConfig(idle_timeout=1.5, keepalive_interval=0.3)
        async with Node(issue_identity(), carrier=net.bind(), quic_config=quic) as r:
            assert r.rejoin_timeout == pytest.approx(1.7)
            async with child(net, r) as c:
                await c.wait_connected()
                gate = await lose_parent_link(runtime, r, c)
                async with runtime.background() as tasks:
                    tasks.spawn(echo_forever, runtime, c)

                    async def rejoin_later() -> None:
                        await runtime.sleep(0.6)  # past DEFAULT_REJOIN_TIMEOUT, within the bound
                        gate.set()

                    tasks.spawn(rejoin_later)
                    async with runtime.bounded(5):
                        assert await round_trip(runtime, r, c.pid, b"late") == b"etal"
                gate = await lose_parent_link(runtime, r, c)
                with pytest.raises(NodeError, match=r"did not join again within 1.7 s"):
                    await r.dial(c.pid)  # the default bound: idle timeout + 0.2 s
                gate.set()

    runtime.run(main)


def test_sibling_dial_waits_for_a_sibling_that_is_joining_again(runtime: Runtime) -> None:
    """A worker dialling a sibling whose link to their parent was lost: the parent's answer to
    the worker's resolve waits (bounded) for the sibling to be published again, instead of a
    ``NotFound`` at once; a sibling that does not come back is ``NotFound`` after the bound."""

    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r) as a, child(net, r) as b:
            await a.wait_connected()
            await b.wait_connected()
            gate = await lose_parent_link(runtime, r, b)
            assert r.nameserver.rejoining(b.pid)
            async with runtime.background() as tasks:
                tasks.spawn(echo_forever, runtime, b)

                async def rejoin_later() -> None:
                    await runtime.sleep(0.2)
                    gate.set()

                tasks.spawn(rejoin_later)
                async with runtime.bounded(5):
                    assert await round_trip(runtime, a, b.pid, b"sib") == b"bis"
            # Lost again, and this time it stays away: NotFound once the parent's wait ends.
            r.nameserver._rejoin_wait = 0.3
            gate = await lose_parent_link(runtime, r, b)
            with pytest.raises(NodeError, match="NotFound"):
                async with runtime.bounded(5):
                    await a.dial(b.pid, Consistency.REFRESH)
            gate.set()

    runtime.run(main, timeout=30)


def _udp() -> UdpSocket:
    return UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))


def _unix(path: Path) -> UnixDatagramSocket:
    return UnixDatagramSocket.bind(DatagramAddr.parse(f"unix://{path}"))


def test_node_serving_on_unix_while_joined_over_udp_takes_connections_from_everyone(
    runtime: Runtime, tmp_path: Path
) -> None:
    """Issue 5's mixed-carrier bug: B serves its child on Unix (its primary carrier) while it
    reaches its parent A over UDP; C serves on UDP while it reaches B over Unix. Each
    advertises the carrier of its parent link, so every process, the parents included (they
    dial the advertised address directly), gets answers on the path its requests took."""

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
            published = lambda: all(a.nameserver.get(n.pid) for n in nodes[1:])  # noqa: E731
            await directory_until(runtime, a, published)
            a_view = a.nameserver.get(b.pid)
            assert a_view is not None
            assert a_view.locators == (Locator(b.advertised_addr, 0),)
            await echo_between_every_pair(runtime, nodes)

    runtime.run(main, timeout=40)


SESSION_PROTOCOL = LinkProtocolId(b"test.session.v1\0")


def test_link_sessions_run_once_per_link_with_both_sides_and_restart(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()
        contexts: list[LinkContext] = []
        restarted = runtime.event()

        async def handler(context: LinkContext, stream: Any) -> None:
            contexts.append(context)
            if context.side is LinkSide.PARENT:
                await runtime.send(stream, b"ping")
                assert await runtime.receive_exactly(stream, 4) == b"pong"
                if sum(c.side is LinkSide.PARENT for c in contexts) >= 2:
                    restarted.set()
                    await runtime.sleep_forever()  # stay until the link ends
            else:
                assert await runtime.receive_exactly(stream, 4) == b"ping"
                await runtime.send(stream, b"pong")
                await runtime.receive_all(stream)  # until the child ends the session

        r = root(net)
        r.register_link_session(SESSION_PROTOCOL, handler)
        with pytest.raises(ValueError, match="already registered"):
            r.register_link_session(b"chrysalis.ns.v3\0", handler)
        c = child(net, r)
        async with r, c:
            # registered after startup: the session still runs on the existing link
            c.register_link_session(SESSION_PROTOCOL, handler, retry_delay=0.05)
            status = await c.wait_connected()
            assert status is not None
            assert status.link is not None
            async with runtime.bounded(10):
                await restarted.wait()
            # The first session ended normally and was reopened on the same link.
            parent_side = [x for x in contexts if x.side is LinkSide.PARENT]
            child_side = [x for x in contexts if x.side is LinkSide.CHILD]
            assert {x.link for x in parent_side} == {status.link}
            assert {x.peer for x in parent_side} == {r.pid}
            assert {x.peer for x in child_side} == {c.pid}
            assert {x.link for x in child_side} == {status.link}
            assert len(child_side) >= 2
            assert r.link_sessions(SESSION_PROTOCOL).active_links == {status.link}
            assert c.link_sessions(SESSION_PROTOCOL).failure is None

    runtime.run(main)


def test_link_session_refused_by_a_parent_without_the_protocol_is_given_up(
    runtime: Runtime,
) -> None:
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
                await eventually(runtime, lambda: status.link in sessions.refused_links)
                assert ran == []

    runtime.run(main)


def test_link_session_version_mismatch_is_a_clear_error(runtime: Runtime) -> None:
    async def main() -> None:
        net = InprocNetwork()

        async def future_parent(peer: Pid, stream: Any) -> None:
            await runtime.receive_exactly(stream, 16)
            await runtime.send(stream, bytes([2]))  # a parent speaking handshake version 2
            await runtime.receive_all(stream)

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
                await eventually(runtime, lambda: sessions.failure is not None)
                assert isinstance(sessions.failure, LinkSessionVersionError)
                assert "handshake version 2, this node speaks 1" in str(sessions.failure)

    runtime.run(main)
