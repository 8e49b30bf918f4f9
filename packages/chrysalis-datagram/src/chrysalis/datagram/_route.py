"""PID routing: ``RouteGate``, ``Route``, ``Router`` and the forwarding decision (spec 3.1, 3.2).

Why this shape: a forwarder moves QUIC datagrams it cannot decrypt. The only thing it may look
at is the destination PID in the first packet's connection ID (``target_pid``), and the only
thing it decides is *where to send the unmodified bytes next*. So routing is a table lookup:

1. no readable target -> ``Dropped(MALFORMED)``;
2. the link-local PID (all zeros) -> ``Dropped(UNBOUND_LINK_LOCAL)``: link-local traffic is
   meant for an adjacent endpoint and must never be routed;
3. the exact PID route, else the default route (the parent link), else ``Dropped(NO_ROUTE)``.
   There is no longest-prefix match (PIDs are hashes, prefixes carry no topology) and no TTL:
   loop freedom comes from the tree topology alone (routes point down, the default points up,
   the root has none);
4. a route whose gate is closed -> ``Dropped(INACTIVE)`` (the exact route wins even when its
   gate is closed: a fenced child is not reached through the parent);
5. one *non-blocking* send of the same buffer object to the route's destination; a would-block
   result -> ``Dropped(EGRESS_QUEUE_FULL)``. Every other error propagates to the caller.

Every drop is deliberate: QUIC loss recovery repairs it, and dropping is how local congestion is
signalled. Nothing here blocks, sleeps or reads a clock.

Fencing. All routes derived from one link share one ``RouteGate``. Each send under a gated
route holds a permit for the duration of the non-blocking ``try_send`` call. ``close()`` flips
the gate to inactive and then waits until every admitted send has returned, so when it returns
no route of that link can begin a send and none is in progress: the link is fenced in O(1),
whatever the size of its subtree. Route removal is only index cleanup; to fence, close the gate
first.

Concurrency. ``Router`` is shared between the receive loop of a switch and every sending
binding. Reads must be cheap, so the hot path takes no lock: the table is a ``dict`` keyed by
the raw 16 PID bytes, and writers mutate it under a writer lock while readers call only the
atomic ``dict.get`` (a single operation under CPython's interpreter lock; readers never iterate
the live dict). This keeps ``insert`` O(1) even at a million routes, where a copy-on-write swap
would be O(n) per insert. The default route is a single attribute, replaced atomically.
"""

from __future__ import annotations

import enum
import mmap
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType, TracebackType
from typing import Final, final

from chrysalis.core import PID_LEN, DatagramAddr, Pid
from chrysalis.datagram._socket import DatagramSocket, DatagramTransmit

__all__ = [
    "DEFAULT_MAX_ROUTES",
    "DropReason",
    "Dropped",
    "ForwardResult",
    "Forwarded",
    "GatePermit",
    "GateStatistics",
    "Route",
    "RouteGate",
    "Router",
    "RouterStatistics",
    "RoutingTableFullError",
]

DEFAULT_MAX_ROUTES: Final = 1_000_000
"""Default bound on the number of exact PID routes a ``Router`` holds."""

_LINK_LOCAL_KEY: Final = bytes(PID_LEN)
_LONG_HEADER_BIT: Final = 0x80
_CID_LEN: Final = 20
_LONG_DCID_END: Final = 6 + PID_LEN
_SHORT_DCID_END: Final = 1 + PID_LEN


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    """``data`` as a flat sequence of unsigned bytes (as ``chrysalis.core``'s private helper of
    ``target_pid``): the view itself, a byte-format cast, or a copy of strided data."""
    view = memoryview(data)
    if view.ndim == 1 and view.format == "B":
        return view
    if view.c_contiguous:
        try:
            return view.cast("B")
        except (TypeError, ValueError):
            pass
    return view.tobytes()


