"""trio adapter for any :class:`DatagramSocket` (trio is an optional dependency).

Same pattern as the asyncio adapter: try, and wait only after a would-block. A wait is a
cancel scope that ends when either a descriptor becomes ready
(``trio.lowlevel.wait_readable`` / ``wait_writable`` on the stdlib socket's descriptor, one
child task per descriptor when a socket set has several) or the socket's waker fires; wakers
reach trio through the run's ``TrioToken.run_sync_soon`` (or cancel the scope directly when
already on trio's thread). After shutdown every method raises :class:`SocketClosedError`.

:meth:`TrioDatagramSocket.aclose` calls ``trio.lowlevel.notify_closing`` on the socket's
descriptors before ``join`` closes them, as trio requires for descriptors other tasks may be
waiting on.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
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


def _canceller(scope: trio.CancelScope) -> Waker:
    """A waker, callable from any thread, that cancels ``scope`` inside the current run."""
    token = trio.lowlevel.current_trio_token()
    trio_thread = threading.get_ident()

    def wake() -> None:
        if threading.get_ident() == trio_thread:
            scope.cancel()
            return
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(scope.cancel)

    return wake


async def _wait_fd_then_cancel(fd: int, scope: trio.CancelScope) -> None:
    await trio.lowlevel.wait_readable(fd)
    scope.cancel()


class TrioDatagramSocket:
    """Awaitable sends and receives over a :class:`DatagramSocket`, for trio.

    One task may receive and any number may send at a time. The adapter does not own the
    socket unless used as an async context manager or closed with :meth:`aclose`.
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

    async def wait_readable(self) -> None:
        """Wait until a receive may succeed; :class:`SocketClosedError` if shut down."""
        sock = self._sock
        fds = sock.readiness_fds()
        try:
            with trio.CancelScope() as scope:
                sock.add_recv_waker(_canceller(scope))
                if not fds:
                    await trio.sleep_forever()
                elif len(fds) == 1:
                    await trio.lowlevel.wait_readable(fds[0])
                else:
                    async with trio.open_nursery() as nursery:
                        for fd in fds:
                            nursery.start_soon(_wait_fd_then_cancel, fd, scope)
        except trio.ClosedResourceError:
            raise SocketClosedError() from None
        if sock.is_shutdown:
            raise SocketClosedError()

    async def wait_writable(self, destination: DatagramAddr) -> None:
        """Wait until a send to ``destination`` may succeed; :class:`SocketClosedError` if
        shut down."""
        sock = self._sock
        fd = sock.send_readiness_fd(destination)
        try:
            with trio.CancelScope() as scope:
                sock.add_send_waker(destination, _canceller(scope))
                if fd is None:
                    await trio.sleep_forever()
                else:
                    await trio.lowlevel.wait_writable(fd)
        except trio.ClosedResourceError:
            raise SocketClosedError() from None
        if sock.is_shutdown:
            raise SocketClosedError()

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
