"""The aioquic engine seam on its own: endpoint-chosen CIDs, client-certificate requests,
consumption-driven receive windows, the CID issuance cap and termination kinds."""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import pytest
from aioquic import tls

sys.path.append(str(Path(__file__).parent))

from test_endpoint_harness import T0, issue

from chrysalis.core import ConnectionId, DatagramAddr, Pid, target_pid
from chrysalis.quic._config import QuicConfig
from chrysalis.quic._engines.aioquic import AioquicConnection, AioquicEngine
from chrysalis.quic._engines.base import (
    CidIssued,
    EngineEvent,
    HandshakeCompleted,
    StreamDataReceived,
    Terminated,
    TerminationKind,
)

CLIENT_ADDR = DatagramAddr.inproc(3, 1)
SERVER_ADDR = DatagramAddr.inproc(3, 2)


class _Pair:
    """A client and a server engine connection joined back to back (no loss)."""

    def __init__(self, config: QuicConfig | None = None) -> None:
        cfg = QuicConfig() if config is None else config
        self.client_id, self.server_id = issue(), issue()
        client_keys, server_keys = itertools.count(1), itertools.count(1)
        self.client_pid, self.server_pid = self.client_id.pid, self.server_id.pid

        def client_cid() -> bytes:
            return ConnectionId.issued(self.client_pid, next(client_keys)).raw

        def server_cid() -> bytes:
            return ConnectionId.issued(self.server_pid, next(server_keys)).raw

        self.now = T0
        self.initial_dcid = ConnectionId.initial(self.server_pid, 1).raw
        self.client = AioquicEngine(cfg, self.client_id).connect(
            host_cid=client_cid(),
            initial_dcid=self.initial_dcid,
            addr=SERVER_ADDR,
            server_name=None,
            issue_cid=client_cid,
            now=self.now,
        )
        self.server = AioquicEngine(cfg, self.server_id).accept(
            host_cid=server_cid(),
            original_dcid=self.initial_dcid,
            retry_scid=None,
            issue_cid=server_cid,
        )
        self.events: dict[str, list[EngineEvent]] = {"client": [], "server": []}
        self.prefixes: list[tuple[str, Pid | None]] = []

    def step(self, rounds: int = 1, dt: float = 0.005) -> None:
        for _ in range(rounds):
            for data, _ in self.client.datagrams_to_send(self.now):
                self.prefixes.append(("to server", target_pid(data)))
                self.server.receive_datagram(data, CLIENT_ADDR, self.now)
            for data, _ in self.server.datagrams_to_send(self.now):
                self.prefixes.append(("to client", target_pid(data)))
                self.client.receive_datagram(data, SERVER_ADDR, self.now)
            self.now += dt
            for name, conn in (("client", self.client), ("server", self.server)):
                timer = conn.get_timer()
                if timer is not None and timer <= self.now:
                    conn.handle_timer(self.now)
                while (event := conn.next_event()) is not None:
                    self.events[name].append(event)

    def of(self, name: str, kind: type) -> list[EngineEvent]:
        return [e for e in self.events[name] if isinstance(e, kind)]


def test_engine_uses_endpoint_chosen_cids_and_requests_client_certificates() -> None:
    pair = _Pair()
    pair.step(10)
    assert pair.of("client", HandshakeCompleted)
    assert pair.of("server", HandshakeCompleted)
    assert {prefix for direction, prefix in pair.prefixes if direction == "to server"} == {
        pair.server_pid
    }
    assert {prefix for direction, prefix in pair.prefixes if direction == "to client"} == {
        pair.client_pid
    }
    assert Pid.from_certificate(pair.server.peer_certificate_chain()[0]) == pair.client_pid
    assert Pid.from_certificate(pair.client.peer_certificate_chain()[0]) == pair.server_pid
    issued = [e for e in pair.of("client", CidIssued) if isinstance(e, CidIssued)]
    assert [ConnectionId.from_bytes(e.cid).pid for e in issued] == [pair.client_pid]
    assert pair.client.peer_packet_seen
    assert pair.server.peer_packet_seen


def _key_exchange(engine: object) -> tuple[list[str], bool, bool]:
    """The key pairs ``engine``'s TLS context generated: EC curves, X25519, X448."""
    assert isinstance(engine, AioquicConnection)
    context = engine.tls
    return (
        [key.curve.name for key in context._ec_private_keys],
        context._x25519_private_key is not None,
        context._x448_private_key is not None,
    )


