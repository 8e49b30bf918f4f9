"""DatagramSocketSet: the reference test inventory (socket_set.rs), fairness, readiness and
lifecycle; also exercises the DatagramSocket base-class defaults through a recording fake."""

from __future__ import annotations

import mmap
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import pytest

from chrysalis.core import DatagramAddr
from chrysalis.datagram import (
    DatagramRecvMeta,
    DatagramSocket,
    DatagramSocketSet,
    DatagramTransmit,
    InprocNetwork,
    InvalidDataError,
    SocketClosedError,
    UdpSocket,
    UnixDatagramSocket,
    UnsupportedSchemeError,
)
from chrysalis.datagram.testing import recv_datagrams


class RecordingSocket(DatagramSocket):
    """A fake carrier: records sends, accepts at most ``accept`` datagrams in total, and
    serves queued ``(payload, source)`` receives. Relies on the base-class defaults of
    ``try_send_transmit`` and ``try_recv_from``."""

    def __init__(self, addr: DatagramAddr, *, accept: int = 1 << 30, segments: int = 1) -> None:
        self._addr = addr
        self.accept = accept
        self.sent: list[tuple[bytes, DatagramAddr]] = []
        self.incoming: deque[tuple[bytes, DatagramAddr]] = deque()
        self.closed = False
        self.recv_waker: object = None
        self._segments = segments

    @property
    def local_addr(self) -> DatagramAddr:
        return self._addr

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        if self.closed:
            raise SocketClosedError()
        if len(self.sent) >= self.accept:
            return False
        self.sent.append((bytes(data), destination))
        return True

    def try_recv(
        self, buffers: Sequence[bytearray | memoryview | mmap.mmap], metas: list[DatagramRecvMeta]
    ) -> int:
        if self.closed:
            raise SocketClosedError()
        filled = 0
        while self.incoming and filled < min(len(buffers), 32):
            data, source = self.incoming.popleft()
            if len(data) > len(buffers[filled]):
                raise InvalidDataError()
            buffers[filled][: len(data)] = data
            metas.append(DatagramRecvMeta(source, len(data), len(data)))
            filled += 1
        return filled

    def fileno(self) -> int | None:
        return None

    def add_recv_waker(self, waker: object) -> None:
        self.recv_waker = waker

    def add_send_waker(self, destination: DatagramAddr, waker: object) -> None:
        pass

    @property
    def max_receive_segments(self) -> int:
        return self._segments

    def shutdown(self) -> None:
        self.closed = True

    @property
    def is_shutdown(self) -> bool:
        return self.closed

    def join(self, timeout: float | None = None) -> bool:
        return self.closed


UDP_A = DatagramAddr.udp("127.0.0.1", 1000)
UDP_B = DatagramAddr.udp("127.0.0.1", 2000)
UNIX_A = DatagramAddr.unixgram("/run/a.sock")
UNIX_B = DatagramAddr.unixgram("/run/b.sock")


def test_selects_send_socket_by_destination_scheme() -> None:
    udp, unix = RecordingSocket(UDP_A), RecordingSocket(UNIX_A)
    group = DatagramSocketSet(udp, unix)
    assert group.try_send_to(b"local", UNIX_B)
    assert group.try_send_to(b"remote", UDP_B)
    assert unix.sent == [(b"local", UNIX_B)]
    assert udp.sent == [(b"remote", UDP_B)]
    assert group.local_addr == UDP_A
    assert group.member_for(UNIX_B) is unix


def test_segmented_send_reports_accepted_prefix() -> None:
    udp = RecordingSocket(UDP_A, accept=2)
    group = DatagramSocketSet(udp, RecordingSocket(UNIX_A))
    assert group.try_send_transmit(DatagramTransmit(UDP_B, b"aabbcc", 2)) == 2
    assert udp.sent == [(b"aa", UDP_B), (b"bb", UDP_B)]
    assert group.try_send_transmit(DatagramTransmit(UDP_B, b"cc", 2)) == 0


def test_receives_from_every_carrier() -> None:
    network = InprocNetwork()
    primary = UdpSocket.bind(("127.0.0.1", 0))
    member = network.bind()
    group = DatagramSocketSet(primary, member)
    peer = network.bind()
    udp_peer = UdpSocket.bind(("127.0.0.1", 0))
    try:
        assert peer.try_send_to(b"via inproc", member.local_addr)
        assert udp_peer.try_send_to(b"via udp", group.local_addr)
        got = recv_datagrams(group, 2)
        assert sorted(got, key=lambda item: item[0]) == [
            (b"via inproc", peer.local_addr),
            (b"via udp", udp_peer.local_addr),
        ]
    finally:
        for sock in (group, udp_peer, peer):
            sock.shutdown()
            assert sock.join(1)


