"""``QuicEndpoint`` on the qh3 engine: handshake and PIDs, the PID in every CID, streams over
loss and reordering, Retry, every way client authentication can fail (the in-band proof is
tested as hard as the mutual-TLS path), shutdown and idle timeout."""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).parent))

pytest.importorskip("qh3")

from aioquic._buffer import Buffer
from aioquic.quic.packet import QuicPacketType, pull_quic_header
from cryptography.hazmat.primitives.serialization import Encoding
from hypothesis import given, settings
from hypothesis import strategies as st
from test_endpoint_harness import Net, Node, issue, other_ca
from test_qh3_harness import PrefixAudit, Recording, add, pair

from chrysalis.core import DatagramAddr, Pid
from chrysalis.core.completion import (
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionEstablished,
    ConnectionRef,
    DriverStopped,
    IncomingStream,
    ReceiveCompletion,
    ReceiveStatus,
    SendCompletion,
    SendOutcome,
    StreamRef,
    SubmissionReceipt,
)
from chrysalis.quic import Identity
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._endpoint import (
    AUTHENTICATION_FAILED_CODE,
    Abort,
    Close,
    Connect,
    EndpointRole,
    EndpointState,
    OpenBidi,
    Shutdown,
)
from chrysalis.quic._engines.base import EngineFactory
from chrysalis.quic._engines.client_proof import ProofFailure, sign_client_proof
from chrysalis.quic._engines.qh3 import Qh3Engine


def _read_until_fin(node: Node, stream: StreamRef, capacity: int = 65536) -> bytes:
    out = bytearray()
    while True:
        done = node.wait_op(node.receive(stream, capacity), within=60.0)
        assert isinstance(done, ReceiveCompletion)
        out += done.data()
        if done.status is ReceiveStatus.FIN:
            return bytes(out)
        assert done.status is ReceiveStatus.DATA


def _wait_closed(net: Net, node: Node, conn: ConnectionRef) -> None:
    net.run_until(lambda: any(c.connection == conn for c in node.of_type(ConnectionClosed)))


# --- handshake, PIDs, CIDs, Retry ----------------------------------------------------------------


def test_handshake_establishes_with_the_right_peer_pids_on_both_sides() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    assert client.established(conn) == ConnectionEstablished(conn, client.pid, server.pid)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    (accepted,) = server.of_type(ConnectionEstablished)
    assert (accepted.local_pid, accepted.peer_pid) == (server.pid, client.pid)
    stats = server.endpoint.statistics()
    assert (stats.active_connections, stats.pending_handshakes, stats.retries_sent) == (1, 0, 1)
    assert stats.authentication_failures == 0


def test_untrusted_udp_uses_retry_before_allocating_server_state() -> None:
    net, client, server = pair()
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
    (initial,) = held  # one ClientHello datagram, as aioquic sends
    server.endpoint.receive_datagram(initial, client.addr, net.now)
    stats = server.endpoint.statistics()
    assert (stats.active_connections, stats.pending_handshakes, stats.retries_sent) == (0, 0, 1)
    ((retry, destination),) = server.endpoint.datagrams_to_send(net.now)
    assert destination == client.addr
    header = pull_quic_header(Buffer(data=retry), host_cid_length=20)
    assert header.packet_type is QuicPacketType.RETRY
    client.endpoint.receive_datagram(retry, server.addr, net.now)
    net.run_until(lambda: bool(client.of_type(ConnectionEstablished)))
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    assert server.endpoint.statistics().active_connections == 1


def test_every_datagram_names_the_pid_of_its_receiver_in_both_directions() -> None:
    net = Net(seed=3, loss=0.05, jitter=0.003)
    a = add(net, "a")
    b = add(net, "b")
    audit = PrefixAudit(net)
    for dialler, listener in ((a, b), (b, a)):
        conn = dialler.connect(listener, within=30.0)
        stream = dialler.open(conn)
        dialler.send(stream, bytes(range(256)) * 300)
        dialler.channels.streams.finish_nowait(stream)
        incoming = listener.incoming(within=30.0)
        assert _read_until_fin(listener, incoming) == bytes(range(256)) * 300
        listener.send(incoming, b"reply")
        listener.channels.streams.finish_nowait(incoming)
        assert _read_until_fin(dialler, stream) == b"reply"
        dialler.submit(Close(conn, 3))
        _wait_closed(net, dialler, conn)
    assert audit.checked > 100
    assert net.dropped > 0
    assert audit.violations == []


