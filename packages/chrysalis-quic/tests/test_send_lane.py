"""The send lane: a small write handed to the endpoint's stream without the submission queue.

``QuicEndpoint.send_direct`` (with ``StreamSubmitter.send_direct_nowait``) executes a send at
once when nothing could be ahead of it; the asyncio inline driver's ``write_through`` uses it
for the first small write of a cycle. These tests check that the lane keeps the completion
model's contracts (a completion per send, in submission order with queued sends, finishes
and resets; credits and retained bytes taken and released as for a queued send), that each
condition under which it must not run sends it the queued way with nothing taken, and that
the adapter really uses it (so the ordering checks are not vacuous).
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).parent))

import pytest
from test_endpoint_harness import Net, Node, issue

from chrysalis.core import DatagramAddr
from chrysalis.core.completion import (
    ControlOutcome,
    DriverId,
    EndpointChannels,
    FinishCompletion,
    ReceiveCompletion,
    ResetCompletion,
    SendCompletion,
    SendOutcome,
    StreamRef,
    SubmissionLimits,
    WouldBlock,
)
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._endpoint import (
    EndpointRole,
    QuicCommand,
    QuicEndpoint,
    Shutdown,
    _Conn,
    _Connection,
)
from chrysalis.quic.testing import open_endpoint_pair, open_stream_pair

_ids = iter(range(61000, 65000))


def _single_node(
    net: Net,
    name: str,
    role: EndpointRole,
    *,
    limits: SubmissionLimits | None = None,
    credits: int = 1024,
    config: QuicConfig | None = None,
) -> Node:
    """``Net.add`` with one-thread channels (``threadsafe=False``), as the inline drivers
    build them: the only channels on which the lane may run."""
    identity = issue()
    channels = EndpointChannels[QuicCommand](
        DriverId(next(_ids)), limits, completion_credits=credits, threadsafe=False
    )
    endpoint = QuicEndpoint(
        identity,
        role=role,
        config=config,
        channels=channels,
        now=net.now,
        random_bytes=random.Random(len(net.nodes)).randbytes,
    )
    where = DatagramAddr.inproc(1, len(net.nodes) + 1)
    node = Node(net, name, identity, where, channels, endpoint)
    net.nodes[where] = node
    return node


def _setup(
    *, limits: SubmissionLimits | None = None, credits: int = 1024
) -> tuple[Net, Node, Node, StreamRef, StreamRef]:
    """A connected client (one-thread channels) and server (thread-safe channels, as the
    thread driver builds them), a client stream and its server end (opened with one
    acknowledged byte, ``b"<"``, which the server has not read)."""
    net = Net()
    client = _single_node(net, "client", EndpointRole.CLIENT, limits=limits, credits=credits)
    server = net.add("server", role=EndpointRole.SERVER)
    conn = client.connect(server)
    stream = client.open(conn)
    client.wait_op(client.send(stream, b"<"))
    return net, client, server, stream, server.incoming()


def _lane(node: Node, stream: StreamRef, payload: bytes) -> bool:
    return node.endpoint.send_direct(stream, payload, node.channels.streams.send_direct_nowait)


def _held(node: Node) -> tuple[int, int, int]:
    """Credits, retained bytes and queued submissions of ``node``'s channels."""
    ch = node.channels
    return ch.credits.in_use, ch.submissions.retained_budget.used, len(ch.submissions)


def _conn(node: Node, stream: StreamRef) -> _Connection:
    return node.endpoint._conns[stream.connection]


def _send_side(node: Node, stream: StreamRef) -> list[tuple[str, int, object]]:
    """The send-direction completions of ``stream`` in arrival order: kind, operation, outcome."""
    out: list[tuple[str, int, object]] = []
    for item in node.completions:
        if isinstance(item, SendCompletion) and item.stream == stream:
            out.append(("send", item.operation.sequence, item.outcome))
        elif isinstance(item, FinishCompletion | ResetCompletion) and item.stream == stream:
            out.append((type(item).__name__, item.operation.sequence, item.outcome))
    return out