def test_rejects_duplicate_schemes() -> None:
    with pytest.raises(ValueError, match="udp"):
        DatagramSocketSet(RecordingSocket(UDP_A), RecordingSocket(UDP_B))
    sock = RecordingSocket(UNIX_A)
    with pytest.raises(ValueError, match="unixgram"):
        DatagramSocketSet(sock, sock)
    with pytest.raises(TypeError):
        DatagramSocketSet(RecordingSocket(UDP_A), object())  # type: ignore[arg-type]


def test_unknown_scheme_names_the_scheme_and_the_available_ones() -> None:
    group = DatagramSocketSet(RecordingSocket(UDP_A), RecordingSocket(UNIX_A))
    with pytest.raises(UnsupportedSchemeError) as info:
        group.try_send_to(b"x", DatagramAddr.inproc(1, 1))
    message = str(info.value)
    assert "'inproc'" in message
    assert "'udp'" in message
    assert "'unixgram'" in message


def test_round_robin_receive_is_fair() -> None:
    first, second = RecordingSocket(UDP_A), RecordingSocket(UNIX_A)
    for i in range(4):
        first.incoming.append((b"u%d" % i, UDP_B))
        second.incoming.append((b"x%d" % i, UNIX_B))
    group = DatagramSocketSet(first, second)
    order = []
    for _ in range(8):
        got = group.try_recv_from()
        assert got is not None
        order.append(got[0])
    assert order == [b"u0", b"x0", b"u1", b"x1", b"u2", b"x2", b"u3", b"x3"]
    buffers = [bytearray(8)]
    first.incoming.extend([(b"u", UDP_B)] * 2)
    second.incoming.extend([(b"x", UNIX_B)] * 2)
    seen = []
    for _ in range(4):
        metas: list[DatagramRecvMeta] = []
        assert group.try_recv(buffers, metas) == 1
        seen.append(bytes(buffers[0][: metas[0].length]))
    assert seen == [b"u", b"x", b"u", b"x"]


def test_batch_receive_collects_from_several_members_up_to_the_batch() -> None:
    first, second = RecordingSocket(UDP_A), RecordingSocket(UNIX_A)
    first.incoming.extend([(b"u", UDP_B)] * 20)
    second.incoming.extend([(b"x", UNIX_B)] * 20)
    group = DatagramSocketSet(first, second)
    metas: list[DatagramRecvMeta] = []
    assert group.try_recv([bytearray(4) for _ in range(40)], metas) == 32
    assert [m.source for m in metas] == [UDP_B] * 20 + [UNIX_B] * 12


def test_member_error_after_partial_batch_is_deferred() -> None:
    first, second = RecordingSocket(UDP_A), RecordingSocket(UNIX_A)
    first.incoming.append((b"ok", UDP_B))
    second.incoming.append((b"far too long", UNIX_B))
    group = DatagramSocketSet(first, second)
    metas: list[DatagramRecvMeta] = []
    assert group.try_recv([bytearray(4), bytearray(4)], metas) == 1
    with pytest.raises(InvalidDataError):
        group.try_recv([bytearray(4)], metas)


def test_properties_combine_members() -> None:
    udp = UdpSocket.bind(("127.0.0.1", 0), gro=False)
    network = InprocNetwork()
    group = DatagramSocketSet(network.bind(), udp, RecordingSocket(UNIX_A, segments=7))
    try:
        assert group.max_transmit_segments == 32  # the primary's (inproc)
        assert group.max_receive_segments == 7
        assert group.may_fragment  # udp may
        assert group.schemes == ("inproc", "udp", "unixgram")
        assert group.fileno() is None
        assert group.readiness_fds() == [udp.fileno()]
        assert group.send_readiness_fd(DatagramAddr.udp("127.0.0.1", 9)) == udp.fileno()
        assert group.send_readiness_fd(DatagramAddr.inproc(network.network_id, 9)) is None
        single = DatagramSocketSet(RecordingSocket(UDP_A))
        assert single.fileno() is None  # the only member has no descriptor
    finally:
        group.shutdown()
        assert group.join(1)


