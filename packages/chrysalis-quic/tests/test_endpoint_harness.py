"""A deterministic in-memory harness for ``QuicEndpoint`` tests, and its own checks.

``Net`` moves datagrams between endpoints with a virtual clock: every datagram takes
``latency`` seconds, and a seeded ``random.Random`` decides loss, duplication and extra delay
(which reorders), so a failing run replays exactly. ``Node`` wraps one endpoint, its channels
and the completions it produced; by default completions are drained (and their leases
released) after every step, ``auto_drain=False`` leaves them queued to exercise
backpressure. ``Net.observers`` see every datagram put on the wire and ``Net.filters`` may
drop some.

The other endpoint test files import this module (it lives next to them).
"""

from __future__ import annotations

import datetime
import heapq
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from chrysalis.core import DatagramAddr, Pid
from chrysalis.core.completion import (
    CommandCompletion,
    CommandReceipt,
    CommandResult,
    Completion,
    ConnectionCreated,
    ConnectionEstablished,
    ConnectionRef,
    DiscardCompletion,
    DriverId,
    EndpointChannels,
    FinishCompletion,
    IncomingStream,
    QueueEmpty,
    QueueExhausted,
    ReceiveCompletion,
    ReceiveOptions,
    ReceiveStatus,
    ResetCompletion,
    SendCompletion,
    StopCompletion,
    StreamOpened,
    StreamRef,
    SubmissionLimits,
    SubmissionReceipt,
)
from chrysalis.quic import DevelopmentCA, Identity
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._endpoint import (
    Connect,
    EndpointRole,
    OpenBidi,
    QuicCommand,
    QuicEndpoint,
)

T0 = 1_800_000_000.0
"""The virtual clock's start; with ``wall_clock_offset=0`` it is also POSIX time."""
WHEN = datetime.datetime.fromtimestamp(T0, datetime.UTC)
_CA = DevelopmentCA.create(now=WHEN)
_driver_ids = iter(range(1, 60000))

C = TypeVar("C")
OpCompletion = (
    SendCompletion
    | ReceiveCompletion
    | FinishCompletion
    | ResetCompletion
    | StopCompletion
    | DiscardCompletion
)
_OP_TYPES = (
    SendCompletion,
    ReceiveCompletion,
    FinishCompletion,
    ResetCompletion,
    StopCompletion,
    DiscardCompletion,
)


def issue(ca: DevelopmentCA | None = None) -> Identity:
    """A fresh leaf (a fresh PID) valid at the virtual time, from the shared test CA."""
    return (ca or _CA).issue(now=WHEN)


def other_ca() -> DevelopmentCA:
    """A second, unrelated CA (its leaves are untrusted by the shared CA's roots)."""
    return DevelopmentCA.create(common_name="untrusted CA", now=WHEN)


@dataclass
class Node:
    """One endpoint on the network with its channels and the completions it produced."""

    net: Net
    name: str
    identity: Identity
    addr: DatagramAddr
    channels: EndpointChannels[QuicCommand]
    endpoint: QuicEndpoint
    auto_drain: bool = True
    completions: list[Completion] = field(default_factory=list)
    _taken: set[StreamRef] = field(default_factory=set)

    @property
    def pid(self) -> Pid:
        return self.identity.pid

    def drain(self) -> None:
        """Move every queued completion into ``completions`` (releasing its lease)."""
        while True:
            try:
                self.completions.append(self.channels.completions.pop_nowait())
            except (QueueEmpty, QueueExhausted):
                return

    def submit(self, command: QuicCommand) -> CommandReceipt:
        return self.channels.commands.submit_nowait(command)

    def result(self, receipt: CommandReceipt, *, within: float = 5.0) -> CommandResult:
        """Run the network until the command's completion arrived; return its result."""

        def done() -> CommandCompletion | None:
            for item in self.completions:
                if isinstance(item, CommandCompletion) and item.request == receipt.request:
                    return item
            return None

        self.net.run_until(lambda: done() is not None, within=within)
        found = done()
        assert found is not None
        return found.result

    def connect(
        self,
        server: Node,
        *,
        expected: Pid | None = None,
        route: Pid | None = None,
        server_name: str | None = None,
        wait: bool = True,
        within: float = 5.0,
    ) -> ConnectionRef:
        """Dial ``server`` (expecting its PID unless told otherwise); wait for the verdict."""
        pid = server.pid if expected is None else expected
        result = self.result(
            self.submit(
                Connect(
                    route=server.pid if route is None else route,
                    peer=server.addr,
                    expected=pid,
                    server_name=server_name,
                )
            )
        )
        assert isinstance(result, ConnectionCreated), result
        if wait:
            self.net.run_until(
                lambda: self.established(result.connection) is not None, within=within
            )
        return result.connection

    def established(self, connection: ConnectionRef) -> ConnectionEstablished | None:
        for item in self.completions:
            if isinstance(item, ConnectionEstablished) and item.connection == connection:
                return item
        return None

    def open(self, connection: ConnectionRef) -> StreamRef:
        result = self.result(self.submit(OpenBidi(connection)))
        assert isinstance(result, StreamOpened), result
        return result.stream

    def of_type(self, kind: type[C]) -> list[C]:
        return [item for item in self.completions if isinstance(item, kind)]

    def op(self, receipt: SubmissionReceipt) -> OpCompletion | None:
        """The completion of the stream operation ``receipt`` admitted, if it arrived."""
        for item in self.completions:
            if isinstance(item, _OP_TYPES) and item.operation == receipt.operation:
                return item
        return None

    def wait_op(self, receipt: SubmissionReceipt, *, within: float = 5.0) -> OpCompletion:
        """Run the network until the operation completed; return its completion."""
        self.net.run_until(lambda: self.op(receipt) is not None, within=within)
        found = self.op(receipt)
        assert found is not None
        return found

    def incoming(self, *, within: float = 5.0) -> StreamRef:
        """Wait for the next not yet taken ``IncomingStream``; return its stream."""
        taken = self._taken

        def fresh() -> list[IncomingStream]:
            return [i for i in self.of_type(IncomingStream) if i.stream not in taken]

        self.net.run_until(lambda: bool(fresh()), within=within)
        stream = fresh()[0].stream
        taken.add(stream)
        return stream

    def send(self, stream: StreamRef, payload: bytes) -> SubmissionReceipt:
        return self.channels.streams.send_nowait(stream, payload)

    def receive(
        self, stream: StreamRef, capacity: int, *, min_bytes: int = 1, prefix: bytes = b""
    ) -> SubmissionReceipt:
        return self.channels.streams.receive_nowait(
            stream, bytearray(prefix), capacity, ReceiveOptions(min_bytes)
        )

    def read_all(self, stream: StreamRef, *, chunk: int = 65536, within: float = 30.0) -> bytes:
        """Post receives until FIN; return every byte received."""
        out = bytearray()
        while True:
            completion = self.wait_op(self.receive(stream, chunk), within=within)
            assert isinstance(completion, ReceiveCompletion), completion
            out += completion.data()
            if completion.status is ReceiveStatus.FIN:
                return bytes(out)
            assert completion.status is ReceiveStatus.DATA, completion


