"""Byte budgets and the two buffer-ownership forms that draw on them.

Why (spec 4.4): a submitted send keeps its bytes alive until the peer acknowledges them (the
QUIC stack keeps views for retransmission), and a posted receive pins the caller's buffer until
the driver fills it. Both must be bounded, globally per endpoint, so a slow or hostile peer
cannot make the process hold unbounded memory. A ``ByteBudget`` is that bound: reservations
never let ``used`` exceed ``capacity``, and every release signals the budget's ``released``
wakeup so a blocked submitter can wait instead of spinning.

- ``RetainedBytes``: an immutable view over a send payload plus a *shared* reservation of its
  length. ``split_to`` produces more views of the same payload; the bytes go back to the budget
  only when every view derived from the original is released (release ~ acknowledgement).
- ``PostedBuffer``: the caller's ``bytearray`` plus an *exclusive* reservation of its whole
  capacity (prefix included). The driver appends into the spare room (``capacity - len``) and
  can never grow it further; the reservation is freed when the buffer is handed back.

Ownership transfer is a contract in Python: after submitting, the caller must not mutate a
sent payload or a posted buffer until the driver hands it back.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import final

from chrysalis.core.completion._errors import BufferCapacityError, CompletionModelError
from chrysalis.core.completion._notify import NOOP_NOTIFIER, Notifier, _fanout
from chrysalis.core.completion._wakeup import Wakeup

__all__ = [
    "BudgetStatistics",
    "ByteBudget",
    "ByteReservation",
    "BytesLike",
    "PostedBuffer",
    "RetainedBytes",
]

BytesLike = bytes | bytearray | memoryview
"""Payload types a send accepts (a memoryview must be C-contiguous)."""

_new = object.__new__

MAX_BUDGET_BYTES = 1 << 48
"""Largest accepted budget (a guard against accidental huge bounds)."""


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """A snapshot of a byte budget: ``used`` of ``capacity`` bytes are reserved."""

    capacity: int
    used: int

    @property
    def available(self) -> int:
        """Bytes that a reservation could take right now."""
        return self.capacity - self.used


@final
class ByteBudget:
    """A thread-safe byte budget: reservations never exceed ``capacity``.

    Args:
        capacity: the most bytes reserved at once (1 to 2**48).
        notifier: signalled after every release.
        name: a label for ``repr`` (for example "retained-send").
        threadsafe: False promises that the budget and what it hands out are used from one
            thread only (an inline driver and its application on one event loop): the hot
            reserve and release paths then skip the lock.
    """

    __slots__ = ("_capacity", "_lock", "_name", "_notify", "_released", "_single", "_used")

    def __init__(
        self,
        capacity: int,
        notifier: Notifier = NOOP_NOTIFIER,
        *,
        name: str = "bytes",
        threadsafe: bool = True,
    ) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool):
            raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
        if not 1 <= capacity <= MAX_BUDGET_BYTES:
            raise ValueError(f"capacity must be in 1..{MAX_BUDGET_BYTES}, got {capacity}")
        self._capacity = capacity
        self._used = 0
        self._lock = threading.Lock()
        self._single = not threadsafe
        self._name = name
        self._released = Wakeup(threadsafe=threadsafe)
        self._notify = _fanout(notifier, self._released).notify

    @property
    def capacity(self) -> int:
        """The most bytes reserved at once."""
        return self._capacity

    @property
    def used(self) -> int:
        """Bytes currently reserved."""
        with self._lock:
            return self._used

    @property
    def released(self) -> Wakeup:
        """Notified after every release: wait on it to get room without spinning."""
        return self._released

    def try_reserve(self, nbytes: int) -> ByteReservation | None:
        """Reserve ``nbytes`` or return None when ``used + nbytes > capacity``.

        ``nbytes`` must be a non-negative int (``ValueError`` otherwise). Zero always succeeds.
        """
        if not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
        with self._lock:
            if self._used + nbytes > self._capacity:
                return None
            self._used += nbytes
        return ByteReservation(self, nbytes)

    def try_retain(self, payload: BytesLike) -> RetainedBytes | None:
        """Reserve ``len(payload)`` and wrap it as ``RetainedBytes``; None when it does not fit.

        ``TypeError`` for a value that is not bytes-like, ``ValueError`` for a
        non-contiguous memoryview.
        """
        return self._try_retain_view(payload, _readonly_view(payload))

    def _try_retain_view(self, payload: BytesLike, view: memoryview) -> RetainedBytes | None:
        """``try_retain`` with ``view = _readonly_view(payload)`` already made by the caller
        (a submitter needs its size first; one view per send instead of two)."""
        nbytes = view.nbytes
        if self._single:
            if self._used + nbytes > self._capacity:
                return None
            self._used += nbytes
        else:
            with self._lock:
                if self._used + nbytes > self._capacity:
                    return None
                self._used += nbytes
        # The three objects are built slot by slot, without constructor frames: one set is
        # made per admitted send (tests check that every slot is set).
        reservation: ByteReservation = _new(ByteReservation)
        reservation._budget = self
        reservation._nbytes = nbytes
        reservation._released = False
        share: _SharedReservation = _new(_SharedReservation)
        share.reservation = reservation
        share.views = 1
        retained: RetainedBytes = _new(RetainedBytes)
        retained._source = payload
        retained._view = view
        retained._length = nbytes
        retained._share = share
        retained._released = False
        return retained

    def try_post(self, buffer: bytearray, capacity: int) -> PostedBuffer | None:
        """Reserve ``capacity`` bytes for ``buffer`` (which may grow up to ``capacity``).

        Returns None when the reservation does not fit. ``TypeError`` unless ``buffer`` is a
        bytearray; ``ValueError`` when ``capacity < len(buffer)``.
        """
        _check_posted(buffer, capacity)
        return self._try_post_checked(buffer, capacity)

    def _try_post_checked(self, buffer: bytearray, capacity: int) -> PostedBuffer | None:
        """``try_post`` for arguments the caller already checked (a submitter does)."""
        if self._single:
            if self._used + capacity > self._capacity:
                return None
            self._used += capacity
        else:
            with self._lock:
                if self._used + capacity > self._capacity:
                    return None
                self._used += capacity
        # Built slot by slot as in ``_try_retain_view``: one is made per admitted receive.
        reservation: ByteReservation = _new(ByteReservation)
        reservation._budget = self
        reservation._nbytes = capacity
        reservation._released = False
        posted: PostedBuffer = _new(PostedBuffer)
        posted._buffer = buffer
        posted._capacity = capacity
        posted._start = len(buffer)
        posted._reservation = reservation
        return posted

    def statistics(self) -> BudgetStatistics:
        """Return an immutable snapshot of the budget."""
        with self._lock:
            return BudgetStatistics(self._capacity, self._used)

    def __repr__(self) -> str:
        return f"ByteBudget({self._name!r}, used={self._used}/{self._capacity})"


def _readonly_view(payload: BytesLike) -> memoryview:
    if type(payload) is bytes:
        return memoryview(payload)  # already read-only, contiguous, one-dimensional bytes
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"payload must be bytes-like, not {type(payload).__name__}")
    view = memoryview(payload)
    if not view.c_contiguous:
        raise ValueError("payload memoryview must be C-contiguous")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view.toreadonly()


def _check_posted(buffer: bytearray, capacity: int) -> None:
    if not isinstance(buffer, bytearray):
        raise TypeError(f"a posted buffer must be a bytearray, not {type(buffer).__name__}")
    if not isinstance(capacity, int) or isinstance(capacity, bool):
        raise TypeError(f"capacity must be an int, not {type(capacity).__name__}")
    if capacity < len(buffer):
        raise ValueError(f"capacity {capacity} is smaller than the buffer ({len(buffer)} bytes)")


@final
class ByteReservation:
    """``nbytes`` reserved from a ``ByteBudget``; ``release()`` returns them exactly once."""

    __slots__ = ("_budget", "_nbytes", "_released")

    def __init__(self, budget: ByteBudget, nbytes: int) -> None:
        self._budget = budget
        self._nbytes = nbytes
        self._released = False

    @property
    def nbytes(self) -> int:
        """The reserved byte count."""
        return self._nbytes

    @property
    def budget(self) -> ByteBudget:
        """The budget the bytes were reserved from."""
        return self._budget

    @property
    def released(self) -> bool:
        """True once the bytes went back to the budget."""
        return self._released

    def release(self) -> bool:
        """Return the bytes to the budget. True the first time, False afterwards."""
        budget = self._budget
        if budget._single:
            if self._released:
                return False
            self._released = True
            budget._used -= self._nbytes
            budget._notify()
            return True
        with budget._lock:
            if self._released:
                return False
            self._released = True
            budget._used -= self._nbytes
        budget._notify()
        return True

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"ByteReservation({self._nbytes}, {state})"


@final
class _SharedReservation:
    """One reservation shared by several ``RetainedBytes`` views (refcounted under the
    budget's lock)."""

    __slots__ = ("reservation", "views")

    def __init__(self, reservation: ByteReservation) -> None:
        self.reservation = reservation
        self.views = 1


@final
class RetainedBytes:
    """An immutable view of a send payload holding a shared retained-send reservation.

    The reservation (the payload's full length) returns to the budget only when every view
    derived from the original submission, through ``split_to``, has been released.
    Thread-safe release; a view's own ``release()`` acts once and also releases the view's
    buffer export (``data`` is then unusable), so a caller's bytearray can be resized again as
    soon as every view of it is released. Slices taken of ``data`` are the holder's own
    views: they keep the export alive until they are released or collected.
    """

    __slots__ = ("_length", "_released", "_share", "_source", "_view")
    _length: int
    _released: bool
    _share: _SharedReservation
    _source: BytesLike
    _view: memoryview

    def __init__(self) -> None:
        raise TypeError("RetainedBytes is created by ByteBudget.try_retain")

    @property
    def data(self) -> memoryview:
        """A read-only view of this part of the payload (``CompletionModelError`` once released)."""
        if self._released:
            raise CompletionModelError("RetainedBytes view was released")
        return self._view

    @property
    def released(self) -> bool:
        """True once this view was released."""
        return self._released

    @property
    def reservation(self) -> ByteReservation:
        """The shared reservation (released when the last view goes)."""
        return self._share.reservation

    def __len__(self) -> int:
        """The byte length of this view (also after ``release()``)."""
        return self._length

    def __bytes__(self) -> bytes:
        return self.data.tobytes()

    def split_to(self, at: int) -> RetainedBytes:
        """Split off the first ``at`` bytes as a new view; this view keeps the rest.

        Both views share the one reservation. ``ValueError`` unless ``0 <= at <= len(self)``.
        """
        view = self.data
        if not 0 <= at <= view.nbytes:
            raise ValueError(f"split point {at} outside 0..{view.nbytes}")
        share = self._share
        budget = share.reservation.budget
        with budget._lock:
            if self._released:
                raise CompletionModelError("RetainedBytes view was released")
            share.views += 1
        head = object.__new__(RetainedBytes)
        head._source = self._source
        head._view = view[:at]
        head._length = at
        head._share = share
        head._released = False
        self._view = view[at:]
        self._length = view.nbytes - at
        return head

    def release(self) -> bool:
        """Drop this view. True the first time; the last view frees the reservation."""
        share = self._share
        budget = share.reservation.budget
        if budget._single:
            if self._released:
                return False
            self._released = True
            share.views -= 1
            last = share.views == 0
        else:
            with budget._lock:
                if self._released:
                    return False
                self._released = True
                share.views -= 1
                last = share.views == 0
        # Release the buffer export too, so the caller may resize its bytearray at once
        # (after a refused submission, or once the driver released the send) instead of
        # when the garbage collector reaches this object. A view that something else still
        # exports from (a consumer holding its buffer) is left to the garbage collector.
        try:  # noqa: SIM105 (contextlib.suppress costs two calls, and this runs per send)
            self._view.release()
        except BufferError:
            pass
        if last:
            share.reservation.release()
        return True

    def _unwrap(self) -> BytesLike:
        """Release this (sole, unsplit) view and return the caller's original payload."""
        self.release()
        return self._source

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"RetainedBytes({self._length} bytes, {state})"


@final
class PostedBuffer:
    """A caller's bytearray posted for receiving, with an exclusive reservation of ``capacity``.

    ``start`` is the buffer length when it was posted: that prefix is preserved, and the driver
    appends after it, never past ``capacity``. ``release()`` frees the reservation (once); the
    bytearray itself always stays the caller's object.
    """

    __slots__ = ("_buffer", "_capacity", "_reservation", "_start")
    _buffer: bytearray
    _capacity: int
    _reservation: ByteReservation
    _start: int

    def __init__(self) -> None:
        raise TypeError("PostedBuffer is created by ByteBudget.try_post")

    @property
    def buffer(self) -> bytearray:
        """The caller's bytearray (the same object that was posted)."""
        return self._buffer

    @property
    def capacity(self) -> int:
        """The most bytes the buffer may hold; the reserved byte count."""
        return self._capacity

    @property
    def start(self) -> int:
        """The buffer length when posted (the preserved prefix)."""
        return self._start

    @property
    def spare(self) -> int:
        """Bytes that may still be appended."""
        return self._capacity - len(self._buffer)

    @property
    def appended(self) -> int:
        """Bytes appended since posting."""
        return len(self._buffer) - self._start

    @property
    def reservation(self) -> ByteReservation:
        """The posted-receive reservation of ``capacity`` bytes."""
        return self._reservation

    @property
    def released(self) -> bool:
        """True once the reservation went back to the budget."""
        return self._reservation.released

    def append(self, data: BytesLike) -> None:
        """Append ``data`` (driver side); ``BufferCapacityError`` if it exceeds ``spare``."""
        size = memoryview(data).nbytes
        if size > self._capacity - len(self._buffer):
            raise BufferCapacityError(
                f"appending {size} bytes exceeds the {self.spare} spare bytes of a posted buffer"
            )
        self._buffer += data

    def release(self) -> bool:
        """Free the reservation. True the first time, False afterwards."""
        return self._reservation.release()

    def __repr__(self) -> str:
        return (
            f"PostedBuffer(len={len(self._buffer)}, start={self._start}, "
            f"capacity={self._capacity}, released={self.released})"
        )
