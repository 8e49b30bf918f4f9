"""UDP carrier: batched receives without GRO (``recvmmsg`` into the caller's cached buffers).

The receive machinery is shared with the Unix carrier (``_recvmmsg.BatchReceiver``, tested in
depth in ``test_unix_batch.py``); these tests cover what differs for UDP: IPv4 and IPv6 source
addresses read from the kernel's ``sockaddr``, truncation (no unnamed senders), GRO sockets
keeping their own receive path, and the lifecycle.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr
from chrysalis.datagram import (
    DatagramRecvMeta,
    InvalidDataError,
    SocketClosedError,
    UdpSocket,
    _recvmmsg,
)
from chrysalis.datagram._recvmmsg import recvmmsg_function
from chrysalis.datagram.testing import wait_readable

pytestmark = pytest.mark.skipif(
    recvmmsg_function() is None, reason="recvmmsg is not available on this platform"
)


@pytest.fixture(autouse=True, scope="module")
def _always_batch() -> Iterator[None]:
    """Take the batch path whatever the last batch held (the receivers switch to their
    per-datagram loop after single datagrams and right after a batch that emptied the queue;
    that switch is tested on its own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(UdpSocket, "_batch_from", 0)
        patch.setattr(_recvmmsg, "_PROBE_AFTER_DRAIN", False)
        yield


def _ipv6_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def _bind(host: str = "127.0.0.1", *, gro: bool = False) -> UdpSocket:
    return UdpSocket.bind(DatagramAddr.udp(host, 0), gso=False, gro=gro)


def _close(*socks: UdpSocket) -> None:
    for sock in socks:
        sock.shutdown()
        assert sock.join(5)


def _batches(sock: UdpSocket) -> int:
    cache = sock._batches
    return -1 if cache is None else len(cache)


def _receive(
    sock: UdpSocket, buffers: Sequence[bytearray], expected: int
) -> list[tuple[bytes, DatagramAddr]]:
    got: list[tuple[bytes, DatagramAddr]] = []
    while len(got) < expected:
        metas: list[DatagramRecvMeta] = []
        filled = sock.try_recv(buffers, metas)
        assert filled == len(metas)
        assert all(m.stride == m.length for m in metas)
        got += [(bytes(buf[: m.length]), m.source) for buf, m in zip(buffers, metas, strict=False)]
        if filled == 0:
            assert wait_readable(sock, 2.0)
    return got


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_batches_report_ipv4_and_ipv6_sources_and_lengths(host: str) -> None:
    if host == "::1" and not _ipv6_available():
        pytest.skip("no IPv6 loopback")
    rx, a, b = _bind(host), _bind(host), _bind(host)
    try:
        buffers = [bytearray(1500) for _ in range(8)]
        for _ in range(2):  # the second sighting caches the list
            assert a.try_send_to(b"warm", rx.local_addr)
            assert _receive(rx, buffers, 1) == [(b"warm", a.local_addr)]
        assert _batches(rx) == 1
        sends = [(a, b"x" * 1200), (a, b"y" * 1200), (b, b"z" * 1200), (b, b""), (a, b"w" * 1500)]
        for sender, payload in sends:
            assert sender.try_send_to(payload, rx.local_addr)
        assert wait_readable(rx, 2.0)
        assert _receive(rx, buffers, len(sends)) == [
            (payload, sender.local_addr) for sender, payload in sends
        ]
        # A uniform batch: one shared meta.
        for _ in range(4):
            assert a.try_send_to(b"u" * 1000, rx.local_addr)
        assert _receive(rx, buffers, 4) == [(b"u" * 1000, a.local_addr)] * 4
        for _ in range(4):
            assert a.try_send_to(b"v" * 1000, rx.local_addr)
        assert wait_readable(rx, 2.0)
        metas: list[DatagramRecvMeta] = []
        got = 0
        while got < 4:
            got += rx.try_recv(buffers, metas)
        assert len({id(m) for m in metas}) == 1
        assert (metas[0].source, metas[0].length) == (a.local_addr, 1000)
    finally:
        _close(rx, a, b)


def test_truncation_in_a_batch_keeps_the_rest_for_later_calls() -> None:
    rx, tx = _bind(), _bind()
    try:
        buffers = [bytearray(1024) for _ in range(6)]
        for _ in range(2):
            assert tx.try_send_to(b"warm", rx.local_addr)
            assert _receive(rx, buffers, 1) == [(b"warm", tx.local_addr)]
        for payload in (b"a" * 10, b"b" * 2000, b"c" * 20, b"d" * 30):
            assert tx.try_send_to(payload, rx.local_addr)
        assert wait_readable(rx, 2.0)
        # All four may not have arrived by the first call; drain until the error shows.
        got: list[object] = []
        while len(got) < 4:
            metas: list[DatagramRecvMeta] = []
            try:
                filled = rx.try_recv(buffers, metas)
            except InvalidDataError:
                got.append("too long")
                continue
            got += [bytes(buf[: m.length]) for buf, m in zip(buffers, metas, strict=False)]
            if filled == 0:
                assert wait_readable(rx, 2.0)
        assert got == [b"a" * 10, "too long", b"c" * 20, b"d" * 30]
        assert not rx.is_shutdown  # a too-long datagram is not a kernel error
    finally:
        _close(rx, tx)


def test_kept_datagrams_come_first_from_try_recv_from() -> None:
    rx, tx = _bind(), _bind()
    try:
        buffers = [bytearray(100) for _ in range(4)]
        for _ in range(2):
            assert tx.try_send_to(b"warm", rx.local_addr)
            assert _receive(rx, buffers, 1) == [(b"warm", tx.local_addr)]
        for payload in (b"a" * 500, b"b" * 5, b"c" * 6):
            assert tx.try_send_to(payload, rx.local_addr)
        assert wait_readable(rx, 2.0)  # loopback queues each datagram within its send
        with pytest.raises(InvalidDataError):
            rx.try_recv(buffers, [])
        rest: list[tuple[bytes, DatagramAddr]] = []
        while len(rest) < 2:
            item = rx.try_recv_from()
            if item is None:
                assert wait_readable(rx, 2.0)
                continue
            rest.append(item)
        assert rest == [(b"b" * 5, tx.local_addr), (b"c" * 6, tx.local_addr)]
    finally:
        _close(rx, tx)


def test_gro_sockets_keep_their_own_receive_path() -> None:
    rx = _bind(gro=True)
    try:
        assert rx._batches is None  # aggregates need recvmsg's control data
    finally:
        _close(rx)


def test_shutdown_and_join_release_cached_buffers() -> None:
    rx, tx = _bind(), _bind()
    buffers = [bytearray(64) for _ in range(2)]
    for _ in range(2):
        assert tx.try_send_to(b"x", rx.local_addr)
        assert _receive(rx, buffers, 1) == [(b"x", tx.local_addr)]
    assert _batches(rx) == 1
    with pytest.raises(BufferError):
        buffers[0].extend(b"grow")
    _close(rx, tx)
    buffers[0].extend(b"grow")
    with pytest.raises(SocketClosedError):
        rx.try_recv(buffers, [])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.sampled_from([0, 1, 700, 1200, 1300])),
        min_size=1,
        max_size=20,
    ),
    st.integers(1, 10),
)
def test_batches_match_a_per_datagram_model(
    sends: list[tuple[int, int]], buffer_count: int
) -> None:
    rx = _bind()
    senders = [_bind(), _bind()]
    try:
        buffers = [bytearray(1200) for _ in range(buffer_count)]
        for _ in range(2):
            assert senders[0].try_send_to(b"warm", rx.local_addr)
            assert _receive(rx, buffers, 1) == [(b"warm", senders[0].local_addr)]
        expected: list[object] = []
        for n, (who, size) in enumerate(sends):
            payload = bytes([n % 256]) * size
            assert senders[who].try_send_to(payload, rx.local_addr)
            expected.append("too long" if size > 1200 else (payload, senders[who].local_addr))
        got: list[object] = []
        while len(got) < len(expected):
            metas: list[DatagramRecvMeta] = []
            try:
                filled = rx.try_recv(buffers, metas)
            except InvalidDataError:
                got.append("too long")
                continue
            assert filled == len(metas) <= buffer_count
            got += [
                (bytes(buf[: m.length]), m.source) for buf, m in zip(buffers, metas, strict=False)
            ]
            if filled == 0:
                assert wait_readable(rx, 2.0)
        assert got == expected
    finally:
        _close(rx, *senders)


def test_a_kernel_error_on_the_batch_path_shuts_the_socket_down() -> None:
    rx, tx = _bind(), _bind()
    try:
        buffers = [bytearray(64) for _ in range(4)]
        for _ in range(2):
            assert tx.try_send_to(b"warm", rx.local_addr)
            assert _receive(rx, buffers, 1) == [(b"warm", tx.local_addr)]
        assert _batches(rx) == 1
        # A connected socket reports the ICMP "port unreachable" of its peer as ECONNREFUSED
        # on the next receive (an unconnected one does not): connect rx to a closed port.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as gone:
            gone.bind(("127.0.0.1", 0))
            dead = gone.getsockname()
        rx._sock.connect(dead)
        rx._sock.send(b"anyone?")
        assert wait_readable(rx, 2.0)  # the error makes the socket readable
        with pytest.raises(ConnectionRefusedError):
            rx.try_recv(buffers, [])
        assert rx.is_shutdown
        assert _batches(rx) == 0
    finally:
        _close(rx, tx)
