"""The receive lane, from a datagram to the woken reader, on its short paths.

What the short paths rely on, pinned here so that a broken one fails:

- ``QuicEndpoint._on_stream_data`` fills the first posted receive from the arriving event in
  one call of the completion model (``CompletionSender.deliver_nowait``) only when the
  general path would complete it the same way: not cancelled, the bytes fit and reach
  ``min_bytes``, nothing buffered or staged before them. The receives complete in order with
  the bytes in order, and every credit and posted byte comes back (with and without locks).
- A completion that finds the completion queue full is staged behind nothing and delivered
  in order once the application consumes.
- ``EndpointCore.dispatch_ready`` releases a batch's leases before any of its handlers run:
  a reader woken by its receive finds the posted bytes back.
- ``StreamCore.read_exactly`` takes a chunk that is exactly the answer whole; every other
  split of the bytes takes the general path with the same result.
- The adapter's event hands its waiter's future out: a read cancelled by a timeout leaves a
  cancelled future that the next data skips, and the next read gets the bytes.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).parent))

import pytest
import test_endpoint_harness as harness
from test_endpoint_harness import Net, Node

from chrysalis.core.completion import (
    CompletionSender,
    ConnectionRef,
    EndpointChannels,
    ReceiveCompletion,
    ReceiveStatus,
    StreamRef,
)
from chrysalis.quic._asyncio import AsyncioStream
from chrysalis.quic._endpoint import EndpointRole
from chrysalis.quic._stream_core import StreamCore
from chrysalis.quic.testing import open_stream_pair

MODES = ["inline", "thread"]


class _SingleThreaded:
    """Stands in for ``EndpointChannels`` in the harness: the same channels, lock-free."""

    def __class_getitem__(cls, item: Any) -> Callable[..., Any]:
        return functools.partial(EndpointChannels[item], threadsafe=False)


@pytest.fixture(params=[True, False], ids=["threadsafe", "single"])
def threadsafe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if not request.param:
        monkeypatch.setattr(harness, "EndpointChannels", _SingleThreaded)
    return bool(request.param)


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every answer of ``deliver_nowait`` (True: the receive was completed directly)."""
    answers: list[bool] = []
    original = CompletionSender.deliver_nowait

    def spy(self: CompletionSender, submission: Any, data: bytes) -> bool:
        answer = original(self, submission, data)
        answers.append(answer)
        return answer

    monkeypatch.setattr(CompletionSender, "deliver_nowait", spy)
    return answers


def _connected(
    *, completion_queue_capacity: int | None = None
) -> tuple[Net, Node, Node, StreamRef, StreamRef]:
    """A client and a server with one stream, the server's end accepted and announced."""
    net = Net()
    client = net.add("client", role=EndpointRole.CLIENT)
    server = net.add(
        "server", role=EndpointRole.SERVER, completion_queue_capacity=completion_queue_capacity
    )
    conn = client.connect(server)
    stream = client.open(conn)
    client.wait_op(client.send(stream, b"!"))  # announces the stream to the server
    incoming = server.incoming()
    first = server.wait_op(server.receive(incoming, 1))
    assert isinstance(first, ReceiveCompletion)
    assert first.status is ReceiveStatus.DATA
    return net, client, server, stream, incoming


def _settled(node: Node, connection: ConnectionRef) -> None:
    """Every credit and posted byte of the node's stream operations came back."""
    assert node.channels.credits.in_use == 0
    assert node.channels.submissions.posted_budget.used == 0
    conn = node.endpoint._conns[connection]
    assert conn.buffered == 0


def test_posted_receives_complete_directly_in_order(threadsafe: bool, direct: list[bool]) -> None:
    net, client, server, stream, incoming = _connected()
    messages = [bytes([65 + index]) * (1 + index * 5) for index in range(6)]
    posted = [server.receive(incoming, 64) for _ in range(3)]
    received: list[bytes] = []
    for index, message in enumerate(messages):
        client.send(stream, message)
        if index + 3 < len(messages):
            posted.append(server.receive(incoming, 64))
        completion = server.wait_op(posted[index])
        assert isinstance(completion, ReceiveCompletion)
        assert completion.status is ReceiveStatus.DATA
        received.append(bytes(completion.data()))
    assert received == messages
    assert direct.count(True) == len(messages)  # each one filled from its event
    done = [server.op(receipt) for receipt in posted]
    assert [c.operation for c in done if c is not None] == [r.operation for r in posted]
    net.run_for(0.1)
    _settled(server, incoming.connection)


