"""Tests of the DatagramSwitch and its bindings (the switch.rs inventory of spec section 8, plus
the binding, dispatch and pump rules of spec 3.4)."""

from __future__ import annotations

import errno
import functools
import os
import resource
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import ConnectionId, DatagramAddr, Pid
from chrysalis.datagram import _switch as switch_module
from chrysalis.datagram._inproc import InprocNetwork, InprocSocket
from chrysalis.datagram._mmsg import RecvRing, recv_ring_supported
from chrysalis.datagram._route import DropReason, Route, RouteGate, Router
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    AddressInUseError,
    AddressNotAvailableError,
    Buffer,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InvalidDataError,
    SocketClosedError,
    Waker,
)
from chrysalis.datagram._switch import (
    DEFAULT_BINDING_BYTES,
    DatagramSwitch,
    DestinationMismatchError,
    SwitchSocket,
)
from chrysalis.datagram._udp import UdpSocket, udp_gso_supported
from chrysalis.datagram._unix import UnixDatagramSocket

WAIT = 5.0  # bound on every wait

PID_A = Pid(bytes(range(1, 17)))
PID_B = Pid(bytes(range(17, 33)))
PID_C = Pid(bytes([0xC3] * 16))
DST_B = DatagramAddr.inproc(1, 11)
DST_PARENT = DatagramAddr.inproc(1, 99)
PEER = DatagramAddr.inproc(1, 50)
PEER2 = DatagramAddr.inproc(1, 51)
SUPPLIED = DatagramAddr.inproc(1, 1234)


def short(pid: Pid, payload: bytes = b"payload", key: int = 1) -> bytes:
    return b"\x40" + bytes(ConnectionId.issued(pid, key)) + payload


def segment(pid: Pid, size: int, fill: int = 0x55) -> bytes:
    """A short-header datagram of exactly ``size`` bytes targeting ``pid``."""
    head = short(pid, b"")
    return head + bytes([fill]) * (size - len(head))


Incoming = tuple[bytes, DatagramAddr, int, int | None]  # data, source, stride, ecn


class FakeCarrier(DatagramSocket):
    """A descriptor-less carrier driven by the test.

    ``inject`` queues receive batches (one ``try_recv`` returns one batch); every send is
    recorded. ``accept`` caps datagrams per ``try_send_transmit`` (0 or ``blocked``: would
    block); ``fail`` makes every send raise.
    """

    def __init__(self) -> None:
        self.batches: deque[list[Incoming]] = deque()
        self.sent: list[tuple[bytes, DatagramAddr]] = []
        self.transmits: list[tuple[bytes, DatagramAddr, int | None, int | None, int]] = []
        self.datagrams: list[tuple[bytes, DatagramAddr]] = []  # every accepted one, in order
        self.accept: int | None = None
        self.blocked = False
        self.fail: OSError | None = None
        self.recv_error: OSError | None = None  # raised by every try_recv
        self.recv_once: deque[OSError] = deque()  # raised by one try_recv each, in order
        self.recv_waker: Waker | None = None
        self.send_wakers: list[tuple[DatagramAddr, Waker]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.joined = False

    @property
    def local_addr(self) -> DatagramAddr:
        return DatagramAddr.inproc(1, 1)

    def inject(self, *datagrams: Incoming) -> None:
        with self._lock:
            self.batches.append(list(datagrams))
            waker, self.recv_waker = self.recv_waker, None
        if waker is not None:
            waker()

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        self._check()
        if self.fail is not None:
            raise self.fail
        if self.blocked:
            return False
        self.sent.append((bytes(data), destination))
        self.datagrams.append((bytes(data), destination))
        return True

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        self._check()
        if self.fail is not None:
            raise self.fail
        if self.blocked:
            return 0
        count = transmit.segment_count
        if self.accept is not None:
            count = min(count, self.accept)
        if count:
            self.transmits.append(
                (
                    bytes(transmit.contents),
                    transmit.destination,
                    transmit.segment_size,
                    transmit.ecn,
                    count,
                )
            )
            self.datagrams.extend(
                (bytes(transmit.segment(i)), transmit.destination) for i in range(count)
            )
        return count

    def try_recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        self._check()
        if self.recv_error is not None:
            raise self.recv_error
        if self.recv_once:
            raise self.recv_once.popleft()
        with self._lock:
            if not self.batches:
                return 0
            batch = self.batches.popleft()
        for index, (data, source, stride, ecn) in enumerate(batch):
            buffers[index][: len(data)] = data
            metas.append(DatagramRecvMeta(source, len(data), stride, ecn))
        return len(batch)

    def fileno(self) -> int | None:
        return None

    def add_recv_waker(self, waker: Waker) -> None:
        with self._lock:
            ready = bool(self.batches) or self._closed
            if not ready:
                self.recv_waker = waker
        if ready:
            waker()

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        self.send_wakers.append((destination, waker))

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            waker, self.recv_waker = self.recv_waker, None
        if waker is not None:
            waker()

    @property
    def is_shutdown(self) -> bool:
        return self._closed

    def join(self, timeout: float | None = None) -> bool:
        self.joined = self._closed
        return self._closed

    def _check(self) -> None:
        if self._closed:
            raise SocketClosedError()


def single(data: bytes, source: DatagramAddr = PEER, ecn: int | None = None) -> Incoming:
    return (data, source, len(data), ecn)


@pytest.fixture
def carrier() -> FakeCarrier:
    return FakeCarrier()


@pytest.fixture
def router() -> Router:
    return Router()


@pytest.fixture
def switch(carrier: FakeCarrier, router: Router) -> DatagramSwitch:
    return DatagramSwitch(carrier, router)


def recv_all(sock: SwitchSocket) -> list[tuple[bytes, DatagramAddr]]:
    out = []
    while (item := sock.try_recv_from()) is not None:
        out.append(item)
    return out


# --------------------------------------------------------------------------------------------
# switch.rs inventory (local parts; the in-process carrier versions are further down)


def test_local_switch_sockets_exchange_datagrams_without_egress(
    switch: DatagramSwitch, carrier: FakeCarrier
) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B)
    assert a.local_addr == DatagramAddr.switch(switch.switch_id, PID_A)

    with pytest.raises(DestinationMismatchError):
        a.try_send_to(short(PID_A), b.local_addr)  # CID names A, the address names B
    assert b.try_recv_from() is None

    assert a.try_send_to(short(PID_B, b"hello"), b.local_addr) is True
    assert b.try_recv_from() == (short(PID_B, b"hello"), a.local_addr)
    assert carrier.sent == []
    assert carrier.transmits == []


def test_local_switch_preserves_segmented_batches(switch: DatagramSwitch) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B)
    batch = b"".join(segment(PID_B, 64, fill) for fill in range(4))

    assert a.try_send_transmit(DatagramTransmit(b.local_addr, batch, 64, ecn=2)) == 4

    buffers = [bytearray(1024) for _ in range(4)]
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv(buffers, metas) == 1
    assert metas == [DatagramRecvMeta(a.local_addr, 256, 64, 2)]
    assert bytes(buffers[0][:256]) == batch


def test_single_receive_splits_local_segmented_batches(switch: DatagramSwitch) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B)
    segments = [segment(PID_B, 64, fill) for fill in range(4)]

    assert a.try_send_transmit(DatagramTransmit(b.local_addr, b"".join(segments), 64, 2)) == 4

    assert recv_all(b) == [(s, a.local_addr) for s in segments]


