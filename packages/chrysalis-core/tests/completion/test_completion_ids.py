"""Transport-core local identifiers (spec 1.6) and their allocators."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chrysalis.core.completion import (
    ConnectionRef,
    ConnectionRefAllocator,
    DriverId,
    DriverIdAllocator,
    IdExhausted,
    OperationId,
    RequestId,
    StreamRef,
    next_driver_id,
)
from chrysalis.core.completion._ids import _Counter

U64 = (1 << 64) - 1


def test_stream_id_retains_driver_connection_and_stream() -> None:
    driver = DriverId(7)
    connection = ConnectionRef(driver, 11)
    stream = StreamRef(connection, 4)
    assert stream.connection == connection
    assert stream.stream == 4
    assert stream.driver == driver
    assert stream.connection.sequence == 11


def test_connection_id_retains_its_driver() -> None:
    connection = ConnectionRef(DriverId(3), 9)
    assert connection.driver == DriverId(3)
    assert connection.sequence == 9
    assert connection != ConnectionRef(DriverId(4), 9)


def test_operation_id_is_scoped_to_its_driver() -> None:
    assert OperationId(DriverId(1), 5) != OperationId(DriverId(2), 5)
    assert OperationId(DriverId(1), 5).driver == DriverId(1)
    assert OperationId(DriverId(1), 5) == OperationId(DriverId(1), 5)


def test_request_id_is_scoped_to_its_driver() -> None:
    assert RequestId(DriverId(1), 5) != RequestId(DriverId(2), 5)
    assert RequestId(DriverId(9), 1).driver == DriverId(9)
    # A request id and an operation id with the same numbers are different kinds.
    assert RequestId(DriverId(1), 1) != OperationId(DriverId(1), 1)  # type: ignore[comparison-overlap]


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: DriverId(-1), ValueError),
        (lambda: DriverId(1 << 16), ValueError),
        (lambda: DriverId(True), TypeError),
        (lambda: ConnectionRef(DriverId(1), 0), ValueError),
        (lambda: ConnectionRef(DriverId(1), U64 + 1), ValueError),
        (lambda: StreamRef(ConnectionRef(DriverId(1), 1), -1), ValueError),
        (lambda: StreamRef(ConnectionRef(DriverId(1), 1), 1 << 62), ValueError),
        (lambda: OperationId(DriverId(1), 0), ValueError),
        (lambda: RequestId(DriverId(1), 0), ValueError),
        (lambda: RequestId(DriverId(1), "1"), TypeError),  # type: ignore[arg-type]
    ],
)
def test_out_of_range_identifiers_are_rejected(build: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        build()  # type: ignore[operator]


def test_identifiers_are_frozen_and_slotted() -> None:
    op = OperationId(DriverId(1), 1)
    with pytest.raises(AttributeError):
        op.sequence = 2  # type: ignore[misc]
    assert not hasattr(op, "__dict__")


def test_driver_id_allocator_counts_from_one() -> None:
    allocator = DriverIdAllocator()
    assert [allocator.allocate() for _ in range(3)] == [DriverId(1), DriverId(2), DriverId(3)]


def test_process_driver_ids_are_unique_and_increasing() -> None:
    first, second = next_driver_id(), next_driver_id()
    assert first.value >= 1
    assert second.value > first.value


def test_connection_allocator_is_per_driver_and_never_reuses() -> None:
    a = ConnectionRefAllocator(DriverId(1))
    b = ConnectionRefAllocator(DriverId(2))
    assert a.allocate() == ConnectionRef(DriverId(1), 1)
    assert a.allocate() == ConnectionRef(DriverId(1), 2)
    assert b.allocate() == ConnectionRef(DriverId(2), 1)
    assert a.driver == DriverId(1)


def test_counter_raises_when_exhausted_instead_of_wrapping() -> None:
    counter = _Counter("test", 2)
    assert counter.next() == 1
    assert counter.next() == 2
    with pytest.raises(IdExhausted):
        counter.next()
    with pytest.raises(IdExhausted):
        counter.next()


def test_concurrent_allocation_yields_distinct_values() -> None:
    allocator = ConnectionRefAllocator(DriverId(5))
    results: list[list[ConnectionRef]] = [[] for _ in range(4)]

    def work(out: list[ConnectionRef]) -> None:
        for _ in range(500):
            out.append(allocator.allocate())

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=5)
    merged = [ref.sequence for out in results for ref in out]
    assert sorted(merged) == list(range(1, 2001))


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 0xFFFF),
    st.integers(1, U64),
    st.integers(0, (1 << 62) - 1),
    st.integers(0, 0xFFFF),
    st.integers(1, U64),
)
def test_identifier_equality_and_order_follow_their_fields(
    driver: int, conn: int, stream: int, other_driver: int, other_conn: int
) -> None:
    a = StreamRef(ConnectionRef(DriverId(driver), conn), stream)
    b = StreamRef(ConnectionRef(DriverId(other_driver), other_conn), stream)
    assert (a == b) == ((driver, conn) == (other_driver, other_conn))
    assert (a < b) == ((driver, conn) < (other_driver, other_conn))
    assert hash(a) == hash(StreamRef(ConnectionRef(DriverId(driver), conn), stream))
