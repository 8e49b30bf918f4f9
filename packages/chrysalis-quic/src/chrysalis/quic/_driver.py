"""The runtime-neutral half of the asyncio and trio adapters.

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
* **No per-operation map.** Operations on a stream complete in submission order, so a stream
  only keeps counters (bytes in flight, one posted receive); completions are routed by their
  stream with one dictionary lookup.

Received data moves out of the endpoint eagerly: every stream keeps one receive posted (while
the completion credits allow it) and buffers at most ``read_ahead`` bytes, so data the peer
sent just before closing its connection is not lost in the endpoint's buffers.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar, final

from chrysalis.core import DatagramAddr, Pid
from chrysalis.core.completion import (
    EVENT_CREDIT_CAPACITY,
    AuthenticationFailed,
    CommandCompletion,
    CommandError,
    CommandFailed,
    CommandResult,
    ConnectionClosed,
    ConnectionCreated,
    ConnectionEstablished,
    ConnectionRef,
    ControlOutcome,
    DiscardCompletion,
    DriverStopped,
    EndpointChannels,
    ExceedsBudget,
    FinishCompletion,
    IncomingStream,
    Notifier,
    OperationCancellation,
    ReceiveCompletion,
    ReceiveOptions,
    ReceiveStatus,
    ResetCompletion,
    SendCompletion,
    SendOutcome,
    StopCompletion,
    StreamClosed,
    StreamOpened,
    StreamRef,
    SubmissionClosed,
    SubmissionLimits,
    WouldBlock,
    next_driver_id,
)
from chrysalis.core.runtime import Event
from chrysalis.datagram import (
    DATAGRAM_BATCH_SIZE,
    MAX_DATAGRAM_SIZE,
    DatagramSocket,
    DatagramTransmit,
    InvalidDataError,
    SocketClosedError,
    UdpSocket,
    UnixDatagramSocket,
)
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._endpoint import (
    Abort,
    Close,
    Connect,
    ConnectionStatistics,
    EndpointRole,
    EndpointStatistics,
    OpenBidi,
    QuicCommand,
    QuicEndpoint,
    Shutdown,
)
from chrysalis.quic._engine import EngineFactory
from chrysalis.quic._identity import Identity

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
    "ConnectError",
    "ConnectionView",
    "ConnectionLostError",
    "DriverStatistics",
    "EndpointClosedError",
    "EndpointCore",
    "EndpointDriver",
    "EndpointSettings",
    "EndpointView",
    "IncompleteReadError",
    "PeerAuthenticationError",
    "QuicTransportError",
    "ReadLimitError",
    "Runtime",
    "StreamBrokenError",
    "StreamClosedError",
    "StreamResetError",
    "ThreadNotifier",
    "WriteBufferFullError",
]

T = TypeVar("T")

REFUSED_STREAM_CODE: Final = 0x2
"""Application error code of STOP_SENDING / RESET_STREAM for an incoming stream refused
because its accept queue (or its peer's share of it) was full."""
DEFAULT_ACCEPT_BACKLOG: Final = 1024
"""Incoming streams waiting for ``accept`` at once, per accept queue."""
DEFAULT_PEER_ACCEPT_BACKLOG: Final = 256
"""Incoming streams of one peer waiting for ``accept`` at once, per accept queue."""
DEFAULT_READ_AHEAD: Final = 64 * 1024
"""Capacity of each posted receive, and the most bytes a stream buffers unread."""
DEFAULT_WRITE_HIGH_WATER: Final = 1024 * 1024
"""Unacknowledged bytes one stream keeps in flight before writers wait."""
DEFAULT_WRITE_BUFFER_LIMIT: Final = 16 * 1024 * 1024
"""Bytes ``write`` may hold locally (not yet admitted) before it raises."""
_MAX_SEND_CHUNK: Final = 1024 * 1024
_DIRECT_SEND: Final = 16 * 1024
_WRITE_THROUGH_MAX: Final = 1024
"""The largest write an inline driver may send from inside ``write`` (one small message: a
request or a reply, never bulk data, whose batching is worth more than a loop callback)."""
_LONE_STEPS: Final = 4  # steps with one lone datagram before receiving one at a time
_LONE_RECHECK: Final = 8  # then every 8th step drains fully again
_LONE_LIMIT: Final = 1 << 20  # the counter wraps back to _LONE_STEPS here
_BULK_DATAGRAM: Final = 1000  # a datagram this large is taken as part of a bulk transfer
_DISPATCH_BATCH: Final = 256
_MAX_DEFERRED: Final = 4096
_THREAD_MAX_WAIT: Final = 1.0


# --- errors ------------------------------------------------------------------------------------


class QuicTransportError(Exception):
    """Base class of the errors raised by the adapters and ``QuicTransport``."""


class EndpointClosedError(QuicTransportError):
    """The endpoint (or transport) is shut down or its driver stopped."""


class ConnectError(QuicTransportError, ConnectionError):
    """A dial failed: the endpoint refused the connect, or the connection closed before its
    handshake completed. ``application_code`` / ``transport_code`` are the close codes."""

    def __init__(
        self,
        message: str,
        *,
        application_code: int | None = None,
        transport_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.application_code = application_code
        self.transport_code = transport_code


class PeerAuthenticationError(ConnectError):
    """The peer's certificate did not prove the requested PID (or was not trusted).

    ``expected`` is the PID dialled (None for an unpinned dial), ``actual`` the PID of the
    presented certificate (None when no trusted certificate was presented), ``reason`` what
    did not match, naming the presented certificate (subject, issuer, PID)."""

    def __init__(self, expected: Pid | None, actual: Pid | None, reason: str = "") -> None:
        wanted = "any trusted peer" if expected is None else f"PID {expected}"
        if reason:
            message = f"peer authentication failed: expected {wanted}; {reason}"
        elif actual is None:
            message = f"peer authentication failed: expected {wanted}; no trusted certificate"
        else:
            message = f"peer authentication failed: expected {wanted}, got PID {actual}"
        super().__init__(message)
        self.expected = expected
        self.actual = actual
        self.reason = reason


class ConnectionLostError(QuicTransportError, ConnectionError):
    """The connection closed before the stream finished (no FIN was received).

    ``application_code`` / ``transport_code`` are the close codes, if any (neither for an idle
    timeout or an endpoint shutdown)."""

    def __init__(
        self,
        message: str = "the connection closed",
        *,
        application_code: int | None = None,
        transport_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.application_code = application_code
        self.transport_code = transport_code


class StreamResetError(QuicTransportError, ConnectionResetError):
    """The peer reset its sending half of the stream with ``error_code``."""

    def __init__(self, error_code: int) -> None:
        super().__init__(f"the peer reset the stream (code {error_code})")
        self.error_code = error_code


class StreamBrokenError(QuicTransportError, BrokenPipeError):
    """Written bytes can no longer be delivered: the peer stopped reading (STOP_SENDING),
    the stream was reset, or the connection closed."""


class StreamClosedError(QuicTransportError):
    """This side already closed the stream (or its writing half) and then used it."""


class IncompleteReadError(QuicTransportError, EOFError):
    """``read_exactly`` reached EOF first; ``partial`` holds the bytes read."""

    def __init__(self, partial: bytes, expected: int) -> None:
        super().__init__(f"{len(partial)} bytes read on a total of {expected} expected bytes")
        self.partial = partial
        self.expected = expected


class ReadLimitError(QuicTransportError, BufferError):
    """Reading everything until EOF would exceed the caller's limit."""


class WriteBufferFullError(QuicTransportError, BufferError):
    """A synchronous ``write`` would hold more than the stream's write buffer limit locally:
    await ``drain()`` between writes."""


# --- the runtime seam --------------------------------------------------------------------------


# What the core needs of an event (``asyncio.Event``, ``trio.Event`` and the asyncio adapter's
# cheaper ``_Event``, whose ``wait`` returns a future, all fit): the shared runtime protocol.
AsyncEvent = Event


class Runtime(Protocol):
    """The few runtime services the core and ``QuicTransport`` need from an adapter.

    Every method is called on the event loop's thread. ``spawn`` starts a task owned by the
    endpoint (it is cancelled, at the latest, when the endpoint closes); ``call_soon`` runs a
    plain callback on the loop soon; ``with_timeout`` raises ``TimeoutError`` after
    ``seconds``.
    """

    def event(self) -> AsyncEvent: ...

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None: ...

    def call_soon(self, fn: Callable[[], object]) -> None: ...

    async def with_timeout(self, seconds: float, fn: Callable[[], Awaitable[T]]) -> T: ...


@dataclass(frozen=True, slots=True)
class AdapterOptions:
    """Bounds of an adapter endpoint (all positive).

    Attributes:
        accept_backlog: incoming streams waiting for ``accept`` (per accept queue: the
            application one and the link-local one).
        peer_accept_backlog: of those, how many one peer may occupy.
        read_ahead: capacity of each posted receive; a stream buffers at most this many
            unread bytes before it stops posting receives.
        write_high_water: unacknowledged bytes one stream keeps in flight before writers wait.
        write_buffer_limit: bytes a synchronous asyncio ``write`` may hold locally before it
            raises ``WriteBufferFullError``.
    """

    accept_backlog: int = DEFAULT_ACCEPT_BACKLOG
    peer_accept_backlog: int = DEFAULT_PEER_ACCEPT_BACKLOG
    read_ahead: int = DEFAULT_READ_AHEAD
    write_high_water: int = DEFAULT_WRITE_HIGH_WATER
    write_buffer_limit: int = DEFAULT_WRITE_BUFFER_LIMIT

    def __post_init__(self) -> None:
        for name in (
            "accept_backlog",
            "peer_accept_backlog",
            "read_ahead",
            "write_high_water",
            "write_buffer_limit",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"AdapterOptions.{name} must be an int")
            if not 1 <= value <= 1 << 40:
                raise ValueError(f"AdapterOptions.{name} must be in 1..2**40, got {value}")


# --- the I/O step ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DriverStatistics:
    """Counters of an ``EndpointDriver``.

    ``steps``: I/O steps run; ``datagrams_received`` / ``datagrams_sent``: datagrams fed to
    and accepted by the carrier; ``transmits``: carrier send calls that accepted something
    (a segmented transmit carries several datagrams); ``send_drops``: datagrams dropped
    because the carrier refused them or the output queue was full (QUIC retransmits);
    ``receive_errors``: carrier receive errors (oversized datagrams included).
    """

    steps: int
    datagrams_received: int
    datagrams_sent: int
    transmits: int
    send_drops: int
    receive_errors: int
    pending_datagrams: int
    socket_failed: bool


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
    driver notifier, writability of ``blocked_destination`` when it is set, or ``deadline``.
    ``step()`` returns True when it stopped draining at its batch limit (call it again soon).

    Args:
        endpoint: the endpoint to drive (this object becomes its only caller).
        socket: the carrier; errors sending to one destination drop those datagrams (QUIC
            recovers); a shut-down or broken socket calls ``on_socket_failure`` once (the
            adapters abort the endpoint then) and drops all further output.
        clock: monotonic seconds; the endpoint's ``now``.
        max_datagram_size: the largest datagram expected (the endpoint's
            ``max_udp_payload``); receive buffers are sized from it unless the socket
            delivers aggregates.
        receive_batches: carrier batches drained per step before the endpoint is polled.
        max_pending_datagrams: datagrams queued while the carrier would block; beyond it
            new output is dropped.
        threadsafe: False promises that every method is called from one thread (the inline
            drivers: the event loop's); ``step`` and ``flush`` then take no lock.
    """

    __slots__ = (
        "_blocked",
        "_buffers",
        "_clock",
        "_counters",
        "_deadline",
        "_drains_fully",
        "_endpoint",
        "_lock",
        "_lone",
        "_max_pending",
        "_max_segments",
        "_metas",
        "_one",
        "_pending",
        "_pending_count",
        "_receive_batches",
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
        self._buffers = [bytearray(size) for _ in range(count)]
        self._views = [memoryview(buffer) for buffer in self._buffers]
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
        self._pending: deque[DatagramTransmit] = deque()
        self._pending_count = 0
        self._blocked: DatagramAddr | None = None
        self._deadline: float | None = None
        self._socket_failed = False
        # ``threadsafe=False`` (the inline drivers): every call comes from the event loop's
        # thread, so ``step`` and ``flush`` skip the lock (an uncontended ``with lock:`` still
        # costs about ten Python calls' worth of time, twice per request/response step).
        self._lock: threading.Lock | None = threading.Lock() if threadsafe else None
        self._counters = [0, 0, 0, 0, 0, 0]  # steps, received, sent, transmits, drops, errors
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
    def blocked_destination(self) -> DatagramAddr | None:
        """The destination whose writability the caller must wait for, or None."""
        return self._blocked

    @property
    def socket_failed(self) -> bool:
        """True once the carrier was found shut down or broken."""
        return self._socket_failed

    def statistics(self) -> DriverStatistics:
        """An immutable snapshot of the driver's counters."""
        c = self._counters
        return DriverStatistics(
            c[0], c[1], c[2], c[3], c[4], c[5], self._pending_count, self._socket_failed
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
                self._deadline = endpoint.get_timer()
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
            self._deadline = endpoint.get_timer()
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
            self._deadline = endpoint.get_timer()

    def _receive(self, now: float) -> bool:
        sock = self._socket
        buffers = self._buffers
        views = self._views
        metas = self._metas
        feed = self._endpoint.receive_datagram
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

    def _fail_socket(self) -> None:
        if self._socket_failed:
            return
        self._socket_failed = True
        callback = self.on_socket_failure
        if callback is not None:
            callback()
        self._counters[4] += self._pending_count
        self._pending.clear()
        self._pending_count = 0
        self._blocked = None

    def _flush(self, now: float) -> None:
        batch = self._endpoint.datagrams_to_send(now)
        if self._socket_failed:
            self._counters[4] += len(batch)
            return
        pending = self._pending
        if len(batch) == 1 and not pending:
            # One datagram and nothing queued before it (every request/response step): send
            # it straight away, without building a transmit. A refusal queues it as usual.
            data, destination = batch[0]
            counters = self._counters
            try:
                sent = self._socket.try_send_to(data, destination)
            except SocketClosedError:
                self._fail_socket()
                return
            except OSError:  # this destination refused (unreachable, gone, too large)
                counters[4] += 1
                self._blocked = None
                return
            if sent:
                counters[2] += 1
                counters[3] += 1
                self._blocked = None
                return
        if batch:
            if len(batch) > 2:
                self._lone = 0  # sending a stream of data: its acknowledgements come in bursts
            self._queue(batch)
        sock = self._socket
        counters = self._counters
        while pending:
            transmit = pending[0]
            count = transmit.segment_count
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
                self._blocked = transmit.destination
                return
            counters[2] += accepted
            counters[3] += 1
            self._pending_count -= accepted
            if accepted >= count:
                pending.popleft()
            else:
                pending[0] = transmit.suffix(accepted)
        self._blocked = None

    def _queue(self, batch: list[tuple[bytes, DatagramAddr]]) -> None:
        """Group consecutive datagrams to one destination with equal sizes (the last of a
        group may be shorter) into segmented transmits and queue them, within the bound."""
        pending = self._pending
        limit = self._max_pending
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
            if self._pending_count + count > limit:
                self._counters[4] += total - index
                return
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

        Waits with ``select`` on the socket's descriptors, ``notifier`` (which must be the
        channels' driver notifier) and, while output is blocked, the destination's send
        descriptor; descriptor-less carriers wake it through their wakers.
        """
        sock = self._socket
        selector = selectors.DefaultSelector()
        try:
            selector.register(notifier.fileno(), selectors.EVENT_READ)
            fds = [] if self._socket_failed else sock.readiness_fds()
            for fd in fds:
                selector.register(fd, selectors.EVENT_READ)
            write_fd: int | None = None
            while not stop.is_set():
                notifier.clear()
                more = self.step()
                if self._endpoint.is_stopped:
                    return
                if more:
                    continue
                blocked = self._blocked
                wanted: int | None = None
                if blocked is not None and not self._socket_failed:
                    wanted = sock.send_readiness_fd(blocked)
                    if wanted is None:
                        sock.add_send_waker(blocked, notifier.notify)
                if wanted != write_fd:
                    if write_fd is not None:
                        _set_write(selector, write_fd, fds, False)
                    if wanted is not None:
                        _set_write(selector, wanted, fds, True)
                    write_fd = wanted
                if not fds and not self._socket_failed:
                    sock.add_recv_waker(notifier.notify)
                deadline = self._deadline
                timeout = _THREAD_MAX_WAIT
                if deadline is not None:
                    timeout = min(timeout, max(0.0, deadline - self._clock()))
                selector.select(timeout)
        finally:
            selector.close()


def _set_write(selector: selectors.BaseSelector, fd: int, readers: list[int], on: bool) -> None:
    events = selectors.EVENT_READ if fd in readers else 0
    if on:
        events |= selectors.EVENT_WRITE
    try:
        if events:
            try:
                selector.modify(fd, events)
            except KeyError:
                selector.register(fd, events)
        else:
            selector.unregister(fd)
    except (KeyError, ValueError, OSError):
        pass


# --- completion dispatch and stream state ------------------------------------------------------


@final
class _Request:
    """A command waiting for its completion."""

    __slots__ = ("abandoned", "context", "event", "result")

    def __init__(self, event: AsyncEvent, context: tuple[Pid | None, Pid] | None) -> None:
        self.event = event
        self.context = context
        self.result: CommandResult | None = None
        self.abandoned = False


_HANDSHAKING: Final = 0
_ESTABLISHED: Final = 1
_FAILED: Final = 2
_CLOSED: Final = 3


@final
class ConnectionCore:
    """The adapter-side state of one connection (runtime-neutral)."""

    __slots__ = (
        "__weakref__",
        "actual",
        "application_code",
        "auth_reason",
        "core",
        "dialed",
        "event",
        "expected",
        "facade",
        "local_pid",
        "peer",
        "ref",
        "state",
        "streams",
        "transport_code",
    )

    def __init__(
        self,
        core: EndpointCore,
        ref: ConnectionRef,
        *,
        dialed: bool,
        local_pid: Pid,
        expected: Pid | None,
    ) -> None:
        self.core = core
        self.ref = ref
        self.dialed = dialed
        self.local_pid = local_pid
        self.expected = expected
        self.peer: Pid | None = None
        self.actual: Pid | None = None
        self.auth_reason = ""
        self.state = _HANDSHAKING
        self.application_code: int | None = None
        self.transport_code: int | None = None
        self.event: AsyncEvent | None = None
        self.streams: dict[StreamRef, StreamCore] = {}
        self.facade: object | None = None

    @property
    def is_established(self) -> bool:
        """The handshake completed and the peer was authenticated (and it is not closed)."""
        return self.state == _ESTABLISHED

    @property
    def is_closed(self) -> bool:
        """The connection is gone (closed, or its authentication failed)."""
        return self.state >= _FAILED

    def _signal(self) -> None:
        event = self.event
        if event is not None:
            self.event = None
            event.set()

    async def wait_changed(self) -> None:
        """Wait for the next state change."""
        event = self.event
        if event is None:
            event = self.event = self.core.runtime.event()
        await event.wait()

    async def wait_settled(self) -> None:
        """Wait until the handshake's verdict (established, failed or closed)."""
        while self.state == _HANDSHAKING:
            await self.wait_changed()

    async def wait_closed(self) -> None:
        """Wait until the connection is gone."""
        while self.state < _FAILED:
            await self.wait_changed()

    def lost_error(self) -> ConnectionLostError:
        """The error that operations on this closed connection raise."""
        return ConnectionLostError(
            f"connection to {self.peer} closed",
            application_code=self.application_code,
            transport_code=self.transport_code,
        )

    def broken_error(self) -> StreamBrokenError:
        """What a writer of this closed connection raises: the close codes are its cause."""
        error = StreamBrokenError("the connection closed")
        error.__cause__ = self.lost_error()
        return error

    def close_nowait(self, error_code: int = 0, reason: str = "") -> None:
        """Queue an application close with ``error_code`` (best effort, idempotent)."""
        if self.state < _FAILED:
            self.core.command_nowait(Close(self.ref, error_code, reason[:256]))

    async def open_stream(self) -> StreamCore:
        """Open a bidirectional stream (nothing is sent before the first write)."""
        if self.state != _ESTABLISHED:
            if self.state == _HANDSHAKING:
                await self.wait_settled()
            if self.state != _ESTABLISHED:
                raise self.lost_error()
        result = await self.core.command(OpenBidi(self.ref))
        if isinstance(result, StreamOpened):
            stream = self.core.streams.get(result.stream)
            if stream is not None:
                return stream
            raise self.lost_error()
        if isinstance(result, CommandFailed):
            if (
                self.state >= _FAILED
                or result.error is CommandError.UNKNOWN_CONNECTION
                or result.detail.startswith("connection")
            ):
                raise self.lost_error()
            raise QuicTransportError(f"cannot open a stream: {result.error.value} {result.detail}")
        raise QuicTransportError(f"unexpected result {result!r}")


# Receive-side terminal states.
_RX_OPEN: Final = 0
_RX_FIN: Final = 1
_RX_RESET: Final = 2
_RX_LOST: Final = 3
_RX_STOPPED: Final = 4
# The endpoint ended the receive half because the connection is going (``ReceiveStatus.CLOSED``),
# but its ``ConnectionClosed``, which carries the close codes, has not been dispatched yet. The
# completion model delivers it after every completion of the connection's operations, and with
# the thread driver (or staged event credits) the application can drain the first before the
# endpoint has queued the second: a reader that raised at once would report a lost connection
# without its codes. Readers keep waiting in this state; nothing more is posted, and
# ``ConnectionClosed`` (or ``StreamClosed``, or the driver stopping) turns it into ``_RX_LOST``.
_RX_CLOSING: Final = 5
# Finish progress.
_EOF_NONE: Final = 0
_EOF_WANTED: Final = 1
_EOF_SENT: Final = 2


class EndpointView:
    """What the asyncio and trio endpoints share: read-only views of their identity, sans-IO
    endpoint, driver and core (the adapters set these attributes and add their runtime)."""

    __slots__ = ("_core", "_driver", "_endpoint", "_identity", "_mode")

    _core: EndpointCore
    _driver: EndpointDriver
    _endpoint: QuicEndpoint
    _identity: Identity
    _mode: str

    @property
    def identity(self) -> Identity:
        """This endpoint's identity."""
        return self._identity

    @property
    def pid(self) -> Pid:
        """This process's PID (``identity.pid``)."""
        return self._identity.pid

    @property
    def routing_pid(self) -> Pid:
        """The prefix of the CIDs of connections this endpoint dials."""
        return self._endpoint.routing_pid

    @property
    def local_addr(self) -> DatagramAddr:
        """The carrier's address."""
        return self._driver.socket.local_addr

    @property
    def driver_mode(self) -> str:
        """``"inline"`` or ``"thread"``."""
        return self._mode

    @property
    def is_closed(self) -> bool:
        """True once the driver stopped."""
        return self._core.stopped

    @property
    def core(self) -> EndpointCore:
        """The runtime-neutral state behind this endpoint (for ``QuicTransport``)."""
        return self._core

    def statistics(self) -> EndpointStatistics:
        """The endpoint's statistics snapshot."""
        return self._driver.endpoint_statistics()


class ConnectionView:
    """What the asyncio and trio connection handles share: read-only views of one
    ``ConnectionCore`` (the adapters add their runtime's ``open_stream`` and waits)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: ConnectionCore) -> None:
        self._conn = conn

    @property
    def ref(self) -> ConnectionRef:
        """The endpoint-local handle of this connection."""
        return self._conn.ref

    @property
    def peer(self) -> Pid:
        """The peer's authenticated PID."""
        peer = self._conn.peer
        if peer is None:
            raise QuicTransportError("the connection is not established")
        return peer

    @property
    def local_pid(self) -> Pid:
        """The routing PID of this side of the connection."""
        return self._conn.local_pid

    @property
    def dialed(self) -> bool:
        """True for a connection this side dialled."""
        return self._conn.dialed

    @property
    def is_closed(self) -> bool:
        """True once the connection is gone."""
        return self._conn.is_closed

    @property
    def close_codes(self) -> tuple[int | None, int | None]:
        """``(application_code, transport_code)`` of a closed connection."""
        return self._conn.application_code, self._conn.transport_code

    @property
    def core(self) -> ConnectionCore:
        """The runtime-neutral state behind this connection."""
        return self._conn


@final
class StreamCore:
    """The adapter-side state of one stream (runtime-neutral).

    Receive side: at most one posted receive; unread bytes wait in ``chunks`` (at most
    ``read_ahead`` before no new receive is posted). Send side: bytes not yet admitted wait in
    ``pending``; admitted, unacknowledged bytes are ``in_flight`` (at most about
    ``write_high_water``). All methods run on the event loop's thread.
    """

    __slots__ = (
        "__weakref__",
        "aborted",
        "ahead_due",
        "blocked",
        "cancellation",
        "chunks",
        "closed",
        "conn",
        "core",
        "eof",
        "facade",
        "head",
        "in_flight",
        "local",
        "pending",
        "pending_len",
        "posted",
        "read_closed",
        "reclaimed",
        "ref",
        "reset_code",
        "rlen",
        "rstate",
        "rwait",
        "stop_code",
        "werror",
        "write_closed",
        "wwait",
    )

    def __init__(self, core: EndpointCore, conn: ConnectionCore, ref: StreamRef, local: bool):
        self.core = core
        self.conn = conn
        self.ref = ref
        self.local = local
        self.chunks: deque[bytes | bytearray] = deque()
        self.head = 0
        self.rlen = 0
        self.posted = False
        self.rstate = _RX_OPEN
        self.reset_code = 0
        self.read_closed = False
        self.rwait: AsyncEvent | None = None
        self.pending: deque[bytes | bytearray | memoryview] = deque()
        self.pending_len = 0
        self.in_flight = 0
        self.eof = _EOF_NONE
        self.write_closed = False
        self.werror: QuicTransportError | None = None
        self.wwait: AsyncEvent | None = None
        self.stop_code: int | None = None
        self.closed = False
        self.reclaimed = False
        self.blocked = False
        self.aborted = False
        self.ahead_due = False  # queued in ``core.read_ahead_due``
        self.cancellation: OperationCancellation | None = None
        self.facade: object | None = None

    # -- signalling ---------------------------------------------------------------------------

    def _wake_readers(self) -> None:
        event = self.rwait
        if event is not None:
            self.rwait = None
            event.set()

    def _wake_writers(self) -> None:
        event = self.wwait
        if event is not None:
            self.wwait = None
            event.set()

    async def _wait_read(self) -> None:
        event = self.rwait
        if event is None:
            event = self.rwait = self.core.runtime.event()
        await event.wait()

    async def _wait_write(self) -> None:
        event = self.wwait
        if event is None:
            event = self.wwait = self.core.runtime.event()
        await event.wait()

    # -- receiving ----------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Received bytes not read yet."""
        return self.rlen

    @property
    def at_eof(self) -> bool:
        """True when every byte was read and the peer finished (or nothing more can come)."""
        state = self.rstate
        return not self.rlen and state != _RX_OPEN and state != _RX_CLOSING

    def post_receive(self) -> WouldBlock[Any] | None:
        """Keep one receive posted while the stream is open and the buffer has room."""
        if (
            self.posted
            or self.rstate != _RX_OPEN
            or self.read_closed
            or self.core.draining
            or self.rlen >= self.core.options.read_ahead
        ):
            return None
        core = self.core
        try:
            receipt = core.submitter.receive_nowait(
                self.ref, bytearray(), core.options.read_ahead, _ONE_BYTE
            )
        except WouldBlock as exc:
            return exc
        except (SubmissionClosed, ExceedsBudget):
            self._terminate_receive(_RX_LOST)
            return None
        self.posted = True
        self.cancellation = receipt.cancellation
        core.posted_receives += 1
        return None

    def _maybe_read_ahead(self) -> None:
        core = self.core
        if core.posted_receives < core.read_ahead_slots:
            self.post_receive()

    def _read_ahead(self) -> None:
        """``_maybe_read_ahead`` now, or after the inline driver's flush while it defers
        read-aheads (see ``EndpointCore.read_ahead_due``)."""
        due = self.core.read_ahead_due
        if due is None:
            self._maybe_read_ahead()
        elif not self.ahead_due:
            self.ahead_due = True
            due.append(self)

    def take(self, max_bytes: int) -> bytes:
        """Remove and return up to ``max_bytes`` buffered bytes (at least one is buffered)."""
        chunks = self.chunks
        chunk = chunks[0]
        head = self.head
        available = len(chunk) - head
        if head == 0 and available <= max_bytes:
            chunks.popleft()
            taken = chunk if isinstance(chunk, bytes) else bytes(chunk)
        elif available <= max_bytes:
            chunks.popleft()
            self.head = 0
            taken = bytes(memoryview(chunk)[head:])
        else:
            taken = bytes(memoryview(chunk)[head : head + max_bytes])
            self.head = head + max_bytes
        self.rlen -= len(taken)
        if not self.posted and not self.ahead_due:  # (queued already: nothing to do)
            self._read_ahead()
        return taken

    def take_buffered(self, count: int) -> bytes:
        """Remove and return exactly ``count`` buffered bytes (``count <= buffered``)."""
        if count <= 0:
            return b""
        first = self.take(count)
        missing = count - len(first)
        if not missing:
            return first  # one chunk held it all (the common case)
        parts = [first]
        while missing:
            part = self.take(missing)
            parts.append(part)
            missing -= len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def raise_receive_error(self) -> None:
        """Raise what ended the receive side unless it was a clean FIN (or it is open)."""
        if self.read_closed:
            raise StreamClosedError("the stream is closed")
        if self.rstate != _RX_OPEN:
            error = self._receive_error()
            if error is not None:
                raise error

    def take_all(self) -> bytes:
        """Remove and return every buffered byte."""
        parts = [self.take(self.rlen)]
        while self.rlen:
            parts.append(self.take(self.rlen))
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def find(self, separator: bytes, start: int) -> int:
        """Index of ``separator`` in the buffered bytes from ``start``, or -1 (no copy when
        one chunk is buffered)."""
        if len(self.chunks) > 1:
            joined = b"".join(
                [bytes(memoryview(self.chunks[0])[self.head :]), *list(self.chunks)[1:]]
            )
            self.chunks.clear()
            self.chunks.append(joined)
            self.head = 0
        if not self.chunks:
            return -1
        found = self.chunks[0].find(separator, self.head + start)
        return -1 if found < 0 else found - self.head

    def _receive_error(self) -> QuicTransportError | None:
        """The error that reading at the end of the buffer raises (None: plain EOF)."""
        state = self.rstate
        if state == _RX_FIN:
            return None
        if state == _RX_RESET:
            return StreamResetError(self.reset_code)
        if state == _RX_STOPPED:
            return StreamClosedError("reading was stopped on this stream")
        return self.conn.lost_error()

    async def read_some(self, max_bytes: int) -> bytes:
        """Wait for data; return up to ``max_bytes`` bytes, or ``b""`` at a clean EOF.

        Raises ``StreamResetError`` (peer reset), ``ConnectionLostError`` (the connection
        closed first) or ``StreamClosedError`` (this side closed the stream).
        """
        while True:
            if self.read_closed:
                raise StreamClosedError("the stream is closed")
            if self.rlen:
                return self.take(max_bytes)
            state = self.rstate
            if state != _RX_OPEN and state != _RX_CLOSING:
                error = self._receive_error()
                if error is None:
                    return b""
                raise error
            blocked = self.post_receive()
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
                continue
            event = self.rwait
            if event is None:
                event = self.rwait = self.core.runtime.event()
            await event.wait()

    async def read_exactly(self, count: int) -> bytes:
        """Read exactly ``count`` bytes; ``IncompleteReadError`` at an earlier clean EOF."""
        if count <= 0:
            return b""
        # Wait here for the first bytes (one coroutine less than through read_some).
        if (
            self.rlen < count
            and self.rstate == _RX_OPEN
            and not self.read_closed
            and (self.posted or self.post_receive() is None)  # read-ahead usually posted it
            and self.rstate == _RX_OPEN
            and not self.rlen
        ):
            event = self.rwait
            if event is None:
                event = self.rwait = self.core.runtime.event()
            await event.wait()
        if self.rlen >= count and not self.read_closed:
            chunks = self.chunks
            chunk = chunks[0]
            if len(chunk) == count and not self.head:
                # One chunk is exactly the answer (a request/response exchange): ``take``
                # inline, two calls less on the path from the woken reader to its reply.
                chunks.popleft()
                self.rlen -= count
                if not self.posted and not self.ahead_due:
                    self._read_ahead()
                return chunk if isinstance(chunk, bytes) else bytes(chunk)
            return self.take_buffered(count)
        parts: list[bytes] = []
        missing = count
        while missing:
            chunk = await self.read_some(missing)
            if not chunk:
                raise IncompleteReadError(b"".join(parts), count)
            parts.append(chunk)
            missing -= len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_until_eof(self, limit: int) -> bytes:
        """Read until a clean EOF (at most ``limit`` bytes, else ``ReadLimitError``)."""
        parts: list[bytes] = []
        total = 0
        while True:
            chunk = await self.read_some(self.core.options.read_ahead)
            if not chunk:
                return b"".join(parts)
            total += len(chunk)
            if total > limit:
                raise ReadLimitError(f"more than {limit} bytes before EOF")
            parts.append(chunk)

    async def wait_readable(self, buffered: int = 0) -> None:
        """Wait until more than ``buffered`` bytes are buffered or the receive side ended (no
        bytes consumed); ``StreamClosedError`` after a local close."""
        while self.rlen <= buffered and (self.rstate == _RX_OPEN or self.rstate == _RX_CLOSING):
            if self.read_closed:
                raise StreamClosedError("the stream is closed")
            blocked = self.post_receive()
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
                continue
            await self._wait_read()

    def _terminate_receive(self, state: int) -> None:
        if self.rstate == _RX_OPEN:
            self.rstate = state
        self._wake_readers()

    def on_receive(self, completion: ReceiveCompletion) -> None:
        core = self.core
        if self.posted:
            self.posted = False
            core.posted_receives -= 1
        self.cancellation = None
        status = completion.status
        buffer = completion.buffer
        if len(buffer) and self.rstate == _RX_OPEN and not self.read_closed:
            self.chunks.append(buffer)
            self.rlen += len(buffer)
        if status is ReceiveStatus.DATA:
            # The common completion (bytes for a reader): ``_read_ahead`` and
            # ``_wake_readers`` inline, two calls less on the path to the woken reader.
            if self.rwait is not None or self.rlen < core.options.read_ahead:
                due = core.read_ahead_due
                if due is None:
                    self._maybe_read_ahead()
                elif not self.ahead_due:
                    self.ahead_due = True
                    due.append(self)
            event = self.rwait
            if event is not None:
                self.rwait = None
                event.set()
            return
        if status is ReceiveStatus.FIN:
            self._terminate_receive(_RX_FIN)
        elif status is ReceiveStatus.RESET:
            self.reset_code = completion.error_code or 0
            self._terminate_receive(_RX_RESET)
        elif status is ReceiveStatus.STOPPED:
            self._terminate_receive(_RX_STOPPED)
        elif status is ReceiveStatus.CLOSED:
            # Final only when nothing will tell us more (see ``_RX_CLOSING``).
            final = self.reclaimed or self.conn.state >= _FAILED or self.core.stopped
            self._terminate_receive(_RX_LOST if final else _RX_CLOSING)
        self._wake_readers()

    # -- sending ------------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Raise if nothing more may be written."""
        if self.write_closed:
            raise StreamClosedError("the stream's writing half is closed")
        if self.werror is not None:
            raise self.werror

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` (copied unless it is ``bytes``) and submit what the bounds allow."""
        if self.write_closed or self.werror is not None:
            self.check_writable()  # raises
        if type(data) is bytes and not self.pending:
            # The common case (nothing waits before it, so order is kept): submit the
            # caller's immutable bytes at once, without the pending queue. Whatever the
            # bounds refuse takes the general path below, which queues it and retries.
            core = self.core
            size = len(data)
            if 0 < size <= core.max_send_piece and (
                self.in_flight + size <= core.options.write_high_water
            ):
                hook = core.write_through if size <= _WRITE_THROUGH_MAX else None
                if hook is not None:
                    # A small write: the inline driver may admit it and send it at once
                    # (True), possibly through its send lane, without the submission queue.
                    # Counted first, as the queued path counts it before flushing.
                    self.in_flight += size
                    if hook(self.ref, data):
                        return
                    self.in_flight -= size
                try:
                    core.submitter.send_nowait(self.ref, data)
                except (WouldBlock, SubmissionClosed, ExceedsBudget):
                    pass
                else:
                    self.in_flight += size
                    return
        size = len(data) if not isinstance(data, memoryview) else data.nbytes
        if not size:
            return
        if self.pending_len + size > self.core.options.write_buffer_limit:
            raise WriteBufferFullError(
                f"write buffer limit of {self.core.options.write_buffer_limit} bytes reached: "
                "await drain()"
            )
        pending = self.pending
        if isinstance(data, bytes) and size >= _DIRECT_SEND:
            pending.append(data)
        elif pending and isinstance(last := pending[-1], bytearray) and len(last) < _DIRECT_SEND:
            last += data
        else:
            pending.append(bytearray(data))
        self.pending_len += size
        self.flush()

    def flush(self) -> WouldBlock[Any] | None:
        """Admit pending bytes (then a requested FIN) and a requested STOP_SENDING while the
        bounds allow.

        Returns the ``WouldBlock`` that stopped it, or None. A refused stream is remembered
        and retried after the next batch of completions.
        """
        blocked = None
        if self.stop_code is not None and self.rstate == _RX_OPEN:
            blocked = self._submit_stop()
        if self.werror is None and (self.pending or self.eof == _EOF_WANTED):
            blocked = self._flush_writes() or blocked
        if blocked is not None:
            self.core.mark_blocked(self)
        return blocked

    def _submit_stop(self) -> WouldBlock[Any] | None:
        cancellation = self.cancellation
        if cancellation is not None:
            # A posted receive would hold the stop back until data arrives: cancel it.
            self.cancellation = None
            cancellation.cancel()
        code = self.stop_code
        assert code is not None
        try:
            self.core.submitter.stop_nowait(self.ref, code)
        except WouldBlock as exc:
            return exc
        except SubmissionClosed:
            pass
        self.rstate = _RX_STOPPED
        self._wake_readers()
        return None

    def _flush_writes(self) -> WouldBlock[Any] | None:
        core = self.core
        submitter = core.submitter
        high = core.options.write_high_water
        limit = core.max_send_piece
        pending = self.pending
        while pending:
            chunk = pending[0]
            length = len(chunk)
            size = min(length, limit)
            room = high - self.in_flight
            if room < size:
                # A partial piece only when a useful amount fits (no trickle of tiny sends).
                if room < min(size, max(high // 4, 1)):
                    break
                size = room
            piece: bytes | bytearray | memoryview = (
                chunk if size == length else memoryview(chunk)[:size]
            )
            try:
                submitter.send_nowait(self.ref, piece)
            except WouldBlock as exc:
                return exc
            except (SubmissionClosed, ExceedsBudget):
                self._fail_write(EndpointClosedError("the endpoint no longer admits work"))
                return None
            if size == length:
                pending.popleft()
            else:
                pending[0] = memoryview(chunk)[size:]
            self.pending_len -= size
            self.in_flight += size
        if self.eof == _EOF_WANTED and not pending:
            try:
                submitter.finish_nowait(self.ref)
            except WouldBlock as exc:
                return exc
            except SubmissionClosed:
                pass
            self.eof = _EOF_SENT
        if not pending:
            self._wake_writers()
        return None

    def _fail_write(self, error: QuicTransportError) -> None:
        if self.werror is None:
            self.werror = error
        self.pending.clear()
        self.pending_len = 0
        self._wake_writers()

    async def drain(self) -> None:
        """Wait until every written byte was admitted (at most ``write_high_water``
        unacknowledged bytes stay in flight); raise the stream's write error, if any."""
        while True:
            if self.werror is not None:
                raise self.werror
            blocked = self.flush()
            if self.werror is not None:
                raise self.werror
            if not self.pending:
                return
            if self.closed:
                raise StreamClosedError("the stream was closed with bytes still pending")
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
            else:
                await self._wait_write()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` and wait until it is admitted (see ``drain``)."""
        self.write(data)
        if self.pending or self.werror is not None:
            await self.drain()

    def writable_now(self) -> bool:
        """True when a write would be admitted without waiting."""
        return (
            self.werror is not None
            or self.write_closed
            or (not self.pending and self.in_flight < self.core.options.write_high_water)
        )

    async def wait_writable(self) -> None:
        """Wait until a write might be admitted without waiting (or the stream broke)."""
        while not self.writable_now():
            blocked = self.flush()
            if self.writable_now():
                return
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
            else:
                await self._wait_write()

    def write_eof(self) -> None:
        """Close the writing half: FIN after every pending byte (idempotent)."""
        if self.write_closed:
            return
        self.write_closed = True
        if self.werror is None:
            self.eof = _EOF_WANTED
            self.flush()
        self._wake_writers()

    def close(self, stop_code: int = 0) -> None:
        """Close both halves: FIN after the pending bytes, and STOP_SENDING with
        ``stop_code`` unless the peer already finished (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.read_closed = True
        self.chunks.clear()
        self.rlen = 0
        self.head = 0
        if self.rstate == _RX_OPEN:
            self.stop_code = stop_code
        self.write_eof()
        self.flush()
        self._wake_readers()
        self._wake_writers()

    def abort(self, error_code: int = 0) -> None:
        """Reset the writing half and stop the reading half with ``error_code``; pending
        bytes are dropped (idempotent)."""
        if self.aborted:
            return
        self.aborted = True
        self.closed = True
        self.read_closed = True
        self.write_closed = True
        self.chunks.clear()
        self.rlen = 0
        self.head = 0
        self.pending.clear()
        self.pending_len = 0
        if self.eof != _EOF_SENT:
            self.eof = _EOF_SENT
            self.core.stream_op_nowait(self, "reset", error_code)
        if self.rstate == _RX_OPEN:
            self.stop_code = error_code
            self.flush()
        self._fail_write(StreamClosedError("the stream was aborted"))
        self._wake_readers()

    async def wait_closed(self) -> None:
        """Wait until the stream's state is reclaimed (every byte acknowledged, both halves
        ended) or its connection closed."""
        while not self.reclaimed and self.conn.state < _FAILED:
            blocked = self.flush()
            if blocked is not None:
                await blocked.released.wait_async(blocked.epoch)
                continue
            event = self.wwait
            if event is None:
                event = self.wwait = self.core.runtime.event()
            await event.wait()

    def on_send(self, completion: SendCompletion) -> None:
        self.in_flight -= completion.nbytes
        outcome = completion.outcome
        if outcome is not SendOutcome.ACKNOWLEDGED and self.werror is None:
            conn = self.conn
            if conn.state >= _FAILED:
                self._fail_write(conn.broken_error())
            else:
                gone = self.core.connection_gone
                if gone is not None and gone(conn.ref):
                    # The connection is going: the completion model delivers its sends'
                    # completions before its ``ConnectionClosed`` (with the thread driver, or
                    # staged event credits, the second may not even be queued yet). Fail the
                    # writer with the connection's error when that arrives
                    # (``on_connection_lost``), not with this send's.
                    self._wake_writers()
                    return
                self._fail_write(StreamBrokenError(f"the send was {outcome.value}"))
        if self.pending or self.eof == _EOF_WANTED:
            self.flush()
        self._wake_writers()

    def on_control(self, outcome: ControlOutcome) -> None:
        if outcome is not ControlOutcome.COMPLETE and self.werror is None and self.eof:
            self.werror = StreamBrokenError(f"finishing the stream was {outcome.value}")
        self._wake_writers()

    def on_closed(self, completion: StreamClosed) -> None:
        self.reclaimed = True
        state = self.rstate
        if state == _RX_OPEN and completion.peer_reset_code is not None:
            # The peer reset the stream while no receive of ours was posted (its bytes and
            # the reset arrived in one step, after the receive before them completed): the
            # reset reaches the reader through this event instead of a receive.
            self.reset_code = completion.peer_reset_code
            self.rstate = _RX_RESET
        elif state in (_RX_OPEN, _RX_CLOSING):
            # OPEN otherwise means the endpoint ended the receive half without telling a
            # receive; CLOSING: the stream is gone before its connection (no codes to wait
            # for).
            self.rstate = _RX_LOST
        if self.werror is None and (self.pending or self.eof != _EOF_SENT):
            # The endpoint ended the send half without our FIN: the peer stopped reading.
            self._fail_write(StreamBrokenError("the peer stopped the stream"))
        self._wake_readers()
        self._wake_writers()

    @property
    def settled(self) -> bool:
        """Reclaimed, with no operation of ours left to complete."""
        return self.reclaimed and not self.in_flight and not self.posted

    def on_connection_lost(self) -> None:
        if self.rstate == _RX_OPEN or self.rstate == _RX_CLOSING:
            self.rstate = _RX_LOST
        if self.werror is None and (self.pending or self.in_flight or not self.write_closed):
            self._fail_write(self.conn.broken_error())
        if self.posted:
            self.posted = False
            self.core.posted_receives -= 1
        self.cancellation = None
        self._wake_readers()
        self._wake_writers()


_ONE_BYTE: Final = ReceiveOptions(1)


@final
class _AcceptQueue:
    """Incoming streams waiting for ``accept``: bounded in total and per peer."""

    __slots__ = ("capacity", "closed", "core", "event", "items", "peer_limit", "per_peer")

    def __init__(self, core: EndpointCore, capacity: int, peer_limit: int) -> None:
        self.core = core
        self.capacity = capacity
        self.peer_limit = peer_limit
        self.items: deque[StreamCore] = deque()
        self.per_peer: dict[Pid, int] = {}
        self.event: AsyncEvent | None = None
        self.closed: QuicTransportError | None = None

    def offer(self, stream: StreamCore) -> bool:
        peer = stream.conn.peer
        assert peer is not None
        count = self.per_peer.get(peer, 0)
        if self.closed is not None or len(self.items) >= self.capacity or count >= self.peer_limit:
            return False
        self.per_peer[peer] = count + 1
        self.items.append(stream)
        event = self.event
        if event is not None:
            self.event = None
            event.set()
        return True

    def take_nowait(self) -> StreamCore | None:
        if not self.items:
            return None
        stream = self.items.popleft()
        peer = stream.conn.peer
        assert peer is not None
        left = self.per_peer[peer] - 1
        if left:
            self.per_peer[peer] = left
        else:
            del self.per_peer[peer]
        return stream

    async def take(self) -> StreamCore:
        while True:
            stream = self.take_nowait()
            if stream is not None:
                return stream
            if self.closed is not None:
                raise self.closed
            event = self.event
            if event is None:
                event = self.event = self.core.runtime.event()
            await event.wait()

    def close(self, error: QuicTransportError) -> list[StreamCore]:
        self.closed = error
        left = list(self.items)
        self.items.clear()
        self.per_peer.clear()
        event = self.event
        if event is not None:
            self.event = None
            event.set()
        return left


@final
class EndpointCore:
    """Completion dispatch and connection/stream state of one adapter endpoint.

    The adapter calls ``dispatch_ready()`` on its event loop whenever completions may have
    arrived (after each inline driver step, or from its pump task in thread mode). Everything
    else is called by the adapter's facades on the same thread.
    """

    __slots__ = (
        "__weakref__",
        "_blocked",
        "_handlers",
        "accepts",
        "channels",
        "commands",
        "connection_gone",
        "conns",
        "deferred",
        "draining",
        "link_accepts",
        "max_send_piece",
        "on_connection_closed",
        "on_established",
        "options",
        "posted_receives",
        "read_ahead_due",
        "read_ahead_slots",
        "refused_streams",
        "routing_pid",
        "runtime",
        "stopped",
        "stopped_event",
        "streams",
        "submitter",
        "unknown_completions",
        "write_through",
    )

    def __init__(
        self,
        channels: EndpointChannels[QuicCommand],
        runtime: Runtime,
        options: AdapterOptions,
        routing_pid: Pid,
    ) -> None:
        self.channels = channels
        self.runtime = runtime
        self.options = options
        self.routing_pid = routing_pid
        self.submitter = channels.streams
        self.max_send_piece = min(_MAX_SEND_CHUNK, channels.submissions.retained_budget.capacity)
        self.draining = False
        self.commands: dict[Any, _Request] = {}
        self.conns: dict[ConnectionRef, ConnectionCore] = {}
        self.streams: dict[StreamRef, StreamCore] = {}
        self.accepts = _AcceptQueue(self, options.accept_backlog, options.peer_accept_backlog)
        self.link_accepts = _AcceptQueue(self, options.accept_backlog, options.peer_accept_backlog)
        self.posted_receives = 0
        self.read_ahead_slots = max(1, channels.credits.capacity // 2)
        # Two hooks of the asyncio inline driver (None elsewhere), both to shorten the path
        # from a datagram to the reply it causes. ``read_ahead_due`` (a list only from a
        # step's dispatch to the end of its flush): streams whose read-ahead receive would
        # be posted now (by the dispatch, or by a read that took buffered bytes); the
        # driver posts them with ``post_read_aheads_from`` once its flush sent the reply, before
        # the next datagram can arrive. ``write_through``: offered each small write (its
        # stream and bytes); True: the driver admitted it and flushed at once, through its
        # send lane when nothing is queued ahead; False: not taken (the driver is on the
        # stack, or already wrote this cycle), the stream submits it as usual.
        self.read_ahead_due: list[StreamCore] | None = None
        self.write_through: Callable[[StreamRef, bytes], bool] | None = None
        self.deferred: deque[tuple[str, Any, int]] = deque()
        self.refused_streams = 0
        self.unknown_completions = 0
        self.stopped = False
        self.stopped_event: AsyncEvent = runtime.event()
        self.on_connection_closed: list[Callable[[ConnectionCore], None]] = []
        # ``EndpointDriver.connection_gone``, set by the adapter (None: unknown, a send that
        # did not complete fails its writer at once).
        self.connection_gone: Callable[[ConnectionRef], bool] | None = None
        self.on_established: list[Callable[[ConnectionCore], None]] = []
        self._blocked: dict[StreamCore, None] = {}
        self._handlers: dict[type, Callable[[Any], None]] = {
            SendCompletion: self._on_send,
            ReceiveCompletion: self._on_receive,
            FinishCompletion: self._on_control,
            StopCompletion: self._on_control,
            ResetCompletion: self._on_control,
            DiscardCompletion: self._on_discard,
            CommandCompletion: self._on_command,
            ConnectionEstablished: self._on_established,
            AuthenticationFailed: self._on_auth_failed,
            IncomingStream: self._on_incoming,
            StreamClosed: self._on_stream_closed,
            ConnectionClosed: self._on_connection_closed,
            DriverStopped: self._on_driver_stopped,
        }

    # -- dispatch -----------------------------------------------------------------------------

    def dispatch_ready(self) -> int:
        """Dispatch every queued completion (in batches); return how many.

        Each batch's leases are released before its first handler runs (a handler's new
        receive or send then finds the credit and the posted bytes back, as before), and a
        ``ReceiveCompletion``, the one a request/response exchange dispatches on the path to
        the woken reader, goes to its stream without the handler table's extra call."""
        receiver = self.channels.completions
        handlers = self._handlers
        streams = self.streams
        total = 0
        while True:
            completions = receiver.drain_released(_DISPATCH_BATCH)
            if not completions:
                if not self.stopped and receiver.is_closed():
                    self._on_driver_stopped(None)
                break
            total += len(completions)
            for completion in completions:
                if type(completion) is ReceiveCompletion:  # ``_on_receive``, inline
                    stream = streams.get(completion.stream)
                    if stream is not None:
                        stream.on_receive(completion)
                        if stream.reclaimed and stream.settled:
                            self._forget(stream)
                else:
                    handlers[type(completion)](completion)
            if len(completions) < _DISPATCH_BATCH:
                break
        if total and (self.deferred or self._blocked):
            self._retry()
        return total

    def post_read_aheads_from(self, due: list[StreamCore]) -> bool:
        """Post the read-aheads deferred to ``due`` (a ``read_ahead_due`` list) and empty
        it; True if any receive was submitted."""
        if not due:
            return False
        before = self.posted_receives
        for stream in due:
            stream.ahead_due = False
            if not stream.posted:
                stream._maybe_read_ahead()
        due.clear()
        return self.posted_receives != before

    def _retry(self) -> None:
        deferred = self.deferred
        for _ in range(len(deferred)):
            kind, target, code = deferred.popleft()
            self._submit_deferred(kind, target, code)
        blocked = self._blocked
        if blocked:
            self._blocked = {}
            for stream in blocked:
                stream.blocked = False
                stream.flush()

    def mark_blocked(self, stream: StreamCore) -> None:
        """Remember a stream whose flush was refused, to retry after completions."""
        if not stream.blocked:
            stream.blocked = True
            self._blocked[stream] = None

    def _on_send(self, completion: SendCompletion) -> None:
        stream = self.streams.get(completion.stream)
        if stream is not None:
            stream.on_send(completion)
            if stream.reclaimed and stream.settled:
                self._forget(stream)

    def _on_receive(self, completion: ReceiveCompletion) -> None:
        stream = self.streams.get(completion.stream)
        if stream is not None:
            stream.on_receive(completion)
            if stream.reclaimed and stream.settled:
                self._forget(stream)

    def _forget(self, stream: StreamCore) -> None:
        self.streams.pop(stream.ref, None)
        stream.conn.streams.pop(stream.ref, None)

    def _on_control(self, completion: FinishCompletion | StopCompletion | ResetCompletion) -> None:
        stream = self.streams.get(completion.stream)
        if stream is not None:
            stream.on_control(completion.outcome)

    def _on_discard(self, completion: DiscardCompletion) -> None:
        self.unknown_completions += 1  # the adapters never discard

    def _on_command(self, completion: CommandCompletion) -> None:
        request = self.commands.pop(completion.request, None)
        result = completion.result
        if isinstance(result, ConnectionCreated):
            expected, local = (None, self.routing_pid)
            if request is not None and request.context is not None:
                expected, local = request.context
            conn = ConnectionCore(
                self, result.connection, dialed=True, local_pid=local, expected=expected
            )
            self.conns[result.connection] = conn
            if request is None or request.abandoned:
                conn.close_nowait(0, "dial abandoned")
        elif isinstance(result, StreamOpened):
            owner = self.conns.get(result.stream.connection)
            if owner is not None:
                stream = StreamCore(self, owner, result.stream, local=True)
                self.streams[result.stream] = stream
                owner.streams[result.stream] = stream
                if request is None or request.abandoned:
                    stream.abort(0)
                else:
                    stream._maybe_read_ahead()
        if request is not None:
            request.result = result
            request.event.set()

    def _on_established(self, completion: ConnectionEstablished) -> None:
        conn = self.conns.get(completion.connection)
        if conn is None:
            conn = ConnectionCore(
                self,
                completion.connection,
                dialed=False,
                local_pid=completion.local_pid,
                expected=None,
            )
            self.conns[completion.connection] = conn
        conn.local_pid = completion.local_pid
        conn.peer = completion.peer_pid
        conn.actual = completion.peer_pid
        conn.state = _ESTABLISHED
        conn._signal()
        for hook in self.on_established:
            hook(conn)

    def _on_auth_failed(self, completion: AuthenticationFailed) -> None:
        conn = self.conns.get(completion.connection)
        if conn is None:  # an accepted connection whose peer was rejected: nobody waits
            return
        conn.actual = completion.actual
        conn.auth_reason = completion.reason
        conn.state = _FAILED
        conn._signal()

    def _on_incoming(self, completion: IncomingStream) -> None:
        conn = self.conns.get(completion.stream.connection)
        if conn is None or conn.state != _ESTABLISHED or conn.peer is None:
            self._refuse(completion.stream)
            return
        stream = StreamCore(self, conn, completion.stream, local=False)
        queue = self.link_accepts if conn.local_pid.is_link_local else self.accepts
        if not queue.offer(stream):
            self._refuse(completion.stream)
            return
        self.streams[completion.stream] = stream
        conn.streams[completion.stream] = stream
        stream._maybe_read_ahead()

    def _refuse(self, ref: StreamRef) -> None:
        self.refused_streams += 1
        self._submit_deferred("stop", ref, REFUSED_STREAM_CODE)
        self._submit_deferred("reset", ref, REFUSED_STREAM_CODE)

    def _on_stream_closed(self, completion: StreamClosed) -> None:
        stream = self.streams.get(completion.stream)
        if stream is not None:
            stream.on_closed(completion)
            if stream.settled:  # else kept until its late completions arrived
                self._forget(stream)

    def _on_connection_closed(self, completion: ConnectionClosed) -> None:
        conn = self.conns.pop(completion.connection, None)
        if conn is None:
            return
        conn.application_code = completion.application_code
        conn.transport_code = completion.transport_code
        conn.state = _CLOSED if conn.state != _FAILED else _FAILED
        for ref, stream in list(conn.streams.items()):
            self.streams.pop(ref, None)
            stream.on_connection_lost()
        conn.streams.clear()
        conn._signal()
        for hook in self.on_connection_closed:
            hook(conn)

    def _on_driver_stopped(self, completion: DriverStopped | None) -> None:
        if self.stopped:
            return
        self.stopped = True
        for request in self.commands.values():
            request.event.set()
        self.commands.clear()
        error = EndpointClosedError("the endpoint stopped")
        for queue in (self.accepts, self.link_accepts):
            for stream in queue.close(error):
                stream.on_connection_lost()
        for conn in list(self.conns.values()):
            conn.state = _CLOSED if conn.state != _FAILED else _FAILED
            for stream in list(conn.streams.values()):
                stream.on_connection_lost()
            conn._signal()
            for hook in self.on_connection_closed:
                hook(conn)
        self.conns.clear()
        self.streams.clear()
        self._blocked.clear()
        self.deferred.clear()
        self.stopped_event.set()

    # -- submissions ----------------------------------------------------------------------------

    def check_open(self) -> None:
        """Raise ``EndpointClosedError`` once the endpoint stopped."""
        if self.stopped:
            raise EndpointClosedError("the endpoint stopped")

    async def command(
        self, command: QuicCommand, context: tuple[Pid | None, Pid] | None = None
    ) -> CommandResult:
        """Submit ``command`` (waiting for admission) and wait for its result."""
        self.check_open()
        try:
            receipt = await self.channels.commands.submit(command)
        except SubmissionClosed:
            raise EndpointClosedError("the endpoint no longer admits commands") from None
        request = _Request(self.runtime.event(), context)
        self.commands[receipt.request] = request
        try:
            await request.event.wait()
        except BaseException:
            request.abandoned = True
            raise
        if request.result is None:
            raise EndpointClosedError("the endpoint stopped before the command completed")
        return request.result

    def command_nowait(self, command: QuicCommand) -> None:
        """Submit a command whose result nobody waits for (deferred when refused)."""
        self._submit_deferred("command", command, 0)

    def stream_op_nowait(self, stream: StreamCore, kind: str, code: int) -> None:
        """Submit a stop or reset on ``stream`` (deferred when refused)."""
        self._submit_deferred(kind, stream.ref, code)

    def _submit_deferred(self, kind: str, target: Any, code: int) -> None:
        if self.stopped:
            return
        try:
            if kind == "command":
                self.channels.commands.submit_nowait(target)
            elif kind == "stop":
                self.submitter.stop_nowait(target, code)
            else:
                self.submitter.reset_nowait(target, code)
        except WouldBlock:
            if len(self.deferred) < _MAX_DEFERRED:
                self.deferred.append((kind, target, code))
        except SubmissionClosed:
            pass

    async def connect(
        self,
        route: Pid,
        address: DatagramAddr,
        *,
        expected: Pid | None,
        source: Pid | None = None,
        server_name: str | None = None,
    ) -> ConnectionCore:
        """Dial and wait for the authenticated connection.

        Raises ``PeerAuthenticationError`` (identity mismatch), ``ConnectError`` (refused or
        closed during the handshake) or ``EndpointClosedError``.
        """
        local = self.routing_pid if source is None else source
        result = await self.command(
            Connect(
                route=route,
                peer=address,
                expected=expected,
                source=source,
                server_name=server_name,
            ),
            (expected, local),
        )
        if isinstance(result, CommandFailed):
            raise ConnectError(f"connect refused: {result.error.value} {result.detail}".strip())
        if not isinstance(result, ConnectionCreated):
            raise ConnectError(f"unexpected connect result {result!r}")
        conn = self.conns.get(result.connection)
        if conn is None:
            raise ConnectError("the connection closed before its handshake")
        try:
            await conn.wait_settled()
        except BaseException:
            if conn.state == _HANDSHAKING:
                conn.close_nowait(0, "dial abandoned")
            raise
        if conn.state == _ESTABLISHED:
            return conn
        if conn.state == _FAILED:
            raise PeerAuthenticationError(expected, conn.actual, conn.auth_reason)
        raise ConnectError(
            "the connection closed during its handshake",
            application_code=conn.application_code,
            transport_code=conn.transport_code,
        )

    def begin_shutdown(self) -> None:
        """Before a graceful shutdown: cancel every posted receive and post no new one, so
        idle reads do not hold the endpoint's drain for its whole grace period (blocked
        readers then see the connection close)."""
        self.draining = True
        for stream in list(self.streams.values()):
            cancellation = stream.cancellation
            if cancellation is not None:
                stream.cancellation = None
                cancellation.cancel()

    def shutdown_nowait(self, grace: float) -> None:
        """Ask the driver for a graceful shutdown within ``grace`` seconds (idempotent)."""
        if self.stopped:
            return
        self.begin_shutdown()
        try:
            self.channels.commands.submit_and_close_nowait(Shutdown(grace))
        except SubmissionClosed:
            pass
        except WouldBlock:
            # Full: close admission; the endpoint shuts down with its configured grace.
            self.channels.submissions.close()

    def abort_nowait(self) -> None:
        """Ask the driver to abort (idempotent; everything is returned at once)."""
        try:
            self.channels.commands.submit_and_close_nowait(Abort())
        except (WouldBlock, SubmissionClosed):
            # Full: close admission; the endpoint then shuts down with its default grace.
            self.channels.submissions.close()

    def statistics_counts(self) -> tuple[int, int, int]:
        """(live connections, live streams, refused streams)."""
        return len(self.conns), len(self.streams), self.refused_streams


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
    engine: EngineFactory | None = None

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


def thread_name(pid: Pid) -> str:
    """The driver thread's name: ``chrysalis-quic-`` and the first 4 PID bytes in hex."""
    return f"chrysalis-quic-{pid.raw[:4].hex()}"