def test_routed_binding_uses_cid_instead_of_supplied_address(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    routed = switch.bind_routed(PID_A)

    assert routed.try_send_to(short(PID_B), SUPPLIED) is True
    assert carrier.sent == [(short(PID_B), DST_B)]

    local = switch.bind(PID_C)
    assert routed.try_send_to(short(PID_C), SUPPLIED) is True  # local binding, not the egress
    assert local.try_recv_from() == (short(PID_C), routed.local_addr)
    assert len(carrier.sent) == 1


def test_local_binding_precedes_route_and_can_be_rebound(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    b = switch.bind(PID_B)

    carrier.inject(single(short(PID_B, b"first")))
    assert switch.pump() == 1
    assert b.try_recv_from() == (short(PID_B, b"first"), PEER)
    assert carrier.sent == []

    with pytest.raises(AddressInUseError):
        switch.bind(PID_B)

    b.shutdown()
    carrier.inject(single(short(PID_B, b"second")))
    switch.pump()
    assert carrier.sent == [(short(PID_B, b"second"), DST_B)]

    again = switch.bind(PID_B)
    carrier.inject(single(short(PID_B, b"third")))
    switch.pump()
    assert again.try_recv_from() == (short(PID_B, b"third"), PEER)
    assert len(carrier.sent) == 1


# --------------------------------------------------------------------------------------------
# switch.rs inventory over the in-process carrier


def wait_recv(sock: InprocSocket | SwitchSocket) -> tuple[bytes, DatagramAddr]:
    """Receive one datagram, waiting (bounded) through the socket's receive waker."""
    deadline = time.monotonic() + WAIT
    while True:
        item = sock.try_recv_from()
        if item is not None:
            return item
        ready = threading.Event()
        sock.add_recv_waker(ready.set)
        assert ready.wait(max(0.0, deadline - time.monotonic())), "nothing was received"


def test_forwards_nonlocal_datagrams_through_router() -> None:
    net = InprocNetwork()
    source = net.bind()
    carrier = net.bind()
    carrier_id = carrier.endpoint_id
    destination = net.bind()
    router = Router()
    router.insert(PID_B, Route.permanent(destination.local_addr))
    switch = DatagramSwitch.spawn(carrier, router)
    try:
        assert source.try_send_to(short(PID_B, b"one"), carrier.local_addr)
        assert wait_recv(destination) == (short(PID_B, b"one"), carrier.local_addr)
        batch = b"".join(segment(PID_B, 50, fill) for fill in range(3))
        assert source.try_send_transmit(DatagramTransmit(carrier.local_addr, batch, 50)) == 3
        got = [wait_recv(destination) for _ in range(3)]
        assert got == [(segment(PID_B, 50, fill), carrier.local_addr) for fill in range(3)]
    finally:
        switch.shutdown()
    assert switch.join(WAIT)
    assert carrier.is_shutdown
    assert net.bind(carrier_id).endpoint_id == carrier_id  # the carrier's id is free again
    assert router.statistics().forwarded == 4


def test_inproc_local_binding_precedes_route_and_replies_through_the_carrier() -> None:
    net = InprocNetwork()
    peer = net.bind()
    carrier = net.bind()
    elsewhere = net.bind()
    router = Router()
    router.insert(PID_A, Route.permanent(elsewhere.local_addr))
    router.insert(PID_C, Route.permanent(peer.local_addr))
    with DatagramSwitch(carrier, router) as switch:
        node = switch.bind_routed(PID_A)
        assert peer.try_send_to(short(PID_A, b"ping"), carrier.local_addr)
        assert switch.pump() == 1
        assert node.try_recv_from() == (short(PID_A, b"ping"), peer.local_addr)
        assert elsewhere.try_recv_from() is None
        # The routed reply ignores the supplied address and follows the route to the peer.
        assert node.try_send_to(short(PID_C, b"pong"), SUPPLIED)
        assert peer.try_recv_from() == (short(PID_C, b"pong"), carrier.local_addr)


def _held_setup(capacity: int) -> tuple[InprocSocket, InprocSocket, InprocSocket, Router]:
    """A source, a switch carrier and a destination on one in-process network whose queues
    hold ``capacity`` datagrams, and a router with a route to the destination."""
    net = InprocNetwork(queue_capacity=capacity)
    source, carrier, destination = net.bind(), net.bind(), net.bind()
    router = Router()
    router.insert(PID_B, Route.permanent(destination.local_addr))
    return source, carrier, destination, router


def _send(source: InprocSocket, carrier: InprocSocket, *fills: int) -> None:
    for fill in fills:
        assert source.try_send_to(segment(PID_B, 40, fill), carrier.local_addr)


def _received(destination: InprocSocket) -> list[int]:
    got = []
    while (item := destination.try_recv_from()) is not None:
        got.append(item[0][-1])
    return got


def test_inproc_full_egress_queue_holds_forwarded_datagrams_in_order() -> None:
    source, carrier, destination, router = _held_setup(2)
    with DatagramSwitch(carrier, router) as switch:
        _send(source, carrier, 0, 1)
        switch.pump()  # both forwarded: the destination's queue is full now
        _send(source, carrier, 2, 3)
        switch.pump()  # held, not dropped
        _send(source, carrier, 4)
        switch.pump()
        assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 0
        assert router.statistics().forwarded == 2
        got = _received(destination)
        _send(source, carrier, 5)
        switch.pump()  # the held ones first (two fit); 5 waits behind 4 although 4 is held
        got += _received(destination)
        switch.pump()
        got += _received(destination)
        assert got == [0, 1, 2, 3, 4, 5]
        assert router.statistics().forwarded == 6
        assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 0


def test_a_held_datagram_is_dropped_after_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(switch_module, "HELD_SECONDS", 0.0)
    source, carrier, destination, router = _held_setup(1)
    with DatagramSwitch(carrier, router) as switch:
        _send(source, carrier, 0)
        switch.pump()
        _send(source, carrier, 1)
        switch.pump()  # held, with a deadline already past
        assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 0
        switch.pump()  # still full at the retry: dropped for QUIC to repair
        assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 1
        assert _received(destination) == [0]


def test_a_full_held_queue_stops_receiving_and_drops_what_does_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(switch_module, "HELD_DATAGRAMS", 3)
    source, carrier, destination, router = _held_setup(2)
    with DatagramSwitch(carrier, router) as switch:
        _send(source, carrier, 0, 1)
        switch.pump()
        _send(source, carrier, 2, 3)
        switch.pump()  # held: 2, 3
        _send(source, carrier, 4, 5)
        switch.pump()  # 4 held (the bound), 5 dropped
        assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 1
        _send(source, carrier, 6)
        assert switch.pump() == 0  # back-pressure: 6 stays in the carrier's queue
        assert switch.statistics().received == 6
        got = _received(destination)
        assert switch.pump() == 1  # 2 and 3 sent, so there is room: 6 is taken, behind 4
        got += _received(destination)
        switch.pump()
        got += _received(destination)
        assert got == [0, 1, 2, 3, 4, 6]
        assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 1


def test_a_stalled_destination_holds_only_its_own_share_and_delays_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(switch_module, "HELD_PER_DESTINATION", 2)
    net = InprocNetwork(queue_capacity=2)
    source, carrier, stalled, free = net.bind(), net.bind(), net.bind(), net.bind()
    router = Router()
    router.insert(PID_B, Route.permanent(stalled.local_addr))
    router.insert(PID_C, Route.permanent(free.local_addr))

    def send(pid: Pid, fill: int) -> None:
        assert source.try_send_to(segment(pid, 40, fill), carrier.local_addr)

    with DatagramSwitch(carrier, router) as switch:
        send(PID_B, 0)
        send(PID_B, 1)
        switch.pump()  # the stalled destination's queue is full now
        send(PID_B, 2)
        send(PID_B, 3)
        switch.pump()  # its share of the hold is full: 2 and 3
        send(PID_B, 4)
        send(PID_C, 0)
        switch.pump()  # 4 is over the share: dropped; the other destination's goes straight on
        assert free.try_recv_from() == (segment(PID_C, 40, 0), carrier.local_addr)
        assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 1
        got = [stalled.try_recv_from(), stalled.try_recv_from()]
        switch.pump()
        got += [stalled.try_recv_from(), stalled.try_recv_from(), stalled.try_recv_from()]
        assert got == [(segment(PID_B, 40, fill), carrier.local_addr) for fill in range(4)] + [None]


def test_stalled_destinations_cannot_keep_the_hold_full_for_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two stopped destinations, each with its share held, fill the whole hold; the switch
    # would then receive nothing for anyone. Once their held datagrams expired they are
    # stalled: what they refuse is dropped at once and the hold stays free for the live one.
    monkeypatch.setattr(switch_module, "HELD_PER_DESTINATION", 1)
    monkeypatch.setattr(switch_module, "HELD_DATAGRAMS", 2)
    monkeypatch.setattr(switch_module, "HELD_SECONDS", 0.0)  # the first holds expire at once
    pid_d = Pid(bytes([0xD4] * 16))
    net = InprocNetwork(queue_capacity=2)
    source, carrier = net.bind(), net.bind()
    stalled_b, stalled_d, live = net.bind(), net.bind(), net.bind()
    router = Router()
    router.insert(PID_B, Route.permanent(stalled_b.local_addr))
    router.insert(pid_d, Route.permanent(stalled_d.local_addr))
    router.insert(PID_C, Route.permanent(live.local_addr))

    def send(*items: tuple[Pid, int]) -> None:
        for pid, fill in items:
            assert source.try_send_to(segment(pid, 40, fill), carrier.local_addr)

    def full_drops() -> int:
        return router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL]

    with DatagramSwitch(carrier, router) as switch:
        send((PID_B, 0), (PID_B, 1))
        switch.pump()
        send((pid_d, 0), (pid_d, 1))
        switch.pump()  # both stopped destinations' queues are full now
        send((PID_B, 2), (pid_d, 2))
        switch.pump()  # held: the hold is full
        monkeypatch.setattr(switch_module, "HELD_SECONDS", 60.0)
        send((PID_C, 0))
        assert switch.pump() == 1  # B 2 and D 2 expired (dropped, stalled); C 0 forwarded
        assert full_drops() == 2
        send((PID_B, 3), (pid_d, 3))
        switch.pump()  # refused again: dropped at once, not held (before: the hold full again)
        assert full_drops() == 4
        send((PID_C, 1))
        assert switch.pump() == 1  # received and forwarded: nothing holds the switch back
        assert _received(live) == [0, 1]
        # A stalled destination that reads again is forwarded to, and held for, as before.
        assert _received(stalled_b) == [0, 1]
        send((PID_B, 4), (PID_B, 5))
        switch.pump()  # both accepted: its queue is full again, and B is no longer stalled
        send((PID_B, 6))
        switch.pump()  # refused: held (not dropped), although less than 60 s went by
        assert full_drops() == 4
        assert _received(stalled_b) == [4, 5]
        switch.pump()
        assert _received(stalled_b) == [6]
        assert full_drops() == 4
        # D, still stopped, stays stalled: its next refused datagram is dropped, not held.
        send((pid_d, 4))
        switch.pump()
        assert full_drops() == 5
        assert _received(stalled_d) == [0, 1]


def test_pump_thread_forwards_a_burst_past_a_unix_destination_queue(tmp_path: Path) -> None:
    # A Unix datagram socket queues net.unix.max_dgram_qlen datagrams (10 by default): a
    # burst of 40 to a destination that is not reading is held and paced, none lost.
    router = Router()
    with (
        UnixDatagramSocket.bind(str(tmp_path / "src.sock")) as source,
        UnixDatagramSocket.bind(str(tmp_path / "dst.sock")) as destination,
    ):
        router.insert(PID_B, Route.permanent(destination.local_addr))
        carrier = UnixDatagramSocket.bind(str(tmp_path / "switch.sock"))
        with DatagramSwitch.spawn(carrier, router) as switch:
            sent = 0
            deadline = time.monotonic() + WAIT
            while sent < 40:  # the switch's own queue may be full for a moment
                assert time.monotonic() < deadline, "the switch did not take the burst"
                if source.try_send_to(segment(PID_B, 1000, sent), switch.carrier.local_addr):
                    sent += 1
            wait_for(lambda: switch.statistics().received == 40, "the burst at the switch")
            got: list[bytes] = []
            deadline = time.monotonic() + WAIT
            while len(got) < 40:
                assert time.monotonic() < deadline, f"only {len(got)} of 40 arrived"
                item = destination.try_recv_from()
                if item is None:
                    time.sleep(0.001)
                else:
                    got.append(item[0])
            assert got == [segment(PID_B, 1000, fill) for fill in range(40)]
            assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 0


# --------------------------------------------------------------------------------------------
# bindings


def test_bind_routed_many_is_all_or_nothing(switch: DatagramSwitch) -> None:
    switch.bind(PID_B)
    with pytest.raises(AddressInUseError):
        switch.bind_routed_many([PID_A, PID_B])
    with pytest.raises(AddressInUseError):
        switch.bind_routed_many([PID_A, PID_A])
    with pytest.raises(ValueError, match="at least one"):
        switch.bind_routed_many([])
    # PID_A was not registered by the failed attempts.
    node = switch.bind_routed_many([PID_A, Pid.LINK_LOCAL])
    assert node.pids == (PID_A, Pid.LINK_LOCAL)
    assert node.local_addr == DatagramAddr.switch(switch.switch_id, PID_A)
    assert node.routed


def test_one_binding_receives_for_every_pid_it_holds(
    switch: DatagramSwitch, carrier: FakeCarrier
) -> None:
    node = switch.bind_routed_many([PID_A, Pid.LINK_LOCAL])
    carrier.inject(single(short(PID_A, b"app")), single(short(Pid.LINK_LOCAL, b"ll")))
    switch.pump()
    assert recv_all(node) == [(short(PID_A, b"app"), PEER), (short(Pid.LINK_LOCAL, b"ll"), PEER)]


def test_binding_shutdown_unregisters_exactly_its_own_registration(
    switch: DatagramSwitch,
) -> None:
    old = switch.bind(PID_A)
    old.shutdown()
    new = switch.bind(PID_A)
    assert new.binding_id != old.binding_id
    # A late cleanup of the old registration (as dispatch does when it finds a closed
    # binding) must not remove the new one.
    switch._unregister(old)
    old.shutdown()
    sender = switch.bind(PID_B)
    assert sender.try_send_to(short(PID_A), new.local_addr)
    assert new.try_recv_from() == (short(PID_A), sender.local_addr)


def test_binding_after_shutdown_rejects_every_operation(switch: DatagramSwitch) -> None:
    a = switch.bind(PID_A)
    woken: list[str] = []
    a.add_recv_waker(lambda: woken.append("recv"))
    a.shutdown()
    a.shutdown()
    assert woken == ["recv"]
    assert a.is_shutdown
    assert a.join(0)
    with pytest.raises(SocketClosedError):
        a.try_recv_from()
    with pytest.raises(SocketClosedError):
        a.try_recv([bytearray(10)], [])
    with pytest.raises(SocketClosedError):
        a.try_send_to(short(PID_B), SUPPLIED)
    a.add_recv_waker(lambda: woken.append("late"))
    assert woken == ["recv", "late"]


def test_queue_capacity_is_validated(switch: DatagramSwitch) -> None:
    for bad in (0, -1, 1 << 21, True):
        with pytest.raises(ValueError, match="queue_capacity"):
            switch.bind(PID_A, queue_capacity=bad)
    with pytest.raises(TypeError):
        switch.bind(bytes(16))  # type: ignore[arg-type]


def test_recv_waker_fires_on_enqueue_and_at_once_when_data_is_queued(
    switch: DatagramSwitch,
) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B)
    woken: list[int] = []
    b.add_recv_waker(lambda: woken.append(1))
    assert woken == []
    a.try_send_to(short(PID_B), b.local_addr)
    assert woken == [1]
    a.try_send_to(short(PID_B), b.local_addr)
    assert woken == [1]  # one-shot
    b.add_recv_waker(lambda: woken.append(2))
    assert woken == [1, 2]  # data already queued


