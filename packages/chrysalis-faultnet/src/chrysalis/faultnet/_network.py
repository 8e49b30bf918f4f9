"""``FaultyNetwork``: an in-process network on which every socket is faulty.

Why: the layers above the carriers test themselves with several endpoints on one in-process
network. Wrapping each endpoint by hand is repetitive and easy to get subtly wrong (two sockets
sharing one seed make correlated decisions), so this helper binds endpoints on an
``InprocNetwork`` (or anything with the same ``bind``), wraps each in a :class:`FaultySocket`
with the network's plan and a seed derived from the plan's seed and the binding's index, and can
partition groups of endpoints from each other. Bind in the same order and a run repeats exactly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Final, Protocol

from chrysalis.core import DatagramAddr
from chrysalis.datagram import DatagramSocket, InprocNetwork
from chrysalis.faultnet._plan import FaultPlan
from chrysalis.faultnet._socket import FaultStatistics, FaultySocket

__all__ = ["MAX_NETWORK_SOCKETS", "BindableNetwork", "FaultyNetwork", "new_inproc_network"]

#: Most sockets one :class:`FaultyNetwork` binds over its lifetime.
MAX_NETWORK_SOCKETS: Final = 4096


class BindableNetwork(Protocol):
    """What :class:`FaultyNetwork` wraps: ``bind(endpoint_id=None)`` returns a new bound socket
    (``chrysalis.datagram.InprocNetwork`` has this shape)."""

    def bind(self, endpoint_id: int | None = None) -> DatagramSocket: ...


def new_inproc_network() -> InprocNetwork:
    """A fresh ``chrysalis.datagram.InprocNetwork`` with its default settings."""
    return InprocNetwork()


class FaultyNetwork:
    """Binds :class:`FaultySocket` endpoints that share one plan on one network.

    ``network`` defaults to a new ``InprocNetwork``. The socket bound ``n``-th (from 0) gets
    ``plan.derive(n)`` unless ``bind`` is given a plan of its own. ``clock`` and
    ``timer_thread`` go to every socket. At most :data:`MAX_NETWORK_SOCKETS` sockets may be
    bound over the network's lifetime (``RuntimeError`` beyond; it is a test tool, make a new one
    per test). As a context manager it shuts down and joins every socket it bound on exit.
    """

    def __init__(
        self,
        plan: FaultPlan | None = None,
        network: BindableNetwork | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        timer_thread: bool = True,
    ) -> None:
        self._plan = plan if plan is not None else FaultPlan()
        if not isinstance(self._plan, FaultPlan):
            raise TypeError(f"FaultyNetwork needs a FaultPlan, not {type(plan).__name__}")
        self._network = network if network is not None else new_inproc_network()
        self._clock = clock
        self._timer_thread = timer_thread
        self._lock = threading.Lock()
        self._sockets: list[FaultySocket] = []

    @property
    def plan(self) -> FaultPlan:
        """The plan every socket's plan is derived from."""
        return self._plan

    @property
    def network(self) -> BindableNetwork:
        """The wrapped network."""
        return self._network

    def bind(
        self, endpoint_id: int | None = None, *, plan: FaultPlan | None = None
    ) -> FaultySocket:
        """Bind an endpoint on the network and wrap it.

        ``plan`` replaces the derived plan for this socket only. Raises what the network's
        ``bind`` raises, and ``RuntimeError`` after :data:`MAX_NETWORK_SOCKETS` bindings.
        """
        if plan is not None and not isinstance(plan, FaultPlan):
            raise TypeError(f"bind() needs a FaultPlan, not {type(plan).__name__}")
        with self._lock:
            index = len(self._sockets)
            if index >= MAX_NETWORK_SOCKETS:
                raise RuntimeError(f"at most {MAX_NETWORK_SOCKETS} sockets per FaultyNetwork")
            inner = self._network.bind(endpoint_id)
            try:
                sock = FaultySocket(
                    inner,
                    plan if plan is not None else self._plan.derive(index),
                    clock=self._clock,
                    timer_thread=self._timer_thread,
                )
            except BaseException:
                inner.shutdown()
                raise
            self._sockets.append(sock)
            return sock

    def sockets(self) -> tuple[FaultySocket, ...]:
        """Every socket this network bound (shut down or not), in binding order."""
        with self._lock:
            return tuple(self._sockets)

    def partition(
        self,
        side_a: Iterable[DatagramAddr | DatagramSocket],
        side_b: Iterable[DatagramAddr | DatagramSocket],
    ) -> None:
        """Cut traffic between every endpoint of ``side_a`` and every endpoint of ``side_b``
        (addresses or sockets), in both directions, on this network's sockets."""
        a = {_addr(x) for x in side_a}
        b = {_addr(x) for x in side_b}
        for sock in self.sockets():
            if sock.is_shutdown:
                continue
            addr = sock.local_addr
            if addr in a:
                sock.partition(*b)
            if addr in b:
                sock.partition(*a)

    def heal(self) -> None:
        """Remove every partition from every socket of this network."""
        for sock in self.sockets():
            sock.heal()

    def statistics(self) -> FaultStatistics:
        """The sum of the statistics of every socket this network bound (shut down or not)."""
        total = FaultStatistics()
        for sock in self.sockets():
            total = total + sock.statistics()
        return total

    def shutdown(self) -> None:
        """Shut down every socket this network bound."""
        for sock in self.sockets():
            sock.shutdown()

    def join(self, timeout: float | None = None) -> bool:
        """Join every socket shut down so far (``False`` if ``timeout`` passed first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = True
        for sock in self.sockets():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ok = sock.join(left) and ok
        return ok

    def __enter__(self) -> FaultyNetwork:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
        self.join()


def _addr(value: DatagramAddr | DatagramSocket) -> DatagramAddr:
    if isinstance(value, DatagramAddr):
        return value
    if isinstance(value, DatagramSocket):
        return value.local_addr
    raise TypeError(f"expected a DatagramAddr or DatagramSocket, not {type(value).__name__}")
