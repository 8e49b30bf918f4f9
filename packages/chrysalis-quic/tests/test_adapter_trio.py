"""The trio adapter over the in-process carrier, with the driver inline and on a thread: its
streams pass trio's own ``check_half_closeable_stream`` conformance suite (including the
"clogged" checks that need real backpressure), and its errors map onto trio's vocabulary."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from chrysalis.core import Pid
from chrysalis.core.completion import ConnectionClosed
from chrysalis.datagram import InprocNetwork
from chrysalis.quic import QuicConfig
from chrysalis.quic._endpoint_core import AdapterOptions
from chrysalis.quic._errors import (
    ConnectionLostError,
    EndpointClosedError,
    PeerAuthenticationError,
    StreamResetError,
)
from chrysalis.quic._trio import TrioEndpoint, TrioStream
from chrysalis.quic.testing import connected_stream_pair, issue_identities, open_endpoint_pair

MODES = ["inline", "thread"]


def run(main: Callable[[], Awaitable[Any]], timeout: float = 8.0) -> Any:
    """Run ``main()`` in a fresh trio run, failing after ``timeout`` seconds."""

    async def bounded() -> Any:
        with trio.fail_after(timeout):
            return await main()

    return trio.run(bounded)


async def receive_to_the_end(stream: TrioStream) -> None:
    """Receive until EOF (an error is what the callers expect)."""
    while await stream.receive_some(10):
        pass
    raise AssertionError("the stream read as a clean EOF")


def quic_stream(stream: TrioStream) -> Any:
    """The QUIC engine's state of ``stream`` (aioquic's ``QuicStream``), or None."""
    endpoint = stream.connection.endpoint._endpoint
    connection = endpoint._conns.get(stream.ref.connection)
    if connection is None:
        return None
    engine: Any = connection.engine  # the aioquic engine (the default)
    return engine._streams.get(stream.ref.stream)


def is_clogged(stream: TrioStream, peer: TrioStream) -> bool:
    """True when the writer of ``stream`` stays blocked until ``peer`` reads, whatever the
    timers do (called when every task is blocked, so no work is runnable):

    - the peer's adapter holds its whole read-ahead and posts no receive: nothing consumes
      the stream at the peer, so its flow-control limit cannot grow;
    - both ends agree on that limit (no window update is on its way);
    - every byte up to the limit was sent and acknowledged (no byte or acknowledgement is on
      its way, so every send that fits below the limit has completed);
    - and the writer is still blocked: what it holds in flight crosses the limit.
    """
    reader = peer.core
    if reader.buffered < reader.core.options.read_ahead or reader.posted:
        return False
    sending, receiving = quic_stream(stream), quic_stream(peer)
    if sending is None or receiving is None:
        return False
    limit = receiving.max_stream_data_local
    return (
        receiving.max_stream_data_local_sent == limit
        and sending.max_stream_data_remote == limit
        and sending.sender._buffer_start == limit
        and not stream.core.writable_now()
    )


async def clog(stream: TrioStream, peer: TrioStream) -> None:
    """Write to ``stream`` until its writer is provably blocked (see ``is_clogged``), then
    cancel the blocked write (its bytes stay queued, so the stream stays clogged)."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def fill() -> None:
                while True:
                    await stream.send_all(b"c" * 1024)

            nursery.start_soon(fill)
            while True:
                # Quiescent first (every runnable task ran, I/O polled), then the condition;
                # progress rides on timers (acknowledgements), so re-check after a tick.
                await trio.testing.wait_all_tasks_blocked()
                if is_clogged(stream, peer):
                    break
                await trio.sleep(0.001)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("mode", MODES)
def test_streams_pass_trios_half_closeable_stream_conformance(mode: str) -> None:
    async def main() -> None:
        async with open_endpoint_pair(driver=mode) as (first, second):

            async def maker() -> tuple[TrioStream, TrioStream]:
                opened, accepted = await connected_stream_pair(first, second)
                assert isinstance(opened, TrioStream)
                return opened, accepted

            await trio.testing.check_half_closeable_stream(maker, None)

    run(main, timeout=20.0)


