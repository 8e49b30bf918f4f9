"""Streams through the completion model: ordered operations, acknowledgement-driven send
completions, multiplexing, backpressure (credits, budgets, the per-stream engine buffer and
receive windows), cancellation, reset/stop, reclamation and statistics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).parent))

import pytest
from test_endpoint_harness import Net, Node, pair

from chrysalis.core.completion import (
    BlockReason,
    CloseQueued,
    CommandError,
    CommandFailed,
    ConnectionClosed,
    ConnectionRef,
    ControlOutcome,
    DiscardCompletion,
    FinishCompletion,
    IncomingStream,
    ReceiveCompletion,
    ReceiveStatus,
    ResetCompletion,
    SendCompletion,
    SendOutcome,
    StopCompletion,
    StreamClosed,
    StreamRef,
    SubmissionReceipt,
    WouldBlock,
)
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._endpoint import Close, EndpointRole, OpenBidi, QuicEndpoint


def _connected() -> tuple[Net, Node, Node, ConnectionRef]:
    net, client, server = pair()
    return net, client, server, client.connect(server)


def _engine_stream_state(node: Node, stream: StreamRef) -> tuple[int, int] | None:
    """White-box: (acknowledged, buffered) of the stream inside the node's QUIC engine."""
    conn = node.endpoint._conns.get(stream.connection)
    return None if conn is None else conn.engine.stream_send_state(stream.stream)


def test_handshake_send_receive_and_ack_use_core_queues() -> None:
    net, client, server, conn = _connected()
    stream = client.open(conn)
    assert stream.stream == 0  # client-initiated bidirectional streams start at 0
    sent = client.send(stream, b"hello")
    incoming = server.incoming()
    assert incoming.stream == 0
    discard = server.channels.streams.discard_nowait(incoming, 2)
    assert server.wait_op(discard) == DiscardCompletion(
        discard.operation, incoming, 2, ReceiveStatus.DATA
    )
    received = server.wait_op(server.receive(incoming, 8, min_bytes=3, prefix=b">"))
    assert isinstance(received, ReceiveCompletion)
    assert (received.status, bytes(received.data()), bytes(received.buffer)) == (
        ReceiveStatus.DATA,
        b"llo",
        b">llo",
    )
    finish = client.channels.streams.finish_nowait(stream)
    late_send = client.send(stream, b"late")
    late_finish = client.channels.streams.finish_nowait(stream)
    assert client.wait_op(finish) == FinishCompletion(
        finish.operation, stream, ControlOutcome.COMPLETE
    )
    assert client.wait_op(late_finish) == FinishCompletion(
        late_finish.operation, stream, ControlOutcome.REJECTED
    )
    assert client.wait_op(sent) == SendCompletion(
        sent.operation, stream, 5, SendOutcome.ACKNOWLEDGED, 5
    )
    assert client.wait_op(late_send) == SendCompletion(
        late_send.operation, stream, 4, SendOutcome.REJECTED
    )
    assert client.channels.submissions.retained_budget.used == 0
    # The server sees FIN, answers and finishes: both sides reclaim the stream.
    assert server.read_all(incoming) == b""
    reply = server.send(incoming, b"bye")
    server.channels.streams.finish_nowait(incoming)
    assert client.read_all(stream) == b"bye"
    assert isinstance(server.wait_op(reply), SendCompletion)
    net.run_until(lambda: bool(client.of_type(StreamClosed)) and bool(server.of_type(StreamClosed)))
    assert client.of_type(StreamClosed) == [StreamClosed(stream)]
    assert server.of_type(StreamClosed) == [StreamClosed(incoming)]
    assert client.endpoint.statistics().active_streams == 0
    assert server.endpoint.statistics().active_streams == 0
    # Operations on a reclaimed stream complete at once.
    again = client.wait_op(client.receive(stream, 16))
    assert isinstance(again, ReceiveCompletion)
    assert again.status is ReceiveStatus.CLOSED
    assert client.result(client.submit(Close(conn, 17))) == CloseQueued(conn)
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)))
    (closed,) = server.of_type(ConnectionClosed)
    assert closed.application_code == 17


