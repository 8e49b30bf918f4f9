"""Test fixtures: a small, strict in-memory carrier and a fake clock.

The memory carrier follows the ``DatagramSocket`` contract for descriptor-less carriers (bounded
per-destination queues, would-block when full, per-destination send wakers, receive wakers,
shutdown semantics), so the wrapper is tested against an inner socket whose behaviour this
package controls, independently of the carriers being written alongside it.
"""

from __future__ import annotations

import itertools
import mmap
import threading
from collections import deque
from collections.abc import Iterator, Sequence

import pytest

from chrysalis.core import INPROC_SCHEME, DatagramAddr
from chrysalis.datagram import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    ConnectionRefusedDatagramError,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    HostUnreachableError,
    InvalidDataError,
    SocketClosedError,
    UnsupportedSchemeError,
    Waker,
)
from chrysalis.faultnet import BindableNetwork

_network_ids = itertools.count(1_000_000)


class MemoryNetwork:
    """Endpoints addressed ``inproc://<network>/<endpoint>``, each with a bounded queue."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self.network_id = next(_network_ids)
        self.lock = threading.Lock()
        self.endpoints: dict[DatagramAddr, MemorySocket] = {}
        self._next_endpoint = 1

    def bind(self, endpoint_id: int | None = None) -> MemorySocket:
        with self.lock:
            if endpoint_id is None:
                endpoint_id = self._next_endpoint
                self._next_endpoint += 1
            addr = DatagramAddr.inproc(self.network_id, endpoint_id)
            assert addr not in self.endpoints, "endpoint in use"
            sock = MemorySocket(self, addr)
            self.endpoints[addr] = sock
            return sock


class MemorySocket(DatagramSocket):
    def __init__(self, network: MemoryNetwork, addr: DatagramAddr) -> None:
        self._network = network
        self._addr = addr
        self._queue: deque[tuple[bytes, DatagramAddr]] = deque()
        self._recv_waker: Waker | None = None
        self._send_wakers: dict[DatagramAddr, Waker] = {}  # senders blocked on this queue
        self._closed = False
        self._shut = threading.Event()

    @property
    def local_addr(self) -> DatagramAddr:
        return self._addr

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        if self._closed:
            raise SocketClosedError()
        if len(data) > MAX_DATAGRAM_SIZE:
            raise DatagramTooLargeError()
        if destination.scheme != INPROC_SCHEME:
            raise UnsupportedSchemeError.for_scheme(destination.scheme, [INPROC_SCHEME])
        with self._network.lock:
            peer = self._network.endpoints.get(destination)
            if peer is None:
                raise HostUnreachableError()
            if peer._closed:
                raise ConnectionRefusedDatagramError()
            if len(peer._queue) >= self._network.capacity:
                return False
            peer._queue.append((bytes(data), self._addr))
            waker, peer._recv_waker = peer._recv_waker, None
        if waker is not None:
            waker()
        return True

    def try_recv(
        self, buffers: Sequence[bytearray | memoryview | mmap.mmap], metas: list[DatagramRecvMeta]
    ) -> int:
        if self._closed:
            raise SocketClosedError()
        limit = min(len(buffers), DATAGRAM_BATCH_SIZE)
        filled = 0
        error: InvalidDataError | None = None
        with self._network.lock:
            while filled < limit and self._queue:
                data, source = self._queue[0]
                buffer = buffers[filled]
                if len(data) > len(buffer):
                    if filled == 0:
                        self._queue.popleft()
                        error = InvalidDataError()
                    break
                self._queue.popleft()
                buffer[: len(data)] = data
                metas.append(DatagramRecvMeta(source, len(data), len(data)))
                filled += 1
            wakers = list(self._send_wakers.values()) if filled or error else []
            if wakers:
                self._send_wakers.clear()
        for waker in wakers:
            waker()
        if error is not None:
            raise error
        return filled

    def fileno(self) -> int | None:
        return None

    def add_recv_waker(self, waker: Waker) -> None:
        with self._network.lock:
            if not (self._closed or self._queue):
                self._recv_waker = waker
                return
        waker()

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        with self._network.lock:
            peer = self._network.endpoints.get(destination)
            full = peer is not None and len(peer._queue) >= self._network.capacity
            if full and peer is not None and not (self._closed or peer._closed):
                peer._send_wakers[self._addr] = waker
                return
        waker()

    def shutdown(self) -> None:
        with self._network.lock:
            if self._closed:
                return
            self._closed = True
            wakers = [w for w in (self._recv_waker, *self._send_wakers.values()) if w is not None]
            self._recv_waker = None
            self._send_wakers.clear()
            self._queue.clear()
        self._shut.set()
        for waker in wakers:
            waker()

    @property
    def is_shutdown(self) -> bool:
        return self._closed

    def join(self, timeout: float | None = None) -> bool:
        if not self._shut.wait(timeout):
            return False
        with self._network.lock:
            if self._network.endpoints.get(self._addr) is self:
                del self._network.endpoints[self._addr]
        return True


@pytest.fixture
def memnet() -> Iterator[BindableNetwork]:
    """A fresh memory network; every socket still bound at the end is shut down and joined."""
    network = MemoryNetwork()
    yield network
    for sock in list(network.endpoints.values()):
        sock.shutdown()
        assert sock.join(5.0)


@pytest.fixture
def small_memnet() -> Iterator[BindableNetwork]:
    """A memory network whose queues hold 4 datagrams (to provoke would-block)."""
    network = MemoryNetwork(capacity=4)
    yield network
    for sock in list(network.endpoints.values()):
        sock.shutdown()
        assert sock.join(5.0)


# --- Hypothesis profiles (issue 15). This block is the same in every tests/conftest.py of the
# repository (tests/test_hypothesis_profiles.py compares them), so a package's tests load them when
# it is installed and tested alone too. The top README's "Testing" section says what they do.
def pytest_configure(config: pytest.Config) -> None:
    """Register the Hypothesis profiles ``ci`` (derandomized, no example database, no
    deadline) and ``dev`` (new examples every run, failures saved in ``.hypothesis/``), then
    load ``--hypothesis-profile``'s, else ``ci`` where ``CI=true``, else the one named by
    ``HYPOTHESIS_PROFILE``, else ``dev``."""
    import os

    from hypothesis import HealthCheck, settings

    slow = [HealthCheck.too_slow]
    settings.register_profile(
        "ci",
        derandomize=True,
        database=None,
        print_blob=True,
        deadline=None,
        suppress_health_check=slow,
    )
    settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=slow)
    chosen = config.getoption("--hypothesis-profile", None)
    if not chosen and os.environ.get("CI", "").lower() in ("true", "1"):
        chosen = "ci"
    settings.load_profile(chosen or os.environ.get("HYPOTHESIS_PROFILE") or "dev")


# --- end of the Hypothesis profiles