def test_receives_the_bytes_do_not_satisfy_take_the_general_path(
    threadsafe: bool, direct: list[bool]
) -> None:
    net, client, server, stream, incoming = _connected()
    # Larger than the posted buffer: declined, buffered, split over two receives.
    small = server.receive(incoming, 4)
    client.send(stream, b"abcdefgh")
    first = server.wait_op(small)
    assert isinstance(first, ReceiveCompletion)
    assert bytes(first.data()) == b"abcd"
    rest = server.wait_op(server.receive(incoming, 16))
    assert isinstance(rest, ReceiveCompletion)
    assert bytes(rest.data()) == b"efgh"
    # Short of ``min_bytes``: declined, the receive completes when enough arrived.
    patient = server.receive(incoming, 16, min_bytes=6)
    client.send(stream, b"123")
    net.run_for(0.05)
    assert server.op(patient) is None
    client.send(stream, b"456")
    whole = server.wait_op(patient)
    assert isinstance(whole, ReceiveCompletion)
    assert bytes(whole.data()) == b"123456"
    assert True not in direct[: direct.index(False) + 1]
    assert direct.count(False) >= 2
    net.run_for(0.1)
    _settled(server, incoming.connection)


def test_a_cancelled_receive_is_not_filled_from_the_event(
    threadsafe: bool, direct: list[bool]
) -> None:
    net, client, server, stream, incoming = _connected()
    receipt = server.receive(incoming, 16)
    net.run_for(0.01)  # the endpoint admitted it
    held: list[bytes] = []

    def hold(source: object, destination: object, data: bytes) -> bool:
        if destination == server.addr:
            held.append(data)  # delivered by hand below
            return False
        return True

    net.filters.append(hold)
    client.send(stream, b"late bytes")
    net.run_until(lambda: bool(held))
    net.filters.clear()
    assert receipt.cancellation is not None
    assert receipt.cancellation.cancel()
    for data in held:  # arrives before the endpoint saw the cancellation
        server.endpoint.receive_datagram(data, client.addr, net.now)
    assert False in direct
    assert True not in direct
    cancelled = server.wait_op(receipt)
    assert isinstance(cancelled, ReceiveCompletion)
    assert cancelled.status is ReceiveStatus.CANCELLED
    assert not cancelled.buffer
    after = server.wait_op(server.receive(incoming, 16))
    assert isinstance(after, ReceiveCompletion)
    assert bytes(after.data()) == b"late bytes"
    net.run_for(0.1)
    _settled(server, incoming.connection)


def test_a_full_completion_queue_stages_direct_completions_in_order(
    threadsafe: bool, direct: list[bool]
) -> None:
    net, client, server, stream, incoming = _connected(completion_queue_capacity=2)
    server.auto_drain = False  # the application stops consuming
    posted = [server.receive(incoming, 8) for _ in range(5)]
    net.run_for(0.01)
    for index in range(5):
        client.send(stream, bytes([48 + index]) * 3)
        net.run_for(0.01)
    assert len(server.channels.completions) == 2  # the rest waits in the endpoint
    assert server.endpoint.statistics().staged_completions == 3
    assert True in direct
    for _ in range(50):  # the application consumes; the endpoint flushes what it staged
        server.drain()
        net.run_for(0.01)
    server.drain()
    done = server.of_type(ReceiveCompletion)[1:]  # after the stream's first byte
    assert [c.operation for c in done] == [r.operation for r in posted]
    assert [bytes(c.data()) for c in done] == [bytes([48 + i]) * 3 for i in range(5)]
    net.run_for(0.1)
    server.drain()
    _settled(server, incoming.connection)


def run(main: Callable[[], Awaitable[Any]], timeout: float = 8.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), timeout)

    return asyncio.run(bounded())