@dataclass(order=True)
class _Flight:
    at: float
    seq: int
    source: DatagramAddr = field(compare=False)
    destination: DatagramAddr = field(compare=False)
    data: bytes = field(compare=False)


class Net:
    """Endpoints joined by a simulated network with a virtual clock.

    Args:
        seed: seeds every loss / duplication / delay decision.
        latency: one-way delay of every datagram in seconds.
        loss: probability a datagram is dropped.
        duplicate: probability a surviving datagram is delivered twice.
        jitter: extra delay, uniform in ``[0, jitter)``, per copy (reorders datagrams).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        latency: float = 0.001,
        loss: float = 0.0,
        duplicate: float = 0.0,
        jitter: float = 0.0,
    ) -> None:
        self.now = T0
        self.latency = latency
        self.loss = loss
        self.duplicate = duplicate
        self.jitter = jitter
        self._random = random.Random(seed)
        self._seq = 0
        self._flights: list[_Flight] = []
        self.nodes: dict[DatagramAddr, Node] = {}
        self.observers: list[Callable[[DatagramAddr, DatagramAddr, bytes], None]] = []
        self.filters: list[Callable[[DatagramAddr, DatagramAddr, bytes], bool]] = []
        self.dropped = 0
        self.sent = 0

    def add(
        self,
        name: str,
        *,
        role: EndpointRole = EndpointRole.DUPLEX,
        identity: Identity | None = None,
        limits: EndpointLimits | None = None,
        config: QuicConfig | None = None,
        submission_limits: SubmissionLimits | None = None,
        completion_credits: int = 1024,
        event_credits: int = 1024,
        completion_queue_capacity: int | None = None,
        auto_drain: bool = True,
        routing_pid: Pid | None = None,
        addr: DatagramAddr | None = None,
        seed: int | None = None,
    ) -> Node:
        ident = issue() if identity is None else identity
        channels = EndpointChannels[QuicCommand](
            DriverId(next(_driver_ids)),
            submission_limits,
            completion_credits=completion_credits,
            event_credits=event_credits,
            completion_queue_capacity=completion_queue_capacity,
        )
        endpoint = QuicEndpoint(
            ident,
            role=role,
            routing_pid=routing_pid,
            limits=limits,
            config=config,
            channels=channels,
            now=self.now,
            random_bytes=random.Random(len(self.nodes) if seed is None else seed).randbytes,
        )
        where = DatagramAddr.inproc(1, len(self.nodes) + 1) if addr is None else addr
        node = Node(self, name, ident, where, channels, endpoint, auto_drain)
        self.nodes[where] = node
        return node

    # -- the wire ---------------------------------------------------------------------------

    def inject(self, source: DatagramAddr, destination: DatagramAddr, data: bytes) -> None:
        """Put a datagram on the wire as if ``source`` sent it (faults apply)."""
        self.sent += 1
        for observer in self.observers:
            observer(source, destination, data)
        if not all(keep(source, destination, data) for keep in self.filters):
            self.dropped += 1
            return
        rng = self._random
        lost = rng.random() < self.loss
        copies = 2 if rng.random() < self.duplicate else 1
        delays = [rng.random() * self.jitter for _ in range(2)]
        if lost:
            self.dropped += 1
            return
        for copy in range(copies):
            self._seq += 1
            heapq.heappush(
                self._flights,
                _Flight(
                    self.now + self.latency + delays[copy],
                    self._seq,
                    source,
                    destination,
                    data,
                ),
            )

    def pump(self) -> bool:
        """One round at the current time: poll, transmit, deliver due datagrams, timers.

        Returns whether anything happened (a datagram moved or a completion was drained),
        as a real driver would be woken again by its notifier in that case.
        """
        now = self.now
        before = (self.sent, sum(len(node.completions) for node in self.nodes.values()))
        delivered = 0
        for node in list(self.nodes.values()):
            node.endpoint.poll(now)
            for data, destination in node.endpoint.datagrams_to_send(now):
                self.inject(node.addr, destination, data)
        while self._flights and self._flights[0].at <= now:
            flight = heapq.heappop(self._flights)
            target = self.nodes.get(flight.destination)
            delivered += 1
            if target is not None:
                target.endpoint.receive_datagram(flight.data, flight.source, now)
        for node in list(self.nodes.values()):
            timer = node.endpoint.get_timer()
            if timer is not None and timer <= now:
                node.endpoint.handle_timer(now)
            node.endpoint.poll(now)
            for data, destination in node.endpoint.datagrams_to_send(now):
                self.inject(node.addr, destination, data)
            if node.auto_drain:
                node.drain()
        after = (self.sent, sum(len(node.completions) for node in self.nodes.values()))
        return delivered > 0 or after != before

    def next_time(self) -> float | None:
        times = [flight.at for flight in self._flights[:1]]
        for node in self.nodes.values():
            timer = node.endpoint.get_timer()
            if timer is not None:
                times.append(timer)
        return min(times) if times else None

    def run_until(self, done: Callable[[], bool], *, within: float = 5.0) -> None:
        """Advance the virtual clock until ``done()``; fail after ``within`` virtual seconds."""
        deadline = self.now + within
        for _ in range(200_000):
            progressed = self.pump()
            if done():
                return
            if progressed:
                continue  # a woken driver runs again before time moves on
            upcoming = self.next_time()
            if upcoming is None:
                raise AssertionError("the network went idle before the condition held")
            if upcoming > deadline:
                raise AssertionError(f"condition not reached within {within} virtual seconds")
            self.now = max(upcoming, self.now + 1e-6)
        raise AssertionError("too many rounds")

    def run_for(self, seconds: float) -> None:
        """Advance the virtual clock by ``seconds`` (or until nothing is scheduled)."""
        deadline = self.now + seconds
        for _ in range(200_000):
            if self.pump():
                continue
            upcoming = self.next_time()
            if upcoming is None or upcoming > deadline:
                self.now = deadline
                self.pump()
                return
            self.now = max(upcoming, self.now + 1e-6)
        raise AssertionError("too many rounds")


def pair(
    *,
    client_config: QuicConfig | None = None,
    server_config: QuicConfig | None = None,
    **net_options: float,
) -> tuple[Net, Node, Node]:
    """A network with a client and a server endpoint."""
    net = Net(**net_options)  # type: ignore[arg-type]
    client = net.add("client", role=EndpointRole.CLIENT, config=client_config)
    server = net.add("server", role=EndpointRole.SERVER, config=server_config)
    return net, client, server


def all_completions(*nodes: Node) -> Iterator[Completion]:
    for node in nodes:
        yield from node.completions


# --- the harness's own checks -----------------------------------------------------------------


def test_same_seed_gives_the_same_fault_decisions() -> None:
    def trace(seed: int) -> list[tuple[float, bytes]]:
        net = Net(seed=seed, loss=0.3, duplicate=0.2, jitter=0.01)
        a, b = DatagramAddr.inproc(9, 1), DatagramAddr.inproc(9, 2)
        for index in range(50):
            net.inject(a, b, bytes([index]))
        return [(flight.at, flight.data) for flight in sorted(net._flights)]

    assert trace(7) == trace(7)
    assert trace(7) != trace(8)


def test_loss_and_duplication_happen_at_roughly_their_rates() -> None:
    net = Net(seed=1, loss=0.25, duplicate=0.5)
    a, b = DatagramAddr.inproc(9, 1), DatagramAddr.inproc(9, 2)
    for _ in range(2000):
        net.inject(a, b, b"x")
    assert 400 < net.dropped < 600
    survivors = 2000 - net.dropped
    assert 1.3 * survivors < len(net._flights) < 1.7 * survivors


def test_run_until_fails_loudly_when_nothing_is_scheduled() -> None:
    net = Net()
    with pytest.raises(AssertionError, match="idle"):
        net.run_until(lambda: False)
