"""The wrapper passes the exported carrier conformance suite of ``chrysalis.datagram.testing``.

Two wrappings of each inner carrier: ``transparent`` (a zero-fault plan: every call goes
straight to the inner socket) and ``mediated`` (still no faults, but a partition from an
unrelated peer forces every send and receive through the fault stage: the ready queue, the
splitting of transmits and aggregates, the wrapper's own waker handling).
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from chrysalis.core import DatagramAddr
from chrysalis.datagram import DatagramSocket, InprocNetwork, UdpSocket, UnixDatagramSocket
from chrysalis.faultnet import FaultDirection, FaultPlan, FaultySocket

if importlib.util.find_spec("chrysalis.datagram.testing") is None:
    pytest.skip(
        "chrysalis.datagram.testing (the carrier conformance suite) is not installed",
        allow_module_level=True,
    )

from chrysalis.datagram.testing import (
    CHECKS,
    TIMEOUT,
    PairFactory,
    check_datagram_socket,
    wait_readable,
)

Pair = tuple[DatagramSocket, DatagramSocket]
UNRELATED = DatagramAddr.inproc(2**64 - 1, 2**64 - 1)


def inproc() -> Pair:
    network = InprocNetwork()
    return network.bind(), network.bind()


def inproc_small_queue() -> Pair:
    network = InprocNetwork(queue_capacity=3)
    return network.bind(), network.bind()


def udp4() -> Pair:
    return UdpSocket.bind(("127.0.0.1", 0)), UdpSocket.bind(("127.0.0.1", 0))


def unixgram() -> Pair:
    folder = Path(tempfile.gettempdir())
    return UnixDatagramSocket.bind_unique(folder), UnixDatagramSocket.bind_unique(folder)


CARRIERS: dict[str, Callable[[], Pair]] = {
    "inproc": inproc,
    "inproc-small-queue": inproc_small_queue,
    "udp4": udp4,
    "unixgram": unixgram,
}


def wrapped(carrier: Callable[[], Pair], mediated: bool) -> PairFactory:
    def make_pair() -> Pair:
        a, b = carrier()
        pair = FaultySocket(a, FaultPlan(seed=1)), FaultySocket(b, FaultPlan(seed=2))
        if mediated:
            for sock in pair:
                sock.partition(UNRELATED)
        return pair

    return make_pair


@pytest.mark.parametrize("mediated", [False, True], ids=["transparent", "mediated"])
@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__[6:] for check in CHECKS])
@pytest.mark.parametrize("carrier", sorted(CARRIERS))
def test_wrapper_passes_conformance_check(
    carrier: str, check: Callable[[PairFactory], None], mediated: bool
) -> None:
    check(wrapped(CARRIERS[carrier], mediated))


def test_check_datagram_socket_accepts_the_wrapper() -> None:
    pairs: list[Pair] = []

    def counting() -> Pair:
        pair = wrapped(inproc, mediated=True)()
        pairs.append(pair)
        return pair

    check_datagram_socket(counting)
    assert len(pairs) == len(CHECKS)
    socks = [sock for pair in pairs for sock in pair]
    assert all(isinstance(sock, FaultySocket) and sock.inner.is_shutdown for sock in socks)


def test_held_datagram_on_a_descriptor_carrier_wakes_the_receiver() -> None:
    a, b = udp4()
    sender = FaultySocket(a, FaultPlan())
    receiver = FaultySocket(b, FaultPlan(delay=0.05, direction=FaultDirection.RECEIVE))
    try:
        assert receiver.fileno() == b.fileno()
        assert receiver.readiness_fds() == b.readiness_fds()
        assert sender.try_send_to(b"late", receiver.local_addr)
        assert wait_readable(receiver, TIMEOUT)  # the inner descriptor: the datagram arrived
        assert receiver.try_recv_from() is None  # taken from the kernel and held
        # Nothing is readable on the descriptor any more: only the wrapper's waker can tell.
        assert wait_readable(receiver, TIMEOUT)
        assert receiver.try_recv_from() == (b"late", sender.local_addr)
    finally:
        for sock in (sender, receiver):
            sock.shutdown()
            assert sock.join(TIMEOUT)
