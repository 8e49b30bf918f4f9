"""``FaultySocket``: any datagram carrier, seen through a bad network.

Why a wrapper and not a carrier of its own: every layer above the carriers (routing, the
switch, QUIC, the node) must be tested over loss, duplication, reordering, delay and
partitions, and it must be the *same* code path it uses in production. So the wrapper
implements the full :class:`~chrysalis.datagram.DatagramSocket` contract around any inner
socket and only decides, per datagram, what the network does to it. The decisions come from the
pure :class:`~chrysalis.faultnet.FaultSchedule` (one per faulted direction, seeded from the
plan), so a run is reproducible from its seed.

How delivery works:

* Send side: a datagram whose copies are all *immediate* goes straight to the inner carrier in
  the caller's thread, so the inner carrier's backpressure (``False`` = would block) and errors
  reach the caller unchanged. Held copies (delayed, reordered) are copied and queued; when they
  come due they are sent to the inner carrier by whoever gets there first: the next send, or
  the timer. A held copy that the inner carrier then refuses (would block) counts as
  ``dropped_overflow``; one it rejects with an error counts as ``dropped_error`` -- on a real
  network a late datagram has nobody to report to either.
* Receive side: ``try_recv`` reads datagrams from the inner carrier one at a time into a
  scratch buffer, splits receive aggregates into datagrams, decides their fate and hands out
  the immediate and due copies, oldest first, through a small ready queue (at most one batch
  plus one duplicate).
* Partitions (``partition``/``heal``) drop traffic to and from the given peers whatever the
  plan says: at send, at receive, and when a held copy comes due.

Readiness (the part that needs care): ``fileno()`` and ``readiness_fds()`` are the inner
socket's, because the inner descriptor is exactly what becomes readable when a datagram
arrives. A held received datagram, however, becomes deliverable with no descriptor event, so the
wrapper also fires the receive waker when one comes due: adapters wait for "a readiness
descriptor readable *or* the receive waker called" (see ``DatagramSocket.readiness_fds``).
``add_recv_waker`` registers the waker with the inner socket too (which calls it when data
arrives, for descriptor-less carriers, and on shutdown) and calls it at once when a held datagram
is already due. One timer thread per socket, started only once something is held, sleeps until
the next due time (at most :data:`TIMER_MAX_WAIT` seconds at a time, so an injected clock that
jumps is noticed), then sends due copies and fires the waker; ``shutdown`` stops it and ``join``
joins it. With ``timer_thread=False`` there is no thread: the owner calls :meth:`handle_timer`
(for example after advancing a fake clock), which makes a test fully deterministic.

Statistics count datagrams (segments of a transmit count one each):
``sent + received + duplicated == delivered + dropped_loss + dropped_partition +
dropped_overflow + dropped_error + held`` at any moment before shutdown (held copies are
discarded, uncounted, at shutdown). A send the inner carrier refuses as would-block is not
counted at all: the caller retries it, and it gets a fresh decision.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Final, NamedTuple, TypeVar

from chrysalis.core import DatagramAddr
from chrysalis.datagram import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTooLargeError,
    DatagramTransmit,
    InvalidDataError,
    SocketClosedError,
    Waker,
)
from chrysalis.faultnet._plan import Admission, FaultDecision, FaultPlan, FaultSchedule

__all__ = ["MAX_PARTITIONED_PEERS", "TIMER_MAX_WAIT", "FaultStatistics", "FaultySocket"]

#: Most peers one socket may have partitioned away at once.
MAX_PARTITIONED_PEERS: Final = 4096
#: Longest single sleep of the timer thread, in seconds (bounds how late it notices a clock
#: that jumps, such as a test's fake clock).
TIMER_MAX_WAIT: Final = 0.05
# Idle sleep of the timer thread when nothing is held (it is also woken explicitly).
_TIMER_IDLE_WAIT: Final = 1.0

_R = TypeVar("_R")


class _Once:
    """A waker that runs at most once, however many parties fire it (the wrapper and the inner
    socket may both hold it)."""

    __slots__ = ("_lock", "_waker")

    def __init__(self, waker: Waker) -> None:
        self._waker: Waker | None = waker
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            waker, self._waker = self._waker, None
        if waker is not None:
            waker()


def once(waker: Waker) -> Waker:
    """``waker`` wrapped to run at most once."""
    return waker if isinstance(waker, _Once) else _Once(waker)


@dataclass(frozen=True, slots=True)
class FaultStatistics:
    """A snapshot of what a :class:`FaultySocket` did, in datagrams (immutable).

    * ``sent``: accepted from the caller for sending; ``received``: read from the inner carrier.
    * ``delivered``: passed on by the fault stage (to the inner carrier when sending, to the
      caller when receiving).
    * ``dropped_loss``: lost by the plan; ``dropped_partition``: to or from a partitioned peer;
      ``dropped_overflow``: refused because ``max_held`` copies were held, or because the inner
      carrier would block when a held copy came due; ``dropped_error``: held copies the inner
      carrier rejected with an error when they came due.
    * ``duplicated``: datagrams delivered twice; ``reordered``: datagrams held back behind
      later ones; ``delayed``: copies held for a positive delay.
    * ``held``: copies currently held or waiting to be received.

    Statistics of several sockets add up with ``+``.
    """

    sent: int = 0
    received: int = 0
    delivered: int = 0
    dropped_loss: int = 0
    dropped_partition: int = 0
    dropped_overflow: int = 0
    dropped_error: int = 0
    duplicated: int = 0
    reordered: int = 0
    delayed: int = 0
    held: int = 0

    def __add__(self, other: FaultStatistics) -> FaultStatistics:
        if not isinstance(other, FaultStatistics):
            return NotImplemented
        return FaultStatistics(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(self))
        )


class _Datagram(NamedTuple):
    data: bytes
    peer: DatagramAddr
    ecn: int | None


class _Counters:
    """Mutable counters behind :class:`FaultStatistics` (guarded by the socket's lock)."""

    __slots__ = (
        "delayed",
        "delivered",
        "dropped_error",
        "dropped_loss",
        "dropped_overflow",
        "dropped_partition",
        "duplicated",
        "received",
        "reordered",
        "sent",
    )

    def __init__(self) -> None:
        self.sent = self.received = self.delivered = 0
        self.dropped_loss = self.dropped_partition = self.dropped_overflow = 0
        self.dropped_error = self.duplicated = self.reordered = self.delayed = 0

    def decided(self, decision: FaultDecision, admission: Admission) -> None:
        if decision.duplicated:
            self.duplicated += 1
        if decision.reordered:
            self.reordered += 1
        self.delayed += admission.delayed
        self.dropped_overflow += admission.dropped


class FaultySocket(DatagramSocket):
    """A :class:`~chrysalis.datagram.DatagramSocket` that applies a :class:`FaultPlan` to the
    traffic of ``inner`` (any carrier) and can partition peers at run time.

    The socket owns ``inner``: ``shutdown`` and ``join`` cascade to it. ``clock`` is the time
    source for delays (seconds, monotonic); inject a fake one together with
    ``timer_thread=False`` and call :meth:`handle_timer` to step time by hand. The local address,
    descriptors, limits and send wakers are the inner socket's (see the module docstring for how
    receive readiness covers held datagrams). With a transparent plan and no partition every
    call goes straight to ``inner``.
    """

    def __init__(
        self,
        inner: DatagramSocket,
        plan: FaultPlan,
        *,
        clock: Callable[[], float] = time.monotonic,
        timer_thread: bool = True,
    ) -> None:
        if not isinstance(inner, DatagramSocket):
            raise TypeError(f"FaultySocket wraps a DatagramSocket, not {type(inner).__name__}")
        if not isinstance(plan, FaultPlan):
            raise TypeError(f"FaultySocket needs a FaultPlan, not {type(plan).__name__}")
        self._inner = inner
        self._plan = plan
        self._clock = clock
        self._timer_thread_enabled = timer_thread
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._send_schedule: FaultSchedule[_Datagram] | None = (
            FaultSchedule(plan.derive("send")) if plan.faults_send else None
        )
        self._recv_schedule: FaultSchedule[_Datagram] | None = (
            FaultSchedule(plan.derive("receive")) if plan.faults_receive else None
        )
        self._partitioned: frozenset[DatagramAddr] = frozenset()
        self._ready: deque[_Datagram] = deque()
        self._pending_error: OSError | None = None
        self._scratch: bytearray | None = None
        self._recv_waker: Waker | None = None
        self._closed = False
        self._shut = threading.Event()
        self._thread: threading.Thread | None = None
        self._counts = _Counters()

    # -- identity, configuration ---------------------------------------------------------------

    @property
    def inner(self) -> DatagramSocket:
        """The wrapped socket."""
        return self._inner

    @property
    def plan(self) -> FaultPlan:
        """The fault plan (fixed for the socket's lifetime)."""
        return self._plan

    @property
    def local_addr(self) -> DatagramAddr:
        """The inner socket's address: what peers see, and what they partition."""
        return self._inner.local_addr

    # -- partitions --------------------------------------------------------------------------

    def partition(self, *peers: DatagramAddr) -> None:
        """Drop all traffic to and from ``peers`` (added to those already partitioned) until
        :meth:`heal`. Held copies to or from them are dropped when they come due. Raises
        ``TypeError`` for a non-address and ``ValueError`` beyond
        :data:`MAX_PARTITIONED_PEERS` peers."""
        for peer in peers:
            if not isinstance(peer, DatagramAddr):
                raise TypeError(f"partition() takes DatagramAddr values, not {type(peer).__name__}")
        with self._lock:
            merged = self._partitioned.union(peers)
            if len(merged) > MAX_PARTITIONED_PEERS:
                raise ValueError(f"at most {MAX_PARTITIONED_PEERS} peers may be partitioned")
            self._partitioned = merged

    def heal(self, *peers: DatagramAddr) -> None:
        """Restore traffic with ``peers``, or with every peer when none are given."""
        with self._lock:
            self._partitioned = self._partitioned.difference(peers) if peers else frozenset()

    @property
    def partitioned(self) -> frozenset[DatagramAddr]:
        """The peers currently partitioned away."""
        return self._partitioned

    # -- statistics ----------------------------------------------------------------------------

    def statistics(self) -> FaultStatistics:
        """A consistent snapshot of the counters (see :class:`FaultStatistics`)."""
        with self._lock:
            c = self._counts
            held = len(self._ready)
            for schedule in (self._send_schedule, self._recv_schedule):
                if schedule is not None:
                    held += schedule.held
            return FaultStatistics(
                sent=c.sent,
                received=c.received,
                delivered=c.delivered,
                dropped_loss=c.dropped_loss,
                dropped_partition=c.dropped_partition,
                dropped_overflow=c.dropped_overflow,
                dropped_error=c.dropped_error,
                duplicated=c.duplicated,
                reordered=c.reordered,
                delayed=c.delayed,
                held=held,
            )

    # -- sending -----------------------------------------------------------------------------

    def try_send_to(self, data: bytes | bytearray | memoryview, destination: DatagramAddr) -> bool:
        """Send ``data`` to ``destination`` through the fault plan (see the class docs).

        Returns ``False`` only when the inner carrier would block on an immediate copy.
        Raises what the inner carrier raises for immediate copies, and
        :class:`DatagramTooLargeError` / :class:`SocketClosedError` itself.
        """
        if self._closed:
            raise SocketClosedError()
        if self._send_schedule is None and not self._partitioned:
            ok = self._inner_send(data, destination, None)
            if ok:
                with self._lock:
                    self._counts.sent += 1
                    self._counts.delivered += 1
            return ok
        with self._lock:
            return self._send_one(data, destination, None)

    def try_send_transmit(self, transmit: DatagramTransmit) -> int:
        """Send the leading datagrams of ``transmit``; each segment gets its own fault decision.

        Returns how many were accepted (``0``: would block before any); errors are raised only
        when nothing was accepted, as the contract requires.
        """
        if self._closed:
            raise SocketClosedError()
        if self._send_schedule is None and not self._partitioned:
            sent = self._inner_send_transmit(transmit)
            if sent:
                with self._lock:
                    self._counts.sent += sent
                    self._counts.delivered += sent
            return sent
        count = min(transmit.segment_count, DATAGRAM_BATCH_SIZE)
        accepted = 0
        with self._lock:
            for index in range(count):
                try:
                    ok = self._send_one(transmit.segment(index), transmit.destination, transmit.ecn)
                except SocketClosedError:
                    raise
                except OSError:
                    if accepted == 0:
                        raise
                    break
                if not ok:
                    break
                accepted += 1
        return accepted

    def _send_one(
        self, data: bytes | bytearray | memoryview, destination: DatagramAddr, ecn: int | None
    ) -> bool:
        """One datagram through partitions and the send schedule (lock held)."""
        self._check()
        if len(data) > MAX_DATAGRAM_SIZE:
            raise DatagramTooLargeError(
                f"datagram of {len(data)} bytes exceeds MAX_DATAGRAM_SIZE ({MAX_DATAGRAM_SIZE})"
            )
        counts = self._counts
        if destination in self._partitioned:
            counts.sent += 1
            counts.dropped_partition += 1
            return True
        schedule = self._send_schedule
        if schedule is None:
            ok = self._inner_send(data, destination, ecn)
            if ok:
                counts.sent += 1
                counts.delivered += 1
            return ok
        now = self._clock()
        self._flush_send(schedule, now)  # what is already due leaves first
        decision = schedule.decide()
        if decision.lost:
            counts.sent += 1
            counts.dropped_loss += 1
            return True
        immediate = decision.immediate_copies
        if immediate:
            if not self._inner_send(data, destination, ecn):
                return False  # would block: not accepted, the caller retries
            counts.delivered += 1
            if immediate > 1:
                self._send_released(_Datagram(bytes(data), destination, ecn))
        counts.sent += 1
        schedule.note_arrival(now)
        admission = Admission(0, 0, 0)
        if decision.copies > immediate:
            admission = schedule.hold(_Datagram(bytes(data), destination, ecn), decision, now)
        counts.decided(decision, admission)
        self._flush_send(schedule, now)  # copies this arrival released go after it
        if admission.held:
            self._arm_timer()
        return True

    def _flush_send(self, schedule: FaultSchedule[_Datagram], now: float) -> None:
        for item in schedule.poll(now):
            self._send_released(item)

    def _send_released(self, item: _Datagram) -> None:
        """Send a copy that is no longer the caller's (lock held); failures are counted."""
        counts = self._counts
        if item.peer in self._partitioned:
            counts.dropped_partition += 1
            return
        try:
            ok = self._inner_send(item.data, item.peer, item.ecn)
        except SocketClosedError:
            raise
        except OSError:
            counts.dropped_error += 1
            return
        if ok:
            counts.delivered += 1
        else:
            counts.dropped_overflow += 1

    def _inner_send(
        self, data: bytes | bytearray | memoryview, destination: DatagramAddr, ecn: int | None
    ) -> bool:
        try:
            if ecn is None:
                return self._inner.try_send_to(data, destination)
            return self._inner.try_send_transmit(DatagramTransmit(destination, data, None, ecn)) > 0
        except SocketClosedError:
            self.shutdown()
            raise

    def _inner_send_transmit(self, transmit: DatagramTransmit) -> int:
        try:
            return self._inner.try_send_transmit(transmit)
        except SocketClosedError:
            self.shutdown()
            raise

    # -- receiving ---------------------------------------------------------------------------

    def _recv_passthrough(self) -> bool:
        return (
            self._recv_schedule is None
            and not self._partitioned
            and not self._ready
            and self._pending_error is None
        )

    def try_recv(
        self, buffers: Sequence[bytearray | memoryview | mmap.mmap], metas: list[DatagramRecvMeta]
    ) -> int:
        """Receive through the fault plan; the contract of ``DatagramSocket.try_recv``.

        While receive faults or partitions are active, each buffer holds one datagram
        (aggregates from the inner carrier are split).
        """
        if self._closed:
            raise SocketClosedError()
        limit = min(len(buffers), DATAGRAM_BATCH_SIZE)
        if limit == 0:
            return 0
        if self._recv_passthrough():
            with self._lock:
                if self._recv_passthrough():
                    return self._inner_recv_counted(buffers, metas)
        with self._lock:
            self._check()
            self._fill_ready(limit)
            ready = self._ready
            filled = 0
            while filled < limit and ready:
                item = ready[0]
                buffer = buffers[filled]
                size = len(item.data)
                if size > len(buffer):
                    if filled:
                        break  # report what was filled; the next call raises
                    ready.popleft()
                    self._counts.delivered += 1
                    raise InvalidDataError(
                        f"datagram of {size} bytes exceeds the {len(buffer)}-byte buffer"
                    )
                ready.popleft()
                buffer[:size] = item.data
                metas.append(DatagramRecvMeta(item.peer, size, size, item.ecn))
                filled += 1
            self._counts.delivered += filled
            if filled == 0 and self._pending_error is not None:
                error, self._pending_error = self._pending_error, None
                raise error
            return filled

    def try_recv_from(self) -> tuple[bytes, DatagramAddr] | None:
        """Receive one whole datagram through the fault plan, or ``None``."""
        if self._closed:
            raise SocketClosedError()
        if self._recv_passthrough():
            with self._lock:
                if self._recv_passthrough():
                    got = self._inner_call(self._inner.try_recv_from)
                    if got is not None:
                        self._counts.received += 1
                        self._counts.delivered += 1
                    return got
        with self._lock:
            self._check()
            self._fill_ready(1)
            if self._ready:
                item = self._ready.popleft()
                self._counts.delivered += 1
                return item.data, item.peer
            if self._pending_error is not None:
                error, self._pending_error = self._pending_error, None
                raise error
            return None

    def _inner_recv_counted(
        self, buffers: Sequence[bytearray | memoryview | mmap.mmap], metas: list[DatagramRecvMeta]
    ) -> int:
        start = len(metas)
        filled = self._inner_try_recv(buffers, metas)
        datagrams = sum(meta.segment_count for meta in metas[start:])
        self._counts.received += datagrams
        self._counts.delivered += datagrams
        return filled

    def _fill_ready(self, limit: int) -> None:
        """Top the ready queue up to ``limit`` from due held copies, then from the inner
        carrier (at most one batch of inner datagrams per call). Lock held."""
        ready = self._ready
        if len(ready) >= limit:
            return
        now = self._clock()
        schedule = self._recv_schedule
        if schedule is not None:
            self._take_due(schedule, now, limit)
        pulled = 0
        metas: list[DatagramRecvMeta] = []
        while len(ready) < limit and pulled < DATAGRAM_BATCH_SIZE and self._pending_error is None:
            scratch = self._scratch
            if scratch is None:
                scratch = self._scratch = bytearray(MAX_DATAGRAM_SIZE)
            metas.clear()
            try:
                count = self._inner_try_recv((scratch,), metas)
            except SocketClosedError:
                raise
            except OSError as exc:
                if not ready:
                    raise
                self._pending_error = exc  # raised after the datagrams before it
                break
            if count == 0:
                break
            meta = metas[0]
            for segment in meta.segments(scratch):
                pulled += 1
                self._arrive(_Datagram(bytes(segment), meta.source, meta.ecn), now, limit)

    def _arrive(self, item: _Datagram, now: float, limit: int) -> None:
        """One datagram read from the inner carrier (lock held)."""
        counts = self._counts
        counts.received += 1
        if item.peer in self._partitioned:
            counts.dropped_partition += 1
            return
        schedule = self._recv_schedule
        if schedule is None:
            self._ready.append(item)
            return
        decision = schedule.decide()
        if decision.lost:
            counts.dropped_loss += 1
            return
        immediate = decision.immediate_copies
        for _ in range(immediate):
            self._ready.append(item)
        schedule.note_arrival(now)
        admission = Admission(0, 0, 0)
        if decision.copies > immediate:
            admission = schedule.hold(item, decision, now)
        counts.decided(decision, admission)
        self._take_due(schedule, now, limit)  # copies this arrival released go after it
        if admission.held:
            self._arm_timer()

    def _take_due(self, schedule: FaultSchedule[_Datagram], now: float, limit: int) -> None:
        room = limit - len(self._ready)
        if room <= 0:
            return
        for item in schedule.poll(now, room):
            if item.peer in self._partitioned:
                self._counts.dropped_partition += 1
            else:
                self._ready.append(item)

    # -- readiness ---------------------------------------------------------------------------

    def fileno(self) -> int | None:
        """The inner socket's descriptor (held datagrams are signalled by the receive waker)."""
        return self._inner.fileno()

    def readiness_fds(self) -> list[int]:
        """The inner socket's readiness descriptors."""
        return self._inner.readiness_fds()

    def send_readiness_fd(self, destination: DatagramAddr) -> int | None:
        """The inner socket's send readiness descriptor for ``destination``."""
        return self._inner.send_readiness_fd(destination)

    def add_recv_waker(self, waker: Waker) -> None:
        """Register the one-shot receive waker: called when the inner socket signals data (for
        descriptor-less carriers), when a held datagram comes due, and on shutdown; called at
        once when something is already deliverable or the socket is shut down."""
        wake = once(waker)
        with self._lock:
            now_ready = self._closed or bool(self._ready) or self._pending_error is not None
            schedule = self._recv_schedule
            if not now_ready and schedule is not None:
                due = schedule.next_due()
                now_ready = due is not None and due <= self._clock()
            if not now_ready:
                self._recv_waker = wake
                self._cond.notify_all()
        if now_ready:
            wake()
            return
        self._inner.add_recv_waker(wake)

    def add_send_waker(self, destination: DatagramAddr, waker: Waker) -> None:
        """Register the one-shot send waker for ``destination`` with the inner socket (called
        at once when shut down, or when ``destination`` is partitioned: such sends never
        block)."""
        wake = once(waker)
        if self._closed or destination in self._partitioned:
            wake()
            return
        self._inner.add_send_waker(destination, wake)

    # -- limits ------------------------------------------------------------------------------

    @property
    def max_transmit_segments(self) -> int:
        """The inner socket's value (faulted transmits are split by the wrapper)."""
        return self._inner.max_transmit_segments

    @property
    def max_receive_segments(self) -> int:
        """The inner socket's value (an upper bound: faulted receives are split)."""
        return self._inner.max_receive_segments

    @property
    def may_fragment(self) -> bool:
        """The inner socket's value."""
        return self._inner.may_fragment

    # -- timers ------------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        """When (on the socket's clock) the next held copy comes due, in either direction, or
        ``None`` when nothing is held."""
        with self._lock:
            dues = [
                due
                for schedule in (self._send_schedule, self._recv_schedule)
                if schedule is not None and (due := schedule.next_due()) is not None
            ]
            return min(dues) if dues else None

    def handle_timer(self) -> None:
        """Act on what is due by the clock now: send due held copies to the inner carrier and
        call the receive waker when a held received datagram is due.

        The timer thread calls this; with ``timer_thread=False`` the owner does. Does nothing
        after shutdown.
        """
        waker: Waker | None = None
        with self._lock:
            if self._closed:
                return
            now = self._clock()
            if self._send_schedule is not None:
                try:
                    self._flush_send(self._send_schedule, now)
                except SocketClosedError:
                    return
            schedule = self._recv_schedule
            if schedule is not None and self._recv_waker is not None:
                due = schedule.next_due()
                if due is not None and due <= now:
                    waker, self._recv_waker = self._recv_waker, None
        if waker is not None:
            waker()

    def _arm_timer(self) -> None:
        """Make sure the timer thread runs and sees the new deadline (lock held)."""
        if not self._timer_thread_enabled or self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run_timer, name=f"faultnet-timer {self.local_addr}", daemon=True
            )
            self._thread.start()
        self._cond.notify_all()

    def _timer_wait(self) -> float:
        """Seconds until the timer has work, or ``0.0`` when it has work now (lock held)."""
        dues: list[float] = []
        send, recv = self._send_schedule, self._recv_schedule
        if send is not None and (due := send.next_due()) is not None:
            dues.append(due)
        # A due received datagram matters only to a registered waker; add_recv_waker checks for
        # already-due datagrams itself, so the thread never spins on one nobody waits for.
        if (
            recv is not None
            and self._recv_waker is not None
            and (due := recv.next_due()) is not None
        ):
            dues.append(due)
        if not dues:
            return _TIMER_IDLE_WAIT
        return max(0.0, min(min(dues) - self._clock(), TIMER_MAX_WAIT))

    def _run_timer(self) -> None:
        while True:
            if self._inner.is_shutdown and not self._closed:
                self.shutdown()  # the inner socket was shut down directly: follow it
            with self._cond:
                if self._closed:
                    return
                wait = self._timer_wait()
                if wait > 0.0:
                    self._cond.wait(wait)
                    continue  # re-check: shut down, woken for a new deadline, or due now
            self.handle_timer()

    # -- lifecycle ---------------------------------------------------------------------------

    def _check(self) -> None:
        if self._closed:
            raise SocketClosedError()

    def _inner_call(self, call: Callable[[], _R]) -> _R:
        try:
            return call()
        except SocketClosedError:
            self.shutdown()
            raise

    def _inner_try_recv(
        self, buffers: Sequence[bytearray | memoryview | mmap.mmap], metas: list[DatagramRecvMeta]
    ) -> int:
        try:
            return self._inner.try_recv(buffers, metas)
        except SocketClosedError:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        """Shut down the wrapper and the inner socket; wake every waker and the timer thread;
        discard held copies. Idempotent and non-blocking."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waker, self._recv_waker = self._recv_waker, None
            for schedule in (self._send_schedule, self._recv_schedule):
                if schedule is not None:
                    schedule.clear()
            self._ready.clear()
            self._cond.notify_all()
        self._shut.set()
        try:
            self._inner.shutdown()
        finally:
            if waker is not None:
                waker()

    @property
    def is_shutdown(self) -> bool:
        """Whether this socket (or its inner socket) was shut down."""
        return self._closed or self._inner.is_shutdown

    def join(self, timeout: float | None = None) -> bool:
        """Wait for shutdown, then for the timer thread to end and the inner socket to release
        its resources; ``False`` if ``timeout`` seconds (real time) passed first."""
        if not self._closed and self._inner.is_shutdown:
            self.shutdown()  # the inner socket was shut down directly: follow it
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._shut.wait(timeout):
            return False
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_remaining(deadline))
            if thread.is_alive():
                return False
        return self._inner.join(_remaining(deadline))


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())
