"""Handshake and PID authentication, stateless Retry before any server state, Retry token
rules at the endpoint, admission limits, roles, and malformed datagrams."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).parent))

from aioquic._buffer import Buffer
from aioquic.quic.packet import QuicPacketType, pull_quic_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_endpoint_harness import (
    T0,
    Net,
    Node,
    issue,
    other_ca,
    pair,
)

from chrysalis.core import DatagramAddr, Pid
from chrysalis.core.completion import (
    AuthenticationFailed,
    CommandCompletion,
    CommandError,
    CommandFailed,
    ConnectionClosed,
    ConnectionCreated,
    ConnectionEstablished,
)
from chrysalis.quic import Identity
from chrysalis.quic._config import EndpointLimits
from chrysalis.quic._endpoint import (
    AUTHENTICATION_FAILED_CODE,
    Connect,
    EndpointRole,
)


def _header_type(data: bytes) -> QuicPacketType:
    return pull_quic_header(Buffer(data=data), host_cid_length=20).packet_type


def _capture_first_flight(net: Net, client: Node, server: Node) -> list[bytes]:
    """Dial and hold back every client datagram; return what the client sent."""
    held: list[bytes] = []

    def hold(source: DatagramAddr, destination: DatagramAddr, data: bytes) -> bool:
        if source == client.addr:
            held.append(data)
            return False
        return True

    net.filters.append(hold)
    client.submit(Connect(route=server.pid, peer=server.addr, expected=server.pid))
    net.run_until(lambda: bool(held))
    net.filters.remove(hold)
    return held


def test_handshake_establishes_with_the_right_peer_pids_on_both_sides() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    assert client.established(conn) == ConnectionEstablished(conn, client.pid, server.pid)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    (accepted,) = server.of_type(ConnectionEstablished)
    assert (accepted.local_pid, accepted.peer_pid) == (server.pid, client.pid)
    stats = server.endpoint.statistics()
    assert (stats.active_connections, stats.pending_handshakes, stats.retries_sent) == (1, 0, 1)


def test_untrusted_udp_uses_retry_before_allocating_server_state() -> None:
    net, client, server = pair()
    (initial,) = _capture_first_flight(net, client, server)
    assert _header_type(initial) is QuicPacketType.INITIAL
    server.endpoint.receive_datagram(initial, client.addr, net.now)
    stats = server.endpoint.statistics()
    assert (stats.active_connections, stats.pending_handshakes) == (0, 0)
    assert stats.retries_sent == 1
    (retry, destination), *rest = server.endpoint.datagrams_to_send(net.now)
    assert not rest
    assert destination == client.addr
    assert _header_type(retry) is QuicPacketType.RETRY
    client.endpoint.receive_datagram(retry, server.addr, net.now)
    net.run_until(lambda: bool(client.of_type(ConnectionEstablished)))
    (created,) = [
        c.result
        for c in client.of_type(CommandCompletion)
        if isinstance(c.result, ConnectionCreated)
    ]
    assert client.established(created.connection) is not None
    assert server.endpoint.statistics().active_connections == 1


def _token_initial(net: Net, client: Node, server: Node) -> bytes:
    """Let the Retry happen, then capture the client's Initial that echoes the token."""
    (initial,) = _capture_first_flight(net, client, server)
    server.endpoint.receive_datagram(initial, client.addr, net.now)
    ((retry, _),) = server.endpoint.datagrams_to_send(net.now)
    held: list[bytes] = []

    def hold(source: DatagramAddr, destination: DatagramAddr, data: bytes) -> bool:
        if source == client.addr:
            held.append(data)
            return False
        return True

    net.filters.append(hold)
    client.endpoint.receive_datagram(retry, server.addr, net.now)
    net.run_until(lambda: bool(held))
    net.filters.remove(hold)
    header = pull_quic_header(Buffer(data=held[0]), host_cid_length=20)
    assert header.token
    return held[0]