def _target_key(datagram: bytes | bytearray | memoryview) -> bytes | None:
    """The raw destination-PID bytes of a datagram, or ``None``.

    Exactly the rule of ``chrysalis.core.target_pid`` (spec 1.5), but returning the 16 bytes
    instead of a ``Pid``: the routing tables are keyed by raw bytes so that the per-datagram
    path hashes a ``bytes`` object (C speed) instead of calling ``Pid.__hash__``. The test suite
    checks that both functions agree on arbitrary input. As there, a memoryview of another
    item format or of several dimensions is read as its bytes (the common ``bytes`` and 1-D
    ``'B'`` view cases pay only a type check for this).
    """
    if type(datagram) is memoryview:
        if datagram.ndim != 1 or datagram.format != "B":
            datagram = _as_bytes(datagram)
    elif type(datagram) is not bytes and type(datagram) is not bytearray:
        datagram = _as_bytes(datagram)
    n = len(datagram)
    if n == 0:
        return None
    if datagram[0] & _LONG_HEADER_BIT:
        if n < _LONG_DCID_END or datagram[5] != _CID_LEN:
            return None
        return bytes(datagram[6:_LONG_DCID_END])
    if n < _SHORT_DCID_END:
        return None
    return bytes(datagram[1:_SHORT_DCID_END])


def _segment_keys(
    contents: bytes | bytearray | memoryview,
    size: int,
    first: bytes,
    backing: bytes | bytearray | mmap.mmap | None = None,
) -> list[bytes | None] | None:
    """The target keys of every ``size``-byte segment of ``contents``, or ``None`` when every
    segment targets ``first`` (the key of segment 0).

    The uniform case is the common one (a GSO/GRO batch of one connection) and is checked in
    place for short headers by comparing 16-byte slices instead of reading each segment's key.
    ``backing``, when given, is a bytes-like object whose first ``len(contents)`` bytes are
    ``contents`` (the switch passes its receive buffer, a ``bytearray`` or an ``mmap``, saving
    the copy a memoryview would need).
    """
    length = len(contents)
    if backing is not None:
        data: bytes | bytearray | mmap.mmap = backing
    elif isinstance(contents, memoryview):
        data = contents.tobytes()
    else:
        data = contents
    tail = length % size
    # Segment 0 carries a short-header key, so size >= 17 and only a short last segment
    # could lack one.
    if data[0] < _LONG_HEADER_BIT and (tail == 0 or tail >= _SHORT_DCID_END):
        for offset in range(size, length, size):
            if (
                data[offset] >= _LONG_HEADER_BIT
                or data[offset + 1 : offset + _SHORT_DCID_END] != first
            ):
                break
        else:
            return None
    view = memoryview(contents)
    keys = [_target_key(view[i : i + size]) for i in range(0, length, size)]
    return None if keys.count(first) == len(keys) else keys


# --------------------------------------------------------------------------------------------
# Results


class DropReason(enum.Enum):
    """Why a datagram was dropped. Every drop is deliberate; QUIC loss recovery repairs it."""

    MALFORMED = "malformed"
    """No destination PID could be read (empty, too short, long header with a DCID length
    other than 20)."""
    NO_ROUTE = "no route"
    """Neither an exact route nor a default route exists for the target."""
    UNBOUND_LINK_LOCAL = "unbound link-local"
    """The target is the link-local PID, which is never routed."""
    INACTIVE = "inactive"
    """The route's gate is closed (the link was fenced)."""
    LOCAL_QUEUE_FULL = "local queue full"
    """A local switch binding's receive queue is full."""
    EGRESS_QUEUE_FULL = "egress queue full"
    """The egress carrier would block (local congestion signalled by dropping)."""


@final
@dataclass(frozen=True, slots=True)
class Forwarded:
    """``count`` leading datagrams addressed to ``target`` were handed to the egress carrier."""

    target: Pid
    count: int = 1


@final
@dataclass(frozen=True, slots=True)
class Dropped:
    """The datagram (or transmit) was dropped for ``reason``.

    ``target`` is the destination PID when one could be read (``None`` for ``MALFORMED``).
    """

    reason: DropReason
    target: Pid | None = None


ForwardResult = Forwarded | Dropped
"""What ``Router.forward`` and ``Router.forward_transmit`` return."""


class RoutingTableFullError(Exception):
    """``Router.insert`` of a new PID when the table already holds ``max_routes`` routes."""


# --------------------------------------------------------------------------------------------
# Gates


@final
@dataclass(frozen=True, slots=True)
class GateStatistics:
    """A snapshot of a ``RouteGate``: whether it admits sends, how many admitted sends are in
    progress, and how many sends it has admitted and refused in its lifetime."""

    active: bool
    in_flight: int
    admitted: int
    refused: int


