"""Replies and port sinks: what a port delivers, and who waits for it.

A ``Reply`` is a raw message delivered to a port (payload, out-of-band buffers, the sender's
cast rank); it is decoded later, in the observer's thread (``decode_reply``), never on the
runtime loop. A ``PortSink`` is registered under a port index of a ``ProcRuntime`` and is fed
on the runtime loop thread: ``OneSink`` (one reply), ``GatherSink`` (one reply per rank),
``StreamSink`` (the k-th reply completes the k-th future) and ``QueueSink`` (a port receiver's
bounded queue). A sink that is done calls ``closer()`` *before* completing its futures, so a
caller that sees the result finds the port closed already.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Any

from monarch.actor._base import codec as _codec
from monarch.actor._base.envelope import PortAddr
from monarch.actor._base.errors import (
    ActorError,
    CodecError,
    PortClosedError,
    PortOverflowError,
)
from monarch.actor._base.future import Future, _Cell
from monarch.actor._runtime.context import current_sender

__all__ = [
    "GatherSink",
    "OneSink",
    "PortSink",
    "QueueSink",
    "Reply",
    "StreamSink",
    "decode_reply",
    "gather_future",
]


# ---------------------------------------------------------------------------------------------
class Reply:
    """A raw message delivered to a port: decoded later, in the observer's thread."""

    __slots__ = ("buffers", "kinds", "ok", "payload", "rank")

    def __init__(
        self, ok: bool, payload: bytes, buffers: Sequence[object], kinds: bytes, rank: int
    ) -> None:
        self.ok = ok
        self.payload = payload
        self.buffers = buffers
        self.kinds = kinds
        self.rank = rank

    @classmethod
    def error(cls, exc: BaseException, rank: int) -> Reply:
        payload = _encode_exception(exc)
        return cls(
            False,
            payload.data,
            _codec.detach_buffers(payload.buffers, payload.kinds),
            payload.kinds,
            rank,
        )


def _nothing() -> None:
    return None


def decode_reply(reply: Reply) -> Any:
    """The value of ``reply``; raises the delivered exception for error replies."""
    value = _codec.decode(reply.payload, reply.buffers, reply.kinds)
    if reply.ok:
        return value
    if isinstance(value, BaseException):
        raise value
    raise CodecError(f"port error payload is a {type(value).__name__}, not an exception")


class PortSink:
    """Receives replies for one port on the runtime loop. ``deliver`` returns True when done.

    A sink that is done calls ``closer()`` *before* completing its futures, so by the time a
    caller sees the result the port is already closed.
    """

    __slots__ = ("closer", "opened")

    def __init__(self) -> None:
        self.closer: Callable[[], None] = _nothing
        #: While metrics are on: when the port opened, for the call latency
        #: (``telemetry.metrics.call_opened``, set by ``ProcRuntime.open_port``).
        self.opened: tuple[float, list[float], str] | None = None

    def deliver(self, reply: Reply) -> bool:
        raise NotImplementedError

    def abandon(self, exc: BaseException) -> None:
        """The port is being closed without its expected replies."""


class OneSink(PortSink):
    """Completes one cell with the first reply."""

    __slots__ = ("cell",)

    def __init__(self, cell: _Cell[Reply]) -> None:
        super().__init__()
        self.cell = cell

    def deliver(self, reply: Reply) -> bool:
        self.closer()
        self.cell.set_result(reply)
        return True

    def abandon(self, exc: BaseException) -> None:
        self.cell.set_exception(exc)


class GatherSink(PortSink):
    """Collects one reply per rank (by cast rank); completes with the list when all arrived."""

    __slots__ = ("cell", "count", "slots")

    def __init__(self, n: int, cell: _Cell[list[Reply]]) -> None:
        self.closer = _nothing  # ``PortSink.__init__`` inlined (every ``call()``)
        self.opened = None
        self.slots: list[Reply | None] = [None] * n
        self.count = 0
        self.cell = cell
        if n == 0:
            cell.set_result([])

    def deliver(self, reply: Reply) -> bool:
        rank = reply.rank
        if 0 <= rank < len(self.slots) and self.slots[rank] is None:
            self.slots[rank] = reply
            self.count += 1
        if self.count == len(self.slots):
            self.closer()
            self.cell.set_result([r for r in self.slots if r is not None])
            return True
        return False

    def abandon(self, exc: BaseException) -> None:
        self.cell.set_exception(exc)


