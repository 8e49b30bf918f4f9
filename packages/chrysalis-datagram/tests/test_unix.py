"""Unix datagram carrier: the reference test inventory (unix.rs) plus path and error rules."""

from __future__ import annotations

import errno
import gc
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import AddressError, DatagramAddr
from chrysalis.datagram import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    AddressInUseError,
    AddressNotAvailableError,
    ConnectionRefusedDatagramError,
    DatagramRecvMeta,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InvalidDataError,
    SocketClosedError,
    UnixDatagramSocket,
)
from chrysalis.datagram.testing import recv_datagrams, wait_readable


def _close(*socks: UnixDatagramSocket) -> None:
    for sock in socks:
        sock.shutdown()
        assert sock.join(5)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[UnixDatagramSocket, UnixDatagramSocket]]:
    a = UnixDatagramSocket.bind(tmp_path / "a.sock")
    b = UnixDatagramSocket.bind(tmp_path / "b.sock")
    yield a, b
    _close(a, b)


def _abstract(tag: str) -> bytes:
    return f"\0chrysalis-test-unix-{os.getpid()}-{tag}".encode()


def test_round_trip_preserves_boundaries_and_source_addresses(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket], tmp_path: Path
) -> None:
    client, server = pair
    assert client.local_addr == DatagramAddr.unixgram(str(tmp_path / "a.sock"))
    assert client.try_send_to(b"request", server.local_addr)
    assert client.try_send_to(b"", server.local_addr)
    assert recv_datagrams(server, 2) == [(b"request", client.local_addr), (b"", client.local_addr)]
    assert server.try_send_to(b"response", client.local_addr)
    assert recv_datagrams(client, 1) == [(b"response", server.local_addr)]


def test_abstract_names_round_trip() -> None:
    a = UnixDatagramSocket.bind(_abstract("a"))
    b = UnixDatagramSocket.bind(DatagramAddr.unixgram(_abstract("b")))
    try:
        assert a.local_addr.is_abstract
        assert a.try_send_to(b"hi", b.local_addr)
        assert recv_datagrams(b, 1) == [(b"hi", a.local_addr)]
    finally:
        _close(a, b)


