"""The public conformance suite run against every carrier of this package, plus the
contract's value types, errors and lifecycle helper."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import resource
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core import DatagramAddr
from chrysalis.datagram import (
    AddressInUseError,
    AddressNotAvailableError,
    ConnectionRefusedDatagramError,
    DatagramError,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramSocketSet,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InprocNetwork,
    InvalidDataError,
    ShutdownState,
    SocketClosedError,
    UdpSocket,
    UnixDatagramSocket,
    UnsupportedSchemeError,
)
from chrysalis.datagram.testing import (
    CHECKS,
    PairFactory,
    check_datagram_socket,
    check_readiness_reports_incoming_data,
    recv_datagrams,
    wait_readable,
)

Pair = tuple[DatagramSocket, DatagramSocket]


def _ipv6_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


def udp4_pair() -> Pair:
    return UdpSocket.bind(("127.0.0.1", 0)), UdpSocket.bind(("127.0.0.1", 0))


def udp4_plain_pair() -> Pair:
    return (
        UdpSocket.bind(("127.0.0.1", 0), gso=False, gro=False),
        UdpSocket.bind(("127.0.0.1", 0), gso=False, gro=False),
    )


def udp4_gso_to_plain_pair() -> Pair:
    # A GSO sender towards a receiver without GRO: the kernel still splits the datagrams.
    return UdpSocket.bind(("127.0.0.1", 0)), UdpSocket.bind(("127.0.0.1", 0), gro=False)


def udp6_pair() -> Pair:
    return UdpSocket.bind(("::1", 0, 0, 0)), UdpSocket.bind(("::1", 0, 0, 0))


_UNIX_DIR = Path(tempfile.gettempdir())


def unix_path_pair() -> Pair:
    return UnixDatagramSocket.bind_unique(_UNIX_DIR), UnixDatagramSocket.bind_unique(_UNIX_DIR)


_abstract_counter = iter(range(1 << 30))


def unix_abstract_pair() -> Pair:
    def name() -> bytes:
        return f"\0chrysalis-test-{id(_UNIX_DIR)}-{next(_abstract_counter)}".encode()

    return UnixDatagramSocket.bind(name()), UnixDatagramSocket.bind(name())


def inproc_pair() -> Pair:
    network = InprocNetwork()
    return network.bind(), network.bind()


def inproc_small_queue_pair() -> Pair:
    network = InprocNetwork(queue_capacity=3)
    return network.bind(), network.bind()


def socket_set_pair() -> Pair:
    network = InprocNetwork()
    a = DatagramSocketSet(UdpSocket.bind(("127.0.0.1", 0)), network.bind())
    b = DatagramSocketSet(UdpSocket.bind(("127.0.0.1", 0)), network.bind())
    return a, b


def socket_set_inproc_primary_pair() -> Pair:
    network = InprocNetwork()
    a = DatagramSocketSet(network.bind(), UnixDatagramSocket.bind_unique(_UNIX_DIR))
    b = DatagramSocketSet(network.bind(), UnixDatagramSocket.bind_unique(_UNIX_DIR))
    return a, b


CARRIERS: dict[str, Callable[[], Pair]] = {
    "udp4": udp4_pair,
    "udp4-plain": udp4_plain_pair,
    "udp4-gso-to-plain": udp4_gso_to_plain_pair,
    "udp6": udp6_pair,
    "unixgram-path": unix_path_pair,
    "unixgram-abstract": unix_abstract_pair,
    "inproc": inproc_pair,
    "inproc-small-queue": inproc_small_queue_pair,
    "socket-set-udp-inproc": socket_set_pair,
    "socket-set-inproc-unix": socket_set_inproc_primary_pair,
}


def _factory(name: str) -> PairFactory:
    if name == "udp6" and not _ipv6_available():
        pytest.skip("IPv6 loopback is not available")
    return CARRIERS[name]


@contextlib.contextmanager
def _descriptors_above_1023() -> Iterator[None]:
    """Occupy the low descriptor numbers so that sockets made inside get numbers >= 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip("the descriptor limit is too low for this test")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_conformance_waits_work_with_descriptors_above_1023() -> None:
    with _descriptors_above_1023():
        a, b = udp4_pair()
        with a, b:
            fd = b.fileno()
            assert fd is not None
            assert fd >= 1024
            assert not wait_readable(b, 0.01)
            assert a.try_send_to(b"high", b.local_addr)
            assert wait_readable(b, 5.0)
            assert recv_datagrams(b, 1) == [(b"high", a.local_addr)]
        check_readiness_reports_incoming_data(udp4_pair)


@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__[6:] for check in CHECKS])
@pytest.mark.parametrize("carrier", sorted(CARRIERS))
def test_carrier_passes_conformance_check(
    carrier: str, check: Callable[[PairFactory], None]
) -> None:
    check(_factory(carrier))


def test_check_datagram_socket_runs_every_check_on_one_carrier() -> None:
    pairs: list[Pair] = []

    def counting_pair() -> Pair:
        pair = inproc_pair()
        pairs.append(pair)
        return pair

    check_datagram_socket(counting_pair)
    assert len(pairs) == len(CHECKS)
    assert all(sock.is_shutdown for pair in pairs for sock in pair)


# -- the contract's value types, errors and lifecycle helper -----------------------------------

