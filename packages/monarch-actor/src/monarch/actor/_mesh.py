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
processes (``this_host().spawn_procs``) come from ``_host``; their proc meshes carry the
``WorkerGroup`` in their state, which ``stop`` uses to end the processes; in a worker, a proc
mesh an actor spawned carries a ``NestedDelegate`` instead: the client's host agent
(``_host_agent``) started those processes and stops them.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, cast

from monarch.actor import _codec
from monarch.actor._actor import check_actor_class
from monarch.actor._adverbs import Endpoint, NotAnEndpoint
from monarch.actor._context import CreatorInfo, _current
from monarch.actor._endpoint import EndpointProperty, endpoints_of
from monarch.actor._envelope import ActorAddr, CastInfo, MessageKind
from monarch.actor._future import Future, _Cell
from monarch.actor._ids import ProcId
from monarch.actor._runtime import (
    CellBase,
    GatherSink,
    Reply,
    RootCell,
    SpawnSpec,
    client,
    current_sender,
    decode_reply,
    new_local_runtime,
)
from monarch.actor._shape import Extent, MeshTrait, Shape, Slice

if TYPE_CHECKING:
    from monarch.actor._host import HostMesh, WorkerGroup
    from monarch.actor._host_agent import NestedDelegate

__all__ = [
    "ActorMesh",
    "ProcMesh",
    "local_proc_mesh",
    "this_proc",
]

T = TypeVar("T")


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


class _ProcMeshState:
    """Shared by an owned proc mesh and the slices made from it in this process; ``group``
    is the worker processes behind it (``None`` for simulated processes)."""

    __slots__ = ("delegate", "group", "stopped")

    def __init__(self, group: WorkerGroup | None = None) -> None:
        self.stopped = False
        self.group = group
        #: In a worker: the processes were spawned for it by the client's host agent, which
        #: stops them (``_host_agent``); ``group`` is then ``None``.
        self.delegate: NestedDelegate | None = None


