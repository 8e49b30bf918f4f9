"""Who is running: ``context()``, ``current_rank()``, ``current_size()``.

Why a context variable: the same thread can run code for different actors over time, and an
async actor runs several concurrent endpoint bodies at once, each answering a different message.
The runtime sets a ``contextvars.ContextVar`` around every handler (tasks copy it when created),
so ``current_rank()`` inside a concurrent body still sees *its* message. Code that runs outside
any actor (the client script, user threads, user asyncio loops) sees the root client context.

``Context.message_rank`` is the receiver's position within the slice that was messaged;
``Instance.rank`` is its position in the mesh it was spawned as. Calling a one-rank slice with
``call_one`` therefore shows ``current_rank() == {}`` while ``rank`` keeps the coordinate.

``current_sender()`` is who sends from the running code: the running actor; outside actors, a
worker process itself (``set_process_sender``) or the root client.

This module is the bottom of the ``_runtime`` layer: the runtime and the meshes above it reach
down through registration hooks set at their import (``set_root_context`` by
``_runtime.client``, ``set_proc_resolver`` by ``_mesh.meshes``).
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import msgspec

from monarch.actor._base.ids import ActorId, ProcId
from monarch.actor._base.shape import Extent, Point

if TYPE_CHECKING:
    from monarch.actor._mesh.meshes import ProcMesh
    from monarch.actor._runtime.cell import CellBase
    from monarch.actor._runtime.proc import ProcRuntime

__all__ = [
    "Context",
    "CreatorInfo",
    "Instance",
    "context",
    "current_actor_name",
    "current_rank",
    "current_sender",
    "current_size",
    "set_process_sender",
]

_CURRENT: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "monarch_actor_context", default=None
)
_EMPTY_POINT = Point(0, Extent([], []))

# Registration hooks: this module sits below the runtime and the meshes, which set these at
# their import (``monarch.actor`` imports both, so they are set before any user code runs).
#: The root client's context, for code running outside any actor (set by ``_runtime.client``).
_root_context: Callable[[], Context] | None = None
#: ``this_proc()``, for an instance spawned without a proc mesh (set by ``_mesh.meshes``).
_proc_resolver: Callable[[], ProcMesh] | None = None


def set_root_context(fn: Callable[[], Context]) -> None:
    """Hook: ``fn()`` returns the root client's context (bootstrapping the client if needed)."""
    global _root_context
    _root_context = fn


def set_proc_resolver(fn: Callable[[], ProcMesh]) -> None:
    """Hook: ``fn()`` returns the one-proc mesh of the running process (``this_proc``)."""
    global _proc_resolver
    _proc_resolver = fn


_T = TypeVar("_T")


def _hook(fn: Callable[[], _T] | None, name: str) -> Callable[[], _T]:
    if fn is None:
        raise RuntimeError(f"monarch.actor is not fully imported ({name} is not registered)")
    return fn


class CreatorInfo(msgspec.Struct, frozen=True):
    """Serialisable description of the actor that spawned another (``name == "root"`` for the
    client)."""

    name: str
    actor_id: str
    chain: str


