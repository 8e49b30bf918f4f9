"""The actor runtime of one process: routing, mailboxes, actor threads, ports, supervision.

Theory of operation
-------------------
A *process* is a ``ProcRuntime``: a transport attachment (its PID), a ``RuntimeLoop`` that
receives envelopes, the actors living in it (by path), and the ports opened in it (by index). The
client script's OS process has one, with the *root client* pseudo-actor at path ``"root"``;
in-process simulated processes (``_local_proc_mesh``) are more of them on the same fabric.

Threads:

- The runtime loop thread routes every inbound envelope (``_on_envelope``): calls, stops and
  supervision events go into the target actor's mailbox; port messages complete futures or fill
  port receivers. It never runs user code and never blocks.
- Each actor has its own thread, created at spawn, so an actor processes one message at a time in
  arrival order, thread-local state set in ``__init__`` is visible in every endpoint, and
  different actors run concurrently. A *sync* actor's thread runs its endpoints directly (no
  asyncio loop is visible to them, so they may block on ``Future.get()``); an *async* actor's
  thread runs a private asyncio loop on which its endpoints are awaited one after the other
  (``concurrent_endpoint`` bodies run as tasks on that loop).
- Senders (user threads, actor threads) encode values and call the transport themselves; the
  transport hands envelopes to the destination loop in FIFO order, which is what preserves
  per-sender, per-receiver order.

Three result paths (spec section 8):

1. An endpoint raises an ``Exception`` and the message has a reply port: the caller gets an
   ``ActorError``; the actor lives on.
2. No reply port (``broadcast``/``send``), an explicit-port endpoint raising, a
   ``BaseException``, ``__init__`` raising, ``abort()``, an unhandled supervision event: the
   actor *fails*. The message being handled (if it has a reply port) and every message queued or
   arriving later get a ``SupervisionError``; owned meshes are stopped, concurrent bodies
   cancelled, ``__cleanup__(exc)`` runs, and the owner receives a ``SUPERVISION`` envelope.
3. Process death: left to the process layer (a Node reports it); nothing here simulates it.

A retired actor leaves a *tombstone* (bounded, oldest dropped) so later messages to it fail fast
with the original failure, which is how slices containing a failed rank keep failing.

Supervision at the owner: ``__supervise__(MeshFailure)`` runs between messages on sync actors,
and as a task as soon as the event arrives on async actors (even while an endpoint awaits);
truthy means handled, falsy, raising or missing means the owner fails in turn with the child's
event as ``cause``, and so does the call an async owner is awaiting in (it is cancelled); at
the root, ``monarch.actor.unhandled_fault_hook`` (looked up at call time) runs on a dedicated
thread, and if it raises the report goes to stderr and the main thread gets
``KeyboardInterrupt``.

Stops are bounded: an actor that has not stopped ``stop_actor_timeout`` after a stop reached it
(stuck in user code) is *fenced* (``ProcRuntime._fence``): retired as stopped, the call it is
stuck in answered, and whatever its thread sends afterwards refused.

Settling (``_client_api.flush_supervision``, test support): a process's agent answers a flush
request once every actor took a marker queued behind its pending supervision events; each
process counts the supervision envelopes it sent and received per peer, so the client can tell
that none is still in flight between two workers.

Liveness (``_liveness``): the client pings each worker process (``HEARTBEAT_ENDPOINT``, answered
here on the runtime loop); every heartbeat renews this process's ``lease`` for the timeout it
carries. Once the lease ran out the client may have declared this process dead: ``post`` sends
nothing more and ``on_fenced`` (the worker's exit) is called.

Every queue is bounded by ``monarch.config`` settings: actor mailboxes
(``actor_mailbox_capacity`` messages and ``actor_mailbox_max_bytes`` bytes; an overflowing call
is rejected with a ``SupervisionError``), port
receivers (``port_queue_capacity``), open ports (``max_open_ports``), actors per process
(``max_actors_per_proc``), tombstones (``MAX_TOMBSTONES``) and the fault-hook queue.
"""

from __future__ import annotations

import _thread
import asyncio
import atexit
import collections
import contextlib
import functools
import inspect
import itertools
import logging
import os
import queue
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec

from chrysalis.core import Pid
from monarch.actor import _logging, _telemetry
from monarch.actor._base import codec as _codec
from monarch.actor._base.actor import check_actor_class
from monarch.actor._base.endpoint import EndpointProperty, endpoints_of
from monarch.actor._base.envelope import (
    FLAG_EXPLICIT_PORT,
    ActorAddr,
    CastInfo,
    Envelope,
    FrameLimits,
    MessageKind,
    PortAddr,
)
from monarch.actor._base.errors import (
    ActorError,
    CodecError,
    ErrorCategory,
    FailureEvent,
    MeshFailure,
    PortClosedError,
    PortOverflowError,
    SupervisionError,
    format_remote_traceback,
)
from monarch.actor._base.future import Future, _Cell
from monarch.actor._base.ids import ActorId, ProcId
from monarch.actor._base.loop import RuntimeLoop
from monarch.actor._base.shape import Extent, Point, Shape
from monarch.actor._context import (
    Context,
    CreatorInfo,
    Instance,
    _current,
    _empty_point,
    _reset_context,
    _set_context,
    set_root_context,
)
from monarch.actor._liveness import Lease
from monarch.actor._runtime import main_module as _main_module
from monarch.actor._transport.seam import Attachable, InProcessFabric
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from monarch.actor._hosts.client_node import ClientNodeLayer
    from monarch.actor._hosts.host_mesh import HostMesh
    from monarch.actor._mesh import ProcMesh

__all__ = [
    "FLUSH_ENDPOINT",
    "HEARTBEAT_ENDPOINT",
    "MAX_TOMBSTONES",
    "ActorCell",
    "CellBase",
    "FlushReport",
    "Heartbeat",
    "ProcDeath",
    "ProcRuntime",
    "Reply",
    "RootCell",
    "UndeliverableEnvelope",
    "broadcast_proc_death",
    "client",
    "current_sender",
    "decode_reply",
    "shutdown_client",
]

_log = logging.getLogger("monarch.actor.runtime")

#: Retired actors remembered per process (for fail-fast replies); the oldest are forgotten.
MAX_TOMBSTONES = 4096
#: Calls held for an actor whose spawn has not reached this process yet (per process), and
#: how long (seconds) one is held before it is rejected as addressed to no actor.
MAX_PARKED_CALLS = 1024
PARK_TIMEOUT = 3.0
#: Pending unhandled faults waiting for the fault hook; more are dropped (and logged).
MAX_PENDING_FAULTS = 10_000
_EMPTY = _codec.Payload(b"")
#: The agent endpoint (path ``""``) that answers a ``flush_supervision`` round.
FLUSH_ENDPOINT = "__flush_supervision__"
#: The agent endpoint that answers the client's heartbeats (``_liveness``, ``_watchdog``).
HEARTBEAT_ENDPOINT = "__heartbeat__"
_SUPERVISION_TRAFFIC = (MessageKind.SUPERVISION, MessageKind.UNDELIVERABLE)
_NONE_PAYLOAD = _codec.encode(None)


# ---------------------------------------------------------------------------------------------
# Replies and port sinks (filled on the runtime loop, decoded by whoever observes them)
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

    __slots__ = ("closer",)

    def __init__(self) -> None:
        self.closer: Callable[[], None] = _nothing

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
        super().__init__()
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


# ---------------------------------------------------------------------------------------------
# Cells: anything that can send and own (actors, the root client, a process's agent)
# ---------------------------------------------------------------------------------------------
class CellBase:
    """Something with an address that sends messages and may own meshes."""

    runtime: ProcRuntime
    path: str
    addr: ActorAddr
    display: str
    user_name: str
    #: Set once a stop gave up waiting for this actor (``ProcRuntime._fence``): it is retired,
    #: and whatever its thread still tries to send is refused.
    fenced = False

    def __init__(self, runtime: ProcRuntime, path: str, display: str, user_name: str) -> None:
        self.runtime = runtime
        self.path = path
        self.addr = ActorAddr(runtime.pid_raw, path)
        self.display = display
        self.user_name = user_name
        self.owned: list[Any] = []
        self._sequence = itertools.count()

    def next_sequence(self) -> int:
        """The sender's next message sequence number."""
        return next(self._sequence)

    @property
    def actor_id(self) -> ActorId:
        """This cell's actor id."""
        return ActorId(self.runtime.proc_id, self.path)

    def request_stop(self, reason: str) -> None:
        raise RuntimeError(f"{self.display} cannot be stopped this way")

    def request_abort(self, reason: str) -> None:
        raise RuntimeError(f"{self.display} cannot be aborted this way")


class _AgentCell(CellBase):
    """A process's own sender identity (bounces, acknowledgements)."""


class UndeliverableEnvelope:
    """What ``Actor._handle_undeliverable_message`` receives for a bounced message."""

    __slots__ = ("_dest", "_endpoint", "_error", "_sender")

    def __init__(self, sender: str, dest: str, endpoint: str, error: str) -> None:
        self._sender = sender
        self._dest = dest
        self._endpoint = endpoint
        self._error = error

    def sender(self) -> str:
        """The actor that sent the message."""
        return self._sender

    def dest(self) -> str:
        """The address it could not reach."""
        return self._dest

    def endpoint(self) -> str:
        """The endpoint it named."""
        return self._endpoint

    def error_msg(self) -> str:
        """Why it was not delivered."""
        return self._error

    def __repr__(self) -> str:
        return f"UndeliverableEnvelope({self._sender} -> {self._dest}: {self._error})"


class _Bounce(msgspec.Struct, frozen=True):
    sender: ActorAddr
    target: ActorAddr
    endpoint: str
    reason: str


def _actor_text(addr: ActorAddr) -> str:
    return f"{addr.path}@{addr.pid.hex()[:12]}"


# ---------------------------------------------------------------------------------------------
# Mailbox
# ---------------------------------------------------------------------------------------------
class _Item:
    __slots__ = ()