# --- streams -------------------------------------------------------------------------------------


def test_streams_survive_loss_reordering_and_duplication() -> None:
    net, client, server = pair(seed=11, latency=0.002, loss=0.05, duplicate=0.02, jitter=0.004)
    conn = client.connect(server, within=30.0)
    source = random.Random(5)
    payloads = [source.randbytes(64 * 1024) for _ in range(4)]
    replies = [source.randbytes(8 * 1024) for _ in range(4)]
    streams = [client.open(conn) for _ in payloads]
    sends: list[tuple[SubmissionReceipt, int]] = []
    for stream, payload in zip(streams, payloads, strict=True):
        for start in range(0, len(payload), 20_000):
            chunk = payload[start : start + 20_000]
            sends.append((client.send(stream, chunk), start + len(chunk)))
        client.channels.streams.finish_nowait(stream)
    received: dict[int, bytes] = {}
    for _ in streams:
        incoming = server.incoming(within=30.0)
        received[incoming.stream] = _read_until_fin(server, incoming)
        server.send(incoming, replies[incoming.stream // 4])
        server.channels.streams.finish_nowait(incoming)
    assert [received[s.stream] for s in streams] == payloads
    for stream, reply in zip(streams, replies, strict=True):
        assert _read_until_fin(client, stream, 4096) == reply
    for receipt, end in sends:
        done = client.wait_op(receipt, within=60.0)
        assert isinstance(done, SendCompletion)
        assert (done.outcome, done.acknowledged_through) == (SendOutcome.ACKNOWLEDGED, end)
    assert net.dropped > 0
    assert client.channels.submissions.retained_budget.used == 0


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    loss=st.sampled_from([0.0, 0.05]),
    sizes=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=4),
)
def test_every_send_completes_once_in_order_with_exact_bytes(
    seed: int, loss: float, sizes: list[int]
) -> None:
    _net, client, server = pair(seed=seed, loss=loss, duplicate=loss / 2, jitter=0.003)
    conn = client.connect(server, within=60.0)
    data = random.Random(seed)
    stream = client.open(conn)
    parts = [data.randbytes(size) for size in sizes]
    receipts = [client.send(stream, part) for part in parts]
    client.channels.streams.finish_nowait(stream)
    assert _read_until_fin(server, server.incoming(within=60.0)) == b"".join(parts)
    for receipt in receipts:
        client.wait_op(receipt, within=60.0)
    mine = client.of_type(SendCompletion)
    assert [c.operation for c in mine] == [r.operation for r in receipts]
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    assert [(c.outcome, c.acknowledged_through) for c in mine] == [
        (SendOutcome.ACKNOWLEDGED, end) for end in ends
    ]


def test_server_opened_streams_reach_the_client() -> None:
    net, client, server = pair()
    client.connect(server)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    (accepted,) = server.of_type(ConnectionEstablished)
    stream = server.open(accepted.connection)
    assert stream.stream == 1
    server.send(stream, b"from the server")
    server.channels.streams.finish_nowait(stream)
    incoming = client.incoming()
    assert incoming.stream == 1
    assert _read_until_fin(client, incoming) == b"from the server"


# --- authentication ------------------------------------------------------------------------------


def _refused_by_server(
    client_engine: EngineFactory, *, client_identity: Identity | None = None, within: float = 5.0
) -> tuple[Net, Node, Node, Recording]:
    """A qh3 server (proof timeout 0.5 s) dialled by ``client_engine``; waits until the
    client's connection closed and returns the recording of the server's engine."""
    recording = Recording(Qh3Engine, {"proof_timeout": 0.5})
    net = Net()
    server = add(net, "server", engine=recording, role=EndpointRole.SERVER)
    client = add(
        net,
        "client",
        engine=client_engine,
        role=EndpointRole.CLIENT,
        identity=client_identity,
    )
    conn = client.connect(server, wait=False)
    net.run_until(
        lambda: any(c.connection == conn for c in client.of_type(ConnectionClosed)), within=within
    )
    assert client.of_type(ConnectionClosed) == [
        ConnectionClosed(conn, application_code=AUTHENTICATION_FAILED_CODE)
    ]
    (refused,) = server.of_type(AuthenticationFailed)
    assert (refused.expected, refused.actual) == (None, None)
    assert not server.of_type(ConnectionEstablished)
    assert not server.of_type(IncomingStream)
    assert server.endpoint.statistics().authentication_failures == 1
    return net, client, server, recording


