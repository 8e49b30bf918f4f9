"""Example tests for RouteGate, Route and Router (the route.rs inventory of spec section 8, plus
the edge cases of spec 3.1/3.2)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from chrysalis.core import ConnectionId, DatagramAddr, Pid, target_pid
from chrysalis.datagram._route import (
    Dropped,
    DropReason,
    Forwarded,
    Route,
    RouteGate,
    Router,
    RoutingTableFullError,
)
from chrysalis.datagram._socket import (
    Buffer,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTransmit,
    HostUnreachableError,
    Waker,
)

WAIT = 5.0  # bound on every wait; the tests finish in milliseconds when correct

PID_A = Pid(bytes(range(1, 17)))
PID_B = Pid(bytes(range(17, 33)))
PID_C = Pid(bytes([0xC3] * 16))
DST_A = DatagramAddr.inproc(1, 10)
DST_B = DatagramAddr.inproc(1, 11)
DST_PARENT = DatagramAddr.inproc(1, 99)
SUPPLIED = DatagramAddr.inproc(1, 1234)


def short(pid: Pid, payload: bytes = b"payload", key: int = 1) -> bytes:
    """A short-header datagram whose DCID targets ``pid``."""
    return b"\x40" + bytes(ConnectionId.issued(pid, key)) + payload


def long_header(pid: Pid, payload: bytes = b"payload") -> bytes:
    """A long-header datagram (DCID length 20) whose DCID targets ``pid``."""
    return b"\xc0\x00\x00\x00\x01\x14" + bytes(ConnectionId.issued(pid, 7)) + payload


class RecordingSocket(DatagramSocket):
    """Records every send; accepts at most ``accept`` datagrams per transmit (None: all) and
    would block while ``blocked`` is set; raises ``fail`` (if set) from every send."""

    def __init__(self, *, accept: int | None = None) -> None:
        self.sent: list[tuple[bytes | bytearray | memoryview, DatagramAddr]] = []
        self.transmits: list[DatagramTransmit] = []
        self.accept = accept
        self.blocked = False
        self.fail: OSError | None = None
        self._closed = False

    @property
    def local_addr(self) -> DatagramAddr:
        return DatagramAddr.inproc(1, 1)

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        if self.fail is not None:
            raise self.fail
        if self.blocked:
            return False
        self.sent.append((data, destination))
        return True

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        if self.fail is not None:
            raise self.fail
        if self.blocked:
            return 0
        count = transmit.segment_count
        if self.accept is not None:
            count = min(count, self.accept)
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
        self._closed = True

    @property
    def is_shutdown(self) -> bool:
        return self._closed

    def join(self, timeout: float | None = None) -> bool:
        return self._closed


class BlockingSendSocket(RecordingSocket):
    """``try_send_to`` signals ``entered`` and then waits for ``release`` (bounded)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        self.entered.set()
        assert self.release.wait(WAIT), "test never released the blocked send"
        return super().try_send_to(data, destination)


