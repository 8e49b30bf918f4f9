"""The client's host agent: process meshes spawned from inside workers, and controllers.

Why an agent: a worker never forks. Its ``spawn_procs`` sends a request to the client's *host
agent* (a system actor at the fixed path ``AGENT_PATH`` in the client's process, whose PID every
worker knows: it is the ``--authority`` it joined), and the agent starts the processes exactly
as a client spawn does (``nested.NestedProcs``, which also holds the bounds), joined under the
client's node. So the whole process layer stays in one place: reapers, process-death notices to
every process (the owning actor in the worker gets its ``MeshFailure`` per rank), lanes and the
orphan rule (a ``kill -9`` of the client ends every process).

Ownership is the spawning actor's: the worker builds the owned ``ProcMesh`` (its state carries
a ``NestedDelegate`` instead of a worker group), records it with the actor, and stops it like
any owned mesh when the actor stops or fails (depth first: actor meshes on it, then the
processes, which the agent stops and reaps).

The agent is spawned in the client on first use (``ensure_agent``; ``HostMesh.spawn_procs``
calls it after its first group started, so the zygote is forked before the agent's thread
exists).

Controllers: ``get_or_spawn_controller(name, Class, *args)`` asks the same agent, which spawns
one ``Class`` actor per name in the client's process (owned by the agent), hands the same mesh
to every caller, and swallows its failure, answering later lookups with ``ActorError``
("Failure on <name>: ...").
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from chrysalis.core import Pid
from monarch.actor._base.actor import Actor, check_actor_class
from monarch.actor._base.endpoint import endpoint
from monarch.actor._base.errors import MeshFailure
from monarch.actor._base.future import Future
from monarch.actor._base.ids import ProcId
from monarch.actor._base.shape import Extent, Shape
from monarch.actor._hosts import groups
from monarch.actor._hosts.commands import EXIT_TIMEOUT, BootstrapCommand, _SpawnOptions
from monarch.actor._hosts.nested import NestedProcs, nested_procs
from monarch.actor._hosts.spawn import bring_up
from monarch.actor._mesh.meshes import (
    ActorMesh,
    _ProcMeshState,
    _spawn_system_actor,
    this_proc,
)
from monarch.actor._runtime.client import (
    client,
)
from monarch.actor._runtime.context import (
    _current,
    _reset_context,
    _set_context,
)
from monarch.actor._runtime.ports import (
    Port,
)
from monarch.config import _registry as _config

if TYPE_CHECKING:
    from monarch.actor._runtime.client import (
        _Client,
    )

__all__ = [
    "AGENT_PATH",
    "NestedDelegate",
    "ensure_agent",
    "get_or_spawn_controller",
    "spawn_from_worker",
]

T = TypeVar("T")

#: The host agent's actor path in the client's process.
AGENT_PATH: Final = "monarch-host-agent"
#: Controllers one client may hold.
MAX_CONTROLLERS: Final = 10_000
#: Seconds a worker waits for the agent's answer to a spawn (the spawn's own bound, plus slack).
REQUEST_TIMEOUT: Final = 60.0


def _answer(nested: NestedProcs, port: Port[Any], work: Any) -> None:
    """Run ``work()`` on its own thread and send its value (or exception) to ``port``."""
    nested.admit()

    def run() -> None:
        try:
            value = work()
        except Exception as exc:
            port.exception(exc)
        else:
            port.send(value)
        finally:
            nested.release()

    threading.Thread(target=run, name="monarch-host-agent-request", daemon=True).start()


class _HostAgent(Actor):
    """The client's host agent (module docstring). Requests that take time (spawning and
    stopping processes) are served on their own threads, so one slow spawn holds up nobody."""

    _is_system_actor = True

    def __init__(self) -> None:
        self._controllers: dict[str, Any] = {}  # name -> ActorMesh or the MeshFailure it had
        self._controller_names: dict[str, str] = {}  # mesh path -> name

    @endpoint(explicit_response_port=True)
    def spawn_procs(
        self,
        port: Port[tuple[str, list[ProcId]]],
        requester: bytes,
        target: str,
        host_ranks: list[int],
        labels: list[str],
        sizes: list[int],
        local_labels: list[str],
        local_sizes: list[int],
        name: str,
        commands: list[BootstrapCommand | None] | None = None,
        numactl: list[list[str]] | None = None,
    ) -> None:
        c = client()
        nested = nested_procs(c.node_layer)
        extent = Extent(labels, sizes)
        local = Extent(local_labels, local_sizes)
        for per_rank in (commands, numactl):
            if per_rank is not None and len(per_rank) != extent.nelements:
                port.exception(ValueError("spawn_procs options must have one entry per process"))
                return
        try:
            _answer(
                nested,
                port,
                lambda: nested.spawn(
                    c,
                    requester,
                    target,
                    host_ranks,
                    extent,
                    local,
                    name,
                    commands=commands,
                    numactl=numactl,
                ),
            )
        except Exception as exc:
            port.exception(exc)

    @endpoint(explicit_response_port=True)
    def stop_procs(self, port: Port[None], group_id: str) -> None:
        nested = nested_procs(client().node_layer)
        bound = float(_config.get("stop_actor_timeout")) + EXIT_TIMEOUT + 2.0

        def work() -> None:
            nested.stop(group_id).get(timeout=bound)

        try:
            _answer(nested, port, work)
        except Exception as exc:
            port.exception(exc)

    @endpoint
    def get_or_spawn(
        self, name: str, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if name not in self._controllers:
            if len(self._controllers) >= MAX_CONTROLLERS:
                raise RuntimeError(f"at most {MAX_CONTROLLERS} controllers per client")
            mesh: Any = this_proc().spawn(name, cls, *args, **kwargs)
            self._controllers[name] = mesh
            self._controller_names[mesh._path] = name
        controller = self._controllers[name]
        if isinstance(controller, MeshFailure):
            raise ValueError(f"Failure on {name}: {controller}")
        return controller

    def __supervise__(self, failure: MeshFailure) -> bool:
        name = self._controller_names.get(failure.mesh_name)
        if name is None:
            return False  # not a controller's: let it end the program
        if not isinstance(self._controllers.get(name), type(failure)):
            self._controllers[name] = failure  # the first failure is the one reported
        return True


def _agent_mesh(authority: bytes) -> Any:
    """A reference to the host agent of the client whose PID is ``authority``."""
    return ActorMesh(
        _HostAgent, "host_agent", AGENT_PATH, [ProcId(Pid(authority), "client")], Shape.unity()
    )


def ensure_agent(client: _Client) -> Any:
    """The host agent of this client, spawned (as the root's, not owned by anyone: it serves
    until the runtime closes) on first use."""
    with client.host_lock:
        if client.host_agent is None:
            token = _set_context(client.root.context)
            try:
                procs = client.root.instance.proc_mesh
                assert procs is not None  # set when the client runtime is made
                _spawn_system_actor(procs, AGENT_PATH, _HostAgent)
            finally:
                _reset_context(token)
            client.host_agent = _agent_mesh(client.node_layer.pid.raw)
        return client.host_agent


def _agent() -> Any:
    """The host agent as seen from this process (a worker, or the client)."""
    if groups._in_worker_process():
        authority = groups._worker_authority
        if authority is None:
            raise RuntimeError("this worker process does not know its client")
        return _agent_mesh(authority)

    return ensure_agent(client())


def _wait(future: Future[T], timeout: float, what: str) -> T:
    if not future._wait(timeout):
        raise RuntimeError(f"{what}: the client's host agent did not answer in {timeout:.0f} s")
    return future._outcome()


class NestedDelegate:
    """In a worker: the owned proc mesh's processes belong to the client's host agent; stopping
    the mesh asks the agent to stop (and reap) them."""

    __slots__ = ("group_id",)

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id

    def stop(self) -> Future[None]:
        result: Future[None] = _agent().stop_procs.call_one(self.group_id)
        return result


def spawn_from_worker(
    target: str,
    host_ranks: Sequence[int],
    extent: Extent,
    local: Extent,
    name: str,
    state: _ProcMeshState,
    options: _SpawnOptions,
) -> None:
    """``HostMesh.spawn_procs`` in a worker process (by an actor, which owns the mesh): ask
    the client's host agent to start the processes, and resolve ``state.ready`` in the
    background once it answered and the owner's setup ran (``spawn.bring_up``)."""
    ctx = _current()
    assert ctx is not None  # checked by the caller
    future = _agent().spawn_procs.call_one(
        ctx._cell.runtime.pid_raw,
        target,
        list(host_ranks),
        list(extent.labels),
        list(extent.sizes),
        list(local.labels),
        list(local.sizes),
        name,
        options.commands,
        options.numactl,
    )

    def start() -> list[ProcId]:
        group_id, procs = _wait(future, REQUEST_TIMEOUT, "spawn_procs")
        state.delegate = NestedDelegate(group_id)
        return list(procs)

    def cleanup() -> None:
        if state.delegate is not None:
            state.delegate.stop()

    bring_up(state, Shape.from_extent(extent), name, start, options, cleanup)


def get_or_spawn_controller(name: str, Class: type[T], *args: Any, **kwargs: Any) -> Future[T]:
    """The controller named ``name``: one ``Class(*args, **kwargs)`` actor in the client's
    process, spawned by the first call and returned to every later one (from the client or
    any actor, in any process). Resolves to the actor mesh (extent ``{}``); if that controller
    failed, to ``ActorError`` ("Failure on <name>: ..."). ``ValueError`` at once for a class
    that is not an ``Actor``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"controller name must be a non-empty str, got {name!r}")
    check_actor_class(Class)
    result: Future[T] = _agent().get_or_spawn.call_one(name, Class, args, kwargs)
    return result
