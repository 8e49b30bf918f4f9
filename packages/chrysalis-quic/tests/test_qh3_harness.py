"""Helpers for the qh3 engine tests, and their own checks.

The endpoint harness (``test_endpoint_harness``) builds every endpoint with the default
(aioquic) engine; ``add`` here puts an endpoint with any engine factory on the same simulated
network, so one test can mix engines. ``Recording`` wraps a factory and keeps every engine
connection it made, for white-box assertions (the endpoint forgets closed connections).
``PrefixAudit`` checks that every datagram names, in its DCID prefix, the PID of its receiver.

qh3 is an optional dependency: every qh3 test module skips when it is missing.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.append(str(Path(__file__).parent))

pytest.importorskip("qh3")

from test_endpoint_harness import Net, Node, _driver_ids, issue

from chrysalis.core import ConnectionId, DatagramAddr, Pid, target_pid
from chrysalis.core.completion import DriverId, EndpointChannels
from chrysalis.quic import Identity
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._endpoint import EndpointRole, QuicCommand, QuicEndpoint
from chrysalis.quic._engines.aioquic import AioquicEngine
from chrysalis.quic._engines.base import EngineConnection, EngineFactory, QuicEngine
from chrysalis.quic._engines.qh3 import AioquicProvingEngine, Qh3Connection, Qh3Engine

ENGINES: dict[str, EngineFactory] = {
    "qh3": Qh3Engine,
    "aioquic": AioquicEngine,
    "aioquic-proving": AioquicProvingEngine,
}


def add(
    net: Net,
    name: str,
    *,
    engine: EngineFactory = Qh3Engine,
    role: EndpointRole = EndpointRole.DUPLEX,
    identity: Identity | None = None,
    config: QuicConfig | None = None,
    limits: EndpointLimits | None = None,
    addr: DatagramAddr | None = None,
) -> Node:
    """Like ``Net.add``, with the endpoint's engine factory chosen by the caller."""
    ident = issue() if identity is None else identity
    channels = EndpointChannels[QuicCommand](DriverId(next(_driver_ids)), None)
    endpoint = QuicEndpoint(
        ident,
        role=role,
        limits=limits,
        config=config,
        channels=channels,
        now=net.now,
        engine=engine,
        random_bytes=random.Random(len(net.nodes)).randbytes,
    )
    where = DatagramAddr.inproc(1, len(net.nodes) + 1) if addr is None else addr
    node = Node(net, name, ident, where, channels, endpoint)
    net.nodes[where] = node
    return node


def pair(
    client_engine: EngineFactory = Qh3Engine,
    server_engine: EngineFactory = Qh3Engine,
    *,
    client_config: QuicConfig | None = None,
    server_config: QuicConfig | None = None,
    client_identity: Identity | None = None,
    server_identity: Identity | None = None,
    **net_options: Any,
) -> tuple[Net, Node, Node]:
    """A network with a client and a server endpoint on the given engines."""
    net = Net(**net_options)
    client = add(
        net,
        "client",
        engine=client_engine,
        role=EndpointRole.CLIENT,
        config=client_config,
        identity=client_identity,
    )
    server = add(
        net,
        "server",
        engine=server_engine,
        role=EndpointRole.SERVER,
        config=server_config,
        identity=server_identity,
    )
    return net, client, server


@dataclass
class Recording:
    """An engine factory that records every connection its engines create."""

    factory: Callable[..., QuicEngine] = Qh3Engine
    options: dict[str, Any] = field(default_factory=dict)
    connections: list[object] = field(default_factory=list)

    def __call__(self, config: QuicConfig, identity: Identity) -> QuicEngine:
        engine = self.factory(config, identity, **self.options)
        recorded = self.connections

        class _Engine:
            def connect(self, **kwargs: Any) -> EngineConnection:
                connection = engine.connect(**kwargs)
                recorded.append(connection)
                return connection

            def accept(self, **kwargs: Any) -> EngineConnection:
                connection = engine.accept(**kwargs)
                recorded.append(connection)
                return connection

        return _Engine()

    def qh3(self) -> list[Qh3Connection]:
        return [c for c in self.connections if isinstance(c, Qh3Connection)]


class PrefixAudit:
    """Records every datagram whose DCID prefix is not its receiver's routing PID."""

    def __init__(self, net: Net) -> None:
        self.net = net
        self.checked = 0
        self.violations: list[tuple[DatagramAddr, Pid | None]] = []
        net.observers.append(self)

    def __call__(self, source: DatagramAddr, destination: DatagramAddr, data: bytes) -> None:
        self.checked += 1
        prefix = target_pid(data)
        if prefix != self.net.nodes[destination].endpoint.routing_pid:
            self.violations.append((destination, prefix))


# --- the helpers' own checks --------------------------------------------------------------------


def test_add_builds_the_endpoint_on_the_requested_engine() -> None:
    recording = Recording(Qh3Engine)
    net = Net()
    server = add(net, "server", engine=recording, role=EndpointRole.SERVER)
    client = add(net, "client", engine=AioquicEngine, role=EndpointRole.CLIENT)
    client.connect(server, wait=False)
    net.run_for(0.05)
    assert [type(c) for c in recording.connections] == [Qh3Connection]
    (client_conn,) = client.endpoint._conns.values()
    assert not isinstance(client_conn.engine, Qh3Connection)


def test_prefix_audit_flags_only_datagrams_for_another_pid() -> None:
    net = Net()
    node = add(net, "node")
    stranger = issue().pid
    audit = PrefixAudit(net)
    source = DatagramAddr.inproc(9, 9)
    audit(source, node.addr, b"\x40" + ConnectionId.issued(node.pid, 1).raw + b"payload")
    audit(source, node.addr, b"\x40" + ConnectionId.issued(stranger, 1).raw + b"payload")
    assert audit.checked == 2
    assert audit.violations == [(node.addr, stranger)]
