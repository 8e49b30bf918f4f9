"""QUIC-level keepalive (``QuicConfig.keepalive_interval``) on the sans-IO endpoint.

A silent but live connection must survive its idle timeout when one side pings; a dead peer
must still reach it. Everything runs on the harness's virtual clock, so the timings are exact.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).parent))

import pytest
from test_endpoint_harness import Net, Node

from chrysalis.core import DatagramAddr
from chrysalis.core.completion import ConnectionClosed, ConnectionRef, ReceiveCompletion
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._endpoint import EndpointRole

IDLE = 2.0


def _config(keepalive: float | None) -> QuicConfig:
    return QuicConfig(idle_timeout=IDLE, keepalive_interval=keepalive)


def _pair(
    engine: str, client_keepalive: float | None, server_keepalive: float | None = None
) -> tuple[Net, Node, Node]:
    """A client (pinging every ``client_keepalive`` seconds of silence, or never) and a
    server (by default never pinging on its own), with the same idle timeout."""
    net = Net()
    client_config, server_config = _config(client_keepalive), _config(server_keepalive)
    if engine == "aioquic":
        client = net.add("client", role=EndpointRole.CLIENT, config=client_config)
        server = net.add("server", role=EndpointRole.SERVER, config=server_config)
    else:
        pytest.importorskip("qh3")
        from test_qh3_harness import add  # skips with its module when qh3 is absent

        client = add(net, "client", role=EndpointRole.CLIENT, config=client_config)
        server = add(net, "server", role=EndpointRole.SERVER, config=server_config)
    return net, client, server


def _closed(node: Node) -> list[ConnectionClosed]:
    return node.of_type(ConnectionClosed)


@pytest.mark.parametrize("value", [0.0, -1.0, IDLE, IDLE + 1.0])
def test_keepalive_interval_must_be_positive_and_below_the_idle_timeout(value: float) -> None:
    with pytest.raises(ValueError, match="keepalive_interval"):
        QuicConfig(idle_timeout=IDLE, keepalive_interval=value)


def test_keepalive_interval_type_is_checked() -> None:
    with pytest.raises(TypeError, match="keepalive_interval"):
        QuicConfig(keepalive_interval="1")  # type: ignore[arg-type]


def test_without_keepalive_a_silent_connection_idles_out() -> None:
    net, client, server = _pair("aioquic", None)
    conn = client.connect(server)
    net.run_for(3 * IDLE)
    assert _closed(client) == [ConnectionClosed(conn)]
    assert len(_closed(server)) == 1
    assert client.endpoint.statistics().keepalive_pings == 0


@pytest.mark.parametrize("engine", ["aioquic", "qh3"])
def test_keepalive_keeps_a_silent_connection_alive_on_both_sides(engine: str) -> None:
    net, client, server = _pair(engine, 0.5)
    conn = client.connect(server)
    sent_before = net.sent
    net.run_for(10 * IDLE)
    assert _closed(client) == []
    assert _closed(server) == []
    # One PING per interval of silence (each answered by one ACK): 20 s / 0.5 s, give or
    # take the first interval and the ACK delay.
    pings = client.endpoint.statistics().keepalive_pings
    assert 35 <= pings <= 41, pings
    assert net.sent - sent_before <= 2 * pings + 4  # PINGs and their ACKs, nothing else
    assert server.endpoint.statistics().keepalive_pings == 0
    # The connection still carries data both ways.
    stream = client.open(conn)
    client.send(stream, b"still here")
    incoming = server.incoming()
    got = server.wait_op(server.receive(incoming, 64))
    assert isinstance(got, ReceiveCompletion)
    assert bytes(got.data()) == b"still here"


def test_traffic_postpones_the_pings() -> None:
    net, client, server = _pair("aioquic", 0.5)
    conn = client.connect(server)
    stream = client.open(conn)
    incoming: object = None
    for _ in range(20):  # a datagram from the server every 0.25 s: never 0.5 s of silence
        client.send(stream, b"x")
        if incoming is None:
            incoming = server.incoming()
        net.run_for(0.25)
    assert client.endpoint.statistics().keepalive_pings == 0
    net.run_for(2.0)
    assert client.endpoint.statistics().keepalive_pings >= 3


def test_a_dead_peer_still_reaches_the_idle_timeout() -> None:
    net, client, server = _pair("aioquic", 0.5)
    conn = client.connect(server)
    net.run_for(1.0)
    dead_at = net.now
    server_addr: DatagramAddr = server.addr
    net.filters.append(lambda source, destination, data: server_addr not in (source, destination))
    net.run_until(lambda: bool(_closed(client)), within=3 * IDLE)
    assert _closed(client) == [ConnectionClosed(conn)]  # silently: an idle timeout
    # Pinging does not extend the idle timeout past the last sign of life (plus at most one
    # interval: the first PING after it restarts the timer, RFC 9000 section 10.1).
    assert net.now - dead_at <= IDLE + 0.5 + 0.01
    assert client.endpoint.statistics().keepalive_pings >= 1


def _stop(net: Net, node: Node, seconds: float) -> list[tuple[DatagramAddr, bytes]]:
    """Stop ``node`` (``SIGSTOP``) while the network runs ``seconds``: nothing is delivered to
    it and none of its timers fires. It runs again on return; the result is what waits in its
    socket (source, datagram), which a driver reads before it fires the timers now due."""
    queued: list[tuple[DatagramAddr, bytes]] = []
    addr: DatagramAddr = node.addr

    def queue(source: DatagramAddr, destination: DatagramAddr, data: bytes) -> None:
        if destination == addr:
            queued.append((source, data))

    net.observers.append(queue)
    del net.nodes[addr]
    net.run_for(seconds)
    net.observers.remove(queue)
    net.nodes[addr] = node
    return queued


def _request(engine: str, keepalive: float | None) -> tuple[Net, Node, Node, ConnectionRef]:
    """A client and a server (both pinging every ``keepalive``), and a request the client
    sent on a new connection (its acknowledgement not yet delivered)."""
    net, client, server = _pair(engine, keepalive, keepalive)
    conn = client.connect(server)
    client.send(client.open(conn), b"request")
    net.pump()
    return net, client, server, conn


@pytest.mark.parametrize("engine", ["aioquic", "qh3"])
def test_a_process_stopped_past_its_idle_timeout_ends_the_connection_when_it_resumes(
    engine: str,
) -> None:
    """A process stopped (``SIGSTOP``, starved) for longer than the idle timeout reads, when it
    runs again, the datagrams queued meanwhile before its timers fire (a driver reads first).
    Those must not revive the connection the peer has discarded: fed first, they restarted
    the idle timer and their acknowledgements, late by the whole stop, inflated the RTT and
    with it the idle timeout's floor of three PTOs (38 s measured after a 10 s stop). The
    connection ends (idle) with the first of them; they are dropped."""
    net, client, server, conn = _request(engine, 0.5)
    queued = _stop(net, client, 3 * IDLE)
    assert len(_closed(server)) == 1  # the peer idled out and forgot the connection
    assert queued  # its acknowledgement and PINGs wait in the stopped process's socket
    for source, data in queued:  # resumed: the queued datagrams are read first
        client.endpoint.receive_datagram(data, source, net.now)
    net.pump()
    assert _closed(client) == [ConnectionClosed(conn)]  # at once, not one idle timeout later


@pytest.mark.parametrize("engine", ["aioquic", "qh3"])
def test_a_process_stopped_past_its_idle_timeout_reports_an_idle_close_when_its_timer_fires_first(
    engine: str,
) -> None:
    """The same stop, with the timer fired before the queued datagrams are read: the
    connection ends idle (no code), although the engine's earliest timer at the stop was an
    acknowledgement's (qh3's core then ends the connection with error 1, "Idle timeout", which
    the engine reported as a transport error)."""
    net, client, _server, conn = _request(engine, 0.5)
    _stop(net, client, 3 * IDLE)
    client.endpoint.handle_timer(net.now)  # resumed: its timer fires first this time
    net.pump()
    assert _closed(client) == [ConnectionClosed(conn)]


def test_qh3_a_process_stopped_below_its_idle_timeout_reads_before_its_overdue_timers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shorter stop: the client's loss and ACK timers fell due meanwhile, its idle deadline
    did not. The queued datagrams go in first and the driver fires those timers after them,
    as before the change (fired first, a late driver would send probes, or declare losses,
    that the datagrams refute); only the idle or closing deadline is fired before a read."""
    net, client, server, conn = _request("qh3", None)
    engine = client.endpoint._conns[conn].engine
    due = engine.get_timer()
    queued = _stop(net, client, IDLE / 4)
    assert due is not None
    assert due < net.now  # a timer fell due during the stop
    assert queued
    fired: list[float] = []
    handle_timer = engine.handle_timer

    def spy(now: float) -> None:
        fired.append(now)
        handle_timer(now)

    monkeypatch.setattr(engine, "handle_timer", spy)
    for source, data in queued:
        client.endpoint.receive_datagram(data, source, net.now)
    assert fired == []  # the datagrams went in before the overdue timers
    net.pump()
    assert _closed(client) == []
    assert _closed(server) == []
