"""Proc meshes and actor meshes: shapes over process and actor addresses.

Why they are plain data: an actor is addressed by (PID, actor path), so a mesh is a ``Shape``
over a tuple of ``ProcId`` plus (for actor meshes) the actor path and class. Slicing builds a new
handle over a subset of the same processes; pickling sends the same data, and the receiving side
gets a *reference* (it can message the mesh, not stop it). Only the handle returned by ``spawn`` /
``_local_proc_mesh`` is *owned*; owners are recorded with the spawning actor (or the root
client), which stops them when it stops or fails.

Spawning is non-blocking and order-preserving: ``spawn`` sends one SPAWN envelope per rank and
returns at once; messages sent afterwards queue behind construction; ``initialized`` resolves
when every rank has run ``__init__`` (successfully or not: a failing ``__init__`` becomes a
supervision event for the owner, not an exception here).

Process layer: ``_local_proc_mesh(per_host=...)`` creates simulated processes in this Python
process (``InProcessFabric``), and ``this_proc()`` is the caller's own process. Real worker
processes (``this_host().spawn_procs``) come from the ``_hosts`` layer; their proc meshes carry
the ``WorkerGroup`` in their state, which ``stop`` uses to end the processes, and are returned
before the processes are up (the state's ``ready``; an actor mesh spawned meanwhile sends its
SPAWN envelopes once they are, see ``_PendingSpawn``); in a worker, a proc
mesh an actor spawned carries a ``NestedDelegate`` instead: the client's host agent
(``_hosts.agent``) started those processes and stops them.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, NoReturn, TypeVar, cast

from monarch.actor._base import codec as _codec
from monarch.actor._base.actor import check_actor_class
from monarch.actor._base.endpoint import EndpointProperty, endpoints_of
from monarch.actor._base.envelope import ActorAddr, CastInfo, MessageKind
from monarch.actor._base.future import Future, _Cell
from monarch.actor._base.ids import ProcId
from monarch.actor._base.shape import Extent, Shape, ShapedMesh
from monarch.actor._mesh import logging_option as _logging_option
from monarch.actor._mesh.adverbs import (
    TENSOR_ENGINE_MODULE,
    Endpoint,
    NotAnEndpoint,
    load_tensor_engine,
)
from monarch.actor._runtime import telemetry as _telemetry
from monarch.actor._runtime.cell import CellBase, RootCell, SpawnSpec
from monarch.actor._runtime.client import client, new_local_runtime
from monarch.actor._runtime.context import CreatorInfo, _current, current_sender, set_proc_resolver
from monarch.actor._runtime.sinks import GatherSink, Reply, decode_reply
from monarch.actor._runtime.telemetry import tracing as _tracing

if TYPE_CHECKING:
    from monarch.actor._hosts.agent import NestedDelegate
    from monarch.actor._hosts.groups import WorkerGroup
    from monarch.actor._hosts.host_mesh import HostMesh

__all__ = [
    "ActorMesh",
    "ProcMesh",
    "local_proc_mesh",
    "this_proc",
]

#: Hook H4: the host mesh (extent ``{}``, a reference) of a target such as ``proc:<pid hex>``;
#: set by ``_hosts.host_mesh`` at import (``ProcMesh.host_mesh``).
_host_resolver: Callable[[str], HostMesh] | None = None


def set_host_resolver(fn: Callable[[str], HostMesh]) -> None:
    """Register how ``ProcMesh.host_mesh`` builds a host mesh reference (``_hosts.host_mesh``, at
    import)."""
    global _host_resolver
    _host_resolver = fn


#: The tensor engine's ``ProcMesh.activate`` (``proc_mesh -> context manager``); registered by
#: ``monarch.tensor`` at import (a higher package: monarch-actor never imports it statically).
_activate_hook: Callable[[ProcMesh], Any] | None = None


def set_activate_hook(fn: Callable[[ProcMesh], Any]) -> None:
    """Register what ``ProcMesh.activate()`` returns (``monarch.tensor``, at import)."""
    global _activate_hook
    _activate_hook = fn


T = TypeVar("T")
_log = logging.getLogger("monarch.actor.mesh")


def _all_ok(replies: list[Reply]) -> None:
    for reply in sorted(replies, key=lambda r: r.rank):
        decode_reply(reply)


def _forget(mesh: Any) -> None:
    """Drop a mesh stopped by its user from its owner's list (its owner need not stop it)."""
    owner = getattr(mesh, "_owner", None)
    if owner is not None:
        with contextlib.suppress(ValueError):
            owner.owned.remove(mesh)
        mesh._owner = None


