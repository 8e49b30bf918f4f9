"""``EndpointDriver``, the runtime-neutral I/O step both adapters run: regrouping output into
segmented (GSO) transmits, order and bounds under carrier backpressure, splitting received
aggregates, per-destination errors, timers, and the thread-mode notifier."""

from __future__ import annotations

import select
from collections.abc import Sequence
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr
from chrysalis.datagram import (
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTransmit,
    HostUnreachableError,
    SocketClosedError,
    Waker,
)
from chrysalis.quic import QuicEndpoint
from chrysalis.quic._driver import EndpointDriver, ThreadNotifier

ADDRS = [DatagramAddr.inproc(77, index) for index in range(1, 4)]


class FakeEndpoint:
    """Stands in for ``QuicEndpoint``: scripted output, recorded input and timer calls."""

    def __init__(self) -> None:
        self.output: list[tuple[bytes, DatagramAddr]] = []
        self.fed: list[tuple[bytes, DatagramAddr]] = []
        self.timer: float | None = None
        self.timers_fired: list[float] = []
        self.polls = 0
        self.is_stopped = False

    def receive_datagram(self, data: bytes, source: DatagramAddr, now: float) -> None:
        self.fed.append((data, source))

    def get_timer(self) -> float | None:
        return self.timer

    def timer_due(self, now: float) -> bool:
        return self.timer is not None and self.timer <= now

    def handle_timer(self, now: float) -> None:
        self.timers_fired.append(now)
        self.timer = None

    def poll(self, now: float) -> None:
        self.polls += 1

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, DatagramAddr]]:
        out, self.output = self.output, []
        return out


class FakeSocket(DatagramSocket):
    """A carrier whose sends follow a script of accepted counts (None: accept all)."""

    def __init__(self, segments: int = 32, receive_segments: int = 1) -> None:
        self.transmits: list[DatagramTransmit] = []
        self.accept: list[int | None] = []
        self.inbox: list[tuple[bytes, DatagramAddr, int]] = []
        self.failing: set[DatagramAddr] = set()
        self.closed = False
        self.receive_calls = 0
        self.per_call = 1 << 30  # datagrams (or aggregates) one try_recv hands over at most
        self._segments = segments
        self._receive_segments = receive_segments

    @property
    def local_addr(self) -> DatagramAddr:
        return DatagramAddr.inproc(77, 99)

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        return self.try_send_transmit(DatagramTransmit(destination, data)) == 1

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        if self.closed:
            raise SocketClosedError()
        if transmit.destination in self.failing:
            raise HostUnreachableError()
        budget = self.accept.pop(0) if self.accept else None
        count = transmit.segment_count if budget is None else min(budget, transmit.segment_count)
        if count:
            whole = bytes(transmit.contents)
            size = transmit.segment_size or len(whole)
            kept = DatagramTransmit(
                transmit.destination, whole[: count * size], transmit.segment_size
            )
            self.transmits.append(kept)
        return count

    def try_recv(self, buffers: Sequence[Any], metas: list[DatagramRecvMeta]) -> int:
        if self.closed:
            raise SocketClosedError()
        self.receive_calls += 1
        filled = 0
        while self.inbox and filled < min(len(buffers), self.per_call):
            data, source, stride = self.inbox.pop(0)
            buffers[filled][: len(data)] = data
            metas.append(DatagramRecvMeta(source, len(data), stride))
            filled += 1
        return filled

    def fileno(self) -> int | None:
        return None

    def add_recv_waker(self, waker: Waker) -> None:
        pass

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        pass

    @property
    def max_transmit_segments(self) -> int:
        return self._segments

    @property
    def max_receive_segments(self) -> int:
        return self._receive_segments

    def shutdown(self) -> None:
        self.closed = True

    @property
    def is_shutdown(self) -> bool:
        return self.closed

    def join(self, timeout: float | None = None) -> bool:
        return True

    def sent(self) -> list[tuple[bytes, DatagramAddr]]:
        out = []
        for transmit in self.transmits:
            for index in range(transmit.segment_count):
                out.append((bytes(transmit.segment(index)), transmit.destination))
        return out


def make(
    segments: int = 32,
    max_pending: int = 4096,
    receive_segments: int = 1,
    threadsafe: bool = True,
) -> tuple[FakeEndpoint, FakeSocket, EndpointDriver]:
    endpoint = FakeEndpoint()
    sock = FakeSocket(segments, receive_segments)
    clock = iter(float(n) for n in range(10_000))
    driver = EndpointDriver(
        cast(QuicEndpoint, endpoint),
        sock,
        clock=lambda: next(clock),
        max_pending_datagrams=max_pending,
        threadsafe=threadsafe,
    )
    return endpoint, sock, driver