def wait_until(predicate: object, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


# --------------------------------------------------------------------------------------------
# route.rs inventory


def test_permanent_route_forwards() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    egress = RecordingSocket()
    datagram = short(PID_A)

    result = router.forward(egress, datagram)

    assert result == Forwarded(PID_A, 1)
    assert len(egress.sent) == 1
    sent, destination = egress.sent[0]
    assert sent is datagram  # the very same object: not copied, not modified
    assert destination == DST_A


def test_closed_gate_fences_every_derived_route() -> None:
    router = Router()
    gate = RouteGate()
    router.insert(PID_A, Route.gated(DST_A, gate))
    router.insert(PID_B, Route.gated(DST_B, gate))
    egress = RecordingSocket()

    assert gate.close() is True
    assert gate.close() is False
    assert not gate.is_active

    assert router.forward(egress, short(PID_A)) == Dropped(DropReason.INACTIVE, PID_A)
    assert router.forward(egress, short(PID_B)) == Dropped(DropReason.INACTIVE, PID_B)
    assert egress.sent == []


def test_close_waits_for_admitted_send_and_rejects_new_sends() -> None:
    router = Router()
    gate = RouteGate()
    router.insert(PID_A, Route.gated(DST_A, gate))
    blocking = BlockingSendSocket()
    forward_results: list[object] = []
    close_results: list[bool] = []

    sender = threading.Thread(
        target=lambda: forward_results.append(router.forward(blocking, short(PID_A)))
    )
    sender.start()
    try:
        assert blocking.entered.wait(WAIT)
        assert gate.in_flight == 1

        closer = threading.Thread(target=lambda: close_results.append(gate.close(timeout=WAIT)))
        closer.start()
        wait_until(lambda: not gate.is_active, "close() to deactivate the gate")

        # close() cannot return while the admitted send is still inside the socket ...
        assert closer.is_alive()
        assert close_results == []
        # ... and a send that starts now is refused without touching the socket.
        other = RecordingSocket()
        assert router.forward(other, short(PID_A)) == Dropped(DropReason.INACTIVE, PID_A)
        assert other.sent == []
        assert closer.is_alive()
    finally:
        blocking.release.set()
        sender.join(WAIT)
    closer.join(WAIT)
    assert not closer.is_alive()
    assert close_results == [True]
    assert forward_results == [Forwarded(PID_A, 1)]
    assert gate.in_flight == 0
    assert [destination for _, destination in blocking.sent] == [DST_A]


def test_malformed_and_unknown_datagrams_are_dropped() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    egress = RecordingSocket()

    assert router.forward(egress, b"") == Dropped(DropReason.MALFORMED)
    assert router.forward(egress, b"\x40\x01\x02\x03") == Dropped(DropReason.MALFORMED)
    assert router.forward(egress, short(PID_B)) == Dropped(DropReason.NO_ROUTE, PID_B)
    assert egress.sent == []


def test_default_route_handles_unknown_targets_and_exact_route_wins() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    assert router.set_default(Route.permanent(DST_PARENT)) is None
    egress = RecordingSocket()

    assert router.forward(egress, short(PID_B)) == Forwarded(PID_B, 1)
    assert router.forward(egress, short(PID_A)) == Forwarded(PID_A, 1)
    assert router.forward(egress, short(Pid.LINK_LOCAL)) == Dropped(
        DropReason.UNBOUND_LINK_LOCAL, Pid.LINK_LOCAL
    )
    assert [destination for _, destination in egress.sent] == [DST_PARENT, DST_A]

    assert router.remove_default() == Route.permanent(DST_PARENT)
    assert router.default_route is None
    assert router.forward(egress, short(PID_B)) == Dropped(DropReason.NO_ROUTE, PID_B)


def test_full_egress_queue_drops_for_quic_retransmission() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    egress = RecordingSocket()
    egress.blocked = True

    assert router.forward(egress, short(PID_A)) == Dropped(DropReason.EGRESS_QUEUE_FULL, PID_A)
    transmit = DatagramTransmit(SUPPLIED, short(PID_A, b"x" * 10) * 3, 31)
    assert router.forward_transmit(egress, transmit) == Dropped(DropReason.EGRESS_QUEUE_FULL, PID_A)
    stats = router.statistics()
    assert stats.dropped[DropReason.EGRESS_QUEUE_FULL] == 4
    assert stats.forwarded == 0


def test_segmented_route_reports_accepted_prefix() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    egress = RecordingSocket(accept=2)
    segment = short(PID_A, b"s" * 43)
    contents = segment * 4
    transmit = DatagramTransmit(SUPPLIED, contents, len(segment), ecn=2)

    assert router.forward_transmit(egress, transmit) == Forwarded(PID_A, 2)
    [sent] = egress.transmits
    assert sent.destination == DST_A  # rewritten to the route's address
    assert sent.contents is contents  # the same buffer, byte-identical
    assert sent.segment_size == len(segment)
    assert sent.ecn == 2
    assert router.statistics().forwarded == 2


# --------------------------------------------------------------------------------------------
# forwarding edge cases


def test_long_header_datagrams_route_by_their_destination_cid() -> None:
    router = Router()
    router.insert(PID_B, Route.permanent(DST_B))
    egress = RecordingSocket()

    assert router.forward(egress, long_header(PID_B)) == Forwarded(PID_B, 1)
    wrong_length = b"\xc0\x00\x00\x00\x01\x08" + bytes(8) + b"rest" * 8
    assert router.forward(egress, wrong_length) == Dropped(DropReason.MALFORMED)


def test_exact_route_with_closed_gate_does_not_fall_back_to_default() -> None:
    router = Router()
    gate = RouteGate()
    router.insert(PID_A, Route.gated(DST_A, gate))
    router.set_default(Route.permanent(DST_PARENT))
    gate.close()
    egress = RecordingSocket()

    assert router.forward(egress, short(PID_A)) == Dropped(DropReason.INACTIVE, PID_A)
    assert egress.sent == []


def test_closed_default_gate_fences_unknown_targets() -> None:
    router = Router()
    parent_gate = RouteGate()
    router.set_default(Route.gated(DST_PARENT, parent_gate))
    parent_gate.close()

    assert router.forward(RecordingSocket(), short(PID_C)) == Dropped(DropReason.INACTIVE, PID_C)


def test_egress_errors_other_than_would_block_propagate_and_release_the_gate() -> None:
    router = Router()
    gate = RouteGate()
    router.insert(PID_A, Route.gated(DST_A, gate))
    egress = RecordingSocket()
    egress.fail = HostUnreachableError("gone")

    with pytest.raises(HostUnreachableError):
        router.forward(egress, short(PID_A))
    with pytest.raises(HostUnreachableError):
        router.forward_transmit(egress, DatagramTransmit(SUPPLIED, short(PID_A)))
    assert gate.in_flight == 0
    assert gate.close() is True


def test_bytearray_and_memoryview_datagrams_are_passed_through_unchanged() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    egress = RecordingSocket()
    buffer = bytearray(short(PID_A)) + bytearray(100)
    view = memoryview(buffer)[: len(short(PID_A))]

    assert router.forward(egress, view) == Forwarded(PID_A, 1)
    assert egress.sent[0][0] is view
    assert bytes(view) == short(PID_A)


def test_empty_transmit_is_malformed() -> None:
    router = Router()
    router.set_default(Route.permanent(DST_PARENT))
    result = router.forward_transmit(RecordingSocket(), DatagramTransmit(SUPPLIED, b""))
    assert result == Dropped(DropReason.MALFORMED)


def test_transmit_whose_first_segment_has_no_target_is_malformed() -> None:
    router = Router()
    router.set_default(Route.permanent(DST_PARENT))
    contents = b"\x40\x01" + b"\x00" * 20 + short(PID_A, b"")[:22]
    egress = RecordingSocket()
    result = router.forward_transmit(egress, DatagramTransmit(SUPPLIED, contents, 3))
    assert result == Dropped(DropReason.MALFORMED)
    assert router.statistics().dropped[DropReason.MALFORMED] == 15  # every segment counted
    assert egress.sent == []
    assert egress.transmits == []


def test_mixed_targets_are_forwarded_one_by_one() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    router.insert(PID_B, Route.permanent(DST_B))
    egress = RecordingSocket()
    seg_a, seg_b = short(PID_A, b"aa"), short(PID_B, b"bb")
    transmit = DatagramTransmit(SUPPLIED, seg_a + seg_b + seg_a, len(seg_a))

    assert router.forward_transmit(egress, transmit) == Forwarded(PID_A, 3)
    assert [(bytes(data), dst) for data, dst in egress.sent] == [
        (seg_a, DST_A),
        (seg_b, DST_B),
        (seg_a, DST_A),
    ]


def test_mixed_targets_stop_at_the_first_full_egress_queue() -> None:
    class FullAfter(RecordingSocket):
        def try_send_to(
            self, data: bytes | bytearray | memoryview, destination: DatagramAddr
        ) -> bool:
            return len(self.sent) < 1 and super().try_send_to(data, destination)

    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    router.insert(PID_B, Route.permanent(DST_B))
    seg_a, seg_b = short(PID_A, b"aa"), short(PID_B, b"bb")
    transmit = DatagramTransmit(SUPPLIED, seg_a + seg_b + seg_a, len(seg_a))

    egress = FullAfter()
    assert router.forward_transmit(egress, transmit) == Forwarded(PID_A, 1)
    assert len(egress.sent) == 1

    blocked = RecordingSocket()
    blocked.blocked = True
    assert router.forward_transmit(blocked, transmit) == Dropped(
        DropReason.EGRESS_QUEUE_FULL, PID_A
    )


def test_mixed_targets_return_any_other_drop_immediately() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    egress = RecordingSocket()
    seg_a, seg_c = short(PID_A, b"aa"), short(PID_C, b"cc")
    transmit = DatagramTransmit(SUPPLIED, seg_a + seg_c + seg_a, len(seg_a))

    assert router.forward_transmit(egress, transmit) == Dropped(DropReason.NO_ROUTE, PID_C)
    assert len(egress.sent) == 1  # the segment after the drop was not sent
    stats = router.statistics()
    assert stats.forwarded == 1
    assert stats.dropped[DropReason.NO_ROUTE] == 2


def test_mixed_targets_error_after_progress_returns_the_accepted_prefix() -> None:
    class FailSecond(RecordingSocket):
        def try_send_to(
            self, data: bytes | bytearray | memoryview, destination: DatagramAddr
        ) -> bool:
            if self.sent:
                raise HostUnreachableError("second hop gone")
            return super().try_send_to(data, destination)

    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    router.insert(PID_B, Route.permanent(DST_B))
    seg_a, seg_b = short(PID_A, b"aa"), short(PID_B, b"bb")
    mixed = DatagramTransmit(SUPPLIED, seg_a + seg_b, len(seg_a))

    assert router.forward_transmit(FailSecond(), mixed) == Forwarded(PID_A, 1)
    failing = RecordingSocket()
    failing.fail = HostUnreachableError("gone")
    with pytest.raises(HostUnreachableError):  # no progress: the error propagates
        router.forward_transmit(failing, mixed)


# --------------------------------------------------------------------------------------------
# gates


def test_gate_permits_release_exactly_once() -> None:
    gate = RouteGate()
    permit = gate.acquire()
    assert permit is not None
    with gate.acquire() as second:  # type: ignore[union-attr]
        assert gate.in_flight == 2
        assert not second.released
    assert gate.in_flight == 1
    permit.release()
    permit.release()
    assert permit.released
    assert gate.in_flight == 0
    stats = gate.statistics()
    assert (stats.active, stats.in_flight, stats.admitted, stats.refused) == (True, 0, 2, 0)


def test_closed_gate_admits_nothing_and_counts_refusals() -> None:
    gate = RouteGate()
    assert gate.close() is True
    assert gate.acquire() is None
    assert gate.statistics().refused == 1
    assert gate.wait_drained(0) is True


def test_gate_close_with_timeout_raises_while_a_permit_is_held() -> None:
    gate = RouteGate()
    permit = gate.acquire()
    assert permit is not None
    with pytest.raises(TimeoutError):
        gate.close(timeout=0.01)
    assert not gate.is_active  # the gate stays closed
    assert gate.wait_drained(0) is False
    permit.release()
    assert gate.wait_drained(WAIT) is True
    assert gate.close() is False  # the first call already changed it


def test_only_one_of_concurrent_closes_reports_the_change() -> None:
    gate = RouteGate()
    results: list[bool] = []
    lock = threading.Lock()

    def close() -> None:
        value = gate.close(timeout=WAIT)
        with lock:
            results.append(value)

    threads = [threading.Thread(target=close) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert sorted(results) == [False] * 7 + [True]


# --------------------------------------------------------------------------------------------
# table


def test_insert_returns_the_replaced_route_and_remove_returns_the_removed_one() -> None:
    router = Router()
    first, second = Route.permanent(DST_A), Route.gated(DST_B, RouteGate())
    assert router.insert(PID_A, first) is None
    assert router.insert(PID_A, second) is first
    assert router.get(PID_A) is second
    assert PID_A in router
    assert len(router) == 1
    assert router.routes() == {PID_A: second}
    assert router.remove(PID_A) is second
    assert router.remove(PID_A) is None
    assert router.get(PID_A) is None


def test_lookup_uses_exact_then_default_and_never_the_link_local_pid() -> None:
    router = Router()
    default = Route.permanent(DST_PARENT)
    router.insert(PID_A, Route.permanent(DST_A))
    router.set_default(default)
    assert router.lookup(PID_A) == Route.permanent(DST_A)
    assert router.lookup(PID_B) is default
    assert router.lookup(Pid.LINK_LOCAL) is None


def test_the_link_local_pid_cannot_be_routed() -> None:
    with pytest.raises(ValueError, match="link-local"):
        Router().insert(Pid.LINK_LOCAL, Route.permanent(DST_A))


def test_routing_table_is_bounded() -> None:
    router = Router(max_routes=2)
    router.insert(PID_A, Route.permanent(DST_A))
    router.insert(PID_B, Route.permanent(DST_B))
    with pytest.raises(RoutingTableFullError):
        router.insert(PID_C, Route.permanent(DST_A))
    router.insert(PID_A, Route.permanent(DST_B))  # replacing is always allowed
    router.remove(PID_B)
    router.insert(PID_C, Route.permanent(DST_A))
    assert len(router) == 2


def test_table_operations_reject_wrong_types() -> None:
    router = Router()
    with pytest.raises(TypeError):
        router.insert(bytes(16), Route.permanent(DST_A))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        router.insert(PID_A, DST_A)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Route(b"addr")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Route(DST_A, object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_routes"):
        Router(max_routes=-1)


def test_routes_compare_gates_by_identity() -> None:
    gate = RouteGate()
    assert Route.gated(DST_A, gate) == Route.gated(DST_A, gate)
    assert Route.gated(DST_A, gate) != Route.gated(DST_A, RouteGate())
    assert Route.permanent(DST_A).is_active
    gate.close()
    assert not Route.gated(DST_A, gate).is_active


def test_statistics_count_every_drop_reason_per_datagram() -> None:
    router = Router()
    router.insert(PID_A, Route.permanent(DST_A))
    egress = RecordingSocket()
    router.forward(egress, short(PID_A))
    router.forward(egress, b"")
    router.forward(egress, short(PID_B))
    router.forward(egress, short(Pid.LINK_LOCAL))
    stats = router.statistics()
    assert stats.routes == 1
    assert not stats.has_default
    assert stats.forwarded == 1
    assert stats.dropped[DropReason.MALFORMED] == 1
    assert stats.dropped[DropReason.NO_ROUTE] == 1
    assert stats.dropped[DropReason.UNBOUND_LINK_LOCAL] == 1
    assert stats.dropped_total == 3
    with pytest.raises(TypeError):
        stats.dropped[DropReason.INACTIVE] = 5  # type: ignore[index]


def test_helpers_build_datagrams_that_target_their_pid() -> None:
    assert target_pid(short(PID_A)) == PID_A
    assert target_pid(long_header(PID_B)) == PID_B
