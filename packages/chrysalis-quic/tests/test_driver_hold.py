"""``EndpointDriver`` under a destination that refuses its datagrams (a full Unix receive queue,
as a SIGSTOPped leaf leaves it): that destination's output is held in its own bounded hold and
retried on the driver's clock with backoff, while every other destination is served at once and
in order; no step ever retries a destination before its delay has passed (no busy spin).

The core is run on a scripted clock and an in-memory carrier; the last tests use real Unix
datagram sockets (one peer never reads) and count send attempts, never wall time."""

from __future__ import annotations

import itertools
import select
import sys
from pathlib import Path
from typing import cast

sys.path.append(str(Path(__file__).parent))

import pytest
from test_adapter_driver import ADDRS, FakeEndpoint, FakeSocket

from chrysalis.core import DatagramAddr
from chrysalis.datagram import DatagramTransmit, UnixDatagramSocket
from chrysalis.quic import QuicEndpoint
from chrysalis.quic._driver import (
    HOLD_RETRY_FIRST,
    HOLD_RETRY_MAX,
    EndpointDriver,
)

STUCK, LIVE, OTHER = ADDRS


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RefusingSocket(FakeSocket):
    """A ``FakeSocket`` on which every destination in ``refusing`` would block; counts the
    send attempts per destination."""

    def __init__(self, segments: int = 32) -> None:
        super().__init__(segments)
        self.refusing: set[DatagramAddr] = set()
        self.attempts: dict[DatagramAddr, int] = {}

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        destination = transmit.destination
        self.attempts[destination] = self.attempts.get(destination, 0) + 1
        if destination in self.refusing:
            return 0
        return super().try_send_transmit(transmit)


def make(
    segments: int = 32, max_pending: int = 4096
) -> tuple[FakeEndpoint, RefusingSocket, EndpointDriver, Clock]:
    endpoint = FakeEndpoint()
    sock = RefusingSocket(segments)
    clock = Clock()
    driver = EndpointDriver(
        cast(QuicEndpoint, endpoint), sock, clock=clock, max_pending_datagrams=max_pending
    )
    return endpoint, sock, driver, clock


def to(destination: DatagramAddr, *tags: int) -> list[tuple[bytes, DatagramAddr]]:
    return [(bytes([tag]) * 100, destination) for tag in tags]


def sent_to(sock: FakeSocket, destination: DatagramAddr) -> list[int]:
    return [data[0] for data, where in sock.sent() if where == destination]


@pytest.mark.parametrize("segments", [1, 32])
def test_a_refusing_destination_delays_no_other_and_is_retried_after_its_backoff(
    segments: int,
) -> None:
    endpoint, sock, driver, clock = make(segments)
    endpoint.timer = clock.now + 1.0
    sock.refusing.add(STUCK)
    endpoint.output = to(STUCK, 1, 2) + to(LIVE, 1) + to(STUCK, 3) + to(OTHER, 1) + to(LIVE, 2)
    driver.step()
    assert sent_to(sock, LIVE) == [1, 2]
    assert sent_to(sock, OTHER) == [1]
    assert sock.attempts[STUCK] == 1  # the rest of its output queued behind, untried
    assert list(driver.held_destinations) == [STUCK]
    assert driver.deadline == clock.now + HOLD_RETRY_FIRST  # before the endpoint's timer
    stats = driver.statistics()
    assert (stats.pending_datagrams, stats.datagrams_held, stats.held_destinations) == (3, 3, 1)

    # Steps before the delay has passed (other traffic wakes the driver) never try it again.
    for tag in range(3, 40):
        endpoint.output = to(LIVE, tag) + to(STUCK, tag + 1)
        driver.step()
    assert sent_to(sock, LIVE) == list(range(1, 40))
    assert sock.attempts[STUCK] == 1
    assert driver.statistics().send_retries == 0

    # Each retry that is refused doubles the delay, up to its cap; one attempt per retry.
    delays = []
    for retry in range(1, 12):
        deadline = driver.deadline
        assert deadline is not None
        delays.append(round(deadline - clock.now, 9))
        clock.now = deadline
        driver.step()
        driver.step()  # a second step at the same time: nothing is tried
        assert sock.attempts[STUCK] == 1 + retry
    assert delays[0] == HOLD_RETRY_FIRST
    assert all(
        later == min(earlier * 2, HOLD_RETRY_MAX) for earlier, later in itertools.pairwise(delays)
    )
    assert delays[-1] == HOLD_RETRY_MAX
    assert driver.statistics().send_retries == 11

    # The destination accepts again: its datagrams leave in their order at the next retry.
    sock.refusing.clear()
    deadline = driver.deadline
    assert deadline is not None
    clock.now = deadline
    driver.step()
    assert sent_to(sock, STUCK) == [1, 2, 3, *range(4, 41)]
    assert not driver.held_destinations
    assert driver.deadline == endpoint.timer
    stats = driver.statistics()
    assert (stats.pending_datagrams, stats.send_drops, stats.hold_drops) == (0, 0, 0)