def test_send_completions_follow_submission_order_with_cumulative_offsets() -> None:
    net, client, server, conn = _connected()
    stream = client.open(conn)
    sizes = [1, 0, 3000, 7, 0, 20000, 5]
    receipts = [client.send(stream, bytes([i]) * size) for i, size in enumerate(sizes)]
    client.channels.streams.finish_nowait(stream)
    incoming = server.incoming()
    data = server.read_all(incoming)
    assert data == b"".join(bytes([i]) * size for i, size in enumerate(sizes))
    net.run_until(lambda: all(client.op(r) is not None for r in receipts))
    sends = client.of_type(SendCompletion)
    assert [s.operation for s in sends] == [r.operation for r in receipts]
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    assert [s.acknowledged_through for s in sends] == ends
    assert all(s.outcome is SendOutcome.ACKNOWLEDGED for s in sends)


def test_multiplexes_connections_and_streams_on_one_server() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER)
    clients = [net.add(f"c{i}", role=EndpointRole.CLIENT) for i in range(2)]
    expected: dict[bytes, bytes] = {}
    for index, client in enumerate(clients):
        for conn in (client.connect(server), client.connect(server)):
            for s in range(3):
                stream = client.open(conn)
                payload = f"client {index} conn {conn.sequence} stream {s} ".encode() * (s + 1)
                client.send(stream, payload)
                client.channels.streams.finish_nowait(stream)
                expected[payload[:24]] = payload
    got: dict[bytes, bytes] = {}
    for _ in range(len(expected)):
        data = server.read_all(server.incoming())
        got[data[:24]] = data
    assert got == expected
    assert len({i.stream.connection for i in server.of_type(IncomingStream)}) == 4
    assert server.endpoint.statistics().active_connections == 4


def test_per_stream_engine_buffer_and_receive_window_bound_memory() -> None:
    limit = 4096
    window = 16384
    net, client, server = pair(
        client_config=QuicConfig(stream_send_buffer=limit),
        server_config=QuicConfig(stream_window=window, connection_window=4 * window),
    )
    conn = client.connect(server)
    stream = client.open(conn)
    payload = bytes(range(256)) * 256  # 64 KiB
    sent = client.send(stream, payload)
    peak_engine = 0
    peak_unread = 0

    def observe() -> bool:
        nonlocal peak_engine, peak_unread
        state = _engine_stream_state(client, stream)
        if state is not None:
            peak_engine = max(peak_engine, state[1])
        for server_conn in server.endpoint._conns.values():
            peak_unread = max(peak_unread, server_conn.buffered)
        return False

    incoming = server.incoming()
    with pytest.raises(AssertionError, match="within"):
        net.run_until(observe, within=1.0)
    # The reader posted nothing: the sender is stalled by the receive window, and the
    # send cannot complete.
    assert client.op(sent) is None
    assert 0 < peak_engine <= limit
    assert 0 < peak_unread <= window
    client.channels.streams.finish_nowait(stream)
    received = bytearray()
    while True:
        completion = server.wait_op(server.receive(incoming, 5000))
        assert isinstance(completion, ReceiveCompletion)
        received += completion.data()
        observe()
        if completion.status is ReceiveStatus.FIN:
            break
    assert bytes(received) == payload
    done = client.wait_op(sent)
    assert isinstance(done, SendCompletion)
    assert (done.outcome, done.acknowledged_through) == (SendOutcome.ACKNOWLEDGED, len(payload))
    assert peak_engine <= limit
    assert peak_unread <= window


def test_completion_credits_and_retained_budget_refuse_work_without_losing_it() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER)
    client = net.add("client", role=EndpointRole.CLIENT, completion_credits=8)
    conn = client.connect(server)
    stream = client.open(conn)
    client.auto_drain = False
    payload = b"p" * 100
    accepted = [client.send(stream, payload) for _ in range(8)]
    with pytest.raises(WouldBlock) as blocked:
        client.send(stream, payload)
    assert blocked.value.reason is BlockReason.COMPLETION_FULL
    assert blocked.value.returned is payload
    net.run_for(1.0)
    client.drain()
    assert [client.op(r) is not None for r in accepted] == [True] * 8
    assert client.channels.credits.in_use == 0
    assert client.channels.submissions.retained_budget.used == 0