def test_segmented_send_preserves_datagram_boundaries(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    a, b = pair
    assert a.max_transmit_segments == DATAGRAM_BATCH_SIZE
    assert not a.may_fragment
    segments = [bytes([i]) * 64 for i in range(40)]
    transmit = DatagramTransmit(b.local_addr, b"".join(segments), 64)
    received: list[bytes] = []
    deadline = time.monotonic() + 5
    while True:
        accepted = a.try_send_transmit(transmit)
        assert accepted <= DATAGRAM_BATCH_SIZE
        if accepted == transmit.segment_count:
            break
        if accepted:
            transmit = transmit.suffix(accepted)
        else:  # the receiver's short kernel queue is full: drain it
            got = b.try_recv_from()
            assert got is not None
            received.append(got[0])
        assert time.monotonic() < deadline
    received += [data for data, _ in recv_datagrams(b, 40 - len(received))]
    assert received == segments


def test_full_receive_queue_would_block_instead_of_dropping(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    a, b = pair
    sent = 0
    while a.try_send_to(sent.to_bytes(4, "big"), b.local_addr):
        sent += 1
        assert sent < 10_000, "the queue never filled"
    got = recv_datagrams(b, sent)
    assert [int.from_bytes(data, "big") for data, _ in got] == list(range(sent))
    assert a.try_send_to(b"again", b.local_addr)


def test_shutdown_wakes_receive_rejects_sends_and_joins(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket], tmp_path: Path
) -> None:
    a, b = pair
    path = tmp_path / "b.sock"
    woken = threading.Event()
    b.add_recv_waker(woken.set)
    b.shutdown()
    b.shutdown()
    assert woken.is_set()
    assert not path.exists(), "the socket file was not removed"
    started = time.monotonic()
    assert b.join(5.0)
    assert time.monotonic() - started < 5.0  # prompt, with room for a loaded machine
    for operation in (
        lambda: b.try_send_to(b"x", a.local_addr),
        lambda: b.try_recv([bytearray(8)], []),
        b.try_recv_from,
    ):
        with pytest.raises(SocketClosedError) as info:
            operation()
        assert info.value.errno == errno.EPIPE
    with pytest.raises(HostUnreachableError):
        a.try_send_to(b"x", b.local_addr)
    rebound = UnixDatagramSocket.bind(path)
    _close(rebound)


def test_shutdown_does_not_remove_a_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    sock = UnixDatagramSocket.bind(path)
    path.unlink()
    path.write_bytes(b"someone else's file")
    _close(sock)
    assert path.read_bytes() == b"someone else's file"


def test_sender_without_a_name_is_address_not_available(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    a, b = pair
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as anonymous:
        anonymous.sendto(b"who?", b.path)
    assert a.try_send_to(b"named", b.local_addr)
    assert wait_readable(b, 2.0)
    with pytest.raises(AddressNotAvailableError):
        b.try_recv([bytearray(64)], [])
    assert recv_datagrams(b, 1) == [(b"named", a.local_addr)]


def test_unnamed_sender_after_a_filled_buffer_defers_the_error(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    a, b = pair
    assert a.try_send_to(b"first", b.local_addr)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as anonymous:
        anonymous.sendto(b"who?", b.path)
    metas: list[DatagramRecvMeta] = []
    assert b.try_recv([bytearray(64), bytearray(64)], metas) == 1
    assert metas[0].source == a.local_addr
    with pytest.raises(AddressNotAvailableError):
        b.try_recv([bytearray(64)], metas)


@pytest.mark.parametrize(
    "path",
    [
        b"",
        b"/tmp/nul\0inside",
        b"/tmp/" + b"x" * 103,  # 108 bytes: no room for the terminator
        b"\0" + b"y" * 108,  # 109 bytes
        b"\0abstract\0with-nul",
    ],
    ids=["empty", "nul", "too-long", "abstract-too-long", "abstract-nul"],
)
def test_invalid_paths_are_rejected(path: bytes) -> None:
    with pytest.raises(AddressError):
        UnixDatagramSocket.bind(path)


def test_longest_paths_fit(tmp_path: Path) -> None:
    abstract = UnixDatagramSocket.bind(b"\0" + f"{os.getpid():08d}".encode() + b"z" * 99)
    assert len(abstract.path) == 108
    _close(abstract)
    directory = os.fsencode(tmp_path)
    filler = 107 - len(directory) - 1
    if filler < 1:
        pytest.skip("temporary directory path is too long")
    longest = UnixDatagramSocket.bind(directory + b"/" + b"f" * filler)
    assert len(longest.path) == 107
    _close(longest)


def test_destination_with_nul_is_rejected_before_sending(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    a, b = pair
    # Sent as is, the kernel would stop at the NUL and deliver to b.
    sneaky = DatagramAddr.unixgram(b.path + b"\0suffix")
    with pytest.raises(AddressError):
        a.try_send_to(b"x", sneaky)
    assert b.try_recv_from() is None


def test_existing_path_is_address_in_use_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "taken.sock"
    path.write_bytes(b"stale")
    with pytest.raises(AddressInUseError):
        UnixDatagramSocket.bind(path)
    assert path.read_bytes() == b"stale"


def test_missing_and_dead_destinations(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket], tmp_path: Path
) -> None:
    a, _ = pair
    with pytest.raises(HostUnreachableError):
        a.try_send_to(b"x", DatagramAddr.unixgram(str(tmp_path / "missing.sock")))
    not_a_socket = tmp_path / "plain"
    not_a_socket.write_bytes(b"")
    with pytest.raises(ConnectionRefusedDatagramError):
        a.try_send_to(b"x", DatagramAddr.unixgram(str(not_a_socket)))


def test_bind_unique_makes_distinct_files_that_are_removed(tmp_path: Path) -> None:
    first = UnixDatagramSocket.bind_unique(tmp_path)
    second = UnixDatagramSocket.bind_unique(tmp_path)
    try:
        assert first.path != second.path
        assert os.path.exists(first.path)
        assert os.path.dirname(first.path) == os.fsencode(tmp_path)
    finally:
        _close(first, second)
    assert list(tmp_path.iterdir()) == []


def test_dropped_socket_shuts_down_and_removes_its_file(tmp_path: Path) -> None:
    path = tmp_path / "dropped.sock"
    sock: UnixDatagramSocket | None = UnixDatagramSocket.bind(path)
    assert path.exists()
    woken = threading.Event()
    assert sock is not None
    sock.add_recv_waker(woken.set)
    sock = None
    gc.collect()
    assert woken.is_set()
    assert not path.exists()


def test_single_receive_rejects_datagrams_longer_than_the_limit(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket], tmp_path: Path
) -> None:
    _, b = pair
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
        raw.bind(str(tmp_path / "raw.sock"))
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        raw.sendto(bytes(70_000), str(tmp_path / "b.sock"))
        raw.sendto(b"\x01" * MAX_DATAGRAM_SIZE, str(tmp_path / "b.sock"))
        raw.sendto(b"next", str(tmp_path / "b.sock"))
        assert wait_readable(b, 5.0)
        with pytest.raises(InvalidDataError):
            b.try_recv_from()  # never silently truncated
        source = DatagramAddr.unixgram(str(tmp_path / "raw.sock"))
        assert b.try_recv_from() == (b"\x01" * MAX_DATAGRAM_SIZE, source)  # the limit fits
        assert b.try_recv_from() == (b"next", source)


def test_every_send_waker_is_kept_and_woken_by_shutdown(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    a, b = pair
    woken: list[str] = []
    a.add_send_waker(b.local_addr, lambda: woken.append("first"))
    a.add_send_waker(b.local_addr, lambda: woken.append("second"))
    a.shutdown()
    assert sorted(woken) == ["first", "second"]


def test_equal_consecutive_datagrams_share_one_read_only_meta(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket], tmp_path: Path
) -> None:
    a, b = pair
    c = UnixDatagramSocket.bind(tmp_path / "c.sock")
    try:
        # Same sender and length (shared), a new length, then a new sender of that length: the
        # meta must follow the source even though the length did not change.
        for sender, payload in ((a, b"x" * 5), (a, b"y" * 5), (a, b"z" * 3), (c, b"w" * 3)):
            assert sender.try_send_to(payload, b.local_addr)
        assert wait_readable(b, 2.0)
        buffers = [bytearray(16) for _ in range(4)]
        metas: list[DatagramRecvMeta] = []
        assert b.try_recv(buffers, metas) == 4
        assert metas[0] is metas[1]
        assert [(m.source, m.length, m.stride, m.ecn) for m in metas] == [
            (a.local_addr, 5, 5, None),
            (a.local_addr, 5, 5, None),
            (a.local_addr, 3, 3, None),
            (c.local_addr, 3, 3, None),
        ]
        assert [bytes(buf[: m.length]) for buf, m in zip(buffers, metas, strict=True)] == [
            b"x" * 5,
            b"y" * 5,
            b"z" * 3,
            b"w" * 3,
        ]
        # Across calls: the next call continues from the last datagram (from c, 3 bytes).
        for sender in (c, a):
            assert sender.try_send_to(b"v" * 3, b.local_addr)
        later: list[DatagramRecvMeta] = []
        for _ in range(2):
            assert wait_readable(b, 2.0)
            assert b.try_recv(buffers[:1], later) == 1
        assert later[0] is metas[3]
        assert [(m.source, m.length) for m in later] == [(c.local_addr, 3), (a.local_addr, 3)]
    finally:
        _close(c)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([0, 1, 7, 1200])), min_size=1, max_size=24
    ),
    st.integers(1, DATAGRAM_BATCH_SIZE + 4),
)
def test_any_mix_of_senders_and_lengths_gets_exact_metas(
    sends: list[tuple[int, int]], buffer_count: int
) -> None:
    tag = os.urandom(6).hex()
    receiver = UnixDatagramSocket.bind(_abstract(f"mix-rx-{tag}"))
    senders = [UnixDatagramSocket.bind(_abstract(f"mix-tx{i}-{tag}")) for i in range(3)]
    try:
        expected: list[tuple[bytes, DatagramAddr]] = []
        got: list[tuple[bytes, DatagramAddr, int, int]] = []
        buffers = [bytearray(2048) for _ in range(buffer_count)]
        # At most 8 datagrams queued at a time: the kernel queue holds about 10.
        for start in range(0, len(sends), 8):
            for n, (who, size) in enumerate(sends[start : start + 8]):
                payload = bytes([(start + n) % 256]) * size
                assert senders[who].try_send_to(payload, receiver.local_addr)
                expected.append((payload, senders[who].local_addr))
            while len(got) < len(expected):
                metas: list[DatagramRecvMeta] = []
                filled = receiver.try_recv(buffers, metas)
                assert filled == len(metas) <= min(buffer_count, DATAGRAM_BATCH_SIZE)
                got.extend(
                    (bytes(buf[: m.length]), m.source, m.stride, m.length)
                    for buf, m in zip(buffers, metas, strict=False)
                )
                if filled == 0:
                    assert wait_readable(receiver, 2.0)
        assert [(data, source) for data, source, _, _ in got] == expected
        assert all(stride == length for _, _, stride, length in got)
    finally:
        _close(receiver, *senders)