class StreamSink(PortSink):
    """Completes the k-th cell with the k-th arriving reply."""

    __slots__ = ("cells", "next")

    def __init__(self, cells: list[_Cell[Reply]]) -> None:
        super().__init__()
        self.cells = cells
        self.next = 0

    def deliver(self, reply: Reply) -> bool:
        if self.next >= len(self.cells):
            return True
        cell = self.cells[self.next]
        self.next += 1
        done = self.next >= len(self.cells)
        if done:
            self.closer()
        cell.set_result(reply)
        return done

    def abandon(self, exc: BaseException) -> None:
        for cell in self.cells[self.next :]:
            cell.set_exception(exc)


class QueueSink(PortSink):
    """A port receiver's bounded queue of replies plus its waiting ``recv`` futures."""

    __slots__ = ("capacity", "closed", "items", "lock", "once", "overflowed", "waiters")

    def __init__(self, capacity: int, once: bool) -> None:
        super().__init__()
        self.capacity = capacity
        self.once = once
        self.items: collections.deque[Reply] = collections.deque()
        self.waiters: collections.deque[_Cell[Reply]] = collections.deque()
        self.lock = threading.Lock()
        self.overflowed = 0
        self.closed = False

    def deliver(self, reply: Reply) -> bool:
        with self.lock:
            if self.closed:
                return True
            waiter = self.waiters.popleft() if self.waiters else None
            if waiter is None:
                if len(self.items) >= self.capacity:
                    self.overflowed += 1
                    return False
                self.items.append(reply)
            if self.once:
                self.closed = True
        if waiter is not None:
            waiter.set_result(reply)
        return self.once

    def take(self) -> _Cell[Reply]:
        cell: _Cell[Reply] = _Cell()
        with self.lock:
            if self.items:
                cell.set_result(self.items.popleft())
            elif self.overflowed:
                dropped, self.overflowed = self.overflowed, 0
                cell.set_exception(
                    PortOverflowError(
                        f"port receiver queue overflowed (capacity {self.capacity}); "
                        f"{dropped} messages were dropped"
                    )
                )
            elif self.closed:
                cell.set_exception(PortClosedError("the port is closed"))
            elif len(self.waiters) >= self.capacity:
                cell.set_exception(
                    PortOverflowError(f"more than {self.capacity} pending recv() calls")
                )
            else:
                self.waiters.append(cell)
        return cell

    def abandon(self, exc: BaseException) -> None:
        with self.lock:
            self.closed = True
            waiters, self.waiters = list(self.waiters), collections.deque()
        for waiter in waiters:
            waiter.set_exception(exc)


def _encode_exception(exc: BaseException) -> _codec.Payload:
    try:
        return _codec.encode(exc)
    except Exception as first:
        text = f"{type(exc).__qualname__}: {exc}"
        stand_in = RuntimeError(f"unpicklable remote exception {text} ({first})")
        if isinstance(exc, ActorError):
            fallback: BaseException = ActorError(stand_in, exc.message, exc.exception_formatted)
        else:
            fallback = stand_in
        try:
            return _codec.encode(fallback)
        except Exception:
            return _codec.encode(RuntimeError(text[:4096]))


def gather_future(n: int, decode: Callable[[list[Reply]], Any]) -> tuple[PortAddr, Future[Any]]:
    """Open a port collecting ``n`` ranked replies; the future decodes them with ``decode``."""
    runtime, sender = current_sender()
    cell: _Cell[list[Reply]] = _Cell()
    addr = runtime.open_port(sender, GatherSink(n, cell))
    if n == 0:
        runtime.close_port(addr.index)
    return addr, Future._create(cell, decode)
