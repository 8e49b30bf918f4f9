"""UDP carrier: the reference test inventory (udp.rs) plus GSO/GRO and error paths."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import AddressError, DatagramAddr
from chrysalis.datagram import (
    DATAGRAM_BATCH_SIZE,
    AddressInUseError,
    DatagramRecvMeta,
    DatagramTransmit,
    HostUnreachableError,
    InvalidDataError,
    SocketClosedError,
    UdpSocket,
    udp_gso_supported,
)
from chrysalis.datagram.testing import recv_datagrams, wait_readable

LOOPBACK = ("127.0.0.1", 0)
needs_gso = pytest.mark.skipif(not udp_gso_supported(), reason="kernel without UDP GSO")


@pytest.fixture
def pair() -> Iterator[tuple[UdpSocket, UdpSocket]]:
    a, b = UdpSocket.bind(LOOPBACK), UdpSocket.bind(LOOPBACK)
    yield a, b
    for sock in (a, b):
        sock.shutdown()
        sock.join(5)


def _close(*socks: UdpSocket) -> None:
    for sock in socks:
        sock.shutdown()
        assert sock.join(5)


def _wait_for_data(sock: UdpSocket) -> None:
    assert wait_readable(sock, 2.0)


def _segments(count: int, size: int = 1200) -> bytes:
    return b"".join(bytes([i]) * size for i in range(count))


def test_round_trip_preserves_boundaries_and_source_addresses(
    pair: tuple[UdpSocket, UdpSocket],
) -> None:
    client, server = pair
    assert client.try_send_to(b"request", server.local_addr)
    assert recv_datagrams(server, 1) == [(b"request", client.local_addr)]
    assert server.try_send_to(b"response", client.local_addr)
    assert recv_datagrams(client, 1) == [(b"response", server.local_addr)]


def test_segmented_send_preserves_udp_datagram_boundaries(
    pair: tuple[UdpSocket, UdpSocket],
) -> None:
    a, b = pair
    contents = _segments(4)
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, contents, 1200)) == 4
    got = recv_datagrams(b, 4)
    assert [data for data, _ in got] == [bytes([i]) * 1200 for i in range(4)]
    assert {source for _, source in got} == {a.local_addr}


def test_single_receive_splits_coalesced_udp_datagrams(pair: tuple[UdpSocket, UdpSocket]) -> None:
    a, b = pair
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, _segments(4), 1200)) == 4
    _wait_for_data(b)
    got = [b.try_recv_from() for _ in range(4)]
    assert got == [(bytes([i]) * 1200, a.local_addr) for i in range(4)]
    assert b.try_recv_from() is None


def test_shutdown_wakes_receive_rejects_sends_and_joins(pair: tuple[UdpSocket, UdpSocket]) -> None:
    a, b = pair
    woken = threading.Event()
    waiting = threading.Event()
    failures: list[OSError] = []

    def receiver() -> None:
        while True:
            try:
                if b.try_recv_from() is not None:
                    continue
            except SocketClosedError as error:
                failures.append(error)
                return
            b.add_recv_waker(woken.set)
            waiting.set()
            woken.wait(2.0)

    thread = threading.Thread(target=receiver)
    thread.start()
    assert waiting.wait(5.0)  # the receive is parked on its waker before shutdown
    b.shutdown()
    b.shutdown()
    started = time.monotonic()
    assert b.join(5.0)
    assert time.monotonic() - started < 5.0  # prompt, with room for a loaded machine
    thread.join(2.0)
    assert not thread.is_alive()
    assert len(failures) == 1
    assert failures[0].errno == errno.EPIPE
    with pytest.raises(SocketClosedError):
        b.try_send_to(b"late", a.local_addr)
    with pytest.raises(SocketClosedError):
        b.fileno()


@needs_gso
def test_gso_send_reaches_gro_receiver_as_one_aggregate(pair: tuple[UdpSocket, UdpSocket]) -> None:
    a, b = pair
    assert a.gso_enabled
    assert b.gro_enabled
    assert b.max_receive_segments == 65535 // 1200
    contents = _segments(5)[:-200]  # last segment shorter
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, contents, 1200)) == 5
    _wait_for_data(b)
    buffers = [bytearray(65535)]
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv(buffers, metas) == 1
    (meta,) = metas
    assert (meta.length, meta.stride, meta.source) == (len(contents), 1200, a.local_addr)
    assert [bytes(seg) for seg in meta.segments(buffers[0])] == [
        contents[i : i + 1200] for i in range(0, len(contents), 1200)
    ]


@needs_gso
def test_gro_aggregate_spreads_whole_segments_over_small_buffers(
    pair: tuple[UdpSocket, UdpSocket],
) -> None:
    a, b = pair
    contents = _segments(5)
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, contents, 1200)) == 5
    assert b.try_send_to(b"x", b.local_addr)  # a different source, queued behind
    _wait_for_data(b)
    buffers = [bytearray(2500), bytearray(2500)]
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv(buffers, metas) == 2
    assert [(m.length, m.stride) for m in metas] == [(2400, 1200), (2400, 1200)]
    assert bytes(buffers[1][:2400]) == contents[2400:4800]
    # The rest of the aggregate comes before anything received later.
    assert b.try_recv_from() == (contents[4800:], a.local_addr)
    assert recv_datagrams(b, 1) == [(b"x", b.local_addr)]


@needs_gso
def test_single_receive_remainder_is_served_first_by_batch_receive(
    pair: tuple[UdpSocket, UdpSocket],
) -> None:
    a, b = pair
    contents = _segments(4)
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, contents, 1200)) == 4
    _wait_for_data(b)
    assert b.try_recv_from() == (contents[:1200], a.local_addr)
    assert a.try_send_to(b"later", b.local_addr)
    got = recv_datagrams(b, 4)
    assert [data for data, _ in got] == [
        contents[1200:2400],
        contents[2400:3600],
        contents[3600:],
        b"later",
    ]


def test_plain_mode_receives_one_datagram_per_buffer() -> None:
    a = UdpSocket.bind(LOOPBACK, gso=False, gro=False)
    b = UdpSocket.bind(LOOPBACK, gso=False, gro=False)
    try:
        assert not a.gso_enabled
        assert b.max_receive_segments == 1
        assert a.max_transmit_segments == DATAGRAM_BATCH_SIZE
        assert a.try_send_transmit(DatagramTransmit(b.local_addr, _segments(3), 1200)) == 3
        _wait_for_data(b)
        metas: list[DatagramRecvMeta] = []
        buffers = [bytearray(2000) for _ in range(4)]
        deadline = time.monotonic() + 2
        while len(metas) < 3 and time.monotonic() < deadline:
            b.try_recv(buffers[len(metas) :], metas)
        assert [(m.length, m.stride) for m in metas] == [(1200, 1200)] * 3
    finally:
        _close(a, b)


def test_transmit_accepts_at_most_one_batch_per_call(pair: tuple[UdpSocket, UdpSocket]) -> None:
    a, b = pair
    transmit = DatagramTransmit(b.local_addr, bytes(40 * 100), 100)
    assert a.try_send_transmit(transmit) == DATAGRAM_BATCH_SIZE
    assert a.try_send_transmit(transmit.suffix(DATAGRAM_BATCH_SIZE)) == 8
    assert len(recv_datagrams(b, 40)) == 40


def test_short_buffer_after_filled_buffers_defers_the_error() -> None:
    a = UdpSocket.bind(LOOPBACK)
    b = UdpSocket.bind(LOOPBACK, gro=False)
    try:
        assert a.try_send_to(b"small", b.local_addr)
        assert a.try_send_to(bytes(500), b.local_addr)
        assert a.try_send_to(b"after", b.local_addr)
        _wait_for_data(b)
        time.sleep(0.01)
        metas: list[DatagramRecvMeta] = []
        assert b.try_recv([bytearray(100), bytearray(100), bytearray(100)], metas) == 1
        with pytest.raises(InvalidDataError):
            b.try_recv([bytearray(100)], metas)
        assert recv_datagrams(b, 1) == [(b"after", a.local_addr)]
    finally:
        _close(a, b)


class _FailingSocket(socket.socket):
    """A real UDP socket whose chosen calls fail with a chosen errno."""

    fail_sendmsg: int | None = None
    fail_recv: int | None = None

    def sendmsg(self, *args: Any, **kwargs: Any) -> int:
        if self.fail_sendmsg is not None:
            raise OSError(self.fail_sendmsg, "injected")
        return super().sendmsg(*args, **kwargs)

    def recvfrom_into(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_recv is not None:
            raise OSError(self.fail_recv, "injected")
        return super().recvfrom_into(*args, **kwargs)

    def recvmsg_into(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_recv is not None:
            raise OSError(self.fail_recv, "injected")
        return super().recvmsg_into(*args, **kwargs)


def _failing_udp(*, gro: bool = False, **failures: int) -> UdpSocket:
    raw = _FailingSocket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.bind(LOOPBACK)
    for name, code in failures.items():
        setattr(raw, name, code)
    return UdpSocket(raw, gso=True, gro=gro)


@pytest.mark.parametrize(
    ("code", "stays_enabled"),
    [(errno.EIO, False), (errno.ENOPROTOOPT, False), (errno.EINVAL, True)],
)
def test_gso_failure_falls_back_to_one_send_per_datagram(code: int, stays_enabled: bool) -> None:
    a = _failing_udp(fail_sendmsg=code)
    b = UdpSocket.bind(LOOPBACK, gro=False)
    try:
        assert a.try_send_transmit(DatagramTransmit(b.local_addr, _segments(3), 1200)) == 3
        assert a.gso_enabled is stays_enabled
        assert [data for data, _ in recv_datagrams(b, 3)] == [bytes([i]) * 1200 for i in range(3)]
    finally:
        _close(a, b)


class _SwitchingSocket:
    """Stands in for the kernel socket of a UdpSocket: looking up ``sendmsg`` first runs
    ``interleave`` once, as a thread switch at that point would (another sender's GSO send)."""

    def __init__(self, real: socket.socket, interleave: Any) -> None:
        self._real = real
        self._interleave = interleave

    def __getattr__(self, name: str) -> Any:
        interleave, self._interleave = self._interleave, None
        if name == "sendmsg" and interleave is not None:
            interleave()
        return getattr(self._real, name)


@needs_gso
def test_gso_segment_size_and_control_message_stay_paired_across_senders() -> None:
    a = UdpSocket.bind(LOOPBACK)
    b = UdpSocket.bind(LOOPBACK, gro=False)
    real = a._sock
    try:
        other = DatagramTransmit(b.local_addr, b"B" * 3000, 1000)
        assert a.try_send_transmit(DatagramTransmit(b.local_addr, b"A" * 2400, 1200)) == 2

        def other_sender() -> None:
            assert a.try_send_transmit(other) == 3

        a._sock = _SwitchingSocket(real, other_sender)  # type: ignore[assignment]
        assert a.try_send_transmit(DatagramTransmit(b.local_addr, b"A" * 2400, 1200)) == 2
        sizes = sorted((data[:1], len(data)) for data, _ in recv_datagrams(b, 7))
        assert sizes == [(b"A", 1200)] * 4 + [(b"B", 1000)] * 3
    finally:
        a._sock = real
        _close(a, b)


def test_every_send_waker_is_kept_and_woken_by_shutdown(pair: tuple[UdpSocket, UdpSocket]) -> None:
    a, b = pair
    woken: list[str] = []
    a.add_send_waker(b.local_addr, lambda: woken.append("first"))
    a.add_send_waker(b.local_addr, lambda: woken.append("second"))
    a.add_send_waker(DatagramAddr.udp("127.0.0.1", 9), lambda: woken.append("other"))
    assert woken == []
    a.shutdown()
    assert sorted(woken) == ["first", "other", "second"]


def test_other_gso_errors_are_raised_when_nothing_was_sent() -> None:
    a = _failing_udp(fail_sendmsg=errno.EACCES)
    try:
        destination = DatagramAddr.udp("127.0.0.1", 9)
        with pytest.raises(PermissionError):
            a.try_send_transmit(DatagramTransmit(destination, _segments(2), 1200))
    finally:
        _close(a)


@pytest.mark.parametrize("gro", [False, True])
@pytest.mark.parametrize("size", [100, 65535])  # GRO: through the scratch buffer, or direct
def test_receive_error_shuts_the_socket_down(gro: bool, size: int) -> None:
    sock = _failing_udp(gro=gro, fail_recv=errno.ENOMEM)
    try:
        with pytest.raises(OSError, match="injected"):
            sock.try_recv([bytearray(size)], [])
        assert sock.is_shutdown
        with pytest.raises(SocketClosedError):
            sock.try_recv([bytearray(size)], [])
    finally:
        assert sock.join(1)


def _gro_receiver() -> UdpSocket:
    sock = UdpSocket.bind(LOOPBACK)
    if not sock.gro_enabled:
        _close(sock)
        pytest.skip("kernel without UDP GRO")
    return sock


def test_gro_receive_into_large_buffers_keeps_order_sources_and_the_batch_limit() -> None:
    """The GRO receive with the driver's buffers (64 KiB each, served by ``try_recv`` itself):
    one meta per datagram in arrival order with its own source, at most one per buffer and
    32 per call, a small buffer after large ones ends the call, and "nothing yet" is 0."""
    b = _gro_receiver()
    a, c = UdpSocket.bind(LOOPBACK, gso=False), UdpSocket.bind(LOOPBACK, gso=False)
    try:
        # Growing sizes from alternating senders: no two of them can form one aggregate.
        sent = [(bytes([index]) * (10 + index), (a, c)[index % 2]) for index in range(40)]
        for payload, sender in sent:
            assert sender.try_send_to(payload, b.local_addr)
        _wait_for_data(b)
        got: list[tuple[bytes, DatagramAddr]] = []

        def take(buffers: list[bytearray]) -> int:
            metas: list[DatagramRecvMeta] = []
            count = b.try_recv(buffers, metas)
            assert len(metas) == count
            for buffer, meta in zip(buffers, metas, strict=False):
                assert meta.stride == meta.length
                assert meta.ecn is None
                got.append((bytes(buffer[: meta.length]), meta.source))
            return count

        assert take([bytearray(65535) for _ in range(33)]) == DATAGRAM_BATCH_SIZE
        assert take([bytearray(65535), bytearray(100), bytearray(65535)]) == 1
        assert take([bytearray(65535)]) == 1
        assert take([bytearray(65535) for _ in range(8)]) == 6
        assert take([bytearray(65535) for _ in range(8)]) == 0
        assert got == [(payload, sender.local_addr) for payload, sender in sent]
    finally:
        _close(a, b, c)


@needs_gso
def test_gro_receive_into_large_buffers_after_a_split_remainder_serves_it_first() -> None:
    b = _gro_receiver()
    a = UdpSocket.bind(LOOPBACK)
    try:
        contents = _segments(3)
        assert a.try_send_transmit(DatagramTransmit(b.local_addr, contents, 1200)) == 3
        _wait_for_data(b)
        assert b.try_recv_from() == (contents[:1200], a.local_addr)  # keeps a remainder
        assert a.try_send_to(b"later", b.local_addr)
        metas: list[DatagramRecvMeta] = []
        buffers = [bytearray(65535) for _ in range(4)]
        assert b.try_recv(buffers, metas) == 2  # the remainder first, then what came later
        assert [(m.length, m.stride) for m in metas] == [(2400, 1200), (5, 5)]
        assert bytes(buffers[0][:2400]) == contents[1200:]
        assert bytes(buffers[1][:5]) == b"later"
        metas.clear()
        assert b.try_recv(buffers, metas) == 0
        b.shutdown()
        with pytest.raises(SocketClosedError):
            b.try_recv(buffers, metas)
    finally:
        _close(a, b)


def test_ipv6_destination_from_ipv4_socket_is_unreachable(
    pair: tuple[UdpSocket, UdpSocket],
) -> None:
    a, _ = pair
    with pytest.raises(HostUnreachableError):
        a.try_send_to(b"x", DatagramAddr.udp("::1", 9))


def test_bind_rejects_names_and_other_schemes() -> None:
    with pytest.raises(AddressError):
        UdpSocket.bind(("localhost", 0))
    with pytest.raises(AddressError):
        UdpSocket.bind(DatagramAddr.unixgram("/tmp/x"))


def test_bind_to_a_taken_port_is_address_in_use(pair: tuple[UdpSocket, UdpSocket]) -> None:
    a, _ = pair
    with pytest.raises(AddressInUseError):
        UdpSocket.bind(a.local_addr)


def test_socket_buffers_are_enlarged() -> None:
    sock = UdpSocket.bind(LOOPBACK, recv_buffer=1 << 20, send_buffer=1 << 20)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as default:
        default_size = default.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    try:
        assert sock.recv_buffer_size >= min(1 << 20, default_size)
        assert sock.send_buffer_size > 0
    finally:
        _close(sock)


def test_local_address_resolves_the_ephemeral_port(pair: tuple[UdpSocket, UdpSocket]) -> None:
    a, _ = pair
    assert a.local_addr.port != 0
    assert a.local_addr == DatagramAddr.from_sockaddr(("127.0.0.1", a.local_addr.port))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=1, max_value=1400),
    st.integers(min_value=1, max_value=DATAGRAM_BATCH_SIZE),
    st.integers(min_value=0, max_value=1399),
)
def test_segmented_sends_arrive_exactly(size: int, count: int, shorten: int) -> None:
    a, b = UdpSocket.bind(LOOPBACK), UdpSocket.bind(LOOPBACK)
    try:
        contents = bytes((i * 31) & 0xFF for i in range(size * count))
        contents = contents[: max(len(contents) - min(shorten, size - 1), 1)]
        transmit = DatagramTransmit(b.local_addr, contents, size)
        sent = 0
        while sent < transmit.segment_count:
            accepted = a.try_send_transmit(transmit if sent == 0 else transmit.suffix(sent))
            assert accepted > 0
            sent += accepted
        got = recv_datagrams(b, transmit.segment_count)
        assert b"".join(data for data, _ in got) == contents
        assert [len(data) for data, _ in got] == [
            len(transmit.segment(i)) for i in range(transmit.segment_count)
        ]
    finally:
        _close(a, b)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=1, max_value=300),
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=0, max_value=299),
    st.lists(st.integers(min_value=1, max_value=1500), min_size=1, max_size=6),
)
def test_aggregate_remainder_is_spread_over_any_buffers_in_order(
    stride: int, count: int, shorten: int, sizes: list[int]
) -> None:
    # The split remainder of a GRO aggregate (set directly here) must come out of try_recv
    # as whole segments, in order, each buffer holding as many as fit; a buffer smaller
    # than one segment consumes that segment with InvalidDataError.
    sock = UdpSocket.bind(LOOPBACK)
    try:
        blob = bytes((i * 13) & 0xFF for i in range(stride * count))
        blob = blob[: max(len(blob) - min(shorten, stride - 1), 1)]
        segments = [blob[i : i + stride] for i in range(0, len(blob), stride)]
        sock._split_remainder = (blob, 0, stride, sock.local_addr)
        delivered: list[bytes] = []
        lost = 0
        for _ in range(len(segments) * 2):
            buffers = [bytearray(size) for size in sizes]
            metas: list[DatagramRecvMeta] = []
            try:
                filled = sock.try_recv(buffers, metas)
            except InvalidDataError:
                lost += 1
                continue
            for buffer, meta in zip(buffers, metas, strict=False):
                assert meta.length <= len(buffer)
                assert meta.source == sock.local_addr
                parts = [bytes(part) for part in meta.segments(buffer)]
                assert all(len(part) == meta.stride for part in parts[:-1])
                delivered.extend(parts)
            if filled == 0:
                break
        leftover: object = sock._split_remainder
        assert leftover is None
        assert len(delivered) + lost == len(segments)
        kept = iter(segments)
        assert all(any(part == seg for seg in kept) for part in delivered)  # in order
    finally:
        _close(sock)


def test_sends_to_a_remembered_destination_fail_after_shutdown_and_join(
    pair: tuple[UdpSocket, UdpSocket],
) -> None:
    # try_send_to has no shutdown test on its fast path (a remembered destination): shutdown
    # empties the memo, and a memo put back by a sender that raced shutdown (simulated here)
    # meets a shut down (EPIPE even though shutdown of an unconnected socket reports
    # ENOTCONN), then closed, kernel socket.
    a, b = pair
    assert a.try_send_to(b"warm", b.local_addr)
    remembered = a._last_sockaddr
    assert remembered[0] is b.local_addr
    a.shutdown()
    for raced in (False, True, True):
        if raced:
            a._last_sockaddr = remembered
        with pytest.raises(SocketClosedError):
            a.try_send_to(b"x", b.local_addr)
        if raced:
            assert a.join(5)
    _wait_for_data(b)
    assert recv_datagrams(b, 1) == [(b"warm", a.local_addr)]
    assert b.try_recv_from() is None