def test_a_datagram_from_a_held_destination_makes_it_due_at_once() -> None:
    """It reads again (its acknowledgements come back): no need to wait out the delay."""
    endpoint, sock, driver, clock = make()
    sock.refusing.add(STUCK)
    endpoint.output = to(STUCK, 1)
    driver.step()
    for _ in range(6):  # refused retries: the delay grows to 3.2 ms
        deadline = driver.deadline
        assert deadline is not None
        clock.now = deadline
        driver.step()
    assert sock.attempts[STUCK] == 7
    deadline = driver.deadline
    assert deadline is not None
    assert deadline - clock.now > 3e-3
    sock.inbox = [(b"from another", LIVE, 12)]
    driver.step()
    assert sock.attempts[STUCK] == 7  # a datagram from elsewhere changes nothing
    sock.inbox = [(b"ack", STUCK, 3)]
    driver.step()
    assert sock.attempts[STUCK] == 8  # retried in that step's flush, before its delay
    assert driver.deadline == clock.now + HOLD_RETRY_FIRST * 2  # the delay starts over
    sock.refusing.clear()
    sock.inbox = [(b"ack", STUCK, 3)]
    driver.step()
    assert sent_to(sock, STUCK) == [1]
    assert endpoint.fed[-1] == (b"ack", STUCK)


def test_a_hold_is_bounded_and_drops_its_oldest_datagrams() -> None:
    endpoint, sock, driver, clock = make(segments=1, max_pending=8)
    sock.refusing.add(STUCK)
    endpoint.output = to(STUCK, *range(20)) + to(LIVE, 7)
    driver.step()
    assert sent_to(sock, LIVE) == [7]
    stats = driver.statistics()
    assert (stats.pending_datagrams, stats.hold_drops, stats.send_drops) == (8, 12, 12)
    sock.refusing.clear()
    clock.now += HOLD_RETRY_FIRST
    driver.step()
    assert sent_to(sock, STUCK) == list(range(12, 20))  # the newest, in order
    assert driver.statistics().pending_datagrams == 0


def test_the_total_bound_is_shared_and_never_stops_the_destinations_that_accept() -> None:
    endpoint, sock, driver, _ = make(segments=1, max_pending=8)
    sock.refusing.update((STUCK, OTHER))
    endpoint.output = to(STUCK, *range(8)) + to(OTHER, 50, 51) + to(LIVE, 9)
    driver.step()
    assert sent_to(sock, LIVE) == [9]
    # STUCK filled the total bound; OTHER's datagrams were dropped, STUCK keeps its 8.
    stats = driver.statistics()
    assert (stats.pending_datagrams, stats.hold_drops, stats.held_destinations) == (8, 2, 1)
    assert list(driver.held_destinations) == [STUCK]


def test_a_refused_lone_datagram_is_held_too() -> None:
    """The one-datagram fast path (request/response steps) holds a refusal like the rest."""
    endpoint, sock, driver, clock = make()
    sock.refusing.add(STUCK)
    endpoint.output = to(STUCK, 1)
    driver.step()
    assert list(driver.held_destinations) == [STUCK]
    endpoint.output = to(LIVE, 2)
    driver.step()
    assert sent_to(sock, LIVE) == [2]
    assert sock.attempts[STUCK] == 1
    sock.refusing.clear()
    clock.now += HOLD_RETRY_FIRST
    driver.flush()
    assert sent_to(sock, STUCK) == [1]