class _InitItem(_Item):
    __slots__ = ("buffers", "env", "nbytes")

    def __init__(self, env: Envelope, buffers: list[bytes | bytearray]) -> None:
        self.env = env
        self.buffers = buffers
        #: What the message holds in memory while queued (pickle stream and buffers).
        self.nbytes = len(env.payload) + sum(env.buffer_sizes)


class _CallItem(_InitItem):
    __slots__ = ()


class _StopItem(_Item):
    __slots__ = ("done", "env", "reason")

    def __init__(
        self, reason: str, env: Envelope | None, done: Callable[[], None] | None = None
    ) -> None:
        self.reason = reason
        self.env = env
        self.done = done


class _SuperviseItem(_Item):
    __slots__ = ("event",)

    def __init__(self, event: FailureEvent) -> None:
        self.event = event


class _BounceItem(_Item):
    __slots__ = ("bounce",)

    def __init__(self, bounce: _Bounce) -> None:
        self.bounce = bounce


class _FlushItem(_Item):
    """A ``flush_supervision`` marker: ``done`` runs once every item queued before it (a
    supervision event included, with whatever handling it sent) has been handled, or when the
    actor retires with the marker still queued."""

    __slots__ = ("done",)

    def __init__(self, done: Callable[[], None]) -> None:
        self.done = done


class _FailItem(_Item):
    __slots__ = ("env", "event", "exc")

    def __init__(
        self, event: FailureEvent, exc: BaseException | None, env: Envelope | None = None
    ) -> None:
        self.event = event
        self.exc = exc
        self.env = env


class _Mailbox:
    """Bounded FIFO of items for one actor; blocking ``get`` (sync) or awaitable ``aget``.

    Two bounds apply to what ``put`` accepts without ``force``: ``capacity`` items, and
    ``max_bytes`` bytes of queued messages (``_InitItem.nbytes``; a single message larger than
    that is still accepted into an empty mailbox, so no message is refused for its size alone).
    """

    def __init__(self, capacity: int, max_bytes: int) -> None:
        self._items: collections.deque[_Item] = collections.deque()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._capacity = capacity
        self._max_bytes = max_bytes
        self.nbytes = 0
        """Bytes of the messages queued now."""
        self._wake: Callable[[], None] | None = None
        self._event: asyncio.Event | None = None
        self._waiting = False
        self._closed = False
        #: Called (under the lock: it only schedules a callback) when a supervision event is
        #: queued: an async actor starts its ``__supervise__`` at once, even mid-endpoint.
        self.on_supervision: Callable[[], None] | None = None

    def put(self, item: _Item, force: bool = False) -> bool:
        wake = None
        size = item.nbytes if isinstance(item, _InitItem) else 0
        with self._lock:
            if self._closed or (
                not force
                and (
                    len(self._items) >= self._capacity
                    or (self.nbytes > 0 and self.nbytes + size > self._max_bytes)
                )
            ):
                return False
            self._items.append(item)
            self.nbytes += size
            if self.on_supervision is not None and type(item) is _SuperviseItem:
                self.on_supervision()  # only schedules a callback: no lock taken
            if self._wake is None:
                self._cond.notify()
            elif self._waiting:
                self._waiting = False
                wake = self._wake
        if wake is not None:
            wake()
        return True

    def full_reason(self) -> str:
        """Why ``put`` refused a message (for the sender's error)."""
        with self._lock:
            if len(self._items) >= self._capacity:
                return f"the actor's mailbox is full ({self._capacity} messages)"
            return (
                f"the actor's mailbox is full ({self.nbytes} bytes queued, "
                f"actor_mailbox_max_bytes {self._max_bytes})"
            )

    def _taken(self, item: _Item) -> _Item:
        if isinstance(item, _InitItem):
            self.nbytes -= item.nbytes
        return item

    def get(self) -> _Item:
        with self._cond:
            while not self._items:
                self._cond.wait()
            return self._taken(self._items.popleft())

    def take_supervision(self) -> list[_SuperviseItem]:
        """Remove and return the queued supervision events (in order), ahead of the rest."""
        with self._lock:
            taken = [item for item in self._items if isinstance(item, _SuperviseItem)]
            if taken:
                self._items = collections.deque(
                    item for item in self._items if type(item) is not _SuperviseItem
                )
            return taken

    def use_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        event = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

        with self._lock:
            self._event = event
            self._wake = wake

    async def aget(self) -> _Item:
        assert self._event is not None
        while True:
            with self._lock:
                if self._items:
                    return self._taken(self._items.popleft())
                self._waiting = True
                self._event.clear()
            await self._event.wait()

    def close(self) -> list[_Item]:
        with self._lock:
            self._closed = True
            items, self._items = list(self._items), collections.deque()
            self.nbytes = 0
        return items


# ---------------------------------------------------------------------------------------------
# Actor cells
# ---------------------------------------------------------------------------------------------
_STARTING, _RUNNING, _STOPPING, _STOPPED, _FAILED = range(5)


class SpawnSpec:
    """What a SPAWN envelope carries (pickled): the class, its arguments, and context."""

    __slots__ = ("args", "cls", "creator", "kwargs", "name", "proc_mesh")

    def __init__(
        self,
        name: str,
        cls: type,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        proc_mesh: ProcMesh | None,
        creator: CreatorInfo | None,
    ) -> None:
        self.name = name
        self.cls = cls
        self.args = args
        self.kwargs = kwargs
        self.proc_mesh = proc_mesh
        self.creator = creator

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            SpawnSpec,
            (self.name, self.cls, self.args, self.kwargs, self.proc_mesh, self.creator),
        )


def _point_of(cast: CastInfo | None) -> Point:
    if cast is None:
        return _empty_point()
    try:
        return Point(cast.rank, Extent(cast.labels, cast.sizes))
    except (ValueError, TypeError):
        return _empty_point()


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed: the actor is gone
        loop.call_soon_threadsafe(callback)


def _is_default(cls: type, name: str) -> bool:
    method = getattr(cls, name, None)
    return method is None or bool(getattr(method, "_monarch_default", False))


