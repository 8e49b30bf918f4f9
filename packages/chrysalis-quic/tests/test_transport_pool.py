"""``QuicTransport`` application streams: one pooled connection per peer PID, shared
handshakes for concurrent dials, adoption of peer-dialled connections, re-dial after a
connection is lost, authenticated accept, under asyncio and trio."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from chrysalis.core import Pid
from chrysalis.datagram import InprocNetwork
from chrysalis.quic._errors import EndpointClosedError, PeerAuthenticationError
from chrysalis.quic._transport import QuicTransport
from chrysalis.quic.testing import issue_identities, open_transport_pair


def run(main: Callable[[], Awaitable[Any]], timeout: float = 8.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), timeout)

    return asyncio.run(bounded())


def run_trio(main: Callable[[], Awaitable[Any]], timeout: float = 8.0) -> Any:
    async def bounded() -> Any:
        with trio.fail_after(timeout):
            return await main()

    return trio.run(bounded)


def test_dials_share_one_pooled_connection_per_peer() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            streams = await asyncio.gather(
                *(first.dial(second.pid, second.local_addr) for _ in range(5))
            )
            stats = first.statistics()
            assert stats.dials == 1  # five concurrent dials, one handshake
            assert stats.pooled == 1
            assert len({stream.connection for stream in streams}) == 1
            for index, stream in enumerate(streams):
                stream.write(bytes([index]) * 3)
            seen = set()
            for _ in streams:
                peer, accepted = await second.accept()
                assert peer == first.pid
                seen.add(await accepted.readexactly(3))
            assert seen == {bytes([i]) * 3 for i in range(5)}
            again = await first.dial(second.pid, second.local_addr)
            assert again.connection is streams[0].connection
            assert first.statistics().dials == 1

    run(main)


def test_a_peer_dialled_connection_is_adopted_for_the_reverse_direction() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            stream = await first.dial(second.pid, second.local_addr)
            stream.write(b"hi")
            _, accepted = await second.accept()
            assert await accepted.readexactly(2) == b"hi"
            back = await second.dial(first.pid, first.local_addr)
            back.write(b"back")
            peer, incoming = await first.accept()
            assert peer == second.pid
            assert await incoming.readexactly(4) == b"back"
            assert second.statistics().dials == 0
            assert second.statistics().adopted == 1
            assert back.connection is accepted.connection

    run(main)


def test_a_lost_connection_leaves_the_pool_and_the_next_dial_reconnects() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            stream = await first.dial(second.pid, second.local_addr)
            stream.connection.close(3)
            await stream.connection.wait_closed()
            assert first.pooled_peers() == []
            fresh = await first.dial(second.pid, second.local_addr)
            assert fresh.connection is not stream.connection
            fresh.write(b"new")
            _, accepted = await second.accept()
            assert await accepted.readexactly(3) == b"new"
            assert first.statistics().dials == 2

    run(main)


def test_dialling_the_wrong_pid_fails_and_pools_nothing() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            wrong = Pid(bytes([7]) * 16)
            with pytest.raises(PeerAuthenticationError) as caught:
                await first.dial(wrong, second.local_addr)
            # The packets reached ``second`` only because the route was the wrong PID and
            # the in-process endpoint accepts any prefix; its certificate gave it away.
            assert caught.value.actual == second.pid
            assert first.pooled_peers() == []
            with pytest.raises(ValueError, match="link-local"):
                await first.dial(Pid.LINK_LOCAL, second.local_addr)

    run(main)


def test_transport_under_trio_dials_accepts_and_closes() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            stream = await first.dial(second.pid, second.local_addr)
            await stream.send_all(b"trio ping")
            peer, accepted = await second.accept()
            assert peer == first.pid
            assert await accepted.receive_some(100) == b"trio ping"
            await accepted.send_all(b"pong")
            await accepted.send_eof()
            assert await stream.receive_some(100) == b"pong"
            assert await stream.receive_some(100) == b""
        assert first.is_closed
        assert second.is_closed
        with pytest.raises(EndpointClosedError):
            await first.dial(second.pid, second.local_addr)

    run_trio(main)


def test_spawn_and_explicit_close_end_every_task() -> None:
    async def main() -> None:
        first_id, second_id = issue_identities(2)
        net = InprocNetwork()
        async with QuicTransport.spawn(second_id, net.bind()) as second:
            before = set(asyncio.all_tasks())
            first = await QuicTransport.spawn(first_id, net.bind()).__aenter__()
            assert set(asyncio.all_tasks()) > before  # its driver and link acceptor
            stream = await first.dial(second.pid, second.local_addr)
            stream.write(b"x")
            await first.aclose()
            assert first.is_closed
            with pytest.raises(EndpointClosedError):
                await first.accept()
            assert set(asyncio.all_tasks()) <= before  # none of them outlived it

    run(main)