datagram = st.tuples(st.sampled_from([1200, 1200, 1200, 700, 40]), st.integers(0, 2))


@settings(max_examples=150, deadline=None)
@given(st.lists(datagram, max_size=80), st.sampled_from([1, 4, 32]))
def test_output_is_regrouped_into_maximal_uniform_transmits_in_order(
    shape: list[tuple[int, int]], segments: int
) -> None:
    endpoint, sock, driver = make(segments)
    batch = [
        (bytes([index % 256]) * size, ADDRS[where]) for index, (size, where) in enumerate(shape)
    ]
    endpoint.output = list(batch)
    driver.step()
    assert sock.sent() == batch  # nothing lost, duplicated or reordered
    for transmit in sock.transmits:
        count = transmit.segment_count
        assert count <= segments
        if count > 1:
            size = transmit.segment_size
            assert size is not None
            assert all(len(transmit.segment(i)) == size for i in range(count - 1))
            assert len(transmit.segment(count - 1)) <= size
    # Maximal: two neighbouring transmits could not have been one.
    for left, right in zip(sock.transmits, sock.transmits[1:], strict=False):
        size = left.segment_size or len(left.contents)
        last = len(left.segment(left.segment_count - 1))
        first = len(right.segment(0))
        assert (
            left.destination != right.destination
            or left.segment_count >= segments
            or last < size
            or first > size
        )
    assert driver.statistics().datagrams_sent == len(batch)


@pytest.mark.parametrize("threadsafe", [True, False])
def test_backpressure_keeps_order_and_resumes_where_it_stopped(threadsafe: bool) -> None:
    """(Also without the step lock, as the inline drivers run it.)"""
    endpoint, sock, driver = make(segments=32, threadsafe=threadsafe)
    first = [(bytes([i]) * 1200, ADDRS[0]) for i in range(5)]
    endpoint.output = list(first)
    sock.accept = [2, 0]  # two datagrams go out, then the carrier would block
    driver.step()
    assert list(driver.held_destinations) == [ADDRS[0]]
    assert driver.statistics().pending_datagrams == 3
    second = [(b"z" * 1200, ADDRS[1])]
    endpoint.output = list(second)
    driver.step()  # the carrier accepts again: the hold drains first, then new output
    assert sock.sent() == first + second
    assert not driver.held_destinations
    assert driver.statistics().pending_datagrams == 0


def test_output_beyond_the_pending_bound_drops_the_oldest_and_is_counted() -> None:
    endpoint, sock, driver = make(segments=1, max_pending=4)
    endpoint.output = [(bytes([i]) * 100, ADDRS[0]) for i in range(10)]
    sock.accept = [0] * 10
    driver.step()
    stats = driver.statistics()
    assert stats.pending_datagrams == 4
    assert stats.send_drops == stats.hold_drops == 6
    sock.accept = []
    driver.step()
    assert [data[0] for data, _ in sock.sent()] == [6, 7, 8, 9]


def test_an_unreachable_destination_drops_only_its_datagrams() -> None:
    endpoint, sock, driver = make()
    sock.failing.add(ADDRS[1])
    endpoint.output = [(b"a" * 10, ADDRS[0]), (b"b" * 10, ADDRS[1]), (b"c" * 10, ADDRS[2])]
    driver.step()
    assert sock.sent() == [(b"a" * 10, ADDRS[0]), (b"c" * 10, ADDRS[2])]
    assert driver.statistics().send_drops == 1
    assert not driver.socket_failed


def test_a_shut_down_socket_fails_the_driver_without_raising() -> None:
    endpoint, sock, driver = make()
    sock.closed = True
    endpoint.output = [(b"x", ADDRS[0])]
    assert driver.step() is False
    assert driver.socket_failed
    endpoint.output = [(b"y", ADDRS[0])]
    driver.step()  # output after the failure is dropped, the endpoint still runs
    assert driver.statistics().send_drops == 2
    assert endpoint.polls == 2


def test_received_aggregates_are_split_by_stride_and_fed_in_order() -> None:
    endpoint, sock, driver = make(receive_segments=8)
    source = ADDRS[2]
    aggregate = b"".join(bytes([i]) * 100 for i in range(3)) + b"\x09" * 40
    sock.inbox = [(aggregate, source, 100), (b"single", ADDRS[0], 6)]
    driver.step()
    assert endpoint.fed == [
        (b"\x00" * 100, source),
        (b"\x01" * 100, source),
        (b"\x02" * 100, source),
        (b"\x09" * 40, source),
        (b"single", ADDRS[0]),
    ]
    assert driver.statistics().datagrams_received == 5


