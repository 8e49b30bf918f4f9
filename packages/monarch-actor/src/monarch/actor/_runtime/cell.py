"""Cells: the senders and owners of one process (actors, the root client, a process's agent).

An ``ActorCell`` is one actor instance; its ``ProcRuntime`` (``_runtime.proc``) routes inbound
envelopes into the cell's bounded ``_Mailbox`` on the runtime loop thread, and the cell handles
them on its own thread, created at spawn, so an actor processes one message at a time in arrival
order, thread-local state set in ``__init__`` is visible in every endpoint, and different actors
run concurrently. A *sync* actor's thread runs its endpoints directly (no asyncio loop is
visible to them, so they may block on ``Future.get()``); an *async* actor's thread runs a
private asyncio loop on which its endpoints are awaited one after the other
(``concurrent_endpoint`` bodies run as tasks on that loop). Which of the two is a ``_Runner``
chosen at spawn by the actor class (``_SyncRunner``, ``_AsyncRunner``); the cell holds what both
share (its state, the failure being recorded, replies, stops and owned meshes).

Three result paths (spec section 8):

1. An endpoint raises an ``Exception`` and the message has a reply port: the caller gets an
   ``ActorError``; the actor lives on.
2. No reply port (``broadcast``/``send``), an explicit-port endpoint raising, a
   ``BaseException``, ``__init__`` raising, ``abort()``, an unhandled supervision event: the
   actor *fails*. The message being handled (if it has a reply port) and every message queued or
   arriving later get a ``SupervisionError``; owned meshes are stopped (``_stop_meshes``),
   concurrent bodies cancelled, ``__cleanup__(exc)`` runs, and the owner receives a
   ``SUPERVISION`` envelope.
3. Process death: left to the process layer (a Node reports it); nothing here simulates it.

Supervision at the owner: ``__supervise__(MeshFailure)`` runs between messages on sync actors,
and as a task as soon as the event arrives on async actors (even while an endpoint awaits);
truthy means handled, falsy, raising or missing means the owner fails in turn with the child's
event as ``cause``, and so does the call an async owner is awaiting in (it is cancelled).

The ``RootCell`` is the client script as an actor, at path ``"root"``: the owner of what it
spawns and the end of supervision. Its unhandled faults go to
``monarch.actor.unhandled_fault_hook`` (looked up at call time) on a dedicated thread; if the
hook raises, the report goes to stderr and the main thread gets ``KeyboardInterrupt``
(``_interrupt_main_thread``).
"""

from __future__ import annotations

import _thread
import asyncio
import collections
import contextlib
import contextvars
import functools
import inspect
import itertools
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from monarch.actor._base import codec as _codec
from monarch.actor._base.actor import check_actor_class
from monarch.actor._base.endpoint import EndpointProperty, endpoints_of
from monarch.actor._base.envelope import (
    FLAG_EXPLICIT_PORT,
    ActorAddr,
    CastInfo,
    Envelope,
    MessageKind,
)
from monarch.actor._base.errors import (
    ActorError,
    CodecError,
    ErrorCategory,
    FailureEvent,
    MeshFailure,
    SupervisionError,
    format_remote_traceback,
)
from monarch.actor._base.ids import ActorId
from monarch.actor._base.shape import Extent, Point
from monarch.actor._runtime import telemetry as _telemetry
from monarch.actor._runtime.context import (
    _CURRENT,
    Context,
    CreatorInfo,
    Instance,
    _empty_point,
    _reset_context,
    _set_context,
)
from monarch.actor._runtime.ports import Port
from monarch.actor._runtime.telemetry import metrics as _metrics
from monarch.actor._runtime.telemetry import tracing as _tracing
from monarch.actor._runtime.telemetry.report import ActorStatus
from monarch.actor._runtime.telemetry.tracing import PLAIN_RESULTS, time_awaitable
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from monarch.actor._base.future import Future
    from monarch.actor._mesh.meshes import ProcMesh
    from monarch.actor._runtime.proc import ProcRuntime

