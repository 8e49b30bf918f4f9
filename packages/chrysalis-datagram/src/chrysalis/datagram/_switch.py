"""``DatagramSwitch``: local demultiplexing plus PID forwarding over one physical carrier (3.4).

Why: one process often hosts several QUIC endpoints (the node itself, link-local protocols,
application endpoints) and also forwards datagrams for the subtree below it, yet it owns one
UDP port. The switch owns that carrier. Every datagram received on it is delivered to the local
binding registered for its destination PID if there is one (local bindings win over routes),
and is otherwise forwarded, byte-identical, through the ``Router``. Bindings are themselves
``DatagramSocket``\\ s, so QUIC endpoints run on them exactly as on a raw carrier.

Runtime neutrality. The reference implementation spawns a receive task. Here the switch is
driven from outside: ``pump()`` drains the carrier without blocking (``try_recv`` into 32
preallocated 65,535-byte buffers) and dispatches what it got. The buffers are private
anonymous mappings (``_socket.mapped_buffers``), not ``bytearray`` objects: the kernel faults
a page in when a datagram first lands in it, so a switch that forwards little (every node has
one) does not zero 2 MiB at its start (512 page faults; issue 22). Any runtime can drive it by
waiting on the carrier's readiness (``readiness_fds()`` / ``add_recv_waker``) and calling
``pump()``; ``start_thread()`` (or ``DatagramSwitch.spawn``) does exactly that on a daemon
thread with ``poll`` (not ``select``: descriptors above 1,023 must work). ``pump`` stops after
a batch that did not fill the buffers (nothing more was ready), so the driver goes back to its
readiness wait without another empty receive. Bindings deliver and forward in the *sender's*
thread: a send through a binding is one synchronous, non-blocking dispatch.

Cost per forwarded datagram. A forwarder in Python is bound by per-datagram work, so the
receive side does as little as possible per datagram: on a UDP carrier (Linux) one
``recvmmsg`` system call fills up to 32 of the switch's buffers (``_mmsg.RecvRing``, owned by
the switch, created by the carrier) and the lengths, GRO segment sizes and sources are read
from the kernel's headers: no ``DatagramRecvMeta`` and no address object per datagram (a
source ``DatagramAddr`` is looked up only for local delivery). Other carriers, or a carrier
with a split GRO remainder or a deferred error pending, go through ``try_recv``. Routes are
looked up once per regrouped batch by the raw 16 PID bytes (a ``dict`` of ``bytes`` keys),
and a batch leaves as one segmented send (one GSO ``sendmsg`` on UDP).

Batching on the forward path. Consecutive received datagrams that go to the same non-local
target with the same length, source and ECN (a GSO burst that arrived as separate datagrams) are
regrouped into one segmented transmit and forwarded with one ``forward_transmit`` call, so the
egress carrier can send them as one batch again (short-header datagrams only: long headers are
handshake packets, not worth batching). Received aggregates (``stride < length``) are
dispatched whole; local delivery queues an aggregate as one item that keeps its stride.

Bounds. Each binding's receive queue holds at most ``queue_capacity`` items (an item is one
datagram or one aggregate of at most ``DATAGRAM_BATCH_SIZE`` datagrams) and, unless it is empty,
admits an item only while fewer than ``queue_bytes`` bytes are queued (default 8 MiB, so at most
``queue_bytes`` plus one item of up to 32 x 65,535 bytes); a full queue drops with
``LOCAL_QUEUE_FULL``. The receive buffers are fixed. Send wakers parked on a binding form a
set of at most 1,024; when it is full, every parked waker is called (a spurious wake: each
waiting sender retries and parks again) and the set starts over, so any number of senders may
wait and none is lost. Each binding also remembers the wakers of its own waiting sends (to wake
them on its shutdown), pruning fired ones as that table grows.

Lifecycle. ``shutdown()`` shuts down every binding and the carrier; ``join()`` waits for the
pump thread and joins the carrier. A receive error on the carrier shuts the switch down (the
error is kept in ``error``), except the two errors that concern one datagram the carrier has
already consumed (``InvalidDataError``: longer than the 65,535-byte buffers;
``AddressNotAvailableError``: a Unix datagram from an unnamed socket): such a datagram is
counted as ``MALFORMED`` and the pump goes on, so no local process can stop the switch with one
datagram. Shutting a binding down unregisters exactly its own registration, so its PIDs can be
bound again, and wakes every waker it holds, its own parked send wakers included.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Final, final

from chrysalis.core import SWITCH_SCHEME, DatagramAddr, Pid
from chrysalis.datagram._mmsg import RecvRing
from chrysalis.datagram._route import (
    _LINK_LOCAL_KEY,
    DropReason,
    Route,
    Router,
    _segment_keys,
    _target_key,
)
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    AddressInUseError,
    AddressNotAvailableError,
    Buffer,
    DatagramError,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InvalidDataError,
    ReceiveBuffer,
    SocketClosedError,
    Waker,
    _Once,
    _park_waker,
    _remember_waker,
    mapped_buffers,
)
from chrysalis.datagram._udp import UdpSocket

__all__ = [
    "DEFAULT_BINDING_BYTES",
    "DEFAULT_BINDING_CAPACITY",
    "MAX_BINDING_BYTES",
    "MAX_BINDING_CAPACITY",
    "BindingStatistics",
    "DatagramSwitch",
    "DestinationMismatchError",
    "SwitchSocket",
    "SwitchStatistics",
]

DEFAULT_BINDING_CAPACITY: Final = 1024
"""Receive-queue capacity (items) of a binding unless ``queue_capacity`` says otherwise."""

MAX_BINDING_CAPACITY: Final = 1 << 20
"""Largest accepted ``queue_capacity``."""

DEFAULT_BINDING_BYTES: Final = 8 << 20
"""Receive-queue byte bound of a binding unless ``queue_bytes`` says otherwise."""

MAX_BINDING_BYTES: Final = 1 << 40
"""Largest accepted ``queue_bytes``."""

_THREAD_BATCHES: Final = 8
HELD_DATAGRAMS: Final = 128
"""Forwarded datagrams a switch holds while their egress queue is full (a Unix datagram
socket queues only ``net.unix.max_dgram_qlen`` datagrams, 10 by default); each target's in
arrival order. While the hold is full the switch receives nothing (back-pressure)."""
HELD_PER_DESTINATION: Final = 64
"""Of those, the most held for one destination PID: one stalled destination (a stopped
process whose socket still exists) cannot fill the whole hold."""
HELD_SECONDS: Final = 0.05
"""The longest a forwarded datagram is held before it is dropped (``EGRESS_QUEUE_FULL``).
A destination whose held datagram was dropped so is *stalled* (a stopped process, most
likely): while it goes on refusing, less than ``HELD_SECONDS`` after its last refusal, what
it refuses is dropped at once instead of held, so several stalled destinations cannot keep
the hold full (and the switch from receiving) for the others. Once it accepts a forwarded
datagram, or after a pause in its refusals, it is held for again."""
_STALLED_KEYS: Final = 1024
"""The most stalled destinations remembered (the one refused longest ago is forgotten first:
held for again)."""
_HELD_RETRY_MS: Final = 1
"""The pump thread's poll timeout while it holds datagrams: the retry pace (an unconnected
Unix datagram socket gets no wake-up when a full destination queue drains)."""
_SWITCH_IDS = itertools.count(1)

# Delivery outcomes of SwitchSocket._deliver.
_DELIVERED: Final = 0
_FULL: Final = 1
_CLOSED: Final = 2

# _dispatch_uniform returns the accepted count (> 0) or a negative drop code.
_REASONS: Final = tuple(DropReason)
_CODES: Final = {reason: -1 - index for index, reason in enumerate(_REASONS)}
_MALFORMED: Final = DropReason.MALFORMED
_LOCAL_QUEUE_FULL: Final = DropReason.LOCAL_QUEUE_FULL
_EGRESS_QUEUE_FULL: Final = DropReason.EGRESS_QUEUE_FULL
_LOCAL_FULL_CODE: Final = _CODES[_LOCAL_QUEUE_FULL]
_EGRESS_FULL_CODE: Final = _CODES[_EGRESS_QUEUE_FULL]
_QUEUE_FULL_CODES: Final = frozenset((_LOCAL_FULL_CODE, _EGRESS_FULL_CODE))
_QUEUE_FULL: Final = frozenset((_LOCAL_QUEUE_FULL, _EGRESS_QUEUE_FULL))

_Item = tuple[bytes, DatagramAddr, int, int | None]  # data, source, stride, ecn
_Payload = bytes | bytearray | memoryview
# Receive errors that concern one datagram the carrier has already consumed.
_PER_DATAGRAM_ERRORS: Final = (InvalidDataError, AddressNotAvailableError)


class DestinationMismatchError(DatagramError, ValueError):
    """A plain binding sent to a ``switch://`` address whose PID is not the destination PID in
    every datagram's connection ID (spec: ``InvalidInput``)."""

    default_errno = errno.EINVAL
    default_message = "datagram CID target does not match the switch destination address"


