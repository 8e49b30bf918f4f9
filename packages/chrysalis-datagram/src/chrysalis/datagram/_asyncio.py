"""asyncio adapter for any :class:`DatagramSocket`.

Why not ``DatagramProtocol``: asyncio's protocol path handles one datagram per event-loop turn.
Watching the descriptor with ``loop.add_reader`` and draining up to a whole batch per wake was
2 to 10 times faster here, and it works for every carrier, including those without a
descriptor. The pattern is always *try, and wait only after a would-block*:

* receive readiness: ``add_reader`` on every descriptor in ``sock.readiness_fds()`` plus the
  socket's receive waker (descriptor-less carriers, and shutdown for all);
* send readiness: ``add_writer`` on ``sock.send_readiness_fd(dst)`` plus the send waker.

Registrations live only while a task waits, so nothing stays registered on a descriptor that
``join`` later closes. Wakers may fire on any thread; they reach the loop through
``call_soon_threadsafe`` (or directly when already on the loop's thread). After a wake caused
by shutdown every method raises :class:`SocketClosedError`.

A destination that keeps refusing while its descriptor reports writable (an unconnected Unix
datagram socket only reports its own buffer) is retried with a short exponential backoff
(50 us doubling to 2 ms) instead of spinning.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Final

from chrysalis.core import DatagramAddr
from chrysalis.datagram._socket import (
    Buffer,
    DatagramRecvMeta,
    DatagramSocket,
    DatagramTransmit,
    SocketClosedError,
    Waker,
)

__all__ = ["AsyncDatagramSocket"]

_BACKOFF_FIRST: Final = 50e-6
_BACKOFF_MAX: Final = 2e-3


def _backoff(attempt: int) -> float:
    """Delay before retry ``attempt`` (0 = none) after repeated would-block results."""
    if attempt <= 0:
        return 0.0
    return min(_BACKOFF_FIRST * (1 << min(attempt - 1, 16)), _BACKOFF_MAX)


class AsyncDatagramSocket:
    """Awaitable sends and receives over a :class:`DatagramSocket`, for asyncio.

    One task may receive and any number may send at a time (the socket keeps only the latest
    receive waker). The adapter does not own the socket unless used as an async context
    manager or closed with :meth:`aclose`.
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

    @staticmethod
    def _waiter() -> tuple[asyncio.AbstractEventLoop, asyncio.Future[None], Waker, Waker]:
        """A future plus two wakers resolving it: one for loop callbacks, one for any
        thread."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        loop_thread = threading.get_ident()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        def wake_any_thread() -> None:
            if threading.get_ident() == loop_thread:
                wake()
                return
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                loop.call_soon_threadsafe(wake)

        return loop, future, wake, wake_any_thread

    async def wait_readable(self) -> None:
        """Wait until a receive may succeed; :class:`SocketClosedError` if shut down."""
        sock = self._sock
        fds = sock.readiness_fds()
        loop, future, wake, wake_any_thread = self._waiter()
        for fd in fds:
            loop.add_reader(fd, wake)
        try:
            sock.add_recv_waker(wake_any_thread)
            await future
        finally:
            for fd in fds:
                loop.remove_reader(fd)
        if sock.is_shutdown:
            raise SocketClosedError()

    async def wait_writable(self, destination: DatagramAddr) -> None:
        """Wait until a send to ``destination`` may succeed; :class:`SocketClosedError` if
        shut down."""
        sock = self._sock
        fd = sock.send_readiness_fd(destination)
        loop, future, wake, wake_any_thread = self._waiter()
        if fd is not None:
            loop.add_writer(fd, wake)
        try:
            sock.add_send_waker(destination, wake_any_thread)
            await future
        finally:
            if fd is not None:
                loop.remove_writer(fd)
        if sock.is_shutdown:
            raise SocketClosedError()

    async def _wait_send(self, destination: DatagramAddr, attempt: int) -> None:
        delay = _backoff(attempt)
        if delay:
            await asyncio.sleep(delay)
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

    async def send_transmit(self, transmit: DatagramTransmit) -> None:
        """Send every datagram of ``transmit`` in order, waiting while the carrier would
        block. Errors after partial progress are raised when retrying the unsent suffix."""
        sock = self._sock
        attempt = 0
        while True:
            accepted = sock.try_send_transmit(transmit)
            if accepted >= transmit.segment_count:
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
                return count
            await self.wait_readable()

    async def recv_from(self) -> tuple[bytes, DatagramAddr]:
        """Wait for and return one datagram and its source."""
        sock = self._sock
        while True:
            got = sock.try_recv_from()
            if got is not None:
                return got
            await self.wait_readable()

    async def aclose(self) -> None:
        """Shut the socket down and wait (off the loop if needed) until it is released."""
        self._sock.shutdown()
        if not self._sock.join(0):
            await asyncio.get_running_loop().run_in_executor(None, self._sock.join)

    async def __aenter__(self) -> AsyncDatagramSocket:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