def test_cancelling_posted_receive_returns_its_original_buffer() -> None:
    net, client, _server, conn = _connected()
    stream = client.open(conn)
    buffer = bytearray(b"keep:")
    receipt = client.channels.streams.receive_nowait(stream, buffer, 64)
    net.run_for(0.05)
    assert client.op(receipt) is None
    assert receipt.cancellation is not None
    assert receipt.cancellation.cancel()
    assert not receipt.cancellation.cancel()
    done = client.wait_op(receipt)
    assert isinstance(done, ReceiveCompletion)
    assert done.status is ReceiveStatus.CANCELLED
    assert done.buffer is buffer
    assert bytes(buffer) == b"keep:"
    assert client.channels.submissions.posted_budget.used == 0


def test_reset_fences_later_sends_and_stop_is_a_terminal_receive_control() -> None:
    net, client, server, conn = _connected()
    stream = client.open(conn)
    client.send(stream, b"before reset")
    reset = client.channels.streams.reset_nowait(stream, 11)
    later = client.send(stream, b"after")
    assert client.wait_op(reset) == ResetCompletion(
        reset.operation, stream, ControlOutcome.COMPLETE
    )
    later_done = client.wait_op(later)
    assert isinstance(later_done, SendCompletion)
    assert later_done.outcome is SendOutcome.REJECTED
    incoming = server.incoming()
    seen = server.wait_op(server.receive(incoming, 64))
    assert isinstance(seen, ReceiveCompletion)
    assert (seen.status, seen.error_code) == (ReceiveStatus.RESET, 11)
    # Stop: our receive half ends with STOPPED. STOP_SENDING ends the peer's send half, and
    # with its receive half already reset the peer reclaims the stream: a later send there
    # completes at once as abandoned.
    stop = client.channels.streams.stop_nowait(stream, 12)
    after_stop = client.receive(stream, 64)
    assert client.wait_op(stop) == StopCompletion(stop.operation, stream, ControlOutcome.COMPLETE)
    stopped = client.wait_op(after_stop)
    assert isinstance(stopped, ReceiveCompletion)
    assert (stopped.status, stopped.error_code) == (ReceiveStatus.STOPPED, 12)
    net.run_until(lambda: bool(client.of_type(StreamClosed)) and bool(server.of_type(StreamClosed)))
    assert client.of_type(StreamClosed) == [StreamClosed(stream)]
    assert server.of_type(StreamClosed) == [StreamClosed(incoming, peer_reset_code=11)]
    server_send = server.wait_op(server.send(incoming, b"x" * 10))
    assert isinstance(server_send, SendCompletion)
    assert server_send.outcome is SendOutcome.ABANDONED


def test_stop_sending_from_the_peer_abandons_pending_sends_in_order() -> None:
    net, client, server = pair(server_config=QuicConfig(stream_window=16384))
    conn = client.connect(server)
    stream = client.open(conn)
    # The receive window stalls the big send, so it and the two behind it are still pending
    # when the peer's STOP_SENDING arrives.
    pending = [
        client.send(stream, b"a" * 200_000),
        client.send(stream, b"b"),
        client.send(stream, b"c"),
    ]
    incoming = server.incoming()
    server.channels.streams.stop_nowait(incoming, 7)
    net.run_until(lambda: all(client.op(r) is not None for r in pending))
    later = client.wait_op(client.send(stream, b"late"))
    sends = client.of_type(SendCompletion)
    assert [s.operation for s in sends] == [r.operation for r in pending] + [later.operation]
    assert [s.outcome for s in sends] == [SendOutcome.ABANDONED] * 3 + [SendOutcome.REJECTED]
    assert client.channels.submissions.retained_budget.used == 0