@pytest.fixture
def handler_view(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(status, posted bytes still reserved on its endpoint) at every ``on_receive``."""
    seen: list[tuple[str, int]] = []
    original = StreamCore.on_receive

    def spy(self: StreamCore, completion: ReceiveCompletion) -> None:
        seen.append((completion.status.value, self.core.channels.submissions.posted_budget.used))
        original(self, completion)

    monkeypatch.setattr(StreamCore, "on_receive", spy)
    return seen


@pytest.mark.parametrize("mode", MODES)
def test_readers_woken_by_their_receive_find_its_lease_released(
    mode: str, handler_view: list[tuple[str, int]]
) -> None:
    async def main() -> None:
        async with open_stream_pair(driver=mode) as (opened, accepted):
            for index in range(30):
                message = bytes([index]) * 16
                opened.write(message)
                assert await accepted.readexactly(16) == message
                accepted.write(message[::-1])
                assert await opened.readexactly(16) == message[::-1]

    run(main)
    data = [used for status, used in handler_view if status == "data"]
    assert len(data) >= 60
    # One stream per endpoint: its one posted receive is the one completing, so its
    # reservation must already be back when the handler runs.
    assert set(data) == {0}


@pytest.mark.parametrize("mode", MODES)
def test_readexactly_over_every_split_of_the_bytes(mode: str) -> None:
    async def main() -> None:
        async with open_stream_pair(driver=mode) as (opened, accepted):
            assert isinstance(opened, AsyncioStream)
            # Exactly one chunk per read (the short path), then two messages that may
            # arrive in one chunk, then one message in two halves written apart.
            for index in range(5):
                opened.write(bytes([index]) * 16)
                assert await accepted.readexactly(16) == bytes([index]) * 16
            opened.write(b"a" * 16)
            opened.write(b"b" * 16)
            assert await accepted.readexactly(16) == b"a" * 16
            assert await accepted.readexactly(16) == b"b" * 16
            reader = asyncio.ensure_future(accepted.readexactly(16))
            opened.write(b"c" * 8)
            await asyncio.sleep(0.02)
            assert not reader.done()
            opened.write(b"d" * 8)
            assert await reader == b"c" * 8 + b"d" * 8
            opened.write(b"e" * 40)
            assert await accepted.readexactly(10) == b"e" * 10
            assert await accepted.readexactly(30) == b"e" * 30
            opened.write_eof()
            assert await accepted.read() == b""

    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_read_cancelled_by_a_timeout_leaves_the_bytes_to_the_next(mode: str) -> None:
    async def main() -> None:
        async with open_stream_pair(driver=mode) as (opened, accepted):
            for _ in range(3):
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(accepted.readexactly(5), 0.01)
            opened.write(b"hello")
            assert await asyncio.wait_for(accepted.readexactly(5), 5) == b"hello"
            opened.write(b"again")
            assert await accepted.readexactly(5) == b"again"

    run(main)


def test_the_event_wakes_its_live_waiters_and_forgets_cancelled_ones() -> None:
    """``_Event.wait`` hands out futures: waiters cancelled in any order (timeouts) are
    skipped by ``set`` and pruned by later waits, so a long-lived event does not grow."""
    from chrysalis.quic._asyncio import _Event

    async def main() -> None:
        event = _Event(asyncio.get_running_loop())

        async def waiter() -> bool:
            return bool(await event.wait())

        live = [asyncio.ensure_future(waiter()) for _ in range(5)]
        for _ in range(60):
            doomed = asyncio.ensure_future(waiter())
            await asyncio.sleep(0)
            doomed.cancel()
            await asyncio.gather(doomed, return_exceptions=True)
            more = asyncio.ensure_future(waiter())
            await asyncio.sleep(0)
            if len(live) < 8:
                live.append(more)
            else:
                more.cancel()
        await asyncio.sleep(0)
        assert event._waiters is not None
        assert len(event._waiters) <= 24  # 8 live waiters; 125 waits were made
        event.set()
        assert await asyncio.gather(*live) == [True] * len(live)
        assert await event.wait()  # set: at once

    run(main)