DESTINATION = DatagramAddr.udp("127.0.0.1", 4433)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.none() | st.integers(min_value=1, max_value=1500))
def test_transmit_segments_cover_the_contents_in_order(
    contents: bytes, segment_size: int | None
) -> None:
    transmit = DatagramTransmit(DESTINATION, contents, segment_size)
    count = transmit.segment_count
    if segment_size is None or segment_size >= len(contents):
        assert count == 1
    else:
        assert count == -(-len(contents) // segment_size)
    segments = [bytes(transmit.segment(i)) for i in range(count)]
    assert b"".join(segments) == contents
    if count > 1:
        assert segment_size is not None
        assert all(len(seg) == segment_size for seg in segments[:-1])
        assert 0 < len(segments[-1]) <= segment_size
        for first in range(1, count):
            suffix = transmit.suffix(first)
            assert [bytes(suffix.segment(i)) for i in range(suffix.segment_count)] == segments[
                first:
            ]
    with pytest.raises(IndexError):
        transmit.segment(count)


def test_transmit_rejects_bad_segment_size_and_ecn() -> None:
    with pytest.raises(ValueError, match="segment_size"):
        DatagramTransmit(DESTINATION, b"x", 0)
    with pytest.raises(ValueError, match="ecn"):
        DatagramTransmit(DESTINATION, b"x", ecn=4)
    transmit = DatagramTransmit(DESTINATION, b"abc", 1, ecn=2)
    with pytest.raises(FrozenInstanceError):
        transmit.segment_size = 2  # type: ignore[misc]
    with pytest.raises(IndexError):
        transmit.suffix(0)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=1, max_size=500), st.integers(min_value=1, max_value=600))
def test_recv_meta_splits_a_buffer_by_stride(data: bytes, stride: int) -> None:
    buffer = bytearray(data + b"\xff" * 10)
    meta = DatagramRecvMeta(DESTINATION, len(data), min(stride, len(data)))
    segments = [bytes(seg) for seg in meta.segments(buffer)]
    assert b"".join(segments) == data
    assert len(segments) == meta.segment_count


def test_errors_are_oserrors_with_errno_and_pickle() -> None:
    closed = SocketClosedError()
    assert isinstance(closed, BrokenPipeError)
    assert isinstance(closed, DatagramError)
    assert closed.errno == errno.EPIPE
    assert isinstance(ConnectionRefusedDatagramError(), ConnectionRefusedError)
    for error in (
        closed,
        DatagramTooLargeError("big"),
        UnsupportedSchemeError.for_scheme("xyz", ("udp",)),
        AddressInUseError(),
        AddressNotAvailableError(),
        HostUnreachableError(),
        ConnectionRefusedDatagramError(),
        InvalidDataError(),
    ):
        assert isinstance(error, OSError)
        assert error.errno is not None
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error)
        assert str(clone) == str(error)


def test_unsupported_scheme_message_is_bounded() -> None:
    error = UnsupportedSchemeError.for_scheme("s" * 1000, ("udp", "inproc"))
    assert len(str(error)) < 200
    assert "'udp', 'inproc'" in str(error)


def test_shutdown_state_join_never_reports_a_failed_release() -> None:
    state = ShutdownState()
    state.shutdown()
    attempts: list[int] = []

    def release() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise OSError(errno.EIO, "release failed")

    for _ in range(2):
        with pytest.raises(OSError, match="release failed"):
            state.join(1.0, release)
    assert state.join(1.0, release)  # a later joiner runs the release again; now it works
    assert state.join(1.0, release)
    assert len(attempts) == 3


def test_shutdown_state_joiner_waiting_on_a_failing_release_does_not_get_true() -> None:
    state = ShutdownState()
    state.shutdown()
    started, proceed = threading.Event(), threading.Event()

    def failing() -> None:
        started.set()
        assert proceed.wait(5.0)
        raise OSError(errno.EIO, "release failed")

    first_error: list[BaseException] = []

    def first() -> None:
        try:
            state.join(5.0, failing)
        except OSError as error:
            first_error.append(error)

    thread = threading.Thread(target=first)
    thread.start()
    assert started.wait(5.0)
    results: list[bool | BaseException] = []

    def second() -> None:
        try:
            results.append(state.join(5.0, failing))
        except OSError as error:
            results.append(error)

    waiter = threading.Thread(target=second)
    waiter.start()
    proceed.set()  # both attempts fail: nobody may report the socket released
    thread.join(5.0)
    waiter.join(5.0)
    assert len(first_error) == 1
    assert len(results) == 1
    assert results[0] is not True


def test_shutdown_state_keeps_every_send_waker_within_a_bound() -> None:
    state = ShutdownState()
    calls = [0] * 1500

    def waker(index: int) -> Callable[[], None]:
        def wake() -> None:
            calls[index] += 1

        return wake

    for index in range(1500):
        state.set_send_waker(waker(index))
    assert len(state._send_wakers) <= 1024  # overflow wakes the parked ones early
    state.shutdown()
    assert calls == [1] * 1500


def test_shutdown_state_join_waits_for_shutdown_and_releases_once() -> None:
    state = ShutdownState()
    released: list[int] = []
    assert not state.join(0.01, lambda: released.append(1))
    assert released == []
    results: list[bool] = []
    joiners = [
        threading.Thread(target=lambda: results.append(state.join(2.0, lambda: released.append(1))))
        for _ in range(3)
    ]
    for thread in joiners:
        thread.start()
    assert state.shutdown()
    assert not state.shutdown()
    for thread in joiners:
        thread.join(2.0)
    assert results == [True, True, True]
    assert released == [1]
    with pytest.raises(SocketClosedError):
        state.check()