def _is_finished(mesh: Any) -> bool:
    state = getattr(mesh, "_state", None) or getattr(mesh, "_proc_state", None)
    return bool(getattr(mesh, "_stopped", False) or (state is not None and state.stopped))


def _adopt(owner: CellBase, mesh: Any) -> None:
    """Record ``owner`` as the owner of ``mesh``, dropping meshes that already stopped (so the
    list stays as long as the number of live meshes)."""
    owner.owned[:] = [m for m in owner.owned if not _is_finished(m)]
    owner.owned.append(mesh)
    mesh._owner = owner
    if isinstance(mesh, ProcMesh):  # an actor mesh's is recorded before its SPAWN leaves
        _spawned(owner, mesh)


def _spawned(owner: CellBase, mesh: ProcMesh | ActorMesh[Any]) -> None:
    mesh._owned_by = (owner.runtime.label, owner.display)
    _mesh_lifecycle("mesh_spawned", mesh)


def _mesh_lifecycle(event: str, mesh: ProcMesh | ActorMesh[Any], reason: str = "") -> None:
    """Record lifecycle ``event`` of an owned ``mesh`` (``_runtime.telemetry.records``), in
    its owner's process."""
    proc, owner = mesh._owned_by
    if isinstance(mesh, ActorMesh):
        subject, name, path = "actor_mesh", mesh._user_name, mesh._path
    else:
        subject, name, path = "proc_mesh", mesh._name, ""
    _telemetry.record_lifecycle(
        event,
        subject,
        name,
        proc,
        actor_id=path,
        mesh_name=path,
        size=len(mesh._shape.ndslice),
        owner=owner,
        reason=reason,
    )


def _recorded_stop(
    mesh: ProcMesh | ActorMesh[Any], reason: str, stop: Callable[[], Future[None] | None]
) -> Future[None] | None:
    """Run ``stop`` (sends the stop of an owned mesh) between ``mesh_stopping`` and, once its
    future resolved, ``mesh_stopped`` (with the error, if the stop failed)."""
    _mesh_lifecycle("mesh_stopping", mesh, reason)
    future = stop()
    if future is None:
        _mesh_lifecycle("mesh_stopped", mesh, reason)
        return None

    def stopped() -> None:
        ok, value = future._cell.outcome()
        _mesh_lifecycle("mesh_stopped", mesh, reason if ok else f"{reason}; stop failed: {value}")

    future._cell.add_done_callback(stopped)
    return future


def _ignore(_: object) -> None:
    return None


def _creator_of(cell: CellBase) -> CreatorInfo:
    if isinstance(cell, RootCell):
        return cell.creator_info()
    return CreatorInfo(cell.user_name, str(cell.actor_id), cell.display)


def _targets_of(
    procs: Sequence[ProcId], shape: Shape, path: str
) -> list[tuple[ActorAddr, CastInfo]]:
    labels = tuple(shape.labels)
    sizes = tuple(shape.ndslice.sizes)
    return [
        (ActorAddr(procs[g].pid.raw, path), CastInfo(labels, sizes, i))
        for i, g in enumerate(shape.ndslice)
    ]


def _fan_out(kind: MessageKind, targets: list[tuple[ActorAddr, CastInfo]]) -> Future[None]:
    """Send ``kind`` to every target with one gathering reply port; resolve when all ack."""
    runtime, sender = current_sender()
    cell: _Cell[list[Reply]] = _Cell()
    if not targets:
        cell.set_result([])
        return Future._create(cell, _all_ok)
    port = runtime.open_port(sender, GatherSink(len(targets), cell))
    try:
        for addr, cast_info in targets:
            runtime.post(sender, kind, addr, reply_port=port, cast=cast_info)
    except BaseException:
        runtime.close_port(port.index)
        raise
    return Future._create(cell, _all_ok)


#: Seconds anything that needs the processes of a ``spawn_procs`` waits for them: the start
#: (``_hosts.commands.SPAWN_TIMEOUT``, or the host agent's ``REQUEST_TIMEOUT`` in a worker)
#: plus the owner's setup (``_hosts.commands.SETUP_TIMEOUT``), with slack. The spawning thread
#: resolves or fails the processes within those bounds itself; this only guards against a lost
#: thread.
READY_TIMEOUT: Final = 200.0