@final
@dataclass(frozen=True, slots=True)
class BindingStatistics:
    """A snapshot of one binding: ``queued`` items waiting (of ``capacity``), datagrams
    ``delivered`` into its queue and datagrams ``refused`` because the queue was full (each
    refusal is counted, also when the sender retries the datagram later), and
    ``queued_bytes`` of the ``byte_capacity`` bound."""

    queued: int
    capacity: int
    delivered: int
    refused: int
    queued_bytes: int
    byte_capacity: int


@final
@dataclass(frozen=True, slots=True)
class SwitchStatistics:
    """A snapshot of a switch.

    ``received``: datagrams taken from the carrier; ``delivered``: datagrams queued to local
    bindings (from the carrier or from other bindings); ``dropped``: datagrams the switch itself
    dropped, per reason (``MALFORMED`` and ``LOCAL_QUEUE_FULL``); drops decided by the router
    are counted in ``Router.statistics()``. As in the router, counts follow the results: a
    dispatch that returns a drop counts every datagram it covers, a partial acceptance counts
    only the accepted ones (a sender that retries after a queue-full result is counted again);
    ``forward_errors``: received datagrams whose forwarding raised a carrier error (they are
    dropped); ``bindings``: live bindings.
    """

    switch_id: int
    bindings: int
    received: int
    delivered: int
    dropped: Mapping[DropReason, int]
    forward_errors: int


def _check_capacity(queue_capacity: object) -> int:
    if (
        not isinstance(queue_capacity, int)
        or isinstance(queue_capacity, bool)
        or not 1 <= queue_capacity <= MAX_BINDING_CAPACITY
    ):
        raise ValueError(
            f"queue_capacity must be an int in 1..{MAX_BINDING_CAPACITY}, got {queue_capacity!r}"
        )
    return queue_capacity


def _check_bytes(queue_bytes: object) -> int:
    if (
        not isinstance(queue_bytes, int)
        or isinstance(queue_bytes, bool)
        or not 1 <= queue_bytes <= MAX_BINDING_BYTES
    ):
        raise ValueError(
            f"queue_bytes must be an int in 1..{MAX_BINDING_BYTES}, got {queue_bytes!r}"
        )
    return queue_bytes