def _read(server: Node, stream: StreamRef, count: int) -> bytes:
    received = server.wait_op(server.receive(stream, 4096, min_bytes=count))
    assert isinstance(received, ReceiveCompletion)
    return bytes(received.data())


def test_the_lane_sends_without_the_queue_and_completes_like_a_queued_send() -> None:
    net, client, server, stream, incoming = _setup()
    assert _held(client) == (0, 0, 0)
    sequence = client.channels.submissions.sequence()
    assert _lane(client, stream, b"hello")
    # Admitted (a credit, five retained bytes) and in the engine, but never queued.
    assert _held(client) == (1, 5, 0)
    assert client.channels.submissions.sequence() == sequence
    assert _conn(client, stream).engine.stream_send_state(stream.stream) == (1, 5)
    assert _read(server, incoming, 6) == b"<hello"
    net.run_until(lambda: len(_send_side(client, stream)) == 2)
    (first, lane) = client.of_type(SendCompletion)
    assert lane == SendCompletion(
        lane.operation, stream, 5, SendOutcome.ACKNOWLEDGED, acknowledged_through=6
    )
    assert lane.operation.sequence > first.operation.sequence
    # The completion was consumed (``auto_drain``): credit and bytes are back.
    assert _held(client) == (0, 0, 0)


def test_a_queued_send_is_never_overtaken() -> None:
    net, client, server, stream, incoming = _setup()
    queued = client.send(stream, b"a")
    # Not polled yet: the lane must not run ahead of it, and takes nothing.
    assert _held(client) == (1, 1, 1)
    assert not _lane(client, stream, b"b")
    assert _held(client) == (1, 1, 1)
    client.endpoint.poll(net.now)
    assert _lane(client, stream, b"c")
    assert _read(server, incoming, 3) == b"<ac"
    net.run_until(lambda: len(_send_side(client, stream)) == 3)
    kinds = _send_side(client, stream)
    assert [operation for _, operation, _ in kinds] == sorted(o for _, o, _ in kinds)
    assert kinds[1][1] == queued.operation.sequence


def test_lane_sends_interleave_with_queued_sends_finish_and_reset_in_order() -> None:
    net, client, server, stream, incoming = _setup()
    assert _lane(client, stream, b"1")
    client.send(stream, b"2")
    client.endpoint.poll(net.now)
    assert _lane(client, stream, b"3")
    client.send(stream, b"4")
    client.channels.streams.finish_nowait(stream)
    assert not _lane(client, stream, b"5")  # the finish is queued ahead
    client.endpoint.poll(net.now)
    assert not _lane(client, stream, b"6")  # the send half is finishing
    rejected = client.send(stream, b"7")
    assert client.wait_op(rejected).outcome is SendOutcome.REJECTED  # type: ignore[union-attr]
    assert server.read_all(incoming) == b"<1234"
    net.run_until(lambda: len(_send_side(client, stream)) == 7)
    kinds = _send_side(client, stream)
    sends = [entry for entry in kinds if entry[0] == "send"]
    assert [entry[1] for entry in sends] == sorted(entry[1] for entry in sends)
    assert [entry[2] for entry in sends] == [SendOutcome.ACKNOWLEDGED] * 5 + [SendOutcome.REJECTED]
    finishes = [entry for entry in kinds if entry[0] == "FinishCompletion"]
    assert [entry[2] for entry in finishes] == [ControlOutcome.COMPLETE]
    assert _held(client) == (0, 0, 0)
    # A reset fences the lane as well.
    other = client.open(next(iter(client.endpoint._conns)))
    assert _lane(client, other, b"x")
    client.channels.streams.reset_nowait(other, 7)
    assert not _lane(client, other, b"y")
    client.endpoint.poll(net.now)
    assert not _lane(client, other, b"y")
    net.run_until(lambda: len(_send_side(client, other)) == 2)
    assert [entry[0] for entry in _send_side(client, other)] == ["send", "ResetCompletion"]