def _true(_: object) -> bool:
    return True


def wait_ready(ready: _Cell[tuple[ProcId, ...]]) -> tuple[ProcId, ...]:
    """The processes once ``ready`` resolved (bounded); its error if the spawn failed."""
    if not ready.wait(READY_TIMEOUT):
        raise RuntimeError(f"the processes of this ProcMesh are not up after {READY_TIMEOUT} s")
    ok, value = ready.outcome()
    if not ok:
        raise value
    return cast(tuple[ProcId, ...], value)


class _ProcMeshState:
    """Shared by an owned proc mesh and the slices made from it in this process; ``group``
    is the worker processes behind it (``None`` for simulated processes).

    ``ready`` (``None``: the processes were known when the mesh was made) is how
    ``spawn_procs`` returns at once: the processes start on a thread of their own, which
    resolves ``ready`` with their ids once they joined and the owner's setup (``bootstrap=``,
    ``proc_bind``) ran on them, or fails it with the reason. Whatever needs the processes
    (actor spawns, calls, stop, pickling) waits for it or chains on it."""

    __slots__ = ("delegate", "group", "kill_requested", "lock", "ready", "stopped")

    def __init__(
        self, group: WorkerGroup | None = None, ready: _Cell[tuple[ProcId, ...]] | None = None
    ) -> None:
        self.stopped = False
        self.group = group
        self.ready = ready
        self.kill_requested = False
        self.lock = threading.Lock()
        #: In a worker: the processes were spawned for it by the client's host agent, which
        #: stops them (``_hosts.agent``); ``group`` is then ``None``.
        self.delegate: NestedDelegate | None = None

    def pending(self) -> bool:
        """True while the processes are still starting."""
        return self.ready is not None and not self.ready.done()

    def failed(self) -> BaseException | None:
        """The reason the processes could not be brought up (``None`` otherwise)."""
        if self.ready is None or not self.ready.done():
            return None
        ok, value = self.ready.outcome()
        return None if ok else cast(BaseException, value)

    def request_kill(self) -> WorkerGroup | None:
        """``HostMesh.kill``: the group to kill now, or ``None`` if it is still starting (the
        starting thread kills it as soon as it exists, see ``adopt_group``)."""
        with self.lock:
            self.stopped = True
            self.kill_requested = True
            group = self.group
        if group is not None:
            group.killed = True
        return group

    def adopt_group(self, group: WorkerGroup) -> bool:
        """The starting thread's group exists; True if it must be killed at once."""
        with self.lock:
            self.group = group
            group.state = self
            return self.kill_requested


def _after_ready(
    ready: _Cell[tuple[ProcId, ...]], then: Callable[[tuple[ProcId, ...]], Future[None] | None]
) -> Future[None]:
    """Run ``then(procs)`` once ``ready`` resolved, on a thread of its own in the caller's
    context (it sends as the caller); resolve when its future does. A failed spawn has
    nothing to stop: the result is ``None`` then too."""
    cell: _Cell[None] = _Cell()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            procs = wait_ready(ready)
        except Exception:
            cell.set_result(None)
            return
        try:
            future = context.run(then, procs)
            if future is not None:
                future._cell.wait(READY_TIMEOUT)
        except Exception:
            _log.exception("stopping a proc mesh after its processes started failed")
        cell.set_result(None)

    threading.Thread(target=run, name="monarch-stop-pending", daemon=True).start()
    return Future._create(cell)


class _PendingSpawn:
    """An actor mesh spawned on processes that are still starting: its SPAWN envelopes go out
    exactly once, as soon as the processes are up (from the starting thread) or when a
    message needs the targets first (from the caller's thread), whichever comes first. Either
    way they are sent before any message that needed the targets, so construction still
    precedes every call from the spawner."""

    __slots__ = ("_error", "_fail", "_lock", "_post", "ready")

    def __init__(
        self,
        ready: _Cell[tuple[ProcId, ...]],
        post: Callable[[tuple[ProcId, ...]], None],
        fail: Callable[[BaseException], object],
    ) -> None:
        self.ready = ready
        self._post: Callable[[tuple[ProcId, ...]], None] | None = post
        self._fail = fail
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def ensure(self) -> tuple[ProcId, ...]:
        """The processes, with the SPAWN sent; raises why the actors cannot exist."""
        try:
            procs = wait_ready(self.ready)
        except BaseException as exc:
            self._fail(exc)
            raise
        with self._lock:
            if self._error is not None:
                raise self._error
            post, self._post = self._post, None
            if post is not None:
                try:
                    post(procs)
                except BaseException as exc:
                    self._error = exc
                    self._fail(exc)
                    raise
        return procs