def test_terminal_stream_churn_reclaims_state_immediately() -> None:
    net, client, server, conn = _connected()
    total = 120
    peak = 0
    for batch in range(total // 20):
        for _ in range(20):
            stream = client.open(conn)
            client.send(stream, b"x")
            client.channels.streams.finish_nowait(stream)
            client.receive(stream, 8)
        for _ in range(20):
            incoming = server.incoming()
            server.channels.streams.finish_nowait(incoming)
            server.receive(incoming, 8)
        closed = 20 * (batch + 1)

        def batch_reclaimed(closed: int = closed) -> bool:
            return (
                len(client.of_type(StreamClosed)) == closed
                and len(server.of_type(StreamClosed)) == closed
            )

        net.run_until(batch_reclaimed)
        peak = max(peak, client.endpoint.statistics().active_streams)
    assert client.endpoint.statistics().reclaimed_streams == total
    assert server.endpoint.statistics().reclaimed_streams == total
    assert client.endpoint.statistics().active_streams == 0
    assert server.endpoint.statistics().active_streams == 0
    assert peak == 0


def test_connection_statistics_keep_same_peer_connections_distinct() -> None:
    _net, client, server = pair()
    first, second = client.connect(server), client.connect(server)
    for conn, size in ((first, 10), (second, 20)):
        stream = client.open(conn)
        client.wait_op(client.send(stream, b"s" * size))
    one = client.endpoint.connection_statistics(first)
    two = client.endpoint.connection_statistics(second)
    assert one is not None
    assert two is not None
    assert (one.stream_bytes_sent, two.stream_bytes_sent) == (10, 20)
    assert one.peer == two.peer == server.pid
    total = client.endpoint.aggregate_peer(server.pid)
    assert total is not None
    assert total.stream_bytes_sent == 30
    assert total.datagrams_sent == one.datagrams_sent + two.datagrams_sent
    assert client.endpoint.connection_statistics(ConnectionRef(first.driver, 999)) is None


def test_peer_streams_over_the_limit_are_refused_without_harming_the_connection() -> None:
    net = Net()
    server = net.add(
        "server", role=EndpointRole.SERVER, limits=EndpointLimits(max_streams_per_connection=2)
    )
    client = net.add("client", role=EndpointRole.CLIENT)
    conn = client.connect(server)
    streams = [client.open(conn) for _ in range(3)]
    sends = [client.send(stream, b"data") for stream in streams]
    net.run_until(lambda: all(client.op(r) is not None for r in sends))
    outcomes = [client.op(r) for r in sends]
    assert [o.outcome for o in outcomes if isinstance(o, SendCompletion)] == [
        SendOutcome.ACKNOWLEDGED,
        SendOutcome.ACKNOWLEDGED,
        SendOutcome.ABANDONED,
    ]
    assert server.endpoint.statistics().refused_streams == 1
    assert len(server.of_type(IncomingStream)) == 2
    assert server.endpoint.statistics().active_connections == 1


def test_operations_on_unknown_streams_and_connections_complete_at_once() -> None:
    _net, client, _server, conn = _connected()
    ghost = StreamRef(ConnectionRef(conn.driver, 4242), 0)
    streams = client.channels.streams
    send = streams.send_nowait(ghost, b"gone")
    buffer = bytearray(b"pre")
    receive = streams.receive_nowait(ghost, buffer, 10)
    discard = streams.discard_nowait(ghost, 5)
    finish = streams.finish_nowait(ghost)
    reset = streams.reset_nowait(ghost, 1)
    stop = streams.stop_nowait(ghost, 1)
    assert client.wait_op(send) == SendCompletion(send.operation, ghost, 4, SendOutcome.ABANDONED)
    got = client.wait_op(receive)
    assert isinstance(got, ReceiveCompletion)
    assert (got.status, got.buffer is buffer) == (ReceiveStatus.CLOSED, True)
    assert client.wait_op(discard) == DiscardCompletion(
        discard.operation, ghost, 0, ReceiveStatus.CLOSED
    )
    for receipt in (finish, reset, stop):
        done = client.wait_op(receipt)
        assert getattr(done, "outcome", None) is ControlOutcome.ABANDONED
    assert client.channels.submissions.retained_budget.used == 0
    assert client.channels.submissions.posted_budget.used == 0


def test_open_bidi_reports_unknown_connections_and_the_local_stream_limit() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER)
    client = net.add(
        "client", role=EndpointRole.CLIENT, limits=EndpointLimits(max_streams_per_connection=1)
    )
    conn = client.connect(server)
    client.open(conn)
    limited = client.result(client.submit(OpenBidi(conn)))
    assert isinstance(limited, CommandFailed)
    assert limited.error is CommandError.INVALID_ARGUMENT
    unknown = client.result(client.submit(OpenBidi(ConnectionRef(conn.driver, 777))))
    assert isinstance(unknown, CommandFailed)
    assert unknown.error is CommandError.UNKNOWN_CONNECTION