def test_tampered_expired_or_moved_retry_tokens_allocate_nothing() -> None:
    net, client, server = pair()
    echoed = _token_initial(net, client, server)
    token = pull_quic_header(Buffer(data=echoed), host_cid_length=20).token
    at = echoed.index(token)
    tampered = bytearray(echoed)
    tampered[at + 5] ^= 0x01
    endpoint = server.endpoint
    endpoint.receive_datagram(bytes(tampered), client.addr, net.now)
    endpoint.receive_datagram(echoed, DatagramAddr.inproc(1, 99), net.now)
    endpoint.receive_datagram(echoed, client.addr, net.now + 121.0)
    stats = endpoint.statistics()
    assert stats.invalid_retry_tokens == 3
    assert (stats.active_connections, stats.pending_handshakes) == (0, 0)
    # The genuine echo, in time and from the right source, is admitted.
    endpoint.receive_datagram(echoed, client.addr, net.now)
    stats = endpoint.statistics()
    assert (stats.active_connections, stats.pending_handshakes) == (1, 1)


def test_admission_limits_pending_handshakes_to_one_at_a_time() -> None:
    net = Net()
    server = net.add(
        "server",
        role=EndpointRole.SERVER,
        limits=EndpointLimits(max_pending_handshakes=1),
    )
    clients = [net.add(f"c{i}", role=EndpointRole.CLIENT) for i in range(3)]
    for client in clients:
        client.submit(Connect(route=server.pid, peer=server.addr, expected=server.pid))
    peak = 0

    def all_established() -> bool:
        nonlocal peak
        peak = max(peak, server.endpoint.statistics().pending_handshakes)
        return all(c.of_type(ConnectionEstablished) for c in clients) and (
            len(server.of_type(ConnectionEstablished)) == 3
        )

    net.run_until(all_established, within=20.0)
    assert peak == 1
    assert server.endpoint.statistics().admission_rejections >= 1
    assert len(server.of_type(ConnectionEstablished)) == 3


def test_admission_limits_connections_per_source_ip_not_per_port() -> None:
    net = Net()
    server = net.add(
        "server",
        role=EndpointRole.SERVER,
        limits=EndpointLimits(max_connections_per_source=1),
        addr=DatagramAddr.udp("10.0.0.100", 4433),
    )
    first = net.add("a", role=EndpointRole.CLIENT, addr=DatagramAddr.udp("10.0.0.1", 1000))
    same_ip = net.add("b", role=EndpointRole.CLIENT, addr=DatagramAddr.udp("10.0.0.1", 1001))
    other_ip = net.add("c", role=EndpointRole.CLIENT, addr=DatagramAddr.udp("10.0.0.2", 1000))
    first.connect(server)
    other_ip.connect(server)
    blocked = same_ip.connect(server, wait=False)
    net.run_for(2.0)
    assert same_ip.established(blocked) is None
    assert server.endpoint.statistics().admission_rejections >= 1
    assert server.endpoint.statistics().active_connections == 2


def test_client_connection_limit_fails_the_connect_command() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER)
    client = net.add("client", role=EndpointRole.CLIENT, limits=EndpointLimits(max_connections=1))
    client.connect(server)
    result = client.result(client.submit(Connect(route=server.pid, peer=server.addr)))
    assert isinstance(result, CommandFailed)
    assert result.error is CommandError.TRANSPORT
    assert client.endpoint.statistics().admission_rejections == 1


def test_authenticated_peer_must_match_the_requested_pid() -> None:
    net, client, server = pair()
    wanted = Pid(b"\xa5" * 16)
    conn = client.connect(server, expected=wanted, wait=False)
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)))
    assert client.of_type(AuthenticationFailed) == [AuthenticationFailed(conn, wanted, server.pid)]
    assert client.established(conn) is None
    assert client.of_type(ConnectionClosed) == [
        ConnectionClosed(conn, application_code=AUTHENTICATION_FAILED_CODE)
    ]
    assert client.endpoint.statistics().authentication_failures == 1
    # The client closed before sending its Finished: the server never reached a verdict, so
    # its half-open connection ends without any event the application would have to handle.
    net.run_until(lambda: server.endpoint.statistics().active_connections == 0, within=60.0)
    assert not server.completions


def test_server_with_an_untrusted_certificate_is_refused() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER, identity=issue(other_ca()))
    client = net.add("client", role=EndpointRole.CLIENT)
    conn = client.connect(server, wait=False)
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)))
    assert client.of_type(AuthenticationFailed) == [AuthenticationFailed(conn, server.pid, None)]
    assert not client.of_type(ConnectionEstablished)


