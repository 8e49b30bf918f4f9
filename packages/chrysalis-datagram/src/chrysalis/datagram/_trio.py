"""trio adapter for any :class:`DatagramSocket` (trio is an optional dependency).

Same pattern as the asyncio adapter: try, and wait only after a would-block. A wait ends when a
descriptor becomes ready (``trio.lowlevel.wait_readable`` / ``wait_writable`` on the stdlib
socket's descriptor, any of several for a socket set) or the socket's waker fires; wakers reach
trio through the run's ``TrioToken.run_sync_soon`` (or act directly when already on trio's
thread). After shutdown every method raises :class:`SocketClosedError`.

Any number of tasks may wait on one socket at once. trio allows one task per descriptor and
direction in ``wait_readable`` / ``wait_writable`` (a second gets ``BusyResourceError``), and
carriers keep only the latest receive waker, so waits are shared at two levels, both private to
this module and touched only on trio's thread:

* Wait rounds: tasks that wait for the same thing on the same socket (a receive, or a send to
  one destination) share one registration of the socket's waker and one descriptor wait.
* Descriptor waits: every wait on one (run, descriptor, direction) is served by one task in
  ``wait_readable`` / ``wait_writable`` (sockets can share a descriptor: the bindings of a
  switch all wait on its egress carrier).

In both, the first task to arrive (the *leader*) does the waiting and the others sleep on a
``trio.Event`` that it sets; a leader that is cancelled hands the wait over to one of them.

:meth:`TrioDatagramSocket.aclose` calls ``trio.lowlevel.notify_closing`` on the socket's
descriptors before ``join`` closes them, as trio requires for descriptors other tasks may be
waiting on.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Hashable, Sequence
from types import TracebackType
from typing import Final

import trio

from chrysalis.core import DatagramAddr
from chrysalis.datagram._socket import (
    Buffer,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTransmit,
    SocketClosedError,
    Waker,
)

__all__ = ["TrioDatagramSocket"]

_BACKOFF_FIRST: Final = 50e-6
_BACKOFF_MAX: Final = 2e-3


def _backoff(attempt: int) -> float:
    if attempt <= 0:
        return 0.0
    return min(_BACKOFF_FIRST * (1 << min(attempt - 1, 16)), _BACKOFF_MAX)


class _SharedWait:
    """A wait that several trio tasks share (trio's thread only).

    The first task in :meth:`wait` (the leader) runs ``leader_wait``; the others sleep on an
    event. The wait is over when ``leader_wait`` returns or :meth:`fire` is called (from a
    waker); then every task returns. A leader that leaves early (cancelled) wakes the others so
    that one of them takes over. ``trio.ClosedResourceError`` from ``leader_wait`` (the
    descriptor is being closed) ends the wait too and is raised in every task. The wait
    removes itself from ``registry`` once over or abandoned by all its tasks.
    """

    __slots__ = (
        "_changed",
        "_key",
        "_leader_wait",
        "_leading",
        "_registry",
        "_scope",
        "_tasks",
        "closed",
        "done",
    )

    def __init__(
        self,
        registry: dict[Hashable, _SharedWait],
        key: Hashable,
        leader_wait: Callable[[], Awaitable[object]],
    ) -> None:
        self._registry = registry
        self._key = key
        self._leader_wait = leader_wait
        self._changed = trio.Event()
        self._leading = False
        self._scope: trio.CancelScope | None = None
        self._tasks = 0
        self.closed = False
        self.done = False
        registry[key] = self

    def _forget(self) -> None:
        if self._registry.get(self._key) is self:
            del self._registry[self._key]

    def fire(self) -> None:
        """End the wait: every task returns (later calls do nothing)."""
        if self.done:
            return
        self.done = True
        self._forget()
        self._changed.set()
        if self._scope is not None:
            self._scope.cancel()

    async def wait(self) -> None:
        """Return once the wait is over; ``trio.ClosedResourceError`` if it ended because the
        descriptor is closing."""
        if self.done:
            await trio.lowlevel.checkpoint()
        self._tasks += 1
        led = False
        try:
            while not self.done:
                if self._leading:
                    await self._changed.wait()
                    continue
                self._leading = led = True
                try:
                    with trio.CancelScope() as scope:
                        self._scope = scope
                        await self._leader_wait()
                except trio.ClosedResourceError:
                    self.closed = True
                finally:
                    self._scope = None
                    self._leading = False
                self.fire()  # the leader's wait returned, or fire() cancelled it
        finally:
            self._tasks -= 1
            if not self.done:
                if self._tasks == 0:
                    self._forget()  # abandoned; a later wait starts afresh
                elif led and not self._leading:
                    changed, self._changed = self._changed, trio.Event()
                    changed.set()  # hand the wait over to a remaining task
        if self.closed:
            raise trio.ClosedResourceError("the descriptor was closed while waiting")


# Descriptor waits: (trio token, descriptor, readable) -> the wait in progress.
_fd_waits: dict[Hashable, _SharedWait] = {}


async def _wait_fd(fd: int, readable: bool) -> None:
    """Wait until ``fd`` is readable (or writable), sharing the wait with other tasks."""
    key = (trio.lowlevel.current_trio_token(), fd, readable)
    shared = _fd_waits.get(key)
    if shared is None:
        waiter = trio.lowlevel.wait_readable if readable else trio.lowlevel.wait_writable
        shared = _SharedWait(_fd_waits, key, functools.partial(waiter, fd))
    await shared.wait()


async def _wait_any_fd(fds: Sequence[int], readable: bool) -> None:
    """Wait until any of ``fds`` is ready (forever when there are none)."""
    if not fds:
        await trio.sleep_forever()
    elif len(fds) == 1:
        await _wait_fd(fds[0], readable)
    else:
        closed = False

        async def one(fd: int, scope: trio.CancelScope) -> None:
            nonlocal closed
            try:
                await _wait_fd(fd, readable)
            except trio.ClosedResourceError:
                closed = True
            scope.cancel()

        async with trio.open_nursery() as nursery:
            for fd in dict.fromkeys(fds):
                nursery.start_soon(one, fd, nursery.cancel_scope)
        if closed:
            raise trio.ClosedResourceError("a descriptor was closed while waiting")


def _waker(fire: Callable[[], None]) -> Waker:
    """A waker, callable from any thread, that runs ``fire`` on trio's thread."""
    token = trio.lowlevel.current_trio_token()
    trio_thread = threading.get_ident()

    def wake() -> None:
        if threading.get_ident() == trio_thread:
            fire()
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(fire)

    return wake


# Wait rounds: (socket id, trio token, destination or None for receives) -> the round. A round
# exists only while a task waits in it, and that task holds the socket, so the id cannot be
# reused by another socket meanwhile.
_rounds: dict[Hashable, _SharedWait] = {}


class TrioDatagramSocket:
    """Awaitable sends and receives over a :class:`DatagramSocket`, for trio.

    Any number of tasks may send and receive at a time, through this adapter or through other
    adapters of the same socket (see the module docstring); shutting the socket down wakes
    every one of them with :class:`SocketClosedError`. The adapter does not own the socket
    unless used as an async context manager or closed with :meth:`aclose`.
    """

    __slots__ = ("_sock",)

    def __init__(self, sock: DatagramSocket) -> None:
        self._sock = sock

    @property
    def socket(self) -> DatagramSocket:
        """The wrapped socket."""
        return self._sock

    @property
    def local_addr(self) -> DatagramAddr:
        """The wrapped socket's address."""
        return self._sock.local_addr

    async def _wait(self, destination: DatagramAddr | None) -> None:
        """Wait in the socket's round for receives (``None``) or sends to ``destination``."""
        sock = self._sock
        key = (id(sock), trio.lowlevel.current_trio_token(), destination)
        round_ = _rounds.get(key)
        if round_ is None:
            if destination is None:
                fds: Sequence[int] = sock.readiness_fds()
            else:
                fd = sock.send_readiness_fd(destination)
                fds = () if fd is None else (fd,)
            round_ = _SharedWait(
                _rounds, key, functools.partial(_wait_any_fd, fds, destination is None)
            )
            try:
                if destination is None:
                    sock.add_recv_waker(_waker(round_.fire))  # may fire at once
                else:
                    sock.add_send_waker(destination, _waker(round_.fire))
            except BaseException:
                round_.fire()
                raise
        try:
            await round_.wait()
        except trio.ClosedResourceError:
            raise SocketClosedError() from None
        if sock.is_shutdown:
            raise SocketClosedError()

    async def wait_readable(self) -> None:
        """Wait until a receive may succeed; :class:`SocketClosedError` if shut down."""
        await self._wait(None)

    async def wait_writable(self, destination: DatagramAddr) -> None:
        """Wait until a send to ``destination`` may succeed; :class:`SocketClosedError` if
        shut down."""
        await self._wait(destination)

    async def _wait_send(self, destination: DatagramAddr, attempt: int) -> None:
        delay = _backoff(attempt)
        if delay:
            await trio.sleep(delay)
        await self.wait_writable(destination)

    async def send_to(
        self, data: bytes | bytearray | memoryview, destination: DatagramAddr
    ) -> None:
        """Send one datagram, waiting while the carrier would block."""
        sock = self._sock
        attempt = 0
        while not sock.try_send_to(data, destination):
            await self._wait_send(destination, attempt)
            attempt += 1
        await trio.lowlevel.checkpoint()

    async def send_transmit(self, transmit: DatagramTransmit) -> None:
        """Send every datagram of ``transmit`` in order, waiting while the carrier would
        block. Errors after partial progress are raised when retrying the unsent suffix."""
        sock = self._sock
        attempt = 0
        while True:
            accepted = sock.try_send_transmit(transmit)
            if accepted >= transmit.segment_count:
                await trio.lowlevel.checkpoint()
                return
            if accepted:
                transmit = transmit.suffix(accepted)
                attempt = 0
                continue
            await self._wait_send(transmit.destination, attempt)
            attempt += 1

    async def recv(self, buffers: Sequence[Buffer], metas: list[DatagramRecvMeta]) -> int:
        """Wait for data, then drain up to a batch into ``buffers`` (returns at least 1)."""
        sock = self._sock
        while True:
            count = sock.try_recv(buffers, metas)
            if count:
                await trio.lowlevel.checkpoint()
                return count
            await self.wait_readable()

    async def recv_from(self) -> tuple[bytes, DatagramAddr]:
        """Wait for and return one datagram and its source."""
        sock = self._sock
        while True:
            got = sock.try_recv_from()
            if got is not None:
                await trio.lowlevel.checkpoint()
                return got
            await self.wait_readable()

    async def aclose(self) -> None:
        """Shut the socket down, tell trio its descriptors are closing, and wait (in a
        worker thread if needed) until it is released."""
        sock = self._sock
        fds: list[int] = []
        with contextlib.suppress(SocketClosedError):
            fds = sock.readiness_fds()
        sock.shutdown()
        for fd in fds:
            trio.lowlevel.notify_closing(fd)
        if not sock.join(0):
            await trio.to_thread.run_sync(sock.join)
        else:
            await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> TrioDatagramSocket:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