def test_a_socket_that_fails_while_holding_drops_the_hold() -> None:
    endpoint, sock, driver, clock = make()
    sock.refusing.add(STUCK)
    endpoint.output = to(STUCK, 1, 2, 3)
    driver.step()
    sock.closed = True
    clock.now += 1.0
    driver.step()
    assert driver.socket_failed
    stats = driver.statistics()
    assert (stats.pending_datagrams, stats.send_drops, stats.held_destinations) == (0, 3, 0)
    assert driver.deadline == endpoint.timer


# --- real Unix datagram sockets ------------------------------------------------------------------


class CountingUnixSocket(UnixDatagramSocket):
    """A Unix carrier that counts its send attempts per destination."""

    attempts: dict[DatagramAddr, int]

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        self.attempts[destination] = self.attempts.get(destination, 0) + 1
        return super().try_send_to(data, destination)

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        if transmit.segment_count > 1:  # (one segment goes through try_send_to)
            destination = transmit.destination
            self.attempts[destination] = self.attempts.get(destination, 0) + 1
        return super().try_send_transmit(transmit)


def test_a_unix_peer_that_never_reads_delays_no_other_peer_and_is_not_spun_on() -> None:
    sender = cast(CountingUnixSocket, CountingUnixSocket.bind_unique())
    sender.attempts = {}
    stuck = UnixDatagramSocket.bind_unique()  # stands in for a SIGSTOPped leaf: never read
    live = UnixDatagramSocket.bind_unique()
    endpoint = FakeEndpoint()
    clock = Clock()
    driver = EndpointDriver(cast(QuicEndpoint, endpoint), sender, clock=clock)
    try:
        received: list[bytes] = []
        rounds = 200
        for index in range(rounds):
            payload = index.to_bytes(4, "big") * 100
            endpoint.output = [(payload, stuck.local_addr), (payload, live.local_addr)]
            driver.step()
            while (item := live.try_recv_from()) is not None:
                received.append(item[0])
            clock.now += HOLD_RETRY_FIRST / 4  # steps come faster than the first retry
        # The live peer got every datagram, in order, at once (each read right after its step).
        assert received == [index.to_bytes(4, "big") * 100 for index in range(rounds)]
        assert sender.attempts[live.local_addr] == rounds
        # The stuck peer's queue filled (the kernel's max_dgram_qlen) and its output is held.
        assert stuck.local_addr in driver.held_destinations
        stats = driver.statistics()
        assert stats.pending_datagrams > 0
        # The premise of the fix: the sender's socket still polls writable all the while.
        _, writable, _ = select.select([], [sender.fileno()], [], 0)
        assert writable
        # No spin: one refused attempt per retry, retries only after their delay (200 steps
        # over 2.5 ms of the clock: delays of 50, 100, 200, 400, 800 us fit), never per step.
        refused = sender.attempts[stuck.local_addr] - stats.datagrams_sent + rounds
        assert stats.send_retries <= 6
        assert refused <= 1 + stats.send_retries
        # Let it read: the held datagrams follow, in order, once a retry is due.
        before = stats.send_retries
        delivered: list[bytes] = []
        for _ in range(400):
            while (item := stuck.try_recv_from()) is not None:
                delivered.append(item[0])
            if not driver.held_destinations:
                break
            deadline = driver.deadline
            assert deadline is not None
            clock.now = max(clock.now, deadline)
            driver.step()
        while (item := stuck.try_recv_from()) is not None:
            delivered.append(item[0])
        assert not driver.held_destinations
        assert driver.statistics().hold_drops == 0
        assert delivered == [index.to_bytes(4, "big") * 100 for index in range(rounds)]
        assert driver.statistics().send_retries > before
    finally:
        for sock in (sender, stuck, live):
            sock.shutdown()
            sock.join()
