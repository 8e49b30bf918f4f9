"""The in-process carrier: datagrams between sockets of one process, through bounded queues.

Why it exists: tests, simulations and co-located components need a carrier with exact,
deterministic semantics and no kernel in the way (spec 2.7). Each :class:`InprocNetwork` is an
isolated address space: endpoints are numbered by ``u64`` ids, and an address is
``inproc://<network id>/<endpoint id>``. Network ids come from a process-global counter starting
at 1, so addresses of different networks never collide.

Semantics (all of them tested):

* ``bind(id)``: :class:`AddressInUseError` if a live endpoint holds the id; a shut-down (or
  garbage-collected) endpoint's id may be bound again. ``bind()`` picks the lowest free id
  from a counter.
* Send: destination on another network or unknown -> :class:`HostUnreachableError`;
  destination shut down (but its socket object still exists) ->
  :class:`ConnectionRefusedDatagramError`; destination queue full -> would block (``False`` /
  ``0``); else the bytes are copied and queued with the sender's address, and the receiver's
  waker is called. A shut-down sender raises :class:`SocketClosedError`.
* Receive: FIFO; each call pops at most ``DATAGRAM_BATCH_SIZE`` datagrams and then wakes every
  sender blocked on *this* endpoint (never senders blocked on another one). A datagram longer
  than the caller's buffer raises :class:`InvalidDataError` and is lost. Buffers are written
  from offset 0, so a caller that wants "append" semantics passes a view of the free tail of
  its buffer.
* ``add_send_waker(destination, w)`` checks the destination's capacity and registers ``w`` on
  the destination's queue under the destination's lock, so no wakeup is lost. Every registered
  waker is kept (any number of senders, several per socket, may wait on one destination) in a
  bounded collection (``_park_waker``: at 1,024 the parked wakers are called early, a spurious
  wake). The sending socket also keeps its own waiting wakers, so that its shutdown wakes them;
  fired ones are pruned from that table as it grows.

Locking: one lock per endpoint guards its queue, its wakers and its closed flag; the network
lock guards only the id map, which is read without it on the send path (a single ``dict.get``,
atomic under the GIL). Wakers always run outside every lock. Sockets have no descriptor:
``fileno()`` is ``None`` and readiness comes only from the wakers. Nothing here imports an I/O
runtime.

Send path cost: each socket caches the endpoints it sends to (destination address -> weak
reference, at most 4,096 entries), so a send is a dict lookup, a weak reference call and one
lock round trip rather than an address decode and a network lookup. A cached endpoint that is
gone or shut down is looked up again, so a dropped destination still becomes unknown and a
rebound id is found; the cache is weak so that it never keeps a dropped endpoint alive.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Final

from chrysalis.core import INPROC_SCHEME, AddressError, DatagramAddr
from chrysalis.datagram._socket import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    AddressInUseError,
    Buffer,
    ConnectionRefusedDatagramError,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    DatagramTransmit,
    HostUnreachableError,
    InvalidDataError,
    SocketClosedError,
    UnsupportedSchemeError,
    Waker,
    _Once,
    _park_waker,
    _remember_waker,
)

__all__ = ["DEFAULT_QUEUE_CAPACITY", "MAX_QUEUE_CAPACITY", "InprocNetwork", "InprocSocket"]

#: Default per-endpoint receive queue bound, in datagrams.
DEFAULT_QUEUE_CAPACITY: Final = 1024
#: Largest accepted ``queue_capacity``.
MAX_QUEUE_CAPACITY: Final = 1 << 20

_U64: Final = 1 << 64
_SCHEMES: Final = (INPROC_SCHEME,)
# Resolved destinations cached per socket (the table is emptied when it reaches this size).
_TARGET_CACHE_LIMIT: Final = 4096
_new_object: Final = object.__new__

_network_ids = itertools.count(1)
_networks: weakref.WeakValueDictionary[int, InprocNetwork] = weakref.WeakValueDictionary()


class _Endpoint:
    """Receive-side state of one bound endpoint; the network refers to it weakly."""

    __slots__ = ("__weakref__", "blocked", "capacity", "closed", "lock", "queue", "recv_waker")

    def __init__(self, capacity: int) -> None:
        self.lock = threading.Lock()
        self.queue: deque[tuple[DatagramAddr, bytes]] = deque()
        self.capacity = capacity
        self.closed = False
        self.recv_waker: Waker | None = None
        # Wakers of senders blocked on this endpoint (a bounded ordered set, _park_waker).
        self.blocked: dict[Waker, None] = {}


class InprocNetwork:
    """An isolated in-process address space with bounded per-endpoint queues.

    ``queue_capacity`` (1 to :data:`MAX_QUEUE_CAPACITY`) bounds every endpoint's receive queue,
    in datagrams. Thread-safe.
    """

    __slots__ = (
        "__weakref__",
        "_capacity",
        "_endpoints",
        "_lock",
        "_network_id",
        "_next_auto",
        "_prefix",
    )

    def __init__(self, queue_capacity: int = DEFAULT_QUEUE_CAPACITY) -> None:
        if isinstance(queue_capacity, bool) or not isinstance(queue_capacity, int):
            raise TypeError(f"queue_capacity must be an int, not {type(queue_capacity).__name__}")
        if not 1 <= queue_capacity <= MAX_QUEUE_CAPACITY:
            raise ValueError(f"queue_capacity must be in 1..{MAX_QUEUE_CAPACITY}")
        self._network_id = next(_network_ids)
        self._prefix = self._network_id.to_bytes(8, "big")
        self._lock = threading.Lock()
        self._endpoints: dict[int, weakref.ref[_Endpoint]] = {}
        self._next_auto = 1
        self._capacity = queue_capacity
        _networks[self._network_id] = self

    @property
    def network_id(self) -> int:
        """This network's process-unique id (from 1)."""
        return self._network_id

    @property
    def queue_capacity(self) -> int:
        """The per-endpoint receive queue bound, in datagrams."""
        return self._capacity

    @classmethod
    def lookup(cls, network_id: int) -> InprocNetwork | None:
        """The live network with ``network_id``, or ``None``."""
        return _networks.get(network_id)

    def bind(self, endpoint_id: int | None = None) -> InprocSocket:
        """Bind an endpoint; ``None`` picks a free id.

        Raises :class:`AddressInUseError` if a live endpoint holds ``endpoint_id``,
        ``AddressError`` if it is outside ``0 .. 2**64 - 1``, ``TypeError`` for a non-int.
        """
        if endpoint_id is not None:
            if isinstance(endpoint_id, bool) or not isinstance(endpoint_id, int):
                raise TypeError(f"endpoint_id must be an int, not {type(endpoint_id).__name__}")
            if not 0 <= endpoint_id < _U64:
                raise AddressError(f"inproc endpoint id must be in 0..{_U64 - 1}")
        endpoint = _Endpoint(self._capacity)
        network_ref = weakref.ref(self)
        with self._lock:
            if endpoint_id is None:
                endpoint_id = self._allocate_locked()
            elif self._live_locked(endpoint_id):
                raise AddressInUseError(
                    f"inproc endpoint {endpoint_id} is in use on network {self._network_id}"
                )
            ident = endpoint_id

            def forget(ref: weakref.ref[_Endpoint]) -> None:
                network = network_ref()
                if network is not None:
                    network._forget(ident, ref)

            self._endpoints[ident] = weakref.ref(endpoint, forget)
        return InprocSocket(self, ident, endpoint)

    def _live_locked(self, endpoint_id: int) -> bool:
        ref = self._endpoints.get(endpoint_id)
        state = ref() if ref is not None else None
        return state is not None and not state.closed

    def _allocate_locked(self) -> int:
        while True:
            candidate = self._next_auto
            self._next_auto = candidate + 1 if candidate + 1 < _U64 else 1
            if not self._live_locked(candidate):
                return candidate

    def _forget(self, endpoint_id: int, ref: weakref.ref[_Endpoint]) -> None:
        with self._lock:
            if self._endpoints.get(endpoint_id) is ref:
                del self._endpoints[endpoint_id]

    def _resolve(self, destination: DatagramAddr) -> tuple[int, _Endpoint]:
        """Map a destination to (endpoint id, live-or-shut-down endpoint state)."""
        if destination.scheme != INPROC_SCHEME:
            raise UnsupportedSchemeError.for_scheme(destination.scheme, _SCHEMES)
        opaque = destination.opaque
        if opaque[:8] != self._prefix:
            raise HostUnreachableError(f"{destination} is on another inproc network")
        endpoint_id = int.from_bytes(opaque[8:], "big")
        ref = self._endpoints.get(endpoint_id)
        state = ref() if ref is not None else None
        if state is None:
            raise HostUnreachableError(f"no inproc endpoint at {destination}")
        return endpoint_id, state

    def __repr__(self) -> str:
        return f"InprocNetwork(id={self._network_id}, queue_capacity={self._capacity})"