def test_full_local_queue_drops_and_send_waits_for_that_queue(
    switch: DatagramSwitch, carrier: FakeCarrier
) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B, queue_capacity=2)
    assert a.try_send_to(short(PID_B, b"1"), b.local_addr)
    assert a.try_send_to(short(PID_B, b"2"), b.local_addr)
    assert a.try_send_to(short(PID_B, b"3"), b.local_addr) is False  # would block

    woken: list[int] = []
    assert a.send_readiness_fd(b.local_addr) is None
    a.add_send_waker(b.local_addr, lambda: woken.append(1))
    assert woken == []
    assert carrier.send_wakers == []
    assert b.try_recv_from() == (short(PID_B, b"1"), a.local_addr)
    assert woken == [1]
    assert a.try_send_to(short(PID_B, b"3"), b.local_addr)

    carrier.inject(single(short(PID_B, b"from the wire")))
    switch.pump()  # the queue is full again: dropped
    stats = switch.statistics()
    assert stats.dropped[DropReason.LOCAL_QUEUE_FULL] == 2
    assert b.statistics().refused == 2
    assert b.statistics().queued == 2
    assert [data for data, _ in recv_all(b)] == [short(PID_B, b"2"), short(PID_B, b"3")]


def test_every_sender_waiting_on_a_full_binding_is_woken(switch: DatagramSwitch) -> None:
    a = switch.bind(PID_A)
    c = switch.bind(PID_C)
    b = switch.bind(PID_B, queue_capacity=1)
    assert a.try_send_to(short(PID_B, b"1"), b.local_addr)
    woken: list[str] = []
    for sender, name in ((a, "a1"), (a, "a2"), (c, "c1")):  # two waiters on one binding
        assert sender.try_send_to(short(PID_B, name.encode()), b.local_addr) is False
        sender.add_send_waker(b.local_addr, functools.partial(woken.append, name))
    assert woken == []
    assert b.try_recv_from() is not None
    assert sorted(woken) == ["a1", "a2", "c1"]