def test_sends_to_a_remembered_destination_fail_after_shutdown_and_join(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    # try_send_to has no shutdown test on its fast path (a remembered destination): shutdown
    # empties the memo, and a memo put back by a sender that raced shutdown (simulated here)
    # meets a shut down, then closed, kernel socket.
    a, b = pair
    assert a.try_send_to(b"warm", b.local_addr)
    remembered = a._last_path
    assert remembered[0] is b.local_addr
    a.shutdown()
    for raced in (False, True, True):
        if raced:
            a._last_path = remembered
        with pytest.raises(SocketClosedError):
            a.try_send_to(b"x", b.local_addr)
        if raced:
            assert a.join(5)
    assert recv_datagrams(b, 1) == [(b"warm", a.local_addr)]
    assert b.try_recv_from() is None


def test_oversized_datagram_is_refused_also_to_a_remembered_destination(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket],
) -> None:
    a, b = pair
    assert a.try_send_to(b"x" * MAX_DATAGRAM_SIZE, b.local_addr)
    with pytest.raises(DatagramTooLargeError):
        a.try_send_to(bytearray(MAX_DATAGRAM_SIZE + 1), b.local_addr)
    assert [len(data) for data, _ in recv_datagrams(b, 1)] == [MAX_DATAGRAM_SIZE]


