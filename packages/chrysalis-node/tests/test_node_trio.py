"""``Node`` under trio (issue 5 item 2): the essential node cases with trio streams, and mixed
processes where one side runs trio and the other asyncio (the ``chrysalis`` command): each
side joins the other and each dials the other."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

trio = pytest.importorskip("trio")

from chrysalis.core import LinkContext, LinkSide, Pid  # noqa: E402
from chrysalis.datagram import InprocNetwork  # noqa: E402
from chrysalis.nameserver import Consistency, Found, ParentStatusKind, TerminalRejection  # noqa: E402
from chrysalis.node import JoinSettings, Node, NodeError  # noqa: E402
from chrysalis.node._address import parse_join_token  # noqa: E402
from chrysalis.quic import DevelopmentIdentityProvider, LinkProtocolId  # noqa: E402
from chrysalis.quic.testing import issue_identity  # noqa: E402

CLI = [sys.executable, "-m", "chrysalis.node._cli"]


def run(main: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> None:
    async def bounded() -> None:
        with trio.fail_after(timeout):
            await main()

    trio.run(bounded)


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def root(net: InprocNetwork) -> Node:
    return Node(issue_identity(), carrier=net.bind())


def child(net: InprocNetwork, parent: Node, **kw: Any) -> Node:
    settings = JoinSettings(parent.local_addr, parent.pid, retry_delay=0.05)
    return Node(kw.pop("identity", None) or issue_identity(), carrier=net.bind(), parent=settings)


async def receive_all(stream: Any) -> bytes:
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    return data


async def echo_forever(node: Node) -> None:
    async def one(stream: Any) -> None:
        await stream.send_all(await receive_all(stream))
        await stream.send_eof()

    async with trio.open_nursery() as nursery:
        while True:
            _peer, stream = await node.accept()
            nursery.start_soon(one, stream)


async def round_trip(source: Node, target: Pid, payload: bytes) -> bytes:
    stream = await source.dial(target, Consistency.REFRESH)
    await stream.send_all(payload)
    await stream.send_eof()
    return await receive_all(stream)


def test_trio_root_and_child_publish_and_exchange_trio_streams() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r, child(net, r) as c:
            status = await c.wait_connected()
            assert status is not None
            assert status.peer == r.pid
            assert r.router.get(c.pid) is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(echo_forever, c)
                nursery.start_soon(echo_forever, r)
                assert await round_trip(r, c.pid, b"down") == b"down"
                assert await round_trip(c, r.pid, b"up") == b"up"
                nursery.cancel_scope.cancel()
        assert r.transport.is_closed

    run(main)


def test_trio_three_level_tree_resolves_enumerates_and_echoes_every_pair() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with AsyncExitStack() as stack:
            r = await stack.enter_async_context(root(net))
            g = await stack.enter_async_context(child(net, r))
            await g.wait_connected()
            leaf = await stack.enter_async_context(child(net, g))
            await leaf.wait_connected()
            await eventually(lambda: r.nameserver.get(leaf.pid) is not None)
            everyone = await leaf.enumerate(Consistency.REFRESH)
            assert {e.pid for e in everyone} == {r.pid, g.pid, leaf.pid}
            assert isinstance(await leaf.resolve(r.pid, Consistency.REFRESH), Found)
            assert await leaf.expand_pid(r.pid.hex()[:12]) == r.pid
            nodes = [r, g, leaf]
            async with trio.open_nursery() as nursery:
                for node in nodes:
                    nursery.start_soon(echo_forever, node)
                for source in nodes:
                    for target in nodes:
                        if source is not target:
                            payload = f"{source.pid}->{target.pid}".encode()
                            assert await round_trip(source, target.pid, payload) == payload
                nursery.cancel_scope.cancel()
            with pytest.raises(NodeError, match="NotFound"):
                await r.dial(Pid(b"\x42" * 16))

    run(main)


def test_trio_duplicate_pid_is_rejected_and_clean_exits_are_withdrawn() -> None:
    async def main() -> None:
        net = InprocNetwork()
        identity = issue_identity()
        async with root(net) as r:
            async with child(net, r, identity=identity) as first:
                await first.wait_connected()
                async with child(net, r, identity=identity) as twin:
                    with pytest.raises(TerminalRejection, match="already_linked"):
                        await twin.wait_connected()
                    manager = twin.parent_manager
                    assert manager is not None
                    assert manager.status.kind is ParentStatusKind.FAILED
            await eventually(lambda: r.nameserver.get(first.pid) is None)
            assert r.router.get(first.pid) is None

    run(main)


def test_trio_child_discovers_its_parent_and_a_hard_stop_is_fenced() -> None:
    async def main() -> None:
        net = InprocNetwork()
        async with root(net) as r:
            unpinned = JoinSettings(r.local_addr, None, retry_delay=0.05)
            c = Node(issue_identity(), carrier=net.bind(), parent=unpinned)
            async with c:
                status = await c.wait_connected()
                assert status is not None
                assert status.peer == r.pid
                manager = c.parent_manager
                assert manager is not None
                assert manager.pinned == r.pid
                route = r.router.get(c.pid)
                assert route is not None
                assert route.gate is not None
                gate = route.gate
                await c.transport.aclose(abort=True)  # nothing is finished cleanly
                await eventually(lambda: not gate.is_active, timeout=10)
                await eventually(lambda: r.router.get(c.pid) is None)
                assert r.nameserver.get(c.pid) is None

    run(main, timeout=30)


def test_trio_link_sessions_run_on_both_sides_of_a_link() -> None:
    protocol = LinkProtocolId(b"test.session.v1\0")

    async def main() -> None:
        net = InprocNetwork()
        contexts: list[LinkContext] = []
        done = trio.Event()

        async def handler(context: LinkContext, stream: Any) -> None:
            contexts.append(context)
            if context.side is LinkSide.PARENT:
                await stream.send_all(b"ping")
                assert await stream.receive_some(4) == b"pong"
                done.set()
                await trio.sleep_forever()
            assert await stream.receive_some(4) == b"ping"
            await stream.send_all(b"pong")
            await trio.sleep_forever()

        r = root(net)
        r.register_link_session(protocol, handler)
        c = child(net, r)
        async with r, c:
            c.register_link_session(protocol, handler)  # also after startup
            status = await c.wait_connected()
            assert status is not None
            await done.wait()
            assert {(x.side, x.peer, x.link) for x in contexts} == {
                (LinkSide.PARENT, r.pid, status.link),
                (LinkSide.CHILD, c.pid, status.link),
            }

    run(main)


# -- mixed runtimes: trio in this process, asyncio in a ``chrysalis`` process ------------------


def start_cli(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    env = dict(os.environ, CHRYSALIS_DEV_CA_DIR=str(tmp / "ca"))
    proc = subprocess.Popen(
        [*CLI, *args, "--echo", "--timeout", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline().decode().strip() if ready else ""
    if "?authority=" not in line:
        stop(proc)
        pytest.fail(f"the chrysalis process printed no join token: {line!r}")
    return proc, line


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


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
        run(main, timeout=30)
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
                await eventually(lambda: node.nameserver.get(child_pid) is not None, 20)
                assert await round_trip(node, child_pid, b"trio->asyncio") == b"trio->asyncio"
            finally:
                await trio.to_thread.run_sync(stop, proc)
            await eventually(lambda: node.nameserver.get(child_pid) is None, 20)

    run(main, timeout=40)