def test_shutting_a_sender_down_wakes_all_of_its_waiting_sends(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_C, Route.permanent(DST_B))
    a = switch.bind_routed(PID_A)
    b = switch.bind(PID_B, queue_capacity=1)
    assert a.try_send_to(short(PID_B, b"1"), SUPPLIED)
    woken: list[str] = []
    assert a.try_send_to(short(PID_B, b"2"), SUPPLIED) is False  # waits on binding b
    a.add_send_waker(SUPPLIED, lambda: woken.append("local"))
    a.add_send_waker(SUPPLIED, lambda: woken.append("local again"))
    carrier.blocked = True
    assert a.try_send_to(short(PID_C), SUPPLIED) is False  # waits on the egress carrier
    a.add_send_waker(SUPPLIED, lambda: woken.append("egress"))
    assert woken == []
    a.shutdown()
    assert sorted(woken) == ["egress", "local", "local again"]
    for _, waker in carrier.send_wakers:
        waker()  # a later wake from the carrier is not delivered twice
    assert b.try_recv_from() is not None
    assert sorted(woken) == ["egress", "local", "local again"]


def test_parked_send_wakers_are_bounded_and_none_is_lost(switch: DatagramSwitch) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B, queue_capacity=1)
    assert a.try_send_to(short(PID_B), b.local_addr)
    assert a.try_send_to(short(PID_B), b.local_addr) is False
    woken: list[int] = []
    for index in range(1500):
        a.add_send_waker(b.local_addr, functools.partial(woken.append, index))
    assert 0 < len(woken) <= 1500  # overflow wakes the parked ones (spuriously) at once
    assert len(b._send_waiters) <= 1024
    assert len(a._own_wakers) <= 1024
    assert b.try_recv_from() is not None
    assert sorted(woken) == list(range(1500))  # each exactly once


def test_binding_queue_is_bounded_in_bytes(switch: DatagramSwitch, carrier: FakeCarrier) -> None:
    assert switch.bind(PID_C).queue_bytes == DEFAULT_BINDING_BYTES
    a = switch.bind(PID_A)
    b = switch.bind(PID_B, queue_bytes=100)
    big = short(PID_B, bytes(200))  # more than the bound: an empty queue still takes it
    assert a.try_send_to(big, b.local_addr)
    assert a.try_send_to(short(PID_B, b"x"), b.local_addr) is False
    assert b.statistics().queued_bytes == len(big)
    assert b.statistics().byte_capacity == 100
    woken: list[int] = []
    a.add_send_waker(b.local_addr, lambda: woken.append(1))
    assert b.try_recv_from() == (big, a.local_addr)
    assert woken == [1]
    assert b.statistics().queued_bytes == 0
    item = short(PID_B, bytes(40))  # 64 bytes
    assert a.try_send_to(item, b.local_addr)
    assert a.try_send_to(item, b.local_addr)  # 64 < 100 queued: admitted (128 now)
    assert a.try_send_to(item, b.local_addr) is False
    carrier.inject(single(item))
    switch.pump()
    assert switch.statistics().dropped[DropReason.LOCAL_QUEUE_FULL] >= 1
    assert b.statistics().queued == 2
    with pytest.raises(ValueError):
        switch.bind(PID_C, queue_bytes=0)


