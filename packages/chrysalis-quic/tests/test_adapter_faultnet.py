"""Both adapters over ``chrysalis.faultnet``: seeded loss, duplication and reordering on
every datagram (handshake included); every byte still arrives exactly once and in order, and
the fault counters prove the faults really happened."""

from __future__ import annotations

import asyncio
import random

import pytest
import trio

from chrysalis.faultnet import FaultPlan, FaultyNetwork
from chrysalis.quic._asyncio import AsyncioStream
from chrysalis.quic._trio import TrioStream
from chrysalis.quic.testing import connected_stream_pair, open_endpoint_pair

PLAN = FaultPlan(seed=20261130, loss=0.04, duplicate=0.02, reorder=0.08, reorder_window=4)
SIZE = 120_000


def _check_faults(net: FaultyNetwork) -> None:
    stats = net.statistics()
    assert stats.dropped_loss > 0
    assert stats.reordered > 0
    assert stats.duplicated > 0


@pytest.mark.parametrize("mode", ["inline", "thread"])
def test_asyncio_streams_survive_loss_and_reordering(mode: str) -> None:
    up = random.Random(1).randbytes(SIZE)
    down = random.Random(2).randbytes(SIZE)

    async def send(stream: AsyncioStream, data: bytes) -> None:
        for start in range(0, len(data), 10_000):
            stream.write(data[start : start + 10_000])
            await stream.drain()
        stream.write_eof()

    async def main() -> None:
        with FaultyNetwork(PLAN) as net:
            async with open_endpoint_pair(network=net, driver=mode) as (first, second):
                opened, accepted = await connected_stream_pair(first, second)
                sending = asyncio.gather(send(opened, up), send(accepted, down))
                got_up, got_down = await asyncio.gather(accepted.read(), opened.read())
                await sending
                assert got_up == up
                assert got_down == down
            _check_faults(net)

    async def bounded() -> None:
        await asyncio.wait_for(main(), 12)

    asyncio.run(bounded())


def test_trio_streams_survive_loss_and_reordering() -> None:
    up = random.Random(3).randbytes(SIZE)
    received = bytearray()

    async def send(stream: TrioStream) -> None:
        view = memoryview(up)
        while view:
            await stream.send_all(view[:7_000])
            view = view[7_000:]
        await stream.send_eof()

    async def main() -> None:
        with FaultyNetwork(PLAN.derive("trio")) as net:
            async with open_endpoint_pair(network=net) as (first, second):
                opened, accepted = await connected_stream_pair(first, second)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send, opened)
                    while chunk := await accepted.receive_some(5000):
                        received.extend(chunk)
            _check_faults(net)

    async def bounded() -> None:
        with trio.fail_after(12):
            await main()

    trio.run(bounded)
    assert bytes(received) == up
