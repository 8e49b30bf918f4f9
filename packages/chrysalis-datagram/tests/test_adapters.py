"""asyncio and trio adapters over every carrier (no pytest plugins: each test runs its own
event loop with a timeout)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import chrysalis.datagram
from chrysalis.datagram import (
    AsyncDatagramSocket,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramSocketSet,
    DatagramTransmit,
    InprocNetwork,
    SocketClosedError,
    UdpSocket,
    UnixDatagramSocket,
)

Pair = tuple[DatagramSocket, DatagramSocket]
TIMEOUT = 5.0


def _udp(tmp: Path) -> Pair:
    return UdpSocket.bind(("127.0.0.1", 0)), UdpSocket.bind(("127.0.0.1", 0))


def _unix(tmp: Path) -> Pair:
    return UnixDatagramSocket.bind(tmp / "a.sock"), UnixDatagramSocket.bind(tmp / "b.sock")


def _inproc(tmp: Path) -> Pair:
    network = InprocNetwork(queue_capacity=4)
    return network.bind(), network.bind()


def _set(tmp: Path) -> Pair:
    network = InprocNetwork(queue_capacity=4)
    a = DatagramSocketSet(network.bind(), UdpSocket.bind(("127.0.0.1", 0)))
    b = DatagramSocketSet(network.bind(), UdpSocket.bind(("127.0.0.1", 0)))
    return a, b


def _udp_set(tmp: Path) -> Pair:
    # The set's primary is UDP, so sends between the two sets use UDP and receives must be
    # woken by a member's descriptor while the inproc member waits on its waker.
    network = InprocNetwork()
    a = DatagramSocketSet(UdpSocket.bind(("127.0.0.1", 0)), network.bind())
    b = DatagramSocketSet(UdpSocket.bind(("127.0.0.1", 0)), network.bind())
    return a, b


CARRIERS: dict[str, Callable[[Path], Pair]] = {
    "udp": _udp,
    "unixgram": _unix,
    "inproc": _inproc,
    "set-inproc-primary": _set,
    "set-udp-primary": _udp_set,
}


def _close(*socks: DatagramSocket) -> None:
    for sock in socks:
        sock.shutdown()
        assert sock.join(1)


def _run_asyncio(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main(), TIMEOUT)

    asyncio.run(bounded())


@pytest.fixture
def trio() -> ModuleType:
    """The trio module (its tests are skipped when the optional dependency is missing)."""
    module: ModuleType = pytest.importorskip("trio")
    return module


def _run_trio(trio: Any, main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        with trio.fail_after(TIMEOUT):
            await main()

    trio.run(bounded)


def _trio_socket(sock: DatagramSocket) -> Any:
    from chrysalis.datagram import TrioDatagramSocket

    return TrioDatagramSocket(sock)


def test_adapters_are_exported_lazily(trio: ModuleType) -> None:
    from chrysalis.datagram._trio import TrioDatagramSocket

    assert chrysalis.datagram.AsyncDatagramSocket is AsyncDatagramSocket
    assert chrysalis.datagram.TrioDatagramSocket is TrioDatagramSocket
    with pytest.raises(AttributeError):
        _ = chrysalis.datagram.NoSuchName


# -- asyncio ------------------------------------------------------------------------------


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
def test_asyncio_echo_and_many_segments(carrier: str, tmp_path: Path) -> None:
    a, b = CARRIERS[carrier](tmp_path)
    count = 40  # more than the Unix and small inproc queues hold: exercises backpressure

    async def main() -> None:
        client, server = AsyncDatagramSocket(a), AsyncDatagramSocket(b)

        async def echo() -> None:
            for _ in range(count + 1):
                data, source = await server.recv_from()
                await server.send_to(data, source)

        task = asyncio.create_task(echo())
        await client.send_to(b"hello", b.local_addr)
        assert await client.recv_from() == (b"hello", b.local_addr)
        payload = b"".join(i.to_bytes(2, "big") * 50 for i in range(count))
        sender = asyncio.create_task(
            client.send_transmit(DatagramTransmit(b.local_addr, payload, 100))
        )
        echoed = [(await client.recv_from())[0] for _ in range(count)]
        await sender
        assert b"".join(echoed) == payload
        await task

    try:
        _run_asyncio(main)
    finally:
        _close(a, b)


def test_asyncio_recv_drains_a_batch(tmp_path: Path) -> None:
    network = InprocNetwork()
    a, b = network.bind(), network.bind()

    async def main() -> None:
        for i in range(10):
            assert a.try_send_to(bytes([i]), b.local_addr)
        metas: list[DatagramRecvMeta] = []
        buffers = [bytearray(16) for _ in range(40)]
        assert await AsyncDatagramSocket(b).recv(buffers, metas) == 10

    try:
        _run_asyncio(main)
    finally:
        _close(a, b)


@pytest.mark.parametrize("carrier", ["udp", "inproc", "set-udp-primary"])
def test_asyncio_shutdown_from_another_thread_fails_the_waiting_receive(
    carrier: str, tmp_path: Path
) -> None:
    a, b = CARRIERS[carrier](tmp_path)

    async def main() -> None:
        receive = asyncio.create_task(AsyncDatagramSocket(b).recv_from())
        await asyncio.sleep(0.01)
        assert not receive.done()
        threading.Thread(target=b.shutdown).start()
        with pytest.raises(SocketClosedError):
            await receive

    try:
        _run_asyncio(main)
    finally:
        _close(a, b)


def test_asyncio_send_waits_for_queue_space() -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b = network.bind(), network.bind()

    async def main() -> None:
        sender = AsyncDatagramSocket(a)
        await sender.send_to(b"one", b.local_addr)
        blocked = asyncio.create_task(sender.send_to(b"two", b.local_addr))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        assert b.try_recv_from() == (b"one", a.local_addr)
        await blocked
        assert b.try_recv_from() == (b"two", a.local_addr)

    try:
        _run_asyncio(main)
    finally:
        _close(a, b)


def test_asyncio_aclose_shuts_down_and_releases(tmp_path: Path) -> None:
    sock = UnixDatagramSocket.bind(tmp_path / "c.sock")

    async def main() -> None:
        async with AsyncDatagramSocket(sock) as wrapped:
            assert wrapped.local_addr == sock.local_addr
        assert sock.is_shutdown
        with pytest.raises(SocketClosedError):
            await wrapped.wait_readable()

    _run_asyncio(main)
    assert not (tmp_path / "c.sock").exists()


# -- trio ---------------------------------------------------------------------------------


@pytest.mark.parametrize("carrier", sorted(CARRIERS))
def test_trio_echo_and_many_segments(carrier: str, tmp_path: Path, trio: ModuleType) -> None:
    a, b = CARRIERS[carrier](tmp_path)
    count = 40

    async def main() -> None:
        client, server = _trio_socket(a), _trio_socket(b)

        async def echo() -> None:
            for _ in range(count + 1):
                data, source = await server.recv_from()
                await server.send_to(data, source)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo)
            await client.send_to(b"hello", b.local_addr)
            assert await client.recv_from() == (b"hello", b.local_addr)
            payload = b"".join(i.to_bytes(2, "big") * 50 for i in range(count))
            echoed: list[bytes] = []

            async def collect() -> None:
                for _ in range(count):
                    echoed.append((await client.recv_from())[0])

            nursery.start_soon(collect)
            await client.send_transmit(DatagramTransmit(b.local_addr, payload, 100))
        assert b"".join(echoed) == payload

    try:
        _run_trio(trio, main)
    finally:
        _close(a, b)


@pytest.mark.parametrize("carrier", ["udp", "inproc", "set-udp-primary"])
def test_trio_shutdown_from_another_thread_fails_the_waiting_receive(
    carrier: str, tmp_path: Path, trio: ModuleType
) -> None:
    a, b = CARRIERS[carrier](tmp_path)

    async def main() -> None:
        failures: list[BaseException] = []

        async def receive() -> None:
            try:
                await _trio_socket(b).recv_from()
            except SocketClosedError as error:
                failures.append(error)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await trio.sleep(0.01)
            assert not failures
            await trio.to_thread.run_sync(b.shutdown)
        assert len(failures) == 1

    try:
        _run_trio(trio, main)
    finally:
        _close(a, b)


def test_trio_recv_drains_a_batch_and_send_waits_for_space(trio: ModuleType) -> None:
    network = InprocNetwork(queue_capacity=2)
    a, b = network.bind(), network.bind()

    async def main() -> None:
        sender = _trio_socket(a)
        await sender.send_to(b"1", b.local_addr)
        await sender.send_to(b"2", b.local_addr)
        done: list[bool] = []

        async def third() -> None:
            await sender.send_to(b"3", b.local_addr)
            done.append(True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(third)
            await trio.sleep(0.01)
            assert not done
            metas: list[DatagramRecvMeta] = []
            assert await _trio_socket(b).recv([bytearray(4)] * 1, metas) == 1
        assert done == [True]
        metas = []
        buffers = [bytearray(4) for _ in range(8)]
        assert await _trio_socket(b).recv(buffers, metas) == 2

    try:
        _run_trio(trio, main)
    finally:
        _close(a, b)


def test_trio_aclose_notifies_waiters(tmp_path: Path, trio: ModuleType) -> None:
    sock = UdpSocket.bind(("127.0.0.1", 0))

    async def main() -> None:
        wrapped = _trio_socket(sock)
        failures: list[BaseException] = []

        async def receive() -> None:
            try:
                await wrapped.recv_from()
            except SocketClosedError as error:
                failures.append(error)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await trio.sleep(0.01)
            await wrapped.aclose()
        assert len(failures) == 1

    _run_trio(trio, main)
    assert sock.is_shutdown