class InprocSocket(DatagramSocket):
    """One bound endpoint of an :class:`InprocNetwork` (build it with
    ``InprocNetwork.bind``). Implements the :class:`DatagramSocket` contract with the
    semantics in the module docstring; shuts itself down when garbage-collected."""

    def __init__(self, network: InprocNetwork, endpoint_id: int, endpoint: _Endpoint) -> None:
        self._network = network
        self._id = endpoint_id
        self._endpoint = endpoint
        self._addr = DatagramAddr.inproc(network.network_id, endpoint_id)
        self._shut = threading.Event()
        self._deferred_error: InvalidDataError | None = None
        # Wakers of this socket's own waiting sends (waker -> its once-wrapper, which is also
        # parked on the destination), so that our own shutdown fires them all. Guarded by
        # our endpoint's lock; fired entries are pruned as the table grows.
        self._send_wakers: dict[Waker, _Once] = {}
        # Destinations this socket has sent to: address -> weak reference to the endpoint
        # state. Weak, so that a cached entry never keeps a dropped endpoint alive (its
        # address must become unknown); an entry whose endpoint is gone or shut down is
        # resolved again through the network, which finds a rebound id.
        self._targets: dict[DatagramAddr, weakref.ref[_Endpoint]] = {}

    # -- identity ------------------------------------------------------------------------------

    @property
    def local_addr(self) -> DatagramAddr:
        """``inproc://<network id>/<endpoint id>``."""
        return self._addr

    @property
    def endpoint_id(self) -> int:
        """This endpoint's id within its network."""
        return self._id

    @property
    def network(self) -> InprocNetwork:
        """The network this endpoint belongs to."""
        return self._network

    # -- sending -------------------------------------------------------------------------------

    def _target(self, destination: DatagramAddr) -> _Endpoint:
        """The endpoint state for ``destination``: from the per-socket cache when it is still
        alive and open, else resolved through the network (and cached)."""
        ref = self._targets.get(destination)
        target = None if ref is None else ref()
        if target is None or target.closed:
            target = self._resolve_target(destination)
        return target

    def _resolve_target(self, destination: DatagramAddr) -> _Endpoint:
        """Resolve through the network (the cache miss); raises what ``_resolve`` raises."""
        _, target = self._network._resolve(destination)
        targets = self._targets
        if len(targets) >= _TARGET_CACHE_LIMIT:
            targets.clear()
        targets[destination] = weakref.ref(target)
        return target

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        """Copy ``data`` into the destination's queue; ``False`` if that queue is full."""
        if self._endpoint.closed:
            raise SocketClosedError()
        # Hot path, inlined _target(): a dict lookup and a weak reference call.
        ref = self._targets.get(destination)
        target = None if ref is None else ref()
        if target is None or target.closed:
            target = self._resolve_target(destination)
        payload = bytes(data)  # no copy for bytes
        if len(payload) > MAX_DATAGRAM_SIZE:
            raise DatagramTooLargeError(
                f"datagram of {len(payload)} bytes exceeds {MAX_DATAGRAM_SIZE}"
            )
        lock = target.lock
        lock.acquire()  # acquire/release: cheaper than a with statement on this path
        try:
            if target.closed:
                raise ConnectionRefusedDatagramError(f"{destination} is shut down")
            queue = target.queue
            if len(queue) >= target.capacity:
                return False
            queue.append((self._addr, payload))
            waker = target.recv_waker
            if waker is not None:
                target.recv_waker = None
        finally:
            lock.release()
        if waker is not None:
            waker()
        return True

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        """Queue the leading segments of ``transmit`` under one lock acquisition (at most
        ``DATAGRAM_BATCH_SIZE`` and at most the free queue space)."""
        count = transmit.segment_count
        if count == 1:
            return 1 if self.try_send_to(transmit.contents, transmit.destination) else 0
        if self._endpoint.closed:
            raise SocketClosedError()
        size = transmit.segment_size
        assert size is not None
        if size > MAX_DATAGRAM_SIZE:
            raise DatagramTooLargeError(f"segment of {size} bytes exceeds {MAX_DATAGRAM_SIZE}")
        target = self._target(transmit.destination)
        contents = bytes(transmit.contents)
        source = self._addr
        with target.lock:
            if target.closed:
                raise ConnectionRefusedDatagramError(f"{transmit.destination} is shut down")
            queue = target.queue
            accepted = min(count, DATAGRAM_BATCH_SIZE, target.capacity - len(queue))
            if accepted <= 0:
                return 0
            for start in range(0, accepted * size, size):
                queue.append((source, contents[start : start + size]))
            waker, target.recv_waker = target.recv_waker, None
        if waker is not None:
            waker()
        return accepted

    # -- receiving -----------------------------------------------------------------------------

    def _take_deferred(self) -> None:
        error = self._deferred_error
        if error is not None:
            self._deferred_error = None
            raise error

    def try_recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """Pop up to ``min(len(buffers), DATAGRAM_BATCH_SIZE)`` datagrams in FIFO order."""
        endpoint = self._endpoint
        if endpoint.closed:
            raise SocketClosedError()
        if self._deferred_error is not None:
            self._take_deferred()
        limit = min(len(buffers), DATAGRAM_BATCH_SIZE)
        filled = 0
        error: InvalidDataError | None = None
        wakers: list[Waker] | None = None
        append = metas.append
        new = _new_object
        lock = endpoint.lock
        lock.acquire()
        try:
            if endpoint.closed:
                raise SocketClosedError()
            queue = endpoint.queue
            popleft = queue.popleft
            while filled < limit and queue:
                source, payload = popleft()
                buffer = buffers[filled]
                size = len(payload)
                if size > len(buffer):
                    error = InvalidDataError(
                        f"datagram of {size} bytes exceeds the {len(buffer)}-byte buffer"
                    )
                    break
                buffer[:size] = payload
                meta = new(DatagramRecvMeta)  # no __init__ call: see DatagramRecvMeta
                meta.source = source
                meta.length = meta.stride = size
                meta.ecn = None
                append(meta)
                filled += 1
            if (filled or error is not None) and endpoint.blocked:
                wakers = list(endpoint.blocked)
                endpoint.blocked.clear()
        finally:
            lock.release()
        if wakers:
            for waker in wakers:
                waker()
        if error is not None:
            if filled == 0:
                raise error
            self._deferred_error = error
        return filled

    def try_recv_from(self) -> tuple[bytes, DatagramAddr] | None:
        """Pop one datagram (no size limit beyond :data:`MAX_DATAGRAM_SIZE`)."""
        endpoint = self._endpoint
        if endpoint.closed:
            raise SocketClosedError()
        self._take_deferred()
        wakers: list[Waker] | None = None
        with endpoint.lock:
            if endpoint.closed:
                raise SocketClosedError()
            if not endpoint.queue:
                return None
            source, payload = endpoint.queue.popleft()
            if endpoint.blocked:
                wakers = list(endpoint.blocked)
                endpoint.blocked.clear()
        if wakers:
            for waker in wakers:
                waker()
        return payload, source

    # -- readiness -----------------------------------------------------------------------------

    def fileno(self) -> int | None:
        """Always ``None``: use the wakers."""
        return None

    def add_recv_waker(self, waker: Waker) -> None:
        """Keep ``waker`` until a datagram arrives or the socket shuts down; call it at once if
        a datagram is already queued or the socket is shut down."""
        endpoint = self._endpoint
        with endpoint.lock:
            if not endpoint.closed and not endpoint.queue:
                endpoint.recv_waker = waker
                return
        waker()

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        """Wake ``waker`` when ``destination``'s queue has room (or either side shuts down).

        Called at once if the destination has room already, is unknown, shut down or not an
        inproc address (so the retried send reports the error). Every waker is kept, so any
        number of senders may wait; a waker registered again while still waiting is kept once.
        """
        if self.is_shutdown:
            waker()
            return
        try:
            _, target = self._network._resolve(destination)
        except (HostUnreachableError, UnsupportedSchemeError):
            waker()
            return
        wrapped = self._own_send_waker(waker)
        if wrapped is None:  # we were shut down meanwhile
            waker()
            return
        with target.lock:
            ready = target.closed or len(target.queue) < target.capacity
            flushed = None if ready else _park_waker(target.blocked, wrapped)
        if ready:
            wrapped()
        elif flushed:
            for parked in flushed:
                parked()

    def _own_send_waker(self, waker: Waker) -> _Once | None:
        """Record ``waker`` as one of our waiting sends, wrapped to run once (the destination
        and our shutdown may both call it); ``None`` if we are shut down. Recording comes
        before parking on the destination, so a shutdown racing with it still wakes it."""
        own = self._endpoint
        with own.lock:
            if own.closed:
                return None
            wrapped, evicted = _remember_waker(self._send_wakers, waker)
        for stale in evicted:
            stale()
        return wrapped

    @property
    def max_transmit_segments(self) -> int:
        """:data:`DATAGRAM_BATCH_SIZE`: segmented sends are queued in one step."""
        return DATAGRAM_BATCH_SIZE

    @property
    def may_fragment(self) -> bool:
        """``False``: datagrams are queued whole."""
        return False

    # -- lifecycle -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Close the endpoint: drop queued datagrams, make the id bindable again, refuse
        further sends to it, and wake the receive waker, blocked senders and our own send
        wakers."""
        endpoint = self._endpoint
        with endpoint.lock:
            if endpoint.closed:
                return
            endpoint.closed = True
            endpoint.queue.clear()
            wakers: list[Waker] = list(endpoint.blocked)
            endpoint.blocked.clear()
            if endpoint.recv_waker is not None:
                wakers.append(endpoint.recv_waker)
                endpoint.recv_waker = None
            # Our waiting sends: fired here; their entries on the destinations are no-ops now
            # and go when those destinations next dequeue.
            wakers.extend(self._send_wakers.values())
            self._send_wakers.clear()
        self._shut.set()
        for waker in wakers:
            waker()

    @property
    def is_shutdown(self) -> bool:
        """Whether ``shutdown`` has been called."""
        return self._endpoint.closed

    def join(self, timeout: float | None = None) -> bool:
        """Wait for ``shutdown`` (the carrier owns no other resources)."""
        return self._shut.wait(timeout)

    def __del__(self) -> None:
        # Spec: sockets shut themselves down when dropped (wakes senders blocked on us).
        with contextlib.suppress(Exception):
            self.shutdown()

    def __repr__(self) -> str:
        state = "shut down" if self._endpoint.closed else "open"
        return f"InprocSocket({self._addr}, {state})"