def test_draining_part_of_a_queued_aggregate_frees_bytes_and_wakes_senders(
    switch: DatagramSwitch,
) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B, queue_bytes=64)
    batch = b"".join(segment(PID_B, 64, fill) for fill in range(4))
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, batch, 64)) == 4
    assert a.try_send_to(short(PID_B), b.local_addr) is False
    woken: list[int] = []
    a.add_send_waker(b.local_addr, lambda: woken.append(1))
    assert b.try_recv_from() == (batch[:64], a.local_addr)  # splits the aggregate
    assert woken == [1]
    assert b.statistics().queued_bytes == 192
    buffers = [bytearray(100)]
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv(buffers, metas) == 1  # takes one more 64-byte stride
    assert b.statistics().queued_bytes == 128


def test_full_egress_queue_returns_zero_and_waits_on_the_route_destination(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    routed = switch.bind_routed(PID_A)
    carrier.blocked = True
    assert routed.try_send_to(short(PID_B), SUPPLIED) is False
    woken: list[int] = []
    routed.add_send_waker(SUPPLIED, lambda: woken.append(1))
    [(destination, waker)] = carrier.send_wakers
    assert destination == DST_B
    waker()
    assert woken == [1]
    assert router.statistics().dropped[DropReason.EGRESS_QUEUE_FULL] == 1


def test_other_drops_count_as_consumed_for_the_sender(
    switch: DatagramSwitch, router: Router
) -> None:
    routed = switch.bind_routed(PID_A)
    assert routed.try_send_to(short(PID_C), SUPPLIED) is True  # no route: dropped, consumed
    assert routed.try_send_to(b"\x40\x01", SUPPLIED) is True  # malformed: dropped, consumed
    gate = RouteGate()
    router.insert(PID_B, Route.gated(DST_B, gate))
    gate.close()
    transmit = DatagramTransmit(SUPPLIED, segment(PID_B, 40) * 3, 40)
    assert routed.try_send_transmit(transmit) == 3
    stats = router.statistics()
    assert stats.dropped[DropReason.NO_ROUTE] == 1
    assert stats.dropped[DropReason.INACTIVE] == 3
    assert switch.statistics().dropped[DropReason.MALFORMED] == 1


def test_plain_binding_rejects_another_switch_and_passes_other_schemes_to_the_egress(
    switch: DatagramSwitch, carrier: FakeCarrier
) -> None:
    a = switch.bind(PID_A)
    other_switch = DatagramAddr.switch(switch.switch_id + 1000, PID_B)
    with pytest.raises(HostUnreachableError):
        a.try_send_to(short(PID_B), other_switch)

    assert a.try_send_to(short(PID_B), SUPPLIED) is True
    assert a.try_send_transmit(DatagramTransmit(SUPPLIED, segment(PID_C, 30) * 2, 30, 1)) == 2
    assert carrier.sent == [(short(PID_B), SUPPLIED)]
    assert carrier.transmits == [(segment(PID_C, 30) * 2, SUPPLIED, 30, 1, 2)]


def test_every_segment_sent_to_a_switch_address_must_carry_its_pid(
    switch: DatagramSwitch,
) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B)
    mixed = segment(PID_B, 40) + segment(PID_C, 40)
    with pytest.raises(DestinationMismatchError):
        a.try_send_transmit(DatagramTransmit(b.local_addr, mixed, 40))
    assert b.try_recv_from() is None


def test_routed_link_local_traffic_goes_to_the_supplied_destination(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.set_default(Route.permanent(DST_PARENT))
    node = switch.bind_routed_many([PID_A, Pid.LINK_LOCAL])
    adjacent = DatagramAddr.inproc(1, 77)
    assert node.try_send_to(short(Pid.LINK_LOCAL, b"hello"), adjacent)
    assert carrier.sent == [(short(Pid.LINK_LOCAL, b"hello"), adjacent)]


def test_limits_follow_the_egress_for_routed_bindings(switch: DatagramSwitch) -> None:
    plain = switch.bind(PID_A)
    routed = switch.bind_routed(PID_B)
    assert plain.max_transmit_segments == 1
    assert routed.max_transmit_segments == switch.carrier.max_transmit_segments
    assert plain.max_receive_segments == DATAGRAM_BATCH_SIZE
    assert plain.fileno() is None
    assert plain.may_fragment == switch.carrier.may_fragment


def test_oversized_and_overlong_sends_are_bounded(switch: DatagramSwitch) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B, queue_capacity=100)
    with pytest.raises(DatagramTooLargeError):
        a.try_send_to(segment(PID_B, 70_000), b.local_addr)
    many = segment(PID_B, 30) * (DATAGRAM_BATCH_SIZE + 8)
    # At most one batch is consumed per call; the caller sends the suffix next.
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, many, 30)) == DATAGRAM_BATCH_SIZE
    assert len(recv_all(b)) == DATAGRAM_BATCH_SIZE


def test_batch_receive_splits_aggregates_that_do_not_fit_and_rejects_oversized_datagrams(
    switch: DatagramSwitch,
) -> None:
    a = switch.bind(PID_A)
    b = switch.bind(PID_B)
    segments = [segment(PID_B, 50, fill) for fill in range(4)]
    a.try_send_transmit(DatagramTransmit(b.local_addr, b"".join(segments), 50))
    a.try_send_to(segment(PID_B, 200), b.local_addr)

    buffers = [bytearray(120), bytearray(120), bytearray(120)]
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv(buffers, metas) == 2  # 2 strides, 2 strides; the 200-byte one waits
    assert [(m.length, m.stride) for m in metas] == [(100, 50), (100, 50)]
    assert bytes(buffers[0][:100]) == segments[0] + segments[1]
    assert bytes(buffers[1][:100]) == segments[2] + segments[3]

    with pytest.raises(InvalidDataError):
        b.try_recv([bytearray(120)], [])
    assert b.try_recv_from() is None  # the oversized datagram was consumed


