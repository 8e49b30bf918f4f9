"""The runtime-neutral half of the asyncio and trio adapters: the I/O step (``EndpointDriver``,
``ThreadNotifier``) and the construction both adapters share (``EndpointSettings``).

The rest of that half lives beside it, one concept per module: ``_errors`` (every public QUIC
exception), ``_stream_core`` (``StreamCore``) and ``_endpoint_core`` (the runtime seam,
``ConnectionCore``, the views, the accept queues, ``EndpointCore``). This module re-exports
their names, so imports from ``chrysalis.quic._driver`` keep working.

Why one module for both runtimes: a ``QuicEndpoint`` is sans-IO, so *something* must move
datagrams between it and a carrier, and *something* must turn its completions back into
awaitable results. Neither job depends on the event loop, so both live here once:

* ``EndpointDriver`` is the I/O step: drain the socket (up to a few batches of
  ``DATAGRAM_BATCH_SIZE``), feed every datagram, fire due timers, ``poll`` the endpoint, then
  flush its output **once**, regrouping consecutive datagrams to one destination with equal
  size into one segmented transmit (GSO on UDP), and report the one deadline to wait for. The
  step can run inline on an event loop (the adapters' default) or on a dedicated thread
  (``run_forever``, which waits with ``select`` on the socket and a self-pipe notifier).
* ``EndpointCore`` dispatches completions (always on the event loop's thread) to the objects
  waiting for them, and holds the per-connection and per-stream state behind the adapters'
  ``Connection`` and ``Stream`` objects. Its awaitable methods use only two primitives, which
  both runtimes provide: ``await event.wait()`` on an event made by the adapter's ``Runtime``,
  and ``await wakeup.wait_async(epoch)`` on the completion model's ``Wakeup``.

Fixes of the reference adapter's recorded defects (spec 4.7):

* **No stop-and-wait.** A write is *admitted*, not acknowledged, before it returns: each
  stream keeps up to ``write_high_water`` unacknowledged bytes in flight and only ``drain``
  (or ``send_all``) waits, and only when that bound is reached.
* **A slow acceptor stalls nothing.** Incoming streams go to bounded accept queues (a total
  and a per-peer bound); a stream that does not fit is refused (STOP_SENDING and RESET with
  ``REFUSED_STREAM_CODE``) instead of blocking completion dispatch.
* **No busy spin.** A submission refused with ``WouldBlock`` waits on exactly the released
  bound (``WouldBlock.released``); a write that could not be submitted at once is retried
  after the next batch of completions.
* **One stuck destination delays no other, and is never polled for writability.** Output
  the carrier refuses ("would block") for destination D goes to D's own bounded *hold*
  (``HOLD_PER_DESTINATION`` datagrams; past it the oldest are dropped and counted); later
  output for D queues behind it (D's order is kept) while every other destination's goes
  out at once. D is retried on a timer, not on writability: an unconnected Unix datagram
  socket reports "writable" while the *receiver's* queue is full (a SIGSTOPped leaf), so
  waiting for writability spun at 100% CPU, and the one FIFO for all destinations stopped
  every send behind D's. The retry delay starts at ``HOLD_RETRY_FIRST`` (50 us) and doubles
  per refused retry up to ``HOLD_RETRY_MAX`` (8 ms); an accepted retry ends the hold. The
  earliest retry is folded into ``deadline``; a step that runs earlier for any other reason
  also retries a destination whose delay has passed, and a datagram received from D (it
  reads again: its acknowledgements come back) makes D due at once, its delay reset (at
  most one attempt per destination per step).
* **No per-operation map.** Operations on a stream complete in submission order, so a stream
  only keeps counters (bytes in flight, one posted receive); completions are routed by their
  stream with one dictionary lookup.

Received data moves out of the endpoint eagerly: every stream keeps one receive posted (while
the completion credits allow it) and buffers at most ``read_ahead`` bytes, so data the peer
sent just before closing its connection is not lost in the endpoint's buffers.
"""

from __future__ import annotations

import mmap
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypedDict, final

from chrysalis.core import DatagramAddr, Pid
from chrysalis.core.completion import (
    EVENT_CREDIT_CAPACITY,
    ConnectionRef,
    EndpointChannels,
    Notifier,
    SubmissionLimits,
    next_driver_id,
)
from chrysalis.datagram import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    DatagramSocket,
    DatagramTransmit,
    InvalidDataError,
    SocketClosedError,
    SwitchSocket,
    UdpSocket,
    UnixDatagramSocket,
)
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._endpoint import (
    ConnectionStatistics,
    EndpointRole,
    EndpointStatistics,
    QuicCommand,
    QuicEndpoint,
)