def _builder(identity: Identity) -> Callable[[bytes], bytes]:
    chain = [c.public_bytes(Encoding.DER) for c in identity.chain]
    return lambda exporter: sign_client_proof(identity.private_key, chain, exporter).encode()


def test_authenticated_server_must_match_the_requested_pid() -> None:
    net, client, server = pair()
    wanted = Pid(b"\xa5" * 16)
    conn = client.connect(server, expected=wanted, wait=False)
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)))
    assert client.of_type(AuthenticationFailed) == [AuthenticationFailed(conn, wanted, server.pid)]
    assert client.established(conn) is None
    assert client.of_type(ConnectionClosed) == [
        ConnectionClosed(conn, application_code=AUTHENTICATION_FAILED_CODE)
    ]


def test_server_with_an_untrusted_certificate_is_refused() -> None:
    net, client, server = pair(server_identity=issue(other_ca()))
    conn = client.connect(server, wait=False)
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)))
    assert client.of_type(AuthenticationFailed) == [AuthenticationFailed(conn, server.pid, None)]
    assert not client.of_type(ConnectionEstablished)


def test_client_with_an_untrusted_certificate_is_refused_after_a_valid_proof() -> None:
    stranger = issue(other_ca())
    # It trusts the server and signs correctly, but its leaf comes from an unknown CA.
    identity = Identity(chain=stranger.chain, private_key=stranger.private_key, roots=issue().roots)
    *_, recording = _refused_by_server(Qh3Engine, client_identity=identity)
    (server_conn,) = recording.qh3()
    assert server_conn.proof_failure is None  # the proof held; the chain did not


def test_proof_signed_with_the_wrong_key_is_refused() -> None:
    victim = issue()
    victim_chain = [c.public_bytes(Encoding.DER) for c in victim.chain]
    forger = issue()

    def forged(exporter: bytes) -> bytes:
        return sign_client_proof(forger.private_key, victim_chain, exporter).encode()

    *_, recording = _refused_by_server(functools.partial(Qh3Engine, proof_builder=forged))
    assert [c.proof_failure for c in recording.qh3()] == [ProofFailure.BAD_SIGNATURE]


def test_proof_replayed_from_another_session_is_refused() -> None:
    identity = issue()
    captured: list[bytes] = []
    honest = _builder(identity)

    def recording_builder(exporter: bytes) -> bytes:
        captured.append(honest(exporter))
        return captured[-1]

    net, client, server = pair(
        functools.partial(Qh3Engine, proof_builder=recording_builder), client_identity=identity
    )
    client.connect(server)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    (first,) = captured
    *_, recording = _refused_by_server(
        functools.partial(Qh3Engine, proof_builder=lambda exporter: first),
        client_identity=identity,
    )
    assert [c.proof_failure for c in recording.qh3()] == [ProofFailure.BAD_SIGNATURE]


def test_missing_proof_times_out_and_no_application_stream_is_delivered() -> None:
    recording = Recording(Qh3Engine, {"proof_timeout": 0.5})
    net = Net()
    server = add(net, "server", engine=recording, role=EndpointRole.SERVER)
    silent = functools.partial(Qh3Engine, proof_builder=lambda exporter: None)
    client = add(net, "client", engine=silent, role=EndpointRole.CLIENT)
    conn = client.connect(server)  # the client itself is satisfied with the server
    stream = client.open(conn)
    client.send(stream, b"let me in")
    client.channels.streams.finish_nowait(stream)
    started = net.now
    net.run_for(0.3)
    stats = server.endpoint.statistics()
    assert (stats.active_connections, stats.pending_handshakes) == (1, 1)
    assert not server.completions  # no verdict yet, so nothing at all
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)), within=5.0)
    assert 0.5 <= net.now - started <= 1.0
    assert client.of_type(ConnectionClosed) == [
        ConnectionClosed(conn, application_code=AUTHENTICATION_FAILED_CODE)
    ]
    assert server.of_type(AuthenticationFailed)
    assert not server.of_type(IncomingStream)
    assert [c.proof_failure for c in recording.qh3()] == [ProofFailure.TIMEOUT]
    assert server.endpoint.statistics().pending_handshakes == 0