def test_client_with_an_untrusted_certificate_is_refused_by_the_server() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER)
    stranger = issue(other_ca())
    # The client trusts the server, but its own leaf comes from a CA the server does not know.
    identity = Identity(chain=stranger.chain, private_key=stranger.private_key, roots=issue().roots)
    client = net.add("client", role=EndpointRole.CLIENT, identity=identity)
    conn = client.connect(server, wait=False)
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)))
    (refused,) = server.of_type(AuthenticationFailed)
    assert (refused.expected, refused.actual) == (None, None)
    assert not server.of_type(ConnectionEstablished)
    assert client.of_type(ConnectionClosed) == [
        ConnectionClosed(conn, application_code=AUTHENTICATION_FAILED_CODE)
    ]


def test_ip_literal_is_verified_against_ip_address_san() -> None:
    net, client, server = pair()
    good = client.connect(server, server_name="127.0.0.1")
    assert client.established(good) is not None
    bad = client.connect(server, server_name="10.9.9.9", wait=False)
    net.run_until(lambda: any(f.connection == bad for f in client.of_type(AuthenticationFailed)))
    assert client.established(bad) is None


def test_roles_restrict_dialling_and_accepting() -> None:
    net, client, server = pair()
    result = server.result(server.submit(Connect(route=client.pid, peer=client.addr)))
    assert isinstance(result, CommandFailed)
    assert result.error is CommandError.WRONG_ROLE
    (initial,) = _capture_first_flight(net, net.add("x", role=EndpointRole.CLIENT), server)
    client.endpoint.receive_datagram(initial, server.addr, net.now)
    assert client.endpoint.statistics().routing_errors == 1
    assert client.endpoint.statistics().active_connections == 0


def test_malformed_datagram_does_not_interrupt_a_later_connection() -> None:
    net, client, server = pair()
    endpoint = server.endpoint
    endpoint.receive_datagram(b"", client.addr, net.now)
    endpoint.receive_datagram(bytes([0x40, 1, 2, 3]), client.addr, net.now)
    endpoint.receive_datagram(bytes([0xC0, 0, 0, 0, 1, 20]) + bytes(10), client.addr, net.now)
    endpoint.receive_datagram(bytes([0xC0, 0, 0, 0, 1, 8]) + bytes(40), client.addr, net.now)
    stats = endpoint.statistics()
    assert stats.routing_errors + stats.parse_errors == 4
    assert stats.active_connections == 0
    assert client.established(client.connect(server)) is not None


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.one_of(
        st.binary(max_size=1400),
        st.binary(min_size=30, max_size=1400).map(lambda b: bytes([0xC0, 0, 0, 0, 1, 20]) + b),
        st.binary(min_size=21, max_size=300).map(lambda b: bytes([0x40]) + b),
    )
)
def test_arbitrary_datagrams_never_raise_and_create_no_connection(data: bytes) -> None:
    net, _client, server = _FUZZ
    before = server.endpoint.statistics().active_connections
    server.endpoint.receive_datagram(data, DatagramAddr.inproc(5, 5), net.now)
    server.endpoint.poll(net.now)
    server.endpoint.datagrams_to_send(net.now)
    assert server.endpoint.statistics().active_connections == before


def _fuzz_pair() -> tuple[Net, Node, Node]:
    net, client, server = pair()
    client.connect(server)
    return net, client, server


_FUZZ = _fuzz_pair()


def test_corrupted_copies_of_real_datagrams_leave_the_connection_working() -> None:
    net, client, server = pair()
    seen: list[bytes] = []
    net.observers.append(lambda s, d, data: seen.append(data) if d == server.addr else None)
    conn = client.connect(server)
    assert seen
    for index, data in enumerate(seen):
        corrupted = bytearray(data)
        corrupted[(index * 7) % len(corrupted)] ^= 0x10
        corrupted[-1] ^= 0x01
        server.endpoint.receive_datagram(bytes(corrupted), client.addr, net.now)
    net.run_for(0.5)
    stats = server.endpoint.statistics()
    assert (stats.active_connections, stats.pending_handshakes) == (1, 0)
    assert not client.of_type(ConnectionClosed)
    assert client.established(conn) is not None
    assert T0 <= net.now