class SwitchSocket(DatagramSocket):
    """One binding of a ``DatagramSwitch``: a ``DatagramSocket`` for one or more PIDs.

    Created by ``DatagramSwitch.bind``, ``bind_routed`` and ``bind_routed_many``; its
    ``local_addr`` is ``switch://(switch id, first PID)``.

    Sending. A *plain* binding sends datagrams for a ``switch://`` destination of its own
    switch to that PID (every datagram's CID target must equal the address's PID, else
    ``DestinationMismatchError``; another switch id is ``HostUnreachableError``) and passes
    every other destination straight to the egress carrier. A *routed* binding ignores the
    supplied destination and dispatches by CID (local binding first, else the router), except
    datagrams for the link-local PID, which go to the supplied destination on the egress
    carrier. Dispatched sends return the number of datagrams consumed: drops count as consumed,
    except a full local or egress queue, which returns 0 (would block); ``add_send_waker`` then
    waits on exactly that queue. At most ``DATAGRAM_BATCH_SIZE`` datagrams are consumed per
    dispatched call.

    Any number of senders may wait: ``add_send_waker`` parks every waker (bounded, see the
    module docstring), and the binding's own ``shutdown`` wakes all of its waiting senders too,
    wherever they wait.

    Receiving. Items queue up to the binding's capacity (items and bytes); ``try_recv`` copies
    queued items (an aggregate keeps its stride; one that does not fit a buffer is split at a
    stride boundary) and ``try_recv_from`` returns one datagram at a time. There is no
    descriptor (``fileno()`` is ``None``): the receive waker is called when an item is queued.
    """

    def __init__(
        self,
        switch: DatagramSwitch,
        pids: tuple[Pid, ...],
        routed: bool,
        queue_capacity: int,
        binding_id: int,
        queue_bytes: int = DEFAULT_BINDING_BYTES,
    ) -> None:
        self._switch = switch
        self._pids = pids
        self._keys = tuple(pid.raw for pid in pids)
        self._routed = routed
        self._capacity = queue_capacity
        self._byte_capacity = queue_bytes
        self._queued_bytes = 0
        self._binding_id = binding_id
        self._local_addr = DatagramAddr.switch(switch.switch_id, pids[0])
        self._qlock = threading.Lock()
        self._queue: deque[_Item] = deque()
        self._closed = False
        self._shut = threading.Event()
        self._recv_waker: Waker | None = None
        # Wakers of senders waiting for room in this binding's queue (a bounded ordered set).
        self._send_waiters: dict[Waker, None] = {}
        # Wakers of this binding's own waiting sends, wherever they wait (waker -> its
        # once-wrapper), so that its shutdown wakes them all.
        self._own_wakers: dict[Waker, _Once] = {}
        self._delivered = 0
        self._refused = 0
        # What the last would-block send waited on: a local binding or an egress destination.
        self._blocked: SwitchSocket | DatagramAddr | None = None

    # -- identity ---------------------------------------------------------------------------

    @property
    def local_addr(self) -> DatagramAddr:
        """``switch://(switch id, first bound PID)``."""
        return self._local_addr

    @property
    def pids(self) -> tuple[Pid, ...]:
        """The PIDs this binding receives for, in registration order."""
        return self._pids

    @property
    def routed(self) -> bool:
        """Whether outbound datagrams are routed by their CID (``bind_routed``)."""
        return self._routed

    @property
    def binding_id(self) -> int:
        """The switch-local id of this registration (from 1)."""
        return self._binding_id

    @property
    def queue_capacity(self) -> int:
        """Receive-queue capacity in items."""
        return self._capacity

    @property
    def queue_bytes(self) -> int:
        """Receive-queue byte bound (an empty queue admits one item of any size)."""
        return self._byte_capacity

    @property
    def switch(self) -> DatagramSwitch:
        """The switch this binding belongs to."""
        return self._switch

    def statistics(self) -> BindingStatistics:
        """An immutable snapshot of the binding's queue and counters."""
        with self._qlock:
            return BindingStatistics(
                len(self._queue),
                self._capacity,
                self._delivered,
                self._refused,
                self._queued_bytes,
                self._byte_capacity,
            )

    def __repr__(self) -> str:
        kind = "routed" if self._routed else "plain"
        state = " shut down" if self._closed else ""
        return f"<SwitchSocket {kind} {self._local_addr}{state}>"

    # -- sending ----------------------------------------------------------------------------

    def try_send_to(self, data: _Payload, destination: DatagramAddr) -> bool:
        """Send one datagram (see the class docstring); ``False`` means would block."""
        return self._send(destination, data, None, None, 1) != 0

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        """Send the leading datagrams of ``transmit``; see the class docstring."""
        return self._send(
            transmit.destination,
            transmit.contents,
            transmit.segment_size,
            transmit.ecn,
            transmit.segment_count,
        )

    def _send(
        self,
        destination: DatagramAddr,
        contents: _Payload,
        size: int | None,
        ecn: int | None,
        count: int,
    ) -> int:
        if self._closed:
            raise SocketClosedError()
        switch = self._switch
        if self._routed:
            first = contents if count == 1 else memoryview(contents)[:size]
            if _target_key(first) == _LINK_LOCAL_KEY:
                return self._send_egress(destination, contents, size, ecn, count)
        elif destination.scheme != SWITCH_SCHEME:
            return self._send_egress(destination, contents, size, ecn, count)
        else:
            opaque = destination.opaque
            if opaque[:8] != switch._id_bytes:
                raise HostUnreachableError(
                    f"{destination} belongs to another switch (this is switch {switch.switch_id})"
                )
            expected = opaque[8:]
            if count == 1:
                mismatch = _target_key(contents) != expected
            else:
                assert size is not None
                view = memoryview(contents)
                mismatch = any(
                    _target_key(view[i : i + size]) != expected for i in range(0, len(view), size)
                )
            if mismatch:
                raise DestinationMismatchError(
                    f"every datagram sent to {destination} must carry its PID in the CID"
                )
        if count > DATAGRAM_BATCH_SIZE:
            assert size is not None
            contents = memoryview(contents)[: DATAGRAM_BATCH_SIZE * size]
            count = DATAGRAM_BATCH_SIZE
        largest = len(contents) if size is None or count == 1 else size
        if largest > MAX_DATAGRAM_SIZE:
            raise DatagramTooLargeError(
                f"datagrams of more than {MAX_DATAGRAM_SIZE} bytes cannot be switched"
            )
        accepted = switch._dispatch_transmit(contents, size, ecn, count, self._local_addr, self)
        return count if accepted < 0 and accepted not in _QUEUE_FULL_CODES else max(accepted, 0)

    def _send_egress(
        self,
        destination: DatagramAddr,
        contents: _Payload,
        size: int | None,
        ecn: int | None,
        count: int,
    ) -> int:
        egress = self._switch._carrier
        if count == 1 and ecn is None:
            accepted = 1 if egress.try_send_to(contents, destination) else 0
        else:
            accepted = egress.try_send_transmit(DatagramTransmit(destination, contents, size, ecn))
        if accepted == 0:
            self._blocked = destination
        return accepted

    # -- receiving --------------------------------------------------------------------------

    def _deliver(self, data: bytes, source: DatagramAddr, stride: int, ecn: int | None) -> int:
        """Queue one item (called by the switch in the sender's or the pump's thread)."""
        count = 1 if stride >= len(data) else -(-len(data) // stride)
        with self._qlock:
            if self._closed:
                return _CLOSED
            queue = self._queue
            # _full_locked(), inlined: this runs once per delivered datagram.
            if len(queue) >= self._capacity or (
                queue and self._queued_bytes >= self._byte_capacity
            ):
                self._refused += count
                return _FULL
            queue.append((data, source, stride, ecn))
            self._queued_bytes += len(data)
            self._delivered += count
            waker = self._recv_waker
            self._recv_waker = None
        if waker is not None:
            waker()
        return _DELIVERED

    def _full_locked(self) -> bool:
        """Whether the queue admits no further item (called with ``_qlock`` held)."""
        queue = self._queue
        return len(queue) >= self._capacity or (
            bool(queue) and self._queued_bytes >= self._byte_capacity
        )

    def try_recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """Copy queued items into a prefix of ``buffers`` (see ``DatagramSocket.try_recv``).

        An aggregate larger than its buffer is split after the largest whole number of strides
        that fits; an item whose first datagram does not fit raises ``InvalidDataError`` (the
        item is consumed) unless other buffers were already filled in this call.
        """
        limit = min(len(buffers), DATAGRAM_BATCH_SIZE)
        filled = 0
        error: InvalidDataError | None = None
        with self._qlock:
            if self._closed:
                raise SocketClosedError()
            queue = self._queue
            freed = False
            while filled < limit and queue:
                data, source, stride, ecn = queue[0]
                buffer = buffers[filled]
                length = len(data)
                room = len(buffer)
                if length > room:
                    fit = (room // stride) * stride if stride < length else 0
                    if fit == 0:
                        if filled:
                            break
                        queue.popleft()
                        self._queued_bytes -= length
                        freed = True
                        error = InvalidDataError(
                            f"datagram of {min(stride, length)} bytes exceeds the "
                            f"{room}-byte buffer"
                        )
                        break
                    queue[0] = (data[fit:], source, stride, ecn)
                    data = data[:fit]
                    length = fit
                else:
                    queue.popleft()
                self._queued_bytes -= length
                freed = True
                buffer[:length] = data
                metas.append(DatagramRecvMeta(source, length, min(stride, length), ecn))
                filled += 1
            waiters = self._take_send_waiters() if freed else None
        if waiters:
            for waker in waiters:
                waker()
        if error is not None:
            raise error
        return filled

    def try_recv_from(self) -> tuple[bytes, DatagramAddr] | None:
        """One queued datagram and its source, or ``None``; aggregates are split in order."""
        with self._qlock:
            if self._closed:
                raise SocketClosedError()
            queue = self._queue
            if not queue:
                return None
            data, source, stride, ecn = queue[0]
            if stride < len(data):
                queue[0] = (data[stride:], source, stride, ecn)
                data = data[:stride]
            else:
                queue.popleft()
            self._queued_bytes -= len(data)
            waiters = self._take_send_waiters()
        if waiters:
            for waker in waiters:
                waker()
        return data, source

    def _take_send_waiters(self) -> list[Waker] | None:
        # Called with _qlock held after bytes left the queue: wake every waiting sender.
        if not self._send_waiters:
            return None
        waiters = list(self._send_waiters)
        self._send_waiters.clear()
        return waiters

    # -- readiness --------------------------------------------------------------------------

    def fileno(self) -> int | None:
        """Always ``None``: bindings have no kernel descriptor; use the wakers."""
        return None

    def send_readiness_fd(self, destination: DatagramAddr) -> int | None:
        """The egress carrier's descriptor when the last would-block send waited on the egress
        carrier, else ``None`` (a full local queue is signalled through ``add_send_waker``)."""
        blocked = self._blocked
        if isinstance(blocked, SwitchSocket):
            return None
        return self._switch._carrier.send_readiness_fd(destination if blocked is None else blocked)

    def add_recv_waker(self, waker: Waker) -> None:
        """Keep ``waker`` (one-shot, latest only); called when an item is queued or at
        shutdown, or at once if an item is already queued or the binding is shut down."""
        with self._qlock:
            if not self._closed and not self._queue:
                self._recv_waker = waker
                return
        waker()

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        """Wake ``waker`` once the send that last returned 0 may be retried: when the full
        local binding dequeues (or shuts down), or when the egress carrier may accept for the
        destination it would have used (the supplied ``destination`` if nothing blocked), or
        when this binding shuts down. Every registered waker is kept (bounded, see the module
        docstring), so several senders may wait at once."""
        wrapped = self._own_send_waker(waker)
        if wrapped is None:
            waker()
            return
        blocked = self._blocked
        if isinstance(blocked, SwitchSocket):
            blocked._add_send_waiter(wrapped)
            return
        self._switch._carrier.add_send_waker(destination if blocked is None else blocked, wrapped)

    def _own_send_waker(self, waker: Waker) -> _Once | None:
        """Record ``waker`` as one of this binding's waiting sends, wrapped to run once; ``None``
        if the binding is shut down. A waker registered again while still waiting is reused."""
        with self._qlock:
            if self._closed:
                return None
            wrapped, evicted = _remember_waker(self._own_wakers, waker)
        for stale in evicted:
            stale()
        return wrapped

    def _add_send_waiter(self, waker: Waker) -> None:
        with self._qlock:
            full = not self._closed and self._full_locked()
            flushed = _park_waker(self._send_waiters, waker) if full else None
        if flushed:
            for parked in flushed:
                parked()
        elif not full:
            waker()

    # -- limits -----------------------------------------------------------------------------

    @property
    def max_transmit_segments(self) -> int:
        """The egress carrier's value for routed bindings, 1 for plain ones."""
        return self._switch._carrier.max_transmit_segments if self._routed else 1

    @property
    def max_receive_segments(self) -> int:
        """``DATAGRAM_BATCH_SIZE``: queued aggregates keep up to that many datagrams."""
        return DATAGRAM_BATCH_SIZE

    @property
    def may_fragment(self) -> bool:
        """The egress carrier's value."""
        return self._switch._carrier.may_fragment

    # -- lifecycle --------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Unregister this binding (its PIDs can be bound again), drop what is queued and wake
        every waiter; afterwards every operation raises ``SocketClosedError``."""
        with self._qlock:
            if self._closed:
                return
            self._closed = True
            self._queue.clear()
            self._queued_bytes = 0
            wakers: list[Waker] = [*self._send_waiters, *self._own_wakers.values()]
            self._send_waiters.clear()
            self._own_wakers.clear()
            if self._recv_waker is not None:
                wakers.append(self._recv_waker)
                self._recv_waker = None
        self._shut.set()
        self._switch._unregister(self)
        for waker in wakers:
            waker()

    @property
    def is_shutdown(self) -> bool:
        """Whether the binding is shut down (by itself or with its switch)."""
        return self._closed

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the binding is shut down (it owns no other resource)."""
        return self._shut.wait(timeout)


class DatagramSwitch:
    """Local demultiplexing and PID forwarding over one carrier (spec 3.4).

    ``DatagramSwitch(carrier, router)`` takes ownership of ``carrier`` (the egress for
    forwarded datagrams); nothing is received until ``pump()`` is called or ``start_thread()``
    runs the pump loop (``spawn`` does both). Switch ids come from a process-wide counter
    starting at 1.
    """

    def __init__(self, carrier: DatagramSocket, router: Router) -> None:
        if not isinstance(carrier, DatagramSocket):
            raise TypeError(f"carrier must be a DatagramSocket, not {type(carrier).__name__}")
        if not isinstance(router, Router):
            raise TypeError(f"router must be a Router, not {type(router).__name__}")
        self._id = next(_SWITCH_IDS)
        self._id_bytes = self._id.to_bytes(8, "big")
        self._carrier = carrier
        self._router = router
        self._lock = threading.Lock()
        self._bindings: dict[bytes, SwitchSocket] = {}
        self._binding_ids = itertools.count(1)
        self._closed = False
        self._shut = threading.Event()
        self._error: BaseException | None = None
        # Receive side (used by one pump at a time).
        self._pump_lock = threading.Lock()
        self._pump_owner: int | None = None  # the thread inside pump(), if any
        # A UDP carrier fills the switch's buffers with one recvmmsg per batch (_mmsg.py);
        # other carriers (or a platform without recvmmsg) through try_recv.
        ring = carrier._new_recv_ring() if isinstance(carrier, UdpSocket) else None
        self._ring = ring
        self._ring_carrier: tuple[UdpSocket, RecvRing] | None = None
        if ring is not None:
            assert isinstance(carrier, UdpSocket)
            self._ring_carrier = (carrier, ring)
            self._buffers = ring.buffers
            self._views = ring.views
        else:
            self._buffers = mapped_buffers(DATAGRAM_BATCH_SIZE, MAX_DATAGRAM_SIZE)
            self._views = [memoryview(buffer) for buffer in self._buffers]
        self._metas: list[DatagramRecvMeta] = []
        self._received = 0
        # Forwarded datagrams waiting for room in their egress queue (datagram, target key,
        # deadline), in arrival order; used by the pump only (under _pump_lock).
        self._held: deque[tuple[bytes, bytes, float]] = deque()
        self._held_keys: dict[bytes, int] = {}  # datagrams held per target key
        # Stalled target keys (a held datagram expired): the time of their last refusal.
        self._stalled: dict[bytes, float] = {}
        # Counters of slow paths.
        self._stats_lock = threading.Lock()
        self._drops: dict[DropReason, int] = dict.fromkeys(DropReason, 0)
        self._forward_errors = 0
        self._retired_delivered = 0
        # Pump thread.
        self._thread: threading.Thread | None = None
        self._wake_lock = threading.Lock()
        self._wake_pair: tuple[socket.socket, socket.socket] | None = None
        self._released = False

    @classmethod
    def spawn(
        cls, carrier: DatagramSocket, router: Router, *, name: str | None = None
    ) -> DatagramSwitch:
        """Build a switch and start its pump thread (the spec's ``spawn``)."""
        switch = cls(carrier, router)
        switch.start_thread(name=name)
        return switch

    # -- accessors --------------------------------------------------------------------------

    @property
    def switch_id(self) -> int:
        """This switch's process-wide id (from 1)."""
        return self._id

    @property
    def carrier(self) -> DatagramSocket:
        """The carrier the switch receives from and forwards on."""
        return self._carrier

    @property
    def router(self) -> Router:
        """The router used for non-local datagrams."""
        return self._router

    @property
    def is_shutdown(self) -> bool:
        """Whether ``shutdown`` has happened."""
        return self._closed

    @property
    def error(self) -> BaseException | None:
        """The receive (or pump-thread) error that shut the switch down, if any."""
        return self._error

    def statistics(self) -> SwitchStatistics:
        """An immutable snapshot of the switch's counters."""
        with self._lock:
            bindings = set(self._bindings.values())
            retired = self._retired_delivered
        delivered = retired + sum(binding._delivered for binding in bindings)
        with self._stats_lock:
            drops = dict(self._drops)
            errors = self._forward_errors
        return SwitchStatistics(
            self._id,
            len(bindings),
            self._received,
            delivered,
            MappingProxyType(drops),
            errors,
        )

    def __repr__(self) -> str:
        state = " shut down" if self._closed else ""
        return f"<DatagramSwitch {self._id} on {self._carrier.local_addr}{state}>"

    # -- bindings ---------------------------------------------------------------------------

    def bind(
        self,
        pid: Pid,
        queue_capacity: int = DEFAULT_BINDING_CAPACITY,
        *,
        queue_bytes: int = DEFAULT_BINDING_BYTES,
    ) -> SwitchSocket:
        """A plain local binding for ``pid``; ``AddressInUseError`` if ``pid`` is bound.

        ``queue_capacity`` bounds its receive queue in items, ``queue_bytes`` in bytes (see the
        module docstring); ``ValueError`` when either is out of range."""
        return self._register((pid,), False, queue_capacity, queue_bytes)

    def bind_routed(
        self,
        pid: Pid,
        queue_capacity: int = DEFAULT_BINDING_CAPACITY,
        *,
        queue_bytes: int = DEFAULT_BINDING_BYTES,
    ) -> SwitchSocket:
        """A routed binding for ``pid``: outbound datagrams are routed by their CID."""
        return self._register((pid,), True, queue_capacity, queue_bytes)

    def bind_routed_many(
        self,
        pids: Iterable[Pid],
        queue_capacity: int = DEFAULT_BINDING_CAPACITY,
        *,
        queue_bytes: int = DEFAULT_BINDING_BYTES,
    ) -> SwitchSocket:
        """One routed binding receiving for every PID in ``pids`` (for example a node's own
        PID and the link-local PID). All-or-nothing: ``AddressInUseError`` if any PID is
        bound or listed twice; ``ValueError`` for an empty list."""
        return self._register(tuple(pids), True, queue_capacity, queue_bytes)

    def _register(
        self, pids: tuple[Pid, ...], routed: bool, queue_capacity: int, queue_bytes: int
    ) -> SwitchSocket:
        capacity = _check_capacity(queue_capacity)
        byte_capacity = _check_bytes(queue_bytes)
        if not pids:
            raise ValueError("a binding needs at least one PID")
        for pid in pids:
            if not isinstance(pid, Pid):
                raise TypeError(f"expected a Pid, not {type(pid).__name__}")
        keys = [pid.raw for pid in pids]
        if len(set(keys)) != len(keys):
            raise AddressInUseError("the PID list contains duplicates")
        with self._lock:
            if self._closed:
                raise SocketClosedError("the datagram switch is shut down")
            bindings = self._bindings
            for pid, key in zip(pids, keys, strict=True):
                holder = bindings.get(key)
                if holder is not None and not holder._closed:
                    raise AddressInUseError(f"PID {pid} is already bound on switch {self._id}")
            binding = SwitchSocket(
                self, pids, routed, capacity, next(self._binding_ids), byte_capacity
            )
            for key in keys:
                bindings[key] = binding
        return binding

    def _unregister(self, binding: SwitchSocket) -> None:
        with self._lock:
            bindings = self._bindings
            removed = False
            for key in binding._keys:
                holder = bindings.get(key)
                if holder is not None and holder._binding_id == binding._binding_id:
                    del bindings[key]
                    removed = True
            if removed:
                self._retired_delivered += binding._delivered

    # -- dispatch ---------------------------------------------------------------------------

    def _drop(self, reason: DropReason, count: int) -> None:
        with self._stats_lock:
            self._drops[reason] += count

    def _dispatch_transmit(
        self,
        contents: _Payload,
        size: int | None,
        ecn: int | None,
        count: int,
        source: DatagramAddr,
        sender: SwitchSocket | None,
        backing: ReceiveBuffer | None = None,
    ) -> int:
        """Dispatch ``count`` datagrams (local binding first, else the router).

        Returns the accepted count (> 0) or a negative code of the ``DropReason`` that ended
        the dispatch with nothing accepted (``_CODES``). ``backing``: see ``_segment_keys``.
        """
        if count == 1:
            key = _target_key(contents)
            if key is None:
                self._drop(_MALFORMED, 1)
                return _CODES[_MALFORMED]
            return self._dispatch_uniform(contents, len(contents), ecn, 1, key, source, sender)
        assert size is not None
        view = memoryview(contents)
        first = _target_key(view[:size])
        if first is None:
            self._drop(_MALFORMED, count)
            return _CODES[_MALFORMED]
        keys = _segment_keys(contents, size, first, backing)
        if keys is None:
            return self._dispatch_uniform(view, size, ecn, count, first, source, sender)
        return self._dispatch_mixed(view, size, keys, ecn, source, sender)

    def _dispatch_mixed(
        self,
        view: memoryview,
        size: int,
        keys: list[bytes | None],
        ecn: int | None,
        source: DatagramAddr,
        sender: SwitchSocket | None,
    ) -> int:
        """Dispatch datagrams with different targets one by one (spec 3.2 mixed rules).

        Outcomes are counted from the result, like the router's mixed walk: a queue-full stop
        after progress returns the accepted prefix and counts nothing for the rest (the caller
        retries it); any other drop is returned at once and covers the rest of the transmit.
        """
        count = len(keys)
        router = self._router
        egress = self._carrier
        bindings = self._bindings
        accepted = 0
        forwarded = 0
        reason: DropReason | None = None
        try:
            for index, key in enumerate(keys):
                if key is None:
                    reason = _MALFORMED
                    break
                segment = view[index * size : (index + 1) * size]
                binding = bindings.get(key)
                if binding is not None:
                    outcome = binding._deliver(bytes(segment), source, len(segment), ecn)
                    if outcome == _DELIVERED:
                        accepted += 1
                        continue
                    if outcome == _FULL:
                        reason = _LOCAL_QUEUE_FULL
                        if sender is not None:
                            sender._blocked = binding
                        break
                    self._unregister(binding)
                try:
                    reason = router._send_one(egress, segment, key)
                except OSError:
                    if accepted == 0:
                        raise
                    return accepted
                if reason is None:
                    accepted += 1
                    forwarded += 1
                    continue
                if reason is _EGRESS_QUEUE_FULL and sender is not None:
                    self._block_on_route(sender, key)
                break
        finally:
            if forwarded:
                router._add_counts(forwarded, None)
        if reason is None:
            return accepted
        if reason in _QUEUE_FULL and accepted:
            return accepted
        dropped = count - accepted
        if reason is _MALFORMED or reason is _LOCAL_QUEUE_FULL:
            self._drop(reason, dropped)
        else:
            router._add_counts(0, {reason: dropped})
        return _CODES[reason] if accepted == 0 else count

    def _block_on_route(self, sender: SwitchSocket, key: bytes) -> None:
        route = self._router._resolve(key)
        sender._blocked = route.destination if isinstance(route, Route) else None

    def _dispatch_uniform(
        self,
        contents: _Payload,
        stride: int,
        ecn: int | None,
        count: int,
        key: bytes,
        source: DatagramAddr,
        sender: SwitchSocket | None,
    ) -> int:
        binding = self._bindings.get(key)
        if binding is not None:
            outcome = binding._deliver(bytes(contents), source, stride, ecn)
            if outcome == _DELIVERED:
                return count
            if outcome == _FULL:
                self._drop(_LOCAL_QUEUE_FULL, count)
                if sender is not None:
                    sender._blocked = binding
                return _LOCAL_FULL_CODE
            self._unregister(binding)
        router = self._router
        if count == 1 and ecn is None:
            reason = router._forward_key(self._carrier, contents, key)
            if reason is None:
                return 1
        else:
            reason, _, accepted = router._forward_uniform(
                self._carrier, contents, stride if count > 1 else None, ecn, count, key
            )
            if reason is None:
                return accepted
        if reason is _EGRESS_QUEUE_FULL and sender is not None:
            self._block_on_route(sender, key)
        return _CODES[reason]

    # -- receive side -----------------------------------------------------------------------

    def pump(self, max_batches: int = 1) -> int:
        """Receive and dispatch up to ``max_batches`` carrier batches without blocking.

        Returns the number of datagrams received (0: nothing was ready). The pump stops early
        after a batch that did not fill every receive buffer (the carrier had nothing more
        ready), so a driver may wait for readiness as soon as ``pump`` returns. Only one
        thread may pump at a time (``RuntimeError`` otherwise). A receive error shuts the
        switch down and is re-raised, except ``InvalidDataError`` and
        ``AddressNotAvailableError``: they concern one datagram that the carrier has already
        consumed, which is counted as received and dropped as ``MALFORMED``, and the pump goes
        on. After shutdown ``pump`` raises ``SocketClosedError``. Forwarding errors of the
        egress carrier drop the datagrams concerned and are counted.
        """
        return self._pump(max_batches)[0]

    def _pump(self, max_batches: int) -> tuple[int, bool]:
        """``pump``, also saying whether the last batch was full (more may be ready)."""
        if not self._pump_lock.acquire(blocking=False):
            raise RuntimeError("the datagram switch is already being pumped by another thread")
        self._pump_owner = threading.get_ident()
        try:
            if self._closed:
                raise SocketClosedError("the datagram switch is shut down")
            carrier = self._carrier
            ring_carrier = self._ring_carrier
            buffers = self._buffers
            slots = len(buffers)
            metas = self._metas
            total = 0
            full = False
            if self._held and len(self._flush_held()) >= HELD_DATAGRAMS:
                # Back-pressure: what arrives stays in the carrier's kernel queue, where
                # senders on this host see it full (would block) instead of losing it here.
                return 0, False
            for _ in range(max_batches):
                try:
                    filled = -1
                    if ring_carrier is not None:
                        filled = ring_carrier[0]._recv_into_ring(ring_carrier[1])
                    from_ring = filled >= 0
                    if not from_ring:
                        metas.clear()
                        filled = carrier.try_recv(buffers, metas)
                except _PER_DATAGRAM_ERRORS:
                    total += 1
                    self._drop(_MALFORMED, 1)
                    full = True
                    continue
                except OSError as exc:
                    if not self._closed and not isinstance(exc, SocketClosedError):
                        self._error = exc
                    self.shutdown()
                    raise
                if filled:
                    if from_ring:
                        total += self._dispatch_ring(filled)
                    else:
                        total += self._dispatch_metas(filled)
                full = filled == slots
                if not full:
                    break
            self._received += total
            return total, full
        finally:
            self._pump_owner = None
            self._pump_lock.release()

    def _dispatch_metas(self, filled: int) -> int:
        """Dispatch the ``filled`` buffers a carrier's ``try_recv`` described in ``_metas``."""
        metas = self._metas[:filled]
        sources = [meta.source for meta in metas]
        return self._dispatch_batch(
            filled,
            [meta.length for meta in metas],
            [meta.stride for meta in metas],
            [meta.ecn for meta in metas],
            sources,
            sources.__getitem__,
        )

    def _dispatch_ring(self, filled: int) -> int:
        """Dispatch the ``filled`` slots of the carrier's receive ring (``recvmmsg``)."""
        ring = self._ring
        assert ring is not None
        return self._dispatch_batch(
            filled, ring.lengths, ring.strides, None, ring.source_keys, ring.source
        )

    def _dispatch_batch(
        self,
        filled: int,
        lengths: list[int],
        strides: list[int],
        ecns: list[int | None] | None,
        senders: Sequence[object],
        source_of: Callable[[int], DatagramAddr],
    ) -> int:
        """Dispatch the first ``filled`` receive buffers; return the number of datagrams.

        Buffer ``i`` holds ``lengths[i]`` bytes (``-1``: a datagram the carrier lost for want
        of room, counted as ``MALFORMED``) in datagrams of ``strides[i]`` bytes, with ECN
        ``ecns[i]`` (``None``: none reported); ``senders[i]`` compares equal for buffers from
        the same source and ``source_of(i)`` is that source's address (looked up only for
        local delivery and aggregates: forwarding does not need it).

        The per-datagram hot path: single datagrams are routed with the router's uncounted
        ``_send_one`` and the outcomes are added to the router's counters once per batch.
        Consecutive short-header datagrams of the same length, source, ECN and target are
        regrouped into one segmented transmit (one GSO send on a UDP egress).
        """
        views = self._views
        buffers = self._buffers
        bindings = self._bindings
        held_keys = self._held_keys
        stalled = self._stalled
        send_one = self._router._send_one
        egress = self._carrier
        received = 0
        forwarded = 0
        drops: dict[DropReason, int] = {}
        i = 0
        try:
            while i < filled:
                length = lengths[i]
                received += 1
                if length < 0:
                    self._drop(_MALFORMED, 1)
                    i += 1
                    continue
                view = views[i][:length]
                stride = strides[i]
                ecn = None if ecns is None else ecns[i]
                if 0 < stride < length:
                    count = -(-length // stride)
                    received += count - 1
                    self._forward_received(view, stride, ecn, count, source_of(i), buffers[i])
                    i += 1
                    continue
                key = _target_key(view)
                if key is None:
                    self._drop(_MALFORMED, 1)
                    i += 1
                    continue
                binding = bindings.get(key)
                if binding is not None:
                    outcome = binding._deliver(bytes(view), source_of(i), length, ecn)
                    if outcome == _FULL:
                        self._drop(_LOCAL_QUEUE_FULL, 1)
                    if outcome != _CLOSED:
                        i += 1
                        continue
                    self._unregister(binding)
                # Regroup following datagrams of the same shape and target into one transmit.
                # Only short-header datagrams are regrouped (long headers are handshake
                # packets); their key is bytes 1..17, compared in place.
                sender = senders[i]
                j = i + 1
                end = min(filled, i + DATAGRAM_BATCH_SIZE) if view[0] < 0x80 else j
                if j < end:
                    # Same shape (length, stride, ECN, source) up to where? Usually up to the
                    # end (a burst from one peer): compare whole columns at C speed first.
                    run = end - i
                    if not (
                        lengths[i:end].count(length) == run
                        and (strides is lengths or strides[i:end].count(length) == run)
                        and (ecns is None or ecns[i:end].count(ecn) == run)
                        and senders[i:end].count(sender) == run
                    ):
                        shape_end = j
                        while shape_end < end:
                            other = senders[shape_end]
                            if (
                                lengths[shape_end] != length
                                or strides[shape_end] != length
                                or (ecns is not None and ecns[shape_end] != ecn)
                                or (other is not sender and other != sender)
                            ):
                                break
                            shape_end += 1
                        end = shape_end
                while j < end:
                    buffer = buffers[j]
                    if buffer[0] >= 0x80 or buffer[1:17] != key:
                        break
                    j += 1
                if j > i + 1:
                    received += j - i - 1
                    if ecn is None and key in held_keys:  # behind its held ones, in order
                        for k in range(i, j):
                            reason = self._hold(bytes(views[k][:length]), key, refused=False)
                            if reason is not None:
                                drops[reason] = drops.get(reason, 0) + 1
                        i = j
                        continue
                    group = b"".join([views[k][:length] for k in range(i, j)])
                    self._forward_group(group, length, ecn, j - i, key)
                    i = j
                    continue
                i += 1
                if ecn is None and key in held_keys:  # behind its held ones, in order
                    reason = self._hold(bytes(view), key, refused=False)
                    if reason is not None:
                        drops[reason] = drops.get(reason, 0) + 1
                    continue
                try:
                    if ecn is None:
                        reason = send_one(egress, view, key)
                    else:
                        reason = self._router._forward_uniform(egress, view, None, ecn, 1, key)[0]
                        continue  # counted by the router
                except OSError:
                    self._count_error(1)
                    continue
                if reason is None:
                    forwarded += 1
                    if stalled:
                        stalled.pop(key, None)  # it accepts again: held for again
                elif reason is _EGRESS_QUEUE_FULL and self._hold(bytes(view), key) is None:
                    pass  # held: retried by the next pump
                else:
                    drops[reason] = drops.get(reason, 0) + 1
        finally:
            if forwarded or drops:
                self._router._add_counts(forwarded, drops)
        return received

    def _hold(self, datagram: bytes, key: bytes, *, refused: bool = True) -> DropReason | None:
        """Hold a forwarded datagram whose egress queue is full (``None``), or say it must
        be dropped (``EGRESS_QUEUE_FULL``: the hold, or its destination's share, is full, or
        the destination is stalled). ``refused``: its egress refused it just now (not: it
        queues behind its destination's held ones unsent). Pump only."""
        held = self._held
        keys = self._held_keys
        count = keys.get(key, 0)
        if len(held) >= HELD_DATAGRAMS or count >= HELD_PER_DESTINATION:
            return _EGRESS_QUEUE_FULL
        now = time.monotonic()
        stalled = self._stalled
        if stalled:
            since = stalled.get(key)
            if since is not None:
                if now - since < HELD_SECONDS:
                    if refused:  # still refusing: still stalled (and the newest), not held
                        del stalled[key]
                        stalled[key] = now
                    return _EGRESS_QUEUE_FULL
                del stalled[key]
        held.append((datagram, key, now + HELD_SECONDS))
        keys[key] = count + 1
        return None

    def _flush_held(self) -> deque[tuple[bytes, bytes, float]]:
        """Send held datagrams, oldest first; a destination whose queue is still full keeps
        its datagrams (in order) while the others' go on; drop those held past their
        deadline. Pump only; returns the held queue."""
        router = self._router
        send_one = router._send_one
        egress = self._carrier
        keys = self._held_keys
        now = time.monotonic()
        forwarded = 0
        drops: dict[DropReason, int] = {}
        blocked: set[bytes] = set()
        kept: deque[tuple[bytes, bytes, float]] = deque()
        held, self._held = self._held, kept
        try:
            while held:
                item = held.popleft()
                datagram, key, deadline = item
                if key in blocked:
                    kept.append(item)
                    continue
                try:
                    reason = send_one(egress, datagram, key)
                except OSError:
                    reason = None
                    self._count_error(1)
                else:
                    if reason is _EGRESS_QUEUE_FULL:
                        if now < deadline:
                            blocked.add(key)
                            kept.append(item)
                            continue
                        self._stall(key, now)
                    if reason is None:
                        forwarded += 1
                        if self._stalled:
                            self._stalled.pop(key, None)  # it accepts again
                    else:
                        drops[reason] = drops.get(reason, 0) + 1
                left = keys[key] - 1
                if left:
                    keys[key] = left
                else:
                    del keys[key]
        finally:
            kept.extend(held)  # only after an unexpected error: nothing is lost from the count
            if forwarded or drops:
                router._add_counts(forwarded, drops)
        return kept

    def _stall(self, key: bytes, now: float) -> None:
        """Remember ``key`` as stalled (a held datagram of it expired). Pump only."""
        stalled = self._stalled
        if stalled.pop(key, None) is None and len(stalled) >= _STALLED_KEYS:
            del stalled[next(iter(stalled))]  # the one refused longest ago
        stalled[key] = now

    def _forward_group(
        self, contents: bytes, size: int, ecn: int | None, count: int, key: bytes
    ) -> None:
        """Forward a regrouped batch, retrying the unsent suffix after partial progress."""
        router = self._router
        egress = self._carrier
        offset = 0
        view = memoryview(contents)
        while count:
            try:
                reason, _, accepted = router._forward_uniform(
                    egress,
                    view[offset:] if offset else contents,
                    size,
                    ecn,
                    count,
                    key,
                    count_full=ecn is not None,
                )
            except OSError:
                self._count_error(count)
                return
            if reason is _EGRESS_QUEUE_FULL and ecn is None:
                # Hold the unsent rest in order; what does not fit is dropped and counted.
                dropped = 0
                for start in range(offset, offset + count * size, size):
                    if self._hold(bytes(view[start : start + size]), key) is not None:
                        dropped += 1
                if dropped:
                    router._add_counts(0, {_EGRESS_QUEUE_FULL: dropped})
                return
            if reason is not None:
                return
            if accepted and self._stalled:
                self._stalled.pop(key, None)  # it accepts again
            count -= accepted
            offset += accepted * size

    def _forward_received(
        self,
        view: memoryview,
        stride: int,
        ecn: int | None,
        count: int,
        source: DatagramAddr,
        backing: ReceiveBuffer,
    ) -> None:
        """Dispatch a received aggregate, retrying the unsent suffix after partial progress."""
        offset = 0
        while count:
            try:
                result = self._dispatch_transmit(
                    view[offset:] if offset else view,
                    stride,
                    ecn,
                    count,
                    source,
                    None,
                    None if offset else backing,
                )
            except OSError:
                self._count_error(count)
                return
            if result <= 0 or result >= count:
                return
            count -= result
            offset += result * stride

    def _count_error(self, count: int) -> None:
        with self._stats_lock:
            self._forward_errors += count

    # -- pump thread ------------------------------------------------------------------------

    def start_thread(self, *, name: str | None = None) -> None:
        """Run the pump loop on a daemon thread until the switch shuts down.

        The thread waits with ``poll`` on the carrier's ``readiness_fds()`` and on an
        internal wake-up socket that the carrier's receive waker and ``shutdown`` write to.
        ``RuntimeError`` if a thread was already started; ``SocketClosedError`` after shutdown.
        """
        with self._lock:
            if self._closed:
                raise SocketClosedError("the datagram switch is shut down")
            if self._thread is not None:
                raise RuntimeError("the pump thread is already running")
            reader, writer = socket.socketpair()
            reader.setblocking(False)
            writer.setblocking(False)
            with self._wake_lock:
                self._wake_pair = (reader, writer)
            thread = threading.Thread(
                target=self._run, name=name or f"datagram-switch-{self._id}", daemon=True
            )
            self._thread = thread
        thread.start()

    def _wake(self) -> None:
        with self._wake_lock:
            pair = self._wake_pair
            if pair is None:
                return
            with contextlib.suppress(OSError):  # full (a wake-up is pending) or closed
                pair[1].send(b"\0")

    def _run(self) -> None:
        pair = self._wake_pair
        assert pair is not None
        reader = pair[0]
        carrier = self._carrier
        try:
            # poll, not select: select fails for descriptors above 1,023.
            poller = select.poll()
            wake_fd = reader.fileno()
            for fd in {wake_fd, *carrier.readiness_fds()}:
                poller.register(fd, select.POLLIN)
            waiter = select.poll()  # the wake-up socket alone: a back-pressure pause
            waiter.register(wake_fd, select.POLLIN)
            while not self.is_shutdown:
                if self._pump(_THREAD_BATCHES)[1]:
                    continue  # the last batch was full: more may be ready
                if len(self._held) >= HELD_DATAGRAMS:
                    # Not receiving (back-pressure): wait for the retry pace or shutdown only,
                    # not for the carrier, whose queue is left full on purpose.
                    if waiter.poll(_HELD_RETRY_MS):
                        with contextlib.suppress(OSError):  # drained
                            while reader.recv(4096):
                                pass
                    continue
                # Called at once if a receive may already succeed or the carrier is shut
                # down; shutdown() also writes to the wake-up socket.
                carrier.add_recv_waker(self._wake)
                # Holding forwarded datagrams: come back to retry them within a millisecond.
                ready = poller.poll(_HELD_RETRY_MS if self._held else None)
                if any(fd == wake_fd for fd, _ in ready):
                    with contextlib.suppress(OSError):  # drained
                        while reader.recv(4096):
                            pass
        except SocketClosedError:
            pass  # the switch or its carrier was shut down
        except BaseException as exc:
            if self._error is None:
                self._error = exc
        finally:
            self.shutdown()

    # -- lifecycle --------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Idempotent, non-blocking: shut down every binding and the carrier and stop the
        pump thread. New binds and pumps then raise ``SocketClosedError``."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            bindings = set(self._bindings.values())
        self._shut.set()
        for binding in bindings:
            binding.shutdown()
        self._carrier.shutdown()
        self._wake()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the switch is shut down, its pump thread has ended and the carrier is
        joined. ``False`` if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._shut.wait(timeout):
            return False
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_remaining(deadline))
            if thread.is_alive():
                return False
        # No pump may still be using the carrier's descriptor when the carrier closes it
        # (unless this thread is the pumping one: a waker called from a pump joined).
        if self._pump_owner != threading.get_ident():
            timeout = _remaining(deadline)
            if not self._pump_lock.acquire(timeout=-1 if timeout is None else timeout):
                return False
            self._pump_lock.release()
        if not self._carrier.join(_remaining(deadline)):
            return False
        if thread is None or thread is not threading.current_thread():
            with self._wake_lock:
                pair, self._wake_pair = self._wake_pair, None
            if pair is not None:
                pair[0].close()
                pair[1].close()
        return True

    def __enter__(self) -> DatagramSwitch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
        self.join()


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())
