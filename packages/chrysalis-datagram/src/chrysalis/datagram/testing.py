"""Conformance suite for :class:`DatagramSocket` implementations (public).

Like ``trio.testing.check_two_way_stream``: a carrier author provides a ``make_pair`` factory
returning two freshly bound sockets that can reach each other, and runs either every check at
once::

    from chrysalis.datagram.testing import check_datagram_socket

    def test_my_carrier_conforms() -> None:
        check_datagram_socket(make_pair)

or one test per check, by subclassing :class:`CarrierConformance` (pytest collects the
subclass if its name starts with ``Test``)::

    class TestMyCarrier(CarrierConformance):
        def make_pair(self) -> tuple[DatagramSocket, DatagramSocket]:
            ...

Each check owns the pair it creates and shuts both sockets down (and joins them) at the end.
Every wait is bounded (:data:`TIMEOUT` seconds): a non-conforming carrier fails, it never
hangs. The checks use only the runtime-neutral contract: ``try_*`` operations, the receive
waker and ``readiness_fds()`` (watched with ``poll``, which, unlike ``select``, accepts
descriptors above 1,023).
"""

from __future__ import annotations

import math
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from chrysalis.core import DatagramAddr
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    DatagramTransmit,
    InvalidDataError,
    SocketClosedError,
    UnsupportedSchemeError,
)

__all__ = [
    "CHECKS",
    "TIMEOUT",
    "CarrierConformance",
    "PairFactory",
    "check_batch_receive_is_bounded",
    "check_datagram_socket",
    "check_oversized_datagram_is_rejected",
    "check_readiness_reports_incoming_data",
    "check_round_trip_preserves_boundaries_and_source_addresses",
    "check_segmented_send_preserves_datagram_boundaries",
    "check_short_buffer_reports_invalid_data",
    "check_shutdown_wakes_receive_rejects_operations_and_joins",
    "check_single_receive_splits_segmented_batches",
    "check_unknown_scheme_is_rejected",
    "exchange",
    "recv_datagrams",
    "send_all",
    "wait_readable",
]

#: Upper bound, in seconds, on every wait in the suite.
TIMEOUT: Final = 5.0
_POLL: Final = 0.05

#: Returns two freshly bound sockets that can send to each other's ``local_addr``.
PairFactory = Callable[[], tuple[DatagramSocket, DatagramSocket]]


# --------------------------------------------------------------------------------------------
# Helpers (public: carrier tests use them too)


def _poll_readable(fds: list[int], timeout: float) -> bool:
    """Whether any of ``fds`` becomes readable within ``timeout`` seconds."""
    poller = select.poll()
    for fd in set(fds):
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))


def wait_readable(sock: DatagramSocket, timeout: float) -> bool:
    """Block up to ``timeout`` seconds until the receive waker fires or a descriptor in
    ``readiness_fds()`` is readable. Returns whether either happened."""
    event = threading.Event()
    sock.add_recv_waker(event.set)
    fds = sock.readiness_fds()
    if event.is_set():
        return True
    if not fds:
        return event.wait(timeout)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if _poll_readable(fds, min(remaining, _POLL)) or event.is_set():
            return True


def recv_datagrams(
    sock: DatagramSocket, count: int, *, buffer_size: int = MAX_DATAGRAM_SIZE
) -> list[tuple[bytes, DatagramAddr]]:
    """Receive until ``count`` datagrams arrived (aggregates split by stride), within
    :data:`TIMEOUT`. Each ``try_recv`` call is checked to respect the batch bound."""
    buffers = [bytearray(buffer_size) for _ in range(min(count, DATAGRAM_BATCH_SIZE) + 8)]
    received: list[tuple[bytes, DatagramAddr]] = []
    deadline = time.monotonic() + TIMEOUT
    while len(received) < count:
        metas: list[DatagramRecvMeta] = []
        filled = sock.try_recv(buffers, metas)
        assert filled == len(metas), f"try_recv returned {filled} but appended {len(metas)}"
        assert filled <= DATAGRAM_BATCH_SIZE, f"try_recv filled {filled} buffers"
        for buffer, meta in zip(buffers, metas, strict=False):
            assert meta.length <= len(buffer)
            received.extend((bytes(seg), meta.source) for seg in meta.segments(buffer))
        if filled == 0:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"received {len(received)} of {count} datagrams in time"
            wait_readable(sock, min(remaining, _POLL))
    assert len(received) == count, f"expected {count} datagrams, got {len(received)}"
    return received


