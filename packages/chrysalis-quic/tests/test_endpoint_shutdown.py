"""Structured shutdown and abort, completion backpressure, connection close codes and the
idle timeout."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).parent))

import pytest
from test_endpoint_harness import Net, Node, pair

from chrysalis.core import DatagramAddr
from chrysalis.core.completion import (
    AbortStarted,
    BlockReason,
    CommandCompletion,
    ConnectionClosed,
    ControlOutcome,
    DriverStopped,
    FinishCompletion,
    IncomingStream,
    ReceiveCompletion,
    ReceiveStatus,
    SendCompletion,
    SendOutcome,
    ShutdownStarted,
    StreamRef,
    SubmissionClosed,
    SubmissionReceipt,
    WouldBlock,
)
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._endpoint import (
    Abort,
    Close,
    Connect,
    EndpointRole,
    EndpointState,
    Shutdown,
)


def _stopped(node: Node) -> bool:
    return bool(node.completions) and isinstance(node.completions[-1], DriverStopped)


def test_graceful_shutdown_is_bounded_and_emits_terminal_completion() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    started = net.now
    receipt = client.channels.commands.submit_and_close_nowait(Shutdown(grace=0.1))
    net.run_until(lambda: _stopped(client), within=1.0)
    assert net.now - started <= 0.1 + 1e-6
    assert CommandCompletion(receipt.request, ShutdownStarted()) in client.completions
    assert client.completions[-1] == DriverStopped(client.channels.driver)
    assert client.of_type(ConnectionClosed) == [ConnectionClosed(conn, application_code=0)]
    assert client.endpoint.state is EndpointState.STOPPED
    with pytest.raises(SubmissionClosed):
        client.submit(Connect(route=server.pid, peer=server.addr))
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)))
    assert server.of_type(ConnectionClosed)[0].application_code == 0


def test_graceful_shutdown_lets_queued_work_finish_first() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    stream = client.open(conn)
    sent = client.send(stream, b"z" * 50_000)
    client.channels.streams.finish_nowait(stream)
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=5.0))
    assert server.read_all(server.incoming()) == b"z" * 50_000
    net.run_until(lambda: _stopped(client), within=6.0)
    done = client.op(sent)
    assert isinstance(done, SendCompletion)
    assert done.outcome is SendOutcome.ACKNOWLEDGED
    assert client.completions.index(done) < len(client.completions) - 1


def test_shutdown_deadline_abandons_work_that_cannot_finish() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    stream = client.open(conn)
    waiting = client.receive(stream, 64)  # the server never sends
    started = net.now
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=0.25))
    net.run_until(lambda: _stopped(client), within=1.0)
    assert 0.25 - 1e-6 <= net.now - started <= 0.3
    closed = client.op(waiting)
    assert isinstance(closed, ReceiveCompletion)
    assert closed.status is ReceiveStatus.CLOSED
    order = client.completions
    assert order.index(closed) < order.index(client.of_type(ConnectionClosed)[0])
    assert isinstance(order[-1], DriverStopped)


def _stalled_work(
    net: Net, client: Node, server: Node
) -> tuple[bytearray, SubmissionReceipt, SubmissionReceipt, SubmissionReceipt]:
    """A send stalled by the peer's receive window (the client's engine buffer bound keeps
    most of it in the endpoint), a finish behind it and a posted receive; returns the receive
    buffer and the receipts (send, finish, receive)."""
    conn = client.connect(server)
    stream = client.open(conn)
    send = client.send(stream, b"w" * 200_000)
    finish = client.channels.streams.finish_nowait(stream)
    buffer = bytearray(b"mine")
    receive = client.channels.streams.receive_nowait(stream, buffer, 64)
    server.incoming()
    net.run_for(0.2)
    assert client.op(send) is None
    assert client.op(finish) is None
    return buffer, send, finish, receive


def test_abort_rejects_new_work_and_returns_all_accepted_ownership() -> None:
    net, client, server = pair(
        client_config=QuicConfig(stream_send_buffer=4096),
        server_config=QuicConfig(stream_window=16384),
    )
    buffer, send, finish, receive = _stalled_work(net, client, server)
    abort = client.channels.commands.submit_and_close_nowait(Abort())
    net.run_until(lambda: _stopped(client), within=0.01)
    assert client.endpoint.state is EndpointState.STOPPED
    sent = client.op(send)
    finished = client.op(finish)
    received = client.op(receive)
    assert isinstance(sent, SendCompletion)
    assert sent.outcome is SendOutcome.ABANDONED
    assert isinstance(finished, FinishCompletion)
    assert finished.outcome is ControlOutcome.ABANDONED
    assert isinstance(received, ReceiveCompletion)
    assert (received.status, received.buffer is buffer, bytes(buffer)) == (
        ReceiveStatus.CLOSED,
        True,
        b"mine",
    )
    assert CommandCompletion(abort.request, AbortStarted()) in client.completions
    submissions = client.channels.submissions
    assert (submissions.retained_budget.used, submissions.posted_budget.used) == (0, 0)
    payload = b"refused"
    with pytest.raises(SubmissionClosed) as refused:
        client.send(received.stream, payload)
    assert refused.value.returned is payload


def test_ordered_abort_abandons_earlier_work_and_closes_admission() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    stream = client.open(conn)
    send = client.send(stream, b"abandon me")
    abort = client.channels.commands.submit_and_close_nowait(Abort())
    with pytest.raises(SubmissionClosed):
        client.channels.streams.finish_nowait(stream)
    net.run_until(lambda: _stopped(client), within=0.01)
    done = client.op(send)
    assert isinstance(done, SendCompletion)
    assert done.outcome is SendOutcome.ABANDONED
    aborted = CommandCompletion(abort.request, AbortStarted())
    assert client.completions.index(done) < client.completions.index(aborted)
    assert client.completions[-1] == DriverStopped(client.channels.driver)


def test_shutdown_waits_for_completion_backpressure_before_stopping() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER, config=QuicConfig(stream_window=16384))
    client = net.add(
        "client",
        role=EndpointRole.CLIENT,
        completion_queue_capacity=1,
        config=QuicConfig(stream_send_buffer=4096),
    )
    buffer, _send, _finish, receive = _stalled_work(net, client, server)
    client.auto_drain = False
    client.channels.commands.submit_and_close_nowait(Abort())
    net.run_for(0.5)
    assert client.endpoint.state is EndpointState.DRAINING
    assert client.endpoint.statistics().staged_completions > 0
    client.auto_drain = True
    net.run_until(lambda: _stopped(client), within=0.1)
    assert client.endpoint.is_stopped
    kinds = [type(c) for c in client.completions[-6:]]
    assert kinds == [
        SendCompletion,
        FinishCompletion,
        ReceiveCompletion,
        ConnectionClosed,
        CommandCompletion,
        DriverStopped,
    ]
    received = client.op(receive)
    assert isinstance(received, ReceiveCompletion)
    assert received.buffer is buffer


def test_completion_backpressure_bounds_internal_staging_until_reader_resumes() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER)
    client = net.add(
        "client",
        role=EndpointRole.CLIENT,
        completion_credits=32,
        event_credits=4,
        config=QuicConfig(max_staged_completions=8),
    )
    conn = client.connect(server)
    streams = [client.open(conn) for _ in range(32)]
    net.run_until(lambda: bool(server.endpoint.connections()))
    (server_conn,) = server.endpoint.connections()
    net.run_until(lambda: server.endpoint.connection_statistics(server_conn) is not None)
    client.auto_drain = False
    finishes = [client.channels.streams.finish_nowait(stream) for stream in streams]
    with pytest.raises(WouldBlock) as blocked:
        client.channels.streams.finish_nowait(streams[0])
    assert blocked.value.reason is BlockReason.COMPLETION_FULL
    # The server opens many streams towards the unread client: IncomingStream events exceed
    # the event credits and wait in staging, which stays bounded.
    for _ in range(40):
        stream = server.open(server_conn)
        server.send(stream, b"!")
    net.run_for(0.05)  # the streams arrive (in as few as one datagram) and stage their events
    server.send(stream, b"?")  # this datagram arrives while staging is over its bound
    peak = 0

    def observe() -> bool:
        nonlocal peak
        peak = max(peak, client.endpoint.statistics().staged_completions)
        return False

    with pytest.raises(AssertionError):
        net.run_until(observe, within=1.0)
    stats = client.endpoint.statistics()
    assert 0 < peak <= 8 + 40
    assert stats.backpressure_drops > 0
    client.auto_drain = True
    net.run_until(lambda: len(client.of_type(IncomingStream)) == 40, within=10.0)
    assert all(client.op(f) is not None for f in finishes)
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=0.1))
    net.run_until(lambda: _stopped(client))


def test_peer_application_close_code_reaches_terminal_event() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    client.submit(Close(conn, 42, "bye"))
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)))
    assert server.of_type(ConnectionClosed)[0].application_code == 42
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)))
    assert client.of_type(ConnectionClosed) == [ConnectionClosed(conn, application_code=42)]
    assert client.endpoint.statistics().active_connections == 0


def test_idle_timeout_closes_connections_silently() -> None:
    config = QuicConfig(idle_timeout=2.0)
    net, client, server = pair(client_config=config, server_config=config)
    conn = client.connect(server)
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)), within=10.0)
    assert client.of_type(ConnectionClosed) == [ConnectionClosed(conn)]
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)), within=10.0)
    (closed,) = server.of_type(ConnectionClosed)
    assert (closed.application_code, closed.transport_code) == (None, None)


def test_closing_every_submission_handle_shuts_down_gracefully() -> None:
    net, client, server = pair(client_config=QuicConfig(shutdown_grace=0.2))
    client.connect(server)
    client.channels.commands.close()
    client.channels.streams.close()
    net.run_until(lambda: _stopped(client), within=1.0)
    assert client.of_type(ConnectionClosed)[0].application_code == 0


def _acknowledged_words(net: Net, client: Node, server: Node) -> tuple[StreamRef, StreamRef]:
    """A client stream whose b"last words" the server received and the client saw
    acknowledged; returns (the client's stream, the server's)."""
    conn = client.connect(server)
    stream = client.open(conn)
    sent = client.send(stream, b"last words")
    accepted = server.incoming()
    done = client.wait_op(sent)
    assert isinstance(done, SendCompletion)
    assert done.outcome is SendOutcome.ACKNOWLEDGED
    return stream, accepted


def test_shutdown_in_the_step_of_a_finish_still_delivers_the_fin() -> None:
    # The finish completes once the engine has the FIN; a shutdown submitted in the same step
    # must not close the connection before the FIN was sent and acknowledged.
    net, client, server = pair()
    stream, accepted = _acknowledged_words(net, client, server)
    finish = client.channels.streams.finish_nowait(stream)
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=5.0))
    assert server.read_all(accepted, within=2.0) == b"last words"
    net.run_until(lambda: _stopped(client), within=2.0)
    done = client.op(finish)
    assert isinstance(done, FinishCompletion)
    assert done.outcome is ControlOutcome.COMPLETE
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)))
    assert server.of_type(ConnectionClosed)[0].application_code == 0


def test_shutdown_waits_for_a_lost_fin_to_be_retransmitted() -> None:
    net, client, server = pair()
    stream, accepted = _acknowledged_words(net, client, server)
    dropped: list[bytes] = []

    def drop_first(source: DatagramAddr, destination: DatagramAddr, data: bytes) -> bool:
        if source == client.addr and not dropped:
            dropped.append(data)
            return False
        return True

    net.filters.append(drop_first)
    finish = client.channels.streams.finish_nowait(stream)
    net.run_until(lambda: client.op(finish) is not None, within=1.0)
    assert dropped  # the datagram that carried the FIN never arrived
    started = net.now
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=5.0))
    assert server.read_all(accepted, within=2.0) == b"last words"
    net.run_until(lambda: _stopped(client), within=2.0)
    assert net.now - started < 2.0  # the retransmission's acknowledgement, not the grace
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)))
    assert server.of_type(ConnectionClosed)[0].application_code == 0


def test_shutdown_with_everything_acknowledged_closes_at_once() -> None:
    net, client, server = pair()
    stream, accepted = _acknowledged_words(net, client, server)
    finish = client.channels.streams.finish_nowait(stream)
    assert server.read_all(accepted) == b"last words"
    net.run_for(0.1)  # the FIN's acknowledgement arrives
    assert isinstance(client.op(finish), FinishCompletion)
    started = net.now
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=5.0))
    net.pump()
    assert _stopped(client)
    assert net.now == started


def test_shutdown_deadline_abandons_an_unacknowledged_fin() -> None:
    net, client, server = pair()
    stream, _ = _acknowledged_words(net, client, server)
    net.filters.append(lambda source, destination, data: source != client.addr)
    client.channels.streams.finish_nowait(stream)
    started = net.now
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=0.5))
    net.run_until(lambda: _stopped(client), within=2.0)
    assert 0.5 - 1e-6 <= net.now - started <= 0.55
    assert client.of_type(ConnectionClosed)[0].application_code == 0