def test_clogged_streams_pass_the_backpressure_checks() -> None:
    # Tiny windows, read-ahead and in-flight bound: a sender really blocks until the
    # receiver reads, which trio's clogged-stream checks require (only the clogged streams
    # use them).
    config = QuicConfig(stream_window=2048, connection_window=1 << 20)
    options = AdapterOptions(read_ahead=1024, write_high_water=1024)

    async def main() -> None:
        async with (
            open_endpoint_pair() as (fast_first, fast_second),
            open_endpoint_pair(config=config, options=options) as (first, second),
        ):

            async def maker() -> tuple[TrioStream, TrioStream]:
                # The suite's 1 MiB duplex exchange runs on normal windows.
                return await connected_stream_pair(fast_first, fast_second)

            async def clogged_maker() -> tuple[TrioStream, TrioStream]:
                # Clogged both ways: the suite also runs with the pair flipped.
                opened, accepted = await connected_stream_pair(first, second)
                await clog(opened, accepted)
                await clog(accepted, opened)
                return opened, accepted

            await trio.testing.check_half_closeable_stream(maker, clogged_maker)

    run(main, timeout=25.0)


def test_large_payloads_arrive_intact_in_both_directions() -> None:
    async def main() -> None:
        async with open_endpoint_pair() as (first, second):
            opened, accepted = await connected_stream_pair(first, second)
            up = random.Random(5).randbytes(400_000)
            down = random.Random(6).randbytes(300_000)
            received: dict[str, bytes] = {}

            async def send(stream: TrioStream, data: bytes) -> None:
                view = memoryview(data)
                while view:
                    await stream.send_all(view[:30_000])
                    view = view[30_000:]
                await stream.send_eof()

            async def receive(stream: TrioStream, key: str) -> None:
                chunks = []
                while chunk := await stream.receive_some(16384):
                    chunks.append(chunk)
                received[key] = b"".join(chunks)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send, opened, up)
                nursery.start_soon(send, accepted, down)
                nursery.start_soon(receive, accepted, "up")
                nursery.start_soon(receive, opened, "down")
            assert received == {"up": up, "down": down}

    run(main)


def test_peer_reset_is_a_broken_resource_with_the_code_chained() -> None:
    async def main() -> None:
        async with open_endpoint_pair() as (first, second):
            opened, accepted = await connected_stream_pair(first, second)
            opened.abort(77)
            with pytest.raises(trio.BrokenResourceError) as caught:
                await receive_to_the_end(accepted)
            cause = caught.value.__cause__
            assert isinstance(cause, StreamResetError)
            assert cause.error_code == 77
            with pytest.raises(trio.ClosedResourceError):
                await opened.send_all(b"after abort")

    run(main)


@pytest.mark.parametrize("mode", MODES)
def test_connection_loss_breaks_blocked_receivers(mode: str) -> None:
    # The completion model delivers a blocked read's ``ReceiveStatus.CLOSED`` before the
    # connection's ``ConnectionClosed`` (which carries the close codes). With the thread
    # driver the adapter can dispatch the first, and run the woken reader, before the driver
    # thread has queued the second. This test forces that ordering on both drivers: it holds
    # the ``ConnectionClosed`` back, proves the reader is still waiting (it must not report a
    # lost connection without its codes), then delivers it.
    async def main() -> None:
        async with open_endpoint_pair(driver=mode) as (first, second):
            opened, accepted = await connected_stream_pair(first, second)
            core = second._core
            deliver = core._handlers[ConnectionClosed]
            held: list[ConnectionClosed] = []
            arrived = trio.Event()

            def hold(completion: ConnectionClosed) -> None:
                held.append(completion)
                arrived.set()

            core._handlers[ConnectionClosed] = hold
            outcome: list[BaseException] = []

            async def receiver() -> None:
                try:
                    await accepted.receive_some(10)
                except trio.BrokenResourceError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receiver)
                await trio.testing.wait_all_tasks_blocked()  # the read is posted and waiting
                opened.connection.close(5)
                await arrived.wait()  # the read's completion was dispatched before it
                await trio.testing.wait_all_tasks_blocked()  # the woken reader has run
                assert not outcome, "the reader gave up before the close codes arrived"
                core._handlers[ConnectionClosed] = deliver
                deliver(held[0])
            assert isinstance(outcome[0].__cause__, ConnectionLostError)
            assert outcome[0].__cause__.application_code == 5

    run(main)


def test_authentication_failure_and_endpoint_shutdown() -> None:
    async def main() -> None:
        first_id, second_id = issue_identities(2)
        net = InprocNetwork()
        async with TrioEndpoint.spawn_server(second_id, net.bind()) as server:
            async with TrioEndpoint.spawn_client(first_id, net.bind()) as client:
                wrong = Pid(bytes([0x5A]) * 16)
                with pytest.raises(PeerAuthenticationError):
                    await client.connect(wrong, server.local_addr, route=second_id.pid)
                conn = await client.connect(second_id.pid, server.local_addr)
                assert conn.peer == second_id.pid
                await client.shutdown(grace=0.5)
                assert client.is_closed
                with pytest.raises(EndpointClosedError):
                    await client.connect(second_id.pid, server.local_addr)

    run(main)