def send_all(
    sender: DatagramSocket, transmit: DatagramTransmit, receiver: DatagramSocket | None = None
) -> list[tuple[bytes, DatagramAddr]]:
    """Send every segment of ``transmit`` by looping over accepted prefixes; while the carrier
    would block, drain ``receiver`` (if given) so bounded queues make progress. Returns what
    was drained from ``receiver`` meanwhile."""
    drained: list[tuple[bytes, DatagramAddr]] = []
    deadline = time.monotonic() + TIMEOUT
    while True:
        accepted = sender.try_send_transmit(transmit)
        total = transmit.segment_count
        assert 0 <= accepted <= total, f"accepted {accepted} of {total}"
        if accepted == total:
            return drained
        if accepted:
            transmit = transmit.suffix(accepted)
            continue
        assert time.monotonic() < deadline, "sender stayed blocked"
        if receiver is not None:
            got = receiver.try_recv_from()
            if got is not None:
                drained.append(got)
                continue
        time.sleep(0.001)


def exchange(
    sender: DatagramSocket, receiver: DatagramSocket, payloads: list[bytes]
) -> list[tuple[bytes, DatagramAddr]]:
    """Send ``payloads`` from ``sender`` to ``receiver`` one datagram at a time, draining
    the receiver whenever the sender would block (so carriers with short queues pass), and
    return everything received, in order."""
    received: list[tuple[bytes, DatagramAddr]] = []
    deadline = time.monotonic() + TIMEOUT
    for payload in payloads:
        while not sender.try_send_to(payload, receiver.local_addr):
            assert time.monotonic() < deadline, "sender stayed blocked"
            got = receiver.try_recv_from()
            if got is None:
                time.sleep(0.001)
            else:
                received.append(got)
    return received + recv_datagrams(receiver, len(payloads) - len(received))


@contextmanager
def _pair(make_pair: PairFactory) -> Iterator[tuple[DatagramSocket, DatagramSocket]]:
    a, b = make_pair()
    try:
        yield a, b
    finally:
        for sock in (a, b):
            sock.shutdown()
        for sock in (a, b):
            assert sock.join(TIMEOUT), f"{sock!r} did not join"


def _pattern(length: int, seed: int) -> bytes:
    return bytes((seed + i * 7) & 0xFF for i in range(length))


# --------------------------------------------------------------------------------------------
# Checks


def check_round_trip_preserves_boundaries_and_source_addresses(make_pair: PairFactory) -> None:
    """Datagrams of several sizes arrive whole, in order, with the sender's address; a reply
    to that source address reaches the sender."""
    with _pair(make_pair) as (a, b):
        sizes = [1, 0, 100, 1200, 9000]
        got = exchange(a, b, [_pattern(size, index) for index, size in enumerate(sizes)])
        assert [data for data, _ in got] == [_pattern(n, i) for i, n in enumerate(sizes)]
        assert all(source == a.local_addr for _, source in got)
        reply_to = got[0][1]
        assert b.try_send_to(b"response", reply_to)
        (reply,) = recv_datagrams(a, 1)
        assert reply == (b"response", b.local_addr)


def check_segmented_send_preserves_datagram_boundaries(make_pair: PairFactory) -> None:
    """A 4 x 1,200-byte transmit (and one with a short last segment) is fully accepted over
    accepted prefixes and received as separate datagrams, in order."""
    with _pair(make_pair) as (a, b):
        for last in (1200, 700):
            contents = _pattern(3 * 1200 + last, last)
            transmit = DatagramTransmit(b.local_addr, contents, 1200)
            assert transmit.segment_count == 4
            drained = send_all(a, transmit, b)
            got = drained + recv_datagrams(b, 4 - len(drained))
            assert [data for data, _ in got] == [
                contents[i : i + 1200] for i in range(0, len(contents), 1200)
            ]
            assert all(source == a.local_addr for _, source in got)