__all__ = [
    "ActorCell",
    "CellBase",
    "Owned",
    "RootCell",
    "SpawnSpec",
    "UndeliverableEnvelope",
]

_log = logging.getLogger("monarch.actor.runtime")

#: Pending unhandled faults waiting for the fault hook; more are dropped (and logged).
MAX_PENDING_FAULTS = 10_000
_NONE_PAYLOAD = _codec.encode(None)
#: A sync call's endpoint timing with metrics only (``_SyncRunner._call``, ``run_endpoint``'s
#: timed case inlined): the clock, the raw latency logs by endpoint, when they fold, and the
#: results that are never awaited.
_perf_counter = time.perf_counter
_latency_logs = _metrics._latency_logs
_FOLD_AT = _metrics.FOLD_AT
#: Whether a sync call is timed here (metrics on, tracing off, no hooks: ``_SyncRunner._call``)
#: rather than by ``run_endpoint``, copied from the switches by ``_metrics``' switch listener.
_TIMED_HERE = False


def _metrics_switched() -> None:
    global _TIMED_HERE
    _TIMED_HERE = _metrics.METRICS and not _metrics.HOOKS and not _tracing.TRACING


_metrics.add_switch_listener(_metrics_switched)


def _timed_result(result: Any, endpoint: str, started: float) -> Any:
    """A sync call's result that is not a plain value (``_SyncRunner._call``, metrics only):
    an awaitable is timed through its await (and run, if a coroutine: an async method exposed
    with ``as_endpoint``); anything else is timed now."""
    if inspect.isawaitable(result):
        result = time_awaitable(result, endpoint, started)
        return asyncio.run(result) if inspect.iscoroutine(result) else result
    _metrics.record_elapsed(endpoint, _perf_counter() - started, None)
    return result


# ---------------------------------------------------------------------------------------------
# Cells: anything that can send and own (actors, the root client, a process's agent)
# ---------------------------------------------------------------------------------------------
class Owned(Protocol):
    """What a cell owns (``ActorMesh``, ``ProcMesh``): stopped when its owner stops."""

    #: When it stops among what its owner owns: lower first (``_stop_meshes``). Actor meshes
    #: stop before proc meshes, so their actors are not stopped by their processes' end.
    stop_order: int

    def _stop_owned(self) -> Future[None] | None:
        """Start stopping it (``None``: nothing to wait for)."""
        ...


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
    #: Where this actor's receive spans ran, ``(os_pid, proc, track, thread_id, packed)``
    #: (``packed``: the four packed once, what its span rows carry): made by the first one
    #: (``telemetry.tracing.run_endpoint``), shared by the rest; the send spans it makes use it
    #: too while it sends from the same thread (``send_call_traced``).
    _span_where: tuple[int, str, str, int, msgspec.Raw] | None = None

    def __init__(self, runtime: ProcRuntime, path: str, display: str, user_name: str) -> None:
        self.runtime = runtime
        self.path = path
        self.addr = ActorAddr(runtime.pid_raw, path)
        self.display = display
        self.user_name = user_name
        self.owned: list[Owned] = []
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

    def __init__(self, env: Envelope, buffers: list[_codec.ReceivedBuffer]) -> None:
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


#: Bytes of queued messages up to which an actor's replies are batched (``_Mailbox.batching``).
_BATCH_BYTES = 64 * 1024


