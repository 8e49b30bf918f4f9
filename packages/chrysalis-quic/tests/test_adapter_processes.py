"""Two processes over real carriers (UDP loopback and Unix datagram sockets), with both
adapters on both ends: the parent dials a child process, several concurrent streams carry
random payloads that must come back byte-exact, and both processes shut down cleanly.

The child is a fresh interpreter (``subprocess``; no fork of the test process and its
threads) that loads its identity from PEM files, prints its address, echoes every stream it
accepts and exits when told to on stdin. Every wait is bounded and the child is killed if
anything goes wrong.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from chrysalis.core import DatagramAddr
from chrysalis.datagram import DatagramSocket, UdpSocket, UnixDatagramSocket
from chrysalis.quic import Identity
from chrysalis.quic._asyncio import AsyncioEndpoint
from chrysalis.quic._trio import TrioEndpoint
from chrysalis.quic.testing import issue_identities

STREAMS = 3
PAYLOAD = 100_000

_CHILD = r"""
import sys
from pathlib import Path

from chrysalis.core import DatagramAddr
from chrysalis.datagram import UdpSocket, UnixDatagramSocket
from chrysalis.quic import Identity

adapter, carrier, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
identity = Identity.from_pem(
    (folder / "chain.pem").read_bytes(),
    (folder / "key.pem").read_bytes(),
    (folder / "roots.pem").read_bytes(),
)
if carrier == "udp":
    sock = UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))
else:
    sock = UnixDatagramSocket.bind_unique(folder)


async def echo(stream):
    while True:
        data = await stream.read(65536)
        if not data:
            break
        stream.write(data)
        await stream.drain()
    stream.write_eof()


if adapter == "asyncio":
    import asyncio

    from chrysalis.quic._asyncio import AsyncioEndpoint

    async def main():
        async with AsyncioEndpoint.spawn_server(identity, sock) as endpoint:
            print(sock.local_addr, flush=True)
            loop = asyncio.get_running_loop()
            stop = loop.run_in_executor(None, sys.stdin.readline)
            tasks = []
            accepting = asyncio.ensure_future(endpoint.accept())
            while True:
                done, _ = await asyncio.wait({stop, accepting}, return_when="FIRST_COMPLETED")
                if accepting in done:
                    _, stream = accepting.result()
                    tasks.append(asyncio.ensure_future(echo(stream)))
                    accepting = asyncio.ensure_future(endpoint.accept())
                if stop in done:
                    accepting.cancel()
                    await asyncio.gather(*tasks)
                    return

    asyncio.run(main())
else:
    import trio

    from chrysalis.quic._trio import TrioEndpoint

    async def trio_echo(stream):
        while data := await stream.receive_some(65536):
            await stream.send_all(data)
        await stream.send_eof()

    async def main():
        async with TrioEndpoint.spawn_server(identity, sock) as endpoint:
            print(sock.local_addr, flush=True)
            async with trio.open_nursery() as nursery:

                async def accept_loop():
                    while True:
                        _, stream = await endpoint.accept()
                        nursery.start_soon(trio_echo, stream)

                nursery.start_soon(accept_loop)
                await trio.to_thread.run_sync(sys.stdin.readline)
                nursery.cancel_scope.cancel()

    trio.run(main)
print("bye", flush=True)
"""


def _write_identity(identity: Identity, folder: Path) -> None:
    (folder / "chain.pem").write_bytes(identity.chain_pem())
    (folder / "key.pem").write_bytes(identity.key_pem())
    (folder / "roots.pem").write_bytes(identity.roots_pem())


def _client_socket(carrier: str, folder: Path) -> DatagramSocket:
    if carrier == "udp":
        return UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))
    return UnixDatagramSocket.bind_unique(folder)


async def _asyncio_client(
    identity: Identity, server: Identity, address: DatagramAddr, sock: DatagramSocket
) -> list[bytes]:
    async with AsyncioEndpoint.spawn_client(identity, sock) as endpoint:
        conn = await endpoint.connect(server.pid, address)

        async def exchange(seed: int) -> bytes:
            data = random.Random(seed).randbytes(PAYLOAD)
            stream = await conn.open_stream()
            writing = asyncio.ensure_future(_asyncio_send(stream, data))
            echoed = await stream.read()
            await writing
            return bytes(echoed)

        return list(await asyncio.gather(*(exchange(seed) for seed in range(STREAMS))))


async def _asyncio_send(stream: Any, data: bytes) -> None:
    for start in range(0, len(data), 20_000):
        stream.write(data[start : start + 20_000])
        await stream.drain()
    stream.write_eof()


async def _trio_client(
    identity: Identity, server: Identity, address: DatagramAddr, sock: DatagramSocket
) -> list[bytes]:
    results: dict[int, bytes] = {}
    async with TrioEndpoint.spawn_client(identity, sock) as endpoint:
        conn = await endpoint.connect(server.pid, address)

        async def exchange(seed: int) -> None:
            data = random.Random(seed).randbytes(PAYLOAD)
            stream = await conn.open_stream()

            async def send() -> None:
                for start in range(0, len(data), 20_000):
                    await stream.send_all(data[start : start + 20_000])
                await stream.send_eof()

            chunks = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                while chunk := await stream.receive_some(65536):
                    chunks.append(chunk)
            results[seed] = b"".join(chunks)

        async with trio.open_nursery() as nursery:
            for seed in range(STREAMS):
                nursery.start_soon(exchange, seed)
    return [results[seed] for seed in range(STREAMS)]


@pytest.mark.parametrize(
    ("carrier", "client_adapter", "server_adapter"),
    [
        ("udp", "asyncio", "asyncio"),
        ("udp", "trio", "trio"),
        ("unixgram", "asyncio", "trio"),
        ("unixgram", "trio", "asyncio"),
    ],
)
def test_streams_between_two_processes_arrive_byte_exact(
    tmp_path: Path, carrier: str, client_adapter: str, server_adapter: str
) -> None:
    client_id, server_id = issue_identities(2)
    _write_identity(server_id, tmp_path)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, server_adapter, carrier, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        line = child.stdout.readline().decode().strip()
        assert line, child.stderr.read().decode()[-3000:] if child.stderr else "no address"
        address = DatagramAddr.parse(line)
        sock = _client_socket(carrier, tmp_path)
        if client_adapter == "asyncio":

            async def bounded() -> list[bytes]:
                return await asyncio.wait_for(
                    _asyncio_client(client_id, server_id, address, sock), 15
                )

            echoed = asyncio.run(bounded())
        else:

            async def bounded_trio() -> list[bytes]:
                with trio.fail_after(15):
                    return await _trio_client(client_id, server_id, address, sock)

            echoed = trio.run(bounded_trio)
        expected = [random.Random(seed).randbytes(PAYLOAD) for seed in range(STREAMS)]
        assert echoed == expected
        child.stdin.write(b"stop\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=10)
        assert child.returncode == 0, err.decode()[-3000:]
        assert b"bye" in out
        assert sock.is_shutdown
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
