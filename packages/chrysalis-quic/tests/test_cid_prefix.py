"""Every datagram on the wire names, in its destination CID prefix, the PID of the process that
terminates it, for the whole connection lifetime in both directions (spec 1.4, invariant 2)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).parent))

from aioquic._buffer import Buffer
from aioquic.quic.packet import QuicPacketType, pull_quic_header
from hypothesis import given, settings
from hypothesis import strategies as st
from test_endpoint_harness import Net, Node, issue

from chrysalis.core import (
    INITIAL_SUFFIX_FLAG,
    ConnectionId,
    DatagramAddr,
    Pid,
    target_pid,
)
from chrysalis.core.completion import (
    ConnectionClosed,
    ConnectionCreated,
    ConnectionEstablished,
    SendCompletion,
)
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._endpoint import Close, Connect, EndpointRole


class _PrefixAudit:
    """Checks each datagram's DCID prefix against the PID its receiver terminates."""

    def __init__(self, net: Net, expected: dict[DatagramAddr, set[Pid]] | None = None) -> None:
        self.net = net
        self.expected = expected
        self.checked = 0
        self.kinds: set[QuicPacketType] = set()
        self.violations: list[tuple[DatagramAddr, Pid | None]] = []
        net.observers.append(self)

    def __call__(self, source: DatagramAddr, destination: DatagramAddr, data: bytes) -> None:
        self.checked += 1
        if data[0] & 0x80:
            self.kinds.add(pull_quic_header(Buffer(data=data), host_cid_length=20).packet_type)
        else:
            self.kinds.add(QuicPacketType.ONE_RTT)
        owner = self.net.nodes[destination]
        allowed = (
            {owner.endpoint.routing_pid} if self.expected is None else self.expected[destination]
        )
        prefix = target_pid(data)
        if prefix not in allowed:
            self.violations.append((destination, prefix))


def _exchange(client: Node, server: Node, *, size: int) -> None:
    conn = client.connect(server)
    stream = client.open(conn)
    client.send(stream, bytes(range(256)) * (size // 256))
    client.channels.streams.finish_nowait(stream)
    incoming = server.incoming()
    assert len(server.read_all(incoming)) == size // 256 * 256
    server.send(incoming, b"reply")
    server.channels.streams.finish_nowait(incoming)
    assert client.read_all(stream) == b"reply"
    client.submit(Close(conn, 3))
    client.net.run_until(
        lambda: any(c.connection == conn for c in client.of_type(ConnectionClosed))
    )


def test_every_datagram_is_addressed_to_the_pid_that_terminates_it() -> None:
    net = Net(seed=3, loss=0.05, jitter=0.003)
    a = net.add("a", role=EndpointRole.DUPLEX)
    b = net.add("b", role=EndpointRole.DUPLEX)
    audit = _PrefixAudit(net)
    _exchange(a, b, size=100_000)  # a dials b
    _exchange(b, a, size=30_000)  # and b dials a on the same endpoints
    net.run_for(2.0)  # closing periods, retransmissions, late acknowledgements
    assert audit.violations == []
    assert audit.checked > 100
    # (Handshake packets travel coalesced behind Initials; the prefix is the first packet's.)
    assert {QuicPacketType.INITIAL, QuicPacketType.RETRY, QuicPacketType.ONE_RTT} <= audit.kinds


def test_cids_have_the_documented_layout() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER)
    client = net.add("client", role=EndpointRole.CLIENT)
    headers = []

    def capture(source: DatagramAddr, destination: DatagramAddr, data: bytes) -> None:
        if data[0] & 0x80:
            headers.append((source, pull_quic_header(Buffer(data=data), host_cid_length=20)))

    net.observers.append(capture)
    client.connect(server)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    net.run_for(0.05)  # the spare CIDs travel in the first 1-RTT packets
    first_source, first = headers[0]
    assert first_source == client.addr
    assert first.packet_type is QuicPacketType.INITIAL
    dcid = ConnectionId.from_bytes(first.destination_cid)
    assert dcid.pid == server.pid
    assert dcid.is_initial
    assert dcid.suffix & INITIAL_SUFFIX_FLAG
    assert 1 <= dcid.suffix & ~INITIAL_SUFFIX_FLAG <= 1 << 30  # a random start below 2^30
    scid = ConnectionId.from_bytes(first.source_cid)
    assert (scid.pid, scid.is_initial) == (client.pid, False)
    (retry,) = [h for s, h in headers if h.packet_type is QuicPacketType.RETRY]
    retry_cid = ConnectionId.from_bytes(retry.source_cid)
    assert (retry_cid.pid, retry_cid.is_initial) == (server.pid, False)
    assert retry.destination_cid == first.source_cid
    # Every routed CID (issued ones included) carries its endpoint's PID and a key with the
    # top bit clear, and no key is used twice within an endpoint.
    for node in (client, server):
        cids = [ConnectionId.from_bytes(cid) for cid in node.endpoint._routes]
        assert len(cids) >= 2
        assert all(cid.pid == node.pid and not cid.is_initial for cid in cids)
        assert len({cid.suffix for cid in cids}) == len(cids)


def test_source_override_prefixes_our_cids_and_still_routes() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER)
    client = net.add("client", role=EndpointRole.CLIENT)
    alias = Pid(b"\x42" * 16)
    audit = _PrefixAudit(net, {client.addr: {alias}, server.addr: {server.pid}})
    result = client.result(
        client.submit(
            Connect(route=server.pid, peer=server.addr, expected=server.pid, source=alias)
        )
    )
    assert isinstance(result, ConnectionCreated)
    conn = result.connection
    net.run_until(lambda: client.established(conn) is not None)
    established = client.established(conn)
    assert established == ConnectionEstablished(conn, alias, server.pid)
    stream = client.open(conn)
    assert isinstance(client.wait_op(client.send(stream, b"via alias")), SendCompletion)
    assert audit.violations == []
    assert audit.checked > 5