def test_server_opened_streams_reach_the_client() -> None:
    net, client, server, _conn = _connected()
    net.run_until(lambda: bool(server.endpoint.connections()))
    (server_conn,) = server.endpoint.connections()
    net.run_until(lambda: server.endpoint.connection_statistics(server_conn) is not None)
    stream = server.open(server_conn)
    assert stream.stream == 1  # server-initiated bidirectional streams start at 1
    server.send(stream, b"from the server")
    server.channels.streams.finish_nowait(stream)
    incoming = client.incoming()
    assert incoming.stream == 1
    assert client.read_all(incoming) == b"from the server"


def _stream_record(node: Node, stream: StreamRef) -> Any:
    """White-box: the endpoint's record of ``stream`` (its buffered and consumed counts)."""
    return node.endpoint._conns[stream.connection].streams[stream.stream]


def _count_progress_passes(monkeypatch: pytest.MonkeyPatch, node: Node) -> list[int]:
    """White-box: count ``node``'s per-stream progress passes (the general path)."""
    general = QuicEndpoint._progress_stream
    passes = [0]

    def counted(self: QuicEndpoint, conn: Any, stream: Any) -> None:
        if self is node.endpoint:
            passes[0] += 1
        general(self, conn, stream)

    monkeypatch.setattr(QuicEndpoint, "_progress_stream", counted)
    return passes


def _received(node: Node, receipt: SubmissionReceipt) -> ReceiveCompletion:
    done = node.wait_op(receipt)
    assert isinstance(done, ReceiveCompletion), done
    return done