# The errors, the stream core and the endpoint core moved out of this module; they are
# re-exported here so that imports from ``chrysalis.quic._driver`` keep working.
from chrysalis.quic._endpoint_core import (
    DEFAULT_ACCEPT_BACKLOG,
    DEFAULT_PEER_ACCEPT_BACKLOG,
    DEFAULT_READ_AHEAD,
    DEFAULT_WRITE_BUFFER_LIMIT,
    DEFAULT_WRITE_HIGH_WATER,
    REFUSED_STREAM_CODE,
    AdapterOptions,
    AsyncEvent,
    ConnectionCore,
    ConnectionView,
    EndpointCore,
    EndpointFacade,
    EndpointView,
    Runtime,
)
from chrysalis.quic._engines import DEFAULT_ENGINE
from chrysalis.quic._engines.base import EngineFactory
from chrysalis.quic._errors import (
    ConnectError,
    ConnectionLostError,
    EndpointClosedError,
    IncompleteReadError,
    PeerAuthenticationError,
    QuicTransportError,
    ReadLimitError,
    StreamBrokenError,
    StreamClosedError,
    StreamResetError,
    WriteBufferFullError,
)
from chrysalis.quic._identity import Identity
from chrysalis.quic._stream_core import StreamCore

__all__ = [
    "DEFAULT_ACCEPT_BACKLOG",
    "DEFAULT_DRIVER_MODE",
    "DRIVER_MODES",
    "DEFAULT_PEER_ACCEPT_BACKLOG",
    "DEFAULT_READ_AHEAD",
    "DEFAULT_WRITE_BUFFER_LIMIT",
    "DEFAULT_WRITE_HIGH_WATER",
    "REFUSED_STREAM_CODE",
    "AdapterOptions",
    "AsyncEvent",
    "ConnectError",
    "ConnectionCore",
    "ConnectionView",
    "ConnectionLostError",
    "DriverStatistics",
    "EndpointClosedError",
    "EndpointCore",
    "EndpointDriver",
    "EndpointFacade",
    "EndpointSettings",
    "EndpointView",
    "SpawnOptions",
    "IncompleteReadError",
    "PeerAuthenticationError",
    "QuicTransportError",
    "ReadLimitError",
    "Runtime",
    "StreamBrokenError",
    "StreamClosedError",
    "StreamCore",
    "StreamResetError",
    "ThreadNotifier",
    "WriteBufferFullError",
    "thread_name",
]

_LONE_STEPS: Final = 4  # steps with one lone datagram before receiving one at a time
_LONE_RECHECK: Final = 8  # then every 8th step drains fully again
_LONE_LIMIT: Final = 1 << 20  # the counter wraps back to _LONE_STEPS here
_BULK_DATAGRAM: Final = 1000  # a datagram this large is taken as part of a bulk transfer
_THREAD_MAX_WAIT: Final = 1.0
HOLD_PER_DESTINATION: Final = 1024
"""Most datagrams held for one destination that refuses them; past it the oldest are dropped."""
HOLD_RETRY_FIRST: Final = 50e-6
"""Seconds before the first retry of a destination that refused (doubles per refusal)."""
HOLD_RETRY_MAX: Final = 0.008
"""The longest retry delay of a held destination."""


# --- the I/O step ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriverStatistics:
    """Counters of an ``EndpointDriver``.

    ``steps``: I/O steps run; ``datagrams_received`` / ``datagrams_sent``: datagrams fed to
    and accepted by the carrier; ``transmits``: carrier send calls that accepted something
    (a segmented transmit carries several datagrams); ``send_drops``: datagrams dropped
    because the carrier refused them or the output queue was full (QUIC retransmits);
    ``receive_errors``: carrier receive errors (oversized datagrams included);
    ``pending_datagrams``: datagrams held now (for destinations that refused them);
    ``datagrams_held``: datagrams ever put on hold; ``hold_drops``: held datagrams dropped
    because their destination's hold or the total bound was full (also in ``send_drops``);
    ``send_retries``: retries of held destinations (refused or not);
    ``held_destinations``: destinations held now.
    """

    steps: int
    datagrams_received: int
    datagrams_sent: int
    transmits: int
    send_drops: int
    receive_errors: int
    pending_datagrams: int
    socket_failed: bool
    datagrams_held: int
    hold_drops: int
    send_retries: int
    held_destinations: int


