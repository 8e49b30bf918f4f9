"""``QuicTransport`` on routed ``DatagramSwitch`` bindings (the node's carrier): application
and link-local traffic share one binding for ``[own PID, PID 0]``, streams between adjacent
processes and, through a forwarding gateway, between processes that never see each other."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from chrysalis.core import Pid
from chrysalis.datagram import DatagramSwitch, InprocNetwork, Route, Router
from chrysalis.quic import Identity
from chrysalis.quic._transport import LinkProtocolId, QuicTransport
from chrysalis.quic.testing import issue_identities

PROTOCOL = LinkProtocolId(b"test.link.proto\0")


def run(main: Callable[[], Awaitable[Any]], timeout: float = 8.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), timeout)

    return asyncio.run(bounded())


class Node:
    """One process: an identity, a switch over an in-process carrier and its router."""

    def __init__(self, identity: Identity, net: InprocNetwork) -> None:
        self.identity = identity
        self.router = Router()
        self.switch = DatagramSwitch.spawn(net.bind(), self.router)

    @property
    def pid(self) -> Pid:
        return self.identity.pid

    def route(self, pid: Pid, via: Node) -> None:
        self.router.insert(pid, Route.permanent(via.switch.carrier.local_addr))


@asynccontextmanager
async def nodes(count: int) -> AsyncIterator[list[tuple[Node, QuicTransport[Any]]]]:
    net = InprocNetwork()
    made = [Node(identity, net) for identity in issue_identities(count)]
    try:
        async with AsyncExitStack() as stack:
            pairs = []
            for node in made:
                binding = node.switch.bind_routed_many([node.pid, Pid.LINK_LOCAL])
                transport = await stack.enter_async_context(
                    QuicTransport.spawn(node.identity, binding)
                )
                pairs.append((node, transport))
            yield pairs
    finally:
        for node in made:  # the switches outlive the transports (close frames still leave)
            node.switch.shutdown()
            assert node.switch.join(5)


def test_adjacent_nodes_share_one_binding_for_application_and_link_local_streams() -> None:
    async def main() -> None:
        async with nodes(2) as [(a, ta), (b, tb)]:
            a.route(b.pid, b)
            b.route(a.pid, a)
            protocol = tb.register_link_protocol(PROTOCOL)
            stream = await ta.dial(b.pid, b.switch.carrier.local_addr)
            stream.write(b"application")
            link = await ta.dial_link_local(b.pid, b.switch.carrier.local_addr, PROTOCOL)
            link.write(b"control")
            peer, app = await tb.accept()
            assert peer == a.pid
            assert await app.readexactly(11) == b"application"
            peer, ctl = await protocol.accept()
            assert peer == a.pid
            assert await ctl.readexactly(7) == b"control"
            assert stream.connection is not link.connection
            assert link.connection.local_pid == Pid.LINK_LOCAL
            # Both connections ran over the one switch binding of each side.
            assert b.switch.statistics().delivered > 0

    run(main)


def test_streams_cross_a_forwarding_gateway_byte_exact() -> None:
    async def main() -> None:
        async with nodes(3) as [(a, ta), (g, _tg), (b, tb)]:
            a.route(b.pid, g)  # A reaches B only through the gateway G
            g.route(b.pid, b)
            g.route(a.pid, a)
            b.route(a.pid, g)
            data = random.Random(11).randbytes(200_000)
            stream = await ta.dial(b.pid, g.switch.carrier.local_addr)
            stream.write(data)
            stream.write_eof()
            peer, accepted = await tb.accept()
            assert peer == a.pid
            assert await accepted.read() == data
            accepted.write(data[::-1])
            accepted.write_eof()
            assert await stream.read() == data[::-1]
            forwarded = g.router.statistics().forwarded
            assert forwarded > 2 * len(data) // 1500  # both directions went through G
            assert ta.statistics().dials == 1

    run(main)
