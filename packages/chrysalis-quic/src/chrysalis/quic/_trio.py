"""The trio adapter: a ``QuicEndpoint`` in a trio run, with ``trio.abc.HalfCloseableStream``
streams (trio is an optional dependency: ``pip install chrysalis-quic[trio]``).

Why it looks like this: the runtime-neutral work (the I/O step, completion dispatch, stream
state) lives in ``_driver``; this module supplies trio's waiting and task primitives and trio's
stream vocabulary (``send_all``, ``wait_send_all_might_not_block``, ``send_eof``,
``receive_some``, ``aclose``), including its conventions: every operation is a checkpoint,
two tasks using the same half at once get ``trio.BusyResourceError``, use after ``aclose``
raises ``trio.ClosedResourceError`` and a stream the peer broke raises
``trio.BrokenResourceError`` (with the cause chained). The streams pass
``trio.testing.check_half_closeable_stream``.

Driver placement mirrors the asyncio adapter: ``driver="inline"`` (the default) runs
``EndpointDriver.step`` in a task of the endpoint's nursery, waiting in
``trio.lowlevel.wait_readable`` inside a cancel scope that the notifier, the socket's wakers
and the endpoint's timer (the scope's deadline) cancel; ``driver="thread"`` runs it on a
dedicated thread and a pump task dispatches completions.

Structure: ``TrioEndpoint.spawn_*`` return async context managers that open the endpoint's
nursery; nothing it starts outlives the ``async with`` block.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Final, TypeVar, Unpack, final

import trio

from chrysalis.core import Pid
from chrysalis.core.completion import StreamRef, SubmissionLimits
from chrysalis.datagram import DatagramSocket
from chrysalis.quic._byte_stream import MAX_READ_ALL
from chrysalis.quic._config import EndpointLimits, QuicConfig
from chrysalis.quic._driver import (
    DEFAULT_DRIVER_MODE,
    EndpointSettings,
    SpawnOptions,
    ThreadNotifier,
    thread_name,
)
from chrysalis.quic._endpoint import (
    ConnectionStatistics,
    EndpointRole,
)
from chrysalis.quic._endpoint_core import (
    AdapterOptions,
    ConnectionCore,
    ConnectionView,
    EndpointCore,
    EndpointFacade,
)
from chrysalis.quic._engines.base import EngineFactory
from chrysalis.quic._errors import EndpointClosedError, QuicTransportError, StreamClosedError
from chrysalis.quic._identity import Identity
from chrysalis.quic._stream_core import StreamCore

__all__ = ["TrioConnection", "TrioEndpoint", "TrioStream"]

T = TypeVar("T")
_log = logging.getLogger("chrysalis.quic")

DEFAULT_SHUTDOWN_GRACE: Final = 1.0
_STOP_MARGIN: Final = 2.0


# --- runtime services --------------------------------------------------------------------------


@final
class _Runtime:
    """``Runtime`` for trio: events, tasks in the endpoint's nursery, soon-callbacks."""

    __slots__ = ("cancelled", "errors", "nursery", "scopes", "token")

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.token = trio.lowlevel.current_trio_token()
        self.errors = 0
        self.scopes: set[trio.CancelScope] = set()
        self.cancelled = False

    def event(self) -> trio.Event:
        return trio.Event()

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        self.nursery.start_soon(self._guard, fn, *args)

    async def _guard(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        with trio.CancelScope() as scope:
            if self.cancelled:
                scope.cancel()
            self.scopes.add(scope)
            try:
                await fn(*args)
            except EndpointClosedError:
                pass
            except Exception:
                self.errors += 1
                _log.exception("a task of a QUIC endpoint failed")
            finally:
                self.scopes.discard(scope)

    def cancel_all(self) -> None:
        """Cancel every spawned task (and the ones spawned from now on)."""
        self.cancelled = True
        for scope in list(self.scopes):
            scope.cancel()

    def call_soon(self, fn: Callable[[], object]) -> None:
        self.token.run_sync_soon(fn)

    async def with_timeout(self, seconds: float, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            with trio.fail_after(seconds):
                return await fn()
        except trio.TooSlowError:
            raise TimeoutError(f"timed out after {seconds} s") from None


@final
class _ScopeNotifier:
    """The driver notifier of the inline mode: cancels the driver task's wait scope."""

    __slots__ = ("flag", "scope", "thread", "token", "unpolled")

    def __init__(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self.thread = threading.get_ident()
        self.flag = False
        # The same news for the endpoint's ``poll`` (``QuicEndpoint.poll_hint``), which
        # clears it: the driver's ``flag`` is cleared on its own schedule.
        self.unpolled = True
        self.scope: trio.CancelScope | None = None

    def notify(self) -> None:
        self.unpolled = True
        self.notify_io()

    def notify_io(self) -> None:
        """A carrier's waker: the driver must step (``flag``), but nothing new was submitted,
        so the step's poll may still be skipped (``unpolled`` untouched)."""
        self.flag = True
        scope = self.scope
        if scope is not None:
            if threading.get_ident() == self.thread:
                scope.cancel()
            else:
                with contextlib.suppress(trio.RunFinishedError):
                    self.token.run_sync_soon(self.wake)

    def wake(self) -> None:
        scope = self.scope
        if scope is not None:
            scope.cancel()


async def _wait_fd_readable(fd: int, scope: trio.CancelScope) -> None:
    await trio.lowlevel.wait_readable(fd)
    scope.cancel()


# --- the endpoint ------------------------------------------------------------------------------


class _Spawn:
    """The async context manager ``spawn_*`` return: opens the endpoint's nursery."""

    __slots__ = ("_endpoint", "_settings", "_stack")

    def __init__(self, settings: EndpointSettings) -> None:
        self._settings = settings
        self._endpoint: TrioEndpoint | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> TrioEndpoint:
        nursery = await self._stack.enter_async_context(trio.open_nursery())
        try:
            endpoint = TrioEndpoint(self._settings, nursery)
            endpoint._start()
        except BaseException:
            await self._stack.aclose()
            raise
        self._endpoint = endpoint
        return endpoint

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        endpoint = self._endpoint
        assert endpoint is not None
        try:
            with trio.CancelScope(shield=True):
                await endpoint.aclose(abort=exc_type is not None)
        finally:
            suppressed = await self._stack.__aexit__(exc_type, exc, tb)
        return suppressed


@final
class TrioEndpoint(EndpointFacade["TrioConnection", "TrioStream"]):
    """A QUIC endpoint in the current trio run (see the module docstring).

    Create it with ``spawn_client``, ``spawn_server``, ``spawn_duplex`` or
    ``spawn_duplex_routed`` inside ``async with``. It dials (``connect``), accepts streams
    (``accept``; ``accept_link_local`` for connections terminating at PID 0) and shuts down
    (``shutdown``, ``abort``, ``aclose``).
    """

    __slots__ = (
        "_channels",
        "_closed",
        "_closing",
        "_error",
        "_notifier",
        "_nursery",
        "_runtime",
        "_settings",
        "_stop",
        "_task_done",
        "_thread",
    )

    def __init__(self, settings: EndpointSettings, nursery: trio.Nursery) -> None:
        self._settings = settings
        self._identity = settings.identity
        self._mode = settings.driver
        self._nursery = nursery
        self._runtime = _Runtime(nursery)
        notifier: _ScopeNotifier | ThreadNotifier
        notifier = _ScopeNotifier() if settings.driver == "inline" else ThreadNotifier()
        channels, endpoint, driver = settings.build(notifier, time.monotonic)
        self._notifier = notifier
        self._channels = channels
        self._endpoint = endpoint
        self._driver = driver
        options = AdapterOptions() if settings.options is None else settings.options
        self._core = EndpointCore(channels, self._runtime, options, endpoint.routing_pid)
        self._core.connection_gone = driver.connection_gone
        driver.on_socket_failure = self._core.abort_nowait
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._closing = False
        self._closed = trio.Event()
        self._task_done = trio.Event()

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
        return TrioEndpoint.spawn(identity, socket, role=EndpointRole.CLIENT, **options)

    @staticmethod
    def spawn_server(
        identity: Identity, socket: DatagramSocket, **options: Unpack[SpawnOptions]
    ) -> _Spawn:
        """An endpoint that only accepts, over ``socket`` (``async with``)."""
        return TrioEndpoint.spawn(identity, socket, role=EndpointRole.SERVER, **options)

    @staticmethod
    def spawn_duplex(
        identity: Identity, socket: DatagramSocket, **options: Unpack[SpawnOptions]
    ) -> _Spawn:
        """An endpoint that dials and accepts, routed by ``identity.pid`` (``async with``)."""
        return TrioEndpoint.spawn(identity, socket, role=EndpointRole.DUPLEX, **options)

    @staticmethod
    def spawn_duplex_routed(
        identity: Identity,
        socket: DatagramSocket,
        *,
        routing_pid: Pid,
        **options: Unpack[SpawnOptions],
    ) -> _Spawn:
        """A duplex endpoint whose dialled connections carry ``routing_pid`` in their CIDs
        (``Pid.LINK_LOCAL`` for a dedicated link-local endpoint) (``async with``)."""
        return TrioEndpoint.spawn(
            identity, socket, role=EndpointRole.DUPLEX, route=routing_pid, **options
        )

    def _start(self) -> None:
        if self._mode == "inline":
            self._nursery.start_soon(self._run_inline, name="chrysalis-quic-driver")
        else:
            thread = threading.Thread(
                target=self._run_thread, name=thread_name(self._identity.pid), daemon=True
            )
            self._thread = thread
            thread.start()
            self._nursery.start_soon(self._pump, name="chrysalis-quic-pump")

    # -- properties -------------------------------------------------------------------------------

    @property
    def runtime(self) -> _Runtime:
        """The runtime services (``QuicTransport`` uses them to own its tasks)."""
        return self._runtime

    def connections(self) -> list[TrioConnection]:
        """The live connections (dialled and accepted, established or not)."""
        return [self.wrap_connection(conn) for conn in list(self._core.conns.values())]

    # -- the driver -------------------------------------------------------------------------------

    async def _run_inline(self) -> None:
        driver = self._driver
        core = self._core
        notifier = self._notifier
        assert isinstance(notifier, _ScopeNotifier)
        fds = driver.socket.readiness_fds()
        # Every notification cancels the wait below (or lands before the next check of
        # ``flag``), so a poll that the notifier says has nothing new to drain is skipped.
        driver.endpoint.poll_hint = notifier
        try:
            while True:
                notifier.flag = False
                more = driver.step(flush=False)
                if core.dispatch_ready():
                    # Let the woken tasks answer first (their data then rides with the
                    # acknowledgements of what they answer).
                    await trio.lowlevel.checkpoint()
                    # The flush's poll admits what they submitted: their notifications need
                    # no further step unless the poll stopped at a bound.
                    notifier.flag = False
                    driver.flush()
                else:
                    # Nothing ran since the step's own poll: nothing new to admit.
                    driver.flush(poll=False)
                if driver.endpoint.backlogged:
                    notifier.flag = True  # the last poll stopped at a bound: poll again
                core.dispatch_ready()
                if driver.endpoint.is_stopped or self._stop.is_set():
                    core.dispatch_ready()
                    break
                if more or notifier.flag:
                    await trio.lowlevel.checkpoint()
                    continue
                await self._wait_inline(notifier, fds)
        except BaseException as exc:
            if not isinstance(exc, trio.Cancelled):
                self._error = exc
                _log.exception("the QUIC endpoint driver failed")
            core._on_driver_stopped(None)
            raise
        finally:
            driver.endpoint.poll_hint = None
            self._task_done.set()

    async def _wait_inline(self, notifier: _ScopeNotifier, fds: list[int]) -> None:
        driver = self._driver
        sock = driver.socket
        with trio.CancelScope() as scope:
            notifier.scope = scope
            try:
                if notifier.flag:
                    return
                deadline = driver.deadline
                if deadline is not None:
                    scope.deadline = trio.current_time() + max(0.0, deadline - time.monotonic())
                # (Held output is retried by the deadline, never on writability: see the
                # driver.)
                if not driver.socket_failed:
                    if not fds:
                        sock.add_recv_waker(notifier.notify_io)
                else:
                    fds = []
                if len(fds) == 1:
                    await trio.lowlevel.wait_readable(fds[0])
                elif not fds:
                    await trio.sleep_forever()
                else:
                    async with trio.open_nursery() as nursery:
                        for fd in fds:
                            nursery.start_soon(_wait_fd_readable, fd, scope)
            except trio.ClosedResourceError:
                pass
            finally:
                notifier.scope = None

    def _run_thread(self) -> None:
        notifier = self._notifier
        assert isinstance(notifier, ThreadNotifier)
        try:
            self._driver.run_forever(notifier, self._stop)
        except BaseException as exc:
            self._error = exc
            _log.exception("the QUIC endpoint driver thread failed")
        finally:
            self._channels.completion_sender.close()

    async def _pump(self) -> None:
        core = self._core
        arrived = self._channels.completions.arrived
        try:
            while True:
                seen = arrived.epoch()
                core.dispatch_ready()
                if core.stopped:
                    return
                await arrived.wait_async(seen)
        finally:
            self._task_done.set()

    # -- dialling and accepting -----------------------------------------------------------------

    def wrap_connection(self, conn: ConnectionCore) -> TrioConnection:
        """The facade of ``conn`` (one per connection)."""
        facade = conn.facade
        if isinstance(facade, TrioConnection):
            return facade
        wrapped = TrioConnection(self, conn)
        conn.facade = wrapped
        return wrapped

    def wrap_stream(self, stream: StreamCore) -> TrioStream:
        """The facade of ``stream`` (one per stream)."""
        facade = stream.facade
        if isinstance(facade, TrioStream):
            return facade
        wrapped = TrioStream(self.wrap_connection(stream.conn), stream)
        stream.facade = wrapped
        return wrapped

    # -- shutdown -------------------------------------------------------------------------------

    async def shutdown(self, grace: float = DEFAULT_SHUTDOWN_GRACE) -> None:
        """Graceful shutdown (see ``AsyncioEndpoint.shutdown``)."""
        self._core.shutdown_nowait(grace)
        with trio.move_on_after(grace + _STOP_MARGIN) as scope:
            await self._wait_stopped()
        if scope.cancelled_caught:
            await self.abort()

    async def abort(self) -> None:
        """Abort: every connection dropped, every operation returned at once."""
        if not self._core.stopped:
            self._core.abort_nowait()
        with trio.move_on_after(_STOP_MARGIN) as scope:
            await self._wait_stopped()
        if scope.cancelled_caught:
            self._force_stop()

    async def _wait_stopped(self) -> None:
        if not self._core.stopped:
            await self._core.stopped_event.wait()
        await self._task_done.wait()

    def _force_stop(self) -> None:
        self._stop.set()
        self._notifier.notify()
        self._core._on_driver_stopped(None)

    async def aclose(self, *, abort: bool = False, grace: float = DEFAULT_SHUTDOWN_GRACE) -> None:
        """Shut down (gracefully, or at once with ``abort=True``), cancel every task the
        endpoint started, join the driver thread and close the socket (unless
        ``close_socket=False``). Idempotent."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            if abort:
                await self.abort()
            else:
                await self.shutdown(grace)
            self._runtime.cancel_all()
            thread = self._thread
            if thread is not None:
                self._stop.set()
                self._notifier.notify()
                await trio.to_thread.run_sync(thread.join, 5.0)
                assert isinstance(self._notifier, ThreadNotifier)
                self._notifier.close()
            else:
                with trio.move_on_after(_STOP_MARGIN):
                    await self._task_done.wait()
            if self._settings.close_socket:
                sock = self._driver.socket
                fds: list[int] = []
                with contextlib.suppress(OSError):
                    fds = sock.readiness_fds()
                sock.shutdown()
                for fd in fds:
                    trio.lowlevel.notify_closing(fd)
                if not sock.join(0):
                    await trio.to_thread.run_sync(sock.join, 5.0)
        finally:
            self._closed.set()
        if self._error is not None:
            raise EndpointClosedError("the QUIC endpoint driver failed") from self._error


# --- connections and streams -------------------------------------------------------------------


@final
class TrioConnection(ConnectionView):
    """One authenticated QUIC connection of a ``TrioEndpoint`` (see ``AsyncioConnection``)."""

    __slots__ = ("__weakref__", "_endpoint")

    def __init__(self, endpoint: TrioEndpoint, conn: ConnectionCore) -> None:
        super().__init__(conn)
        self._endpoint = endpoint

    @property
    def endpoint(self) -> TrioEndpoint:
        """The endpoint this connection belongs to."""
        return self._endpoint

    async def open_stream(self) -> TrioStream:
        """Open a bidirectional stream (the peer sees it with the first bytes sent)."""
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
        return f"<TrioConnection {self._conn.ref.sequence} peer={self._conn.peer}>"


def _translate(exc: QuicTransportError) -> Exception:
    if isinstance(exc, StreamClosedError):
        return trio.ClosedResourceError(str(exc))
    return trio.BrokenResourceError(str(exc))


@final
class TrioStream(trio.abc.HalfCloseableStream):
    """A bidirectional QUIC stream as a ``trio.abc.HalfCloseableStream``.

    ``send_all`` returns once the bytes are admitted (at most ``write_high_water``
    unacknowledged bytes stay in flight), not when they are acknowledged. ``receive_some``
    returns ``b""`` after the peer's FIN. A peer reset, a peer STOP_SENDING or a lost
    connection raises ``trio.BrokenResourceError`` (the Chrysalis error is its ``__cause__``);
    use after ``aclose`` raises ``trio.ClosedResourceError``. ``aclose`` sends FIN and
    STOP_SENDING and returns at once; ``wait_closed`` waits for the acknowledgements.

    It is also a ``ByteStream`` (``read``, ``read_exactly``, ``write``, ``drain``,
    ``write_eof``, ``close``, ``abort``, ``wait_closed``), the runtime-neutral vocabulary that
    ``AsyncioStream`` speaks too: those verbs behave as on asyncio and raise the Chrysalis
    errors (``StreamResetError``, ``ConnectionLostError``...), not trio's. ``close`` and
    ``abort`` close the trio side as ``aclose`` does.
    """

    __slots__ = ("__weakref__", "_closed", "_conn", "_receiving", "_sending", "_stream")

    def __init__(self, connection: TrioConnection, stream: StreamCore) -> None:
        self._conn = connection
        self._stream = stream
        self._sending = False
        self._receiving = False
        self._closed = False

    @property
    def connection(self) -> TrioConnection:
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

    def _check_send(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data``; returns once it is admitted."""
        self._check_send()
        self._sending = True
        try:
            await trio.lowlevel.checkpoint()
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")
            try:
                await self._stream.send_all(data)
            except QuicTransportError as exc:
                if self._closed:
                    raise trio.ClosedResourceError("the stream is closed") from exc
                raise _translate(exc) from exc
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        """Wait until ``send_all`` might be admitted without waiting."""
        self._check_send()
        self._sending = True
        try:
            await trio.lowlevel.checkpoint()
            await self._stream.wait_writable()
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")
        finally:
            self._sending = False

    async def send_eof(self) -> None:
        """Send FIN after the bytes already sent; repeated calls are fine."""
        self._check_send()
        self._sending = True
        try:
            await trio.lowlevel.checkpoint()
            if self._closed:
                raise trio.ClosedResourceError("the stream is closed")
            self._stream.write_eof()
        finally:
            self._sending = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Up to ``max_bytes`` bytes (any positive amount when None); ``b""`` after FIN."""
        if max_bytes is None:
            max_bytes = self._stream.core.options.read_ahead
        elif isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise TypeError("max_bytes must be an int or None")
        elif max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint()
            try:
                return await self._stream.read_some(max_bytes)
            except QuicTransportError as exc:
                if self._closed:
                    raise trio.ClosedResourceError("the stream is closed") from exc
                raise _translate(exc) from exc
        finally:
            self._receiving = False

    # -- the runtime-neutral ByteStream verbs (Chrysalis errors, as on asyncio) ----------------

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (``n < 0``: everything until EOF, at most ``MAX_READ_ALL``);
        ``b""`` at EOF."""
        if n == 0:
            return b""
        if n < 0:
            return await self._stream.read_until_eof(MAX_READ_ALL)
        return await self._stream.read_some(n)

    async def read_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; ``chrysalis.quic.IncompleteReadError`` (an ``EOFError``) at an
        earlier EOF."""
        return await self._stream.read_exactly(n)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` without waiting (``WriteBufferFullError`` beyond the stream's local
        write buffer: ``drain`` between writes)."""
        self._stream.write(data)

    async def drain(self) -> None:
        """Wait until every written byte was admitted (bounded in-flight, not acknowledged)."""
        await self._stream.drain()

    def write_eof(self) -> None:
        """Send FIN after every written byte (idempotent)."""
        self._stream.write_eof()

    def close(self, error_code: int = 0) -> None:
        """FIN after the written bytes, and STOP_SENDING with ``error_code`` unless the peer
        already finished (idempotent); the trio verbs then raise ``ClosedResourceError``."""
        self._closed = True
        self._stream.close(error_code)

    async def aclose(self) -> None:
        """Close both halves (FIN and STOP_SENDING); idempotent, and it closes even when
        cancelled."""
        self._closed = True
        self._stream.close()
        await trio.lowlevel.checkpoint()

    def abort(self, error_code: int = 0) -> None:
        """Reset the sending half and stop the receiving half with ``error_code``."""
        self._closed = True
        self._stream.abort(error_code)

    async def wait_closed(self) -> None:
        """Wait until every byte was acknowledged and the stream reclaimed (or the
        connection closed)."""
        await self._stream.wait_closed()

    def __repr__(self) -> str:
        return f"<TrioStream {self._stream.ref.stream} peer={self._conn.core.peer}>"
