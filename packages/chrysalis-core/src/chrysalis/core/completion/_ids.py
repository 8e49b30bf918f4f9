"""Transport-core local identifiers (spec 1.6): never on the wire, always driver-scoped.

Why: the application correlates completions with what it submitted, across several drivers in
one process. Every identifier therefore carries its ``DriverId``, and each kind comes from its
own counter that starts at 1 and never reuses a value, so a stale identifier can never alias a
live one. Identifiers are frozen, slotted, hashable and ordered.

``ConnectionRef`` is the driver-local handle of a connection (the Rust ``ConnectionId``); it is
named differently to avoid a clash with ``chrysalis.core.ConnectionId``, the 20-byte QUIC
connection ID.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import final

from chrysalis.core.completion._errors import IdExhausted

__all__ = [
    "ConnectionRef",
    "ConnectionRefAllocator",
    "DriverId",
    "DriverIdAllocator",
    "OperationId",
    "RequestId",
    "StreamRef",
    "next_driver_id",
]

U16_MAX = 0xFFFF
U64_MAX = (1 << 64) - 1
QUIC_STREAM_ID_MAX = (1 << 62) - 1


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in {low}..{high}, got {value}")


@dataclass(frozen=True, slots=True, order=True)
class DriverId:
    """A process-local driver (endpoint) identity: an unsigned 16-bit value."""

    value: int

    def __post_init__(self) -> None:
        _check_int("DriverId", self.value, 0, U16_MAX)

    def __hash__(self) -> int:
        return hash(self.value)  # equal ids have equal values (no tuple per call)


@dataclass(frozen=True, slots=True, order=True)
class ConnectionRef:
    """A connection of one driver: ``(driver, sequence)``, sequence from 1, never reused."""

    driver: DriverId
    sequence: int
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_int("ConnectionRef.sequence", self.sequence, 1, U64_MAX)
        object.__setattr__(self, "_hash", hash((self.driver.value, self.sequence)))

    def __hash__(self) -> int:
        # Cached: refs key the endpoint's and the adapters' tables, looked up several times
        # per stream operation, and the generated hash recursed into ``DriverId`` each time.
        return self._hash


@dataclass(frozen=True, slots=True, order=True)
class StreamRef:
    """A stream of one connection: ``(connection, QUIC stream number)``."""

    connection: ConnectionRef
    stream: int
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_int("StreamRef.stream", self.stream, 0, QUIC_STREAM_ID_MAX)
        object.__setattr__(self, "_hash", hash((self.connection._hash, self.stream)))

    def __hash__(self) -> int:
        return self._hash  # cached, as ``ConnectionRef``'s

    @property
    def driver(self) -> DriverId:
        """The driver that owns the stream's connection."""
        return self.connection.driver


@dataclass(frozen=True, slots=True, order=True)
class OperationId:
    """A stream submission: ``(driver, sequence)`` from the submission sender's counter."""

    driver: DriverId
    sequence: int

    def __post_init__(self) -> None:
        _check_int("OperationId.sequence", self.sequence, 1, U64_MAX)


@dataclass(frozen=True, slots=True, order=True)
class RequestId:
    """A command: ``(driver, sequence)`` from the command sender's counter."""

    driver: DriverId
    sequence: int

    def __post_init__(self) -> None:
        _check_int("RequestId.sequence", self.sequence, 1, U64_MAX)


_new = object.__new__
_set = object.__setattr__


def _operation_id(driver: DriverId, sequence: int) -> OperationId:
    """An ``OperationId`` from parts that are valid by construction (the submitter's
    ``DriverId`` and a value of its counter), without re-validating them: one is made per
    stream operation, so this is on the hot path. Equal to ``OperationId(driver, sequence)``."""
    operation: OperationId = _new(OperationId)
    _set(operation, "driver", driver)
    _set(operation, "sequence", sequence)
    return operation


@final
class _Counter:
    """A thread-safe counter yielding 1, 2, ... up to ``maximum``, then ``IdExhausted``."""

    __slots__ = ("_lock", "_maximum", "_name", "_next", "_single")

    def __init__(self, name: str, maximum: int, *, threadsafe: bool = True) -> None:
        self._lock = threading.Lock()
        self._single = not threadsafe  # one thread only: no lock
        self._next = 1
        self._maximum = maximum
        self._name = name

    def next(self) -> int:
        if self._single:
            value = self._next
            if value > self._maximum:
                raise IdExhausted(f"{self._name} identifiers are exhausted")
            self._next = value + 1
            return value
        with self._lock:
            value = self._next
            if value > self._maximum:
                raise IdExhausted(f"{self._name} identifiers are exhausted")
            self._next = value + 1
        return value

    def peek(self) -> int:
        with self._lock:
            return self._next


@final
class DriverIdAllocator:
    """Allocates ``DriverId`` values 1, 2, ... 65535, then raises ``IdExhausted``."""

    __slots__ = ("_counter",)

    def __init__(self) -> None:
        self._counter = _Counter("DriverId", U16_MAX)

    def allocate(self) -> DriverId:
        """Return the next unused driver id."""
        return DriverId(self._counter.next())


_PROCESS_DRIVER_IDS = DriverIdAllocator()


def next_driver_id() -> DriverId:
    """Return the next driver id of this process (a process-wide counter from 1)."""
    return _PROCESS_DRIVER_IDS.allocate()


@final
class ConnectionRefAllocator:
    """Allocates a driver's ``ConnectionRef`` values, sequence 1, 2, ..., never reused."""

    __slots__ = ("_counter", "_driver")

    def __init__(self, driver: DriverId) -> None:
        self._driver = driver
        self._counter = _Counter("ConnectionRef", U64_MAX)

    @property
    def driver(self) -> DriverId:
        """The driver whose connections are numbered."""
        return self._driver

    def allocate(self) -> ConnectionRef:
        """Return the next unused connection handle of the driver."""
        return ConnectionRef(self._driver, self._counter.next())
