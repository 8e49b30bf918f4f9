"""A hung Unix-datagram leaf must not take its parent down (found 2026-12-03 with gdb): a leaf
served over a Unix datagram socket was SIGSTOPped while the root streamed data to it, its
receive queue filled, and the root's QUIC driver queued every datagram, whatever its
destination, behind the leaf's and waited for writability that an unconnected Unix datagram
socket reports all along: the root answered nobody and spun at 100% CPU. Here a ``chrysalis``
process is that leaf; the root, in this process, keeps answering another child while the leaf
is stopped, and holds (not sends, not spins on) the stopped leaf's datagrams."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import sys
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the shared helpers, by name
from node_processes import CLI, start_node, stop_all
from node_runtimes import AsyncioRuntime, Runtime, TrioRuntime, directory_until, eventually
from test_node import echo_forever

from chrysalis.datagram import UnixDatagramSocket
from chrysalis.nameserver import Consistency
from chrysalis.node import JoinSettings, Node
from chrysalis.node._address import JoinToken, parse_join_token
from chrysalis.quic import DevelopmentIdentityProvider

T = TypeVar("T")


async def in_thread(rt: Runtime, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a worker thread, so that this runtime's loop keeps running."""
    if rt.name == "trio":
        import trio

        return await trio.to_thread.run_sync(functools.partial(fn, *args))
    return await asyncio.to_thread(fn, *args)


def fill_queue(path: Path) -> None:
    """Send junk datagrams to the Unix socket at ``path`` until its receive queue is full (a
    stopped reader: the kernel refuses the next one); the reader drops them as not QUIC."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as junk:
        junk.setblocking(False)
        for _ in range(100_000):
            try:
                junk.sendto(b"\x00" * 64, str(path))
            except BlockingIOError:
                return
    raise AssertionError(f"the receive queue of {path} never filled")


async def stream_forever(rt: Runtime, stream: object) -> None:
    chunk = bytes(64 * 1024)
    while True:
        await rt.send(stream, chunk)


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["asyncio", "trio"])
def test_a_stopped_unix_leaf_does_not_stop_its_parent_answering_another_child(
    runtime: str, tmp_path: Path
) -> None:
    if runtime == "trio":
        pytest.importorskip("trio")
    RT: Runtime = TrioRuntime() if runtime == "trio" else AsyncioRuntime()
    provider = DevelopmentIdentityProvider(tmp_path / "ca")
    provider.issue_identity()  # creates the CA the leaf process shares
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp_path / "ca"))
    procs = []
    stopped: list[int] = []

    async def main() -> None:
        carrier = UnixDatagramSocket.bind(tmp_path / "root.sock")
        async with Node(provider.issue_identity(), carrier=carrier) as root:
            token = str(JoinToken(root.local_addr, root.pid))
            # (On a thread: the root, on this loop, must answer the leaf's join meanwhile.)
            leaf, leaf_token = await in_thread(
                RT,
                start_node,
                [*CLI, "join", token, "--listen", f"unix://{tmp_path}/leaf.sock", "--echo"],
                env,
                tmp_path / "leaf.log",
            )
            procs.append(leaf)
            leaf_pid = parse_join_token(leaf_token).authority
            assert leaf_pid is not None
            other = Node(
                provider.issue_identity(),
                carrier=UnixDatagramSocket.bind(tmp_path / "other.sock"),
                parent=JoinSettings(root.local_addr, root.pid, retry_delay=0.05),
            )
            async with other:
                await other.wait_connected()
                await directory_until(
                    RT, root, lambda: root.nameserver.get(leaf_pid) is not None, timeout=15
                )
                async with RT.background() as tasks:
                    tasks.spawn(echo_forever, RT, other)
                    # The root streams to the leaf (the leaf's echo reads it all)...
                    stream = await root.dial(leaf_pid, Consistency.REFRESH)
                    async with RT.bounded(15):
                        for _ in range(16):
                            await RT.send(stream, bytes(64 * 1024))
                    tasks.spawn(stream_forever, RT, stream)
                    # ...and the leaf hangs mid-transfer.
                    os.kill(leaf.pid, signal.SIGSTOP)
                    stopped.append(leaf.pid)
                    # Its receive queue fills: whether the root's own datagrams in flight
                    # would fill it depends on its congestion window at that moment (a loaded
                    # CI run waited 10 s for a hold in vain), so the test fills the rest, and
                    # the root's next datagram to the leaf (data, or a loss probe) is refused.
                    fill_queue(tmp_path / "leaf.sock")
                    endpoint = root.transport.endpoint
                    before = endpoint.driver_statistics()
                    await eventually(
                        RT,
                        lambda: endpoint.driver_statistics().datagrams_held > before.datagrams_held,
                        timeout=10,
                    )
                    # The root still answers its other child, round trip after round trip.
                    for index in range(20):
                        payload = f"round trip {index} while the leaf is stopped".encode() * 50
                        async with RT.bounded(5):
                            reply = await round_trip(root, other, payload)
                        assert reply == payload[::-1]
                    stats = endpoint.driver_statistics()
                    assert stats.held_destinations >= 1
                    assert stats.pending_datagrams > 0
                    assert not stats.socket_failed

    async def round_trip(source: Node, target: Node, payload: bytes) -> bytes:
        stream = await source.dial(target.pid, Consistency.REFRESH)
        await RT.send(stream, payload)
        await RT.send_eof(stream)
        return await RT.receive_all(stream)

    try:
        RT.run(main, timeout=90)
    finally:
        for pid in stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        stop_all(procs)
