"""The link-local mux of ``QuicTransport``: streams to PID 0 start with a 16-byte protocol id,
the acceptor dispatches them to bounded per-protocol queues or handlers, and anything it
cannot deliver closes only that stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from chrysalis.core import Pid
from chrysalis.datagram import InprocNetwork
from chrysalis.quic._asyncio import AsyncioStream
from chrysalis.quic._errors import StreamBrokenError
from chrysalis.quic._transport import (
    DuplicateProtocolError,
    LinkProtocolId,
    QuicTransport,
)
from chrysalis.quic.testing import issue_identities, open_transport_pair

NAMESERVER = LinkProtocolId(b"chrysalis.ns.v2\0")
REPLICATION = LinkProtocolId(b"chrysalis.crr.v4")


def run(main: Callable[[], Awaitable[Any]], timeout: float = 8.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), timeout)

    return asyncio.run(bounded())


async def write_until_broken(stream: AsyncioStream) -> None:
    for _ in range(200):
        stream.write(b"more")
        await stream.drain()
        await asyncio.sleep(0.005)
    raise AssertionError("the stream never broke")


def test_protocol_id_repr_is_stable_hex_and_ids_are_values() -> None:
    assert repr(NAMESERVER) == "LinkProtocolId(6368727973616c69732e6e732e763200)"
    assert NAMESERVER.hex() == "6368727973616c69732e6e732e763200"
    assert LinkProtocolId.from_hex(NAMESERVER.hex().upper()) == NAMESERVER
    assert hash(LinkProtocolId(bytes(NAMESERVER))) == hash(NAMESERVER)
    assert NAMESERVER != REPLICATION
    with pytest.raises(ValueError, match="16 bytes"):
        LinkProtocolId(b"short")
    with pytest.raises(AttributeError):
        NAMESERVER._raw = b"x" * 16


def test_link_streams_reach_their_protocol_with_the_peer_pid() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            names = second.register_link_protocol(NAMESERVER)
            replication = second.register_link_protocol(REPLICATION)
            ns_stream = await first.dial_link_local(second.pid, second.local_addr, NAMESERVER)
            ns_stream.write(b"resolve")
            crr_stream = await first.dial_link_local(second.pid, second.local_addr, REPLICATION)
            crr_stream.write(b"changes")
            peer, got = await names.accept()
            assert peer == first.pid
            assert await got.readexactly(7) == b"resolve"
            peer, got = await replication.accept()
            assert peer == first.pid
            assert await got.readexactly(7) == b"changes"
            # Link-local streams never show up as application streams, and they use the
            # link-local pool (a connection terminating at PID 0), not the application one.
            assert ns_stream.connection.local_pid == Pid.LINK_LOCAL
            assert first.statistics().link_pooled == 1
            assert first.statistics().pooled == 0
            assert ns_stream.connection is crr_stream.connection
            assert len(second.endpoint.core.accepts.items) == 0

    run(main)


def test_pooled_dial_opens_streams_on_the_link_connection_both_ways_without_dialling() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            with pytest.raises(ValueError, match="process PID"):
                await first.dial_link_pooled(Pid.LINK_LOCAL, NAMESERVER)
            assert await first.dial_link_pooled(second.pid, NAMESERVER) is None  # no link yet
            assert first.statistics().dials == 0
            names = second.register_link_protocol(NAMESERVER)
            back = first.register_link_protocol(NAMESERVER)
            stream = await first.dial_link_local(second.pid, second.local_addr, NAMESERVER)
            stream.write(b"join")
            peer, _ = await names.accept()
            assert peer == first.pid
            # The acceptor opens its own stream on the connection the peer dialled.
            reverse = await second.dial_link_pooled(first.pid, NAMESERVER)
            assert reverse is not None
            reverse.write(b"reply")
            peer, got = await back.accept()
            assert peer == second.pid
            assert await got.readexactly(5) == b"reply"
            again = await first.dial_link_pooled(second.pid, NAMESERVER)
            assert again is not None
            assert again.connection is stream.connection
            assert (first.statistics().dials, second.statistics().dials) == (1, 0)

    run(main)


def test_unknown_selector_finishes_only_that_stream() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            names = second.register_link_protocol(NAMESERVER)
            unknown = await first.dial_link_local(
                second.pid, second.local_addr, b"no such proto!!!"
            )
            unknown.write(b"hello?")
            assert await unknown.read(100) == b""  # FIN from the mux
            with pytest.raises(StreamBrokenError):
                await write_until_broken(unknown)
            # The connection and the other protocols are unaffected.
            good = await first.dial_link_local(second.pid, second.local_addr, NAMESERVER)
            assert good.connection is unknown.connection
            good.write(b"still fine")
            _, accepted = await names.accept()
            assert await accepted.readexactly(10) == b"still fine"
            assert second.statistics().link_rejected == 1

    run(main)


def test_a_full_protocol_queue_rejects_new_streams() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            names = second.register_link_protocol(NAMESERVER, queue_capacity=2)
            streams = []
            for index in range(4):
                stream = await first.dial_link_local(second.pid, second.local_addr, NAMESERVER)
                stream.write(bytes([index]))
                streams.append(stream)
            results = await asyncio.gather(*(s.read(10) for s in streams[2:]))
            assert results == [b"", b""]  # rejected: FIN without data
            assert len(names) == 2
            for index in range(2):
                _, accepted = await names.accept()
                assert await accepted.readexactly(1) == bytes([index])
            assert second.statistics().link_rejected == 2

    run(main)


def test_a_stream_that_never_sends_its_selector_times_out() -> None:
    async def main() -> None:
        first_id, second_id = issue_identities(2)
        net = InprocNetwork()
        async with (
            QuicTransport.spawn(first_id, net.bind()) as first,
            QuicTransport.spawn(second_id, net.bind(), classify_timeout=0.2) as second,
        ):
            names = second.register_link_protocol(NAMESERVER)
            endpoint: Any = first.endpoint
            conn = await endpoint.connect(
                second.pid, second.local_addr, route=Pid.LINK_LOCAL, source=Pid.LINK_LOCAL
            )
            silent = await conn.open_stream()
            silent.write(b"abc")  # three bytes of a selector, then nothing
            assert await silent.read(10) == b""
            assert len(names) == 0
            assert second.statistics().link_rejected == 1

    run(main)


def test_handlers_serve_streams_and_errors_abort_only_their_stream() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            served: list[Pid] = []

            async def echo(peer: Pid, stream: AsyncioStream) -> None:
                served.append(peer)
                data = await stream.readexactly(4)
                if data == b"boom":
                    raise RuntimeError("handler failure")
                stream.write(data[::-1])
                await stream.drain()

            second.register_link_protocol(NAMESERVER, echo, max_handlers=2)
            with pytest.raises(DuplicateProtocolError):
                second.register_link_protocol(NAMESERVER)
            streams = []
            for word in (b"abcd", b"boom", b"wxyz"):
                stream = await first.dial_link_local(second.pid, second.local_addr, NAMESERVER)
                stream.write(word)
                streams.append(stream)
            assert await streams[0].read() == b"dcba"
            with pytest.raises(ConnectionResetError):
                await streams[1].read()
            assert await streams[2].read() == b"zyxw"
            assert served == [first.pid] * 3

    run(main)


def test_unpinned_dial_discovers_and_pools_the_peer() -> None:
    async def main() -> None:
        async with open_transport_pair() as (first, second):
            names = second.register_link_protocol(NAMESERVER)
            peer, stream = await first.dial_link_local_unpinned(second.local_addr, NAMESERVER)
            assert peer == second.pid
            stream.write(b"who")
            who, accepted = await names.accept()
            assert who == first.pid
            assert await accepted.readexactly(3) == b"who"
            again = await first.dial_link_local(second.pid, second.local_addr, NAMESERVER)
            assert again.connection is stream.connection

    run(main)


def test_a_dedicated_link_local_transport_under_trio() -> None:
    async def main() -> None:
        first_id, second_id = issue_identities(2)
        net = InprocNetwork()
        async with (
            QuicTransport.spawn(first_id, net.bind(), link_local=True) as first,
            QuicTransport.spawn(second_id, net.bind()) as second,
        ):
            assert first.is_link_local
            names = second.register_link_protocol(NAMESERVER)
            # On a link-local transport even ``dial`` terminates at the peer's PID 0.
            stream = await first.dial_link_local(second.pid, second.local_addr, NAMESERVER)
            await stream.send_all(b"trio link")
            peer, accepted = await names.accept()
            assert peer == first.pid
            assert await accepted.receive_some(100) == b"trio link"
            plain = await first.dial(second.pid, second.local_addr)
            assert plain.connection.local_pid == Pid.LINK_LOCAL

    async def bounded() -> None:
        with trio.fail_after(8):
            await main()

    trio.run(bounded)