def test_client_offers_one_x25519_key_share_and_the_server_agrees_on_it() -> None:
    pair = _Pair()
    pair.step(10)
    assert pair.of("client", HandshakeCompleted)
    assert pair.of("server", HandshakeCompleted)
    assert isinstance(pair.client, AioquicConnection)
    assert pair.client.tls._supported_groups == [tls.Group.X25519]
    assert _key_exchange(pair.client) == ([], True, False)  # one key pair generated
    assert _key_exchange(pair.server) == ([], True, False)  # agreed on X25519
    # Authentication is unchanged: each side holds the other's leaf.
    assert Pid.from_certificate(pair.server.peer_certificate_chain()[0]) == pair.client_pid
    assert Pid.from_certificate(pair.client.peer_certificate_chain()[0]) == pair.server_pid


def test_server_still_accepts_a_client_offering_every_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that offers aioquic's four groups (an older peer) still connects: the server
    keeps every group and takes the client's first, P-256."""
    every = [tls.Group.SECP256R1, tls.Group.SECP384R1, tls.Group.X25519, tls.Group.X448]
    initialize = AioquicConnection._initialize

    def old_client(self: AioquicConnection, peer_cid: bytes) -> None:
        initialize(self, peer_cid)
        if self._is_client:
            self.tls._supported_groups = list(every)

    monkeypatch.setattr(AioquicConnection, "_initialize", old_client)
    pair = _Pair()
    pair.step(10)
    assert pair.of("client", HandshakeCompleted)
    assert pair.of("server", HandshakeCompleted)
    assert _key_exchange(pair.client) == (["secp256r1", "secp384r1"], True, True)
    assert _key_exchange(pair.server) == (["secp256r1"], False, False)
    assert Pid.from_certificate(pair.server.peer_certificate_chain()[0]) == pair.client_pid


def test_receive_window_slides_only_with_consumption() -> None:
    window = 16384
    pair = _Pair(QuicConfig(stream_window=window, connection_window=4 * window))
    pair.step(10)
    pair.client.open_stream(0)
    pair.client.send_stream_data(0, b"d" * 100_000, False)
    pair.step(40)

    def received() -> int:
        events = pair.of("server", StreamDataReceived)
        return sum(len(e.data) for e in events if isinstance(e, StreamDataReceived))

    assert received() == window  # stalled at the window: nothing was consumed
    state = pair.client.stream_send_state(0)
    assert state is not None
    assert state[0] == window
    pair.server.stream_consumed(0, window)
    pair.step(40)
    assert received() == 2 * window
    # Consuming a little more would grow the window by less than half: no update is sent.
    pair.server.stream_consumed(0, window + 100)
    pair.step(20)
    assert received() == 2 * window


def test_cid_issuance_is_capped_per_connection() -> None:
    pair = _Pair()
    pair.step(10)
    engine = pair.client
    assert isinstance(engine, AioquicConnection)
    issued = len(engine._host_cids)
    for _ in range(20):  # as if the peer retired the spare CID again and again
        engine._host_cids = engine._host_cids[:1]
        engine._replenish_connection_ids()
        issued += len(engine._host_cids) - 1
    assert issued == 1 + 8


def test_idle_and_application_terminations_are_distinguished() -> None:
    idle = _Pair(QuicConfig(idle_timeout=1.0))
    idle.step(10)
    idle.now += 10.0
    idle.step(3)
    (ended,) = idle.of("client", Terminated)
    assert ended == Terminated(TerminationKind.IDLE, None, "Idle timeout")
    assert idle.client.is_terminated
    closed = _Pair()
    closed.step(10)
    closed.client.close(9, "done")
    closed.step(200)
    client_end = closed.of("client", Terminated)
    server_end = closed.of("server", Terminated)
    assert client_end == [Terminated(TerminationKind.APPLICATION, 9, "done")]
    assert server_end == [Terminated(TerminationKind.APPLICATION, 9, "done")]


def test_stream_data_event_is_complete() -> None:
    """The engine builds ``StreamDataReceived`` through its slots, not its ``__init__``: every
    field the dataclass declares must be set, and the event must equal (and hash like) the
    one the constructor makes, in order, with the FIN on the last."""
    assert [field.name for field in dataclasses.fields(StreamDataReceived)] == [
        "stream_id",
        "data",
        "fin",
    ]
    pair = _Pair()
    pair.step(10)
    pair.client.open_stream(0)
    pair.client.send_stream_data(0, b"first", False)
    pair.step(3)
    pair.client.send_stream_data(0, b"second", True)
    pair.step(3)
    events = [e for e in pair.of("server", StreamDataReceived) if type(e) is StreamDataReceived]
    assert len(events) == len(pair.of("server", StreamDataReceived))
    assert events == [
        StreamDataReceived(0, b"first", False),
        StreamDataReceived(0, b"second", True),
    ]
    assert hash(events[1]) == hash(StreamDataReceived(0, b"second", True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        events[0].fin = True  # type: ignore[misc]