def check_single_receive_splits_segmented_batches(make_pair: PairFactory) -> None:
    """``try_recv_from`` returns the segments of a segmented send one at a time, in order."""
    with _pair(make_pair) as (a, b):
        contents = _pattern(4 * 1200, 3)
        drained = send_all(a, DatagramTransmit(b.local_addr, contents, 1200), b)
        got = list(drained)
        deadline = time.monotonic() + TIMEOUT
        while len(got) < 4:
            item = b.try_recv_from()
            if item is None:
                assert time.monotonic() < deadline, f"only {len(got)} of 4 segments arrived"
                wait_readable(b, _POLL)
                continue
            got.append(item)
        assert [data for data, _ in got] == [contents[i : i + 1200] for i in range(0, 4800, 1200)]
        assert all(source == a.local_addr for _, source in got)
        assert b.try_recv_from() is None


def check_batch_receive_is_bounded(make_pair: PairFactory) -> None:
    """With more buffers than :data:`DATAGRAM_BATCH_SIZE`, one ``try_recv`` fills at most that
    many; 40 small datagrams all arrive in order (sends interleaved with receives so that
    bounded carrier queues make progress)."""
    with _pair(make_pair) as (a, b):
        total = 40
        expected = [i.to_bytes(2, "big") * 8 for i in range(total)]
        received: list[bytes] = []
        buffers = [bytearray(2048) for _ in range(DATAGRAM_BATCH_SIZE + 16)]
        sent = 0
        deadline = time.monotonic() + TIMEOUT
        while len(received) < total:
            assert time.monotonic() < deadline, f"received {len(received)} of {total}"
            while sent < total and a.try_send_to(expected[sent], b.local_addr):
                sent += 1
            metas: list[DatagramRecvMeta] = []
            filled = b.try_recv(buffers, metas)
            assert filled <= DATAGRAM_BATCH_SIZE
            assert filled == len(metas)
            for buffer, meta in zip(buffers, metas, strict=False):
                received.extend(bytes(seg) for seg in meta.segments(buffer))
            if filled == 0 and sent == total:
                wait_readable(b, _POLL)
        assert received == expected


def check_oversized_datagram_is_rejected(make_pair: PairFactory) -> None:
    """A datagram above :data:`MAX_DATAGRAM_SIZE` raises :class:`DatagramTooLargeError`."""
    with _pair(make_pair) as (a, b):
        too_big = bytes(MAX_DATAGRAM_SIZE + 1)
        try:
            a.try_send_to(too_big, b.local_addr)
        except DatagramTooLargeError:
            pass
        else:
            raise AssertionError("an oversized datagram was accepted")


def check_unknown_scheme_is_rejected(make_pair: PairFactory) -> None:
    """A destination of a scheme the socket cannot serve raises
    :class:`UnsupportedSchemeError` naming that scheme."""
    with _pair(make_pair) as (a, _b):
        destination = DatagramAddr("nosuchcarrier", b"\x01\x02")
        sends: list[Callable[[], object]] = [
            lambda: a.try_send_to(b"x", destination),
            lambda: a.try_send_transmit(DatagramTransmit(destination, b"xy", 1)),
        ]
        for send in sends:
            message = ""
            try:
                send()
            except UnsupportedSchemeError as error:
                message = str(error)
            else:
                raise AssertionError("a destination of an unknown scheme was accepted")
            assert "nosuchcarrier" in message, message


def check_short_buffer_reports_invalid_data(make_pair: PairFactory) -> None:
    """A datagram longer than the receive buffer raises :class:`InvalidDataError` (consumed);
    the next datagram is received normally."""
    with _pair(make_pair) as (a, b):
        assert a.try_send_to(_pattern(100, 1), b.local_addr)
        small = bytearray(10)
        deadline = time.monotonic() + TIMEOUT
        while True:
            metas: list[DatagramRecvMeta] = []
            try:
                filled = b.try_recv([small], metas)
            except InvalidDataError:
                break
            assert filled == 0, "a truncated datagram was delivered"
            assert time.monotonic() < deadline, "no InvalidDataError"
            wait_readable(b, _POLL)
        assert exchange(a, b, [b"next"]) == [(b"next", a.local_addr)]


def check_readiness_reports_incoming_data(make_pair: PairFactory) -> None:
    """After a waker is registered on an idle socket, an arriving datagram makes it fire or a
    readiness descriptor readable."""
    with _pair(make_pair) as (a, b):
        assert b.try_recv_from() is None
        event = threading.Event()
        b.add_recv_waker(event.set)
        fds = b.readiness_fds()
        assert a.try_send_to(b"ping", b.local_addr)
        deadline = time.monotonic() + TIMEOUT
        while not event.is_set():
            if fds and _poll_readable(fds, _POLL):
                break
            if not fds:
                event.wait(_POLL)
            assert time.monotonic() < deadline, "no readiness after a datagram arrived"
        assert recv_datagrams(b, 1) == [(b"ping", a.local_addr)]