class ProcMesh(ShapedMesh):
    """A mesh of processes. ``spawn`` creates one actor per process.

    The process ids are known at construction, or (a mesh ``spawn_procs`` just returned)
    later, when the state's ``ready`` resolves: ``procs`` is then ``None``."""

    __slots__ = ("_known", "_name", "_owned", "_owned_by", "_owner", "_shape", "_state")

    #: An owner stops its proc meshes after its actor meshes (``_runtime.cell._stop_meshes``).
    stop_order = 1

    def __init__(
        self,
        procs: Sequence[ProcId] | None,
        shape: Shape,
        *,
        owned: bool = False,
        state: _ProcMeshState | None = None,
        name: str = "procs",
    ) -> None:
        self._known = tuple(procs) if procs is not None else None
        self._shape = shape
        self._owned = owned
        self._owner: CellBase | None = None
        #: The owner's process label and readable chain (lifecycle records; kept past stop).
        self._owned_by = (_tracing.process_label(), "")
        self._state = state
        self._name = name
        if self._known is None:
            if state is None or state.ready is None:
                raise ValueError("a ProcMesh without process ids needs a pending state")
            return
        for rank in shape.ndslice:
            if not 0 <= rank < len(self._known):
                raise ValueError(f"shape selects rank {rank} of {len(self._known)} procs")

    def _proc_ids(self) -> tuple[ProcId, ...]:
        """The process ids, waiting (bounded) for processes that are still starting; the
        spawn's error if they could not be brought up."""
        known = self._known
        if known is None:
            assert self._state is not None
            assert self._state.ready is not None
            known = self._known = wait_ready(self._state.ready)
        return known

    # -- MeshTrait ---------------------------------------------------------------------------
    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._known, shape, owned=False, state=self._state, name=self._name)

    # -- API -----------------------------------------------------------------------------------
    @property
    def initialized(self) -> Future[bool]:
        """Resolves to ``True`` once the processes joined and the owner's ``bootstrap`` ran
        on each (at once for processes known at construction); raises why they could not be
        brought up (``ActorError`` from a failing ``bootstrap``)."""
        state = self._state
        if state is None or state.ready is None:
            return Future._completed(True)
        return Future._create(state.ready, _true)

    @property
    def host_mesh(self) -> HostMesh:
        """The host of a one-process mesh, as a host mesh with extent ``{}`` (a reference:
        ``spawn_procs`` on it starts processes on that host, owned by the caller).
        ``NotImplementedError`` for a mesh of several processes, as in the reference."""
        if _host_resolver is None:
            raise RuntimeError("monarch.actor is not fully imported (no host resolver registered)")
        if len(self._shape.ndslice) != 1:
            raise NotImplementedError(
                "`ProcMesh.host_mesh` is not yet supported for non-singleton proc meshes."
            )
        pid = self._proc_ids()[next(iter(self._shape.ndslice))].pid
        return _host_resolver(f"proc:{pid.hex()}")

    async def logging_option(
        self,
        stream_to_client: bool = False,
        aggregate_window_sec: int | None = None,
        level: int = logging.INFO,
    ) -> None:
        """Set the logging level of every process of this mesh (``level``, 0..255); the module
        ``_mesh.logging_option`` says what ``stream_to_client`` and ``aggregate_window_sec``
        mean here. ``ValueError`` for a bad level or a window without streaming."""
        await _logging_option.logging_option(self, stream_to_client, aggregate_window_sec, level)

    def spawn(self, name: str, actor_class: type[T], *args: Any, **kwargs: Any) -> T:
        """Spawn ``actor_class(*args, **kwargs)`` on every process; returns the actor mesh.

        Non-blocking, also while the processes are still starting (the actors are created
        once they are up, before any message to them). ``ValueError`` for classes that are
        not ``Actor`` subclasses, mix sync and async endpoints, or use reserved endpoint names.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"actor mesh name must be a non-empty str, got {name!r}")
        check_actor_class(actor_class)
        return self._spawn(name, f"{name}-{uuid.uuid4().hex[:12]}", actor_class, args, kwargs)

    def _spawn(
        self, name: str, path: str, actor_class: type[T], args: Any, kwargs: dict[str, Any]
    ) -> T:
        runtime, sender = current_sender()
        cell: _Cell[list[Reply]] = _Cell()
        state = self._state
        mesh: ActorMesh[T] = ActorMesh(
            actor_class,
            name,
            path,
            self._known,
            self._shape,
            owned=True,
            initialized=Future._create(cell, _all_ok),
        )
        creator = _creator_of(sender)
        shape = self._shape
        _spawned(sender, mesh)

        def post(procs: tuple[ProcId, ...]) -> None:
            if state is not None and state.stopped:
                raise RuntimeError("`ProcMesh` has already been stopped")
            proc_mesh = self if self._known is not None else self._with_procs(procs)
            payload = _codec.encode(SpawnSpec(name, actor_class, args, kwargs, proc_mesh, creator))
            targets = _targets_of(procs, shape, path)
            port = runtime.open_port(sender, GatherSink(len(targets), cell))
            try:
                for addr, cast_info in targets:
                    runtime.post(
                        sender,
                        MessageKind.SPAWN,
                        addr,
                        reply_port=port,
                        cast=cast_info,
                        payload=payload,
                    )
            except BaseException:
                runtime.close_port(port.index)
                raise

        if state is not None and state.stopped:
            cell.set_exception(RuntimeError("`ProcMesh` has already been stopped"))
            if self._known is None:  # calls fail with that error too
                assert state.ready is not None
                mesh._pending = _PendingSpawn(state.ready, post, cell.set_exception)
            return cast(T, mesh)
        if self._known is not None:
            post(self._known)
        else:
            assert state is not None
            assert state.ready is not None
            mesh._pending = _PendingSpawn(state.ready, post, cell.set_exception)
            state.ready.add_done_callback(mesh._on_ready)
        mesh._proc_state = state
        _adopt(sender, mesh)
        return cast(T, mesh)

    def _with_procs(self, procs: tuple[ProcId, ...]) -> ProcMesh:
        """This mesh with its (now known) process ids: what a spawned actor gets as its
        ``proc_mesh``."""
        self._known = procs
        return self

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor on these processes, then the processes (owner only). Processes
        that are still starting are stopped once they are up."""
        if not self._owned:
            raise ValueError("ProcMesh is not owned; must be stopped by an owner")
        _forget(self)
        return self._stop_owned() or Future._completed(None)

    def _stop_owned(self) -> Future[None] | None:
        state = self._state
        if state is None or state.stopped:
            return None
        state.stopped = True
        return _recorded_stop(self, "stopped by its owner", self._stop_sent)

    def _stop_sent(self) -> Future[None] | None:
        state = self._state
        assert state is not None
        if state.ready is not None and state.pending():
            return _after_ready(state.ready, self._stop_started)
        if state.failed() is not None:
            return None  # the starting thread killed what had started
        return self._stop_started(self._proc_ids())

    def _stop_started(self, procs: tuple[ProcId, ...]) -> Future[None] | None:
        state = self._state
        assert state is not None
        if state.delegate is not None:  # the client's host agent stops them
            return state.delegate.stop()
        group = state.group
        ranks = list(self._shape.ndslice)
        live = [g for g in ranks if group is None or group.alive(g)]
        # Cast ranks index the gathering port's slots: number the live targets densely.
        targets = [
            (ActorAddr(procs[g].pid.raw, ""), CastInfo((), (), i)) for i, g in enumerate(live)
        ]
        if group is None:
            return _fan_out(MessageKind.STOP_PROC, targets)
        # Worker processes: acknowledgements from the live ones, then every one exits.
        return group.stop(ranks, _fan_out(MessageKind.STOP_PROC, targets) if targets else None)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owned:
            await self.stop()

    def activate(self) -> Any:
        """``with proc_mesh.activate():`` makes torch operations issued by this thread run on
        every process of the mesh (the tensor engine, package ``monarch-tensor``, imported here
        on first use; ``NotImplementedError`` naming it when it is not installed)."""
        if _activate_hook is None:
            load_tensor_engine("ProcMesh.activate()")
        if _activate_hook is None:
            raise NotImplementedError(
                f"ProcMesh.activate(): {TENSOR_ENGINE_MODULE} did not register the tensor engine"
            )
        return _activate_hook(self)

    def sync_workspace(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Not implemented on ``ProcMesh`` (as in the reference)."""
        raise NotImplementedError("sync_workspace is not implemented on ProcMesh")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_proc_mesh, (self._proc_ids(), self._shape, self._name))

    def __repr__(self) -> str:
        owned = "owned" if self._owned else "ref"
        return f"<ProcMesh {self._name} {self.extent} ({owned})>"


def _spawn_system_actor(procs: ProcMesh, path: str, actor_class: type[Any]) -> None:
    """Spawn ``actor_class()`` at the fixed ``path`` (a well-known address such as the host
    agent's); it belongs to no one, so no stop reaches it before its process ends."""
    mesh: Any = procs._spawn(path, path, actor_class, (), {})
    _forget(mesh)


def _rebuild_proc_mesh(procs: tuple[ProcId, ...], shape: Shape, name: str) -> ProcMesh:
    return ProcMesh(procs, shape, owned=False, state=None, name=name)


class ActorMesh(ShapedMesh, Generic[T]):
    """One actor per process of a proc mesh; endpoints are attributes (``mesh.method.call()``)."""

    #: An owner stops its actor meshes before its proc meshes (``_runtime.cell._stop_meshes``).
    stop_order = 0

    def __init__(
        self,
        actor_class: type[T],
        name: str,
        path: str,
        procs: Sequence[ProcId] | None,
        shape: Shape,
        *,
        owned: bool = False,
        initialized: Future[None] | None = None,
        pending: _PendingSpawn | None = None,
    ) -> None:
        self._class = actor_class
        self._user_name = name
        self._path = path
        #: ``None`` while the processes are still starting (``_pending`` sends the spawn).
        self._procs = tuple(procs) if procs is not None else None
        self._pending = pending
        self._shape = shape
        #: ``len(self)``, asked by every ``call_one``, and the extent, by every ``call`` (to
        #: gather the replies): made once (the shape never changes; an ``Extent`` is immutable)
        self._size = len(shape.ndslice)
        self._extent: Extent | None = None
        self._owned = owned
        self._initialized = initialized
        self._owner: CellBase | None = None
        #: The owner's process label and readable chain (lifecycle records; kept past stop).
        self._owned_by = (_tracing.process_label(), "")
        self._proc_state: _ProcMeshState | None = None
        self._stopped = False
        self._chooser = itertools.count()
        self._targets_cache: list[tuple[ActorAddr, CastInfo]] | None = None
        self._endpoints: dict[str, EndpointProperty[Any, Any]] = endpoints_of(actor_class)

    # -- MeshTrait ---------------------------------------------------------------------------
    def _new_with_shape(self, shape: Shape) -> ActorMesh[T]:
        return ActorMesh(
            self._class, self._user_name, self._path, self._procs, shape, pending=self._pending
        )

    def _proc_ids(self) -> tuple[ProcId, ...]:
        """The process ids; for processes still starting, waits (bounded) until they are up
        and the spawn is sent, or raises why the actors cannot exist."""
        procs = self._procs
        if procs is None:
            if self._pending is None:
                raise RuntimeError("this actor mesh has no processes")
            procs = self._procs = self._pending.ensure()
        return procs

    def _targets(self) -> list[tuple[ActorAddr, CastInfo]]:
        # A mesh's processes, shape and path never change: compute the targets once (this is
        # on every call's path). Callers only read the list.
        targets = self._targets_cache
        if targets is None:
            targets = self._targets_cache = _targets_of(self._proc_ids(), self._shape, self._path)
        return targets

    def __len__(self) -> int:
        return self._size

    @property
    def extent(self) -> Extent:
        """The mesh's ``Extent``."""
        extent = self._extent
        if extent is None:
            extent = self._extent = Extent(self._shape.labels, self._shape.ndslice.sizes)
        return extent

    # -- endpoints -------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_class", "_endpoints"):
            raise AttributeError(name)
        prop = self._endpoints.get(name)
        if prop is not None:
            # kept on the mesh (an ``Endpoint`` never changes): ``mesh.method`` is then found
            # without this hook, on every call's path (``__reduce__`` leaves it out)
            endpoint: Endpoint[Any, Any] = Endpoint(self, name, prop)
            self.__dict__[name] = endpoint
            return endpoint
        if callable(getattr(self._class, name, None)) and not name.startswith("_"):
            return NotAnEndpoint(self, name)
        raise AttributeError(f"{self._class.__qualname__} has no endpoint {name!r}")

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def initialized(self) -> Future[None]:
        """Resolves once every rank ran ``__init__`` (even if it raised)."""
        if self._initialized is not None:
            return self._initialized
        # A reference: ask every rank; the answer queues behind construction (FIFO).
        cell: _Cell[list[Reply]] = _Cell()
        targets = self._targets()
        if not targets:
            cell.set_result([])
        else:
            runtime, sender = current_sender()
            port = runtime.open_port(sender, GatherSink(len(targets), cell))
            payload = _codec.encode(((), {}))
            for addr, cast_info in targets:
                runtime.post(
                    sender,
                    MessageKind.CALL,
                    addr,
                    endpoint="__monarch_ping__",
                    reply_port=port,
                    cast=cast_info,
                    payload=payload,
                )
        return Future._create(cell, _ignore)

    @property
    def _name(self) -> Future[str]:
        """The mesh's unique internal name (what ``MeshFailure.mesh_name`` reports)."""
        return Future._completed(self._path)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Gracefully stop this actor mesh (owner only); later calls fail with
        ``SupervisionError``."""
        if not self._owned:
            raise ValueError("ActorMesh is not owned; must be stopped by an owner")
        _forget(self)
        return self._stop_owned() or Future._completed(None)

    def _on_ready(self) -> None:
        """The processes of a pending spawn are up (or failed; on the starting thread): send
        the spawn now and learn the process ids (process-death supervision reads them)."""
        with contextlib.suppress(Exception):
            self._proc_ids()

    def _stop_owned(self) -> Future[None] | None:
        if self._stopped:
            return None
        self._stopped = True
        return _recorded_stop(self, "stopped by its owner", self._stop_sent)

    def _stop_sent(self) -> Future[None] | None:
        pending = self._pending
        if self._procs is None and pending is not None:
            if not pending.ready.done():  # stop once the processes are up and it exists
                return _after_ready(pending.ready, lambda _: self._stop_started())
            return self._stop_started()
        return _fan_out(MessageKind.STOP, self._targets())

    def _stop_started(self) -> Future[None] | None:
        try:
            targets = self._targets()
        except Exception:
            return None  # the actors never existed: nothing to stop
        return _fan_out(MessageKind.STOP, targets)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_actor_mesh,
            (self._class, self._user_name, self._path, self._proc_ids(), self._shape),
        )

    def __repr__(self) -> str:
        return f"<ActorMesh {self._user_name} of {self._class.__qualname__} {self.extent}>"


def _rebuild_actor_mesh(
    actor_class: type[Any], name: str, path: str, procs: tuple[ProcId, ...], shape: Shape
) -> ActorMesh[Any]:
    return ActorMesh(actor_class, name, path, procs, shape)


def this_proc() -> ProcMesh:
    """The current process as a one-process mesh (extent ``{}``): actors spawned on it run in
    this process. On the client that is the client's own process."""
    runtime, _ = current_sender()
    return ProcMesh([runtime.proc_id], Shape.unity(), owned=False, name=runtime.label)


def local_proc_mesh(per_host: dict[str, int] | None = None, *, name: str = "local") -> ProcMesh:
    """An owned mesh of simulated processes inside this Python process.

    ``per_host`` gives the dimensions (``{"gpus": 2}``, ``{"hosts": 1, "gpus": 2}``); omitted
    means one process with no dimensions. Each process has its own PID, actors and ports and
    talks to the others only through envelopes on the in-process fabric.
    """
    sizes = dict(per_host or {})
    for label, size in sizes.items():
        if not isinstance(label, str) or isinstance(size, bool) or not isinstance(size, int):
            raise TypeError("per_host maps dimension names to int sizes")
        if size < 1:
            raise ValueError(f"per_host size for {label!r} must be at least 1, got {size}")
    extent = Extent(list(sizes), list(sizes.values()))
    client()
    procs = []
    for point in extent.points():
        runtime = new_local_runtime(f"{name}{point}")
        procs.append(runtime.proc_id)
    mesh = ProcMesh(procs, Shape.from_extent(extent), owned=True, state=_ProcMeshState(), name=name)
    ctx = _current()
    _adopt(ctx._cell if ctx is not None else client().root, mesh)
    return mesh


set_proc_resolver(this_proc)  # hook H2: ``Instance.proc`` of an instance without a proc mesh