class _Mailbox:
    """Bounded FIFO of items for one actor; blocking ``get`` (sync) or awaitable ``aget``.

    Two bounds apply to what ``put`` accepts without ``force``: ``capacity`` items, and
    ``max_bytes`` bytes of queued messages (``_InitItem.nbytes``; a single message larger than
    that is still accepted into an empty mailbox, so no message is refused for its size alone).
    """

    def __init__(self, capacity: int, max_bytes: int) -> None:
        self._items: collections.deque[_Item] = collections.deque()
        self._lock = threading.Lock()
        # A sync actor's thread sleeps on this lock, held while nobody rang (a binary
        # semaphore): ``put`` releases it once for a sleeping ``get``. Cheaper than a
        # ``threading.Condition``, whose every wait makes, takes and drops a lock of its own
        # and whose notify runs Python for each waiter.
        self._doorbell = _thread.allocate_lock()
        self._doorbell.acquire()
        self._sleeping = False
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
        ring = False
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
            if self._sleeping:
                self._sleeping = False
                ring = True
            elif self._waiting:
                self._waiting = False
                wake = self._wake
        if ring:
            try:  # noqa: SIM105 (no context manager on the hot path: three calls per message)
                self._doorbell.release()  # the one release for this sleep (``get``)
            except RuntimeError:
                pass  # open already (a ``get`` left by an exception was rung): nothing to do
        elif wake is not None:
            wake()
        return True

    def __len__(self) -> int:
        """Items queued now."""
        return len(self._items)

    def batching(self) -> bool:
        """Whether a reply sent now should wait in the transport's outbox for the replies of
        the calls queued behind it (one ``sendmsg`` for the batch): only when calls are queued
        and they are small. Queued calls carrying large buffers (``_BATCH_BYTES`` in all) take
        long enough each that the outbox would hold the reply alone, at the price of a wake-up
        of the runtime loop; the reply is then written at once by the actor's thread."""
        return bool(self._items) and self.nbytes < _BATCH_BYTES

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
        """The next item, waiting as long as it takes (one thread: the actor's)."""
        lock = self._lock
        while True:
            with lock:
                if self._items:  # (``take_supervision`` and ``close`` replace the deque)
                    item = self._items.popleft()
                    if isinstance(item, _InitItem):
                        self.nbytes -= item.nbytes
                    return item
                self._sleeping = True
            # ``put`` releases the doorbell once after setting an item and clearing
            # ``_sleeping``; a release before this acquire just lets it through at once.
            self._doorbell.acquire()

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
#: ``ActorCell.state`` by number, as ``ActorStatus.state`` names it.
STATE_NAMES = ("starting", "running", "stopping", "stopped", "failed")


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


#: Points of recent ``CastInfo``s: a ``Point`` is immutable, and every call of a pipelining
#: caller carries the same cast, whose ``Point`` (an ``Extent`` checked and the coordinates
#: computed) was about a fifth of the actor thread's work per tiny call. Bounded: cleared when
#: it holds ``_POINTS_MAX`` casts (slices of many shapes).
_POINTS: dict[CastInfo, Point] = {}
_POINTS_MAX = 1024


def _point_of(cast: CastInfo | None) -> Point:
    if cast is None:
        return _empty_point()
    point = _POINTS.get(cast)
    if point is not None:
        return point
    try:
        point = Point(cast.rank, Extent(cast.labels, cast.sizes))
    except (ValueError, TypeError):
        return _empty_point()
    if len(_POINTS) >= _POINTS_MAX:
        _POINTS.clear()
    _POINTS[cast] = point
    return point


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed: the actor is gone
        loop.call_soon_threadsafe(callback)


def _is_default(cls: type, name: str) -> bool:
    method = getattr(cls, name, None)
    return method is None or bool(getattr(method, "_monarch_default", False))


