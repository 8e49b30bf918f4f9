"""The qh3 engine on its own, two connections back to back: endpoint-chosen CIDs, the in-band
client proof (and when it is not asked for), the exporter both sides share, the receive gate,
the acknowledgement estimate, termination kinds, address and identity limits."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.append(str(Path(__file__).parent))

pytest.importorskip("qh3")

from aioquic.quic.crypto import CryptoPair
from aioquic.quic.packet import QuicFrameType, QuicPacketType
from aioquic.quic.packet_builder import QuicPacketBuilder
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from test_endpoint_harness import T0, issue

from chrysalis.core import ConnectionId, DatagramAddr, Pid, target_pid
from chrysalis.quic import Identity
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._engines.aioquic import AioquicEngine
from chrysalis.quic._engines.base import (
    CidIssued,
    EngineConnection,
    EngineEvent,
    HandshakeCompleted,
    StreamDataReceived,
    StreamResetReceived,
    Terminated,
    TerminationKind,
)
from chrysalis.quic._engines.client_proof import PROOF_STREAM_ID, ExporterTap, ProofFailure
from chrysalis.quic._engines.qh3 import AioquicProvingEngine, Qh3Connection, Qh3Engine
from chrysalis.quic._identity import IdentityError

CLIENT_ADDR = DatagramAddr.inproc(3, 1)
SERVER_ADDR = DatagramAddr.inproc(3, 2)
Factory = Callable[..., Any]


class _Pair:
    """A client and a server engine connection joined back to back, with optional seeded
    loss and reordering (a datagram is held back one round)."""

    def __init__(
        self,
        config: QuicConfig | None = None,
        *,
        client: Factory = Qh3Engine,
        server: Factory = Qh3Engine,
        client_options: dict[str, Any] | None = None,
        server_options: dict[str, Any] | None = None,
        loss: float = 0.0,
        reorder: float = 0.0,
        seed: int = 0,
    ) -> None:
        cfg = QuicConfig() if config is None else config
        self.client_id, self.server_id = issue(), issue()
        client_keys, server_keys = itertools.count(1), itertools.count(1)
        self.client_pid, self.server_pid = self.client_id.pid, self.server_id.pid

        def client_cid() -> bytes:
            return ConnectionId.issued(self.client_pid, next(client_keys)).raw

        def server_cid() -> bytes:
            return ConnectionId.issued(self.server_pid, next(server_keys)).raw

        self.now = T0
        initial_dcid = ConnectionId.initial(self.server_pid, 1).raw
        self.client: EngineConnection = client(
            cfg, self.client_id, **(client_options or {})
        ).connect(
            host_cid=client_cid(),
            initial_dcid=initial_dcid,
            addr=SERVER_ADDR,
            server_name=None,
            issue_cid=client_cid,
            now=self.now,
        )
        self.server: EngineConnection = server(
            cfg, self.server_id, **(server_options or {})
        ).accept(
            host_cid=server_cid(),
            original_dcid=initial_dcid,
            retry_scid=None,
            issue_cid=server_cid,
        )
        self.events: dict[str, list[EngineEvent]] = {"client": [], "server": []}
        self.prefixes: list[tuple[str, Pid | None]] = []
        self.received = 0  # stream bytes the server delivered
        self.random = random.Random(seed)
        self.loss, self.reorder = loss, reorder
        self.held: list[tuple[str, bytes]] = []
        self.on_server_event: Callable[[EngineEvent], None] | None = None
        self.drop: Callable[[str, bytes], bool] | None = None  # True: lose this datagram

    def _carry(self, direction: str, data: bytes) -> None:
        if direction == "to server":
            self.server.receive_datagram(data, CLIENT_ADDR, self.now)
        else:
            self.client.receive_datagram(data, SERVER_ADDR, self.now)

    def step(self, rounds: int = 1, dt: float = 0.005) -> None:
        for _ in range(rounds):
            late, self.held = self.held, []
            for direction, conn in (("to server", self.client), ("to client", self.server)):
                for data, _ in conn.datagrams_to_send(self.now):
                    self.prefixes.append((direction, target_pid(data)))
                    if self.drop is not None and self.drop(direction, data):
                        continue
                    roll = self.random.random()
                    if roll < self.loss:
                        continue
                    if roll < self.loss + self.reorder:
                        self.held.append((direction, data))
                        continue
                    self._carry(direction, data)
            for direction, data in late:
                self._carry(direction, data)
            self.now += dt
            for name, conn in (("client", self.client), ("server", self.server)):
                timer = conn.get_timer()
                if timer is not None and timer <= self.now:
                    conn.handle_timer(self.now)
                while (event := conn.next_event()) is not None:
                    self.events[name].append(event)
                    if name == "server" and isinstance(event, StreamDataReceived):
                        self.received += len(event.data)
                    if name == "server" and self.on_server_event is not None:
                        self.on_server_event(event)

    def of(self, name: str, kind: type) -> list[Any]:
        return [e for e in self.events[name] if isinstance(e, kind)]

    def prefixes_ok(self) -> bool:
        expected = {"to server": self.server_pid, "to client": self.client_pid}
        return all(prefix == expected[d] for d, prefix in self.prefixes)


def test_handshake_uses_endpoint_cids_and_proves_the_client_in_band() -> None:
    pair = _Pair()
    pair.step(10)
    assert pair.of("client", HandshakeCompleted) == [HandshakeCompleted("chrysalis/1")]
    assert pair.of("server", HandshakeCompleted) == [HandshakeCompleted("chrysalis/1")]
    assert pair.prefixes
    assert pair.prefixes_ok()
    server = pair.server
    assert isinstance(server, Qh3Connection)
    assert Pid.from_certificate(server.peer_certificate_chain()[0]) == pair.client_pid
    assert Pid.from_certificate(pair.client.peer_certificate_chain()[0]) == pair.server_pid
    assert server.proof_failure is None
    # qh3's core issues exactly one spare CID per side, drawn at random (not PID-prefixed).
    assert len(pair.of("client", CidIssued)) == len(pair.of("server", CidIssued)) == 1
    assert pair.client.peer_packet_seen
    assert server.peer_packet_seen


def test_both_ends_derive_the_same_exporter_and_each_session_its_own() -> None:
    values = []
    for client in (Qh3Engine, AioquicProvingEngine):
        pair = _Pair(client=client)
        pair.step(10)
        taps: list[ExporterTap] = []
        for conn in (pair.client, pair.server):
            tap = conn._ch_tap if isinstance(conn, Qh3Connection) else conn._tap  # type: ignore[attr-defined]
            taps.append(tap)
        client_value, server_value = (tap.exporter() for tap in taps)
        assert client_value is not None
        assert client_value == server_value
        values.append(server_value)
    assert values[0] != values[1]


def test_server_announces_the_handshake_only_once_the_proof_is_judged() -> None:
    pair = _Pair(
        client_options={"proof_builder": lambda exporter: None},
        server_options={"proof_timeout": 0.5},
    )
    pair.step(40)  # 0.2 s: handshake done, no proof
    assert pair.of("client", HandshakeCompleted)
    assert not pair.of("server", HandshakeCompleted)
    server = pair.server
    assert isinstance(server, Qh3Connection)
    assert server.peer_certificate_chain() == []
    deadline = server.get_timer()
    assert deadline is not None
    assert deadline <= pair.now + 0.5
    pair.step(200)
    assert pair.of("server", HandshakeCompleted) == [HandshakeCompleted("chrysalis/1")]
    assert server.proof_failure is ProofFailure.TIMEOUT
    assert server.peer_certificate_chain() == []
    rejected = Terminated(TerminationKind.APPLICATION, 1, "client proof rejected: timeout")
    assert pair.of("server", Terminated) == [rejected]
    assert pair.of("client", Terminated) == [rejected]


def test_data_sent_before_a_missing_proof_never_comes_with_a_chain() -> None:
    # A client that never proves but sends application data at once. The engine passes the
    # bytes up as they come (the endpoint holds them until the verdict); the verdict that
    # follows carries no chain, so the endpoint refuses and never delivers them.
    pair = _Pair(
        client_options={"proof_builder": lambda exporter: None},
        server_options={"proof_timeout": 0.2},
    )
    pair.step(10)
    pair.client.open_stream(0)
    pair.client.send_stream_data(0, b"before any proof", False)
    order: list[type] = []
    pair.on_server_event = lambda event: order.append(type(event))
    pair.step(100)
    assert order.index(StreamDataReceived) < order.index(HandshakeCompleted)
    assert pair.server.peer_certificate_chain() == []
    assert pair.of("server", Terminated)[0].error_code == 1


def test_a_qh3_client_presents_its_certificate_in_tls_to_an_aioquic_server() -> None:
    pair = _Pair(server=AioquicEngine)
    pair.step(10)
    assert pair.of("client", HandshakeCompleted)
    assert pair.of("server", HandshakeCompleted)
    assert Pid.from_certificate(pair.server.peer_certificate_chain()[0]) == pair.client_pid
    assert pair.prefixes_ok()
    pair.client.open_stream(0)
    pair.client.send_stream_data(0, b"ping", True)
    pair.step(10)
    assert [e.data for e in pair.of("server", StreamDataReceived)] == [b"ping"]
    assert not pair.of("server", Terminated)  # no proof stream was opened (it would be illegal)


def test_an_aioquic_client_proves_itself_to_a_qh3_server_only_when_proving() -> None:
    proving = _Pair(client=AioquicProvingEngine)
    proving.step(10)
    server = proving.server
    assert isinstance(server, Qh3Connection)
    assert Pid.from_certificate(server.peer_certificate_chain()[0]) == proving.client_pid
    plain = _Pair(client=AioquicEngine, server_options={"proof_timeout": 0.1})
    plain.step(100)
    server = plain.server
    assert isinstance(server, Qh3Connection)
    assert server.proof_failure is ProofFailure.TIMEOUT
    (ended,) = plain.of("client", Terminated)
    assert (ended.kind, ended.error_code) == (TerminationKind.APPLICATION, 1)
    assert ended.reason == "client proof rejected: timeout"


def test_receive_gate_bounds_unconsumed_bytes_and_resumes_on_consumption() -> None:
    window = 16384
    pair = _Pair(QuicConfig(stream_window=window, connection_window=4 * window))
    pair.step(10)
    consumed = 0

    def hold(event: EngineEvent) -> None:  # an endpoint that keeps everything unread
        pair.server.set_buffered(pair.received - consumed)

    pair.on_server_event = hold
    payload = 400_000
    pair.client.open_stream(0)
    pair.client.send_stream_data(0, b"d" * payload, True)
    pair.step(60)
    stalled = pair.received
    assert 4 * window <= stalled <= 8 * window + 65536
    state = pair.client.stream_send_state(0)
    assert state is not None
    assert state[0] <= 8 * window + 65536
    for _ in range(100):
        if pair.received == payload:
            break
        consumed = pair.received
        pair.server.set_buffered(0)
        pair.step(5)
    assert pair.received == payload


def _confirmed(connection: Qh3Connection) -> bool:
    return bool(connection._handshake_confirmed)


def test_client_stream_data_waits_for_confirmation_in_order_and_a_reset_drops_it() -> None:
    """A client's stream data reaches the core only once the handshake is confirmed (see the
    module docstring, 8.): until then it is handed over and unacknowledged, nothing of it is
    sent (the server's first 1-RTT datagram, with HANDSHAKE_DONE, is lost), and none of it
    counts as acknowledged when everything in flight was; then it leaves in order, and a
    stream reset meanwhile never sends its kept bytes."""
    pair = _Pair()
    while not pair.of("client", HandshakeCompleted):
        pair.step(1)
        assert pair.now < T0 + 5.0
    client = pair.client
    assert isinstance(client, Qh3Connection)
    assert not _confirmed(client)  # the server has not seen the Finished yet
    first, second = random.Random(3).randbytes(30_000), random.Random(4).randbytes(5_000)
    client.open_stream(0)
    client.open_stream(4)
    client.send_stream_data(0, first[:20_000], False)
    client.send_stream_data(4, second, False)
    client.send_stream_data(0, memoryview(first)[20_000:], True)
    assert client.stream_send_state(0) == (0, len(first))
    assert client.stream_send_state(4) == (0, len(second))
    assert client._core is not None
    assert client._core.get_send_buffer_size(0) == 0  # nothing in the core yet
    client.reset_stream(4, 7)
    assert not client.sends_settled()  # the kept FIN of stream 0 too
    lost: list[bytes] = []

    def lose_handshake_done(direction: str, data: bytes) -> bool:
        if direction == "to client" and not data[0] & 0x80 and not lost:
            lost.append(data)
            return True
        return False

    pair.drop = lose_handshake_done
    received: dict[int, bytearray] = {0: bytearray(), 4: bytearray()}

    def collect(event: EngineEvent) -> None:
        if isinstance(event, StreamDataReceived):
            received[event.stream_id] += event.data

    pair.on_server_event = collect
    for _ in range(200):
        pair.step(1)
        state = client.stream_send_state(0)
        assert state is not None
        assert state[0] <= len(received[0])  # kept bytes are never counted as acknowledged
        assert not client.sends_settled() or _confirmed(client)
        if state == (len(first), 0):
            break
    assert _confirmed(client)
    assert lost
    assert bytes(received[0]) == first
    assert received[4] == b""
    assert [(e.stream_id, e.error_code) for e in pair.of("server", StreamResetReceived)] == [(4, 7)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_acknowledged_estimate_never_runs_ahead_of_delivery(seed: int) -> None:
    pair = _Pair(loss=0.05, reorder=0.1, seed=seed)
    while not (pair.of("client", HandshakeCompleted) and pair.of("server", HandshakeCompleted)):
        pair.step(1)
        assert pair.now < T0 + 5.0
    payload = 300_000
    pair.client.open_stream(0)
    written = 0
    chunk = random.Random(seed).randbytes(10_000)
    for _ in range(2000):
        if written < payload:
            pair.client.send_stream_data(0, chunk, False)
            written += len(chunk)
        pair.step(1)
        state = pair.client.stream_send_state(0)
        assert state is not None
        acked, buffered = state
        assert acked + buffered == written
        assert acked <= pair.received  # acknowledged bytes were delivered, never later
        if acked == payload:
            break
    assert pair.client.stream_send_state(0) == (payload, 0)
    assert pair.received == payload
    assert pair.prefixes_ok()


def test_idle_and_application_terminations_are_distinguished() -> None:
    idle = _Pair(QuicConfig(idle_timeout=1.0))
    idle.step(10)
    idle.now += 10.0
    idle.step(3)
    assert idle.of("client", Terminated) == [Terminated(TerminationKind.IDLE, None, "Idle timeout")]
    assert idle.client.is_terminated
    closed = _Pair()
    closed.step(10)
    closed.client.close(9, "done")
    closed.client.close(10, "second close is ignored")
    closed.step(200)
    done = [Terminated(TerminationKind.APPLICATION, 9, "done")]
    assert closed.of("client", Terminated) == done
    assert closed.of("server", Terminated) == done


def test_datagrams_from_too_many_addresses_are_dropped_without_harm() -> None:
    pair = _Pair()
    pair.step(10)
    server = pair.server
    for index in range(20):
        server.receive_datagram(b"\x40" + bytes(60), DatagramAddr.inproc(8, index + 1), pair.now)
    assert isinstance(server, Qh3Connection)
    assert len(server._ch_to_synthetic) == 8
    pair.client.open_stream(0)
    pair.client.send_stream_data(0, b"still fine", True)
    pair.step(10)
    assert [e.data for e in pair.of("server", StreamDataReceived)] == [b"still fine"]


def test_transport_parameters_allow_only_the_proof_stream() -> None:
    pair = _Pair(QuicConfig(max_streams_bidi=77))
    pair.step(10)
    client, server = pair.client, pair.server
    assert isinstance(client, Qh3Connection)
    assert isinstance(server, Qh3Connection)
    assert client._tls is not None
    assert server._tls is not None
    from_server = client._tls.remote_transport_parameters
    from_client = server._tls.remote_transport_parameters
    assert from_server is not None
    assert from_client is not None
    assert (from_server.initial_max_streams_bidi, from_server.initial_max_streams_uni) == (77, 1)
    assert (from_client.initial_max_streams_bidi, from_client.initial_max_streams_uni) == (77, 0)
    assert from_client.max_datagram_frame_size is None
    assert PROOF_STREAM_ID == 2
    with pytest.raises(ValueError, match="bidirectional"):
        client.open_stream(2)


def test_an_identity_qh3_cannot_use_is_refused_up_front() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ed25519 leaf")])
    when = datetime.datetime.fromtimestamp(T0, datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(when)
        .not_valid_after(when + datetime.timedelta(days=1))
        .sign(key, None)
    )
    identity = Identity(chain=(certificate,), private_key=key, roots=(certificate,))
    with pytest.raises(IdentityError, match="ECDSA or RSA"):
        Qh3Engine(QuicConfig(), identity)
    with pytest.raises(ValueError, match="proof_timeout"):
        Qh3Engine(QuicConfig(), issue(), proof_timeout=0.0)


def _ping_only_initial(scid: bytes, dcid: bytes) -> bytes:
    """A client Initial carrying a PING and padding but no CRYPTO frame (a legal probe)."""
    crypto = CryptoPair()
    crypto.setup_initial(dcid, is_client=True, version=1)
    builder = QuicPacketBuilder(
        host_cid=scid, peer_cid=dcid, version=1, is_client=True, max_datagram_size=1200
    )
    builder.start_packet(QuicPacketType.INITIAL, crypto)
    builder.start_frame(QuicFrameType.PING)
    (datagram,), _ = builder.flush()
    return datagram


def test_a_first_initial_without_client_hello_leaves_no_server_state() -> None:
    server_id = issue()
    initial_dcid = ConnectionId.initial(server_id.pid, 1).raw
    engine = Qh3Engine(QuicConfig(), server_id)
    keys = itertools.count(1)

    def accept() -> EngineConnection:
        return engine.accept(
            host_cid=ConnectionId.issued(server_id.pid, next(keys)).raw,
            original_dcid=initial_dcid,
            retry_scid=None,
            issue_cid=lambda: b"",
        )

    probe = _ping_only_initial(ConnectionId.issued(issue().pid, 1).raw, initial_dcid)
    assert len(probe) >= 1200
    refused = accept()
    refused.receive_datagram(probe, CLIENT_ADDR, T0)
    # qh3's core calls this a protocol violation; the engine answers nothing and keeps
    # nothing, so the endpoint drops the connection silently (as for any unauthenticated
    # first datagram) and the client's ClientHello can start a fresh one.
    assert not refused.peer_packet_seen
    assert refused.datagrams_to_send(T0) == []
    assert refused.next_event() is None
    assert refused.get_timer() is None


def test_an_identity_too_large_to_prove_in_band_is_refused_up_front() -> None:
    base = issue()
    padding = [base.chain[0]] * 7  # eight certificates of a few hundred bytes: fits
    fits = Identity(chain=(base.chain[0], *padding), private_key=base.private_key, roots=base.roots)
    Qh3Engine(QuicConfig(), fits)
    big_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "o" * 60)] * 200)
    when = datetime.datetime.fromtimestamp(T0, datetime.UTC)
    key = base.private_key
    bulky = (
        x509.CertificateBuilder()
        .subject_name(big_name)
        .issuer_name(big_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(when)
        .not_valid_after(when + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    assert len(bulky.public_bytes(Encoding.DER)) > 12_000
    too_big = Identity(chain=(base.chain[0], *[bulky] * 6), private_key=key, roots=base.roots)
    with pytest.raises(IdentityError, match="in-band"):
        Qh3Engine(QuicConfig(), too_big)


def test_qh3_stream_data_event_is_complete() -> None:
    """The engine builds ``StreamDataReceived`` through its slots, not its ``__init__``: the
    event must equal (and hash like) the one the constructor makes (the field list itself is
    pinned in ``test_endpoint_engine.py``)."""
    pair = _Pair()
    pair.step(10)
    pair.client.open_stream(0)
    pair.client.send_stream_data(0, b"sixteen bytes!!!", True)
    pair.step(5)
    (event,) = pair.of("server", StreamDataReceived)
    assert type(event) is StreamDataReceived
    assert event == StreamDataReceived(0, b"sixteen bytes!!!", True)
    assert hash(event) == hash(StreamDataReceived(0, b"sixteen bytes!!!", True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.fin = False  # type: ignore[misc]


def test_each_datagram_is_mapped_to_its_own_path_with_the_last_path_memo() -> None:
    """Receipt remembers the last sender by identity. Equal address objects, alternating
    senders and a sender beyond the path limit must each still map to their own path (or
    be dropped), never to the remembered one."""
    pair = _Pair()
    pair.step(10)
    server = pair.server
    assert isinstance(server, Qh3Connection)
    probe = b"\x40" + bytes(60)  # a short-header packet that does not decrypt
    paths = [DatagramAddr.inproc(8, index + 1) for index in range(7)]  # 7 + the client's: 8
    for addr in [paths[0], paths[1], paths[0], DatagramAddr.inproc(8, 2), *paths[2:]]:
        server.receive_datagram(probe, addr, pair.now)
        assert server._ch_last_addr is addr
        assert server._ch_last_synthetic == server._ch_to_synthetic[addr]
    assert len(set(server._ch_to_synthetic.values())) == 8
    remembered = server._ch_last_addr
    server.receive_datagram(probe, DatagramAddr.inproc(8, 99), pair.now)  # beyond the limit
    assert server._ch_last_addr is remembered
    assert DatagramAddr.inproc(8, 99) not in server._ch_to_synthetic
    # The client's path, under a fresh but equal address object, still carries its data.
    pair.client.open_stream(0)
    pair.client.send_stream_data(0, b"still mapped", True)
    for _ in range(10):
        for data, destination in pair.client.datagrams_to_send(pair.now):
            assert destination == SERVER_ADDR
            server.receive_datagram(data, DatagramAddr.inproc(3, 1), pair.now)
        for data, destination in server.datagrams_to_send(pair.now):
            assert destination == CLIENT_ADDR
            pair.client.receive_datagram(data, SERVER_ADDR, pair.now)
        pair.now += 0.005
    assert server._ch_last_synthetic == server._ch_to_synthetic[CLIENT_ADDR]
    received = []
    while (event := server.next_event()) is not None:
        if isinstance(event, StreamDataReceived):
            received.append(event.data)
    assert received == [b"still mapped"]


# --- EngineHints: the endpoint's drain and consume calls -----------------------------------------

_HINTS = ("event_queue", "events_withheld", "stream_consumed_noop")


@pytest.mark.parametrize("engine", [Qh3Engine, AioquicEngine], ids=["qh3", "aioquic"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sends_settle_only_once_every_fin_was_delivered(engine: Factory, seed: int) -> None:
    """``sends_settled`` (a graceful shutdown's condition to close) is False from the moment
    a FIN is handed over until the peer has it, whether the FIN rides with data or alone,
    and its datagram is lost (seed 0: the first one after each handover; else random loss
    and reordering); it becomes True once every FIN was acknowledged."""
    pair = _Pair(client=engine, server=engine, seed=seed)
    while not (pair.of("client", HandshakeCompleted) and pair.of("server", HandshakeCompleted)):
        pair.step(1)
        assert pair.now < T0 + 5.0
    client = pair.client
    pair.step(20)
    if seed:
        pair.loss = pair.reorder = 0.1
    assert client.sends_settled()
    fins: set[int] = set()
    dropping: list[bool] = []

    def collect(event: EngineEvent) -> None:
        if isinstance(event, StreamDataReceived) and event.fin:
            fins.add(event.stream_id)

    def drop_after_handover(direction: str, data: bytes) -> bool:
        if seed == 0 and direction == "to server" and dropping:
            dropping.clear()
            return True
        return False

    def settle(expected: set[int]) -> None:
        for _ in range(2000):
            pair.step(1)
            if client.sends_settled():
                assert fins == expected  # never before the peer has every FIN
                return
        raise AssertionError("the FINs were never acknowledged")

    pair.on_server_event = collect
    pair.drop = drop_after_handover
    for sid in (0, 4, 8):
        client.open_stream(sid)
    client.send_stream_data(0, b"with data", True)  # data and FIN together
    client.send_stream_data(4, b"data first", False)
    dropping.append(True)
    assert not client.sends_settled()
    settle({0})
    client.send_stream_data(4, b"", True)  # a FIN alone, after its data was acknowledged
    client.send_stream_data(8, b"", True)  # a stream that is only a FIN
    dropping.append(True)
    assert not client.sends_settled()
    settle({0, 4, 8})
    # A FIN handed over just before a receipt that finds nothing in flight: not transmitted
    # yet, so that receipt must not count it acknowledged.
    client.open_stream(12)
    client.send_stream_data(12, b"", True)
    pair.server.send_ping(1)
    for data, _ in pair.server.datagrams_to_send(pair.now):
        client.receive_datagram(data, SERVER_ADDR, pair.now)
    assert not client.sends_settled()
    settle({0, 4, 8, 12})


class _Spy:
    """Wraps an engine connection, counting ``next_event`` answers and ``stream_consumed``
    calls; ``hinted=False`` hides the ``EngineHints`` (a third engine without them)."""

    def __init__(self, inner: Any, hinted: bool) -> None:
        self._inner = inner
        self._hinted = hinted
        self.events: list[EngineEvent] = []
        self.empty_asks = 0
        self.consumed_calls = 0

    def next_event(self) -> EngineEvent | None:
        event: EngineEvent | None = self._inner.next_event()
        if event is None:
            self.empty_asks += 1
        else:
            self.events.append(event)
        return event

    def stream_consumed(self, stream_id: int, consumed_through: int) -> None:
        self.consumed_calls += 1
        self._inner.stream_consumed(stream_id, consumed_through)

    def __getattr__(self, name: str) -> Any:
        if name in _HINTS and not self._hinted:
            raise AttributeError(name)
        return getattr(self._inner, name)


def _spied(spies: list[_Spy], hinted: bool) -> Callable[[QuicConfig, Identity], Any]:
    def factory(config: QuicConfig, identity: Identity) -> Any:
        engine = Qh3Engine(config, identity)

        class _Engine:
            def connect(self, **kwargs: Any) -> Any:
                spies.append(_Spy(engine.connect(**kwargs), hinted))
                return spies[-1]

            def accept(self, **kwargs: Any) -> Any:
                spies.append(_Spy(engine.accept(**kwargs), hinted))
                return spies[-1]

        return _Engine()

    return factory


def _exchange(hinted: bool, config: QuicConfig | None = None) -> tuple[list[_Spy], list[bytes]]:
    """Request/response rounds (the server's receive posted ahead: direct delivery), then a
    large message through a small window (buffered delivery, the qh3 receive gate)."""
    from test_endpoint_harness import Net
    from test_qh3_harness import add

    from chrysalis.core.completion import ConnectionEstablished, ReceiveCompletion, ReceiveStatus
    from chrysalis.quic._endpoint import EndpointRole

    spies: list[_Spy] = []
    net = Net()
    server = add(
        net, "server", engine=_spied(spies, hinted), role=EndpointRole.SERVER, config=config
    )
    client = add(
        net, "client", engine=_spied(spies, hinted), role=EndpointRole.CLIENT, config=config
    )
    conn = client.connect(server)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)))
    stream = client.open(conn)
    client.wait_op(client.send(stream, b"hello"))
    incoming = server.incoming()
    got: list[bytes] = []
    done = server.wait_op(server.receive(incoming, 65536))
    assert isinstance(done, ReceiveCompletion)
    got.append(bytes(done.data()))
    for round_ in range(5):
        receipt = server.receive(incoming, 65536)  # posted before the bytes arrive
        client.send(stream, b"round %d" % round_)
        done = server.wait_op(receipt)
        assert isinstance(done, ReceiveCompletion)
        got.append(bytes(done.data()))
    big = random.Random(7).randbytes(300_000)
    client.send(stream, big)
    client.channels.streams.finish_nowait(stream)
    tail = bytearray()
    while True:
        done = server.wait_op(server.receive(incoming, 5000), within=60.0)
        assert isinstance(done, ReceiveCompletion)
        tail += done.data()
        if done.status is ReceiveStatus.FIN:
            break
    got.append(bytes(tail))
    assert got == [b"hello"] + [b"round %d" % i for i in range(5)] + [big]
    return spies, got


def test_hints_skip_empty_drains_and_noop_consumes_without_losing_events() -> None:
    """qh3's hints: the endpoint never asks ``next_event`` for nothing and never calls the
    no-op ``stream_consumed``; every byte still arrives once, in order, through a window
    small enough to gate the core (events withheld, then released)."""
    config = QuicConfig(connection_window=65536, stream_window=65536)
    spies, _ = _exchange(hinted=True, config=config)
    plain, _ = _exchange(hinted=False, config=config)
    assert len(spies) == 2
    for spy in spies:
        assert spy.empty_asks == 0
    # The five posted-ahead rounds are direct deliveries: no ``stream_consumed`` call there
    # (buffered bytes consumed later still report it).
    hinted_calls = sum(spy.consumed_calls for spy in spies)
    assert sum(spy.consumed_calls for spy in plain) - hinted_calls >= 5
    server_spy = spies[0] if spies[0]._inner._ch_verifier is not None else spies[1]
    data = [e for e in server_spy.events if isinstance(e, StreamDataReceived)]
    assert data[-1].fin


def test_an_engine_without_hints_is_drained_and_told_as_before() -> None:
    """A third engine without ``EngineHints``: the endpoint asks ``next_event`` until None
    and reports every consumption, and the same exchange delivers the same bytes."""
    config = QuicConfig(connection_window=65536, stream_window=65536)
    spies, got = _exchange(hinted=False, config=config)
    hinted, got_hinted = _exchange(hinted=True, config=config)
    assert got == got_hinted
    for spy in spies:
        assert spy.empty_asks > 0
    assert sum(spy.consumed_calls for spy in spies) > 0
    # The same events, in the same order, with or without the hints.
    assert sorted(
        [type(e).__name__ for e in spy.events if not isinstance(e, CidIssued)] for spy in spies
    ) == sorted(
        [type(e).__name__ for e in spy.events if not isinstance(e, CidIssued)] for spy in hinted
    )


@pytest.mark.parametrize("core_has_events", [True, False])
def test_qh3_event_queue_is_the_whole_story_after_each_call(
    core_has_events: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hints' contract on the engine itself: after every public call, an empty
    ``event_queue`` with nothing withheld means ``next_event`` has nothing (through the
    handshake, the proof, stream data in both directions, the receive gate and a close),
    whether the core's drain stops on ``has_events`` or on ``next_event`` saying None."""
    from chrysalis.quic._engines import qh3 as _qh3_engine
    from chrysalis.quic._engines.base import EngineHints

    assert _qh3_engine._CORE_HAS_EVENTS  # the pinned qh3 has it: the fast path is the one run
    monkeypatch.setattr(_qh3_engine, "_CORE_HAS_EVENTS", core_has_events)
    assert tuple(EngineHints.__annotations__) == _HINTS
    window = 16384
    pair = _Pair(QuicConfig(connection_window=window, stream_window=window))
    violations: list[str] = []
    withheld: list[bool] = []

    def audited(conn: Any, name: str) -> Callable[..., Any]:
        original = getattr(conn, name)

        def wrapped(*args: Any) -> Any:
            result = original(*args)
            withheld.append(conn.events_withheld)
            empty = not conn.event_queue and not conn.events_withheld
            if empty and (conn._events or conn.next_event() is not None):
                violations.append(name)
            return result

        return wrapped

    def audit(conn: Any) -> None:
        for name in ("receive_datagram", "handle_timer", "datagrams_to_send", "set_buffered"):
            setattr(conn, name, audited(conn, name))

    assert getattr(pair.client, "event_queue", None) is not None
    audit(pair.client)
    audit(pair.server)
    pair.step(10)
    assert any(isinstance(e, HandshakeCompleted) for e in pair.events["server"])
    pair.client.open_stream(0)
    pair.server.set_buffered(window)  # the endpoint holds a full window: the gate closes
    pair.client.send_stream_data(0, bytes(3 * window), False)
    pair.step(10)
    held_back = pair.received
    assert any(withheld)
    pair.server.set_buffered(0)  # consumed: released by the next flush
    pair.client.send_stream_data(0, b"", True)
    pair.step(20)
    assert pair.received == 3 * window > held_back
    pair.server.send_stream_data(0, b"answer", True)
    pair.step(10)
    assert any(isinstance(e, StreamDataReceived) and e.fin for e in pair.events["client"])
    pair.client.close(0, "done")
    pair.step(20)
    assert violations == []
    assert getattr(type(pair.client), "stream_consumed_noop", None) is True
    assert (
        AioquicEngine(QuicConfig(), issue())
        .accept(
            host_cid=bytes(20),
            original_dcid=bytes(20),
            retry_scid=None,
            issue_cid=lambda: bytes(20),
        )
        .stream_consumed_noop
        is False
    )
