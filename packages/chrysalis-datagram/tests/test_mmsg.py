"""Tests of the ``recvmmsg`` receive ring (``_mmsg.RecvRing``) that the datagram switch uses on
a UDP carrier: lengths, GRO strides and source addresses read from the kernel's headers, the
header reset between calls, truncation, and errors."""

from __future__ import annotations

import errno
import mmap
import select
import socket
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr
from chrysalis.datagram._mmsg import RecvRing, recv_ring_supported
from chrysalis.datagram._socket import DATAGRAM_BATCH_SIZE, DatagramTransmit, SocketClosedError
from chrysalis.datagram._udp import UdpSocket, udp_gso_supported

pytestmark = pytest.mark.skipif(not recv_ring_supported(), reason="no recvmmsg here")

WAIT_S = 5.0


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def _wait_readable(sock: UdpSocket) -> None:
    ready, _, _ = select.select([sock.fileno()], [], [], WAIT_S)
    assert ready, "nothing arrived"


def _receive_all(ring: RecvRing, sock: UdpSocket, expected: int) -> list[tuple[bytes, int, int]]:
    """(data, stride, slot) of every filled slot until ``expected`` datagrams arrived."""
    got: list[tuple[bytes, int, int]] = []
    datagrams = 0
    while datagrams < expected:
        _wait_readable(sock)
        count = ring.receive(sock.fileno())
        for i in range(count):
            length = ring.lengths[i]
            assert ring.source(i) is not None
            got.append((bytes(ring.buffers[i][:length]), ring.strides[i], i))
            datagrams += -(-length // ring.strides[i]) if 0 < ring.strides[i] < length else 1
    return got


@pytest.fixture(params=["127.0.0.1", "::1"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[UdpSocket, UdpSocket]]:
    host: str = request.param
    if host == "::1" and not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback")
    with (
        UdpSocket.bind(DatagramAddr.udp(host, 0), gro=False) as rx,
        UdpSocket.bind(DatagramAddr.udp(host, 0), gso=False) as tx,
    ):
        yield rx, tx


def _ring_for(sock: UdpSocket, slots: int = DATAGRAM_BATCH_SIZE, size: int = 65535) -> RecvRing:
    family = socket.AF_INET if sock.local_addr.opaque[0] == 0x04 else socket.AF_INET6
    return RecvRing(family, slots, size)


def test_nothing_ready_is_zero(pair: tuple[UdpSocket, UdpSocket]) -> None:
    rx, _ = pair
    assert _ring_for(rx).receive(rx.fileno()) == 0


def test_lengths_data_and_sources_match_the_senders(pair: tuple[UdpSocket, UdpSocket]) -> None:
    rx, tx = pair
    host = "::1" if rx.local_addr.opaque[0] == 0x06 else "127.0.0.1"
    with UdpSocket.bind(DatagramAddr.udp(host, 0)) as other:
        payloads = [bytes([n]) * (n * 37) for n in range(6)]  # includes an empty datagram
        for n, payload in enumerate(payloads):
            assert (other if n == 3 else tx).try_send_to(payload, rx.local_addr)
        ring = _ring_for(rx)
        got = _receive_all(ring, rx, len(payloads))
        assert [data for data, _, _ in got] == payloads
        assert all(stride == len(data) for data, stride, _ in got)
        # Sources are decoded from the kernel's sockaddr exactly as the carrier decodes them.
        assert [ring.source(i) for i in range(len(payloads))] == [
            other.local_addr if n == 3 else tx.local_addr for n in range(len(payloads))
        ]
        keys = ring.source_keys
        assert keys[0] == keys[1] == keys[2] != keys[3]


def test_more_datagrams_than_slots_take_several_calls_and_headers_are_reset(
    pair: tuple[UdpSocket, UdpSocket],
) -> None:
    rx, tx = pair
    ring = _ring_for(rx, slots=4)
    sizes = [1200, 7, 1200, 300, 65000, 1, 1200, 44, 1500]
    for n, size in enumerate(sizes):
        assert tx.try_send_to(bytes([n]) * size, rx.local_addr)
    got = _receive_all(ring, rx, len(sizes))
    assert [(len(data), data[:1]) for data, _, _ in got] == [
        (size, bytes([n])) for n, size in enumerate(sizes)
    ]
    assert max(slot for _, _, slot in got) == 3


def test_a_datagram_larger_than_its_slot_is_reported_lost(
    pair: tuple[UdpSocket, UdpSocket],
) -> None:
    rx, tx = pair
    ring = _ring_for(rx, slots=3, size=100)
    for size in (100, 101, 5):
        assert tx.try_send_to(b"z" * size, rx.local_addr)
    received: list[int] = []
    while len(received) < 3:
        _wait_readable(rx)
        count = ring.receive(rx.fileno())
        received += ring.lengths[:count]
    assert received == [100, -1, 5]


@pytest.mark.skipif(not udp_gso_supported(), reason="no UDP GSO")
def test_gro_aggregates_report_their_segment_size() -> None:
    with (
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gro=True) as rx,
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gso=True) as tx,
    ):
        contents = b"".join(bytes([n]) * 1000 for n in range(4)) + b"tail"
        assert tx.try_send_transmit(DatagramTransmit(rx.local_addr, contents, 1000)) == 5
        assert tx.try_send_to(b"single", rx.local_addr)
        ring = _ring_for(rx)
        got = _receive_all(ring, rx, 6)
        assert b"".join(data for data, _, _ in got) == contents + b"single"
        # However the kernel coalesced them, every slot splits back at 1,000 bytes.
        for data, stride, _ in got:
            assert stride == len(data) or stride == 1000


def test_errors_other_than_would_block_are_raised() -> None:
    ring = RecvRing(socket.AF_INET, 2, 64)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fd = sock.fileno()
    with pytest.raises(OSError) as info:
        ring.receive(fd)  # closed descriptor
    assert info.value.errno == errno.EBADF


def test_ring_shape_and_family_are_validated() -> None:
    with pytest.raises(ValueError, match="AF_INET"):
        RecvRing(socket.AF_UNIX, 2, 64)
    with pytest.raises(ValueError, match="ring shape"):
        RecvRing(socket.AF_INET, 0, 64)
    with pytest.raises(ValueError, match="ring shape"):
        RecvRing(socket.AF_INET, 2, 0)


def test_ring_buffers_cannot_be_resized_under_the_kernel() -> None:
    ring = RecvRing(socket.AF_INET, 2, 64)
    assert ring.slots == 2
    buffer = ring.buffers[0]
    assert isinstance(buffer, mmap.mmap)  # mapped, not zeroed up front (issue 22)
    with pytest.raises(BufferError):
        buffer.resize(128)
    with pytest.raises(BufferError):
        buffer.close()
    assert not buffer.closed


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=40))
def test_any_sequence_of_datagrams_arrives_exactly(payloads: list[bytes]) -> None:
    with (
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gro=False) as rx,
        UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0), gso=False) as tx,
    ):
        for payload in payloads:
            assert tx.try_send_to(payload, rx.local_addr)
        ring = _ring_for(rx, slots=8, size=4096)
        got = _receive_all(ring, rx, len(payloads))
        assert [data for data, _, _ in got] == payloads


def test_carrier_ring_receive_after_shutdown_is_socket_closed() -> None:
    sock = UdpSocket.bind(DatagramAddr.udp("127.0.0.1", 0))
    ring = sock._new_recv_ring()
    assert ring is not None
    assert sock._recv_into_ring(ring) == 0
    sock.shutdown()
    with pytest.raises(SocketClosedError):
        sock._recv_into_ring(ring)
    assert sock.join(WAIT_S)