class ActorCell(CellBase):
    """One actor instance on its own thread, run by a ``_Runner`` (see the module docstring)."""

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
        #: Items given to its mailbox so far (``status``).
        self.received = 0
        self.failure: FailureEvent | None = None
        self.actor: Any = None
        self.cls: type | None = None
        #: Whether the class is async (``check_actor_class``): which ``_Runner`` runs it.
        self.is_async = False
        self.endpoints: dict[str, EndpointProperty[Any, Any]] = {}
        #: The endpoints declared ``instrument=False`` (no receive span: ``run_endpoint``'s one
        #: set test, where a lookup of the property and its flag were).
        self._untraced: frozenset[str] = frozenset()
        self.instance: Instance | None = None
        self._pending_failure: tuple[FailureEvent, BaseException | None, Envelope | None] | None
        self._pending_failure = None
        #: The call being handled (a fence answers it; an async owner's failure cancels it).
        self._inflight: Envelope | None = None
        #: Who spawned it (readable chain), for lifecycle records.
        self._creator_chain = ""
        self._thread = threading.Thread(
            target=self._main, name=f"monarch-actor:{path}[{self.rank}]", daemon=True
        )

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, init: _InitItem) -> None:
        self.mailbox.put(init, force=True)
        self._thread.start()

    def enqueue(self, item: _Item, force: bool = False) -> bool:
        self.received += 1  # ``monarch top``'s message rate (racy increments may miss one)
        return self.mailbox.put(item, force=force)

    def status(self) -> ActorStatus:
        """What ``monarch top`` shows of this actor (``_runtime.telemetry.report``)."""
        cls = self.cls
        return ActorStatus(
            name=self.display,
            actor_id=f"{self.path}@{self.runtime.pid_raw.hex()}",
            cls=f"{cls.__module__}.{cls.__qualname__}" if cls is not None else "",
            rank=self.rank,
            state=STATE_NAMES[self.state],
            mailbox=len(self.mailbox),
            received=self.received,
        )

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

    def lifecycle(self, event: str, reason: str = "", failure: FailureEvent | None = None) -> None:
        """Record lifecycle ``event`` of this actor (``_runtime.telemetry.records``)."""
        _telemetry.record_lifecycle(
            event,
            "actor",
            self.display,
            self.runtime.label,
            actor_id=str(self.actor_id),
            mesh_name=self.path,
            rank=self.rank,
            owner=self._creator_chain,
            reason=reason,
            failure=failure,
        )

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
                _SyncRunner(self).die()  # the actor was never made: its failure is reported
                return
            runner = _AsyncRunner(self) if self.is_async else _SyncRunner(self)
            runner.run(spec, init)
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
        self._untraced = frozenset(n for n, p in self.endpoints.items() if not p._instrument)
        module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__  # main_module
        class_name = f"{module}.{cls.__qualname__}"
        creator_chain = spec.creator.chain if spec.creator is not None else "<root>"
        self.display = f"{creator_chain}.<{class_name} {spec.name}{self.spawn_point}>"
        self._creator_chain = creator_chain
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
        self.lifecycle("actor_spawned")
        return spec

    def _own_context(self) -> contextvars.Token[Context | None]:
        """Enter the actor's own context (outside any message): its constructor and hooks may
        call ``context()`` and message other actors; ``_reset_context`` the token after."""
        assert self.instance is not None
        return _set_context(Context(self.instance, self.spawn_point))

    def _user_hook(self, name: str) -> Callable[..., Any] | None:
        """The actor's own ``name`` (``__supervise__``, ``__cleanup__``), or None where it has
        none or its class keeps the default."""
        if self.actor is None or self.cls is None or _is_default(self.cls, name):
            return None
        hook: Callable[..., Any] = getattr(self.actor, name)
        return hook

    def _construct(self, spec: SpawnSpec, init: _InitItem) -> bool:
        token = self._own_context()
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
        self.lifecycle("actor_running")
        return True

    def _reply_init(self, env: Envelope) -> None:
        if env.reply_port is not None:
            self._post_reply(env, _NONE_PAYLOAD)

    def _gave_up(self) -> bool:
        """True once a stop fenced this actor (set by the runtime loop thread at any time)."""
        return self.fenced

    def _take(self, item: _Item) -> _StopItem | None:
        """What both runners handle alike: a stop (returned: the actor stops once this item is
        handled), a bounce, and a failure (recorded: the actor fails once it is handled)."""
        if isinstance(item, _StopItem):
            return item
        if isinstance(item, _BounceItem):
            self._bounce(item.bounce)
        elif isinstance(item, _FailItem):
            self._record_failure(item.event, item.exc, item.env)
        return None

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
        self, item: _CallItem, explicit: bool, wrap: bool = True
    ) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
        # ``wrap``: while telemetry is on, the endpoint comes wrapped (``wrap_endpoint``); a
        # sync actor's call passes False and runs it through ``run_endpoint`` instead
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
            if env.reply_port is None:
                raise RuntimeError(f"{env.endpoint}() needs a reply port but none was sent")
            args = (Port._bound(env.reply_port, env.cast), *args)
        if wrap and _telemetry.ACTIVE:
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
        self.lifecycle("actor_failed", failure=self.failure)
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
            self.lifecycle("actor_stopped", item.reason)
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
        token = self._own_context()
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
                # More small calls queued behind this one (a pipelining caller): the replies
                # of the batch leave together, in one write, instead of one ``sendmsg`` each.
                more=self.mailbox.batching(),
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