def check_shutdown_wakes_receive_rejects_operations_and_joins(make_pair: PairFactory) -> None:
    """Shutdown is idempotent, wakes a waiting receive, makes every operation raise
    :class:`SocketClosedError`, and ``join`` returns promptly."""
    with _pair(make_pair) as (a, b):
        assert b.try_recv_from() is None
        calls: list[int] = []
        woken = threading.Event()

        def waker() -> None:
            calls.append(1)
            woken.set()

        b.add_recv_waker(waker)
        waiter_saw: list[BaseException] = []

        def waiting_receive() -> None:
            # A receive blocked in another thread until the waker fires, then retrying.
            woken.wait(TIMEOUT)
            try:
                b.try_recv_from()
            except SocketClosedError as error:
                waiter_saw.append(error)

        thread = threading.Thread(target=waiting_receive)
        thread.start()
        b.shutdown()
        b.shutdown()
        thread.join(TIMEOUT)
        assert not thread.is_alive()
        assert calls == [1], f"receive waker called {len(calls)} times"
        assert len(waiter_saw) == 1, "the waiting receive did not fail with SocketClosedError"
        assert b.is_shutdown
        started = time.monotonic()
        assert b.join(1.0)
        assert time.monotonic() - started < 1.0
        late = threading.Event()
        b.add_recv_waker(late.set)
        assert late.is_set(), "a waker registered after shutdown was not called at once"
        operations: list[Callable[[], object]] = [
            lambda: b.try_send_to(b"x", a.local_addr),
            lambda: b.try_send_transmit(DatagramTransmit(a.local_addr, b"xy", 1)),
            lambda: b.try_recv([bytearray(16)], []),
            b.try_recv_from,
        ]
        for operation in operations:
            try:
                operation()
            except SocketClosedError:
                continue
            raise AssertionError("an operation succeeded after shutdown")


#: Every check, in a stable order.
CHECKS: Final[tuple[Callable[[PairFactory], None], ...]] = (
    check_round_trip_preserves_boundaries_and_source_addresses,
    check_segmented_send_preserves_datagram_boundaries,
    check_single_receive_splits_segmented_batches,
    check_batch_receive_is_bounded,
    check_oversized_datagram_is_rejected,
    check_unknown_scheme_is_rejected,
    check_short_buffer_reports_invalid_data,
    check_readiness_reports_incoming_data,
    check_shutdown_wakes_receive_rejects_operations_and_joins,
)


def check_datagram_socket(make_pair: PairFactory) -> None:
    """Run every check in :data:`CHECKS` against fresh pairs from ``make_pair``."""
    for check in CHECKS:
        check(make_pair)


class CarrierConformance:
    """Base class for one-test-per-check conformance: subclass it (with a ``Test`` name) and
    implement :meth:`make_pair`."""

    def make_pair(self) -> tuple[DatagramSocket, DatagramSocket]:
        """Return two freshly bound sockets that can reach each other."""
        raise NotImplementedError

    def test_round_trip_preserves_boundaries_and_source_addresses(self) -> None:
        check_round_trip_preserves_boundaries_and_source_addresses(self.make_pair)

    def test_segmented_send_preserves_datagram_boundaries(self) -> None:
        check_segmented_send_preserves_datagram_boundaries(self.make_pair)

    def test_single_receive_splits_segmented_batches(self) -> None:
        check_single_receive_splits_segmented_batches(self.make_pair)

    def test_batch_receive_is_bounded(self) -> None:
        check_batch_receive_is_bounded(self.make_pair)

    def test_oversized_datagram_is_rejected(self) -> None:
        check_oversized_datagram_is_rejected(self.make_pair)

    def test_unknown_scheme_is_rejected(self) -> None:
        check_unknown_scheme_is_rejected(self.make_pair)

    def test_short_buffer_reports_invalid_data(self) -> None:
        check_short_buffer_reports_invalid_data(self.make_pair)

    def test_readiness_reports_incoming_data(self) -> None:
        check_readiness_reports_incoming_data(self.make_pair)

    def test_shutdown_wakes_receive_rejects_operations_and_joins(self) -> None:
        check_shutdown_wakes_receive_rejects_operations_and_joins(self.make_pair)