def test_single_member_set_exposes_its_descriptor() -> None:
    udp = UdpSocket.bind(("127.0.0.1", 0))
    group = DatagramSocketSet(udp)
    try:
        assert group.fileno() == udp.fileno()
    finally:
        group.shutdown()
        assert group.join(1)


def test_recv_waker_fires_for_a_waker_driven_member() -> None:
    network = InprocNetwork()
    unix = UnixDatagramSocket.bind(b"\0chrysalis-set-waker-test-%d" % id(network))
    member = network.bind()
    group = DatagramSocketSet(unix, member)
    peer = network.bind()
    try:
        calls: list[int] = []
        group.add_recv_waker(lambda: calls.append(1))
        assert peer.try_send_to(b"x", member.local_addr)
        assert calls == [1]
        group.shutdown()
        assert calls == [1]  # one-shot across members
    finally:
        group.shutdown()
        assert group.join(1)


def test_shutdown_cascades_and_wakes_and_join_waits_for_all(tmp_path: Path) -> None:
    unix = UnixDatagramSocket.bind(tmp_path / "u.sock")
    udp = UdpSocket.bind(("127.0.0.1", 0))
    group = DatagramSocketSet(udp, unix)
    woken = threading.Event()
    group.add_recv_waker(woken.set)
    assert not group.join(0.0)
    group.shutdown()
    group.shutdown()
    assert woken.is_set()
    assert udp.is_shutdown
    assert unix.is_shutdown
    assert group.join(1.0)
    assert not (tmp_path / "u.sock").exists()
    with pytest.raises(SocketClosedError):
        group.try_recv_from()
    with pytest.raises(SocketClosedError):
        group.try_send_to(b"x", UDP_B)
    late = threading.Event()
    group.add_recv_waker(late.set)
    assert late.is_set()


def test_member_that_shuts_down_alone_shuts_the_set_down() -> None:
    first, second = RecordingSocket(UDP_A), RecordingSocket(UNIX_A)
    group = DatagramSocketSet(first, second)
    second.shutdown()
    with pytest.raises(SocketClosedError):
        group.try_recv([bytearray(4)], [])
    assert group.is_shutdown
    assert first.is_shutdown


def test_member_that_shut_itself_down_is_noticed_by_is_shutdown() -> None:
    first, second = RecordingSocket(UDP_A), RecordingSocket(UNIX_A)
    group = DatagramSocketSet(first, second)
    second.shutdown()  # by itself, as a UDP member does after a receive error
    assert group.is_shutdown
    assert first.is_shutdown  # noticing it shut the whole set down


def test_member_that_shut_itself_down_is_noticed_on_the_send_path() -> None:
    first, second = RecordingSocket(UDP_A), RecordingSocket(UNIX_A)
    group = DatagramSocketSet(first, second)
    second.shutdown()
    with pytest.raises(SocketClosedError):
        group.try_send_to(b"x", UNIX_B)
    assert first.is_shutdown
    with pytest.raises(SocketClosedError):
        group.try_send_to(b"x", UDP_B)  # the set is shut down: no member sends any more
    third, fourth = RecordingSocket(UDP_A), RecordingSocket(UNIX_A)
    other = DatagramSocketSet(third, fourth)
    fourth.shutdown()
    with pytest.raises(SocketClosedError):
        other.try_send_transmit(DatagramTransmit(UNIX_B, b"abcd", 2))
    assert third.is_shutdown
    assert first.sent == third.sent == []


def test_base_class_try_recv_from_splits_aggregates() -> None:
    class Aggregating(RecordingSocket):
        def try_recv(
            self,
            buffers: Sequence[bytearray | memoryview | mmap.mmap],
            metas: list[DatagramRecvMeta],
        ) -> int:
            if not self.incoming:
                return 0
            data, source = self.incoming.popleft()
            buffers[0][: len(data)] = data
            metas.append(DatagramRecvMeta(source, len(data), 2))
            return 1

    sock = Aggregating(UDP_A)
    sock.incoming.append((b"aabbc", UDP_B))
    sock.incoming.append((b"zz", UDP_B))
    got = [sock.try_recv_from() for _ in range(4)]
    assert got == [(b"aa", UDP_B), (b"bb", UDP_B), (b"c", UDP_B), (b"zz", UDP_B)]
    assert sock.try_recv_from() is None