def test_mixed_target_transmit_is_dispatched_segment_by_segment(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    routed = switch.bind_routed(PID_A)
    local = switch.bind(PID_C)
    seg_b, seg_c = segment(PID_B, 40, 1), segment(PID_C, 40, 2)

    mixed = DatagramTransmit(SUPPLIED, seg_c + seg_b + seg_c, 40)
    assert routed.try_send_transmit(mixed) == 3
    assert recv_all(local) == [(seg_c, routed.local_addr), (seg_c, routed.local_addr)]
    assert carrier.sent == [(seg_b, DST_B)]
    assert router.statistics().forwarded == 1


def test_mixed_target_transmit_stops_at_a_full_queue_without_counting_the_rest(
    switch: DatagramSwitch, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    routed = switch.bind_routed(PID_A)
    local = switch.bind(PID_C, queue_capacity=1)
    seg_b, seg_c = segment(PID_B, 40), segment(PID_C, 40)
    mixed = DatagramTransmit(SUPPLIED, seg_b + seg_c + seg_c + seg_b, 40)

    assert routed.try_send_transmit(mixed) == 2  # B forwarded, C queued, second C: full
    assert switch.statistics().dropped[DropReason.LOCAL_QUEUE_FULL] == 0
    assert routed.try_send_transmit(mixed.suffix(2)) == 0  # nothing accepted: would block
    assert switch.statistics().dropped[DropReason.LOCAL_QUEUE_FULL] == 2
    woken: list[int] = []
    routed.add_send_waker(SUPPLIED, lambda: woken.append(1))
    assert local.try_recv_from() == (seg_c, routed.local_addr)
    assert woken == [1]
    assert routed.try_send_transmit(mixed.suffix(2)) == 2


def test_mixed_target_transmit_returns_other_drops_as_consuming_the_rest(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    routed = switch.bind_routed(PID_A)
    seg_b, seg_c = segment(PID_B, 40), segment(PID_C, 40)

    mixed = DatagramTransmit(SUPPLIED, seg_b + seg_c + seg_b, 40)
    assert routed.try_send_transmit(mixed) == 3  # C has no route: the rest goes with it
    assert carrier.sent == [(seg_b, DST_B)]
    stats = router.statistics()
    assert stats.forwarded == 1
    assert stats.dropped[DropReason.NO_ROUTE] == 2


# --------------------------------------------------------------------------------------------
# pump: dispatch of received datagrams


def test_pump_regroups_consecutive_datagrams_for_the_same_route(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    router.insert(PID_C, Route.permanent(DST_PARENT))
    s1, s2, s3 = (segment(PID_B, 100, fill) for fill in (1, 2, 3))
    c1 = segment(PID_C, 100)
    carrier.inject(
        single(s1, ecn=2),
        single(s2, ecn=2),
        single(s3, ecn=2),
        single(c1),
        single(segment(PID_B, 100), source=PEER2),  # another source: its own transmit
        single(segment(PID_B, 90)),  # another length: its own transmit
    )

    assert switch.pump() == 6

    assert carrier.transmits[0] == (s1 + s2 + s3, DST_B, 100, 2, 3)
    assert carrier.sent == [
        (c1, DST_PARENT),
        (segment(PID_B, 100), DST_B),
        (segment(PID_B, 90), DST_B),
    ]
    assert len(carrier.transmits) == 1
    assert router.statistics().forwarded == 6
    assert switch.statistics().received == 6


def test_pump_retries_the_unsent_suffix_of_a_regrouped_batch(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    carrier.accept = 2
    segments = [segment(PID_B, 64, fill) for fill in range(5)]
    carrier.inject(*(single(s) for s in segments))

    switch.pump()

    assert [(t[0], t[4]) for t in carrier.transmits] == [
        (segments[0] + segments[1] + segments[2] + segments[3] + segments[4], 2),
        (segments[2] + segments[3] + segments[4], 2),
        (segments[4], 1),
    ]
    assert router.statistics().forwarded == 5


def test_pump_delivers_received_aggregates_whole_and_drops_malformed(
    switch: DatagramSwitch, carrier: FakeCarrier
) -> None:
    b = switch.bind(PID_B)
    aggregate = b"".join(segment(PID_B, 40, fill) for fill in range(3))
    carrier.inject((aggregate, PEER, 40, 1), single(b"\x40\x00"), single(b""))

    assert switch.pump() == 5

    buffers = [bytearray(200)]
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv(buffers, metas) == 1
    assert metas == [DatagramRecvMeta(PEER, 120, 40, 1)]
    assert switch.statistics().dropped[DropReason.MALFORMED] == 2
    assert switch.statistics().delivered == 3


def test_pump_counts_forwarding_errors_and_keeps_going(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.set_default(Route.permanent(DST_PARENT))
    b = switch.bind(PID_B)
    carrier.fail = HostUnreachableError("parent gone")
    carrier.inject(single(short(PID_C)), single(short(PID_B)))

    assert switch.pump() == 2

    assert switch.statistics().forward_errors == 1
    assert b.try_recv_from() == (short(PID_B), PEER)
    assert not switch.is_shutdown


def test_receive_error_shuts_the_switch_down(switch: DatagramSwitch, carrier: FakeCarrier) -> None:
    b = switch.bind(PID_B)
    carrier.recv_error = OSError(errno.EIO, "the carrier failed")
    with pytest.raises(OSError, match="the carrier failed"):
        switch.pump()
    assert switch.is_shutdown
    assert switch.error is carrier.recv_error
    assert b.is_shutdown
    assert carrier.is_shutdown
    with pytest.raises(SocketClosedError):
        switch.pump()
    with pytest.raises(SocketClosedError):
        switch.bind(PID_A)
    assert switch.join(WAIT)


def test_switch_shutdown_shuts_down_bindings_and_the_carrier(
    switch: DatagramSwitch, carrier: FakeCarrier
) -> None:
    a = switch.bind(PID_A)
    b = switch.bind_routed(PID_B)
    switch.shutdown()
    switch.shutdown()
    assert a.is_shutdown
    assert b.is_shutdown
    assert carrier.is_shutdown
    assert switch.join(WAIT)
    assert carrier.joined
    assert switch.statistics().bindings == 0
    assert switch.error is None


def test_switch_ids_are_distinct_and_positive(carrier: FakeCarrier, router: Router) -> None:
    first = DatagramSwitch(carrier, router)
    second = DatagramSwitch(FakeCarrier(), router)
    assert 1 <= first.switch_id < second.switch_id


# --------------------------------------------------------------------------------------------
# pump thread


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def test_pump_thread_is_woken_by_the_carrier_and_stops_on_shutdown(
    carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    switch = DatagramSwitch.spawn(carrier, router)
    try:
        local = switch.bind(PID_A)
        got = threading.Event()
        local.add_recv_waker(got.set)
        carrier.inject(single(short(PID_A, b"wake")))
        assert got.wait(WAIT)
        assert local.try_recv_from() == (short(PID_A, b"wake"), PEER)
        carrier.inject(single(short(PID_B)))
        wait_for(lambda: len(carrier.sent) == 1, "the forwarded datagram")
        assert carrier.sent == [(short(PID_B), DST_B)]
        with pytest.raises(RuntimeError):
            switch.start_thread()
    finally:
        switch.shutdown()
    assert switch.join(WAIT)
    assert local.is_shutdown
    assert carrier.joined
    assert switch.error is None


def test_pump_thread_records_a_receive_error(carrier: FakeCarrier, router: Router) -> None:
    with DatagramSwitch.spawn(carrier, router) as switch:
        carrier.recv_error = ConnectionResetError(errno.ECONNRESET, "bad")
        carrier.inject(single(short(PID_A)))
        wait_for(lambda: switch.is_shutdown, "the switch to shut down")
        assert switch.join(WAIT)
        assert isinstance(switch.error, ConnectionResetError)


def test_per_datagram_receive_errors_are_dropped_as_malformed_and_pumping_goes_on(
    switch: DatagramSwitch, carrier: FakeCarrier
) -> None:
    b = switch.bind(PID_B)
    carrier.recv_once.extend(
        [AddressNotAvailableError("unnamed sender"), InvalidDataError("too long")]
    )
    carrier.inject(single(short(PID_B, b"after")))
    assert switch.pump(4) == 3
    assert not switch.is_shutdown
    assert switch.error is None
    stats = switch.statistics()
    assert stats.dropped[DropReason.MALFORMED] == 2
    assert stats.received == 3
    assert b.try_recv_from() == (short(PID_B, b"after"), PEER)


def _unix_switch(tmp_path: Path) -> tuple[DatagramSwitch, str]:
    path = str(tmp_path / "switch.sock")
    return DatagramSwitch(UnixDatagramSocket.bind(path), Router()), path


def _pump_until(switch: DatagramSwitch, received: int) -> None:
    deadline = time.monotonic() + WAIT
    while switch.statistics().received < received:
        assert time.monotonic() < deadline, "the datagrams did not arrive"
        if not switch.pump(4):
            time.sleep(0.001)


def test_unix_datagram_from_an_unnamed_socket_does_not_stop_the_switch(tmp_path: Path) -> None:
    switch, path = _unix_switch(tmp_path)
    with switch, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as unnamed:
        b = switch.bind(PID_B)
        unnamed.sendto(short(PID_B, b"anonymous"), path)  # the source has no address
        named = UnixDatagramSocket.bind(str(tmp_path / "peer.sock"))
        with named:
            assert named.try_send_to(short(PID_B, b"named"), switch.carrier.local_addr)
            _pump_until(switch, 2)
        assert not switch.is_shutdown
        assert switch.error is None
        assert switch.statistics().dropped[DropReason.MALFORMED] == 1
        assert b.try_recv_from() == (short(PID_B, b"named"), named.local_addr)


def test_oversized_unix_datagram_does_not_stop_the_switch(tmp_path: Path) -> None:
    switch, path = _unix_switch(tmp_path)
    with switch, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as peer:
        b = switch.bind(PID_B)
        peer.bind(str(tmp_path / "peer.sock"))
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        peer.sendto(short(PID_B, b"small"), path)
        peer.sendto(short(PID_B, bytes(70_000)), path)  # longer than the 65,535-byte buffers
        peer.sendto(short(PID_B, b"after"), path)
        _pump_until(switch, 3)
        assert not switch.is_shutdown
        assert switch.error is None
        assert switch.statistics().dropped[DropReason.MALFORMED] == 1
        source = DatagramAddr.unixgram(str(tmp_path / "peer.sock"))
        assert recv_all(b) == [(short(PID_B, b"small"), source), (short(PID_B, b"after"), source)]


def test_pump_thread_survives_per_datagram_errors_of_a_unix_carrier(tmp_path: Path) -> None:
    path = str(tmp_path / "switch.sock")
    with DatagramSwitch.spawn(UnixDatagramSocket.bind(path), Router()) as switch:
        b = switch.bind(PID_B)
        got = threading.Event()
        b.add_recv_waker(got.set)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as unnamed:
            unnamed.sendto(short(PID_B, b"anonymous"), path)
        wait_for(lambda: switch.statistics().received == 1, "the unnamed datagram")
        with UnixDatagramSocket.bind(str(tmp_path / "peer.sock")) as named:
            assert named.try_send_to(short(PID_B, b"named"), switch.carrier.local_addr)
            assert got.wait(WAIT)
        assert not switch.is_shutdown
        assert b.try_recv_from() == (short(PID_B, b"named"), named.local_addr)
        assert switch.statistics().dropped[DropReason.MALFORMED] == 1


def test_pump_thread_works_with_a_carrier_descriptor_above_1023() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip("the descriptor limit is too low for this test")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held: list[int] = []
    try:
        while True:
            fd = os.open(os.devnull, os.O_RDONLY)
            held.append(fd)
            if fd >= 1030:
                break
        carrier = UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))
        assert carrier.fileno() >= 1024
        with DatagramSwitch.spawn(carrier, Router()) as switch:
            b = switch.bind(PID_B)
            got = threading.Event()
            b.add_recv_waker(got.set)
            with UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)) as peer:
                assert peer.try_send_to(short(PID_B, b"high"), carrier.local_addr)
                assert got.wait(WAIT), "the pump thread did not deliver"
            assert b.try_recv_from() == (short(PID_B, b"high"), peer.local_addr)
            assert switch.error is None
            assert not switch.is_shutdown
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# --------------------------------------------------------------------------------------------
# property: dispatch of received batches agrees with the spec 3.4 model

POOL = [PID_A, PID_B, PID_C, Pid(bytes([0xD4] * 16)), Pid.LINK_LOCAL]
SOURCES = [PEER, PEER2]


@settings(max_examples=120, deadline=None)
@given(
    bound=st.sets(st.sampled_from(POOL)),
    routes=st.dictionaries(
        st.sampled_from(POOL[:4]), st.tuples(st.integers(0, 2), st.booleans()), max_size=4
    ),
    default=st.none() | st.integers(0, 2),
    batch=st.lists(
        st.tuples(
            st.none() | st.sampled_from(POOL),
            st.sampled_from(SOURCES),
            st.sampled_from([30, 30, 31]),
            st.none() | st.just(2),
        ),
        min_size=1,
        max_size=DATAGRAM_BATCH_SIZE,
    ),
)
def test_pump_dispatch_agrees_with_the_model(
    bound: set[Pid],
    routes: dict[Pid, tuple[int, bool]],
    default: int | None,
    batch: list[tuple[Pid | None, DatagramAddr, int, int | None]],
) -> None:
    carrier = FakeCarrier()
    router = Router()
    switch = DatagramSwitch(carrier, router)
    destinations = [DatagramAddr.inproc(3, n) for n in range(3)]
    routes_by_pid: dict[Pid, Route] = {}
    for pid, (dst, closed) in routes.items():
        gate = RouteGate()
        if closed:
            gate.close()
        routes_by_pid[pid] = Route.gated(destinations[dst], gate)
        router.insert(pid, routes_by_pid[pid])
    default_route = None if default is None else Route.permanent(destinations[default])
    if default_route is not None:
        router.set_default(default_route)
    bindings = {pid: switch.bind(pid, queue_capacity=64) for pid in bound}

    incoming: list[Incoming] = []
    expected_local: dict[Pid, list[tuple[bytes, DatagramAddr]]] = {pid: [] for pid in bound}
    expected_forwarded: list[tuple[bytes, DatagramAddr]] = []
    expected_drops = dict.fromkeys(DropReason, 0)
    for index, (target, source, size, ecn) in enumerate(batch):
        if target is None:
            data = bytes([0xC0, 0, 0, 0, 1, 8, index]) + bytes(size - 7)  # DCID length 8
        else:
            data = segment(target, size, index)
        incoming.append((data, source, len(data), ecn))
        if target is None:
            expected_drops[DropReason.MALFORMED] += 1
        elif target in bound:
            expected_local[target].append((data, source))
        elif target == Pid.LINK_LOCAL:
            expected_drops[DropReason.UNBOUND_LINK_LOCAL] += 1
        else:
            route = routes_by_pid.get(target, default_route)
            if route is None:
                expected_drops[DropReason.NO_ROUTE] += 1
            elif not route.is_active:
                expected_drops[DropReason.INACTIVE] += 1
            else:
                expected_forwarded.append((data, route.destination))
    carrier.inject(*incoming)

    assert switch.pump() == len(batch)

    for pid, binding in bindings.items():
        assert recv_all(binding) == expected_local[pid]
    forwarded = carrier.datagrams
    # Regrouping may turn singles into one transmit, but never reorders per destination.
    for destination in destinations:
        assert [d for d, dst in forwarded if dst == destination] == [
            d for d, dst in expected_forwarded if dst == destination
        ]
    assert len(forwarded) == len(expected_forwarded)
    drops = {**router.statistics().dropped}
    for reason, count in switch.statistics().dropped.items():
        drops[reason] += count
    assert drops == expected_drops
    assert router.statistics().forwarded == len(expected_forwarded)


# --------------------------------------------------------------------------------------------
# pump over a real UDP carrier: one recvmmsg per batch (chrysalis.datagram._mmsg)


def _pump_while_not(switch: DatagramSwitch, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, "timed out pumping the switch"
        if not switch.pump(8):
            time.sleep(0.001)


def _drain(sock: UdpSocket, into: list[bytes]) -> int:
    """Receive what is ready from ``sock`` (aggregates split); the number of datagrams."""
    before = len(into)
    while (item := sock.try_recv_from()) is not None:
        into.append(item[0])
    return len(into) - before


def test_udp_switch_forwards_batches_byte_identical_and_in_order() -> None:
    with (
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)) as receiver,
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gso=False) as sender,
        DatagramSwitch(UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)), Router()) as switch,
    ):
        switch.router.insert(PID_B, Route.permanent(receiver.local_addr))
        if recv_ring_supported():
            assert switch._ring is not None  # the batched receive path is the one under test
        sent = [segment(PID_B, 1200, n % 251) for n in range(70)]
        long_header = bytes([0xC0, 0, 0, 0, 1, 20]) + bytes(ConnectionId.issued(PID_B, 1))
        sent += [segment(PID_B, 700, 1), long_header + b"hs", segment(PID_B, 1200)]
        for datagram in sent:
            assert sender.try_send_to(datagram, switch.carrier.local_addr)
        got: list[bytes] = []
        _pump_while_not(switch, lambda: _drain(receiver, got) >= 0 and len(got) >= len(sent))
        assert got == sent
        assert switch.statistics().received == len(sent)
        assert switch.router.statistics().forwarded == len(sent)


