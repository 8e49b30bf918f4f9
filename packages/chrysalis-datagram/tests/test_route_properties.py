"""Property tests: the router's forwarding decision agrees with a small model of spec 3.2, the
raw target extraction agrees with ``chrysalis.core.target_pid``, and RouteGate / the routing
table behave like their models under random operation sequences."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chrysalis.core import ConnectionId, DatagramAddr, Pid, target_pid
from chrysalis.datagram._route import (
    Dropped,
    DropReason,
    Forwarded,
    GatePermit,
    Route,
    RouteGate,
    Router,
    RoutingTableFullError,
    _segment_keys,
    _target_key,
)
from chrysalis.datagram._socket import (
    Buffer,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTransmit,
    Waker,
)

SETTINGS = settings(max_examples=150, deadline=None)

POOL = [Pid(bytes([i]) * 16) for i in range(1, 7)]  # small pool so tables and targets collide
SUPPLIED = DatagramAddr.inproc(7, 7)


class Egress(DatagramSocket):
    """Records sends; accepts at most ``accept`` datagrams per transmit and ``accept``
    single datagrams in total (then it would block)."""

    def __init__(self, accept: int) -> None:
        self.accept = accept
        self.sent: list[tuple[bytes | bytearray | memoryview, DatagramAddr]] = []
        self.transmits: list[DatagramTransmit] = []

    @property
    def local_addr(self) -> DatagramAddr:
        return DatagramAddr.inproc(7, 1)

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        if len(self.sent) >= self.accept:
            return False
        self.sent.append((data, destination))
        return True

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        count = min(transmit.segment_count, self.accept)
        if count:
            self.transmits.append(transmit)
        return count

    def try_recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        return 0

    def fileno(self) -> int | None:
        return None

    def add_recv_waker(self, waker: Waker) -> None:
        pass

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        waker()

    def shutdown(self) -> None:
        pass

    @property
    def is_shutdown(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> bool:
        return True


# --------------------------------------------------------------------------------------------
# target extraction


@SETTINGS
@given(st.binary(max_size=40))
def test_raw_target_key_agrees_with_target_pid_on_arbitrary_bytes(data: bytes) -> None:
    expected = target_pid(data)
    key = _target_key(data)
    assert key == (None if expected is None else expected.raw)
    assert _target_key(memoryview(data)) == key
    assert _target_key(bytearray(data)) == key
    padded = data + bytes(-len(data) % 4)
    words = memoryview(padded).cast("I")  # read as bytes, never as 4-byte items
    assert _target_key(words) == _target_key(padded)


def test_raw_target_key_reads_bytes_of_wide_and_multidimensional_views() -> None:
    datagram = b"\x40" + bytes(ConnectionId.issued(POOL[0], 3)) + b"xyz"  # 24 bytes
    assert _target_key(memoryview(datagram).cast("I")) == POOL[0].raw
    assert _target_key(memoryview(datagram).cast("B", (4, 6))) == POOL[0].raw
    rows = datagram[:12] + bytes(12) + datagram[12:] + bytes(12)
    skipping = memoryview(bytearray(rows)).cast("B", (4, 12))[::2]
    assert _target_key(skipping) == POOL[0].raw


@SETTINGS
@given(
    st.sampled_from(POOL),
    st.integers(1, 2**31 - 1),
    st.booleans(),
    st.integers(0, 255),
    st.binary(max_size=8),
)
def test_raw_target_key_agrees_with_target_pid_on_quic_headers(
    pid: Pid, key: int, long: bool, dcid_len: int, tail: bytes
) -> None:
    cid = bytes(ConnectionId.issued(pid, key))
    if long:
        data = b"\xc0\x00\x00\x00\x01" + bytes([dcid_len]) + cid + tail
    else:
        data = bytes([0x40 | (dcid_len & 0x3F)]) + cid + tail
    expected = target_pid(data)
    assert _target_key(data) == (None if expected is None else expected.raw)


segment_shapes = st.lists(
    st.tuples(
        st.sampled_from([*POOL[:2], None]),  # None: a segment without a readable target
        st.booleans(),  # long header
    ),
    min_size=2,
    max_size=8,
)


@SETTINGS
@given(segment_shapes, st.integers(0, 30), st.integers(0, 40), st.binary(min_size=1, max_size=40))
def test_segment_keys_agree_with_per_segment_extraction(
    shapes: list[tuple[Pid | None, bool]], extra: int, tail_len: int, garbage: bytes
) -> None:
    size = 22 + extra
    segments = []
    for index, (pid, long) in enumerate(shapes):
        if pid is None:
            head = b"\xc0\x00\x00\x00\x01\x08" if long else b"\x40\x01"
        elif long:
            head = b"\xc0\x00\x00\x00\x01\x14" + bytes(ConnectionId.issued(pid, 1))[:16]
        else:
            head = b"\x40" + bytes(ConnectionId.issued(pid, 1))
        segments.append((head + bytes([index]) * size)[:size])
    full_last = segments[-1]
    segments[-1] = full_last[: max(1, min(size, tail_len))]  # the last may be shorter
    contents = b"".join(segments)
    first = _target_key(segments[0])
    if first is None:
        return  # callers reject a first segment without a target before asking
    expected = [_target_key(segment) for segment in segments]
    uniform = all(key == first for key in expected)
    # A receive buffer holds stale bytes after the contents: here the cut-off rest of the last
    # segment, which must not make a truncated last segment look routable.
    backing = bytearray(contents) + full_last[len(segments[-1]) :] + garbage
    for result in (
        _segment_keys(contents, size, first),
        _segment_keys(memoryview(contents), size, first),
        _segment_keys(memoryview(backing)[: len(contents)], size, first, backing),
    ):
        assert result == (None if uniform else expected)


# --------------------------------------------------------------------------------------------
# forwarding decision vs model


@dataclass(frozen=True)
class RouteSpec:
    destination: int
    gated: bool
    closed: bool


route_specs = st.builds(RouteSpec, st.integers(0, 3), st.booleans(), st.booleans())
tables = st.dictionaries(st.sampled_from(POOL), route_specs, max_size=len(POOL))
targets = st.one_of(
    st.sampled_from([*POOL, Pid.LINK_LOCAL]),
    st.none(),  # malformed
)


def build_router(
    table: dict[Pid, RouteSpec], default: RouteSpec | None
) -> tuple[Router, dict[Pid, Route], Route | None]:
    router = Router()

    def make(spec: RouteSpec) -> Route:
        destination = DatagramAddr.inproc(9, spec.destination)
        if not spec.gated:
            return Route.permanent(destination)
        gate = RouteGate()
        if spec.closed:
            gate.close()
        return Route.gated(destination, gate)

    routes = {pid: make(spec) for pid, spec in table.items()}
    for pid, route in routes.items():
        router.insert(pid, route)
    default_route = None if default is None else make(default)
    if default_route is not None:
        router.set_default(default_route)
    return router, routes, default_route


def datagram_for(target: Pid | None, payload: bytes) -> bytes:
    if target is None:
        return b"\x40" + payload[:10]  # too short to carry a DCID
    return b"\x40" + bytes(ConnectionId.issued(target, 1)) + payload


def model(
    target: Pid | None, routes: dict[Pid, Route], default: Route | None, accept: int
) -> tuple[DropReason | None, Route | None]:
    """Spec 3.2 ``forward``: the expected drop reason (None: forwarded) and the route used."""
    if target is None:
        return DropReason.MALFORMED, None
    if target == Pid.LINK_LOCAL:
        return DropReason.UNBOUND_LINK_LOCAL, None
    route = routes.get(target, default)
    if route is None:
        return DropReason.NO_ROUTE, None
    if not route.is_active:
        return DropReason.INACTIVE, None
    if accept == 0:
        return DropReason.EGRESS_QUEUE_FULL, route
    return None, route


@SETTINGS
@given(
    tables,
    st.none() | route_specs,
    targets,
    st.binary(max_size=30),
    st.integers(0, 1),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_forward_agrees_with_the_model(
    table: dict[Pid, RouteSpec],
    default_spec: RouteSpec | None,
    target: Pid | None,
    payload: bytes,
    accept: int,
    wrap: type,
) -> None:
    router, routes, default = build_router(table, default_spec)
    egress = Egress(accept)
    datagram = wrap(datagram_for(target, payload))

    result = router.forward(egress, datagram)

    reason, route = model(target, routes, default, accept)
    if reason is None:
        assert route is not None
        assert target is not None
        assert result == Forwarded(target, 1)
        assert len(egress.sent) == 1
        sent, destination = egress.sent[0]
        assert sent is datagram  # byte-identical: the same object, unchanged
        assert bytes(sent) == datagram_for(target, payload)
        assert destination == route.destination
    else:
        assert result == Dropped(reason, target)
        assert egress.sent == []
    stats = router.statistics()
    assert stats.forwarded == (1 if reason is None else 0)
    assert stats.dropped_total == (0 if reason is None else 1)
    for gate in {r.gate for r in [*routes.values(), default] if r is not None and r.gate}:
        assert gate.in_flight == 0


@SETTINGS
@given(
    tables,
    st.none() | route_specs,
    st.lists(targets, min_size=1, max_size=6),
    st.integers(0, 8),
    st.integers(1, 6),
)
def test_forward_transmit_agrees_with_the_model(
    table: dict[Pid, RouteSpec],
    default_spec: RouteSpec | None,
    segment_targets: list[Pid | None],
    accept: int,
    payload_len: int,
) -> None:
    router, routes, default = build_router(table, default_spec)
    segments = [datagram_for(t, bytes(payload_len)) for t in segment_targets]
    size = len(datagram_for(POOL[0], bytes(payload_len)))
    # Malformed segments are shorter; pad them so every segment has exactly ``size`` bytes.
    segments = [s.ljust(size, b"\x00") if len(s) < size else s for s in segments]
    # A padded malformed segment becomes readable (zeros as PID) only if long enough; make it
    # unreadable again by giving it a long header with a wrong DCID length.
    segments = [
        (b"\xc0\x00\x00\x00\x01\x08" + s[6:]) if t is None else s
        for s, t in zip(segments, segment_targets, strict=True)
    ]
    contents = b"".join(segments)
    transmit = DatagramTransmit(SUPPLIED, contents, size, ecn=1)
    egress = Egress(accept)

    result = router.forward_transmit(egress, transmit)

    count = len(segments)
    first = segment_targets[0]
    uniform = all(t == first for t in segment_targets)
    if first is None:
        assert result == Dropped(DropReason.MALFORMED)
    elif uniform:
        reason, route = model(first, routes, default, accept)
        if reason is None:
            assert route is not None
            assert result == Forwarded(first, min(count, accept))
            [sent] = egress.transmits
            assert sent.contents is contents
            assert sent.destination == route.destination
            assert (sent.segment_size, sent.ecn) == (size, 1)
        else:
            assert result == Dropped(reason, first)
            assert egress.transmits == []
    else:
        # Walk the segments as spec 3.2 describes for mixed targets.
        accepted = 0
        expected: Forwarded | Dropped | None = None
        for target in segment_targets:
            reason, _ = model(target, routes, default, accept - accepted)
            if reason is None:
                accepted += 1
                continue
            if reason is DropReason.EGRESS_QUEUE_FULL and accepted:
                expected = Forwarded(first, accepted)
            else:
                expected = Dropped(reason, target)
            break
        if expected is None:
            expected = Forwarded(first, accepted)
        assert result == expected
        assert len(egress.sent) == accepted
        for (data, _), segment in zip(egress.sent, segments, strict=False):
            assert bytes(data) == segment


# --------------------------------------------------------------------------------------------
# RouteGate and the routing table as state machines


class GateMachine(RuleBasedStateMachine):
    """Random acquire/release/close sequences against the spec 3.1 model."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = RouteGate()
        self.active = True
        self.permits: list[GatePermit] = []
        self.closes_returning_true = 0

    @rule()
    def acquire(self) -> None:
        permit = self.gate.acquire()
        if self.active:
            assert permit is not None
            self.permits.append(permit)
        else:
            assert permit is None

    @precondition(lambda self: bool(self.permits))
    @rule(index=st.integers(0, 100), twice=st.booleans())
    def release(self, index: int, twice: bool) -> None:
        permit = self.permits.pop(index % len(self.permits))
        permit.release()
        if twice:
            permit.release()

    @rule()
    def close(self) -> None:
        if self.permits:
            try:
                self.gate.close(timeout=0)
            except TimeoutError:
                pass
            else:
                raise AssertionError("close returned with permits outstanding")
            self.active = False
            return
        changed = self.gate.close()
        assert changed == self.active
        self.closes_returning_true += changed
        self.active = False

    @invariant()
    def matches_model(self) -> None:
        assert self.gate.in_flight == len(self.permits)
        assert self.gate.is_active == self.active
        assert self.closes_returning_true <= 1