def test_a_stream_with_sends_inside_the_bound_keeps_the_queue_path() -> None:
    # A send larger than the engine's per-stream buffer stays partly queued in the endpoint
    # (``send_ops``): the lane refuses until it is handed over completely.
    net = Net()
    client = _single_node(
        net, "client", EndpointRole.CLIENT, config=QuicConfig(stream_send_buffer=1024)
    )
    server = net.add("server", role=EndpointRole.SERVER)
    stream = client.open(client.connect(server))
    big = bytes(range(256)) * 12
    client.send(stream, big)
    client.endpoint.poll(net.now)
    assert _conn(client, stream).streams[stream.stream].send_ops
    taken = _held(client)
    assert not _lane(client, stream, b"tail")
    assert _held(client) == taken
    client.send(stream, b"tail")
    client.channels.streams.finish_nowait(stream)
    assert server.read_all(server.incoming()) == big + b"tail"


def test_every_other_condition_falls_back_with_nothing_taken() -> None:
    net, client, server, stream, incoming = _setup()
    endpoint = client.endpoint
    conn = _conn(client, stream)
    taken = _held(client)

    def refused(payload: bytes = b"x", ref: StreamRef = stream) -> bool:
        result = not _lane(client, ref, payload)
        assert _held(client) == taken
        return result

    assert refused(b"")  # nothing to send
    assert refused(ref=StreamRef(stream.connection, 400))  # an unknown stream
    # A cancellation hint waits for the driver.
    receipt = client.receive(stream, 64)
    endpoint.poll(net.now)
    taken = _held(client)
    assert receipt.cancellation is not None
    assert receipt.cancellation.cancel()
    assert refused()
    endpoint.poll(net.now)
    client.drain()
    taken = _held(client)
    # White-box: what the poll would do first (more submissions after a poll that stopped
    # at its bound, staged completions, runnable streams, a connection to reap, an
    # acknowledgement check due) and a connection not established.
    for attribute, value in [
        ("_backlogged", True),
        ("_staged", [(object(), None)]),
        ("_active", {conn: None}),
        ("_reap", [conn]),
        ("_acks_held", {conn: None}),
    ]:
        saved = getattr(endpoint, attribute)
        setattr(endpoint, attribute, value)
        try:
            assert refused()
        finally:
            setattr(endpoint, attribute, saved)
    endpoint._acks_held = {conn: None}
    endpoint.hold_ack_checks = True  # held on purpose: the check is not due yet
    assert _lane(client, stream, b"h")
    endpoint.hold_ack_checks = False
    endpoint.poll(net.now)
    assert _read(server, incoming, 2) == b"<h"
    conn.state = _Conn.HANDSHAKING
    taken = _held(client)
    try:
        assert refused()
    finally:
        conn.state = _Conn.ESTABLISHED
    # The server's channels are thread-safe: never the lane.
    assert not server.endpoint.send_direct(
        incoming, b"x", server.channels.streams.send_direct_nowait
    )
    # Shutting down: admission closed (the command still queued), then the endpoint draining.
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=1.0))
    taken = _held(client)
    assert refused()
    endpoint.poll(net.now)
    taken = _held(client)
    assert endpoint.state.name == "DRAINING"
    assert refused()


def test_refused_bounds_fall_back_to_the_queue_with_nothing_taken() -> None:
    limits = SubmissionLimits(retained_send_bytes=64)
    net, client, server, stream, incoming = _setup(limits=limits, credits=2)
    assert _lane(client, stream, b"a" * 60)
    assert not _lane(client, stream, b"b" * 5)  # retained bytes
    assert _held(client) == (1, 60, 0)
    with pytest.raises(WouldBlock):
        client.send(stream, b"b" * 5)
    assert _lane(client, stream, b"c")
    assert not _lane(client, stream, b"d")  # both credits held
    assert _held(client) == (2, 61, 0)
    assert _read(server, incoming, 62) == b"<" + b"a" * 60 + b"c"
    net.run_until(lambda: _held(client) == (0, 0, 0))


