"""The client's host agent: process meshes spawned from inside workers, and controllers.

Why the client spawns every process: in the reference Monarch the processes an actor spawns
with ``this_host().spawn_procs`` (or on a host mesh it was handed) are started by the host's
agent, which for the client's own host lives in the client, so they are OS children of the
client, not of the spawning worker. Here too: a worker never forks. Its ``spawn_procs`` sends a
request to the client's *host agent* (a system actor at the fixed path ``AGENT_PATH`` in the
client's process, whose PID every worker knows: it is the ``--authority`` it joined), and the
agent starts the processes exactly as a client spawn does (forked from the client's zygote, or
through the worker loop of an attached host), joined under the client's node. So the whole
process layer stays in one place: reapers, process-death notices to every process (the owning
actor in the worker gets its ``MeshFailure`` per rank), lanes and the orphan rule (a ``kill -9``
of the client ends every process).

Ownership is the spawning actor's: the worker builds the owned ``ProcMesh`` (its state carries
a ``NestedDelegate`` instead of a worker group), records it with the actor, and stops it like
any owned mesh when the actor stops or fails (depth first: actor meshes on it, then the
processes, which the agent stops and reaps). The client remembers which process asked for which
group (``NestedProcs``): when that process exits (killed, crashed or stopped), every group it
still owns is SIGKILLed at once, so children never outlive their parent, also under ``kill -9``,
and the rule applies again one level down.

Bounds: ``MAX_SPAWN_DEPTH`` levels of processes below the client, ``MAX_NESTED_PROCS`` processes
spawned from workers alive at once, ``MAX_REQUESTS_IN_FLIGHT`` requests being served (each
spawn is at most 1 024 processes, as on the client). Exceeding one is a ``RuntimeError`` for the
spawning actor that says which bound.

Where the processes go (as in the reference): ``this_host()`` in a worker is the host of that
worker (the client's host for local workers, the attached host for workers of an attached
host); a host mesh passed to an actor keeps meaning the hosts it named at the client
(``this_host()`` of the client, or a slice of an attached host mesh: the client keeps a token ->
host sessions table for attached host meshes that were pickled). ``ProcMesh.host_mesh`` of a
one-process mesh is that process's host.

Controllers: ``get_or_spawn_controller(name, Class, *args)`` asks the same agent, which spawns
one ``Class`` actor per name in the client's process (owned by the agent), hands the same mesh
to every caller, and swallows its failure, answering later lookups with ``ActorError``
("Failure on <name>: ...").
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from monarch.actor._base.actor import Actor, check_actor_class
from monarch.actor._base.endpoint import endpoint
from monarch.actor._base.errors import MeshFailure
from monarch.actor._base.future import Future
from monarch.actor._base.ids import ProcId
from monarch.actor._base.shape import Extent, Shape
from monarch.actor._mesh.meshes import (
    ActorMesh,
    ProcMesh,
    _ProcMeshState,
    _spawn_system_actor,
    this_proc,
)
from monarch.actor._runtime.client import client
from monarch.actor._runtime.context import _current, _reset_context, _set_context, context
from monarch.actor._runtime.ports import Port

if TYPE_CHECKING:
    from chrysalis.core import Pid
    from monarch.actor._attach import HostSession
    from monarch.actor._host import BootstrapCommand, ClientNodeLayer, WorkerGroup, _SpawnOptions
    from monarch.actor._runtime.client import _Client

__all__ = [
    "AGENT_PATH",
    "MAX_NESTED_PROCS",
    "MAX_SPAWN_DEPTH",
    "NestedDelegate",
    "NestedProcs",
    "ProcSetup",
    "get_or_spawn_controller",
]

T = TypeVar("T")

#: The host agent's actor path in the client's process.
AGENT_PATH: Final = "monarch-host-agent"
#: Levels of processes below the client (its own workers are level 1).
MAX_SPAWN_DEPTH: Final = 8
#: Processes spawned from inside workers that may run at once.
MAX_NESTED_PROCS: Final = 1024
#: Spawn and stop requests the agent serves at once (more are refused, not queued).
MAX_REQUESTS_IN_FLIGHT: Final = 64
#: Host meshes of attached hosts that may be handed to actors (pickled) per client.
MAX_HOST_TOKENS: Final = 1024
#: Controllers one client may hold.
MAX_CONTROLLERS: Final = 10_000
_DEAD_REMEMBERED: Final = 4096
#: Seconds a worker waits for the agent's answer to a spawn (the spawn's own bound, plus slack).
REQUEST_TIMEOUT: Final = 60.0


class _Nested:
    """One group of processes spawned for a worker, as the client sees it."""

    __slots__ = ("depth", "mesh", "owner")

    def __init__(self, mesh: ProcMesh, owner: bytes, depth: int) -> None:
        self.mesh = mesh
        self.owner = owner
        self.depth = depth


class NestedProcs:
    """The client's table of process groups spawned on behalf of worker processes (see the
    module docstring): who owns which group, how deep each process is, which host meshes of
    attached hosts were handed out. Thread-safe; every table is bounded."""

    def __init__(self, layer: ClientNodeLayer) -> None:
        self._layer = layer
        self._lock = threading.Lock()
        self._groups: dict[str, _Nested] = {}
        self._by_owner: dict[bytes, set[str]] = {}
        self._depth: dict[bytes, int] = {}
        self._dead: OrderedDict[bytes, None] = OrderedDict()
        self._hosts: dict[str, list[HostSession]] = {}
        self._in_flight = 0

    # -- host meshes handed to actors ---------------------------------------------------------
    def register_hosts(self, token: str, sessions: Sequence[HostSession]) -> None:
        """Remember the sessions of an attached host mesh that is being pickled."""
        with self._lock:
            if token in self._hosts:
                return
            if len(self._hosts) >= MAX_HOST_TOKENS:
                raise RuntimeError(
                    f"at most {MAX_HOST_TOKENS} attached host meshes can be passed to actors"
                )
            self._hosts[token] = list(sessions)

    def forget_hosts(self, token: str) -> None:
        """The host mesh was shut down: spawning on references to it fails from now on."""
        with self._lock:
            self._hosts.pop(token, None)

    def resolve(self, target: str, ranks: Sequence[int]) -> list[HostSession] | None:
        """The hosts ``target`` names (``None``: this host, the client's), selected by
        ``ranks`` (the host mesh's ranks); ``RuntimeError`` for hosts that are gone."""
        kind, _, value = target.partition(":")
        if kind == "client":
            return None
        if kind == "attached":
            with self._lock:
                sessions = self._hosts.get(value)
            if sessions is None:
                raise RuntimeError("HostMesh has already been shut down")
            try:
                return [sessions[rank] for rank in ranks]
            except IndexError:
                raise RuntimeError("the host mesh reference names a missing host") from None
        if kind == "proc":
            return self._host_of(bytes.fromhex(value))
        raise ValueError(f"unknown host mesh target {target!r}")

    def _host_of(self, pid: bytes) -> list[HostSession] | None:
        from monarch.actor._attach import RemoteWorkerGroup

        with self._layer._lock:
            groups = list(self._layer.groups)
        for group in groups:
            for rank, each in enumerate(group.pids):
                if each.raw == pid:
                    if isinstance(group, RemoteWorkerGroup):
                        return [group.hosts[rank]]
                    return None
        return None  # the client itself, or a process already gone: this host

    # -- spawning and stopping -----------------------------------------------------------------
    def admit(self) -> None:
        """Count one request in flight (``RuntimeError`` over ``MAX_REQUESTS_IN_FLIGHT``)."""
        with self._lock:
            if self._in_flight >= MAX_REQUESTS_IN_FLIGHT:
                raise RuntimeError(
                    f"the host agent is serving {MAX_REQUESTS_IN_FLIGHT} requests already"
                )
            self._in_flight += 1

    def release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def spawn(
        self,
        client: _Client,
        requester: bytes,
        target: str,
        host_ranks: Sequence[int],
        extent: Extent,
        local: Extent,
        name: str,
        *,
        commands: Sequence[BootstrapCommand | None] | None = None,
        numactl: Sequence[Sequence[str]] | None = None,
    ) -> tuple[str, list[ProcId]]:
        """Start the processes ``requester`` asked for; return the group id and processes."""
        from monarch.actor._host import _start_group

        with self._lock:
            if requester in self._dead:
                raise RuntimeError("the process that asked for these processes is gone")
            depth = self._depth.get(requester, 1) + 1
            if depth > MAX_SPAWN_DEPTH:
                raise RuntimeError(
                    f"spawn_procs is nested too deeply: at most {MAX_SPAWN_DEPTH} levels of "
                    "processes below the client"
                )
            live = sum(
                len(n.mesh._state.group.live_pids())
                for n in self._groups.values()
                if n.mesh._state is not None and n.mesh._state.group is not None
            )
            if live + extent.nelements > MAX_NESTED_PROCS:
                raise RuntimeError(
                    f"at most {MAX_NESTED_PROCS} processes spawned from inside workers may run "
                    f"at once ({live} run now, {extent.nelements} asked for)"
                )
        sessions = self.resolve(target, host_ranks)
        group = _start_group(
            client, sessions, extent, local, name, commands=commands, numactl=numactl
        )
        state = _ProcMeshState(group)
        group.state = state
        procs = [ProcId(pid, label) for pid, label in zip(group.pids, group.labels, strict=True)]
        mesh = ProcMesh(procs, Shape.from_extent(extent), owned=True, state=state, name=name)
        group_id = uuid.uuid4().hex
        with self._lock:
            orphaned = requester in self._dead
            if not orphaned:
                self._groups[group_id] = _Nested(mesh, requester, depth)
                self._by_owner.setdefault(requester, set()).add(group_id)
                for pid in group.pids:
                    self._depth[pid.raw] = depth
        if orphaned:  # the owner died while its processes started
            _kill_groups([group])
            raise RuntimeError("the process that asked for these processes is gone")
        return group_id, procs

    def stop(self, group_id: str) -> Future[None]:
        """Stop a group (its owner asked): ``STOP_PROC``, then reap or kill every process."""
        with self._lock:
            nested = self._pop(group_id)
        if nested is None:
            return Future._completed(None)
        return nested.mesh._stop_owned() or Future._completed(None)

    def _pop(self, group_id: str) -> _Nested | None:
        nested = self._groups.pop(group_id, None)
        if nested is None:
            return None
        owned = self._by_owner.get(nested.owner)
        if owned is not None:
            owned.discard(group_id)
            if not owned:
                del self._by_owner[nested.owner]
        state = nested.mesh._state
        if state is not None and state.group is not None:
            for pid in state.group.pids:
                self._depth.pop(pid.raw, None)
        return nested

    def process_gone(self, pid: Pid) -> None:
        """A process of the program exited (any thread, once per process): SIGKILL every
        group it owns (not failures: their owner is gone); their own exits do the same for
        the groups they own in turn."""
        raw = pid.raw
        with self._lock:
            self._dead[raw] = None
            while len(self._dead) > _DEAD_REMEMBERED:
                self._dead.popitem(last=False)
            self._depth.pop(raw, None)
            ids = self._by_owner.pop(raw, set())
            doomed = [n for n in (self._pop(i) for i in ids) if n is not None]
        groups = []
        for nested in doomed:
            state = nested.mesh._state
            if state is not None and state.group is not None:
                state.stopped = True
                state.group.killed = True
                groups.append(state.group)
        if groups:
            _kill_groups(groups)

    def clear(self) -> None:
        """Forget everything (client shutdown kills every process anyway)."""
        with self._lock:
            self._groups.clear()
            self._by_owner.clear()
            self._depth.clear()
            self._hosts.clear()


def _kill_groups(groups: Sequence[WorkerGroup]) -> None:
    def run() -> None:
        for group in groups:
            group.kill()

    # ``LocalWorkerGroup.kill`` reaps (bounded): not on a reaper thread.
    threading.Thread(target=run, name="monarch-kill-orphans", daemon=True).start()


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
        nested = c.node_layer.nested
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
        from monarch.actor._host import EXIT_TIMEOUT
        from monarch.config import _registry as _config

        nested = client().node_layer.nested
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
    from chrysalis.core import Pid

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
    from monarch.actor import _host

    if _host._in_worker_process():
        authority = _host._worker_authority
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
    background once it answered and the owner's setup ran (``_host.bring_up``)."""
    from monarch.actor._host import bring_up

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


class ProcSetup(Actor):
    """Runs the owner's setup on each new process of a ``spawn_procs`` before its mesh is
    ready (the reference's ``SetupActor``): the ``cpus`` binding, then ``bootstrap``. A
    ``bootstrap`` that raises reaches the owner as ``ActorError`` (through this call), which
    fails the mesh's ``initialized``."""

    @endpoint
    def setup(
        self, bootstrap: Callable[[], Any] | None, cpus: Sequence[Sequence[int] | None] | None
    ) -> None:
        from monarch.actor._worker import bind_cpus

        rank = context().actor_instance.rank.rank
        if cpus is not None and cpus[rank] is not None:
            bind_cpus(cpus[rank] or ())
        if bootstrap is not None:
            try:
                result = bootstrap()
                if inspect.isawaitable(result):
                    asyncio.run(_awaited(result))
            except Exception:
                raise
            except BaseException as exc:  # sys.exit: an error of the spawn (initialized), not
                # a failure of this actor, which would reach the owner as a supervision fault
                raise RuntimeError(f"bootstrap raised {exc!r}") from exc


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


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