@pytest.mark.parametrize(
    ("proof", "failure"),
    [
        (b"\x00" * 70_000, ProofFailure.OVERSIZED),
        (b"CCP1\x04\x03\x01\x00\x00\x10truncated", ProofFailure.MALFORMED),
    ],
)
def test_oversized_or_malformed_proofs_are_refused_without_waiting(
    proof: bytes, failure: ProofFailure
) -> None:
    net, _client, _server, recording = _refused_by_server(
        functools.partial(Qh3Engine, proof_builder=lambda exporter: proof), within=0.4
    )
    assert [c.proof_failure for c in recording.qh3()] == [failure]
    assert net.now - 1_800_000_000.0 < 0.4  # well before the 0.5 s proof timeout


# --- lifecycle -----------------------------------------------------------------------------------


def test_graceful_shutdown_lets_queued_work_finish_then_stops() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    stream = client.open(conn)
    sent = client.send(stream, b"z" * 50_000)
    client.channels.streams.finish_nowait(stream)
    client.channels.commands.submit_and_close_nowait(Shutdown(grace=5.0))
    assert _read_until_fin(server, server.incoming()) == b"z" * 50_000
    net.run_until(
        lambda: bool(client.completions) and isinstance(client.completions[-1], DriverStopped),
        within=6.0,
    )
    done = client.op(sent)
    assert isinstance(done, SendCompletion)
    assert done.outcome is SendOutcome.ACKNOWLEDGED
    assert client.endpoint.state is EndpointState.STOPPED
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)))
    assert server.of_type(ConnectionClosed)[0].application_code == 0


def test_abort_returns_every_operation_and_closes_the_peer() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    stream = client.open(conn)
    waiting = client.receive(stream, 64)
    client.channels.commands.submit_and_close_nowait(Abort())
    net.run_until(lambda: client.endpoint.is_stopped, within=1.0)
    closed = client.op(waiting)
    assert isinstance(closed, ReceiveCompletion)
    assert closed.status is ReceiveStatus.CLOSED
    assert isinstance(client.completions[-1], DriverStopped)
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)))


def test_peer_application_close_code_and_idle_timeout_reach_the_application() -> None:
    net, client, server = pair()
    conn = client.connect(server)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    client.submit(Close(conn, 42, "bye"))
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)))
    assert server.of_type(ConnectionClosed)[0].application_code == 42
    idle, a, b = pair(
        client_config=QuicConfig(idle_timeout=1.0), server_config=QuicConfig(idle_timeout=1.0)
    )
    quiet = a.connect(b)
    idle.run_for(3.0)
    assert a.of_type(ConnectionClosed) == [ConnectionClosed(quiet)]
    assert a.endpoint.statistics().active_connections == 0


def test_open_bidi_after_rejection_fails() -> None:
    net, client, server = pair(server_identity=issue(other_ca()))
    conn = client.connect(server, wait=False)
    net.run_until(lambda: bool(client.of_type(AuthenticationFailed)))
    result = client.result(client.submit(OpenBidi(conn)))
    assert not hasattr(result, "stream")


@pytest.mark.parametrize("seed", [12780, 4, 5])
def test_sends_complete_when_reordering_defers_acknowledgement_to_a_quiet_moment(
    seed: int,
) -> None:
    # Heavy reordering makes qh3 declare (spurious) losses, so the engine settles
    # acknowledgements only once nothing is in flight; that moment can come on a timer
    # (pacing), after which the endpoint must look at its sends again.
    _net, client, server = pair(seed=seed, jitter=0.003)
    conn = client.connect(server, within=60.0)
    data = random.Random(seed)
    receipts: list[SubmissionReceipt] = []
    expected: dict[int, bytes] = {}
    for sizes in ([480], [8, 8977, 15582, 17242, 30000], [566, 623]):
        stream = client.open(conn)
        parts = [data.randbytes(size) for size in sizes]
        receipts += [client.send(stream, part) for part in parts]
        client.channels.streams.finish_nowait(stream)
        expected[stream.stream] = b"".join(parts)
    for _ in expected:
        incoming = server.incoming(within=60.0)
        assert _read_until_fin(server, incoming, 8193) == expected[incoming.stream]
    outcomes = [client.wait_op(receipt, within=5.0) for receipt in receipts]
    assert all(
        isinstance(o, SendCompletion) and o.outcome is SendOutcome.ACKNOWLEDGED for o in outcomes
    )
