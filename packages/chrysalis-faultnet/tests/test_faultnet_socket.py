"""FaultySocket over the in-memory carrier of conftest.py."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Sequence

import pytest

from chrysalis.core import DatagramAddr
from chrysalis.datagram import (
    MAX_DATAGRAM_SIZE,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InvalidDataError,
    SocketClosedError,
)
from chrysalis.faultnet import (
    BindableNetwork,
    FaultDirection,
    FaultPlan,
    FaultStatistics,
    FaultySocket,
)

WAIT_S = 5.0


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pair(
    network: BindableNetwork,
    send_plan: FaultPlan,
    recv_plan: FaultPlan | None = None,
    clock: FakeClock | None = None,
) -> tuple[FaultySocket, FaultySocket]:
    """Two faulty sockets; with a fake clock there is no timer thread."""
    recv_plan = recv_plan if recv_plan is not None else FaultPlan()
    if clock is None:
        return FaultySocket(network.bind(), send_plan), FaultySocket(network.bind(), recv_plan)
    return (
        FaultySocket(network.bind(), send_plan, clock=clock, timer_thread=False),
        FaultySocket(network.bind(), recv_plan, clock=clock, timer_thread=False),
    )


def drain(sock: DatagramSocket) -> list[bytes]:
    out = []
    while (got := sock.try_recv_from()) is not None:
        out.append(got[0])
    return out


def payloads(n: int) -> list[bytes]:
    return [f"datagram {i:05d} ".encode() * (1 + i % 7) for i in range(n)]


def send_all(sock: DatagramSocket, data: Sequence[bytes | memoryview], to: DatagramAddr) -> None:
    for item in data:
        assert sock.try_send_to(item, to)


def assert_balanced(stats: FaultStatistics) -> None:
    assert stats.sent + stats.received + stats.duplicated == (
        stats.delivered
        + stats.dropped_loss
        + stats.dropped_partition
        + stats.dropped_overflow
        + stats.dropped_error
        + stats.held
    )


# -- transparency ---------------------------------------------------------------------------


def test_zero_fault_plan_is_transparent(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan(seed=9), FaultPlan(seed=9, direction=FaultDirection.BOTH))
    data = payloads(50)
    send_all(a, data, b.local_addr)
    assert drain(b) == data
    assert a.local_addr == a.inner.local_addr
    # batch receive path, with a memoryview as the datagram
    send_all(a, [memoryview(b"\x00\xffbinary\x00")], b.local_addr)
    buffers = [bytearray(64) for _ in range(4)]
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv(buffers, metas) == 1
    assert bytes(buffers[0][: metas[0].length]) == b"\x00\xffbinary\x00"
    assert metas[0].source == a.local_addr
    assert a.statistics() == FaultStatistics(sent=51, delivered=51)
    assert b.statistics() == FaultStatistics(received=51, delivered=51)


def test_zero_fault_plan_keeps_the_inner_backpressure(small_memnet: BindableNetwork) -> None:
    a, b = pair(small_memnet, FaultPlan())
    for i in range(4):
        assert a.try_send_to(bytes([i]), b.local_addr)
    assert not a.try_send_to(b"full", b.local_addr)
    assert a.statistics().sent == 4


def test_immediate_copies_keep_the_inner_backpressure_under_faults(
    small_memnet: BindableNetwork,
) -> None:
    lossy, sink = pair(small_memnet, FaultPlan(seed=1, loss=0.1))
    accepted = 0
    while lossy.try_send_to(b"x", sink.local_addr):
        accepted += 1
        assert accepted < 100
    stats = lossy.statistics()
    assert stats.delivered == 4
    assert stats.sent == accepted == 4 + stats.dropped_loss


def test_inner_errors_reach_the_caller_under_faults(memnet: BindableNetwork) -> None:
    a, _ = pair(memnet, FaultPlan(loss=0.01, seed=3))
    with pytest.raises(HostUnreachableError):
        a.try_send_to(b"x", DatagramAddr.inproc(1, 1))
    with pytest.raises(DatagramTooLargeError):
        a.try_send_to(bytes(MAX_DATAGRAM_SIZE + 1), DatagramAddr.inproc(1, 1))


# -- loss, duplication, reordering, delay ---------------------------------------------------


def test_loss_rate_is_close_to_the_plan(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan(seed=77, loss=0.2))
    received = 0
    n = 3000
    for i in range(n):
        assert a.try_send_to(i.to_bytes(4, "big"), b.local_addr)
        if i % 32 == 31:
            received += len(drain(b))
    received += len(drain(b))
    stats = a.statistics()
    assert stats.sent == n
    assert stats.delivered == received == n - stats.dropped_loss
    assert abs(stats.dropped_loss / n - 0.2) < 0.035  # ~4.8 standard deviations
    assert_balanced(stats)


def test_duplication_produces_exact_duplicates(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan(seed=1, duplicate=1.0))
    data = payloads(20)
    for item in data:
        assert a.try_send_to(item, b.local_addr)
    assert drain(b) == [item for item in data for _ in range(2)]
    stats = a.statistics()
    assert (stats.sent, stats.duplicated, stats.delivered) == (20, 20, 40)
    assert_balanced(stats)


def test_reordering_reorders_but_loses_nothing(memnet: BindableNetwork) -> None:
    clock = FakeClock()
    a, b = pair(memnet, FaultPlan(seed=11, reorder=0.4, reorder_timeout=0.5), clock=clock)
    data = payloads(60)
    got: list[bytes] = []
    for index, item in enumerate(data):
        clock.now = index * 0.001
        assert a.try_send_to(item, b.local_addr)
        got.extend(drain(b))
    clock.now = 10.0
    a.handle_timer()
    got.extend(drain(b))
    assert Counter(got) == Counter(data)
    assert got != data
    stats = a.statistics()
    assert stats.reordered > 0
    assert stats.held == 0
    assert_balanced(stats)


@pytest.mark.parametrize("direction", [FaultDirection.SEND, FaultDirection.RECEIVE])
def test_delay_releases_no_datagram_early(
    memnet: BindableNetwork, direction: FaultDirection
) -> None:
    clock = FakeClock()
    plan = FaultPlan(seed=4, delay=1.0, jitter=0.5, direction=direction)
    a, b = pair(memnet, plan, plan, clock=clock)
    data = payloads(20)
    send_all(a, data, b.local_addr)
    got = drain(b)
    assert got == []
    for now in (0.5, 0.999999):
        clock.now = now
        a.handle_timer()
        b.handle_timer()
        assert drain(b) == []
    clock.now = 1.2
    a.handle_timer()
    b.handle_timer()
    partial = drain(b)
    clock.now = 1.5
    a.handle_timer()
    b.handle_timer()
    rest = drain(b)
    assert 0 < len(partial) < 20  # jitter spreads the releases
    assert Counter(partial + rest) == Counter(data)
    faulted = a if direction is FaultDirection.SEND else b
    assert faulted.statistics().delayed == 20
    assert faulted.next_timer() is None


def test_timer_thread_delivers_delayed_sends_and_the_inner_wakes_the_receiver(
    memnet: BindableNetwork,
) -> None:
    a, b = pair(memnet, FaultPlan(delay=0.02))
    woken = threading.Event()
    b.add_recv_waker(woken.set)
    assert a.try_send_to(b"late", b.local_addr)  # held by a; its timer sends it later
    assert woken.wait(WAIT_S)
    assert b.try_recv_from() == (b"late", a.local_addr)


def test_held_received_datagram_fires_the_receive_waker_when_due(
    memnet: BindableNetwork,
) -> None:
    a, b = pair(memnet, FaultPlan(), FaultPlan(delay=0.03, direction=FaultDirection.RECEIVE))
    assert a.try_send_to(b"late", b.local_addr)
    assert b.try_recv_from() is None  # pulled from the inner socket and held
    assert b.statistics().held == 1
    woken = threading.Event()
    b.add_recv_waker(woken.set)
    assert woken.wait(WAIT_S)
    assert b.try_recv_from() == (b"late", a.local_addr)


def test_receive_waker_fires_at_once_when_a_held_datagram_is_already_due(
    memnet: BindableNetwork,
) -> None:
    clock = FakeClock()
    a, b = pair(memnet, FaultPlan(), FaultPlan(delay=1.0, direction=FaultDirection.RECEIVE), clock)
    assert a.try_send_to(b"x", b.local_addr)
    assert b.try_recv_from() is None
    woken: list[str] = []
    b.add_recv_waker(lambda: woken.append("early"))
    assert woken == []
    clock.now = 1.0
    b.handle_timer()  # the registered waker fires now
    assert woken == ["early"]
    b.add_recv_waker(lambda: woken.append("again"))  # still due: called at once
    assert woken == ["early", "again"]
    assert b.try_recv_from() == (b"x", a.local_addr)


# -- partitions ------------------------------------------------------------------------------


def test_partition_blocks_and_heal_restores(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan(), FaultPlan())
    a.partition(b.local_addr)
    assert a.partitioned == frozenset({b.local_addr})
    assert a.try_send_to(b"lost", b.local_addr)  # accepted, then dropped
    assert drain(b) == []
    b.partition(a.local_addr)
    # traffic from a partitioned peer is dropped on receipt, even if the sender is healthy
    assert FaultySocket(a.inner, FaultPlan()).try_send_to(b"raw", b.local_addr)
    assert drain(b) == []
    assert a.statistics().dropped_partition == 1
    assert b.statistics().dropped_partition == 1
    a.heal()
    b.heal(a.local_addr)
    assert b.partitioned == frozenset()
    assert a.try_send_to(b"back", b.local_addr)
    assert drain(b) == [b"back"]


def test_partition_drops_held_datagrams_when_they_come_due(memnet: BindableNetwork) -> None:
    clock = FakeClock()
    a, b = pair(memnet, FaultPlan(delay=1.0), clock=clock)
    assert a.try_send_to(b"in flight", b.local_addr)
    a.partition(b.local_addr)
    clock.now = 2.0
    a.handle_timer()
    assert drain(b) == []
    assert a.statistics().dropped_partition == 1


def test_partition_validates_its_arguments(memnet: BindableNetwork) -> None:
    a, _ = pair(memnet, FaultPlan())
    with pytest.raises(TypeError, match="DatagramAddr"):
        a.partition("inproc://1/1")  # type: ignore[arg-type]


def test_send_waker_for_a_partitioned_peer_fires_at_once(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan())
    a.partition(b.local_addr)
    fired = threading.Event()
    a.add_send_waker(b.local_addr, fired.set)
    assert fired.is_set()


# -- bounds ----------------------------------------------------------------------------------


def test_max_held_bound_is_respected(memnet: BindableNetwork) -> None:
    clock = FakeClock()
    a, b = pair(memnet, FaultPlan(delay=10.0, max_held=5), clock=clock)
    send_all(a, payloads(20), b.local_addr)
    stats = a.statistics()
    assert (stats.held, stats.dropped_overflow, stats.delayed) == (5, 15, 5)
    assert_balanced(stats)
    clock.now = 10.0
    a.handle_timer()
    assert drain(b) == payloads(5)


def test_held_copy_refused_by_a_full_inner_queue_counts_as_overflow(
    small_memnet: BindableNetwork,
) -> None:
    clock = FakeClock()
    a, b = pair(small_memnet, FaultPlan(delay=1.0), clock=clock)
    send_all(a, payloads(6), b.local_addr)  # all held: sends never block
    clock.now = 1.0
    a.handle_timer()
    stats = a.statistics()
    assert (stats.delivered, stats.dropped_overflow, stats.held) == (4, 2, 0)
    assert len(drain(b)) == 4


def test_receive_ready_queue_stays_bounded(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan(), FaultPlan(duplicate=1.0, direction=FaultDirection.RECEIVE))
    send_all(a, payloads(40), b.local_addr)
    assert b.try_recv_from() is not None
    assert b.statistics().held <= 2


# -- transmits and buffers -------------------------------------------------------------------


def test_segmented_transmit_gets_one_decision_per_datagram(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan(seed=21, loss=0.5))
    segments = [bytes([i]) * 10 for i in range(16)]
    transmit = DatagramTransmit(b.local_addr, b"".join(segments), segment_size=10)
    assert a.try_send_transmit(transmit) == 16
    got = drain(b)
    stats = a.statistics()
    assert stats.sent == 16
    assert 0 < len(got) < 16
    assert len(got) == stats.delivered == 16 - stats.dropped_loss
    assert all(item in segments for item in got)
    assert got == sorted(got)  # survivors keep their order


def test_transparent_transmit_goes_to_the_inner_socket_whole(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan())
    transmit = DatagramTransmit(b.local_addr, b"abcdef", segment_size=2)
    assert a.try_send_transmit(transmit) == 3
    assert drain(b) == [b"ab", b"cd", b"ef"]
    assert a.statistics().sent == 3


def test_datagram_longer_than_the_buffer_is_consumed_with_an_error(
    memnet: BindableNetwork,
) -> None:
    a, b = pair(memnet, FaultPlan(), FaultPlan(loss=0.0001, direction=FaultDirection.RECEIVE))
    send_all(a, [b"short", b"much too long for the buffer", b"ok"], b.local_addr)
    buffers = [bytearray(8), bytearray(8)]
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv(buffers, metas) == 1  # the short one; the long one waits
    with pytest.raises(InvalidDataError):
        b.try_recv(buffers, metas)
    assert b.try_recv(buffers, metas) == 1
    assert bytes(buffers[0][: metas[-1].length]) == b"ok"


def test_statistics_balance_under_mixed_faults(memnet: BindableNetwork) -> None:
    clock = FakeClock()
    plan = FaultPlan(
        seed=8, loss=0.1, duplicate=0.2, reorder=0.2, delay=0.01, jitter=0.02, max_held=8
    )
    recv_plan = dataclasses.replace(plan, seed=99, direction=FaultDirection.RECEIVE)
    a, b = pair(memnet, plan, recv_plan, clock=clock)
    for i in range(300):
        clock.now = i * 0.001
        assert a.try_send_to(i.to_bytes(2, "big"), b.local_addr)
        a.handle_timer()
        drain(b)
        assert_balanced(a.statistics())
        assert_balanced(b.statistics())
    stats = a.statistics()
    assert stats.dropped_loss > 0
    assert stats.duplicated > 0
    assert stats.reordered > 0
    assert stats.delayed > 0


# -- lifecycle -------------------------------------------------------------------------------


def test_shutdown_wakes_waiters_and_joins_the_timer(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan(), FaultPlan(delay=30.0, direction=FaultDirection.RECEIVE))
    assert a.try_send_to(b"held for long", b.local_addr)
    assert b.try_recv_from() is None
    timers = [t for t in threading.enumerate() if t.name == f"faultnet-timer {b.local_addr}"]
    assert len(timers) == 1
    outcome: list[BaseException] = []
    waiting = threading.Event()

    def receiver() -> None:
        woken = threading.Event()
        b.add_recv_waker(woken.set)
        waiting.set()
        woken.wait(WAIT_S)
        try:
            b.try_recv_from()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=receiver)
    thread.start()
    assert waiting.wait(WAIT_S)
    b.shutdown()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert len(outcome) == 1
    assert isinstance(outcome[0], SocketClosedError)
    assert b.join(WAIT_S)
    assert b.inner.is_shutdown
    assert not any(t.is_alive() for t in timers)
    with pytest.raises(SocketClosedError):
        b.try_send_to(b"x", a.local_addr)
    fired = threading.Event()
    b.add_recv_waker(fired.set)
    assert fired.is_set()
    b.shutdown()  # idempotent


def test_wrapper_follows_an_inner_socket_shut_down_directly(memnet: BindableNetwork) -> None:
    a, b = pair(memnet, FaultPlan(loss=0.1))
    a.inner.shutdown()
    assert a.is_shutdown
    assert a.join(WAIT_S)
    with pytest.raises(SocketClosedError):
        a.try_send_to(b"x", b.local_addr)


def test_join_times_out_before_shutdown(memnet: BindableNetwork) -> None:
    a, _ = pair(memnet, FaultPlan())
    assert not a.join(0.01)


def test_context_manager_shuts_down_and_joins(memnet: BindableNetwork) -> None:
    inner = memnet.bind()
    peer = memnet.bind()
    with FaultySocket(inner, FaultPlan(delay=0.5)) as sock:
        assert sock.try_send_to(b"held", peer.local_addr)
    assert sock.is_shutdown
    assert inner.is_shutdown


def test_constructor_checks_its_arguments(memnet: BindableNetwork) -> None:
    with pytest.raises(TypeError, match="DatagramSocket"):
        FaultySocket(object(), FaultPlan())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FaultPlan"):
        FaultySocket(memnet.bind(), {"loss": 0.1})  # type: ignore[arg-type]