@final
class _Hold:
    """The datagrams held for one destination that refused them, oldest first, and when to
    retry it (the driver's clock)."""

    __slots__ = ("count", "delay", "retry_at", "transmits")

    def __init__(self, now: float) -> None:
        self.transmits: deque[DatagramTransmit] = deque()
        self.count = 0  # datagrams in ``transmits``
        self.delay = HOLD_RETRY_FIRST
        self.retry_at = now + HOLD_RETRY_FIRST


@final
class ThreadNotifier:
    """A ``Notifier`` that wakes a thread blocked in ``select`` (a self-pipe, coalesced).

    ``notify()`` writes one byte unless a wakeup is already pending; the driver thread calls
    ``clear()`` (drain the pipe, then reset the flag) *before* each step, so a notification
    that races with the step is either seen by it or wakes the next wait.
    """

    __slots__ = ("_flag", "_reader", "_writer")

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._flag = False

    def fileno(self) -> int:
        """The descriptor that becomes readable on ``notify``."""
        return self._reader.fileno()

    def notify(self) -> None:
        """Wake the driver thread (from any thread; never blocks)."""
        if self._flag:
            return
        self._flag = True
        try:  # noqa: SIM105 (hot path: no context manager)
            self._writer.send(b"\0")
        except OSError:  # full pipe (a wakeup is pending anyway) or closed
            pass

    def clear(self) -> None:
        """Consume pending wakeups; call before observing the state."""
        try:
            while self._reader.recv(4096):
                pass
        except OSError:
            pass
        self._flag = False

    def close(self) -> None:
        """Close both ends (idempotent)."""
        self._reader.close()
        self._writer.close()