class _Runner:
    """How an actor's thread runs it, chosen at spawn by the actor class (``check_actor_class``):
    ``_SyncRunner`` calls its endpoints directly, ``_AsyncRunner`` awaits them on a private
    asyncio loop. The cell keeps what both share (state, failures, replies, stops)."""

    __slots__ = ("cell",)

    def __init__(self, cell: ActorCell) -> None:
        self.cell = cell

    def run(self, spec: SpawnSpec, init: _InitItem) -> None:
        """Construct the actor, then handle its mailbox in order until it stops, fails or is
        fenced (on the actor's thread; returns when the actor is done)."""
        raise NotImplementedError


class _SyncRunner(_Runner):
    """A sync actor: no asyncio loop is visible to its endpoints (they may block on
    ``Future.get()``), and ``__supervise__`` runs between messages, in mailbox order."""

    __slots__ = ()

    def run(self, spec: SpawnSpec, init: _InitItem) -> None:
        cell = self.cell
        if not cell._construct(spec, init):
            self.die()
            return
        while not cell.fenced:  # fenced: a stop gave up on it; its thread just ends
            stop = self._handle(cell.mailbox.get())
            if cell._gave_up():
                return  # a stop gave up on it while it ran: it is retired already
            if cell._pending_failure is not None:
                self.die()
                return
            if stop is not None:
                self._stop(stop)
                return

    def _handle(self, item: _Item) -> _StopItem | None:
        if isinstance(item, _CallItem):
            self._call(item)
        elif isinstance(item, _SuperviseItem):
            self._supervise(item.event)
        elif isinstance(item, _FlushItem):
            item.done()
        else:
            return self.cell._take(item)
        return None

    def _call(self, item: _CallItem) -> None:
        cell = self.cell
        env = item.env
        explicit = cell._explicit(env)
        token = _CURRENT.set(cell._message_context(env))  # (``_set_context``: one call less)
        cell._inflight = env
        try:
            fn, args, kwargs = cell._begin(item, explicit, False)
            if _telemetry.ACTIVE:
                if _TIMED_HERE:  # metrics only: ``run_endpoint``'s timed case inlined (no frame)
                    started = _perf_counter()
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as exc:
                        _metrics.record_endpoint(env.endpoint, started, exc)
                        raise
                    if type(result) in PLAIN_RESULTS:  # (no coroutine: one type test, not two)
                        elapsed = _perf_counter() - started
                        try:
                            log = _latency_logs[env.endpoint]
                        except KeyError:
                            log = _metrics.latency_log(env.endpoint)
                        log.append(elapsed)
                        if len(log) >= _FOLD_AT:  # (the mirror sets ``HOOKS``: not this branch)
                            _metrics.note_latency(env.endpoint, log, elapsed)
                    else:
                        result = _timed_result(result, env.endpoint, started)
                else:  # timed and in a receive span
                    result = _telemetry.run_endpoint(cell, env, fn, args, kwargs)
                    if type(result) not in PLAIN_RESULTS and inspect.iscoroutine(result):
                        result = asyncio.run(result)
            else:  # telemetry off: the branch last, so no jump after it (as before)
                result = fn(*args, **kwargs)
                if type(result) not in PLAIN_RESULTS and inspect.iscoroutine(result):
                    result = asyncio.run(result)  # an async method exposed with as_endpoint
        except Exception as exc:
            cell._raised(env, exc, explicit)
            return
        except BaseException as exc:
            cell._raised_base(env, exc)
            return
        finally:
            cell._inflight = None
            _CURRENT.reset(token)
        if not explicit:
            cell._reply_value(env, result)

    def _supervise(self, event: FailureEvent) -> None:
        cell = self.cell
        hook = cell._user_hook("__supervise__")
        if hook is None:
            cell._record_failure(cell._unhandled(event), None)
            return
        token = cell._own_context()
        try:
            handled = hook(MeshFailure(event))
            if inspect.iscoroutine(handled):
                handled = asyncio.run(handled)
        except BaseException as exc:
            cell._record_failure(cell._supervise_raised(event, exc), exc)
            return
        finally:
            _reset_context(token)
        if not handled:
            cell._record_failure(cell._unhandled(event), None)

    def die(self) -> None:
        cell = self.cell
        exc = cell._begin_failure()
        cell._stop_owned()
        self._cleanup(exc)
        cell._announce_failure()

    def _stop(self, item: _StopItem) -> None:
        cell = self.cell
        cell.state = _STOPPING
        cell.lifecycle("actor_stopping", item.reason)
        cell._stop_owned()
        self._cleanup(None)
        cell._finish_stop(item)

    def _cleanup(self, exc: BaseException | None) -> None:
        cell = self.cell
        hook = cell._user_hook("__cleanup__")
        if hook is None:
            return
        token = cell._own_context()
        try:
            result = hook(exc)
            if inspect.iscoroutine(result):
                timeout = float(_config.get("cleanup_timeout"))
                asyncio.run(asyncio.wait_for(result, timeout))
        except BaseException as error:
            cell._cleanup_failed(error)
        finally:
            _reset_context(token)