class ActorCell(CellBase):
    """One actor instance on its own thread (see the module docstring)."""

    def __init__(self, runtime: ProcRuntime, env: Envelope) -> None:
        path = env.target.path
        super().__init__(runtime, path, f"<{path}>", path)
        self.owner = env.sender
        self.spawn_env = env
        self.spawn_point = _point_of(env.cast)
        self.rank = env.cast.rank if env.cast is not None else 0
        self.mailbox = _Mailbox(
            int(_config.get("actor_mailbox_capacity")), int(_config.get("actor_mailbox_max_bytes"))
        )
        self.state = _STARTING
        self.failure: FailureEvent | None = None
        self.actor: Any = None
        self.cls: type | None = None
        self.is_async = False
        self.endpoints: dict[str, EndpointProperty[Any, Any]] = {}
        self.instance: Instance | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        #: The ``__supervise__`` tasks of an async actor (a flush marker waits for them).
        self.supervising: set[asyncio.Task[Any]] = set()
        self._pending_failure: tuple[FailureEvent, BaseException | None, Envelope | None] | None
        self._pending_failure = None
        self._stopping_tasks = False
        #: The call being handled (a fence answers it; an async owner's failure cancels it).
        self._inflight: Envelope | None = None
        self._main_task: asyncio.Task[Any] | None = None
        self._thread = threading.Thread(
            target=self._main, name=f"monarch-actor:{path}[{self.rank}]", daemon=True
        )

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, init: _InitItem) -> None:
        self.mailbox.put(init, force=True)
        self._thread.start()

    def enqueue(self, item: _Item, force: bool = False) -> bool:
        return self.mailbox.put(item, force=force)

    def request_stop(self, reason: str) -> None:
        self.mailbox.put(_StopItem(reason, None), force=True)

    def request_abort(self, reason: str) -> None:
        event = self._event(ErrorCategory.USER, f"aborted: {reason}")
        self.mailbox.put(_FailItem(event, None), force=True)

    def _event(
        self,
        category: ErrorCategory,
        reason: str,
        exc: BaseException | None = None,
        cause: FailureEvent | None = None,
        kind: str = "failed",
    ) -> FailureEvent:
        event = FailureEvent(
            category=str(category),
            kind=kind,
            actor=self.display,
            mesh_name=self.path,
            rank=self.rank,
            reason=reason,
            traceback=format_remote_traceback(exc) if exc is not None else "",
            actor_id=str(self.actor_id),
            proc=self.runtime.label,
        )
        return event.with_cause(cause) if cause is not None else event

    def _record_failure(
        self, event: FailureEvent, exc: BaseException | None, env: Envelope | None = None
    ) -> None:
        if self._pending_failure is None:
            self._pending_failure = (event, exc, env)

    def _main(self) -> None:
        try:
            init = self.mailbox.get()
            assert isinstance(init, _InitItem)
            spec = self._decode_spawn(init)
            if spec is None:
                self._die_sync()
                return
            if self.is_async:
                loop = asyncio.new_event_loop()
                self.loop = loop
                asyncio.set_event_loop(loop)
                self.mailbox.use_loop(loop)
                self.mailbox.on_supervision = functools.partial(
                    _call_soon, loop, self._dispatch_supervision
                )
                try:
                    loop.run_until_complete(self._run_async(spec, init))
                finally:
                    with contextlib.suppress(Exception):
                        leftover = asyncio.all_tasks(loop)
                        for task in leftover:
                            task.cancel()
                        if leftover:
                            loop.run_until_complete(asyncio.wait(leftover, timeout=1.0))
                    asyncio.set_event_loop(None)
                    loop.close()
            else:
                self._run_sync(spec, init)
        except BaseException:  # the thread must always retire the cell
            _log.exception("actor thread %s crashed", self.display)
            if self.failure is None:
                self.failure = self._event(ErrorCategory.SYSTEM, "actor thread crashed")
                self.state = _FAILED
        finally:
            with contextlib.suppress(Exception):
                self.runtime.loop.call_soon(self.runtime._retire, self)

    def _decode_spawn(self, init: _InitItem) -> SpawnSpec | None:
        env = init.env
        try:
            spec = _codec.decode(env.payload, init.buffers, env.buffer_kinds)
            if not isinstance(spec, SpawnSpec):
                raise CodecError("SPAWN payload is not a SpawnSpec")
        except Exception as exc:
            self._reply_init(env)
            self._record_failure(
                self._event(
                    ErrorCategory.USER,
                    "the actor class or its arguments could not be "
                    f"unpickled: {type(exc).__name__}: {exc}",
                    exc,
                ),
                exc,
            )
            return None
        cls = spec.cls
        try:
            self.is_async = check_actor_class(cls)
        except ValueError as exc:
            self._reply_init(env)
            self._record_failure(self._event(ErrorCategory.USER, str(exc), exc), exc)
            return None
        self.cls = cls
        self.user_name = spec.name
        self.endpoints = endpoints_of(cls)
        module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__  # _main_module
        class_name = f"{module}.{cls.__qualname__}"
        creator_chain = spec.creator.chain if spec.creator is not None else "<root>"
        self.display = f"{creator_chain}.<{class_name} {spec.name}{self.spawn_point}>"
        self.instance = Instance(
            cell=self,
            actor_id=self.actor_id,
            rank=self.spawn_point,
            proc_mesh=spec.proc_mesh,
            name=spec.name,
            class_name=class_name,
            creator=spec.creator,
            chain=self.display,
        )
        return spec

    def _construct(self, spec: SpawnSpec, init: _InitItem) -> bool:
        assert self.instance is not None
        token = _set_context(Context(self.instance, self.spawn_point))
        try:
            self.actor = spec.cls(*spec.args, **spec.kwargs)
        except BaseException as exc:
            self._record_failure(
                self._event(
                    ErrorCategory.USER, f"__init__ raised {type(exc).__name__}: {exc}", exc
                ),
                exc,
            )
            return False
        finally:
            _reset_context(token)
            self._reply_init(init.env)
        self.state = _RUNNING
        return True

    def _reply_init(self, env: Envelope) -> None:
        if env.reply_port is not None:
            self._post_reply(env, _NONE_PAYLOAD)

    # -- sync actors ------------------------------------------------------------------------
    def _run_sync(self, spec: SpawnSpec, init: _InitItem) -> None:
        if not self._construct(spec, init):
            self._die_sync()
            return
        while not self.fenced:  # fenced: a stop gave up on it; its thread just ends
            item = self.mailbox.get()
            stop: _StopItem | None = None
            if isinstance(item, _CallItem):
                self._call_sync(item)
            elif isinstance(item, _StopItem):
                stop = item
            elif isinstance(item, _SuperviseItem):
                self._supervise_sync(item.event)
            elif isinstance(item, _BounceItem):
                self._bounce(item.bounce)
            elif isinstance(item, _FailItem):
                self._record_failure(item.event, item.exc, item.env)
            elif isinstance(item, _FlushItem):
                item.done()
            if self._gave_up():
                return  # a stop gave up on it while it ran: it is retired already
            if self._pending_failure is not None:
                self._die_sync()
                return
            if stop is not None:
                self._stop_sync(stop)
                return

    def _gave_up(self) -> bool:
        """True once a stop fenced this actor (set by the runtime loop thread at any time)."""
        return self.fenced

    def _call_sync(self, item: _CallItem) -> None:
        env = item.env
        explicit = self._explicit(env)
        token = _set_context(self._message_context(env))
        self._inflight = env
        try:
            fn, args, kwargs = self._begin(item, explicit)
            result = fn(*args, **kwargs)
            if inspect.iscoroutine(result):  # an async method exposed with as_endpoint
                result = asyncio.run(result)
        except Exception as exc:
            self._raised(env, exc, explicit)
            return
        except BaseException as exc:
            self._raised_base(env, exc)
            return
        finally:
            self._inflight = None
            _reset_context(token)
        if not explicit:
            self._reply_value(env, result)

    def _supervise_sync(self, event: FailureEvent) -> None:
        if self.cls is None or _is_default(self.cls, "__supervise__"):
            self._record_failure(self._unhandled(event), None)
            return
        assert self.instance is not None
        token = _set_context(Context(self.instance, self.spawn_point))
        try:
            handled = self.actor.__supervise__(MeshFailure(event))
            if inspect.iscoroutine(handled):
                handled = asyncio.run(handled)
        except BaseException as exc:
            self._record_failure(self._supervise_raised(event, exc), exc)
            return
        finally:
            _reset_context(token)
        if not handled:
            self._record_failure(self._unhandled(event), None)

    def _die_sync(self) -> None:
        exc = self._begin_failure()
        self._stop_owned()
        self._cleanup_sync(exc)
        self._announce_failure()

    def _stop_sync(self, item: _StopItem) -> None:
        self.state = _STOPPING
        self._stop_owned()
        self._cleanup_sync(None)
        self._finish_stop(item)

    def _cleanup_sync(self, exc: BaseException | None) -> None:
        if self.actor is None or self.cls is None or _is_default(self.cls, "__cleanup__"):
            return
        assert self.instance is not None
        # The actor's own context: __cleanup__ may call context() and message other actors.
        token = _set_context(Context(self.instance, self.spawn_point))
        try:
            result = self.actor.__cleanup__(exc)
            if inspect.iscoroutine(result):
                timeout = float(_config.get("cleanup_timeout"))
                asyncio.run(asyncio.wait_for(result, timeout))
        except BaseException as error:
            self._cleanup_failed(error)
        finally:
            _reset_context(token)

    # -- async actors -----------------------------------------------------------------------
    async def _run_async(self, spec: SpawnSpec, init: _InitItem) -> None:
        self._main_task = asyncio.current_task()
        if not self._construct(spec, init):
            await self._die_async()
            return
        while not self.fenced:
            item = await self.mailbox.aget()
            stop: _StopItem | None = None
            if isinstance(item, _CallItem):
                prop = self.endpoints.get(item.env.endpoint)
                if prop is not None and prop._concurrent:
                    self._start_concurrent(item, prop)
                else:
                    await self._call_async(item)
            elif isinstance(item, _StopItem):
                stop = item
            elif isinstance(item, _SuperviseItem):
                task = self._track(self._supervise_async(item.event))
                self.supervising.add(task)
                task.add_done_callback(self.supervising.discard)
            elif isinstance(item, _BounceItem):
                self._bounce(item.bounce)
            elif isinstance(item, _FailItem):
                self._record_failure(item.event, item.exc, item.env)
            elif isinstance(item, _FlushItem):
                self._flush_async(item)
            if self._gave_up():
                return
            if self._pending_failure is not None:
                await self._die_async()
                return
            if stop is not None:
                await self._stop_async(stop)
                return

    def _dispatch_supervision(self) -> None:
        """Supervision events queued while this async actor is busy (its loop): their
        ``__supervise__`` starts now, interleaving with an endpoint that awaits (Monarch: a
        safe point is also "while the owner awaits"), instead of after it."""
        if self.state != _RUNNING or self.fenced or self._pending_failure is not None:
            return  # the main loop takes them in order, or they die with the actor
        for item in self.mailbox.take_supervision():
            task = self._track(self._supervise_async(item.event))
            self.supervising.add(task)
            task.add_done_callback(self.supervising.discard)

    def _track(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _flush_async(self, item: _FlushItem) -> None:
        """A flush marker on an async actor: ``__supervise__`` runs as a task and an unhandled
        event comes back as a ``_FailItem``, so the marker is queued again behind whatever the
        supervise tasks running now put in the mailbox, once they are all done."""
        pending = set(self.supervising)
        if not pending:
            item.done()
            return

        def one_done(task: asyncio.Task[Any]) -> None:
            pending.discard(task)
            if not pending and not self.mailbox.put(item, force=True):
                item.done()  # the mailbox closed: the actor retired

        for task in list(pending):
            task.add_done_callback(one_done)

    async def _call_async(self, item: _CallItem) -> None:
        env = item.env
        explicit = self._explicit(env)
        token = _set_context(self._message_context(env))
        self._inflight = env
        try:
            fn, args, kwargs = self._begin(item, explicit)
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            if not self._failed_during(env):
                self._raised(env, exc, explicit)
            return
        except BaseException as exc:
            if not self._failed_during(env):
                self._raised_base(env, exc)
            elif isinstance(exc, asyncio.CancelledError) and self._main_task is not None:
                self._main_task.uncancel()  # our own cancel (``_fail_now``), consumed here
            return
        finally:
            self._inflight = None
            _reset_context(token)
        if not explicit and not self._failed_during(env):
            self._reply_value(env, result)

    def _failed_during(self, env: Envelope) -> bool:
        """True if this actor failed while handling ``env`` (its caller gets the failure)."""
        pending = self._pending_failure
        return pending is not None and pending[2] is env

    def _fail_now(self, event: FailureEvent, exc: BaseException | None) -> None:
        """An async actor's supervision event was not handled (on its loop): the actor fails at
        once. A call in flight is cancelled and fails with the ``SupervisionError`` (Monarch:
        the owner fails, and so does the call it is handling); otherwise the failure queues."""
        env = self._inflight
        if env is not None and self._main_task is not None and self._pending_failure is None:
            self._record_failure(event, exc, env)
            self._main_task.cancel()
            return
        self.mailbox.put(_FailItem(event, exc), force=True)

    def _start_concurrent(self, item: _CallItem, prop: EndpointProperty[Any, Any]) -> None:
        token = _set_context(self._message_context(item.env))
        try:  # the task copies the context, so the body sees its own message rank
            self._track(self._run_concurrent(item, prop))
        finally:
            _reset_context(token)

    async def _run_concurrent(self, item: _CallItem, prop: EndpointProperty[Any, Any]) -> None:
        env = item.env
        forwards = not prop._user_port and env.reply_port is not None
        try:
            fn, args, kwargs = self._begin(item, prop._user_port)
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError:
            if forwards and self._stopping_tasks:
                self._reply_error(
                    env,
                    SupervisionError(
                        event=self._event(
                            ErrorCategory.SYSTEM,
                            "the actor stopped while the concurrent endpoint was running",
                            kind="stopped",
                        ),
                        endpoint=f"{self.user_name}.{env.endpoint}",
                    ),
                )
            elif forwards:
                self._reply_error(env, self._actor_error(env, asyncio.CancelledError(), True))
            raise
        except Exception as exc:
            if forwards:
                self._reply_error(env, self._actor_error(env, exc, False))
            elif not self._stopping_tasks:
                self._fail_later(env, exc)
            return
        except BaseException as exc:
            if forwards:
                self._reply_error(env, self._actor_error(env, exc, True))
            elif not self._stopping_tasks:
                self._fail_later(env, exc)
            return
        if forwards:
            self._reply_value(env, result)

    def _fail_later(self, env: Envelope, exc: BaseException) -> None:
        event = self._event(
            ErrorCategory.USER,
            f"endpoint {env.endpoint}() raised {type(exc).__name__}: {exc}",
            exc,
        )
        self.mailbox.put(_FailItem(event, exc, env), force=True)

    async def _supervise_async(self, event: FailureEvent) -> None:
        if self.cls is None or _is_default(self.cls, "__supervise__"):
            self._fail_now(self._unhandled(event), None)
            return
        assert self.instance is not None
        token = _set_context(Context(self.instance, self.spawn_point))
        try:
            handled = self.actor.__supervise__(MeshFailure(event))
            if inspect.isawaitable(handled):
                handled = await handled
        except asyncio.CancelledError:
            if self._stopping_tasks:
                return  # a pending __supervise__ cancelled by stop does not propagate
            raise
        except BaseException as exc:
            self._fail_now(self._supervise_raised(event, exc), exc)
            return
        finally:
            _reset_context(token)
        if not handled:
            self._fail_now(self._unhandled(event), None)

    async def _cancel_tasks(self) -> None:
        self._stopping_tasks = True
        while self.tasks:
            pending = list(self.tasks)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=float(_config.get("cleanup_timeout")))
            self.tasks.difference_update(pending)

    async def _die_async(self) -> None:
        exc = self._begin_failure()
        self._stop_owned()
        await self._cancel_tasks()
        await self._cleanup_async(exc)
        self._announce_failure()

    async def _stop_async(self, item: _StopItem) -> None:
        self.state = _STOPPING
        self._stop_owned()
        await self._cancel_tasks()
        await self._cleanup_async(None)
        self._finish_stop(item)

    async def _cleanup_async(self, exc: BaseException | None) -> None:
        if self.actor is None or self.cls is None or _is_default(self.cls, "__cleanup__"):
            return
        assert self.instance is not None
        # The actor's own context: __cleanup__ may call context() and message other actors.
        token = _set_context(Context(self.instance, self.spawn_point))
        try:
            result = self.actor.__cleanup__(exc)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, float(_config.get("cleanup_timeout")))
        except BaseException as error:
            self._cleanup_failed(error)
        finally:
            _reset_context(token)

    # -- shared pieces ------------------------------------------------------------------------
    def _message_context(self, env: Envelope) -> Context:
        assert self.instance is not None
        return Context(self.instance, _point_of(env.cast))

    def _explicit(self, env: Envelope) -> bool:
        prop = self.endpoints.get(env.endpoint)
        if prop is not None:
            return prop._user_port
        return bool(env.flags & FLAG_EXPLICIT_PORT)

    def _begin(
        self, item: _CallItem, explicit: bool
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        env = item.env
        if env.endpoint == "__monarch_ping__":
            return (lambda: None), (), {}
        prop = self.endpoints.get(env.endpoint)
        if prop is not None:
            fn: Callable[..., Any] = prop._method.__get__(self.actor, self.cls)
        else:
            attr = getattr(self.actor, env.endpoint, None) if env.endpoint[:1] != "_" else None
            if attr is None or not callable(attr):
                raise AttributeError(f"{self.display} has no endpoint {env.endpoint!r}")
            fn = attr
        decoded = _codec.decode(env.payload, item.buffers, env.buffer_kinds)
        if (
            not isinstance(decoded, tuple)
            or len(decoded) != 2
            or not isinstance(decoded[0], tuple)
            or not isinstance(decoded[1], dict)
        ):
            raise CodecError("call payload is not an (args, kwargs) pair")
        args, kwargs = decoded
        if explicit:
            from monarch.actor._port import Port

            if env.reply_port is None:
                raise RuntimeError(f"{env.endpoint}() needs a reply port but none was sent")
            args = (Port._bound(env.reply_port, env.cast), *args)
        if _telemetry.ACTIVE:
            fn = _telemetry.wrap_endpoint(self, env, fn, prop)
        return fn, args, kwargs

    def _actor_error(self, env: Envelope, exc: BaseException, base: bool) -> ActorError:
        suffix = " with BaseException" if base else ""
        return ActorError(exc, f"Actor call {self.user_name}.{env.endpoint} failed{suffix}.")

    def _raised(self, env: Envelope, exc: Exception, explicit: bool) -> None:
        if env.reply_port is not None and not explicit:
            self._reply_error(env, self._actor_error(env, exc, False))
            return
        event = self._event(
            ErrorCategory.USER,
            f"endpoint {env.endpoint}() raised {type(exc).__name__}: {exc}",
            exc,
        )
        self._record_failure(event, exc, env)

    def _raised_base(self, env: Envelope, exc: BaseException) -> None:
        event = self._event(
            ErrorCategory.USER,
            f"endpoint {env.endpoint}() raised {type(exc).__name__} (a BaseException): {exc}",
            exc,
        )
        self._record_failure(event, exc, env)

    def _unhandled(self, event: FailureEvent) -> FailureEvent:
        return self._event(
            ErrorCategory.SYSTEM,
            f"a supervision event from owned mesh {event.mesh_name!r} (rank {event.rank}) was "
            "not handled",
            cause=event,
        )

    def _supervise_raised(self, event: FailureEvent, exc: BaseException) -> FailureEvent:
        return self._event(
            ErrorCategory.USER,
            f"__supervise__ raised {type(exc).__name__}: {exc}",
            exc,
            cause=event,
        )

    def _cleanup_failed(self, error: BaseException) -> None:
        if isinstance(error, TimeoutError | asyncio.TimeoutError):
            reason = f"__cleanup__ did not finish within {_config.get('cleanup_timeout')} s"
        else:
            reason = f"__cleanup__ raised {type(error).__name__}: {error}"
        if self.state == _FAILED:
            _log.warning("%s: %s (after the actor had failed)", self.display, reason)
            return
        self.failure = self._event(ErrorCategory.USER, reason, error)
        self.state = _FAILED
        self._announce_failure()

    def _bounce(self, bounce: _Bounce) -> None:
        envelope = UndeliverableEnvelope(
            _actor_text(bounce.sender), _actor_text(bounce.target), bounce.endpoint, bounce.reason
        )
        handled = False
        if self.cls is not None and not _is_default(self.cls, "_handle_undeliverable_message"):
            try:
                handled = bool(self.actor._handle_undeliverable_message(envelope))
            except Exception as exc:
                self._record_failure(
                    self._event(ErrorCategory.USER, "_handle_undeliverable_message raised", exc),
                    exc,
                )
                return
        if not handled:
            self._record_failure(
                self._event(
                    ErrorCategory.SYSTEM,
                    f"a message it sent to {_actor_text(bounce.target)} "
                    f"({bounce.endpoint or 'port'}) could not be delivered: {bounce.reason}",
                ),
                None,
            )

    def _begin_failure(self) -> BaseException | None:
        assert self._pending_failure is not None
        event, exc, env = self._pending_failure
        self.state = _FAILED
        self.failure = event
        if env is not None and env.reply_port is not None:
            self._reply_error(
                env, SupervisionError(event=event, endpoint=f"{self.user_name}.{env.endpoint}")
            )
        return exc

    def _announce_failure(self) -> None:
        assert self.failure is not None
        _telemetry.record_supervision("actor_failed", self.failure, self.runtime.label)
        payload = _codec.Payload(msgspec.msgpack.encode(self.failure))
        try:
            self.runtime.post(self, MessageKind.SUPERVISION, self.owner, payload=payload)
        except Exception:
            _log.exception("could not report the failure of %s to its owner", self.display)

    def _finish_stop(self, item: _StopItem) -> None:
        if self.state != _FAILED:
            self.state = _STOPPED
            self.failure = self._event(ErrorCategory.SYSTEM, item.reason, kind="stopped")
            _telemetry.record_supervision("actor_stopped", self.failure, self.runtime.label)
        if item.env is not None and item.env.reply_port is not None:
            self._post_reply(item.env, _NONE_PAYLOAD)
        if item.done is not None:
            self.runtime.loop.call_soon(item.done)

    def _stop_owned(self) -> None:
        owned, self.owned = self.owned, []
        if not owned:
            return
        if self.instance is None:
            _stop_meshes(owned)
            return
        # Stop messages must leave from this actor's process (in a worker, outside an
        # endpoint, ``current_sender`` would otherwise fall back to a fresh local client).
        token = _set_context(Context(self.instance, self.spawn_point))
        try:
            _stop_meshes(owned)
        finally:
            _reset_context(token)

    def _reply_value(self, env: Envelope, value: Any) -> None:
        if env.reply_port is None:
            return
        try:
            payload = _codec.encode(value)
        except Exception as exc:
            error = ActorError(
                exc,
                f"Actor call {self.user_name}.{env.endpoint} failed: the result could not "
                "be pickled.",
            )
            self._reply_error(env, error)
            return
        self._post_reply(env, payload)

    def _post_reply(self, env: Envelope, payload: _codec.Payload) -> None:
        assert env.reply_port is not None
        if self.fenced:
            return  # its caller was answered when the actor was fenced
        try:
            self.runtime.post(
                self,
                MessageKind.PORT_VALUE,
                env.reply_port.actor,
                port=env.reply_port.index,
                cast=env.cast,
                payload=payload,
            )
        except Exception as exc:  # e.g. the result is too large for a frame
            self._reply_error(
                env,
                ActorError(
                    exc,
                    f"Actor call {self.user_name}.{env.endpoint} failed: the reply was not sent.",
                ),
            )

    def _reply_error(self, env: Envelope, exc: BaseException) -> None:
        if env.reply_port is not None and not self.fenced:
            self.runtime.reply_error(self, env.reply_port, env.cast, exc)


def _stop_meshes(
    meshes: Sequence[Any], timeout: float | None = None, *, at_exit: bool = False
) -> None:
    """Stop owned meshes (actor meshes before proc meshes, newest first), all at once, then
    wait for them within one overall ``timeout``. ``at_exit``: the interpreter is ending and
    stragglers are killed next, so a slow stop is only worth a debug line."""
    if timeout is None:
        timeout = float(_config.get("stop_actor_timeout"))
    ordered = list(meshes)[::-1]  # newest first; then actor meshes before proc meshes
    ordered.sort(key=lambda m: type(m).__name__ == "ProcMesh")
    pending = []
    for mesh in ordered:
        try:
            future = mesh._stop_owned()
        except Exception:
            _log.exception("could not stop owned mesh %r", mesh)
            continue
        if future is not None:
            pending.append((mesh, future))
    deadline = time.monotonic() + timeout
    for mesh, future in pending:
        if not future._cell.wait(max(0.0, deadline - time.monotonic())):
            _log.log(
                logging.DEBUG if at_exit else logging.WARNING,
                "owned mesh %r did not stop within %.1f s",
                mesh,
                timeout,
            )


# ---------------------------------------------------------------------------------------------
# The root client
# ---------------------------------------------------------------------------------------------
class RootCell(CellBase):
    """The client script as an actor: owner of everything it spawns, end of supervision."""

    def __init__(self, runtime: ProcRuntime) -> None:
        super().__init__(runtime, "root", "<root>", "root")
        self.instance = Instance(
            cell=self,
            actor_id=self.actor_id,
            rank=_empty_point(),
            proc_mesh=None,
            name="root",
            class_name="monarch.actor.RootClientActor",
            creator=None,
            chain="<root>",
        )
        self.context = Context(self.instance, _empty_point())
        # Faults for the hook, and flush markers (an Event the hook thread sets when it gets
        # there, i.e. once every fault queued before it went through the hook).
        self._faults: queue.Queue[FailureEvent | threading.Event] = queue.Queue(MAX_PENDING_FAULTS)
        self._hook_thread: threading.Thread | None = None
        self._hook_lock = threading.Lock()

    def creator_info(self) -> CreatorInfo:
        return CreatorInfo("root", str(self.actor_id), "<root>")

    def on_fault(self, event: FailureEvent) -> None:
        """Queue an unhandled failure for the fault hook (runtime loop thread)."""
        _telemetry.record_supervision("unhandled_fault", event, self.runtime.label)
        try:
            self._faults.put_nowait(event)
        except queue.Full:
            _log.error("dropping unhandled fault (hook queue full): %s", event.headline())
            return
        self._ensure_hook_thread()

    def _ensure_hook_thread(self) -> None:
        with self._hook_lock:
            if self._hook_thread is None:
                self._hook_thread = threading.Thread(
                    target=self._run_hook, name="monarch-fault-hook", daemon=True
                )
                self._hook_thread.start()

    def flush_hook(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds; any thread but the hook's) until every fault
        queued so far went through the fault hook; False on timeout."""
        deadline = time.monotonic() + timeout
        marker = threading.Event()
        try:
            self._faults.put(marker, timeout=timeout)
        except queue.Full:
            return False
        self._ensure_hook_thread()
        return marker.wait(max(0.0, deadline - time.monotonic()))

    def _run_hook(self) -> None:
        while True:
            event = self._faults.get()
            if isinstance(event, threading.Event):
                event.set()
                continue
            failure = MeshFailure(event)
            module = sys.modules.get("monarch.actor")
            hook = getattr(module, "unhandled_fault_hook", None) if module else None
            try:
                if hook is None:
                    raise SystemExit(1)
                hook(failure)
            except BaseException:
                sys.stderr.write(
                    f"monarch.actor: unhandled fault reached the root client:\n{failure.report()}\n"
                )
                sys.stderr.flush()
                _interrupt_main_thread()

    def request_stop(self, reason: str) -> None:
        raise RuntimeError("the root client cannot stop itself; use shutdown_context()")

    def request_abort(self, reason: str) -> None:
        raise RuntimeError("the root client cannot abort itself")


def _interrupt_main_thread() -> None:
    """Raise ``KeyboardInterrupt`` in the main thread, waking it from blocking calls.

    ``_thread.interrupt_main`` alone only sets a flag that a thread blocked in ``sleep`` or a
    lock wait notices when the call returns; a real SIGINT to the main thread wakes it (when
    Python's default SIGINT handler is installed, which turns it into ``KeyboardInterrupt``).
    """
    main = threading.main_thread()
    if (
        hasattr(signal, "pthread_kill")
        and main.ident is not None
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        signal.pthread_kill(main.ident, signal.SIGINT)
    else:
        _thread.interrupt_main()


# ---------------------------------------------------------------------------------------------
# One process
# ---------------------------------------------------------------------------------------------
class ProcRuntime:
    """The runtime of one (possibly simulated) process. See the module docstring."""

    def __init__(
        self, fabric: Attachable, loop: RuntimeLoop, label: str, pid: Pid | None = None
    ) -> None:
        self.loop = loop
        self.label = label
        _logging.install(label)
        self.transport = fabric.attach(loop, self._on_envelope, self._on_undeliverable, pid)
        self.pid_raw = self.transport.pid.raw
        self.proc_id = ProcId(self.transport.pid, label)
        self.cells: dict[str, ActorCell] = {}
        self.tombstones: collections.OrderedDict[str, tuple[FailureEvent, str]] = (
            collections.OrderedDict()
        )
        # Calls that overtook their actor's spawn (a mesh handed on by its owner reaches a
        # third process before the owner's SPAWN reaches the target): held, in order, until
        # the spawn lands or PARK_TIMEOUT passes. Bounded by MAX_PARKED_CALLS.
        self._parked: dict[str, list[tuple[Envelope, list[bytes | bytearray]]]] = {}
        self._parked_count = 0
        self.root: RootCell | None = None
        self.agent = _AgentCell(self, "", f"<proc {label}>", "")
        self.stopped = False
        self._ports: dict[int, PortSink] = {}
        self._port_lock = threading.Lock()
        self._next_port = itertools.count(1)
        self._dead: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        # Supervision traffic (SUPERVISION and UNDELIVERABLE envelopes: what can turn into a
        # fault) counted per peer PID, for ``flush_supervision``'s check that nothing is in
        # flight between two processes. ``_sent`` is net of bounces. Bounded (oldest dropped).
        self._traffic_lock = threading.Lock()
        self._sent: dict[bytes, int] = {}
        self._received: dict[bytes, int] = {}
        # Liveness: renewed by the client's heartbeats; once expired, this process is fenced.
        self.lease = Lease()
        self._lease_timer: asyncio.TimerHandle | None = None
        self.fenced: str | None = None
        """Why this process was fenced (``None``: it was not)."""
        self.on_fenced: Callable[[str], None] | None = None
        """Called once when the lease runs out (a worker exits); without it, sends are dropped."""

    # -- supervision traffic and flushes -------------------------------------------------------
    def _count(self, table: dict[bytes, int], pid: bytes, delta: int) -> None:
        with self._traffic_lock:
            table[pid] = table.pop(pid, 0) + delta  # re-inserted: the most recent stay
            if len(table) > MAX_TOMBSTONES:
                del table[next(iter(table))]

    def _snapshot(self, table: dict[bytes, int]) -> dict[str, int]:
        with self._traffic_lock:
            return {pid.hex(): n for pid, n in table.items()}

    def _flush_request(self, env: Envelope) -> None:
        """A ``flush_supervision`` round reached this process (runtime loop thread), behind
        everything that reached it before, death notices included (their supervision events
        are in the owners' mailboxes by now). A marker goes into every actor's mailbox; once
        each actor handled its marker (so the supervision events queued before it, and sent
        what handling them sent) or retired, the last one to finish replies with a
        ``FlushReport``. The reply leaves after those sends (a happens-before edge through the
        countdown's lock), so on the same path to the client it arrives after them.

        What it reports as received is counted *now*, when everything received is queued
        ahead of the markers (so handled before the reply); what it reports as sent is
        counted at the reply, so it includes what handling sent (an event received after
        the markers may be counted as sent and not yet as received: the next round sees it).
        """
        received = self._snapshot(self._received)
        cells = list(self.cells.values())
        remaining = [len(cells) + 1]
        lock = threading.Lock()

        def one_done() -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last and env.reply_port is not None:
                report = FlushReport(self._snapshot(self._sent), received)
                payload = _codec.Payload(msgspec.msgpack.encode(report))
                with contextlib.suppress(Exception):  # the client is gone: nobody waits
                    self.post(
                        self.agent,
                        MessageKind.PORT_VALUE,
                        env.reply_port.actor,
                        port=env.reply_port.index,
                        payload=payload,
                    )

        for cell in cells:
            if not cell.enqueue(_FlushItem(one_done), force=True):
                one_done()  # its mailbox is closed: it retired, its sends are done
        one_done()

    # -- sending ------------------------------------------------------------------------------
    def post(
        self,
        sender: CellBase,
        kind: MessageKind,
        target: ActorAddr,
        *,
        port: int = -1,
        endpoint: str = "",
        reply_port: PortAddr | None = None,
        cast: CastInfo | None = None,
        payload: _codec.Payload = _EMPTY,
        flags: int = 0,
    ) -> None:
        """Send one envelope from ``sender`` (any thread; FIFO per thread and destination).
        Nothing leaves a fenced process (its lease ran out), nor a fenced actor."""
        if sender.fenced:
            raise RuntimeError(
                f"{sender.display} was stopped (it did not stop within the stop timeout); it "
                "can no longer send"
            )
        lease = self.lease
        if lease.armed and lease.expired(time.monotonic()):
            self._fence_process("no heartbeat from the client within its timeout")
            return
        envelope = Envelope(
            kind,
            sender.addr,
            target,
            port,
            endpoint,
            sender.next_sequence(),
            reply_port,
            cast,
            payload.data,
            tuple(b.nbytes for b in payload.buffers),
            payload.kinds,
            flags,
            _telemetry.outgoing_trace(kind) if _telemetry.TRACING else b"",
        )
        if _telemetry.ACTIVE:
            _telemetry.on_sent(envelope)
        self.transport.send(envelope, payload.buffers)
        if kind in _SUPERVISION_TRAFFIC:
            self._count(self._sent, target.pid, 1)

    def reply_error(
        self, sender: CellBase, reply_port: PortAddr, cast: CastInfo | None, exc: BaseException
    ) -> None:
        """Send ``exc`` to ``reply_port`` (falling back to a stand-in if it cannot be pickled)."""
        payload = _encode_exception(exc)
        try:
            self.post(
                sender,
                MessageKind.PORT_ERROR,
                reply_port.actor,
                port=reply_port.index,
                cast=cast,
                payload=payload,
            )
        except Exception:
            _log.exception("could not send an error reply to %r", reply_port)

    # -- ports ----------------------------------------------------------------------------------
    def open_port(self, owner: CellBase, sink: PortSink) -> PortAddr:
        """Register ``sink`` under a new port index owned by ``owner`` (any thread)."""
        limit = int(_config.get("max_open_ports"))
        with self._port_lock:
            if len(self._ports) >= limit:
                raise PortOverflowError(f"this process already has {limit} open ports")
            index = next(self._next_port)
            self._ports[index] = sink
        if _telemetry.ACTIVE:
            _telemetry.on_port_opened(self, index)
        sink.closer = lambda: self.close_port(index)
        return PortAddr(self.pid_raw, owner.path, index)

    def close_port(self, index: int) -> None:
        """Forget port ``index`` (idempotent)."""
        with self._port_lock:
            self._ports.pop(index, None)

    @property
    def open_ports(self) -> int:
        """Number of open ports (for tests and statistics)."""
        return len(self._ports)

    def _deliver_port(self, index: int, reply: Reply) -> None:
        with self._port_lock:
            sink = self._ports.get(index)
        if sink is None:
            _log.debug("dropping a message for closed port %d", index)
            return
        if sink.deliver(reply):
            self.close_port(index)
            if _telemetry.ACTIVE:
                _telemetry.on_port_completed(self, index)

    # -- inbound (runtime loop thread) ---------------------------------------------------------
    def _on_envelope(self, env: Envelope, buffers: list[bytes | bytearray]) -> None:
        if _telemetry.ACTIVE and env.endpoint != HEARTBEAT_ENDPOINT:
            _telemetry.on_received(env)
        if env.kind in _SUPERVISION_TRAFFIC:
            self._count(self._received, env.sender.pid, 1)
        try:
            self._route(env, buffers)
        except Exception:
            _log.exception("failed to route %s envelope", env.kind.name)

    def _route(self, env: Envelope, buffers: list[bytes | bytearray]) -> None:
        kind = env.kind
        if kind in (MessageKind.PORT_VALUE, MessageKind.PORT_ERROR):
            rank = env.cast.rank if env.cast is not None else 0
            reply = Reply(
                kind == MessageKind.PORT_VALUE, env.payload, buffers, env.buffer_kinds, rank
            )
            self._deliver_port(env.port, reply)
            return
        if kind == MessageKind.SPAWN:
            self._spawn(env, buffers)
            return
        if kind == MessageKind.STOP_PROC:
            self._stop_proc(env)
            return
        path = env.target.path
        if path == "root" and self.root is not None:
            self._to_root(env)
            return
        cell = self.cells.get(path)
        if cell is None:
            if not path and kind == MessageKind.SUPERVISION:  # a process-death notice
                notice = msgspec.msgpack.decode(env.payload, type=ProcDeath)
                self.proc_died(notice.pid, notice.reason, fenced=notice.fenced)
                return
            if not path and kind == MessageKind.CALL and env.endpoint == FLUSH_ENDPOINT:
                self._flush_request(env)
                return
            if not path and kind == MessageKind.CALL and env.endpoint == HEARTBEAT_ENDPOINT:
                self._heartbeat(env)
                return
            if self._park(env, buffers):
                return
            self._reject(env, self._missing_event(env))
            return
        item: _Item
        if kind == MessageKind.CALL:
            item = _CallItem(env, buffers)
        elif kind == MessageKind.STOP:
            item = _StopItem("stopped by its owner", env)
            self.loop.loop.call_later(
                float(_config.get("stop_actor_timeout")), self._fence, cell, "stopped by its owner"
            )
        elif kind == MessageKind.SUPERVISION:
            item = _SuperviseItem(msgspec.msgpack.decode(env.payload, type=FailureEvent))
            _telemetry.record_supervision("supervision_received", item.event, self.label)
        else:  # UNDELIVERABLE
            item = _BounceItem(msgspec.msgpack.decode(env.payload, type=_Bounce))
        if _telemetry.ACTIVE:
            _telemetry.on_enqueued(len(cell.mailbox._items))
        if not cell.enqueue(item, force=kind != MessageKind.CALL):
            event = FailureEvent(
                category=str(ErrorCategory.SYSTEM),
                kind="undeliverable",
                actor=cell.display,
                mesh_name=path,
                rank=cell.rank,
                reason=cell.mailbox.full_reason(),
            )
            self._reject(env, (event, cell.user_name))

    def _to_root(self, env: Envelope) -> None:
        assert self.root is not None
        if env.kind == MessageKind.SUPERVISION:
            self.root.on_fault(msgspec.msgpack.decode(env.payload, type=FailureEvent))
        elif env.kind == MessageKind.UNDELIVERABLE:
            bounce = msgspec.msgpack.decode(env.payload, type=_Bounce)
            self.root.on_fault(
                FailureEvent(
                    category=str(ErrorCategory.SYSTEM),
                    kind="undeliverable",
                    actor=_actor_text(bounce.target),
                    mesh_name=bounce.target.path,
                    rank=-1,
                    reason=f"a message from the client ({bounce.endpoint or 'port'}) could not "
                    f"be delivered: {bounce.reason}",
                )
            )
        else:
            event = FailureEvent(
                category=str(ErrorCategory.SYSTEM),
                kind="undeliverable",
                actor="<root>",
                mesh_name="root",
                rank=-1,
                reason="the root client has no endpoints",
            )
            self._reject(env, (event, "root"))

    def _park(self, env: Envelope, buffers: list[bytes | bytearray]) -> bool:
        """Hold a call to an unknown actor that may still be on its way (see ``_parked``)."""
        path = env.target.path
        if (
            env.kind != MessageKind.CALL
            or self.stopped
            or path in self.tombstones
            or path in ("", "root")
            or self._parked_count >= MAX_PARKED_CALLS
        ):
            return False
        waiting = self._parked.get(path)
        if waiting is None:
            waiting = self._parked[path] = []
            self.loop.loop.call_later(PARK_TIMEOUT, self._unpark, path)
        waiting.append((env, buffers))
        self._parked_count += 1
        return True

    def _unpark(self, path: str) -> None:
        """Route the calls held for ``path``: to the actor if it exists now, else rejected."""
        waiting = self._parked.pop(path, None)
        if not waiting:
            return
        self._parked_count -= len(waiting)
        for env, buffers in waiting:
            if path in self.cells:
                self._route(env, buffers)
            else:
                self._reject(env, self._missing_event(env))

    def _missing_event(self, env: Envelope) -> tuple[FailureEvent, str]:
        path = env.target.path
        stone = self.tombstones.get(path)
        if stone is not None:
            event, user_name = stone
            if event.kind == "failed":
                unhealthy = FailureEvent(
                    category=event.category,
                    kind="unhealthy",
                    actor=event.actor,
                    mesh_name=event.mesh_name,
                    rank=event.rank,
                    reason=event.headline(),
                ).with_cause(event)
                return unhealthy, user_name
            return event, user_name
        reason = (
            "actor mesh is stopped due to proc mesh shutdown"
            if self.stopped
            else f"no actor {path!r} exists in this process"
        )
        event = FailureEvent(
            category=str(ErrorCategory.SYSTEM),
            kind="stopped" if self.stopped else "undeliverable",
            actor=_actor_text(env.target),
            mesh_name=path,
            rank=env.cast.rank if env.cast is not None else -1,
            reason=reason,
        )
        return event, path.rsplit("-", 1)[0]

    def _reject(self, env: Envelope, why: tuple[FailureEvent, str]) -> None:
        event, user_name = why
        if env.kind in (MessageKind.CALL, MessageKind.SPAWN):
            if env.reply_port is not None:
                endpoint = f"{user_name}.{env.endpoint or 'spawn'}"
                self.reply_error(
                    self.agent,
                    env.reply_port,
                    env.cast,
                    SupervisionError(event=event, endpoint=endpoint),
                )
            elif env.kind == MessageKind.CALL:
                self._bounce_to_sender(env, event.report())
        elif env.kind == MessageKind.STOP and env.reply_port is not None:
            self.post(
                self.agent,
                MessageKind.PORT_VALUE,
                env.reply_port.actor,
                port=env.reply_port.index,
                cast=env.cast,
                payload=_NONE_PAYLOAD,
            )
        elif env.kind == MessageKind.SUPERVISION:
            _log.warning("supervision event for a retired owner %s dropped", env.target.path)

    def _bounce_to_sender(self, env: Envelope, reason: str) -> None:
        bounce = _Bounce(env.sender, env.target, env.endpoint, reason)
        payload = _codec.Payload(msgspec.msgpack.encode(bounce))
        try:
            self.post(self.agent, MessageKind.UNDELIVERABLE, env.sender, payload=payload)
        except Exception:
            _log.exception("could not bounce a message back to its sender")

    def _on_undeliverable(self, env: Envelope, reason: str) -> None:
        """An envelope this process sent could not be delivered (runtime loop thread)."""
        if env.endpoint == HEARTBEAT_ENDPOINT and not env.sender.path:
            return  # a heartbeat or its answer: the watcher's timeout decides, not a bounce
        if env.kind in _SUPERVISION_TRAFFIC:
            self._count(self._sent, env.target.pid, -1)
        event = FailureEvent(
            category=str(ErrorCategory.INFRASTRUCTURE),
            kind="undeliverable",
            actor=_actor_text(env.target),
            mesh_name=env.target.path,
            rank=env.cast.rank if env.cast is not None else -1,
            reason=reason,
        )
        _telemetry.record_supervision("undeliverable", event, self.label)
        if (
            env.kind
            in (MessageKind.CALL, MessageKind.SPAWN, MessageKind.STOP_PROC, MessageKind.STOP)
            and env.reply_port is not None
        ):
            user_name = env.target.path.rsplit("-", 1)[0]
            error = SupervisionError(event=event, endpoint=f"{user_name}.{env.endpoint or 'stop'}")
            rank = env.cast.rank if env.cast is not None else 0
            if env.reply_port.pid == self.pid_raw:
                self._deliver_port(env.reply_port.index, Reply.error(error, rank))
            else:
                self.reply_error(self.agent, env.reply_port, env.cast, error)
        elif env.kind == MessageKind.CALL:
            bounce = _Bounce(env.sender, env.target, env.endpoint, reason)
            self._route(
                Envelope(
                    MessageKind.UNDELIVERABLE,
                    self.agent.addr,
                    env.sender,
                    -1,
                    "",
                    0,
                    None,
                    None,
                    msgspec.msgpack.encode(bounce),
                ),
                [],
            )
        else:
            _log.debug("undeliverable %s envelope dropped: %s", env.kind.name, reason)

    def _spawn(self, env: Envelope, buffers: list[bytes | bytearray]) -> None:
        path = env.target.path
        problem = None
        if self.stopped:
            problem = "`ProcMesh` has already been stopped"
        elif path in self.cells or path in self.tombstones or path in ("", "root"):
            problem = f"an actor named {path!r} already exists in this process"
        elif len(self.cells) >= int(_config.get("max_actors_per_proc")):
            problem = f"this process already runs {len(self.cells)} actors"
        if problem is not None:
            if env.reply_port is not None:
                self.reply_error(self.agent, env.reply_port, env.cast, RuntimeError(problem))
            return
        cell = ActorCell(self, env)
        self.cells[path] = cell
        cell.start(_InitItem(env, buffers))
        if path in self._parked:
            self._unpark(path)

    def _stop_proc(self, env: Envelope) -> None:
        self.stopped = True
        # Stopped by its owner, who stopped watching it: a slow stop is no lost process.
        self.lease.release()
        cells = list(self.cells.values())
        finished = [False]
        timer: list[asyncio.TimerHandle] = []

        def finish() -> None:
            if finished[0]:
                return
            finished[0] = True
            for handle in timer:
                handle.cancel()
            if env.reply_port is not None:
                self.post(
                    self.agent,
                    MessageKind.PORT_VALUE,
                    env.reply_port.actor,
                    port=env.reply_port.index,
                    cast=env.cast,
                    payload=_NONE_PAYLOAD,
                )
            if self.root is None:
                self.transport.close()

        remaining = [len(cells)]

        def one_done() -> None:
            remaining[0] -= 1
            if remaining[0] <= 0:
                finish()

        if not cells:
            finish()
            return
        for cell in cells:
            cell.enqueue(
                _StopItem("actor mesh is stopped due to proc mesh shutdown", None, one_done),
                force=True,
            )

        def give_up() -> None:
            for cell in cells:
                self._fence(cell, "actor mesh is stopped due to proc mesh shutdown")
            finish()

        timer.append(self.loop.loop.call_later(float(_config.get("stop_actor_timeout")), give_up))

    def _fence(self, cell: ActorCell, reason: str) -> None:
        """A stop waited ``stop_actor_timeout`` for ``cell`` in vain (runtime loop thread): its
        thread is stuck in user code (an ``__init__`` or endpoint that never returns), and a
        thread cannot be killed. Retire the actor now, as Monarch kills it: it counts as
        stopped (no supervision event), the stop is acknowledged, queued and later messages
        are refused, what it owns is stopped, and anything its thread sends later is refused.
        If that thread ever returns, it ends without handling another message."""
        if cell.fenced or self.cells.get(cell.path) is not cell:
            return  # it stopped (or failed) in time
        timeout = _config.get("stop_actor_timeout")
        _log.warning("%s did not stop within %s s; fenced", cell.display, timeout)
        starting, inflight = cell.state == _STARTING, cell._inflight
        if cell.state not in (_STOPPED, _FAILED) or cell.failure is None:
            cell.state = _STOPPED
            cell.failure = cell._event(
                ErrorCategory.SYSTEM,
                f"{reason} (it did not stop within {timeout} s and was fenced)",
                kind="stopped",
            )
            _telemetry.record_supervision("actor_stopped", cell.failure, self.label)
        spawn = cell.spawn_env
        if starting and spawn.reply_port is not None:  # ``initialized`` resolves (as Monarch's)
            self.post(
                self.agent,
                MessageKind.PORT_VALUE,
                spawn.reply_port.actor,
                port=spawn.reply_port.index,
                cast=spawn.cast,
                payload=_NONE_PAYLOAD,
            )
        if inflight is not None and inflight.reply_port is not None:  # the call it is stuck in
            error = SupervisionError(
                event=cell.failure, endpoint=f"{cell.user_name}.{inflight.endpoint}"
            )
            self.reply_error(self.agent, inflight.reply_port, inflight.cast, error)
        owned, cell.owned = cell.owned, []
        if owned and cell.instance is not None:
            token = _set_context(Context(cell.instance, cell.spawn_point))
            try:  # the stops leave as this actor; nobody waits for them here
                for mesh in owned:
                    with contextlib.suppress(Exception):
                        mesh._stop_owned()
            finally:
                _reset_context(token)
        self._retire(cell)
        cell.fenced = True

    def _retire(self, cell: ActorCell) -> None:
        """An actor thread finished: forget it, keep a tombstone, reject what is left."""
        if cell.fenced:
            return  # retired already, when a stop gave up on it
        if self.cells.get(cell.path) is cell:
            del self.cells[cell.path]
        event = cell.failure or cell._event(ErrorCategory.SYSTEM, "stopped", kind="stopped")
        self.tombstones[cell.path] = (event, cell.user_name)
        while len(self.tombstones) > MAX_TOMBSTONES:
            self.tombstones.popitem(last=False)
        for item in cell.mailbox.close():
            if isinstance(item, _CallItem):
                self._reject(item.env, self._missing_event(item.env))
            elif isinstance(item, _StopItem):
                if item.env is not None:
                    self._reject(item.env, (event, cell.user_name))
                if item.done is not None:
                    item.done()
            elif isinstance(item, _FlushItem):
                item.done()

    # -- liveness ------------------------------------------------------------------------------
    def send_heartbeat(self, pid: bytes, port: PortAddr, timeout: float) -> None:
        """Ping process ``pid``'s agent; the answer goes to ``port`` (client side; any thread)."""
        payload = msgspec.msgpack.encode(Heartbeat(timeout))
        self._send_quiet(MessageKind.CALL, ActorAddr(pid, ""), -1, port, None, payload)

    def _send_quiet(
        self,
        kind: MessageKind,
        target: ActorAddr,
        port: int,
        reply_port: PortAddr | None,
        cast: CastInfo | None,
        payload: bytes,
    ) -> None:
        """``post`` for heartbeats: no telemetry, no lease check."""
        envelope = Envelope(
            kind,
            self.agent.addr,
            target,
            port,
            HEARTBEAT_ENDPOINT,
            self.agent.next_sequence(),
            reply_port,
            cast,
            payload,
        )
        try:
            self.transport.send(envelope, ())
        except Exception:
            _log.exception("could not send a heartbeat")

    def _heartbeat(self, env: Envelope) -> None:
        """The client's heartbeat (runtime loop thread): renew the lease and answer, or, if the
        lease ran out before it came, fence this process."""
        try:
            beat = msgspec.msgpack.decode(env.payload, type=Heartbeat)
        except (msgspec.DecodeError, msgspec.ValidationError):
            _log.warning("malformed heartbeat from %s dropped", env.sender.pid.hex())
            return
        if not self.lease.renew(time.monotonic(), beat.timeout):
            self._fence_process(f"a heartbeat came after the lease of {beat.timeout:g} s ran out")
            return
        if self._lease_timer is None and self.lease.armed:
            self._arm_lease_timer()
        if env.reply_port is not None:
            reply = env.reply_port
            self._send_quiet(MessageKind.PORT_VALUE, reply.actor, reply.index, None, env.cast, b"")

    def _arm_lease_timer(self) -> None:
        expiry = self.lease.expiry
        if expiry is None or self.fenced is not None:
            self._lease_timer = None
            return
        # Both clocks are time.monotonic; a little past the expiry, so that it has passed.
        self._lease_timer = self.loop.loop.call_at(expiry + 0.001, self._check_lease)

    def _check_lease(self) -> None:
        self._lease_timer = None
        if self.lease.expired(time.monotonic()):
            self._fence_process("no heartbeat from the client within its timeout")
        else:
            self._arm_lease_timer()

    def _fence_process(self, reason: str) -> None:
        """The lease ran out: the client may have declared this process dead. Send nothing
        more (``post``), and call ``on_fenced`` once (a worker exits)."""
        if self.fenced is not None:
            return
        self.fenced = reason
        _log.error("this process is fenced (%s): it sends nothing more", reason)
        hook = self.on_fenced
        if hook is not None:
            hook(reason)

    def proc_died(self, pid: bytes, reason: str, *, fenced: bool = False) -> None:
        """The process ``pid`` died (runtime loop thread; once per PID): later messages to it
        fail fast, the owners here of actors on it get a ``MeshFailure`` per rank
        (``__supervise__``; the root client's go to ``unhandled_fault_hook``), and actors here
        owned by actors of that process are stopped (children never outlive their parent).
        ``fenced``: it was declared dead for not answering heartbeats and may still run; what
        it sends from now on is refused."""
        if pid in self._dead or pid == self.pid_raw:
            return
        self._dead[pid] = reason
        while len(self._dead) > MAX_TOMBSTONES:
            self._dead.popitem(last=False)
        mark = getattr(self.transport, "mark_unreachable", None)
        if mark is not None:
            if fenced:
                mark(pid, reason, fence=True)
            else:
                mark(pid, reason)
        owners: list[CellBase] = [self.root] if self.root is not None else []
        owners += [c for c in self.cells.values() if c.state in (_STARTING, _RUNNING)]
        for owner in owners:
            for mesh in list(owner.owned):
                for event in _dead_ranks(owner, mesh, pid, reason):
                    _telemetry.record_supervision("process_died", event, self.label)
                    if isinstance(owner, RootCell):
                        owner.on_fault(event)
                    elif isinstance(owner, ActorCell):
                        owner.enqueue(_SuperviseItem(event), force=True)
        for cell in list(self.cells.values()):
            if cell.owner.pid == pid:
                cell.request_stop(f"the process of its owner died: {reason}")

    def close(self) -> None:
        """Detach from the transport and abandon open ports."""
        self.transport.close()
        with self._port_lock:
            sinks, self._ports = list(self._ports.values()), {}
        for sink in sinks:
            sink.abandon(SupervisionError("the client runtime was shut down"))


# ---------------------------------------------------------------------------------------------
# The client (this OS process)
# ---------------------------------------------------------------------------------------------
_frame_limits_cache: list[FrameLimits] = [FrameLimits()]


def _frame_limits() -> FrameLimits:
    # Asked on every send: reuse the last FrameLimits while the setting is unchanged.
    value = int(_config.get("codec_max_frame_length"))
    cached = _frame_limits_cache[0]
    if cached.max_frame_bytes != value:
        cached = _frame_limits_cache[0] = FrameLimits(max_frame_bytes=value)
    return cached


class _Client:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = RuntimeLoop("monarch-runtime")
        self.loop.start()
        self.fabric = InProcessFabric(_frame_limits)
        if _node_layer_factory is None:
            raise RuntimeError("monarch.actor is not fully imported (no node layer registered)")
        self.node_layer = _node_layer_factory()  # the client's PID is its (lazy) node's PID
        self.host_mesh: HostMesh | None = None
        self.host_lock = threading.Lock()
        #: The host agent (``_host_agent``), spawned in this process on first use.
        self.host_agent: Any = None
        self.runtime = ProcRuntime(self.fabric, self.loop, "client", pid=self.node_layer.pid)
        self.root = RootCell(self.runtime)
        self.runtime.root = self.root
        self.local_runtimes: weakref.WeakSet[ProcRuntime] = weakref.WeakSet()
        from monarch.actor._mesh import ProcMesh

        self.root.instance.proc_mesh = ProcMesh(
            [self.runtime.proc_id], Shape.unity(), owned=False, name="client"
        )


#: Hook H3: builds the client's node layer (``_host.ClientNodeLayer``, set by ``_host`` at import).
_node_layer_factory: Callable[[], ClientNodeLayer] | None = None


def set_node_layer(factory: Callable[[], ClientNodeLayer]) -> None:
    """Register the factory of the client's node layer (called once, by ``_host``, at import)."""
    global _node_layer_factory
    _node_layer_factory = factory


_client: _Client | None = None
_client_lock = threading.Lock()
_atexit_registered = False


def client() -> _Client:
    """The client runtime of this OS process, bootstrapped on first use (and after fork)."""
    global _client, _atexit_registered
    current = _client
    if current is not None and current.pid == os.getpid():
        return current
    with _client_lock:
        if _client is None or _client.pid != os.getpid():
            # A worker importing the client's script: its unguarded program is running.
            _main_module.refuse_while_importing("Monarch (a client: this_proc(), context(), ...)")
            _client = _Client()
            if not _atexit_registered:
                atexit.register(_shutdown_at_exit)
                _atexit_registered = True
        return _client


#: A worker process's own runtime and sender (``set_process_sender``), with the OS pid that
#: set it (a fork inherits the value, not the runtime).
_process_sender: tuple[int, ProcRuntime, CellBase] | None = None


def set_process_sender(runtime: ProcRuntime) -> None:
    """Called by a worker process once its runtime exists: code running outside any actor
    (a thread an endpoint started, replying through its ``Port`` after the endpoint returned)
    sends through that runtime as the process itself, not through a client of its own that no
    other process can reach."""
    global _process_sender
    _process_sender = (os.getpid(), runtime, runtime.agent)


def current_sender() -> tuple[ProcRuntime, CellBase]:
    """The process runtime and cell of whoever is running: an actor; outside actors, a worker
    process itself, or the root client."""
    ctx = _current()
    if ctx is not None:
        cell = ctx._cell
        return cell.runtime, cell
    own = _process_sender
    if own is not None and own[0] == os.getpid():
        return own[1], own[2]
    c = client()
    return c.runtime, c.root


def shutdown_client(timeout: float = 5.0, *, at_exit: bool = False) -> None:
    """Stop everything the root client owns, then the runtime loop (bounded; idempotent)."""
    global _client
    with _client_lock:
        current, _client = _client, None
    if current is None or current.pid != os.getpid():
        return
    owned, current.root.owned = current.root.owned, []
    # The stops leave as this client's root: with no context, ``current_sender`` would
    # bootstrap a fresh client (this one is unpublished already), whose ports get the acks.
    token = _set_context(current.root.context)
    try:
        _stop_meshes(owned, timeout, at_exit=at_exit)
    finally:
        _reset_context(token)
    for runtime in list(current.local_runtimes):
        runtime.close()
    current.node_layer.shutdown(current, timeout)
    current.runtime.close()
    current.loop.stop(timeout=min(timeout, 1.0))


def _shutdown_at_exit() -> None:
    with contextlib.suppress(Exception):
        shutdown_client(timeout=1.0, at_exit=True)


class FlushReport(msgspec.Struct, frozen=True):
    """A process's answer to a ``flush_supervision`` round: supervision envelopes it sent
    (net of bounces) and received, per peer PID (hex)."""

    sent: dict[str, int]
    received: dict[str, int]


class Heartbeat(msgspec.Struct, frozen=True):
    """A heartbeat's payload: the watcher's timeout (seconds), which the lease adopts."""

    timeout: float


class ProcDeath(msgspec.Struct, frozen=True):
    """A process-death notice: a SUPERVISION envelope to a process's agent (path ``""``);
    ``fenced``: declared dead for not answering heartbeats (it may still run)."""

    pid: bytes
    reason: str
    fenced: bool = False


def _dead_ranks(owner: CellBase, mesh: Any, pid: bytes, reason: str) -> list[FailureEvent]:
    """One failure event per rank of the owned actor mesh ``mesh`` that lived on ``pid``."""
    procs = getattr(mesh, "_procs", None)
    path = getattr(mesh, "_path", None)
    if procs is None or path is None or getattr(mesh, "_stopped", True):
        return []
    shape = mesh._shape
    extent = Extent(list(shape.labels), list(shape.ndslice.sizes))
    cls = mesh._class
    events = []
    for rank, global_rank in enumerate(shape.ndslice):
        if procs[global_rank].pid.raw != pid:
            continue
        point = Point(rank, extent)
        display = f"{owner.display}.<{cls.__module__}.{cls.__qualname__} {mesh._user_name}{point}>"
        events.append(
            FailureEvent(
                category=str(ErrorCategory.INFRASTRUCTURE),
                kind="failed",
                actor=display,
                mesh_name=path,
                rank=rank,
                reason=f"its process failed: {reason}",
                actor_id=f"{path}@{pid.hex()}",
                proc=procs[global_rank].label,
            )
        )
    return events


def broadcast_proc_death(
    client: _Client, pid: Pid, reason: str, others: Sequence[Pid], *, fenced: bool = False
) -> None:
    """Tell the client's runtime and every process in ``others`` that ``pid`` died (``fenced``:
    was declared dead, see ``ProcRuntime.proc_died``)."""
    with contextlib.suppress(Exception):
        client.loop.call_soon(partial(client.runtime.proc_died, pid.raw, reason, fenced=fenced))
    runtime = client.runtime
    payload = _codec.Payload(msgspec.msgpack.encode(ProcDeath(pid.raw, reason, fenced)))
    for other in others:
        with contextlib.suppress(Exception):
            runtime.post(
                runtime.agent, MessageKind.SUPERVISION, ActorAddr(other.raw, ""), payload=payload
            )


def new_local_runtime(label: str) -> ProcRuntime:
    """A simulated process on the client's fabric and loop."""
    c = client()
    runtime = ProcRuntime(c.fabric, c.loop, label)
    c.local_runtimes.add(runtime)
    return runtime


def gather_future(n: int, decode: Callable[[list[Reply]], Any]) -> tuple[PortAddr, Future[Any]]:
    """Open a port collecting ``n`` ranked replies; the future decodes them with ``decode``."""
    runtime, sender = current_sender()
    cell: _Cell[list[Reply]] = _Cell()
    addr = runtime.open_port(sender, GatherSink(n, cell))
    if n == 0:
        runtime.close_port(addr.index)
    return addr, Future._create(cell, decode)


def _root_context() -> Context:
    return client().root.context


set_root_context(_root_context)  # hook H1: ``context()`` outside any actor
