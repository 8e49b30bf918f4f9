"""``AsyncioEndpoint.spawn`` and ``TrioEndpoint.spawn``: one constructor taking the role (and a
route), of which ``spawn_client``/``spawn_server``/``spawn_duplex``/``spawn_duplex_routed`` are
thin wrappers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chrysalis.core import Pid
from chrysalis.datagram import InprocNetwork
from chrysalis.quic import AsyncioEndpoint, EndpointRole, TrioEndpoint
from chrysalis.quic.testing import issue_identities

ROUTE = Pid(bytes([7]) * 16)


async def _exercise(adapter: Any) -> None:
    client_id, server_id, routed_id = issue_identities(3)
    net = InprocNetwork()
    async with (
        adapter.spawn(client_id, net.bind(), role=EndpointRole.CLIENT, driver="inline") as client,
        adapter.spawn(server_id, net.bind(), role=EndpointRole.SERVER) as server,
        adapter.spawn(routed_id, net.bind(), role=EndpointRole.DUPLEX, route=ROUTE) as routed,
        adapter.spawn_duplex_routed(routed_id, net.bind(), routing_pid=ROUTE) as wrapped,
    ):
        assert client.pid == client_id.pid
        assert client.routing_pid == client_id.pid
        assert client.driver_mode == "inline"
        assert routed.routing_pid == ROUTE
        assert wrapped.routing_pid == ROUTE
        conn = await client.connect(server_id.pid, server.local_addr)
        assert conn.peer == server_id.pid
        dialled = await routed.connect(server_id.pid, server.local_addr)
        assert dialled.peer == server_id.pid


def test_asyncio_spawn_takes_the_role_and_route() -> None:
    async def main() -> None:
        async with asyncio.timeout(10):
            await _exercise(AsyncioEndpoint)

    asyncio.run(main())


def test_trio_spawn_takes_the_role_and_route() -> None:
    trio = pytest.importorskip("trio")

    async def main() -> None:
        with trio.fail_after(10):
            await _exercise(TrioEndpoint)

    trio.run(main)


def test_spawn_rejects_an_unknown_driver() -> None:
    (identity,) = issue_identities(1)
    with pytest.raises(ValueError, match="driver must be one of"):
        AsyncioEndpoint.spawn(
            identity, InprocNetwork().bind(), role=EndpointRole.DUPLEX, driver="x"
        )