def test_udp_switch_delivers_locally_with_the_sender_address_and_drops_malformed() -> None:
    with (
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)) as sender,
        DatagramSwitch(UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)), Router()) as switch,
    ):
        local = switch.bind(PID_A)
        for datagram in (short(PID_A, b"one"), b"", b"\x40\x01", short(PID_A, b"two")):
            assert sender.try_send_to(datagram, switch.carrier.local_addr)
        _pump_while_not(switch, lambda: switch.statistics().received >= 4)
        assert recv_all(local) == [
            (short(PID_A, b"one"), sender.local_addr),
            (short(PID_A, b"two"), sender.local_addr),
        ]
        assert switch.statistics().dropped[DropReason.MALFORMED] == 2


@pytest.mark.skipif(not udp_gso_supported(), reason="no UDP GSO")
def test_udp_switch_serves_a_split_remainder_on_its_carrier_first() -> None:
    carrier = UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gro=True)
    with (
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gso=True) as sender,
        DatagramSwitch(carrier, Router()) as switch,
    ):
        local = switch.bind(PID_A)
        parts = [segment(PID_A, 500, n) for n in range(3)]
        assert sender.try_send_transmit(DatagramTransmit(carrier.local_addr, b"".join(parts), 500))
        deadline = time.monotonic() + WAIT
        while (first := carrier.try_recv_from()) is None:  # leaves the rest of an aggregate
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert first[0] == parts[0]
        assert sender.try_send_to(short(PID_A, b"later"), carrier.local_addr)
        _pump_while_not(switch, lambda: switch.statistics().received >= 3)
        assert [data for data, _ in recv_all(local)] == [*parts[1:], short(PID_A, b"later")]


