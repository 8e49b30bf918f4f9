"""The asyncio adapter: a ``QuicEndpoint`` on an asyncio event loop, with asyncio-style streams.

Why it looks like this: the endpoint is sans-IO and the runtime-neutral work (the I/O step,
completion dispatch, stream state) lives in ``_driver``; this module only supplies asyncio's
waiting and task primitives and the familiar ``StreamReader``/``StreamWriter`` vocabulary.

Driver placement. By default (``driver="inline"``) the endpoint runs *on the event loop*, as
loop callbacks (``_InlineDriver``): a readable socket (``loop.add_reader`` on its descriptors,
registered once, or its receive waker), the channels' driver notifier and the endpoint's timer
each run or schedule one ``EndpointDriver.step`` (drain the socket, feed every datagram, poll),
whose completions are dispatched at once; the output is flushed once, after the tasks those
completions woke had their turn (the first small write of such a task is flushed at once,
from inside ``write``: see ``_InlineDriver``). A lifecycle task only awaits the driver's end.
``driver="thread"`` runs the same step on a dedicated thread (``chrysalis-quic-<pid>``, as the
reference implementation does) and a pump task dispatches completions on the loop. Inline won
the measurement that decided the default (``benchmarks/quic_driver_choice.py``: 16-byte
ping-pong on one stream, two processes over UDP loopback, 2 shared cores): p50 round trip 691
us inline against 926 us on a thread with aioquic (median per-round ratio 1.32x over 8 ABAB
rounds), 395 us against 583 us with qh3 (1.48x), and about 1.5 times the messages per second
with 64 in flight. A thread hand-off costs tens of microseconds each way and both sides share
the GIL, and only the inline loop can let the tasks a completion woke answer before flushing,
so that replies carry the acknowledgements (about 27% fewer datagrams per round trip).

Structure: ``AsyncioEndpoint.spawn_*`` return async context managers; every task the endpoint
starts (its driver or pump, and tasks ``QuicTransport`` spawns through it) ends before
``aclose`` returns. Leaving the ``async with`` block normally shuts down gracefully (1 s of
grace), leaving it with an exception aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final, TypeVar, Unpack, final

from chrysalis.core import Pid
from chrysalis.core.completion import (
    ExceedsBudget,
    StreamRef,
    SubmissionClosed,
    SubmissionLimits,
    WouldBlock,
)
from chrysalis.datagram import DatagramSocket
from chrysalis.quic._byte_stream import MAX_READ_ALL
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._driver import (
    DEFAULT_DRIVER_MODE,
    EndpointDriver,
    EndpointSettings,
    SpawnOptions,
    ThreadNotifier,
    thread_name,
)
from chrysalis.quic._endpoint import (
    ConnectionStatistics,
    EndpointRole,
    EndpointState,
)
from chrysalis.quic._endpoint_core import (
    AdapterOptions,
    ConnectionCore,
    ConnectionView,
    EndpointCore,
    EndpointFacade,
)
from chrysalis.quic._engines.base import EngineFactory
from chrysalis.quic._errors import EndpointClosedError, IncompleteReadError
from chrysalis.quic._identity import Identity
from chrysalis.quic._stream_core import StreamCore

__all__ = ["AsyncioConnection", "AsyncioEndpoint", "AsyncioStream"]

T = TypeVar("T")
_NEVER: Final = float("inf")
_log = logging.getLogger("chrysalis.quic")

DEFAULT_SHUTDOWN_GRACE: Final = 1.0
_STOP_MARGIN: Final = 2.0
_STREAM_LIMIT: Final = 64 * 1024


# --- runtime services --------------------------------------------------------------------------


@final
class _Event:
    """A set-once event (the adapters' ``AsyncEvent``): ``asyncio.Event`` without ``clear``.

    Why not ``asyncio.Event``: a stream makes one event per wait (every read that finds no
    data), and this one is cheaper to create, wait on and set (no deque, no mixin, one
    future per waiter). ``wait()`` returns the waiter's future itself rather than a
    coroutine around it: awaiting it is the same, without a coroutine frame per wait (every
    read that finds no data waits once). Several tasks may wait; a waiter cancelled while
    waiting cancels its own future, which ``set`` skips and a later ``wait`` forgets.
    """

    __slots__ = ("_loop", "_set", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        self._waiters: list[asyncio.Future[bool]] | None = None

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for future in waiters:
                if not future.done():
                    future.set_result(True)

    def is_set(self) -> bool:
        return self._set

    def wait(self) -> asyncio.Future[bool]:
        """An awaitable that gives True once the event is set (at once if it is)."""
        # The Future class directly: ``loop.create_future()`` is one more Python call per
        # wait to build the same object.
        future: asyncio.Future[bool] = asyncio.Future(loop=self._loop)
        if self._set:
            future.set_result(True)
            return future
        waiters = self._waiters
        if waiters is None:
            self._waiters = [future]
        else:
            # Forget waiters cancelled meanwhile (timeouts), so that they cannot pile up on
            # an event that is never set: after a cancelled last waiter (one reader timing
            # out again and again) and whenever the list doubled (amortised O(1) per wait).
            count = len(waiters)
            if waiters[-1].done() or not count & (count - 1):
                waiters[:] = [waiter for waiter in waiters if not waiter.done()]
            waiters.append(future)
        return future


@final
class _Runtime:
    """``Runtime`` for asyncio: events, owned tasks, soon-callbacks and timeouts."""

    __slots__ = ("closed", "errors", "loop", "tasks")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.tasks: set[asyncio.Task[Any]] = set()
        self.errors = 0
        self.closed = False

    def event(self) -> _Event:
        return _Event(self.loop)

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        if self.closed:  # the endpoint is closing: nothing new may start
            return
        task = self.loop.create_task(self._guard(fn, *args))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _guard(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        try:
            await fn(*args)
        except (asyncio.CancelledError, EndpointClosedError):
            pass
        except Exception:
            self.errors += 1
            _log.exception("a task of a QUIC endpoint failed")

    def call_soon(self, fn: Callable[[], object]) -> None:
        self.loop.call_soon(fn)

    async def with_timeout(self, seconds: float, fn: Callable[[], Awaitable[T]]) -> T:
        async with asyncio.timeout(seconds):
            return await fn()

    async def cancel_all(self) -> None:
        self.closed = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


@final
class _LoopNotifier:
    """The driver notifier of the inline mode: records why the driver must run and schedules
    it (``kick``) through ``call_soon``, never running it inside the caller (a ``write``)."""

    __slots__ = ("flag", "io", "kick", "loop", "queued", "thread", "unpolled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.thread = threading.get_ident()
        self.flag = False  # new submissions (the channels' driver notifier)
        self.io = False  # a carrier waker fired (kept apart: a flush does not consume it)
        # The same news for the endpoint's ``poll`` (``QuicEndpoint.poll_hint``), which
        # clears it: the driver's ``flag`` is cleared on its own schedule.
        self.unpolled = True
        # Set by the inline driver while one of its callbacks is queued or running that
        # reads ``flag`` before the driver goes idle: a notification then needs no kick
        # (three calls less per submission; each read and write notifies).
        self.queued = False
        self.kick: Callable[[], None] | None = None  # set while the inline driver runs

    def notify_io(self) -> None:
        self.io = True
        self._schedule()

    def notify(self) -> None:
        self.flag = True
        self.unpolled = True
        if not self.queued:
            self._schedule()

    def _schedule(self) -> None:
        kick = self.kick
        if kick is not None:
            if threading.get_ident() == self.thread:
                kick()
            else:
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits
                    self.loop.call_soon_threadsafe(kick)


@final
class _InlineDriver:
    """The inline driver as loop callbacks rather than a task that awaits its next wake-up.

    Why callbacks: a wake-up then costs one callback instead of a future, a task step and an
    extra loop turn. A readable socket runs ``_run`` straight from the selector's callback: one
    ``step`` without flushing, then the completions it produced are dispatched; if they woke
    tasks, ``_finish`` is queued behind those tasks (``call_soon`` is FIFO), so that their
    replies are admitted by its poll and leave in the same datagrams as the acknowledgements of
    what they answer. Submissions, carrier wakers and the timer only *schedule* ``_run``
    (``kick``). The loop timer is re-armed only when the endpoint's deadline moved earlier:
    one that moved later (every packet sent pushes the loss timer out) leaves the armed timer
    in place, which then fires early once and re-arms for the real deadline (a second loop
    timer takes a deadline that comes and goes, such as a held ACK: see ``_arm``). ``done`` resolves
    when the endpoint stopped (or fails with the driver's error); the endpoint's lifecycle
    task awaits it.

    The path from a datagram to the reply it causes is what both peers of a request/response
    exchange wait on, so work that the reply does not need waits until the reply left: the
    first small write of a woken task is flushed from inside ``write`` (``write_through``),
    and the read-aheads the dispatch would post (``EndpointCore.read_ahead_due``) and the
    completion of sends the datagram acknowledged (``QuicEndpoint.hold_ack_checks``) follow
    it, admitted by one poll (``EndpointDriver.admit``) before the next datagram is read.
    """

    __slots__ = (
        "_busy",
        "_core",
        "_driver",
        "_due",
        "_endpoint",
        "_fds",
        "_finishing",
        "_loop",
        "_more",
        "_near",
        "_near_at",
        "_notifier",
        "_scheduled",
        "_seen",
        "_stop",
        "_timer",
        "_timer_at",
        "_wrote",
        "done",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        driver: EndpointDriver,
        core: EndpointCore,
        notifier: _LoopNotifier,
        stop: threading.Event,
    ) -> None:
        self._loop = loop
        self._driver = driver
        self._endpoint = driver.endpoint
        self._seen = -1  # ``endpoint.emitted`` at the last dispatch
        self._core = core
        self._notifier = notifier
        self._stop = stop
        self._fds = driver.socket.readiness_fds()
        self._scheduled = False  # a _run is queued
        self._finishing = False  # a _finish is queued behind the tasks a dispatch woke
        self._more = False
        self._busy = False  # a step, dispatch or flush of this driver is on the stack
        self._due: list[StreamCore] = []  # ``core.read_ahead_due`` during a cycle
        self._wrote = False  # a write went out through ``write_through`` this cycle
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = _NEVER
        # A second loop timer for a deadline earlier than ``_timer`` (see ``_arm``).
        self._near: asyncio.TimerHandle | None = None
        self._near_at = _NEVER
        self.done: asyncio.Future[None] = loop.create_future()

    def start(self) -> None:
        loop = self._loop
        for fd in self._fds:
            loop.add_reader(fd, self._run)
        self._notifier.kick = self.kick
        self._core.write_through = self.write_through
        # Every notification sets ``unpolled`` and either kicks this driver or finds one of
        # its callbacks queued or running that reads ``flag`` before going idle
        # (``_LoopNotifier.queued``), so a poll that the notifier says has nothing new to
        # drain can be skipped.
        self._endpoint.poll_hint = self._notifier
        self.kick()

    def kick(self) -> None:
        """Run the driver soon (on this loop's thread only)."""
        if not (self._scheduled or self._finishing):
            self._scheduled = True
            self._notifier.queued = True
            self._loop.call_soon(self._kicked)

    def _kicked(self) -> None:
        self._scheduled = False
        self._run()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = _NEVER
        deadline = self._driver._deadline  # the property's value, one call less per wake-up
        if deadline is not None and deadline > self._loop.time():
            # Armed for a deadline that has since moved later (every packet sent pushes the
            # loss timer out; an ACK that rode along cancels the ACK timer): re-arm for the
            # real one instead of running a whole step, unless the near timer covers it.
            # ``deadline`` is current: it is refreshed by every flush, and anything that
            # could move it queues a step.
            if self._near_at > deadline:
                self._timer = self._loop.call_at(deadline, self._on_timer)
                self._timer_at = deadline
            return
        self._run()

    def _on_near(self) -> None:
        self._near = None
        self._near_at = _NEVER
        deadline = self._driver._deadline
        if deadline is not None and deadline > self._loop.time():
            # Early (see ``_on_timer``); the usual case is covered by ``_timer``.
            if self._timer_at > deadline:
                self._near = self._loop.call_at(deadline, self._on_near)
                self._near_at = deadline
            return
        self._run()

    def write_through(self, ref: StreamRef, data: bytes) -> bool:
        """Admit a small write and send it now, from inside ``write``; False: not taken.

        Why: the woken task's reply otherwise waits for the queued ``_finish``, behind the
        rest of the task's step (usually its next read: a receive to post, an event and a
        future to build) and a loop callback. Sending it first takes that off the path from
        the request to the reply, and both peers wait on that path. Once per cycle only
        (more writes of the same step are batched by ``_finish`` as before), never from
        the driver's own stack (a completion handler), never for bulk writes (the stream
        offers only small ones). When the driver was idle (a write that no datagram
        woke), a ``_finish`` is queued to admit the rest of the step and arm the timer,
        unless a step is already queued.

        The send lane: when nothing is queued ahead of the write (no submission, no
        cancellation, nothing staged or runnable in the endpoint: ``QuicEndpoint.send_direct``
        and ``StreamSubmitter.send_direct_nowait`` check), the endpoint takes it straight
        into the stream's engine and the flush skips its poll; the notifier is not
        involved. It is admitted, accounted (credit, retained bytes) and completed exactly
        like a queued send, and being first in line it keeps submission order. Otherwise it
        is submitted through the queue and the flush polls it in, as before.
        """
        if self._busy or self._wrote or self.done.done():
            return False
        core = self._core
        endpoint = self._endpoint
        self._busy = True
        admitted = False
        try:
            submitter = core.submitter
            lane = endpoint.send_direct(ref, data, submitter.send_direct_nowait)
            if not lane:
                try:
                    submitter.send_nowait(ref, data)
                except (WouldBlock, SubmissionClosed, ExceedsBudget):
                    return False  # the stream queues it and waits on the bound
            admitted = True
            self._wrote = True
            if not (self._finishing or self._scheduled):
                self._finishing = True
                self._more = False
                self._loop.call_soon(self._finish)
            # The flush's poll consumes the notifications; after the lane such a poll would
            # have found nothing to do (``send_direct``'s conditions), so it is skipped.
            notifier = self._notifier
            notifier.flag = False
            driver = self._driver
            if lane:
                driver.flush(poll=False)
            else:
                driver.flush()
            # The reply left: now the acknowledgements the step held back and the deferred
            # read-aheads (``admit`` polls them in).
            endpoint.hold_ack_checks = False
            if core.post_read_aheads_from(self._due) or endpoint.acks_held:
                notifier.flag = False
                driver.admit()
        except BaseException as exc:
            if not admitted:
                raise  # the writer's error (admission takes nothing when it raises)
            self._fail(exc)
        finally:
            self._busy = False
        return True

    def _run(self) -> None:
        if self._finishing or self.done.done():
            return  # the queued _finish polls and flushes; it runs before any new I/O
        notifier = self._notifier
        self._busy = True
        try:
            notifier.queued = True  # ``_settle`` or the queued ``_finish`` reads ``flag``
            notifier.flag = False
            notifier.io = False
            driver = self._driver
            endpoint = self._endpoint
            # Sends that the datagrams acknowledge complete after the reply left (see
            # ``QuicEndpoint.hold_ack_checks``; released by ``write_through`` or ``_finish``).
            endpoint.hold_ack_checks = True
            more = driver.step(flush=False)
            # Set before dispatching: submissions the handlers make need no kick of their
            # own, the queued _finish polls them.
            self._finishing = True
            self._seen = endpoint.emitted  # handlers never run the endpoint
            core = self._core
            # Read-aheads wait until the reply left (``write_through`` or ``_finish``).
            core.read_ahead_due = self._due
            dispatched = core.dispatch_ready()
            if not dispatched:
                # Nothing to answer (an acknowledgement alone, a timer): no reply to hurry.
                endpoint.hold_ack_checks = False
                if endpoint.acks_held:
                    driver.admit()
                    self._seen = endpoint.emitted
                    dispatched = core.dispatch_ready()
            if dispatched:
                # Let the woken tasks answer first (see the class docstring).
                self._more = more
                self._loop.call_soon(self._finish)
                return
            core.read_ahead_due = None  # nothing was dispatched: nothing deferred
            self._finishing = False
            # Nothing ran since the step's own poll: nothing new to admit.
            driver.flush(poll=False)
            self._settle(more)
        except BaseException as exc:  # a bug: end the driver, report it from aclose
            self._fail(exc)
        finally:
            self._busy = False

    def _finish(self) -> None:
        if self.done.done():
            self._finishing = False
            return
        self._busy = True
        try:
            # The flush's poll admits what the woken tasks submitted: their notifications
            # need no further step unless the poll stopped at a bound. A write that went
            # out through ``write_through`` already flushed everything up to it: flush
            # again only if something was submitted since.
            notifier = self._notifier
            driver = self._driver
            endpoint = self._endpoint
            endpoint.hold_ack_checks = False
            if not self._wrote or notifier.flag:
                notifier.flag = False
                driver.flush()
            # The read-aheads deferred since the dispatch (``_finishing`` still suppresses
            # the kick of their notifications: ``admit`` admits them).
            core = self._core
            core.read_ahead_due = None
            due = self._due
            if (due and core.post_read_aheads_from(due)) or endpoint._acks_held:
                notifier.flag = False
                driver.admit()
            self._finishing = False
            self._settle(self._more)
        except BaseException as exc:
            self._finishing = False
            self._fail(exc)
        finally:
            self._busy = False

    def _settle(self, more: bool) -> None:
        core = self._core
        notifier = self._notifier
        endpoint = self._endpoint
        self._wrote = False  # the cycle ends: the next one may write through again
        # (The endpoint's attributes behind ``backlogged`` and ``is_stopped``: this runs
        # after every cycle.)
        if endpoint._backlogged:
            notifier.flag = True  # the last poll stopped at a bound: poll again
        emitted = endpoint.emitted
        if emitted != self._seen:
            # Only what the endpoint emitted since the last dispatch can be queued (the
            # usual flush emits nothing: its reply is acknowledged later).
            self._seen = emitted
            core.dispatch_ready()
        if endpoint._state is EndpointState.STOPPED or self._stop.is_set():
            core.dispatch_ready()
            self.close()
            if not self.done.done():
                self.done.set_result(None)
            return
        # From here a notification must kick: the flag is read once more, just below.
        notifier.queued = False
        if more or notifier.flag or notifier.io:
            self.kick()
            return
        self._arm()

    def _arm(self) -> None:
        driver = self._driver
        loop = self._loop
        # Registered descriptors (the common case): only the timer, which also retries the
        # destinations whose output the driver holds (never writability: see the driver).
        # (The driver's attributes behind its properties: this runs after every step.)
        if not self._fds and not driver._socket_failed:
            driver.socket.add_recv_waker(self._notifier.notify_io)
        # Two loop timers, so that a deadline that comes and goes does not move the one
        # that covers the others: qh3 holds every other ACK for about 1 ms, so the deadline
        # alternates between that ACK timer and the loss timer (tens of ms, pushed out by
        # every packet sent), and the next step's packet makes the ACK timer moot. With one
        # timer each ACK deadline cancelled the loss timer's loop timer (a cancelled handle
        # left in the loop's heap) and then fired early to re-arm it (a loop wake-up, a
        # callback and a ``call_at``). Now ``_timer`` keeps the later deadline (or the only
        # one, when none is armed), ``_near`` takes an earlier one and is cancelled as soon
        # as ``_timer`` covers the deadline again (a cancelled handle at the heap's head is
        # dropped without a wake-up). Either fires early at most once and re-arms only when
        # the other does not cover the deadline. Invariant: min(_timer_at, _near_at) <= deadline.
        deadline = driver._deadline
        if deadline is None:
            return  # an armed timer fires once more, harmlessly
        if deadline >= self._timer_at:
            near = self._near
            if near is not None:  # moot: it would only fire early
                near.cancel()
                self._near = None
                self._near_at = _NEVER
            return
        if deadline >= self._near_at:
            return
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._on_timer)
            self._timer_at = deadline
            return
        near = self._near
        if near is not None:
            near.cancel()
        self._near = loop.call_at(deadline, self._on_near)
        self._near_at = deadline

    def _fail(self, exc: BaseException) -> None:
        self.close()
        if not self.done.done():
            self.done.set_exception(exc)
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise exc  # as from a task: these still stop the loop

    def close(self) -> None:
        """Unregister every callback (idempotent); queued callbacks then do nothing."""
        self._notifier.kick = None
        core = self._core
        core.write_through = None
        core.read_ahead_due = None  # streams post their own receives again (moot now)
        self._endpoint.hold_ack_checks = False
        self._endpoint.poll_hint = None  # whoever polls next looks at the queues
        for stream in self._due:
            stream.ahead_due = False
        self._due.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = _NEVER
        if self._near is not None:
            self._near.cancel()
            self._near = None
            self._near_at = _NEVER
        for fd in self._fds:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(fd)
        self._fds = []
        if not self.done.done():
            self._finishing = True  # makes every queued callback a no-op


# --- the endpoint ------------------------------------------------------------------------------


class _Spawn:
    """The async context manager ``spawn_*`` return (``async with ... as endpoint``)."""

    __slots__ = ("_endpoint", "_settings")

    def __init__(self, settings: EndpointSettings) -> None:
        self._settings = settings
        self._endpoint: AsyncioEndpoint | None = None

    async def __aenter__(self) -> AsyncioEndpoint:
        endpoint = AsyncioEndpoint(self._settings)
        endpoint._start()
        self._endpoint = endpoint
        return endpoint

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        endpoint = self._endpoint
        assert endpoint is not None
        if exc_type is None:
            await endpoint.aclose()
        else:
            await endpoint.aclose(abort=True)


@final
class AsyncioEndpoint(EndpointFacade["AsyncioConnection", "AsyncioStream"]):
    """A QUIC endpoint driven on the running asyncio loop (see the module docstring).

    Create it with ``spawn_client``, ``spawn_server``, ``spawn_duplex`` or
    ``spawn_duplex_routed`` inside ``async with``. It dials (``connect``), accepts streams
    (``accept`` for connections that terminate at this endpoint's PID, ``accept_link_local``
    for connections that terminate at the link-local PID 0) and shuts down (``shutdown``,
    ``abort``, ``aclose``). Not thread-safe: use it from its loop.
    """

    __slots__ = (
        "_aborting",
        "_channels",
        "_closed",
        "_closing",
        "_error",
        "_loop",
        "_notifier",
        "_runtime",
        "_settings",
        "_stop",
        "_task",
        "_thread",
    )

    def __init__(self, settings: EndpointSettings) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._settings = settings
        self._identity = settings.identity
        self._mode = settings.driver
        self._runtime = _Runtime(loop)
        notifier: _LoopNotifier | ThreadNotifier
        if settings.driver == "inline":
            notifier = _LoopNotifier(loop)
            # The loop's clock (its timers fire on it); the stock loops' ``time`` is
            # ``time.monotonic`` behind a Python frame: read that directly (one frame less
            # per clock read, several per cycle). A loop with a clock of its own keeps it.
            clock = (
                time.monotonic
                if getattr(type(loop), "time", None) is asyncio.BaseEventLoop.time
                else loop.time
            )
            channels, endpoint, driver = settings.build(notifier, clock)
        else:
            notifier = ThreadNotifier()
            channels, endpoint, driver = settings.build(notifier, time.monotonic)
        self._notifier = notifier
        self._channels = channels
        self._endpoint = endpoint
        self._driver = driver
        options = AdapterOptions() if settings.options is None else settings.options
        self._core = EndpointCore(channels, self._runtime, options, endpoint.routing_pid)
        self._core.connection_gone = driver.connection_gone
        driver.on_socket_failure = self._core.abort_nowait
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._aborting = False

    # -- construction ---------------------------------------------------------------------------

    @staticmethod
    def spawn(
        identity: Identity,
        socket: DatagramSocket,
        *,
        role: EndpointRole,
        route: Pid | None = None,
        config: QuicConfig | None = None,
        limits: EndpointLimits | None = None,
        options: AdapterOptions | None = None,
        submission_limits: SubmissionLimits | None = None,
        completion_credits: int = 8192,
        event_credits: int = 4096,
        driver: str = DEFAULT_DRIVER_MODE,
        close_socket: bool = True,
        engine: EngineFactory | None = None,
    ) -> _Spawn:
        """An endpoint of ``role`` over ``socket`` (``async with``); a ``route`` (a PID) is put
        in the CIDs of the connections it dials instead of ``identity.pid`` (``Pid.LINK_LOCAL``
        for a dedicated link-local endpoint). The other options are ``EndpointSettings``'."""
        return _Spawn(
            EndpointSettings(
                identity,
                socket,
                role,
                route,
                config,
                limits,
                options,
                submission_limits,
                completion_credits,
                event_credits,
                driver,
                close_socket,
                engine,
            )
        )

    @staticmethod
    def spawn_client(
        identity: Identity, socket: DatagramSocket, **options: Unpack[SpawnOptions]
    ) -> _Spawn:
        """An endpoint that only dials, over ``socket`` (``async with``)."""
        return AsyncioEndpoint.spawn(identity, socket, role=EndpointRole.CLIENT, **options)

    @staticmethod
    def spawn_server(
        identity: Identity, socket: DatagramSocket, **options: Unpack[SpawnOptions]
    ) -> _Spawn:
        """An endpoint that only accepts, over ``socket`` (``async with``)."""
        return AsyncioEndpoint.spawn(identity, socket, role=EndpointRole.SERVER, **options)

    @staticmethod
    def spawn_duplex(
        identity: Identity, socket: DatagramSocket, **options: Unpack[SpawnOptions]
    ) -> _Spawn:
        """An endpoint that dials and accepts, routed by ``identity.pid`` (``async with``)."""
        return AsyncioEndpoint.spawn(identity, socket, role=EndpointRole.DUPLEX, **options)

    @staticmethod
    def spawn_duplex_routed(
        identity: Identity,
        socket: DatagramSocket,
        *,
        routing_pid: Pid,
        **options: Unpack[SpawnOptions],
    ) -> _Spawn:
        """A duplex endpoint whose dialled connections carry ``routing_pid`` in their CIDs
        (``Pid.LINK_LOCAL`` for a dedicated link-local endpoint), typically over a routed
        ``DatagramSwitch`` binding (``async with``)."""
        return AsyncioEndpoint.spawn(
            identity, socket, role=EndpointRole.DUPLEX, route=routing_pid, **options
        )

    def _start(self) -> None:
        if self._mode == "inline":
            self._task = self._loop.create_task(self._run_inline(), name="chrysalis-quic-driver")
        else:
            thread = threading.Thread(
                target=self._run_thread, name=thread_name(self._identity.pid), daemon=True
            )
            self._thread = thread
            thread.start()
            self._task = self._loop.create_task(self._pump(), name="chrysalis-quic-pump")

    # -- properties -------------------------------------------------------------------------------

    @property
    def runtime(self) -> _Runtime:
        """The runtime services (``QuicTransport`` uses them to own its tasks)."""
        return self._runtime

    def connections(self) -> list[AsyncioConnection]:
        """The live connections (dialled and accepted, established or not)."""
        return [self.wrap_connection(conn) for conn in list(self._core.conns.values())]

    # -- the driver -------------------------------------------------------------------------------

    async def _run_inline(self) -> None:
        notifier = self._notifier
        assert isinstance(notifier, _LoopNotifier)
        inline = _InlineDriver(self._loop, self._driver, self._core, notifier, self._stop)
        try:
            inline.start()
            await inline.done
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self._error = exc
                _log.exception("the QUIC endpoint driver failed")
            self._core._on_driver_stopped(None)
            raise
        finally:
            inline.close()

    def _run_thread(self) -> None:
        notifier = self._notifier
        assert isinstance(notifier, ThreadNotifier)
        try:
            self._driver.run_forever(notifier, self._stop)
        except BaseException as exc:  # a bug: make the loop side see the end
            self._error = exc
            _log.exception("the QUIC endpoint driver thread failed")
        finally:
            # The endpoint closes its completion sender when it stops; after a failure this
            # makes the pump see the end of the queue.
            self._channels.completion_sender.close()

    async def _pump(self) -> None:
        core = self._core
        arrived = self._channels.completions.arrived
        while True:
            seen = arrived.epoch()
            core.dispatch_ready()
            if core.stopped:
                return
            await arrived.wait_async(seen)

    # -- dialling and accepting -----------------------------------------------------------------

    def wrap_connection(self, conn: ConnectionCore) -> AsyncioConnection:
        """The facade of ``conn`` (one per connection)."""
        facade = conn.facade
        if isinstance(facade, AsyncioConnection):
            return facade
        wrapped = AsyncioConnection(self, conn)
        conn.facade = wrapped
        return wrapped

    def wrap_stream(self, stream: StreamCore) -> AsyncioStream:
        """The facade of ``stream`` (one per stream)."""
        facade = stream.facade
        if isinstance(facade, AsyncioStream):
            return facade
        wrapped = AsyncioStream(self.wrap_connection(stream.conn), stream)
        stream.facade = wrapped
        return wrapped

    # -- shutdown -------------------------------------------------------------------------------

    async def shutdown(self, grace: float = DEFAULT_SHUTDOWN_GRACE) -> None:
        """Graceful shutdown: stop admission, let queued work finish, close every connection
        with code 0, abandon what remains after ``grace`` seconds; returns when the driver
        stopped (an abort follows if it overstays ``grace`` plus a margin)."""
        self._core.shutdown_nowait(grace)
        try:
            async with asyncio.timeout(grace + _STOP_MARGIN):
                await self._wait_stopped()
        except TimeoutError:
            await self.abort()

    async def abort(self) -> None:
        """Abort: every connection is dropped and every operation returned at once; returns
        when the driver stopped (or, if it does not stop within a margin, after forcing it)."""
        self._aborting = True
        if not self._core.stopped:
            self._core.abort_nowait()
        try:
            async with asyncio.timeout(_STOP_MARGIN):
                await self._wait_stopped()
        except TimeoutError:
            self._force_stop()

    async def _wait_stopped(self) -> None:
        core = self._core
        if not core.stopped:
            await core.stopped_event.wait()
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait({task})

    def _force_stop(self) -> None:
        self._stop.set()
        self._notifier.notify()
        if self._task is not None:
            self._task.cancel()
        self._core._on_driver_stopped(None)

    async def aclose(self, *, abort: bool = False, grace: float = DEFAULT_SHUTDOWN_GRACE) -> None:
        """Shut down (gracefully, or at once with ``abort=True``), end every task the endpoint
        owns, join the driver thread and close the socket (unless ``close_socket=False``).
        Idempotent; concurrent callers wait for the first."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            if abort:
                await self.abort()
            else:
                await self.shutdown(grace)
            await self._runtime.cancel_all()
            task = self._task
            if task is not None:
                if not task.done():
                    self._force_stop()
                await asyncio.gather(task, return_exceptions=True)
            thread = self._thread
            if thread is not None:
                self._stop.set()
                assert isinstance(self._notifier, ThreadNotifier)
                self._notifier.notify()
                await asyncio.to_thread(thread.join, 5.0)
                self._notifier.close()
            if self._settings.close_socket:
                sock = self._driver.socket
                sock.shutdown()
                if not sock.join(0):
                    await asyncio.to_thread(sock.join, 5.0)
        finally:
            self._closed.set()
        if self._error is not None:
            raise EndpointClosedError("the QUIC endpoint driver failed") from self._error

    async def __aenter__(self) -> AsyncioEndpoint:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose(abort=exc_type is not None)


# --- connections and streams -------------------------------------------------------------------


@final
class AsyncioConnection(ConnectionView):
    """One authenticated QUIC connection of an ``AsyncioEndpoint``.

    ``peer`` is the PID the peer's certificate proves; ``local_pid`` the PID this side's
    CIDs carry (``Pid.LINK_LOCAL`` on a link-local connection).
    """

    __slots__ = ("__weakref__", "_endpoint")

    def __init__(self, endpoint: AsyncioEndpoint, conn: ConnectionCore) -> None:
        super().__init__(conn)
        self._endpoint = endpoint

    @property
    def endpoint(self) -> AsyncioEndpoint:
        """The endpoint this connection belongs to."""
        return self._endpoint

    async def open_stream(self) -> AsyncioStream:
        """Open a bidirectional stream (the peer sees it with the first bytes written).

        Raises ``ConnectionLostError`` when the connection is gone."""
        return self._endpoint.wrap_stream(await self._conn.open_stream())

    def close(self, error_code: int = 0, reason: str = "") -> None:
        """Close the connection with an application ``error_code`` (idempotent)."""
        self._conn.close_nowait(error_code, reason)

    async def wait_closed(self) -> None:
        """Wait until the connection is gone."""
        await self._conn.wait_closed()

    def statistics(self) -> ConnectionStatistics | None:
        """This connection's statistics, or None once it is gone."""
        return self._endpoint._driver.connection_statistics(self._conn.ref)

    def __repr__(self) -> str:
        return f"<AsyncioConnection {self._conn.ref.sequence} peer={self._conn.peer}>"


@final
class AsyncioStream:
    """A bidirectional QUIC stream with ``asyncio.StreamReader``/``StreamWriter`` ergonomics.

    A ``ByteStream`` (``read``, ``read_exactly``, ``write``, ``drain``, ``write_eof``, ``close``,
    ``abort``, ``wait_closed``), plus the rest of the asyncio vocabulary.

    Reading: ``read``, ``readexactly``, ``readuntil``, ``readline``, ``at_eof``. A clean FIN
    reads as EOF; a peer reset raises ``StreamResetError``; a connection that closed first
    raises ``ConnectionLostError``.

    Writing: ``write`` (non-blocking: bytes are admitted at once while the stream has fewer
    than ``write_high_water`` unacknowledged bytes in flight, otherwise they wait in a local
    buffer bounded by ``write_buffer_limit``), ``drain`` (waits only while that bound is
    reached, never for acknowledgements), ``write_eof`` (FIN), ``close`` (FIN and
    STOP_SENDING), ``abort`` (RESET_STREAM and STOP_SENDING), ``wait_closed`` (every byte
    acknowledged and the stream reclaimed, or the connection gone).
    """

    __slots__ = ("__weakref__", "_conn", "_stream")

    def __init__(self, connection: AsyncioConnection, stream: StreamCore) -> None:
        self._conn = connection
        self._stream = stream

    @property
    def connection(self) -> AsyncioConnection:
        """The stream's connection."""
        return self._conn

    @property
    def peer(self) -> Pid:
        """The peer's authenticated PID."""
        return self._conn.peer

    @property
    def ref(self) -> StreamRef:
        """The endpoint-local handle of this stream."""
        return self._stream.ref

    @property
    def stream_id(self) -> int:
        """The QUIC stream number."""
        return self._stream.ref.stream

    @property
    def core(self) -> StreamCore:
        """The runtime-neutral state behind this stream."""
        return self._stream

    # -- reading --------------------------------------------------------------------------------

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (``n < 0``: everything until EOF); ``b""`` at EOF."""
        if n == 0:
            return b""
        if n < 0:
            return await self._stream.read_until_eof(MAX_READ_ALL)
        return await self._stream.read_some(n)

    async def read_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; ``chrysalis.quic.IncompleteReadError`` (an ``EOFError``) at an
        earlier EOF (the ``ByteStream`` verb)."""
        return await self._stream.read_exactly(n)

    async def readexactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; ``asyncio.IncompleteReadError`` at an earlier EOF."""
        try:
            return await self._stream.read_exactly(n)
        except IncompleteReadError as exc:
            raise asyncio.IncompleteReadError(exc.partial, exc.expected) from None

    async def readuntil(self, separator: bytes = b"\n", *, limit: int = _STREAM_LIMIT) -> bytes:
        """Bytes up to and including ``separator``.

        ``asyncio.IncompleteReadError`` at EOF first; ``asyncio.LimitOverrunError`` when
        ``limit`` bytes arrived without it (they stay buffered)."""
        if not separator:
            raise ValueError("separator must not be empty")
        stream = self._stream
        checked = 0
        while True:
            found = stream.find(separator, checked)
            if found >= 0:
                return stream.take_buffered(found + len(separator))
            if stream.buffered > limit:
                raise asyncio.LimitOverrunError("separator not found within the limit", limit)
            checked = max(0, stream.buffered - len(separator) + 1)
            if stream.at_eof:
                stream.raise_receive_error()
                raise asyncio.IncompleteReadError(
                    stream.take_all() if stream.buffered else b"", None
                )
            await stream.wait_readable(stream.buffered)

    async def readline(self) -> bytes:
        """One line including ``b"\\n"``; the partial last line (or ``b""``) at EOF."""
        try:
            return await self.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial

    def at_eof(self) -> bool:
        """True when the buffer is empty and the peer finished its side."""
        return self._stream.at_eof

    # -- writing --------------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` (see the class docstring); raises ``StreamClosedError`` after
        ``write_eof``/``close``, the stream's write error after a failure, and
        ``WriteBufferFullError`` beyond the local buffer limit."""
        self._stream.write(data)

    def writelines(self, data: list[bytes] | tuple[bytes, ...]) -> None:
        """``write`` every item."""
        for item in data:
            self._stream.write(item)

    async def drain(self) -> None:
        """Wait until every written byte was admitted (bounded in-flight, not acknowledged)."""
        await self._stream.drain()

    def can_write_eof(self) -> bool:
        """Always True (QUIC streams are half-closeable)."""
        return True

    def write_eof(self) -> None:
        """Send FIN after every written byte (idempotent)."""
        self._stream.write_eof()

    def close(self, error_code: int = 0) -> None:
        """FIN after the written bytes, and STOP_SENDING with ``error_code`` unless the peer
        already finished (idempotent; ``wait_closed`` waits for the end)."""
        self._stream.close(error_code)

    def is_closing(self) -> bool:
        """True after ``close`` or ``abort``."""
        return self._stream.closed

    def abort(self, error_code: int = 0) -> None:
        """Reset the writing half and stop the reading half with ``error_code``."""
        self._stream.abort(error_code)

    async def wait_closed(self) -> None:
        """Wait until every byte was acknowledged and the stream reclaimed (or the
        connection closed)."""
        await self._stream.wait_closed()

    def __repr__(self) -> str:
        return f"<AsyncioStream {self._stream.ref.stream} peer={self._conn.core.peer}>"