@final
class EndpointDriver:
    """Moves datagrams between one ``QuicEndpoint`` and one ``DatagramSocket``.

    ``step()`` is the whole I/O cycle (see the module docstring) and never blocks; the caller
    waits for the socket (``socket.readiness_fds()`` or the receive waker), the channels'
    driver notifier, or ``deadline`` (which includes the retry of held destinations: the
    driver never asks to wait for writability, see the module docstring). ``step()`` returns
    True when it stopped draining at its batch limit (call it again soon).

    Args:
        endpoint: the endpoint to drive (this object becomes its only caller).
        socket: the carrier; errors sending to one destination drop those datagrams (QUIC
            recovers), a refusal ("would block") holds them (see the module docstring); a
            shut-down or broken socket calls ``on_socket_failure`` once (the adapters abort
            the endpoint then) and drops all further output.
        clock: monotonic seconds; the endpoint's ``now``.
        max_datagram_size: the largest datagram expected (the endpoint's
            ``max_udp_payload``); receive buffers are sized from it unless the socket
            delivers aggregates.
        receive_batches: carrier batches drained per step before the endpoint is polled.
        max_pending_datagrams: datagrams held in all (over every destination that would
            block); beyond it new output for a held destination drops that destination's
            oldest (or the new one). Each destination holds at most
            ``HOLD_PER_DESTINATION`` of them.
        threadsafe: False promises that every method is called from one thread (the inline
            drivers: the event loop's); ``step`` and ``flush`` then take no lock.
    """

    __slots__ = (
        "_buffers",
        "_clock",
        "_counters",
        "_deadline",
        "_drains_fully",
        "_endpoint",
        "_held",
        "_held_count",
        "_hold_limit",
        "_lock",
        "_lone",
        "_max_pending",
        "_max_segments",
        "_metas",
        "_one",
        "_pending",
        "_pending_count",
        "_receive_batches",
        "_retry_at",
        "_socket",
        "_socket_failed",
        "_views",
        "on_socket_failure",
    )

    def __init__(
        self,
        endpoint: QuicEndpoint,
        socket: DatagramSocket,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_datagram_size: int = 1472,
        receive_batches: int = 4,
        max_pending_datagrams: int = 4096,
        threadsafe: bool = True,
    ) -> None:
        self._endpoint = endpoint
        self._socket = socket
        self._clock = clock
        if socket.max_receive_segments > 1:
            size, count = MAX_DATAGRAM_SIZE, 8
        else:
            size, count = min(max(max_datagram_size, 1500), MAX_DATAGRAM_SIZE), DATAGRAM_BATCH_SIZE
        if isinstance(socket, SwitchSocket):
            # A switch binding (a node's socket) copies queued datagrams into any writable
            # buffer: one anonymous mapping, not ``count`` bytearrays. The kernel maps its
            # zero pages on first write, so only the pages datagrams land in are faulted in
            # and none is zeroed up front (issue 22 item 4: the bytearrays zeroed all 512 KiB
            # of a local node's buffers at its start, 128 page faults in each forked scale
            # worker). Carriers keep bytearrays: they batch ``recvmmsg`` only into those.
            # Private: a shared anonymous mapping is shared memory (each first write about a
            # third dearer), and a fork would share it with the child.
            arena = memoryview(mmap.mmap(-1, size * count, flags=mmap.MAP_PRIVATE))
            views = [arena[index * size : (index + 1) * size] for index in range(count)]
            self._buffers: list[bytearray] | list[memoryview] = views
            self._views = views
        else:
            buffers = [bytearray(size) for _ in range(count)]
            self._buffers = buffers
            self._views = [memoryview(buffer) for buffer in buffers]
        self._metas: list[Any] = []
        self._max_segments = max(1, min(socket.max_transmit_segments, DATAGRAM_BATCH_SIZE))
        self._receive_batches = max(1, receive_batches)
        # A lone receive (one datagram, or one GRO aggregate) from these carriers means their
        # queue is empty (their ``try_recv`` stops only at "would block", an error it defers,
        # or the batch limit; the UDP one also at a small buffer after large ones, which the
        # uniform buffers here never give it) and their descriptor is level-triggered, so
        # nothing is lost by not asking again: one system call less per request/response
        # step. A fuller batch
        # is a stream of data: keep draining (more data per step, fewer acknowledgements).
        # Other carriers are asked until they return nothing.
        self._drains_fully = isinstance(socket, UdpSocket | UnixDatagramSocket) and bool(
            socket.readiness_fds()
        )
        # Request/response traffic: once several steps in a row found at most one lone
        # datagram, a step asks the carrier for one datagram only, which spares its second,
        # empty system call (and the exception that reports it); more queued input re-fires
        # the level-triggered descriptor. Every ``_LONE_RECHECK``-th step drains fully
        # again, and a fuller batch, a GRO aggregate or a full-size datagram (bulk data,
        # not a request, a response or an acknowledgement) returns to full draining at once,
        # as does a step that sends more than two datagrams (its acknowledgements will come
        # in bursts).
        self._one = self._buffers[:1]
        self._lone = 0
        self._max_pending = max(1, max_pending_datagrams)
        # ``_pending`` is the flush's working queue (empty between flushes); what a
        # destination refused waits in its ``_Hold``.
        self._pending: deque[DatagramTransmit] = deque()
        self._pending_count = 0
        self._held: dict[DatagramAddr, _Hold] = {}
        self._held_count = 0
        self._hold_limit = min(HOLD_PER_DESTINATION, self._max_pending)
        self._retry_at = 0.0  # the earliest ``retry_at`` of ``_held`` (when it is not empty)
        self._deadline: float | None = None
        self._socket_failed = False
        # ``threadsafe=False`` (the inline drivers): every call comes from the event loop's
        # thread, so ``step`` and ``flush`` skip the lock (an uncontended ``with lock:`` still
        # costs about ten Python calls' worth of time, twice per request/response step).
        self._lock: threading.Lock | None = threading.Lock() if threadsafe else None
        # steps, received, sent, transmits, drops, errors, held, hold drops, retries
        self._counters = [0, 0, 0, 0, 0, 0, 0, 0, 0]
        self.on_socket_failure: Callable[[], None] | None = None

    @property
    def endpoint(self) -> QuicEndpoint:
        """The driven endpoint (only touch it from the driver's thread)."""
        return self._endpoint

    @property
    def socket(self) -> DatagramSocket:
        """The carrier."""
        return self._socket

    @property
    def clock(self) -> Callable[[], float]:
        """The clock the endpoint runs on."""
        return self._clock

    @property
    def deadline(self) -> float | None:
        """When the next step must run at the latest (the endpoint's timer), or None."""
        return self._deadline

    @property
    def held_destinations(self) -> tuple[DatagramAddr, ...]:
        """The destinations whose datagrams are held (retried by ``deadline``)."""
        return tuple(self._held)

    @property
    def socket_failed(self) -> bool:
        """True once the carrier was found shut down or broken."""
        return self._socket_failed

    def statistics(self) -> DriverStatistics:
        """An immutable snapshot of the driver's counters."""
        c = self._counters
        return DriverStatistics(
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            self._held_count + self._pending_count,
            self._socket_failed,
            c[6],
            c[7],
            c[8],
            len(self._held),
        )

    def endpoint_statistics(self) -> EndpointStatistics:
        """The endpoint's statistics (safe from any thread when ``threadsafe``: taken between
        steps)."""
        lock = self._lock
        if lock is None:
            return self._endpoint.statistics()
        with lock:
            return self._endpoint.statistics()

    def connection_gone(self, connection: ConnectionRef) -> bool:
        """True once the endpoint forgot ``connection`` (see ``QuicEndpoint.knows_connection``;
        safe from any thread when ``threadsafe``: a step in progress finishes first)."""
        lock = self._lock
        if lock is None:
            return not self._endpoint.knows_connection(connection)
        with lock:
            return not self._endpoint.knows_connection(connection)

    def connection_statistics(self, connection: ConnectionRef) -> ConnectionStatistics | None:
        """One connection's statistics, or None (safe from any thread when ``threadsafe``)."""
        lock = self._lock
        if lock is None:
            return self._endpoint.connection_statistics(connection)
        with lock:
            return self._endpoint.connection_statistics(connection)

    def step(self, *, flush: bool = True) -> bool:
        """Run one I/O cycle now; True if the socket may hold more input.

        With ``flush=False`` the output stays in the endpoint until ``flush()``: an inline
        driver first lets the tasks that the new completions woke run, so that their replies
        leave in the same packets as the acknowledgements of what they answer.
        """
        # The cycle is written out here, not behind a helper taken with or without the lock:
        # one Python frame less per step (the inline drivers' every wake-up). ``acquire``
        # and ``try``/``finally`` are ``with lock:`` spelt out.
        lock = self._lock
        if lock is not None:
            lock.acquire()
        try:
            now = self._clock()
            endpoint = self._endpoint
            self._counters[0] += 1
            more = False if self._socket_failed else self._receive(now)
            # The cached deadlines suffice here (no engine is asked): a timer that the
            # datagrams just received made due is seen by the flush's ``get_timer``.
            if endpoint.timer_due(now):
                endpoint.handle_timer(now)
            endpoint.poll(now)
            if flush:
                self._flush(now)
                deadline = endpoint.get_timer()
                self._deadline = self._with_retry(deadline) if self._held else deadline
            return more
        finally:
            if lock is not None:
                lock.release()

    def flush(self, *, poll: bool = True) -> None:
        """Admit new submissions (``poll``), send the endpoint's output once and update
        ``deadline``.

        ``poll=False`` skips admission: for an inline driver whose ``step(flush=False)`` woke
        no task, so that nothing can have been submitted since that step's own ``poll``.
        """
        lock = self._lock  # written out as in ``step``: one frame less per flush
        if lock is not None:
            lock.acquire()
        try:
            now = self._clock()
            endpoint = self._endpoint
            if poll:
                endpoint.poll(now)
            self._flush(now)
            deadline = endpoint.get_timer()
            self._deadline = self._with_retry(deadline) if self._held else deadline
        finally:
            if lock is not None:
                lock.release()

    def admit(self) -> None:
        """Admit new submissions (a poll) and flush only if that gave an engine something to
        send (a posted receive can complete at once from buffered bytes, and consuming them
        may open the peer's window): ``flush`` without its usually empty second half."""
        lock = self._lock
        if lock is None:
            self._admit()
            return
        with lock:
            self._admit()

    def _admit(self) -> None:
        now = self._clock()
        endpoint = self._endpoint
        endpoint.poll(now)
        if endpoint._dirty or endpoint._outbox:  # ``has_output`` without the property call
            self._flush(now)
            deadline = endpoint.get_timer()
            self._deadline = self._with_retry(deadline) if self._held else deadline

    def _with_retry(self, deadline: float | None) -> float:
        """``deadline`` or the earliest retry of a held destination, whichever is first."""
        retry = self._retry_at
        return retry if deadline is None or retry < deadline else deadline

    def _receive(self, now: float) -> bool:
        sock = self._socket
        buffers = self._buffers
        views = self._views
        metas = self._metas
        # While output is held, a datagram from a held destination says that it reads again:
        # it is retried in this step's flush (no cost while nothing is held).
        feed = self._feed_waking if self._held else self._endpoint.receive_datagram
        counters = self._counters
        drains_fully = self._drains_fully
        lone = self._lone
        single = drains_fully and lone >= _LONE_STEPS and lone % _LONE_RECHECK
        if drains_fully:
            self._lone = lone + 1 if lone < _LONE_LIMIT else _LONE_STEPS
        batches = self._receive_batches
        while batches:
            batches -= 1
            metas.clear()
            try:
                count = sock.try_recv(self._one if single else buffers, metas)
            except InvalidDataError:
                counters[5] += 1
                continue
            except SocketClosedError:
                self._fail_socket()
                return False
            except OSError:
                counters[5] += 1
                if sock.is_shutdown:
                    self._fail_socket()
                return False
            if not count:
                return False
            if count == 1:
                # One plain datagram (every request/response step): fed without the loop
                # below; the same decisions as there, for ``count == 1``.
                meta = metas[0]
                length = meta.length
                stride = meta.stride
                if stride <= 0 or stride >= length:
                    counters[1] += 1
                    feed(bytes(views[0][:length]), meta.source, now)
                    if not drains_fully:
                        continue
                    if length >= _BULK_DATAGRAM:
                        self._lone = 0  # part of a stream of data: drain fully
                        if single:
                            single = False
                            continue  # and drain the rest of this burst now
                    # A lone datagram: the queue is empty (the batch holds at least 8).
                    return False
            bulk = False  # a GRO aggregate or a full-size datagram: part of a stream of data
            for index in range(count):
                meta = metas[index]
                view = views[index]
                length = meta.length
                stride = meta.stride
                source = meta.source
                if stride <= 0 or stride >= length:
                    counters[1] += 1
                    if length >= _BULK_DATAGRAM:
                        bulk = True
                    feed(bytes(view[:length]), source, now)
                else:
                    bulk = True
                    for start in range(0, length, stride):
                        counters[1] += 1
                        feed(bytes(view[start : min(start + stride, length)]), source, now)
            if drains_fully:
                if count > 1 or bulk:
                    self._lone = 0  # a stream of data: drain fully
                    if single:
                        single = False
                        continue  # and drain the rest of this burst now
                if single or count == 1:  # (the batch holds 8 or 32 buffers)
                    return False
        return True

    def _feed_waking(self, data: bytes, source: DatagramAddr, now: float) -> None:
        hold = self._held.get(source)
        if hold is not None and hold.retry_at > now:
            hold.delay = HOLD_RETRY_FIRST
            hold.retry_at = now
            self._retry_at = now
        self._endpoint.receive_datagram(data, source, now)

    def _fail_socket(self) -> None:
        if self._socket_failed:
            return
        self._socket_failed = True
        callback = self.on_socket_failure
        if callback is not None:
            callback()
        self._counters[4] += self._pending_count + self._held_count
        self._pending.clear()
        self._pending_count = 0
        self._held = {}
        self._held_count = 0

    def _flush(self, now: float) -> None:
        batch = self._endpoint.datagrams_to_send(now)
        if self._socket_failed:
            self._counters[4] += len(batch)
            return
        held = self._held
        if len(batch) == 1 and not held:
            # One datagram and nothing held (every request/response step): send it straight
            # away, without building a transmit. A refusal holds it.
            data, destination = batch[0]
            counters = self._counters
            try:
                sent = self._socket.try_send_to(data, destination)
            except SocketClosedError:
                self._fail_socket()
                return
            except OSError:  # this destination refused (unreachable, gone, too large)
                counters[4] += 1
                return
            if sent:
                counters[2] += 1
                counters[3] += 1
            else:
                self._hold(DatagramTransmit(destination, data), now)
            return
        if held and now >= self._retry_at and not self._retry_held(now):
            self._counters[4] += len(batch)  # the socket failed
            return
        if not batch:
            return
        if len(batch) > 2:
            self._lone = 0  # sending a stream of data: its acknowledgements come in bursts
        self._queue(batch)
        pending = self._pending
        sock = self._socket
        counters = self._counters
        while pending:
            transmit = pending[0]
            count = transmit.segment_count
            if held and transmit.destination in held:
                pending.popleft()  # behind what its destination holds: keeps its order
                self._pending_count -= count
                self._hold(transmit, now)
                continue
            try:
                accepted = sock.try_send_transmit(transmit)
            except SocketClosedError:
                self._fail_socket()
                return
            except OSError:  # this destination refused (unreachable, gone, too large)
                pending.popleft()
                self._pending_count -= count
                counters[4] += count
                continue
            if not accepted:
                # Would block: hold it, and go on with the other destinations' output.
                pending.popleft()
                self._pending_count -= count
                self._hold(transmit, now)
                held = self._held
                continue
            counters[2] += accepted
            counters[3] += 1
            self._pending_count -= accepted
            if accepted >= count:
                pending.popleft()
            else:
                pending[0] = transmit.suffix(accepted)

    def _hold(self, transmit: DatagramTransmit, now: float) -> None:
        """Hold ``transmit`` behind what its destination holds already, within the bounds
        (the destination's oldest datagrams, or this one, are dropped past them)."""
        destination = transmit.destination
        hold = self._held.get(destination)
        if hold is None:
            hold = self._held[destination] = _Hold(now)
            if len(self._held) == 1 or hold.retry_at < self._retry_at:
                self._retry_at = hold.retry_at
        counters = self._counters
        count = transmit.segment_count
        transmits = hold.transmits
        while transmits and (
            hold.count + count > self._hold_limit or self._held_count + count > self._max_pending
        ):
            oldest = transmits.popleft()
            dropped = oldest.segment_count
            hold.count -= dropped
            self._held_count -= dropped
            counters[4] += dropped
            counters[7] += dropped
        if hold.count + count > self._hold_limit or self._held_count + count > self._max_pending:
            counters[4] += count  # (larger than the bound alone, or the others fill it)
            counters[7] += count
            if not transmits:
                self._forget(destination)
            return
        transmits.append(transmit)
        hold.count += count
        self._held_count += count
        counters[6] += count

    def _forget(self, destination: DatagramAddr) -> None:
        del self._held[destination]
        held = self._held
        if held:
            self._retry_at = min(hold.retry_at for hold in held.values())

    def _retry_held(self, now: float) -> bool:
        """Retry every held destination whose delay has passed, once each; False if the
        socket failed meanwhile."""
        sock = self._socket
        counters = self._counters
        for destination, hold in list(self._held.items()):
            if hold.retry_at > now:
                continue
            counters[8] += 1
            transmits = hold.transmits
            while transmits:
                transmit = transmits[0]
                count = transmit.segment_count
                try:
                    accepted = sock.try_send_transmit(transmit)
                except SocketClosedError:
                    self._fail_socket()
                    return False
                except OSError:  # this destination refused (unreachable, gone, too large)
                    transmits.popleft()
                    hold.count -= count
                    self._held_count -= count
                    counters[4] += count
                    continue
                if not accepted:
                    delay = min(hold.delay * 2, HOLD_RETRY_MAX)
                    hold.delay = delay
                    hold.retry_at = now + delay
                    break
                counters[2] += accepted
                counters[3] += 1
                hold.count -= accepted
                self._held_count -= accepted
                if accepted >= count:
                    transmits.popleft()
                else:
                    transmits[0] = transmit.suffix(accepted)
            if not transmits:
                del self._held[destination]
        held = self._held
        if held:
            self._retry_at = min(hold.retry_at for hold in held.values())
        return True

    def _queue(self, batch: list[tuple[bytes, DatagramAddr]]) -> None:
        """Group consecutive datagrams to one destination with equal sizes (the last of a
        group may be shorter) into segmented transmits and queue them (one endpoint batch,
        which the endpoint bounds; the flush empties the queue, holding what is refused)."""
        pending = self._pending
        max_segments = self._max_segments
        total = len(batch)
        index = 0
        while index < total:
            data, destination = batch[index]
            size = len(data)
            end = index + 1
            if max_segments > 1:
                while end < total and end - index < max_segments:
                    following, where = batch[end]
                    if where is not destination and where != destination:
                        break
                    length = len(following)
                    if length > size:
                        break
                    end += 1
                    if length < size:
                        break
            count = end - index
            if count == 1:
                pending.append(DatagramTransmit(destination, data))
            else:
                joined = b"".join([item[0] for item in batch[index:end]])
                pending.append(DatagramTransmit(destination, joined, size))
            self._pending_count += count
            index = end

    # -- the dedicated-thread mode --------------------------------------------------------------

    def run_forever(self, notifier: ThreadNotifier, stop: threading.Event) -> None:
        """Run steps on the calling thread until the endpoint stopped or ``stop`` is set.

        Waits with ``select`` on the socket's descriptors and ``notifier`` (which must be
        the channels' driver notifier) until ``deadline`` (held output is retried by it);
        descriptor-less carriers wake it through their wakers.
        """
        sock = self._socket
        selector = selectors.DefaultSelector()
        try:
            selector.register(notifier.fileno(), selectors.EVENT_READ)
            fds = [] if self._socket_failed else sock.readiness_fds()
            for fd in fds:
                selector.register(fd, selectors.EVENT_READ)
            while not stop.is_set():
                notifier.clear()
                more = self.step()
                if self._endpoint.is_stopped:
                    return
                if more:
                    continue
                if not fds and not self._socket_failed:
                    sock.add_recv_waker(notifier.notify)
                deadline = self._deadline
                timeout = _THREAD_MAX_WAIT
                if deadline is not None:
                    timeout = min(timeout, max(0.0, deadline - self._clock()))
                selector.select(timeout)
        finally:
            selector.close()


