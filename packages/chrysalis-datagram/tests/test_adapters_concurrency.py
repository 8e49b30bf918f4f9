"""Several tasks on one socket through the asyncio and trio adapters: concurrent senders all make
progress, concurrent receivers are all served, a cancelled waiter does not strand the others,
sockets that share a descriptor can wait together, and shutdown wakes every waiting task.

Over UDP on loopback a send never blocks (the kernel hands the datagram to the receiver at
once), so the UDP tests make the tasks wait together on readiness instead."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from chrysalis.core import DatagramAddr, Pid
from chrysalis.datagram import (
    AsyncDatagramSocket,
    DatagramSocket,
    DatagramSwitch,
    InprocNetwork,
    Router,
    SocketClosedError,
    UdpSocket,
    UnixDatagramSocket,
)

Pair = tuple[DatagramSocket, DatagramSocket]
TIMEOUT = 5.0
SENDERS = 4
PAYLOAD = b"\x40" + bytes(40)


def _inproc(tmp: Path) -> Pair:
    network = InprocNetwork(queue_capacity=4)
    return network.bind(), network.bind()


def _unix(tmp: Path) -> Pair:
    return UnixDatagramSocket.bind(tmp / "a.sock"), UnixDatagramSocket.bind(tmp / "b.sock")


def _udp(tmp: Path) -> Pair:
    return UdpSocket.bind(("127.0.0.1", 0)), UdpSocket.bind(("127.0.0.1", 0))


BLOCKING: dict[str, Callable[[Path], Pair]] = {"inproc": _inproc, "unixgram": _unix}
RECEIVING: dict[str, Callable[[Path], Pair]] = {"inproc": _inproc, "unixgram": _unix, "udp": _udp}


def _close(*socks: DatagramSocket) -> None:
    for sock in socks:
        sock.shutdown()
        assert sock.join(TIMEOUT)


def _drain(sock: DatagramSocket) -> int:
    count = 0
    while sock.try_recv_from() is not None:
        count += 1
    return count


@pytest.fixture
def trio() -> ModuleType:
    module: ModuleType = pytest.importorskip("trio")
    return module


def _trio_socket(sock: DatagramSocket) -> Any:
    from chrysalis.datagram import TrioDatagramSocket

    return TrioDatagramSocket(sock)


def _run_asyncio(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main(), TIMEOUT)

    asyncio.run(bounded())


def _run_trio(trio: Any, main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        with trio.fail_after(TIMEOUT):
            await main()

    trio.run(bounded)


# -- asyncio ------------------------------------------------------------------------------


@pytest.mark.parametrize("carrier", sorted(BLOCKING))
def test_asyncio_concurrent_senders_all_progress_and_shutdown_wakes_every_one(
    carrier: str, tmp_path: Path
) -> None:
    a, b = BLOCKING[carrier](tmp_path)

    async def main() -> None:
        sender = AsyncDatagramSocket(a)
        sent = [0] * SENDERS

        async def send_forever(index: int) -> None:
            while True:
                await sender.send_to(PAYLOAD, b.local_addr)
                sent[index] += 1

        tasks = [asyncio.create_task(send_forever(i)) for i in range(SENDERS)]
        while min(sent) < 20:  # every sender keeps making progress while b drains
            _drain(b)
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.02)  # b is full again: every sender waits
        assert not any(task.done() for task in tasks)
        await asyncio.get_running_loop().run_in_executor(None, a.shutdown)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(result, SocketClosedError) for result in results), results

    try:
        _run_asyncio(main)
    finally:
        _close(a, b)


@pytest.mark.parametrize("carrier", sorted(RECEIVING))
def test_asyncio_concurrent_receivers_are_all_served_and_all_woken_by_shutdown(
    carrier: str, tmp_path: Path
) -> None:
    a, b = RECEIVING[carrier](tmp_path)

    async def main() -> None:
        receiver = AsyncDatagramSocket(b)
        first = [asyncio.create_task(receiver.recv_from()) for _ in range(SENDERS)]
        await asyncio.sleep(0.01)
        for index in range(SENDERS):
            assert a.try_send_to(bytes([index]), b.local_addr)
        got = await asyncio.gather(*first)
        assert sorted(data for data, _ in got) == [bytes([i]) for i in range(SENDERS)]
        waiting = [asyncio.create_task(receiver.recv_from()) for _ in range(SENDERS)]
        await asyncio.sleep(0.01)
        threading.Thread(target=b.shutdown).start()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(result, SocketClosedError) for result in results), results

    try:
        _run_asyncio(main)
    finally:
        _close(a, b)


@pytest.mark.parametrize("carrier", sorted(RECEIVING))
def test_asyncio_a_cancelled_receiver_does_not_strand_the_others(
    carrier: str, tmp_path: Path
) -> None:
    a, b = RECEIVING[carrier](tmp_path)

    async def main() -> None:
        receiver = AsyncDatagramSocket(b)
        tasks = [asyncio.create_task(receiver.recv_from()) for _ in range(3)]
        await asyncio.sleep(0.01)
        tasks[0].cancel()  # the task that started the wait round
        await asyncio.sleep(0.01)
        for index in range(2):
            assert a.try_send_to(bytes([index]), b.local_addr)
        got = await asyncio.gather(*tasks[1:])
        assert sorted(data for data, _ in got) == [b"\x00", b"\x01"]
        assert tasks[0].cancelled()

    try:
        _run_asyncio(main)
    finally:
        _close(a, b)


def test_asyncio_concurrent_waits_on_one_udp_descriptor_all_return(tmp_path: Path) -> None:
    a, b = _udp(tmp_path)
    other = DatagramAddr.udp("127.0.0.1", 9)

    async def main() -> None:
        sender = AsyncDatagramSocket(a)
        waits = [sender.wait_writable(b.local_addr) for _ in range(SENDERS)]
        waits += [sender.wait_writable(other) for _ in range(SENDERS)]  # same descriptor
        await asyncio.gather(*waits)
        await asyncio.gather(*(sender.send_to(bytes([i]), b.local_addr) for i in range(SENDERS)))

    try:
        _run_asyncio(main)
    finally:
        _close(a, b)


def test_asyncio_switch_bindings_can_wait_on_their_shared_egress_descriptor() -> None:
    carrier = UdpSocket.bind(("127.0.0.1", 0))
    peer = UdpSocket.bind(("127.0.0.1", 0))
    switch = DatagramSwitch(carrier, Router())
    first = switch.bind(Pid(bytes([1]) * 16))
    second = switch.bind(Pid(bytes([2]) * 16))
    assert first.send_readiness_fd(peer.local_addr) == second.send_readiness_fd(peer.local_addr)

    async def main() -> None:
        waits = [
            AsyncDatagramSocket(binding).wait_writable(peer.local_addr)
            for binding in (first, second)
            for _ in range(3)
        ]
        await asyncio.gather(*waits)

    try:
        _run_asyncio(main)
    finally:
        switch.shutdown()
        assert switch.join(TIMEOUT)
        _close(peer)


# -- trio ---------------------------------------------------------------------------------


@pytest.mark.parametrize("carrier", sorted(BLOCKING))
def test_trio_concurrent_senders_all_progress_and_shutdown_wakes_every_one(
    carrier: str, tmp_path: Path, trio: ModuleType
) -> None:
    a, b = BLOCKING[carrier](tmp_path)

    async def main() -> None:
        sender = _trio_socket(a)
        sent = [0] * SENDERS
        closed: list[int] = []

        async def send_forever(index: int) -> None:
            try:
                while True:
                    await sender.send_to(PAYLOAD, b.local_addr)
                    sent[index] += 1
            except SocketClosedError:
                closed.append(index)

        async with trio.open_nursery() as nursery:
            for index in range(SENDERS):
                nursery.start_soon(send_forever, index)
            while min(sent) < 20:
                _drain(b)
                await trio.sleep(0.001)
            await trio.sleep(0.02)
            assert not closed
            await trio.to_thread.run_sync(a.shutdown)
        assert sorted(closed) == list(range(SENDERS))

    try:
        _run_trio(trio, main)
    finally:
        _close(a, b)


@pytest.mark.parametrize("carrier", sorted(RECEIVING))
def test_trio_concurrent_receivers_are_all_served_and_all_woken_by_shutdown(
    carrier: str, tmp_path: Path, trio: ModuleType
) -> None:
    a, b = RECEIVING[carrier](tmp_path)

    async def main() -> None:
        receiver = _trio_socket(b)
        got: list[bytes] = []
        closed: list[int] = []

        async def receive(index: int) -> None:
            try:
                got.append((await receiver.recv_from())[0])
            except SocketClosedError:
                closed.append(index)

        async with trio.open_nursery() as nursery:
            for index in range(SENDERS):
                nursery.start_soon(receive, index)
            await trio.sleep(0.01)
            for index in range(SENDERS):
                assert a.try_send_to(bytes([index]), b.local_addr)
        assert sorted(got) == [bytes([i]) for i in range(SENDERS)]
        async with trio.open_nursery() as nursery:
            for index in range(SENDERS):
                nursery.start_soon(receive, index)
            await trio.sleep(0.01)
            await trio.to_thread.run_sync(b.shutdown)
        assert sorted(closed) == list(range(SENDERS))

    try:
        _run_trio(trio, main)
    finally:
        _close(a, b)


@pytest.mark.parametrize("carrier", sorted(RECEIVING))
def test_trio_a_cancelled_receiver_hands_the_wait_over(
    carrier: str, tmp_path: Path, trio: ModuleType
) -> None:
    a, b = RECEIVING[carrier](tmp_path)

    async def main() -> None:
        receiver = _trio_socket(b)
        got: list[bytes] = []
        first = trio.CancelScope()

        async def receive(scope: Any) -> None:
            with scope:
                got.append((await receiver.recv_from())[0])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive, first)  # starts first: it leads the wait
            await trio.sleep(0.01)
            for _ in range(2):
                nursery.start_soon(receive, trio.CancelScope())
            await trio.sleep(0.01)
            first.cancel()
            await trio.sleep(0.01)
            for index in range(2):
                assert a.try_send_to(bytes([index]), b.local_addr)
        assert sorted(got) == [b"\x00", b"\x01"]

    try:
        _run_trio(trio, main)
    finally:
        _close(a, b)


def test_trio_concurrent_waits_on_one_udp_descriptor_all_return(
    tmp_path: Path, trio: ModuleType
) -> None:
    a, b = _udp(tmp_path)
    other = DatagramAddr.udp("127.0.0.1", 9)

    async def main() -> None:
        sender = _trio_socket(a)
        async with trio.open_nursery() as nursery:
            for destination in (b.local_addr, other):  # one descriptor for both
                for _ in range(SENDERS):
                    nursery.start_soon(sender.wait_writable, destination)
            for index in range(SENDERS):
                nursery.start_soon(sender.send_to, bytes([index]), b.local_addr)

    try:
        _run_trio(trio, main)
    finally:
        _close(a, b)


def test_trio_switch_bindings_can_wait_on_their_shared_egress_descriptor(
    trio: ModuleType,
) -> None:
    carrier = UdpSocket.bind(("127.0.0.1", 0))
    peer = UdpSocket.bind(("127.0.0.1", 0))
    switch = DatagramSwitch(carrier, Router())
    first = switch.bind(Pid(bytes([1]) * 16))
    second = switch.bind(Pid(bytes([2]) * 16))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for binding in (first, second):
                for _ in range(3):
                    nursery.start_soon(_trio_socket(binding).wait_writable, peer.local_addr)

    try:
        _run_trio(trio, main)
    finally:
        switch.shutdown()
        assert switch.join(TIMEOUT)
        _close(peer)