def test_an_engine_refusal_abandons_the_send_and_releases_it() -> None:
    _, client, _, stream, _ = _setup()
    conn = _conn(client, stream)
    engine = conn.engine

    class Refusing:
        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

        def send_stream_data(self, sid: int, data: bytes, end_stream: bool) -> None:
            raise ValueError("refused")

    conn.engine = Refusing()  # type: ignore[assignment]
    try:
        emitted = client.endpoint.emitted
        assert _lane(client, stream, b"x")
        assert client.endpoint.emitted > emitted  # completed within the lane
    finally:
        conn.engine = engine
    client.drain()
    (_, abandoned) = client.of_type(SendCompletion)
    assert abandoned.outcome is SendOutcome.ABANDONED
    assert _held(client) == (0, 0, 0)
    assert not _lane(client, stream, b"y")  # the send half ended


# --- the asyncio inline driver -------------------------------------------------------------


def _run(main: Callable[[], Awaitable[Any]], timeout: float = 8.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), timeout)

    return asyncio.run(bounded())


def _count_lane(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record every ``send_direct`` answer."""
    answers: list[bool] = []
    original = QuicEndpoint.send_direct

    def spy(self: QuicEndpoint, *args: Any) -> bool:
        answer = original(self, *args)
        answers.append(answer)
        return answer

    monkeypatch.setattr(QuicEndpoint, "send_direct", spy)
    return answers


def test_inline_ping_pong_takes_the_lane_and_returns_every_credit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = _count_lane(monkeypatch)

    async def main() -> None:
        async with open_stream_pair() as (opened, accepted):
            rounds = 50
            for index in range(rounds):
                message = index.to_bytes(16, "big")
                opened.write(message)
                assert await accepted.readexactly(16) == message
                accepted.write(message[::-1])
                assert await opened.readexactly(16) == message[::-1]
            assert answers.count(True) >= rounds  # the replies at least
            for stream in (opened, accepted):
                core = stream.core
                while core.in_flight:  # every send acknowledged (woken per completion)
                    await core._wait_write()
                channels = core.core.channels
                assert channels.submissions.retained_budget.used == 0
                # One credit each: the read-ahead receive posted for the next message.
                assert channels.credits.in_use == core.posted

    _run(main)


def test_inline_writes_keep_their_order_around_the_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = _count_lane(monkeypatch)

    async def main() -> None:
        async with open_stream_pair() as (opened, accepted):
            big = bytes(range(256)) * 8
            # A bulk write (queued, never offered to the lane) then a small one: the lane
            # must see the queued send and take the queue path behind it.
            seen = len(answers)
            opened.write(big)
            opened.write(b"after")
            assert answers[seen:] == [False]
            assert await accepted.readexactly(len(big) + 5) == big + b"after"
            # The lane first, then more writes of the same step (queued) and a FIN.
            seen = len(answers)
            accepted.write(b"one")
            lane_used = answers[seen:]
            accepted.write(b"two")
            accepted.write(big)
            accepted.write(b"three")
            accepted.write_eof()
            assert await opened.read(-1) == b"one" + b"two" + big + b"three"
            assert lane_used == [True]

    _run(main)


def test_the_thread_driver_does_not_offer_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = _count_lane(monkeypatch)

    async def main() -> None:
        async with open_endpoint_pair(driver="thread") as (first, second):
            connection = await first.connect(second.pid, second.local_addr)
            stream = await connection.open_stream()
            assert stream.core.core.write_through is None
            stream.write(b"ping")
            stream.write_eof()
            _, incoming = await second.accept()
            assert await incoming.read() == b"ping"

    _run(main)
    assert answers == []