# --- construction shared by the adapters ---------------------------------------------------------

DRIVER_MODES: Final = ("inline", "thread")
"""Where an adapter runs the endpoint: on the event loop (``inline``) or on its own thread."""
DEFAULT_DRIVER_MODE: Final = "inline"
"""The adapters' default driver placement (chosen by measurement: see the package README)."""


@dataclass(frozen=True, slots=True)
class EndpointSettings:
    """Everything an adapter needs to build an endpoint (see the adapters' ``spawn_*``)."""

    identity: Identity
    socket: DatagramSocket
    role: EndpointRole
    routing_pid: Pid | None = None
    config: QuicConfig | None = None
    limits: EndpointLimits | None = None
    options: AdapterOptions | None = None
    submission_limits: SubmissionLimits | None = None
    completion_credits: int = 8192
    event_credits: int = EVENT_CREDIT_CAPACITY
    driver: str = DEFAULT_DRIVER_MODE
    close_socket: bool = True
    engine: EngineFactory | None = DEFAULT_ENGINE
    """The QUIC engine (the default is chosen here, not by the sans-IO endpoint)."""

    def __post_init__(self) -> None:
        if not isinstance(self.identity, Identity):
            raise TypeError(f"identity must be an Identity, not {type(self.identity).__name__}")
        if not isinstance(self.socket, DatagramSocket):
            raise TypeError(f"socket must be a DatagramSocket, not {type(self.socket).__name__}")
        if self.driver not in DRIVER_MODES:
            raise ValueError(f"driver must be one of {DRIVER_MODES}, got {self.driver!r}")
        if self.routing_pid is not None and not isinstance(self.routing_pid, Pid):
            raise TypeError("routing_pid must be a Pid")

    def build(
        self, notifier: Notifier, clock: Callable[[], float]
    ) -> tuple[EndpointChannels[QuicCommand], QuicEndpoint, EndpointDriver]:
        """Create the channels (with ``notifier`` as the driver's notifier), the endpoint and
        its driver on ``clock``."""
        config = QuicConfig() if self.config is None else self.config
        channels = EndpointChannels[QuicCommand](
            next_driver_id(),
            self.submission_limits,
            completion_credits=self.completion_credits,
            event_credits=self.event_credits,
            driver_notifier=notifier,
            # Inline, the driver and the application share the event loop's thread: the
            # channels' per-operation locks can go (see ``EndpointChannels``).
            threadsafe=self.driver != "inline",
        )
        now = clock()
        endpoint = QuicEndpoint(
            self.identity,
            role=self.role,
            routing_pid=self.routing_pid,
            limits=self.limits,
            config=config,
            channels=channels,
            now=now,
            wall_clock_offset=time.time() - now,
            engine=self.engine,
        )
        driver = EndpointDriver(
            endpoint,
            self.socket,
            clock=clock,
            max_datagram_size=config.max_udp_payload,
            threadsafe=self.driver != "inline",
        )
        return channels, endpoint, driver


class SpawnOptions(TypedDict, total=False):
    """The keyword options of the adapters' ``spawn`` besides ``role`` and ``route`` (the
    ``spawn_client``/``spawn_server``/``spawn_duplex``/``spawn_duplex_routed`` wrappers take
    these); their meaning is ``EndpointSettings``'."""

    config: QuicConfig | None
    limits: EndpointLimits | None
    options: AdapterOptions | None
    submission_limits: SubmissionLimits | None
    completion_credits: int
    event_credits: int
    driver: str
    close_socket: bool
    engine: EngineFactory | None


def thread_name(pid: Pid) -> str:
    """The driver thread's name: ``chrysalis-quic-`` and the first 4 PID bytes in hex."""
    return f"chrysalis-quic-{pid.raw[:4].hex()}"