def test_receives_posted_before_the_data_complete_like_buffered_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receive already posted when data arrives completes straight from the engine event
    (the request/response path); every case that path does not take falls back to the
    buffered one, and the outcomes are the same either way."""
    net, client, server, conn = _connected()
    stream = client.open(conn)
    client.send(stream, b"!")
    incoming = server.incoming()
    assert bytes(_received(server, server.receive(incoming, 1)).data()) == b"!"
    record = _stream_record(server, incoming)
    # Fits: completes on arrival, nothing buffered, flow-control credit consumed.
    first = server.receive(incoming, 8, prefix=b">")
    net.run_for(0.01)
    assert server.op(first) is None
    passes = _count_progress_passes(monkeypatch, server)
    client.send(stream, b"ping")
    done = server.wait_op(first)
    assert passes == [0]  # neither posting nor completing it needed a progress pass
    assert isinstance(done, ReceiveCompletion)
    assert (done.status, bytes(done.buffer)) == (ReceiveStatus.DATA, b">ping")
    assert (record.buffered, record.consumed) == (0, 1 + 4)
    # Below min_bytes: held (in the posted buffer) until the rest arrives, one completion.
    waiting = server.receive(incoming, 16, min_bytes=6)
    client.send(stream, b"abc")
    net.run_for(0.01)
    assert server.op(waiting) is None
    assert (record.buffered, record.consumed) == (0, 8)
    client.send(stream, b"def")
    done = server.wait_op(waiting)
    assert isinstance(done, ReceiveCompletion)
    assert bytes(done.data()) == b"abcdef"
    # Larger than the spare room: the posted receive fills up, the rest waits buffered.
    small = server.receive(incoming, 4)
    client.send(stream, b"0123456789")
    done = server.wait_op(small)
    assert isinstance(done, ReceiveCompletion)
    assert bytes(done.data()) == b"0123"
    assert record.buffered == 6
    rest = server.wait_op(server.receive(incoming, 64))
    assert isinstance(rest, ReceiveCompletion)
    assert bytes(rest.data()) == b"456789"
    # Two posted: the first takes the data, the second stays posted for the next bytes.
    one, two = server.receive(incoming, 8), server.receive(incoming, 8)
    client.send(stream, b"x")
    assert bytes(_received(server, one).data()) == b"x"
    net.run_for(0.01)
    assert server.op(two) is None
    client.send(stream, b"y")
    assert bytes(_received(server, two).data()) == b"y"
    # Cancelled before the data: CANCELLED, and the data goes to the next receive.
    cancelled = server.receive(incoming, 8)
    net.run_for(0.01)
    assert cancelled.cancellation is not None
    assert cancelled.cancellation.cancel()
    assert _received(server, cancelled).status is ReceiveStatus.CANCELLED
    client.send(stream, b"z")
    net.run_for(0.01)
    assert record.buffered == 1
    assert bytes(_received(server, server.receive(incoming, 8)).data()) == b"z"
    assert record.consumed == 1 + 4 + 6 + 10 + 2 + 1  # every byte, each counted once
    assert server.channels.submissions.posted_budget.used == 0


def test_a_send_on_an_idle_established_stream_reaches_the_engine_in_its_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net, client, server, conn = _connected()
    stream = client.open(conn)
    receipt = client.send(stream, b"hello")
    passes = _count_progress_passes(monkeypatch, client)
    client.endpoint.poll(net.now)  # admission alone hands the bytes to the engine
    assert _engine_stream_state(client, stream) == (0, 5)
    assert passes == [0]
    later = client.send(stream, b"world")
    client.endpoint.poll(net.now)
    assert _engine_stream_state(client, stream) == (0, 10)
    incoming = server.incoming()
    got = server.wait_op(server.receive(incoming, 64, min_bytes=10))
    assert isinstance(got, ReceiveCompletion)
    assert bytes(got.data()) == b"helloworld"
    assert client.wait_op(receipt).outcome is SendOutcome.ACKNOWLEDGED  # type: ignore[union-attr]
    assert client.wait_op(later).outcome is SendOutcome.ACKNOWLEDGED  # type: ignore[union-attr]


def test_held_ack_checks_complete_sends_only_at_a_poll_without_the_hold() -> None:
    # ``hold_ack_checks`` (the inline driver sets it from a datagram's arrival until its
    # reply left) postpones completing the sends a datagram acknowledged to the next poll
    # without the hold: the same completion, later.
    net, client, server, conn = _connected()
    stream = client.open(conn)
    endpoint = client.endpoint
    endpoint.hold_ack_checks = True
    sent = client.send(stream, b"hello")
    incoming = server.incoming()
    net.run_until(lambda: _engine_stream_state(client, stream) == (5, 0))

    def held() -> bool:  # a call, so that the type checker does not narrow the property
        return endpoint.acks_held

    # The engine has the acknowledgement; the endpoint only noted the connection.
    assert held()
    net.run_for(0.01)
    assert client.op(sent) is None
    endpoint.hold_ack_checks = False
    endpoint.poll(net.now)
    client.drain()
    assert not held()
    assert client.op(sent) == SendCompletion(sent.operation, stream, 5, SendOutcome.ACKNOWLEDGED, 5)
    # Without the hold nothing is noted: acknowledgements complete in the same poll.
    again = client.send(stream, b"again")
    net.run_until(lambda: client.op(again) is not None)
    assert not held()
    received = server.wait_op(server.receive(incoming, 64, min_bytes=10))
    assert isinstance(received, ReceiveCompletion)
    assert bytes(received.data()) == b"helloagain"