@final
class RouteGate:
    """The terminal fence shared by every route derived from one link (spec 3.1).

    A gate starts active. ``acquire()`` admits a send (returns a ``GatePermit``) while the gate
    is active and returns ``None`` once it is closed. ``close()`` makes the gate inactive for
    good (there is no reopen) and then blocks until every admitted send has released its
    permit. Permits are held only around non-blocking sends, so ``close`` waits at most for
    sends already inside a ``try_send`` call. Never call ``close`` while holding a permit of the
    same gate in the same thread: it would wait for itself.
    """

    __slots__ = (
        "__weakref__",
        "_active",
        "_admitted",
        "_drained",
        "_in_flight",
        "_lock",
        "_refused",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._active = True
        self._in_flight = 0
        self._admitted = 0
        self._refused = 0

    @property
    def is_active(self) -> bool:
        """Whether the gate still admits new sends."""
        return self._active

    @property
    def in_flight(self) -> int:
        """Admitted sends whose permit has not been released yet."""
        return self._in_flight

    def acquire(self) -> GatePermit | None:
        """Admit one send: a permit while the gate is active, ``None`` once it is closed.

        The permit must be released (``release()`` or leaving its ``with`` block) as soon as
        the send call returns.
        """
        if self._enter():
            return GatePermit(self)
        return None

    def close(self, timeout: float | None = None) -> bool:
        """Stop admitting sends, then wait until every admitted send has released its permit.

        Returns ``True`` only for the call that changed the gate from active to inactive;
        later calls return ``False`` (after waiting for the drain just the same). When
        ``timeout`` seconds pass before the drain, raises ``TimeoutError``; the gate stays
        closed and ``wait_drained`` (or another ``close``) can wait again.
        """
        with self._lock:
            changed = self._active
            self._active = False
            if not self._drained.wait_for(self._is_drained, timeout):
                raise TimeoutError(
                    f"route gate still has {self._in_flight} admitted send(s) after {timeout} s"
                )
        return changed

    def wait_drained(self, timeout: float | None = None) -> bool:
        """Wait until no admitted send is in progress; ``False`` if ``timeout`` passed first.

        On an active gate this only observes a moment without sends in flight.
        """
        with self._lock:
            return self._drained.wait_for(self._is_drained, timeout)

    def statistics(self) -> GateStatistics:
        """An immutable snapshot of the gate's state and counters."""
        with self._lock:
            return GateStatistics(self._active, self._in_flight, self._admitted, self._refused)

    def __repr__(self) -> str:
        state = "active" if self._active else "closed"
        return f"<RouteGate {state} in_flight={self._in_flight} at {id(self):#x}>"

    # -- internal fast path (no permit object) ----------------------------------------------

    def _is_drained(self) -> bool:
        return self._in_flight == 0

    def _enter(self) -> bool:
        with self._lock:
            if not self._active:
                self._refused += 1
                return False
            self._in_flight += 1
            self._admitted += 1
            return True

    def _exit(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._drained.notify_all()


@final
class GatePermit:
    """Admission of one send through a ``RouteGate``; release it when the send returns.

    Releasing is idempotent and thread-safe: only the first ``release`` (or ``with`` exit)
    decrements the gate's in-flight count.
    """

    __slots__ = ("_gate",)

    def __init__(self, gate: RouteGate) -> None:
        self._gate: RouteGate | None = gate

    @property
    def released(self) -> bool:
        """Whether the permit has been released."""
        return self._gate is None

    def release(self) -> None:
        """Give the admission back (the first call only)."""
        gate = self._gate
        if gate is None:
            return
        with gate._lock:
            if self._gate is None:
                return
            self._gate = None
            gate._in_flight -= 1
            if gate._in_flight == 0:
                gate._drained.notify_all()

    def __enter__(self) -> GatePermit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


# --------------------------------------------------------------------------------------------
# Routes


@final
@dataclass(frozen=True, slots=True)
class Route:
    """Where to send datagrams for a PID: the next-hop ``destination`` on the egress carrier,
    optionally fenced by a ``gate`` shared with the other routes of the same link.

    Two routes are equal when they have equal destinations and the *same* gate object.
    """

    destination: DatagramAddr
    gate: RouteGate | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.destination, DatagramAddr):
            raise TypeError(
                f"Route destination must be a DatagramAddr, not {type(self.destination).__name__}"
            )
        if self.gate is not None and not isinstance(self.gate, RouteGate):
            raise TypeError(f"Route gate must be a RouteGate, not {type(self.gate).__name__}")

    @classmethod
    def permanent(cls, destination: DatagramAddr) -> Route:
        """A route that is never fenced."""
        return cls(destination)

    @classmethod
    def gated(cls, destination: DatagramAddr, gate: RouteGate) -> Route:
        """A route fenced by ``gate``."""
        return cls(destination, gate)

    @property
    def is_active(self) -> bool:
        """False once the route's gate is closed (a permanent route is always active)."""
        return self.gate is None or self.gate.is_active


# --------------------------------------------------------------------------------------------
# Router


@final
@dataclass(frozen=True, slots=True)
class RouterStatistics:
    """A snapshot of a ``Router``.

    ``routes``: exact PID routes held; ``has_default``: whether a default route is set;
    ``forwarded``: datagrams handed to an egress carrier; ``dropped``: datagrams dropped, per
    reason (every ``DropReason`` is present). A dropped segmented transmit counts each of its
    datagrams.
    """

    routes: int
    has_default: bool
    forwarded: int
    dropped: Mapping[DropReason, int]

    @property
    def dropped_total(self) -> int:
        """All dropped datagrams, whatever the reason."""
        return sum(self.dropped.values())


_MALFORMED: Final = DropReason.MALFORMED
_NO_ROUTE: Final = DropReason.NO_ROUTE
_UNBOUND_LINK_LOCAL: Final = DropReason.UNBOUND_LINK_LOCAL
_INACTIVE: Final = DropReason.INACTIVE
_EGRESS_QUEUE_FULL: Final = DropReason.EGRESS_QUEUE_FULL


def _check_pid(pid: object) -> bytes:
    if pid.__class__ is not Pid:
        raise TypeError(f"expected a Pid, not {type(pid).__name__}")
    assert isinstance(pid, Pid)
    return pid.raw


def _check_route(route: object) -> Route:
    if route.__class__ is not Route:
        raise TypeError(f"expected a Route, not {type(route).__name__}")
    assert isinstance(route, Route)
    return route


def _pid_or_none(key: bytes | None) -> Pid | None:
    return None if key is None else Pid(key)


@final
class Router:
    """The PID routing table of one forwarder (spec 3.2): exact routes plus a default route.

    Thread-safe. Table updates take a writer lock; ``forward`` and ``forward_transmit`` read
    the table without locking (see the module docstring). The table holds at most
    ``max_routes`` exact routes; inserting a new PID beyond that raises
    ``RoutingTableFullError`` (replacing an existing PID's route always works).
    """

    __slots__ = (
        "_default",
        "_drops",
        "_forwarded",
        "_lock",
        "_max_routes",
        "_stats_lock",
        "_table",
    )

    def __init__(self, *, max_routes: int = DEFAULT_MAX_ROUTES) -> None:
        if not isinstance(max_routes, int) or isinstance(max_routes, bool) or max_routes < 0:
            raise ValueError(f"max_routes must be a non-negative int, got {max_routes!r}")
        self._max_routes = max_routes
        self._lock = threading.Lock()
        self._table: dict[bytes, Route] = {}
        self._default: Route | None = None
        self._stats_lock = threading.Lock()
        self._forwarded = 0
        self._drops: dict[DropReason, int] = dict.fromkeys(DropReason, 0)

    # -- table ------------------------------------------------------------------------------

    @property
    def max_routes(self) -> int:
        """The bound on exact routes."""
        return self._max_routes

    def insert(self, pid: Pid, route: Route) -> Route | None:
        """Route ``pid`` via ``route``; return the route it replaced, if any.

        ``ValueError`` for the link-local PID (never routed); ``RoutingTableFullError`` when
        ``pid`` is new and the table is full.
        """
        key = _check_pid(pid)
        route = _check_route(route)
        if key == _LINK_LOCAL_KEY:
            raise ValueError("the link-local PID is never routed")
        with self._lock:
            table = self._table
            previous = table.get(key)
            if previous is None and len(table) >= self._max_routes:
                raise RoutingTableFullError(
                    f"routing table is full ({self._max_routes} routes); cannot add {pid}"
                )
            table[key] = route
        return previous

    def remove(self, pid: Pid) -> Route | None:
        """Remove ``pid``'s exact route and return it (``None`` if there was none).

        Removal is index cleanup only; to fence a link close its gate first.
        """
        key = _check_pid(pid)
        with self._lock:
            return self._table.pop(key, None)

    def get(self, pid: Pid) -> Route | None:
        """``pid``'s exact route, or ``None`` (the default route is not consulted)."""
        return self._table.get(_check_pid(pid))

    def lookup(self, pid: Pid) -> Route | None:
        """The route ``forward`` would use for ``pid``: exact, else default; ``None`` for the
        link-local PID or when neither exists."""
        key = _check_pid(pid)
        if key == _LINK_LOCAL_KEY:
            return None
        route = self._table.get(key)
        return self._default if route is None else route

    def set_default(self, route: Route) -> Route | None:
        """Use ``route`` for every PID without an exact route; return the previous default."""
        route = _check_route(route)
        with self._lock:
            previous, self._default = self._default, route
        return previous

    def remove_default(self) -> Route | None:
        """Remove the default route and return it (``None`` if there was none)."""
        with self._lock:
            previous, self._default = self._default, None
        return previous

    @property
    def default_route(self) -> Route | None:
        """The current default route, if any."""
        return self._default

    def routes(self) -> dict[Pid, Route]:
        """A snapshot copy of the exact routes."""
        with self._lock:
            items = list(self._table.items())
        return {Pid(key): route for key, route in items}

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, pid: object) -> bool:
        return isinstance(pid, Pid) and pid.raw in self._table

    def statistics(self) -> RouterStatistics:
        """An immutable snapshot of the table size and the forwarding counters."""
        with self._stats_lock:
            forwarded = self._forwarded
            drops = dict(self._drops)
        return RouterStatistics(
            len(self._table), self._default is not None, forwarded, MappingProxyType(drops)
        )

    # -- forwarding -------------------------------------------------------------------------

    def forward(
        self, egress: DatagramSocket, datagram: bytes | bytearray | memoryview
    ) -> ForwardResult:
        """Forward one datagram on ``egress`` by its destination PID (spec 3.2 ``forward``).

        The very same ``datagram`` object is passed to ``egress.try_send_to``: the bytes are
        neither copied nor modified. Returns ``Forwarded(target, 1)`` or ``Dropped(reason,
        target)``. Errors of the egress carrier other than would-block propagate.
        """
        key = _target_key(datagram)
        if key is None:
            self._count(_MALFORMED, 1)
            return Dropped(_MALFORMED)
        reason = self._forward_key(egress, datagram, key)
        if reason is None:
            return Forwarded(Pid(key), 1)
        return Dropped(reason, Pid(key))

    def forward_transmit(self, egress: DatagramSocket, transmit: DatagramTransmit) -> ForwardResult:
        """Forward a (possibly segmented) transmit by its datagrams' destination PIDs.

        Empty contents or a first datagram without a target -> ``Dropped(MALFORMED)``. When
        every datagram has the same target, the whole batch goes to the route's destination in
        one ``try_send_transmit`` (same contents object, same segment size and ECN):
        ``Forwarded(target, k)`` for ``k`` accepted leading datagrams, or
        ``Dropped(EGRESS_QUEUE_FULL)`` when none was. With mixed targets the datagrams are
        forwarded one by one: the first egress-queue-full stops the walk (the accepted prefix
        is returned as ``Forwarded``, or the drop if nothing was accepted), any other drop is
        returned at once, and an error after partial progress returns the accepted prefix.
        As with ``try_send_transmit``, the caller may retry the unsent suffix.
        """
        reason, key, count = self._forward_segments(
            egress,
            transmit.contents,
            transmit.segment_size,
            transmit.ecn,
            transmit.segment_count,
        )
        if reason is None:
            assert key is not None
            return Forwarded(Pid(key), count)
        return Dropped(reason, _pid_or_none(key))

    # -- internal: result-object-free paths used by the switch ------------------------------

    def _count(self, reason: DropReason, datagrams: int) -> None:
        with self._stats_lock:
            self._drops[reason] += datagrams

    def _count_forwarded(self, datagrams: int) -> None:
        with self._stats_lock:
            self._forwarded += datagrams

    def _resolve(self, key: bytes) -> Route | DropReason:
        if key == _LINK_LOCAL_KEY:
            return _UNBOUND_LINK_LOCAL
        route = self._table.get(key)
        if route is None:
            route = self._default
            if route is None:
                return _NO_ROUTE
        return route

    def _send_one(
        self, egress: DatagramSocket, datagram: bytes | bytearray | memoryview, key: bytes
    ) -> DropReason | None:
        """Route and send one datagram without counting; ``None`` when it was sent.

        The per-datagram hot path: ``_resolve`` is inlined on purpose.
        """
        route = self._table.get(key)
        if route is None:
            if key == _LINK_LOCAL_KEY:
                return _UNBOUND_LINK_LOCAL
            route = self._default
            if route is None:
                return _NO_ROUTE
        gate = route.gate
        if gate is None:
            sent = egress.try_send_to(datagram, route.destination)
        else:
            if not gate._enter():
                return _INACTIVE
            try:
                sent = egress.try_send_to(datagram, route.destination)
            finally:
                gate._exit()
        return None if sent else _EGRESS_QUEUE_FULL

    def _add_counts(self, forwarded: int, drops: dict[DropReason, int] | None) -> None:
        """Add outcomes a caller counted itself (the switch counts a whole batch at once)."""
        with self._stats_lock:
            self._forwarded += forwarded
            if drops:
                totals = self._drops
                for reason, count in drops.items():
                    totals[reason] += count

    def _forward_key(
        self, egress: DatagramSocket, datagram: bytes | bytearray | memoryview, key: bytes
    ) -> DropReason | None:
        """``forward`` for a datagram whose target key is known; counts the outcome."""
        reason = self._send_one(egress, datagram, key)
        with self._stats_lock:
            if reason is None:
                self._forwarded += 1
            else:
                self._drops[reason] += 1
        return reason

    def _forward_segments(
        self,
        egress: DatagramSocket,
        contents: bytes | bytearray | memoryview,
        segment_size: int | None,
        ecn: int | None,
        count: int,
    ) -> tuple[DropReason | None, bytes | None, int]:
        """``forward_transmit`` on the transmit's parts; counts the outcome.

        Returns ``(None, target, accepted)`` or ``(reason, target, 0)`` where ``target`` is the
        key of the datagram the result is about (``None`` for a malformed first datagram).
        """
        if len(contents) == 0:
            self._count(_MALFORMED, 1)
            return _MALFORMED, None, 0
        if count == 1:
            first = _target_key(contents)
            if first is None:
                self._count(_MALFORMED, 1)
                return _MALFORMED, None, 0
            return self._forward_uniform(egress, contents, segment_size, ecn, 1, first)
        assert segment_size is not None
        size = segment_size
        view = memoryview(contents)
        first = _target_key(view[:size])
        if first is None:
            self._count(_MALFORMED, count)
            return _MALFORMED, None, 0
        keys = _segment_keys(view, size, first)
        if keys is None:
            return self._forward_uniform(egress, contents, segment_size, ecn, count, first)
        accepted = 0
        for index, key in enumerate(keys):
            if key is None:
                reason: DropReason | None = _MALFORMED
            else:
                segment = view[index * size : (index + 1) * size]
                try:
                    reason = self._send_one(egress, segment, key)
                except OSError:
                    if accepted == 0:
                        raise
                    self._count_forwarded(accepted)
                    return None, first, accepted
            if reason is None:
                accepted += 1
                continue
            if reason is _EGRESS_QUEUE_FULL and accepted:
                self._count_forwarded(accepted)
                return None, first, accepted
            with self._stats_lock:
                self._forwarded += accepted
                self._drops[reason] += count - accepted
            return reason, key, 0
        self._count_forwarded(accepted)
        return None, first, accepted

    def _forward_uniform(
        self,
        egress: DatagramSocket,
        contents: bytes | bytearray | memoryview,
        segment_size: int | None,
        ecn: int | None,
        count: int,
        key: bytes,
        *,
        count_full: bool = True,
    ) -> tuple[DropReason | None, bytes | None, int]:
        """Send ``count`` datagrams of one target; counts the outcome, except a full egress
        queue with ``count_full=False`` (the switch then holds them and counts later)."""
        route = self._resolve(key)
        if route.__class__ is DropReason:
            assert isinstance(route, DropReason)
            self._count(route, count)
            return route, key, 0
        assert isinstance(route, Route)
        transmit = DatagramTransmit(route.destination, contents, segment_size, ecn)
        gate = route.gate
        if gate is None:
            accepted = egress.try_send_transmit(transmit)
        else:
            if not gate._enter():
                self._count(_INACTIVE, count)
                return _INACTIVE, key, 0
            try:
                accepted = egress.try_send_transmit(transmit)
            finally:
                gate._exit()
        if accepted == 0:
            if count_full:
                self._count(_EGRESS_QUEUE_FULL, count)
            return _EGRESS_QUEUE_FULL, key, 0
        self._count_forwarded(accepted)
        return None, key, accepted
