"""In-process carrier: the reference test inventory (inproc.rs), the exact semantics of spec
2.7, a threaded stress test and a hypothesis state machine against a model."""

from __future__ import annotations

import gc
import threading
from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chrysalis.core import AddressError, DatagramAddr
from chrysalis.datagram import (
    DATAGRAM_BATCH_SIZE,
    AddressInUseError,
    ConnectionRefusedDatagramError,
    DatagramRecvMeta,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InprocNetwork,
    InprocSocket,
    InvalidDataError,
    SocketClosedError,
    UnsupportedSchemeError,
)


class Flag:
    """A waker that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_duplicate_bind_is_rejected() -> None:
    network = InprocNetwork()
    first = network.bind(1)
    with pytest.raises(AddressInUseError):
        network.bind(1)
    first.shutdown()


def test_shutdown_wakes_receive_rejects_sends_and_joins() -> None:
    network = InprocNetwork()
    a, b = network.bind(1), network.bind(2)
    waker = Flag()
    b.add_recv_waker(waker)
    assert not b.join(0.0)
    b.shutdown()
    b.shutdown()
    assert waker.calls == 1
    assert b.join(1.0)
    with pytest.raises(SocketClosedError):
        b.try_recv_from()
    with pytest.raises(SocketClosedError):
        b.try_send_to(b"x", a.local_addr)
    with pytest.raises(ConnectionRefusedDatagramError):
        a.try_send_to(b"x", b.local_addr)
    rebound = network.bind(2)
    assert a.try_send_to(b"again", rebound.local_addr)
    assert rebound.try_recv_from() == (b"again", a.local_addr)


def test_round_trip_preserves_boundaries_and_source_addresses() -> None:
    network = InprocNetwork()
    client, server = network.bind(), network.bind()
    assert client.local_addr == DatagramAddr.inproc(network.network_id, client.endpoint_id)
    assert client.try_send_to(b"request", server.local_addr)
    assert client.try_send_to(b"", server.local_addr)
    assert server.try_recv_from() == (b"request", client.local_addr)
    assert server.try_recv_from() == (b"", client.local_addr)
    assert server.try_send_to(b"response", client.local_addr)
    assert client.try_recv_from() == (b"response", server.local_addr)


def test_receive_into_a_view_keeps_the_existing_prefix() -> None:
    # Port of poll_recv_from_appends_to_read_buf: buffers are written from offset 0, so the
    # caller appends by passing a view of the free tail.
    network = InprocNetwork()
    a, b = network.bind(), network.bind()
    assert a.try_send_to(b"payload", b.local_addr)
    buffer = bytearray(b"prefix:") + bytearray(32)
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv([memoryview(buffer)[7:]], metas) == 1
    assert bytes(buffer[: 7 + metas[0].length]) == b"prefix:payload"


def test_full_queue_applies_backpressure() -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b = network.bind(), network.bind()
    assert a.try_send_to(b"one", b.local_addr)
    assert not a.try_send_to(b"two", b.local_addr)
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, b"xy", 1)) == 0
    assert b.try_recv_from() == (b"one", a.local_addr)
    assert b.try_recv_from() is None


@pytest.mark.parametrize("method", ["try_recv_from", "try_recv"])
def test_consuming_a_datagram_wakes_send_readiness(method: str) -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b = network.bind(), network.bind()
    assert a.try_send_to(b"one", b.local_addr)
    waker = Flag()
    a.add_send_waker(b.local_addr, waker)
    assert waker.calls == 0
    if method == "try_recv":
        assert b.try_recv([bytearray(8)], []) == 1
    else:
        assert b.try_recv_from() is not None
    assert waker.calls == 1
    assert a.try_send_to(b"two", b.local_addr)


def test_send_readiness_is_scoped_to_the_destination() -> None:
    network = InprocNetwork(queue_capacity=1)
    sender, first, second = network.bind(), network.bind(), network.bind()
    assert sender.try_send_to(b"1", first.local_addr)
    assert sender.try_send_to(b"2", second.local_addr)
    wake_first, wake_second = Flag(), Flag()
    sender.add_send_waker(first.local_addr, wake_first)
    sender.add_send_waker(second.local_addr, wake_second)
    assert first.try_recv_from() == (b"1", sender.local_addr)
    assert (wake_first.calls, wake_second.calls) == (1, 0)
    assert second.try_recv_from() == (b"2", sender.local_addr)
    assert (wake_first.calls, wake_second.calls) == (1, 1)


def test_send_waker_is_called_at_once_when_there_is_room_or_no_destination() -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b = network.bind(), network.bind()
    room, unknown, foreign = Flag(), Flag(), Flag()
    a.add_send_waker(b.local_addr, room)
    a.add_send_waker(DatagramAddr.inproc(network.network_id, 999), unknown)
    a.add_send_waker(DatagramAddr.udp("127.0.0.1", 1), foreign)
    assert (room.calls, unknown.calls, foreign.calls) == (1, 1, 1)


def test_blocked_sender_shutdown_calls_its_send_waker_once() -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b = network.bind(), network.bind()
    assert a.try_send_to(b"fill", b.local_addr)
    waker = Flag()
    a.add_send_waker(b.local_addr, waker)
    a.shutdown()
    assert waker.calls == 1
    assert b.try_recv_from() is not None  # would wake a's waker if it were still registered
    assert waker.calls == 1


def test_every_waiting_sender_of_one_socket_is_woken() -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b = network.bind(), network.bind()
    assert a.try_send_to(b"fill", b.local_addr)
    first, second = Flag(), Flag()
    a.add_send_waker(b.local_addr, first)  # two tasks of one socket wait on one destination
    a.add_send_waker(b.local_addr, second)
    assert b.try_recv_from() is not None
    assert (first.calls, second.calls) == (1, 1)


def test_sender_shutdown_wakes_all_of_its_waiting_sends() -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b, c = network.bind(), network.bind(), network.bind()
    for destination in (b, c):
        assert a.try_send_to(b"fill", destination.local_addr)
    flags = [Flag() for _ in range(4)]
    for index, flag in enumerate(flags):
        a.add_send_waker((b if index % 2 else c).local_addr, flag)
    a.shutdown()
    assert [flag.calls for flag in flags] == [1, 1, 1, 1]
    assert b.try_recv_from() is not None
    assert c.try_recv_from() is not None
    assert [flag.calls for flag in flags] == [1, 1, 1, 1]  # never twice


def test_fired_send_wakers_are_pruned_from_the_sender() -> None:
    network = InprocNetwork(queue_capacity=1)
    a = network.bind()
    destinations = [network.bind() for _ in range(600)]
    for destination in destinations:
        assert a.try_send_to(b"fill", destination.local_addr)
        waker = Flag()
        a.add_send_waker(destination.local_addr, waker)
        assert destination.try_recv_from() is not None
        assert waker.calls == 1
    assert len(a._send_wakers) <= 257  # not one entry per destination ever waited on


def test_parked_send_wakers_are_bounded_and_each_is_called_once() -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b = network.bind(), network.bind()
    assert a.try_send_to(b"fill", b.local_addr)
    flags = [Flag() for _ in range(1500)]
    for flag in flags:
        a.add_send_waker(b.local_addr, flag)
    assert len(b._endpoint.blocked) <= 1024  # overflow wakes the parked ones early
    assert b.try_recv_from() is not None
    assert [flag.calls for flag in flags] == [1] * 1500


def test_destination_shutdown_wakes_blocked_senders() -> None:
    network = InprocNetwork(queue_capacity=1)
    a, b = network.bind(), network.bind()
    assert a.try_send_to(b"fill", b.local_addr)
    waker = Flag()
    a.add_send_waker(b.local_addr, waker)
    b.shutdown()
    assert waker.calls == 1
    with pytest.raises(ConnectionRefusedDatagramError):
        a.try_send_to(b"x", b.local_addr)


def test_recv_waker_fires_on_arrival_or_at_once_when_data_is_queued() -> None:
    network = InprocNetwork()
    a, b = network.bind(), network.bind()
    waker = Flag()
    b.add_recv_waker(waker)
    assert waker.calls == 0
    assert a.try_send_to(b"x", b.local_addr)
    assert waker.calls == 1
    assert a.try_send_to(b"y", b.local_addr)
    assert waker.calls == 1  # one-shot
    again = Flag()
    b.add_recv_waker(again)
    assert again.calls == 1  # data already queued


def test_only_the_latest_recv_waker_is_kept() -> None:
    network = InprocNetwork()
    a, b = network.bind(), network.bind()
    old, new = Flag(), Flag()
    b.add_recv_waker(old)
    b.add_recv_waker(new)
    assert a.try_send_to(b"x", b.local_addr)
    assert (old.calls, new.calls) == (0, 1)


def test_unknown_foreign_and_wrong_scheme_destinations() -> None:
    network, other = InprocNetwork(), InprocNetwork()
    a = network.bind()
    stranger = other.bind()
    assert other.network_id > network.network_id
    with pytest.raises(HostUnreachableError):
        a.try_send_to(b"x", DatagramAddr.inproc(network.network_id, 12345))
    with pytest.raises(HostUnreachableError):
        a.try_send_to(b"x", stranger.local_addr)
    with pytest.raises(UnsupportedSchemeError, match="udp"):
        a.try_send_to(b"x", DatagramAddr.udp("127.0.0.1", 1))


def test_dropped_socket_shuts_down_and_its_address_becomes_unknown() -> None:
    network = InprocNetwork(queue_capacity=1)
    a = network.bind()
    b: InprocSocket | None = network.bind()
    assert b is not None
    address = b.local_addr
    assert a.try_send_to(b"fill", address)
    waker = Flag()
    a.add_send_waker(address, waker)
    b = None
    gc.collect()
    assert waker.calls == 1
    with pytest.raises(HostUnreachableError):
        a.try_send_to(b"x", address)


def test_send_copies_the_data() -> None:
    network = InprocNetwork()
    a, b = network.bind(), network.bind()
    data = bytearray(b"original")
    assert a.try_send_to(data, b.local_addr)
    data[:] = b"mutated!"
    assert b.try_recv_from() == (b"original", a.local_addr)


def test_segmented_transmit_is_bounded_by_free_space_and_batch() -> None:
    network = InprocNetwork(queue_capacity=3)
    a, b = network.bind(), network.bind()
    transmit = DatagramTransmit(b.local_addr, b"aabbccddee", 2)
    assert a.try_send_transmit(transmit) == 3
    assert a.try_send_transmit(transmit.suffix(3)) == 0
    metas: list[DatagramRecvMeta] = []
    buffers = [bytearray(4) for _ in range(5)]
    assert b.try_recv(buffers, metas) == 3
    assert [bytes(buf[: m.length]) for buf, m in zip(buffers, metas, strict=False)] == [
        b"aa",
        b"bb",
        b"cc",
    ]
    big = InprocNetwork()
    c, d = big.bind(), big.bind()
    assert c.try_send_transmit(DatagramTransmit(d.local_addr, bytes(40), 1)) == DATAGRAM_BATCH_SIZE


def test_oversized_datagram_in_batch_is_consumed_and_reported_after_the_good_ones() -> None:
    network = InprocNetwork()
    a, b = network.bind(), network.bind()
    for payload in (b"ok", b"too long for four", b"next"):
        assert a.try_send_to(payload, b.local_addr)
    metas: list[DatagramRecvMeta] = []
    buffers = [bytearray(4), bytearray(4), bytearray(4)]
    assert b.try_recv(buffers, metas) == 1
    with pytest.raises(InvalidDataError):
        b.try_recv(buffers, metas)
    assert b.try_recv(buffers, metas) == 1
    assert bytes(buffers[0][: metas[-1].length]) == b"next"


def test_limits_and_validation() -> None:
    network = InprocNetwork()
    a = network.bind()
    with pytest.raises(DatagramTooLargeError):
        a.try_send_to(bytes(65536), a.local_addr)
    with pytest.raises(AddressError):
        network.bind(1 << 64)
    with pytest.raises(TypeError):
        network.bind("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue_capacity"):
        InprocNetwork(queue_capacity=0)
    assert a.fileno() is None
    assert a.readiness_fds() == []
    assert not a.may_fragment
    assert InprocNetwork.lookup(network.network_id) is network


def test_automatic_ids_skip_live_endpoints() -> None:
    network = InprocNetwork()
    explicit = network.bind(1)
    automatic = network.bind()
    assert automatic.endpoint_id != explicit.endpoint_id
    assert network.bind().endpoint_id not in (explicit.endpoint_id, automatic.endpoint_id)


def test_concurrent_senders_keep_per_sender_order_under_backpressure() -> None:
    network = InprocNetwork(queue_capacity=8)
    receiver = network.bind()
    senders = [network.bind() for _ in range(3)]
    per_sender = 300
    errors: list[BaseException] = []

    def send_all(sock: InprocSocket) -> None:
        try:
            for i in range(per_sender):
                while not sock.try_send_to(i.to_bytes(2, "big"), receiver.local_addr):
                    ready = threading.Event()
                    sock.add_send_waker(receiver.local_addr, ready.set)
                    assert ready.wait(5), "sender was never woken"
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=send_all, args=(s,)) for s in senders]
    for thread in threads:
        thread.start()
    received: dict[DatagramAddr, list[int]] = {s.local_addr: [] for s in senders}
    total = 0
    while total < per_sender * len(senders):
        got = receiver.try_recv_from()
        if got is None:
            ready = threading.Event()
            receiver.add_recv_waker(ready.set)
            assert ready.wait(5), "receiver was never woken"
            continue
        received[got[1]].append(int.from_bytes(got[0], "big"))
        total += 1
    for thread in threads:
        thread.join(5)
    assert not errors
    assert all(values == list(range(per_sender)) for values in received.values())


class InprocModel(RuleBasedStateMachine):
    """Random binds, sends, receives and shutdowns compared with a model of bounded FIFO
    queues."""

    CAPACITY = 3

    def __init__(self) -> None:
        super().__init__()
        self.network = InprocNetwork(queue_capacity=self.CAPACITY)
        self.sockets: dict[int, InprocSocket] = {}
        self.closed: set[int] = set()
        self.queues: dict[int, deque[tuple[int, bytes]]] = {}

    @rule(endpoint=st.integers(min_value=1, max_value=4))
    def bind(self, endpoint: int) -> None:
        if endpoint in self.sockets and endpoint not in self.closed:
            with pytest.raises(AddressInUseError):
                self.network.bind(endpoint)
            return
        self.sockets[endpoint] = self.network.bind(endpoint)
        self.closed.discard(endpoint)
        self.queues[endpoint] = deque()

    @precondition(lambda self: bool(self.sockets))
    @rule(data=st.data(), payload=st.binary(max_size=8))
    def send(self, data: st.DataObject, payload: bytes) -> None:
        source = data.draw(st.sampled_from(sorted(self.sockets)))
        target = data.draw(st.integers(min_value=1, max_value=5))
        sock = self.sockets[source]
        destination = DatagramAddr.inproc(self.network.network_id, target)
        if source in self.closed:
            with pytest.raises(SocketClosedError):
                sock.try_send_to(payload, destination)
        elif target not in self.sockets:
            with pytest.raises(HostUnreachableError):
                sock.try_send_to(payload, destination)
        elif target in self.closed:
            with pytest.raises(ConnectionRefusedDatagramError):
                sock.try_send_to(payload, destination)
        elif len(self.queues[target]) >= self.CAPACITY:
            assert not sock.try_send_to(payload, destination)
        else:
            assert sock.try_send_to(payload, destination)
            self.queues[target].append((source, payload))

    @precondition(lambda self: bool(self.sockets))
    @rule(data=st.data(), count=st.integers(min_value=1, max_value=4))
    def receive(self, data: st.DataObject, count: int) -> None:
        endpoint = data.draw(st.sampled_from(sorted(self.sockets)))
        sock = self.sockets[endpoint]
        if endpoint in self.closed:
            with pytest.raises(SocketClosedError):
                sock.try_recv([bytearray(8)], [])
            return
        metas: list[DatagramRecvMeta] = []
        buffers = [bytearray(8) for _ in range(count)]
        filled = sock.try_recv(buffers, metas)
        expected = [self.queues[endpoint].popleft() for _ in range(filled)]
        assert filled == min(count, filled + len(self.queues[endpoint]))
        got = [
            (meta.source.endpoint_id, bytes(buf[: meta.length]))
            for buf, meta in zip(buffers, metas, strict=False)
        ]
        assert got == expected

    @precondition(lambda self: bool(self.sockets))
    @rule(data=st.data())
    def shutdown(self, data: st.DataObject) -> None:
        endpoint = data.draw(st.sampled_from(sorted(self.sockets)))
        self.sockets[endpoint].shutdown()
        self.closed.add(endpoint)
        self.queues[endpoint].clear()

    @invariant()
    def shutdown_flags_match(self) -> None:
        for endpoint, sock in self.sockets.items():
            assert sock.is_shutdown == (endpoint in self.closed)


TestInprocModel = InprocModel.TestCase
TestInprocModel.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