def test_udp_switch_counts_a_datagram_too_large_for_its_ring_as_malformed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not recv_ring_supported():
        pytest.skip("no recvmmsg here")

    def small_ring(self: UdpSocket) -> RecvRing:
        return RecvRing(socket.AF_INET, 4, 256)

    monkeypatch.setattr(UdpSocket, "_new_recv_ring", small_ring)
    with (
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)) as sender,
        DatagramSwitch(UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)), Router()) as switch,
    ):
        local = switch.bind(PID_A)
        for datagram in (short(PID_A, b"x" * 300), short(PID_A, b"fits")):
            assert sender.try_send_to(datagram, switch.carrier.local_addr)
        _pump_while_not(switch, lambda: switch.statistics().received >= 2)
        assert recv_all(local) == [(short(PID_A, b"fits"), sender.local_addr)]
        assert switch.statistics().dropped[DropReason.MALFORMED] == 1


def test_udp_switch_without_recvmmsg_receives_through_try_recv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("chrysalis.datagram._udp.recv_ring_supported", lambda: False)
    with (
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)) as receiver,
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)) as sender,
        DatagramSwitch(UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)), Router()) as switch,
    ):
        assert switch._ring is None
        switch.router.insert(PID_B, Route.permanent(receiver.local_addr))
        sent = [segment(PID_B, 300, n) for n in range(5)]
        for datagram in sent:
            assert sender.try_send_to(datagram, switch.carrier.local_addr)
        got: list[bytes] = []
        _pump_while_not(switch, lambda: _drain(receiver, got) >= 0 and len(got) >= len(sent))
        assert got == sent


def test_pump_stops_after_a_batch_that_did_not_fill_the_buffers(
    switch: DatagramSwitch, carrier: FakeCarrier, router: Router
) -> None:
    router.insert(PID_B, Route.permanent(DST_B))
    carrier.inject(*(single(segment(PID_B, 40, n)) for n in range(DATAGRAM_BATCH_SIZE)))
    carrier.inject(single(segment(PID_B, 40)), single(segment(PID_B, 41)))
    carrier.inject(single(segment(PID_B, 42)))

    assert switch.pump(8) == DATAGRAM_BATCH_SIZE + 2  # the full batch, then a partial one
    assert len(carrier.batches) == 1
    assert switch.pump(8) == 1
    assert switch.pump(8) == 0


def test_a_waker_called_inside_pump_may_shut_down_and_join_the_switch(
    switch: DatagramSwitch, carrier: FakeCarrier
) -> None:
    local = switch.bind(PID_B)
    joined: list[bool] = []

    def waker() -> None:
        switch.shutdown()
        joined.append(switch.join(WAIT))

    local.add_recv_waker(waker)
    carrier.inject(single(short(PID_B)))
    switch.pump()
    assert joined == [True]
    assert carrier.joined


def test_join_waits_for_a_pump_in_progress_before_joining_the_carrier(
    carrier: FakeCarrier,
) -> None:
    switch = DatagramSwitch(carrier, Router())
    local = switch.bind(PID_B)
    entered = threading.Event()
    release = threading.Event()

    def slow_waker() -> None:  # runs inside pump(), holding the pump
        entered.set()
        release.wait(WAIT)

    local.add_recv_waker(slow_waker)
    carrier.inject(single(short(PID_B)))
    pumper = threading.Thread(target=switch.pump)
    pumper.start()
    try:
        assert entered.wait(WAIT)
        switch.shutdown()
        assert switch.join(0.05) is False  # the pump still runs: the carrier stays open
        assert not carrier.joined
    finally:
        release.set()
        pumper.join(WAIT)
    assert switch.join(WAIT)
    assert carrier.joined


def test_udp_switch_ring_receive_error_shuts_the_carrier_and_the_switch_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not recv_ring_supported():
        pytest.skip("no recvmmsg here")

    def failing(self: RecvRing, fd: int) -> int:
        raise OSError(errno.EIO, "the kernel failed")

    switch = DatagramSwitch(UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0)), Router())
    monkeypatch.setattr(RecvRing, "receive", failing)
    with pytest.raises(OSError, match="the kernel failed"):
        switch.pump()
    assert switch.is_shutdown
    assert switch.carrier.is_shutdown
    assert isinstance(switch.error, OSError)
    assert switch.error.errno == errno.EIO
    assert switch.join(WAIT)