class Instance:
    """The running actor: identity, spawn-time rank, its proc mesh, and self-control.

    ``str(instance)`` is the creation chain, e.g. ``<root>.<mymod.Trainer trainers{'gpus': 1/2}>``.
    """

    __slots__ = (
        "_cell",
        "_chain",
        "_proc_mesh",
        "_resolve_proc_mesh",
        "actor_id",
        "class_name",
        "creator",
        "name",
        "proc_id",
        "rank",
    )

    def __init__(
        self,
        *,
        cell: CellBase,
        actor_id: ActorId,
        rank: Point,
        proc_mesh: ProcMesh | None,
        name: str,
        class_name: str,
        creator: CreatorInfo | None,
        chain: str,
        resolve_proc_mesh: bool = False,
    ) -> None:
        self._cell = cell
        self.actor_id = actor_id
        self.proc_id: ProcId = actor_id.proc
        self.rank = rank
        self._proc_mesh = proc_mesh
        #: The root client's instance: ``proc_mesh`` is its own process, made on first use.
        self._resolve_proc_mesh = resolve_proc_mesh and proc_mesh is None
        self.name = name
        self.class_name = class_name
        self.creator = creator
        self._chain = chain

    @property
    def proc_mesh(self) -> ProcMesh | None:
        """The mesh this actor was spawned on (``None``: spawned without one). The root
        client's is its own process (``this_proc()`` as the root, through the
        ``set_proc_resolver`` hook), made on first use."""
        mesh = self._proc_mesh
        if mesh is None and self._resolve_proc_mesh:
            token = _CURRENT.set(Context(self, _EMPTY_POINT))
            try:  # the resolver answers for the running instance: make it this one
                mesh = _hook(_proc_resolver, "set_proc_resolver")()
            finally:
                _CURRENT.reset(token)
            # Two threads may race here: each gets an equal mesh (a reference, owning
            # nothing), and one of them is kept.
            if self._proc_mesh is None:
                self._proc_mesh = mesh
            mesh = self._proc_mesh
        return mesh

    @property
    def proc(self) -> ProcMesh:
        """The one-proc slice of ``proc_mesh`` this actor runs on."""
        mesh = self.proc_mesh
        if mesh is None:
            return _hook(_proc_resolver, "set_proc_resolver")()
        return mesh.slice(**dict(self.rank))

    def stop(self, reason: str | None = None) -> None:
        """Stop this actor gracefully after the current message (not a failure)."""
        self._cell.request_stop(reason or "stopped by the actor itself")

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor after the current message; its owner gets a supervision event."""
        self._cell.request_abort(reason or "no reason provided")

    def kill(self, reason: str | None = None) -> None:
        """Same as ``abort`` (the actor fails with ``reason``)."""
        self.abort(reason)

    def __str__(self) -> str:
        return self._chain

    def __repr__(self) -> str:
        return f"Instance({self._chain})"


class Context:
    """What ``context()`` returns: the actor instance and the rank of the current message."""

    __slots__ = ("_span", "actor_instance", "message_rank")

    def __init__(self, actor_instance: Instance, message_rank: Point) -> None:
        self.actor_instance = actor_instance
        self.message_rank = message_rank
        #: The trace context (24 bytes) of the receive span the runtime runs this message's
        #: sync endpoint in, ``b""`` if none: the current span below any span entered in it
        #: (``telemetry.tracing.run_endpoint`` sets it instead of a context variable; a
        #: message's context is made for that message alone).
        self._span = b""

    @property
    def _cell(self) -> CellBase:
        return self.actor_instance._cell

    def __repr__(self) -> str:
        return f"Context({self.actor_instance}, message_rank={self.message_rank})"


def _current() -> Context | None:
    return _CURRENT.get()


def context() -> Context:
    """The running actor's context, or the root client's (bootstrapping it if needed)."""
    ctx = _CURRENT.get()
    if ctx is not None:
        return ctx
    return _hook(_root_context, "set_root_context")()


def current_rank() -> Point:
    """Position of this actor within the slice that sent the current message."""
    return context().message_rank


def current_size() -> dict[str, int]:
    """Extent of the slice that sent the current message, as a dict."""
    return dict(context().message_rank.extent)


def current_actor_name() -> str:
    """Unique name of the running actor (``str`` of its actor id)."""
    return str(context().actor_instance.actor_id)


def _set_context(ctx: Context) -> contextvars.Token[Context | None]:
    return _CURRENT.set(ctx)


def _reset_context(token: contextvars.Token[Context | None]) -> None:
    _CURRENT.reset(token)


def _empty_point() -> Point:
    return _EMPTY_POINT


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
    process itself, or the root client (bootstrapping it if needed, hook ``set_root_context``)."""
    ctx = _CURRENT.get()
    if ctx is None:
        own = _process_sender
        if own is not None and own[0] == os.getpid():
            return own[1], own[2]
        root = _root_context  # (``_hook`` inlined: the client's every call passes here)
        ctx = root() if root is not None else _hook(root, "set_root_context")()
    cell = ctx._cell
    return cell.runtime, cell