def test_one_datagram_per_receive_call_is_fed_in_order_and_counted() -> None:
    """A carrier that hands over one datagram or aggregate per call (the lone-datagram path
    of the step, mixed with aggregates): every batch of the step is still asked for, in
    order, and each datagram counted once."""
    endpoint, sock, driver = make(receive_segments=8)
    sock.per_call = 1
    aggregate = b"A" * 100 + b"B" * 100 + b"C" * 30
    sock.inbox = [
        (b"one", ADDRS[0], 3),
        (bytes(1200), ADDRS[1], 1200),  # full-size: a lone datagram all the same here
        (aggregate, ADDRS[2], 100),
        (b"four", ADDRS[0], 0),  # stride 0: one datagram
        (b"five", ADDRS[1], 4),
    ]
    assert driver.step() is True  # four batches (the default), each one datagram or aggregate
    assert sock.receive_calls == 4
    assert endpoint.fed == [
        (b"one", ADDRS[0]),
        (bytes(1200), ADDRS[1]),
        (b"A" * 100, ADDRS[2]),
        (b"B" * 100, ADDRS[2]),
        (b"C" * 30, ADDRS[2]),
        (b"four", ADDRS[0]),
    ]
    assert driver.step() is False
    assert endpoint.fed[6:] == [(b"five", ADDRS[1])]
    assert driver.statistics().datagrams_received == 7


def test_a_full_receive_batch_asks_for_another_step() -> None:
    endpoint, sock, driver = make()
    sock.inbox = [(bytes([i % 256]), ADDRS[0], 1) for i in range(32 * 4 + 1)]
    assert driver.step() is True  # stopped at the batch limit: more may be waiting
    assert len(endpoint.fed) == 32 * 4
    assert driver.step() is False
    assert len(endpoint.fed) == 32 * 4 + 1


@pytest.mark.parametrize("threadsafe", [True, False])
def test_due_timers_fire_and_the_next_deadline_is_reported(threadsafe: bool) -> None:
    endpoint, _sock, driver = make(threadsafe=threadsafe)
    endpoint.timer = 0.0  # the clock reads 0.0 at the first step: due
    driver.step()
    assert endpoint.timers_fired == [0.0]
    endpoint.timer = 50.0
    driver.step()
    assert endpoint.timers_fired == [0.0]
    assert driver.deadline == 50.0
    endpoint.timer = 20.0
    driver.flush()  # a flush polls, sends and refreshes the deadline too
    assert driver.deadline == 20.0
    assert endpoint.polls == 3


def test_the_inline_drivers_step_without_a_lock_and_the_thread_driver_with_one() -> None:
    """Inline, the driver and the application share the event loop's thread: the step's
    lock would only cost time. A driver thread's step must hold it (statistics are read
    from the loop thread meanwhile)."""
    import threading

    from chrysalis.datagram import UdpSocket
    from chrysalis.quic import DevelopmentCA, EndpointRole
    from chrysalis.quic._driver import EndpointSettings

    identity = DevelopmentCA.create().issue()
    for mode, locked in (("inline", False), ("thread", True)):
        sock = UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))
        notifier = ThreadNotifier()
        try:
            settings = EndpointSettings(identity, sock, EndpointRole.DUPLEX, driver=mode)
            _channels, endpoint, driver = settings.build(notifier, lambda: 0.0)
            lock = driver._lock
            assert (lock is not None) is locked
            assert driver.endpoint_statistics() == endpoint.statistics()
            if lock is not None:
                # A step waits for the lock (a statistics read in progress elsewhere).
                with lock:
                    stepper = threading.Thread(target=driver.step)
                    stepper.start()
                    stepper.join(0.05)
                    assert stepper.is_alive()
                stepper.join(5)
                assert not stepper.is_alive()
            assert driver.statistics().steps == (1 if locked else 0)
        finally:
            sock.shutdown()
            notifier.close()


def test_thread_notifier_coalesces_and_never_loses_a_wakeup() -> None:
    notifier = ThreadNotifier()
    try:

        def readable() -> bool:
            ready, _, _ = select.select([notifier.fileno()], [], [], 0)
            return bool(ready)

        assert not readable()
        notifier.notify()
        notifier.notify()
        assert readable()
        notifier.clear()
        assert not readable()
        notifier.notify()  # after clear: must wake the next wait
        assert readable()
    finally:
        notifier.close()