def test_segmented_send_checks_once_and_reports_errors_only_before_progress(
    pair: tuple[UnixDatagramSocket, UnixDatagramSocket], tmp_path: Path
) -> None:
    # try_send_transmit validates the destination and the segment size once per call, then
    # loops sendto: a short last segment, and every refusal before the first datagram.
    a, b = pair
    assert a.try_send_transmit(DatagramTransmit(b.local_addr, b"aaabbbc", 3)) == 3
    assert [data for data, _ in recv_datagrams(b, 3)] == [b"aaa", b"bbb", b"c"]
    big = MAX_DATAGRAM_SIZE + 1
    with pytest.raises(DatagramTooLargeError):
        a.try_send_transmit(DatagramTransmit(b.local_addr, bytes(2 * big), big))
    with pytest.raises(HostUnreachableError):
        a.try_send_transmit(DatagramTransmit(DatagramAddr.unixgram(str(tmp_path / "no")), b"xy", 1))
    with pytest.raises(AddressError):
        a.try_send_transmit(DatagramTransmit(DatagramAddr.unixgram(b"x\0y"), b"xy", 1))
    assert b.try_recv_from() is None  # nothing of the refused transmits arrived
    a.shutdown()
    with pytest.raises(SocketClosedError):
        a.try_send_transmit(DatagramTransmit(b.local_addr, b"xy", 1))


def test_a_full_receiver_refuses_while_the_sender_still_polls_writable(tmp_path: Path) -> None:
    """Why a sender must not wait for writability to retry a full Unix destination (the QUIC
    driver retries it on a timer): the receiver's full queue answers would-block, while the
    sender's own descriptor stays writable, and another destination is still served."""
    sender = UnixDatagramSocket.bind(tmp_path / "s.sock")
    stuck = UnixDatagramSocket.bind(tmp_path / "stuck.sock")
    live = UnixDatagramSocket.bind(tmp_path / "live.sock")
    try:
        accepted = 0
        while sender.try_send_to(b"x" * 100, stuck.local_addr):
            accepted += 1
            assert accepted < 100_000
        assert accepted > 0
        _, writable, _ = select.select([], [sender.fileno()], [], 0)
        assert writable
        assert not sender.try_send_to(b"x" * 100, stuck.local_addr)
        assert sender.try_send_to(b"y", live.local_addr)
        assert live.try_recv_from() == (b"y", sender.local_addr)
    finally:
        _close(sender, stuck, live)


def test_enobufs_is_reported_as_would_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = UnixDatagramSocket.bind(tmp_path / "s.sock")
    peer = UnixDatagramSocket.bind(tmp_path / "p.sock")

    def no_buffers(data: object, path: object) -> int:
        raise OSError(errno.ENOBUFS, "No buffer space available")

    try:
        monkeypatch.setattr(sender, "_sendto", no_buffers)
        assert sender.try_send_to(b"x", peer.local_addr) is False
        assert sender.try_send_transmit(DatagramTransmit(peer.local_addr, b"ab" * 4, 2)) == 0
    finally:
        _close(sender, peer)