def test_link_local_endpoints_route_by_the_zero_pid() -> None:
    net = Net()
    server = net.add("server", role=EndpointRole.SERVER, routing_pid=Pid.LINK_LOCAL)
    client = net.add("client", role=EndpointRole.CLIENT, routing_pid=Pid.LINK_LOCAL)
    audit = _PrefixAudit(net)
    conn = client.connect(server, route=Pid.LINK_LOCAL)
    assert client.established(conn) == ConnectionEstablished(conn, Pid.LINK_LOCAL, server.pid)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    (accepted,) = server.of_type(ConnectionEstablished)
    assert (accepted.local_pid, accepted.peer_pid) == (Pid.LINK_LOCAL, client.pid)
    assert audit.violations == []
    assert audit.checked > 3


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    loss=st.sampled_from([0.0, 0.1, 0.2]),
    duplicate=st.sampled_from([0.0, 0.1]),
)
def test_prefix_invariant_holds_under_any_fault_schedule(
    seed: int, loss: float, duplicate: float
) -> None:
    net = Net(seed=seed, loss=loss, duplicate=duplicate, jitter=0.004)
    client = net.add("client", role=EndpointRole.CLIENT)
    server = net.add("server", role=EndpointRole.SERVER)
    audit = _PrefixAudit(net)
    conn = client.connect(server, within=60.0)
    stream = client.open(conn)
    client.wait_op(client.send(stream, b"q" * 20_000), within=60.0)
    assert audit.violations == []


def test_a_restarted_endpoint_on_the_same_address_is_not_routed_to_the_old_one() -> None:
    """A process that comes back with its identity on its address (a scale worker restarted
    after a kill -9) dials afresh: its first Initial must not repeat the last incarnation's
    (same DCID, SCID and source), or the server feeds it to the dead incarnation's connection
    until that one idles out. Initial nonces start at a random point, and count up from it."""
    net = Net()
    # Without Retry (as between local processes, where addresses need no validation): with it,
    # the connection is keyed by the server's Retry CID, fresh for every attempt.
    server = net.add("server", role=EndpointRole.SERVER, config=QuicConfig(retry=False))
    identity = issue()
    first_dcids: list[bytes] = []

    def capture(source: DatagramAddr, destination: DatagramAddr, data: bytes) -> None:
        if data[0] & 0x80:
            header = pull_quic_header(Buffer(data=data), host_cid_length=20)
            if header.packet_type is QuicPacketType.INITIAL and source != server.addr:
                first_dcids.append(header.destination_cid)

    net.observers.append(capture)
    old = net.add("old", role=EndpointRole.CLIENT, identity=identity)
    old.connect(server)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    old_dcid = first_dcids[0]
    # The old incarnation dies without a word (the server keeps its connection until it idles
    # out, 30 s); the new one binds the same address with its own entropy.
    del net.nodes[old.addr]
    new = net.add("new", role=EndpointRole.CLIENT, identity=identity, addr=old.addr, seed=99)
    new.connect(server)
    net.run_until(lambda: len(server.of_type(ConnectionEstablished)) == 2, within=2.0)
    assert first_dcids[-1] != old_dcid