class _AsyncRunner(_Runner):
    """An async actor: its thread runs a private asyncio loop on which its endpoints are
    awaited one after the other; ``concurrent_endpoint`` bodies run as tasks, and so does
    ``__supervise__``, as soon as the event arrives (even while an endpoint awaits)."""

    __slots__ = ("main_task", "stopping_tasks", "supervising", "tasks")

    def __init__(self, cell: ActorCell) -> None:
        super().__init__(cell)
        #: Concurrent bodies and ``__supervise__`` calls in flight (cancelled at the end).
        self.tasks: set[asyncio.Task[Any]] = set()
        #: The ``__supervise__`` tasks (a flush marker waits for them).
        self.supervising: set[asyncio.Task[Any]] = set()
        self.stopping_tasks = False
        #: The task of the main loop (an unhandled supervision event cancels the call it awaits).
        self.main_task: asyncio.Task[Any] | None = None

    def run(self, spec: SpawnSpec, init: _InitItem) -> None:
        mailbox = self.cell.mailbox
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        mailbox.use_loop(loop)
        mailbox.on_supervision = functools.partial(_call_soon, loop, self._dispatch_supervision)
        try:
            loop.run_until_complete(self._run(spec, init))
        finally:
            with contextlib.suppress(Exception):
                leftover = asyncio.all_tasks(loop)
                for task in leftover:
                    task.cancel()
                if leftover:
                    loop.run_until_complete(asyncio.wait(leftover, timeout=1.0))
            asyncio.set_event_loop(None)
            loop.close()

    async def _run(self, spec: SpawnSpec, init: _InitItem) -> None:
        cell = self.cell
        self.main_task = asyncio.current_task()
        if not cell._construct(spec, init):
            await self._die()
            return
        while not cell.fenced:
            stop = await self._handle(await cell.mailbox.aget())
            if cell._gave_up():
                return
            if cell._pending_failure is not None:
                await self._die()
                return
            if stop is not None:
                await self._stop(stop)
                return

    async def _handle(self, item: _Item) -> _StopItem | None:
        if isinstance(item, _CallItem):
            prop = self.cell.endpoints.get(item.env.endpoint)
            if prop is not None and prop._concurrent:
                self._start_concurrent(item, prop)
            else:
                await self._call(item)
        elif isinstance(item, _SuperviseItem):
            self._supervise_soon(item.event)
        elif isinstance(item, _FlushItem):
            self._flush(item)
        else:
            return self.cell._take(item)
        return None

    def _supervise_soon(self, event: FailureEvent) -> None:
        task = self._track(self._supervise(event))
        self.supervising.add(task)
        task.add_done_callback(self.supervising.discard)

    def _dispatch_supervision(self) -> None:
        """Supervision events queued while this async actor is busy (its loop): their
        ``__supervise__`` starts now, interleaving with an endpoint that awaits (Monarch: a
        safe point is also "while the owner awaits"), instead of after it."""
        cell = self.cell
        if cell.state != _RUNNING or cell.fenced or cell._pending_failure is not None:
            return  # the main loop takes them in order, or they die with the actor
        for item in cell.mailbox.take_supervision():
            self._supervise_soon(item.event)

    def _track(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _flush(self, item: _FlushItem) -> None:
        """A flush marker on an async actor: ``__supervise__`` runs as a task and an unhandled
        event comes back as a ``_FailItem``, so the marker is queued again behind whatever the
        supervise tasks running now put in the mailbox, once they are all done."""
        pending = set(self.supervising)
        if not pending:
            item.done()
            return
        mailbox = self.cell.mailbox

        def one_done(task: asyncio.Task[Any]) -> None:
            pending.discard(task)
            if not pending and not mailbox.put(item, force=True):
                item.done()  # the mailbox closed: the actor retired

        for task in list(pending):
            task.add_done_callback(one_done)

    async def _call(self, item: _CallItem) -> None:
        cell = self.cell
        env = item.env
        explicit = cell._explicit(env)
        token = _set_context(cell._message_context(env))
        cell._inflight = env
        try:
            fn, args, kwargs = cell._begin(item, explicit)
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            if not self._failed_during(env):
                cell._raised(env, exc, explicit)
            return
        except BaseException as exc:
            if not self._failed_during(env):
                cell._raised_base(env, exc)
            elif isinstance(exc, asyncio.CancelledError) and self.main_task is not None:
                self.main_task.uncancel()  # our own cancel (``_fail_now``), consumed here
            return
        finally:
            cell._inflight = None
            _reset_context(token)
        if not explicit and not self._failed_during(env):
            cell._reply_value(env, result)

    def _failed_during(self, env: Envelope) -> bool:
        """True if this actor failed while handling ``env`` (its caller gets the failure)."""
        pending = self.cell._pending_failure
        return pending is not None and pending[2] is env

    def _fail_now(self, event: FailureEvent, exc: BaseException | None) -> None:
        """An async actor's supervision event was not handled (on its loop): the actor fails at
        once. A call in flight is cancelled and fails with the ``SupervisionError`` (Monarch:
        the owner fails, and so does the call it is handling); otherwise the failure queues."""
        cell = self.cell
        env = cell._inflight
        if env is not None and self.main_task is not None and cell._pending_failure is None:
            cell._record_failure(event, exc, env)
            self.main_task.cancel()
            return
        cell.mailbox.put(_FailItem(event, exc), force=True)

    def _start_concurrent(self, item: _CallItem, prop: EndpointProperty[Any, Any]) -> None:
        token = _set_context(self.cell._message_context(item.env))
        try:  # the task copies the context, so the body sees its own message rank
            self._track(self._run_concurrent(item, prop))
        finally:
            _reset_context(token)

    async def _run_concurrent(self, item: _CallItem, prop: EndpointProperty[Any, Any]) -> None:
        cell = self.cell
        env = item.env
        forwards = not prop._user_port and env.reply_port is not None
        try:
            fn, args, kwargs = cell._begin(item, prop._user_port)
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError:
            if forwards and self.stopping_tasks:
                cell._reply_error(
                    env,
                    SupervisionError(
                        event=cell._event(
                            ErrorCategory.SYSTEM,
                            "the actor stopped while the concurrent endpoint was running",
                            kind="stopped",
                        ),
                        endpoint=f"{cell.user_name}.{env.endpoint}",
                    ),
                )
            elif forwards:
                cell._reply_error(env, cell._actor_error(env, asyncio.CancelledError(), True))
            raise
        except Exception as exc:
            if forwards:
                cell._reply_error(env, cell._actor_error(env, exc, False))
            elif not self.stopping_tasks:
                self._fail_later(env, exc)
            return
        except BaseException as exc:
            if forwards:
                cell._reply_error(env, cell._actor_error(env, exc, True))
            elif not self.stopping_tasks:
                self._fail_later(env, exc)
            return
        if forwards:
            cell._reply_value(env, result)

    def _fail_later(self, env: Envelope, exc: BaseException) -> None:
        cell = self.cell
        event = cell._event(
            ErrorCategory.USER,
            f"endpoint {env.endpoint}() raised {type(exc).__name__}: {exc}",
            exc,
        )
        cell.mailbox.put(_FailItem(event, exc, env), force=True)

    async def _supervise(self, event: FailureEvent) -> None:
        cell = self.cell
        hook = cell._user_hook("__supervise__")
        if hook is None:
            self._fail_now(cell._unhandled(event), None)
            return
        token = cell._own_context()
        try:
            handled = hook(MeshFailure(event))
            if inspect.isawaitable(handled):
                handled = await handled
        except asyncio.CancelledError:
            if self.stopping_tasks:
                return  # a pending __supervise__ cancelled by stop does not propagate
            raise
        except BaseException as exc:
            self._fail_now(cell._supervise_raised(event, exc), exc)
            return
        finally:
            _reset_context(token)
        if not handled:
            self._fail_now(cell._unhandled(event), None)

    async def _cancel_tasks(self) -> None:
        self.stopping_tasks = True
        while self.tasks:
            pending = list(self.tasks)
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=float(_config.get("cleanup_timeout")))
            self.tasks.difference_update(pending)

    async def _die(self) -> None:
        cell = self.cell
        exc = cell._begin_failure()
        cell._stop_owned()
        await self._cancel_tasks()
        await self._cleanup(exc)
        cell._announce_failure()

    async def _stop(self, item: _StopItem) -> None:
        cell = self.cell
        cell.state = _STOPPING
        cell.lifecycle("actor_stopping", item.reason)
        cell._stop_owned()
        await self._cancel_tasks()
        await self._cleanup(None)
        cell._finish_stop(item)

    async def _cleanup(self, exc: BaseException | None) -> None:
        cell = self.cell
        hook = cell._user_hook("__cleanup__")
        if hook is None:
            return
        token = cell._own_context()
        try:
            result = hook(exc)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, float(_config.get("cleanup_timeout")))
        except BaseException as error:
            cell._cleanup_failed(error)
        finally:
            _reset_context(token)


def _stop_meshes(
    meshes: Sequence[Owned], timeout: float | None = None, *, at_exit: bool = False
) -> None:
    """Stop owned meshes (by ``stop_order``: actor meshes before proc meshes; newest first
    within one order), all at once, then wait for them within one overall ``timeout``.
    ``at_exit``: the interpreter is ending and stragglers are killed next, so a slow stop is
    only worth a debug line."""
    if timeout is None:
        timeout = float(_config.get("stop_actor_timeout"))
    ordered = list(meshes)[::-1]  # newest first; the sort is stable
    ordered.sort(key=lambda mesh: mesh.stop_order)
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
            resolve_proc_mesh=True,  # this process, as a mesh, on first use
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