class ProcMesh(MeshTrait):
    """A mesh of processes. ``spawn`` creates one actor per process."""

    __slots__ = ("_name", "_owned", "_owner", "_procs", "_shape", "_state")

    def __init__(
        self,
        procs: Sequence[ProcId],
        shape: Shape,
        *,
        owned: bool = False,
        state: _ProcMeshState | None = None,
        name: str = "procs",
    ) -> None:
        self._procs = tuple(procs)
        self._shape = shape
        self._owned = owned
        self._owner: CellBase | None = None
        self._state = state
        self._name = name
        for rank in shape.ndslice:
            if not 0 <= rank < len(self._procs):
                raise ValueError(f"shape selects rank {rank} of {len(self._procs)} procs")

    # -- MeshTrait ---------------------------------------------------------------------------
    @property
    def _ndslice(self) -> Slice:
        return self._shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self._shape.labels

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(self._procs, shape, owned=False, state=self._state, name=self._name)

    # -- API -----------------------------------------------------------------------------------
    @property
    def initialized(self) -> Future[bool]:
        """Resolves to ``True`` once the processes are ready (in-process: at once)."""
        return Future._completed(True)

    @property
    def host_mesh(self) -> HostMesh:
        """The host of a one-process mesh, as a host mesh with extent ``{}`` (a reference:
        ``spawn_procs`` on it starts processes on that host, owned by the caller).
        ``NotImplementedError`` for a mesh of several processes, as in the reference."""
        from monarch.actor._host import HostMesh

        if len(self._shape.ndslice) != 1:
            raise NotImplementedError(
                "`ProcMesh.host_mesh` is not yet supported for non-singleton proc meshes."
            )
        pid = self._procs[next(iter(self._shape.ndslice))].pid
        return HostMesh(Shape.unity(), owned=False, target=f"proc:{pid.hex()}")

    def spawn(self, name: str, actor_class: type[T], *args: Any, **kwargs: Any) -> T:
        """Spawn ``actor_class(*args, **kwargs)`` on every process; returns the actor mesh.

        Non-blocking. ``ValueError`` for classes that are not ``Actor`` subclasses, mix sync and
        async endpoints, or use reserved endpoint names.
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
        mesh: ActorMesh[T] = ActorMesh(
            actor_class,
            name,
            path,
            self._procs,
            self._shape,
            owned=True,
            initialized=Future._create(cell, _all_ok),
        )
        if self._state is not None and self._state.stopped:
            cell.set_exception(RuntimeError("`ProcMesh` has already been stopped"))
            return cast(T, mesh)
        spec = SpawnSpec(name, actor_class, args, kwargs, self, _creator_of(sender))
        payload = _codec.encode(spec)
        targets = _targets_of(self._procs, self._shape, path)
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
        mesh._proc_state = self._state
        _adopt(sender, mesh)
        return cast(T, mesh)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor on these processes, then the processes (owner only)."""
        if not self._owned:
            raise ValueError("ProcMesh is not owned; must be stopped by an owner")
        _forget(self)
        return self._stop_owned() or Future._completed(None)

    def _stop_owned(self) -> Future[None] | None:
        if self._state is None or self._state.stopped:
            return None
        self._state.stopped = True
        if self._state.delegate is not None:  # the client's host agent stops them
            return self._state.delegate.stop()
        group = self._state.group
        ranks = list(self._shape.ndslice)
        live = [g for g in ranks if group is None or group.alive(g)]
        # Cast ranks index the gathering port's slots: number the live targets densely.
        targets = [
            (ActorAddr(self._procs[g].pid.raw, ""), CastInfo((), (), i)) for i, g in enumerate(live)
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

    def sync_workspace(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Not implemented on ``ProcMesh`` (as in the reference)."""
        raise NotImplementedError("sync_workspace is not implemented on ProcMesh")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_proc_mesh, (self._procs, self._shape, self._name))

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


class ActorMesh(MeshTrait, Generic[T]):
    """One actor per process of a proc mesh; endpoints are attributes (``mesh.method.call()``)."""

    def __init__(
        self,
        actor_class: type[T],
        name: str,
        path: str,
        procs: Sequence[ProcId],
        shape: Shape,
        *,
        owned: bool = False,
        initialized: Future[None] | None = None,
    ) -> None:
        self._class = actor_class
        self._user_name = name
        self._path = path
        self._procs = tuple(procs)
        self._shape = shape
        self._owned = owned
        self._initialized = initialized
        self._owner: CellBase | None = None
        self._proc_state: _ProcMeshState | None = None
        self._stopped = False
        self._chooser = itertools.count()
        self._targets_cache: list[tuple[ActorAddr, CastInfo]] | None = None
        self._endpoints: dict[str, EndpointProperty[Any, Any]] = endpoints_of(actor_class)

    # -- MeshTrait ---------------------------------------------------------------------------
    @property
    def _ndslice(self) -> Slice:
        return self._shape.ndslice

    @property
    def _labels(self) -> Sequence[str]:
        return self._shape.labels

    def _new_with_shape(self, shape: Shape) -> ActorMesh[T]:
        return ActorMesh(self._class, self._user_name, self._path, self._procs, shape)

    def _targets(self) -> list[tuple[ActorAddr, CastInfo]]:
        # A mesh's processes, shape and path never change: compute the targets once (this is
        # on every call's path). Callers only read the list.
        targets = self._targets_cache
        if targets is None:
            targets = self._targets_cache = _targets_of(self._procs, self._shape, self._path)
        return targets

    # -- endpoints -------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_class", "_endpoints"):
            raise AttributeError(name)
        prop = self._endpoints.get(name)
        if prop is not None:
            return Endpoint(self, name, prop)
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

    def _stop_owned(self) -> Future[None] | None:
        if self._stopped:
            return None
        self._stopped = True
        return _fan_out(MessageKind.STOP, self._targets())

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_actor_mesh,
            (self._class, self._user_name, self._path, self._procs, self._shape),
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
