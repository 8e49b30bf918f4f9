"""Mixed engines: an aioquic client and a qh3 server, and the reverse, authenticate each other
(mutual TLS one way, the in-band client proof the other), route by PID and carry streams over
a lossy link; a plain aioquic client, which cannot prove itself in-band, is refused by a qh3
server with a clear reason."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).parent))

pytest.importorskip("qh3")

from aioquic.quic.connection import QuicConnection as AioquicQuicConnection
from test_endpoint_harness import Net, Node, issue, other_ca
from test_qh3_harness import ENGINES, PrefixAudit, Recording, add

from chrysalis.core.completion import (
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionEstablished,
    ReceiveCompletion,
    ReceiveStatus,
    StreamRef,
)
from chrysalis.quic import Identity
from chrysalis.quic._endpoint import AUTHENTICATION_FAILED_CODE, Close, EndpointRole
from chrysalis.quic._engines.aioquic import AioquicEngine
from chrysalis.quic._engines.client_proof import ProofFailure
from chrysalis.quic._engines.qh3 import Qh3Engine


def _read_until_fin(node: Node, stream: StreamRef) -> bytes:
    out = bytearray()
    while True:
        done = node.wait_op(node.receive(stream, 65536), within=60.0)
        assert isinstance(done, ReceiveCompletion)
        out += done.data()
        if done.status is ReceiveStatus.FIN:
            return bytes(out)


@pytest.mark.parametrize(
    ("client_engine", "server_engine"),
    [
        ("aioquic-proving", "qh3"),
        ("qh3", "aioquic"),
        ("qh3", "qh3"),
        ("aioquic-proving", "aioquic"),
    ],
)
def test_engines_interoperate_with_authentication_and_pid_routing(
    client_engine: str, server_engine: str
) -> None:
    net = Net(seed=7, latency=0.002, loss=0.03, duplicate=0.01, jitter=0.002)
    audit = PrefixAudit(net)
    server = add(net, "server", engine=ENGINES[server_engine], role=EndpointRole.SERVER)
    client = add(net, "client", engine=ENGINES[client_engine], role=EndpointRole.CLIENT)
    conn = client.connect(server, within=30.0)
    net.run_until(lambda: bool(server.of_type(ConnectionEstablished)), within=30.0)
    (accepted,) = server.of_type(ConnectionEstablished)
    assert (accepted.local_pid, accepted.peer_pid) == (server.pid, client.pid)
    payload = random.Random(1).randbytes(96 * 1024)
    stream = client.open(conn)
    client.send(stream, payload)
    client.channels.streams.finish_nowait(stream)
    incoming = server.incoming(within=30.0)
    assert _read_until_fin(server, incoming) == payload
    server.send(incoming, b"reply" * 1000)
    server.channels.streams.finish_nowait(incoming)
    assert _read_until_fin(client, stream) == b"reply" * 1000
    client.submit(Close(conn, 7))
    net.run_until(lambda: bool(server.of_type(ConnectionClosed)), within=30.0)
    assert server.of_type(ConnectionClosed)[0].application_code == 7
    assert not server.of_type(AuthenticationFailed)
    assert not client.of_type(AuthenticationFailed)
    assert audit.violations == []
    assert net.dropped > 0


def test_a_plain_aioquic_client_is_refused_by_a_qh3_server_with_a_clear_reason() -> None:
    net = Net()
    server_engines = Recording(Qh3Engine, {"proof_timeout": 0.5})
    client_engines = Recording(AioquicEngine)
    server = add(net, "server", engine=server_engines, role=EndpointRole.SERVER)
    client = add(net, "client", engine=client_engines, role=EndpointRole.CLIENT)
    conn = client.connect(server)  # the aioquic client authenticated the server
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)), within=5.0)
    assert client.of_type(ConnectionClosed) == [
        ConnectionClosed(conn, application_code=AUTHENTICATION_FAILED_CODE)
    ]
    assert [c.proof_failure for c in server_engines.qh3()] == [ProofFailure.TIMEOUT]
    assert not server.of_type(ConnectionEstablished)
    (refused,) = server.of_type(AuthenticationFailed)
    assert (refused.expected, refused.actual) == (None, None)
    (aioquic_client,) = client_engines.connections
    assert isinstance(aioquic_client, AioquicQuicConnection)
    ended = aioquic_client._close_event
    assert ended is not None
    assert ended.reason_phrase == "client proof rejected: timeout"


@pytest.mark.parametrize(
    ("client_engine", "server_engine"), [("aioquic-proving", "qh3"), ("qh3", "aioquic")]
)
def test_an_untrusted_client_is_refused_across_engines(
    client_engine: str, server_engine: str
) -> None:
    stranger = issue(other_ca())
    identity = Identity(chain=stranger.chain, private_key=stranger.private_key, roots=issue().roots)
    net = Net()
    server = add(net, "server", engine=ENGINES[server_engine], role=EndpointRole.SERVER)
    client = add(
        net, "client", engine=ENGINES[client_engine], role=EndpointRole.CLIENT, identity=identity
    )
    conn = client.connect(server, wait=False)
    net.run_until(lambda: bool(client.of_type(ConnectionClosed)), within=10.0)
    assert client.of_type(ConnectionClosed) == [
        ConnectionClosed(conn, application_code=AUTHENTICATION_FAILED_CODE)
    ]
    (refused,) = server.of_type(AuthenticationFailed)
    assert (refused.expected, refused.actual) == (None, None)
    assert not server.of_type(ConnectionEstablished)
