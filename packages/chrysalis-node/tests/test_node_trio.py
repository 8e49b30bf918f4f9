"""``Node`` under trio across processes (issue 5 item 2): mixed processes where one side runs
trio and the other asyncio (the ``chrysalis`` command); each side joins the other and each dials
the other. The in-process node scenarios run under trio too, in ``test_node.py`` (every
scenario there is parametrised by the runtime)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

trio = pytest.importorskip("trio")

sys.path.insert(0, str(Path(__file__).parent))  # the shared runtime helper, by name
from node_processes import CLI, start_node, stop_all  # noqa: E402
from node_runtimes import TrioRuntime, directory_until  # noqa: E402

from chrysalis.core import Pid  # noqa: E402
from chrysalis.nameserver import Consistency  # noqa: E402
from chrysalis.node import JoinSettings, Node  # noqa: E402
from chrysalis.node._address import parse_join_token  # noqa: E402
from chrysalis.quic import DevelopmentIdentityProvider  # noqa: E402

RT = TrioRuntime()


async def echo_forever(node: Node) -> None:
    """Answer every stream opened to ``node`` with its own bytes (what ``chrysalis ping``
    expects), each stream in its own task."""

    async def one(stream: Any) -> None:
        await RT.send(stream, await RT.receive_all(stream))
        await RT.send_eof(stream)

    async with trio.open_nursery() as nursery:
        while True:
            _peer, stream = await node.accept()
            nursery.start_soon(one, stream)


async def round_trip(source: Node, target: Pid, payload: bytes) -> bytes:
    stream = await source.dial(target, Consistency.REFRESH)
    await RT.send(stream, payload)
    await RT.send_eof(stream)
    return await RT.receive_all(stream)


# -- mixed runtimes: trio in this process, asyncio in a ``chrysalis`` process ------------------


def start_cli(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp / "ca"))
    return start_node([*CLI, *args, "--echo", "--timeout", "20"], env)


def stop(proc: subprocess.Popen[bytes]) -> None:
    stop_all([proc])


@pytest.mark.slow
def test_trio_child_joins_an_asyncio_root_process_and_both_echo(tmp_path: Path) -> None:
    provider = DevelopmentIdentityProvider(tmp_path / "ca")
    provider.issue_identity()  # creates the CA the process below shares
    proc, token = start_cli(tmp_path, "serve", "--listen", "udp://127.0.0.1:0")
    join = parse_join_token(token)

    async def main() -> None:
        settings = JoinSettings(join.address, join.authority, retry_delay=0.1)
        async with Node(provider.issue_identity(), parent=settings) as node:
            status = await node.wait_connected()
            assert status is not None
            assert status.peer == join.authority
            assert join.authority is not None
            assert await round_trip(node, join.authority, b"trio->asyncio") == b"trio->asyncio"
            entries = await node.enumerate(Consistency.REFRESH)
            assert {join.authority, node.pid} <= {e.pid for e in entries}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(echo_forever, node)
                # An asyncio client process joins the root and dials this trio node.
                ping = await trio.to_thread.run_sync(
                    lambda: subprocess.run(
                        [*CLI, "ping", token, node.pid.hex(), "--json", "--timeout", "15"],
                        capture_output=True,
                        env=dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp_path / "ca")),
                        timeout=30,
                        check=False,
                    )
                )
                nursery.cancel_scope.cancel()
            assert ping.returncode == 0, ping.stderr.decode()[-500:]
            assert json.loads(ping.stdout)[node.pid.hex()]["ok"] is True

    try:
        RT.run(main, timeout=30)
    finally:
        stop(proc)


@pytest.mark.slow
def test_asyncio_child_process_joins_a_trio_root_and_answers_it(tmp_path: Path) -> None:
    provider = DevelopmentIdentityProvider(tmp_path / "ca")

    async def main() -> None:
        async with Node(provider.issue_identity(), listen="udp://127.0.0.1:0") as node:
            proc, token = await trio.to_thread.run_sync(
                start_cli, tmp_path, "join", node.join_token
            )
            try:
                child_pid = Pid.parse(token.rsplit("=", 1)[1])
                published = lambda: node.nameserver.get(child_pid) is not None  # noqa: E731
                await directory_until(RT, node, published, 20)
                assert await round_trip(node, child_pid, b"trio->asyncio") == b"trio->asyncio"
            finally:
                await trio.to_thread.run_sync(stop, proc)
            await directory_until(RT, node, lambda: node.nameserver.get(child_pid) is None, 20)

    RT.run(main, timeout=40)
