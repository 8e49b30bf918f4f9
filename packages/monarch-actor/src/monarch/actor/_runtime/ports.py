"""Ports: addresses values can be sent to, and the receivers that read them.

Why: replies, explicit-response endpoints and "send a handle now, fill it later" patterns all
need a destination that is plain data. A ``Port`` is the address of a port (PID, owning actor
path, index) and pickles as exactly that, so it can be passed to any actor in any process; the
sender is whoever calls ``send`` (the running actor's context, or the root client). A
``PortReceiver`` is the local end: a bounded queue filled by the runtime loop; ``recv()``
returns a ``Future``. Values are decoded by whoever observes the future, never on the loop.

Order: values sent on one port by one sender arrive in send order. ``Channel.open(once=True)``
accepts a single value and then closes. The receiver closes its port when it is garbage
collected.
"""

from __future__ import annotations

import weakref
from typing import Any, Generic, TypeVar

from monarch.actor._base import codec as _codec
from monarch.actor._base.envelope import CastInfo, MessageKind, PortAddr
from monarch.actor._base.future import Future
from monarch.actor._runtime.context import _current, current_sender
from monarch.actor._runtime.sinks import QueueSink, Reply, _encode_exception, decode_reply
from monarch.config import _registry as _config

__all__ = ["Channel", "Port", "PortReceiver"]

R = TypeVar("R")


class Port(Generic[R]):
    """Where values of type ``R`` can be sent: ``send(value)`` or ``exception(exc)``.

    Fire-and-forget, reliable and FIFO per sender. Picklable: pass it to another actor and that
    actor can reply. ``return_undeliverable`` is kept for compatibility (default ``True``).
    """

    __slots__ = ("_addr", "_cast", "_once", "return_undeliverable")

    def __init__(self, addr: PortAddr, cast: CastInfo | None = None, once: bool = False) -> None:
        if not isinstance(addr, PortAddr):
            raise TypeError("Port needs a PortAddr; use Channel.open() to make one")
        self._addr = addr
        self._cast = cast
        self._once = once
        self.return_undeliverable = True

    @classmethod
    def _bound(cls, addr: PortAddr, cast: CastInfo | None) -> Port[Any]:
        return cls(addr, cast)

    @property
    def addr(self) -> PortAddr:
        """The port's address."""
        return self._addr

    def _send(self, kind: MessageKind, payload: _codec.Payload) -> None:
        runtime, sender = current_sender()
        cast = self._cast
        if cast is None:
            ctx = _current()
            if ctx is not None:
                point = ctx.message_rank
                cast = CastInfo(tuple(point.extent.labels), tuple(point.extent.sizes), point.rank)
        runtime.post(
            sender, kind, self._addr.actor, port=self._addr.index, cast=cast, payload=payload
        )

    def send(self, value: R) -> None:
        """Send ``value`` (pickled now; errors pickling it raise here)."""
        self._send(MessageKind.PORT_VALUE, _codec.encode(value))

    def exception(self, exc: BaseException) -> None:
        """Deliver ``exc``: the receiver's ``recv()`` raises it."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"Port.exception needs an exception, got {type(exc).__name__}")

        self._send(MessageKind.PORT_ERROR, _encode_exception(exc))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Port, (self._addr, self._cast, self._once))

    def __repr__(self) -> str:
        return f"Port({self._addr.path}#{self._addr.index}@{self._addr.pid.hex()[:12]})"


class PortReceiver(Generic[R]):
    """The receiving end of a port: ``recv()`` returns a ``Future`` of the next value."""

    __slots__ = ("__weakref__", "_addr", "_finalizer", "_ranked", "_sink")

    def __init__(self, addr: PortAddr, sink: QueueSink, ranked: bool, close: Any) -> None:
        self._addr = addr
        self._sink = sink
        self._ranked = ranked
        self._finalizer = weakref.finalize(self, close, addr.index)

    def recv(self) -> Future[R]:
        """The next value (``await`` it or ``.get()`` it); raises what was sent with
        ``Port.exception``, ``PortClosedError`` after a one-shot port was used, and
        ``PortOverflowError`` if the bounded queue dropped messages."""
        cell = self._sink.take()
        return Future._create(cell, self._decode)

    def _decode(self, reply: Reply) -> Any:
        value = decode_reply(reply)
        return (reply.rank, value) if self._ranked else value

    def close(self) -> None:
        """Close the port now (later sends to it are dropped)."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"PortReceiver({self._addr.path}#{self._addr.index})"


class Channel(Generic[R]):
    """Factory of (``Port``, ``PortReceiver``) pairs owned by the running actor (or client)."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        """A new port and its receiver; ``once=True`` accepts a single value."""
        return _open(once, ranked=False)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], PortReceiver[tuple[int, R]]]:
        """Like ``open``, but ``recv()`` yields ``(rank, value)`` with the sender's rank."""
        return _open(once, ranked=True)


def _open(once: bool, ranked: bool) -> tuple[Port[Any], PortReceiver[Any]]:
    runtime, owner = current_sender()
    sink = QueueSink(int(_config.get("port_queue_capacity")), once)
    addr = runtime.open_port(owner, sink)
    return Port(addr, None, once), PortReceiver(addr, sink, ranked, runtime.close_port)