@pytest.mark.parametrize("gro", [False, True])
def test_request_response_traffic_receives_one_datagram_per_step_and_loses_nothing(
    gro: bool,
) -> None:
    """On a real UDP socket (level-triggered; with GRO, the carrier's own large-buffer
    receive): after a few steps that each found one lone datagram, a step asks for one
    datagram only (no second, empty receive); queued small datagrams are then taken one per
    step, in order, while the descriptor stays readable; a full-size datagram or a fuller
    batch returns to full draining within the same step."""
    import socket as stdlib_socket

    from chrysalis.datagram import UdpSocket

    endpoint = FakeEndpoint()
    sock = UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gso=False, gro=None if gro else False)
    if sock.gro_enabled is not gro:
        sock.shutdown()
        pytest.skip("kernel without UDP GRO")
    peer = stdlib_socket.socket(stdlib_socket.AF_INET, stdlib_socket.SOCK_DGRAM)
    try:
        target = sock.local_addr.to_sockaddr()
        driver = EndpointDriver(cast(QuicEndpoint, endpoint), sock)
        (fd,) = sock.readiness_fds()

        def readable() -> bool:
            return bool(select.select([fd], [], [], 0)[0])

        def send(*payloads: bytes) -> None:
            for payload in payloads:
                peer.sendto(payload, target)
            deadline = 100
            while not readable() and deadline:  # loopback delivery is immediate, but bounded
                deadline -= 1
                select.select([], [], [], 0.001)

        for index in range(6):  # request/response: one lone datagram per step
            send(b"q%d" % index)
            assert driver.step() is False
        assert [data for data, _ in endpoint.fed] == [b"q%d" % index for index in range(6)]
        endpoint.fed.clear()

        send(b"a", b"b", b"c")  # three small datagrams queued at once
        assert driver.step() is False
        assert [data for data, _ in endpoint.fed] == [b"a"]  # one per step now
        assert readable()  # the rest re-fires the level-triggered descriptor
        steps = 0
        while readable() and steps < 10:
            driver.step()
            steps += 1
        assert [data for data, _ in endpoint.fed] == [b"a", b"b", b"c"]
        endpoint.fed.clear()

        for index in range(6):  # back to lone datagrams
            send(b"r%d" % index)
            driver.step()
        endpoint.fed.clear()
        big = [bytes([index]) * 1200 for index in range(4)]
        send(*big)  # full-size datagrams: bulk data, drained in the same step
        driver.step()
        assert [data for data, _ in endpoint.fed] == big
        assert not readable()
    finally:
        peer.close()
        sock.shutdown()


def test_a_switch_bindings_receive_buffers_are_not_touched_before_datagrams_land() -> None:
    """Over a switch binding (a node's socket) a driver's receive buffers (here 32 of 16 KiB:
    128 pages) are mapped, not zeroed: a driver built in a forked process (where every page
    written costs a fault: a scale worker forked from its fork server) faults in only a few
    pages, and a received datagram still arrives whole. Carriers keep bytearrays (they
    batch ``recvmmsg`` into those only)."""
    import os
    import resource
    import sys

    from chrysalis.core import ConnectionId, Pid
    from chrysalis.datagram import DatagramSwitch, InprocNetwork, Router

    if not sys.platform.startswith("linux"):
        pytest.skip("fork and ru_minflt: Linux")
    assert all(isinstance(b, bytearray) for b in make(1)[2]._buffers)  # a carrier: bytearrays
    switch = DatagramSwitch(InprocNetwork().bind(), Router())  # no pump thread: fork-safe
    me, peer = Pid(bytes(range(1, 17))), Pid(bytes(range(17, 33)))
    datagram = b"\x40" + bytes(ConnectionId.issued(me, 1)) + b"x" * 16000
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            sock, other = switch.bind(me), switch.bind(peer)
            endpoint = FakeEndpoint()
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            driver = EndpointDriver(cast(QuicEndpoint, endpoint), sock, max_datagram_size=16384)
            faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            other.try_send_to(datagram, sock.local_addr)
            driver.step()
            whole = endpoint.fed == [(datagram, other.local_addr)]
            os.write(write_end, f"{faulted} {whole}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        report = os.read(read_end, 100).decode()
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        switch.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0, report
    count, arrived = report.split()
    # Zeroed buffers alone are 128 pages (measured: about 240 in all, against about 70).
    assert int(count) < 128, report
    assert arrived == "True"