class TableMachine(RuleBasedStateMachine):
    """Router table operations against a dict model with a small ``max_routes``."""

    LIMIT = 4

    def __init__(self) -> None:
        super().__init__()
        self.router = Router(max_routes=self.LIMIT)
        self.model: dict[Pid, Route] = {}
        self.default: Route | None = None

    @rule(pid=st.sampled_from(POOL), destination=st.integers(0, 3))
    def insert(self, pid: Pid, destination: int) -> None:
        route = Route.permanent(DatagramAddr.inproc(5, destination))
        if pid not in self.model and len(self.model) >= self.LIMIT:
            try:
                self.router.insert(pid, route)
            except RoutingTableFullError:
                return
            raise AssertionError("insert beyond max_routes succeeded")
        assert self.router.insert(pid, route) == self.model.get(pid)
        self.model[pid] = route

    @rule(pid=st.sampled_from(POOL))
    def remove(self, pid: Pid) -> None:
        assert self.router.remove(pid) == self.model.pop(pid, None)

    @rule(destination=st.integers(0, 3))
    def set_default(self, destination: int) -> None:
        route = Route.permanent(DatagramAddr.inproc(6, destination))
        assert self.router.set_default(route) == self.default
        self.default = route

    @rule()
    def remove_default(self) -> None:
        assert self.router.remove_default() == self.default
        self.default = None

    @invariant()
    def matches_model(self) -> None:
        assert self.router.routes() == self.model
        assert self.router.default_route == self.default
        for pid in POOL:
            assert self.router.get(pid) == self.model.get(pid)
            assert self.router.lookup(pid) == self.model.get(pid, self.default)


TestGateMachine = GateMachine.TestCase
TestGateMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestTableMachine = TableMachine.TestCase
TestTableMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
