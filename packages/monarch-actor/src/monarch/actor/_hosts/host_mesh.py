"""``HostMesh``: the client's host (``this_host()``) and hosts started separately
(``attach_to_workers``), and the wiring of the ``_hosts`` layer into the runtime.

- ``spawn_procs`` starts one ``python -m monarch.actor._worker`` per rank, each a Node joined under
  the client's node, and returns at once, as the reference does: a thread of its own
  (``spawn.bring_up``) waits (bounded) until each worker printed its PID, i.e. joined, runs the
  owner's setup on them (``bootstrap=``, ``proc_bind`` ``cpus``, through a ``ProcSetup`` actor) and
  resolves the mesh's pending state (``_mesh.meshes._ProcMeshState.ready``), which ``initialized``,
  actor spawns, calls and stops wait or chain on. The workers get the client's ``sys.path`` as
  ``PYTHONPATH``: actor classes travel by reference. A ``bootstrap_command`` or a numactl
  ``proc_bind`` key starts them with exec instead of the zygote; their options then travel in
  ``MONARCH_WORKER_ARGV``. After the first group started, the client's host agent (``agent``) is
  started, so the zygote forks before the agent's thread exists.
- ``ProcMesh.stop()`` sends ``STOP_PROC`` to the live workers (bounded wait), then waits for
  every worker to exit and kills stragglers; it succeeds after workers crashed.
- ``attach_to_workers`` attaches the worker daemons (``attach_daemon``) of other hosts through
  one ``attach_session.HostSession`` each; their workers are the same worker processes.
- ``spawn_procs`` in a worker's actor asks the client's host agent (``agent``), which starts
  the processes in the client and SIGKILLs them when the process that asked for them exits.

At import this module registers the runtime's hooks: the client's node layer (H3,
``set_node_layer``: a ``ClientNodeLayer`` with its ``NestedProcs`` subscribed) and the host of
a process (H4, ``set_host_resolver``: ``ProcMesh.host_mesh``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Final

from chrysalis.core import default_registry
from chrysalis.node import join_members
from monarch.actor._base.future import Future, _Cell
from monarch.actor._base.ids import ProcId
from monarch.actor._base.shape import Extent, Point, Shape, ShapedMesh
from monarch.actor._hosts import groups
from monarch.actor._hosts.agent import ensure_agent, spawn_from_worker
from monarch.actor._hosts.attach_protocol import (
    _TRUST_ALL,
    ATTACH_TIMEOUT,
    MAX_HOSTS,
    _ca_directory,
    _udp_address,
)
from monarch.actor._hosts.attach_session import HostSession
from monarch.actor._hosts.client_node import ClientNodeLayer
from monarch.actor._hosts.commands import (
    _WORKER_ARGS,
    EXIT_TIMEOUT,
    BootstrapCommand,
    _SpawnOptions,
    bootstrap_commands,
    check_proc_bind,
)
from monarch.actor._hosts.groups import LocalWorkerGroup, check_spawn_method
from monarch.actor._hosts.nested import NestedProcs, nested_meshes, nested_procs
from monarch.actor._hosts.spawn import bring_up, start_group
from monarch.actor._mesh.admin import set_nested_meshes
from monarch.actor._mesh.meshes import (
    ProcMesh,
    _adopt,
    _ProcMeshState,
    set_host_resolver,
)
from monarch.actor._runtime.client import (
    client,
    set_node_layer,
)
from monarch.actor._runtime.context import (
    _current,
)
from monarch.actor._runtime.main_module import refuse_while_importing
from monarch.config import _registry as _config

__all__ = ["HostMesh", "attach_to_workers", "this_host"]

_MAX_PROCS: Final = 1024


class HostMesh(ShapedMesh):
    """A mesh of hosts. ``this_host()`` is the client's own host (extent ``{}``);
    ``attach_to_workers`` makes one of hosts started separately (extent ``{hosts: N}``).

    ``spawn_procs(per_host)`` starts one worker process per point of ``per_host`` on every host
    of this mesh and returns the owned ``ProcMesh`` (extent: the host dimensions, then
    ``per_host``). ``stop()`` stops every proc mesh spawned from this handle and keeps it (and
    the hosts' worker daemons) usable; ``shutdown()`` does the same, then ends the worker
    daemons and makes the handle unusable; ``kill()`` force-kills every process at once.

    ``target`` says which hosts a *reference* means wherever it is used (it pickles with the
    handle): ``client`` (the client's host), ``proc:<PID hex>`` (the host of that process:
    ``this_host()`` in a worker, ``ProcMesh.host_mesh``) or ``attached:<token>`` (attached
    hosts, looked up in the client's table when the handle was pickled). In a worker,
    ``spawn_procs`` asks the client's host agent (``agent``) to start the processes.
    """

    def __init__(
        self,
        shape: Shape,
        *,
        owned: bool,
        name: str = "host",
        hosts: Sequence[HostSession] | None = None,
        attached_ref: bool = False,
        target: str | None = None,
        _registry: tuple[list[ProcMesh], threading.Lock] | None = None,
    ) -> None:
        self._shape = shape
        self._attached_ref = attached_ref
        if target is None:
            target = "client" if hosts is None else f"attached:{os.urandom(12).hex()}"
        self._target = target
        self._owned = owned
        self._name = name
        self._hosts = list(hosts) if hosts is not None else None
        # Proc meshes spawned from this mesh *or its slices* (shared with them), so stopping
        # the owner stops everything spawned on its hosts.
        self._spawned, self._lock = _registry or ([], threading.Lock())
        self._shut_down = False
        self._python: str | None = None  # with_python_executable

    # -- MeshTrait ---------------------------------------------------------------------------
    def _new_with_shape(self, shape: Shape) -> HostMesh:
        mesh = HostMesh(
            shape,
            owned=False,
            name=self._name,
            hosts=self._hosts,
            attached_ref=self._attached_ref,
            target=self._target,
            _registry=(self._spawned, self._lock),
        )
        mesh._python = self._python
        return mesh

    # -- API -----------------------------------------------------------------------------------
    @property
    def initialized(self) -> Future[bool]:
        """Resolves to ``True`` (hosts are attached before the handle exists)."""
        return Future._completed(True)

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """This mesh, spawning its processes with ``python_executable`` (the interpreter that
        runs ``-m monarch.actor._worker``) instead of the client's ``sys.executable``, unless
        a ``spawn_procs`` call gives its own ``bootstrap_command``. Their own ``this_host()
        .spawn_procs`` then uses that interpreter too (it is their ``sys.executable``). The
        interpreter must be able to import this package (the client's ``sys.path`` is passed
        on as ``PYTHONPATH``); one that cannot start fails ``initialized``."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError(f"python_executable must be a non-empty str, got {python_executable!r}")
        mesh = HostMesh(
            self._shape,
            owned=self._owned,
            name=self._name,
            hosts=self._hosts,
            attached_ref=self._attached_ref,
            target=self._target,
            _registry=(self._spawned, self._lock),
        )
        mesh._python = python_executable
        return mesh

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: list[dict[str, Any]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
    ) -> ProcMesh:
        """Start one worker process per point of ``per_host`` on every host; return their
        ``ProcMesh`` at once (as the reference: the processes start in the background).

        ``await pm.initialized`` (or ``.get()``) resolves to ``True`` once every process
        joined and ran ``bootstrap``; it raises if they could not be brought up (a failing
        ``bootstrap`` is an ``ActorError``). Spawning actors on the mesh does not wait;
        calls, stops and pickling wait (bounded) for the processes and fail with the same
        error if the spawn failed.

        ``bootstrap``: a sync or async zero-argument callable run on every new process before
        any user actor. ``proc_bind``: one dict per process on a host; ``cpus`` (a CPU list
        such as ``"0-3,6"``) binds the process with ``sched_setaffinity``, ``cpunodebind``,
        ``membind`` and ``physcpubind`` start it under ``numactl`` (``RuntimeError`` if it is
        not installed). ``bootstrap_command``: a ``BootstrapCommand`` or a callable ``Point ->
        BootstrapCommand`` (see ``default_bootstrap_cmd``): the program that starts each
        process; it must end up running ``monarch.actor._worker``.

        Raised at once: ``RuntimeError`` after ``shutdown`` or for a lost host; ``ValueError``
        for a label of the host mesh, a bad size or a ``proc_bind`` of the wrong length;
        ``TypeError`` for arguments of the wrong type (on attached hosts a missing numactl or
        a command the host's worker loop cannot start fail ``initialized``). In a worker's
        actor the processes are started by the client (``agent``) and owned by the
        calling actor; past the nesting bounds (``MAX_SPAWN_DEPTH`` levels,
        ``MAX_NESTED_PROCS`` processes) ``initialized`` raises ``RuntimeError``.
        """
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        sizes = dict(per_host or {})
        for label, size in sizes.items():
            if not isinstance(label, str) or isinstance(size, bool) or not isinstance(size, int):
                raise TypeError("per_host maps dimension names to int sizes")
            if label in self._shape.labels:
                raise ValueError(f"per_host label {label!r} is already a host mesh label")
            if size < 1:
                raise ValueError(f"per_host size for {label!r} must be at least 1, got {size}")
        local = Extent(list(sizes), list(sizes.values()))
        extent = Extent(
            [*self._shape.labels, *local.labels],
            [*self._shape.ndslice.sizes, *local.sizes],
        )
        if extent.nelements > _MAX_PROCS:
            raise ValueError(f"at most {_MAX_PROCS} processes per spawn_procs call")
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a zero-argument callable, got {bootstrap!r}")
        if bootstrap_command is None and self._python is not None:
            bootstrap_command = BootstrapCommand(self._python, None, _WORKER_ARGS, {})
        options = _SpawnOptions(
            bootstrap,
            check_proc_bind(proc_bind, local.nelements),
            bootstrap_commands(bootstrap_command, extent),
            extent.nelements,
        )
        if options.numactl_missing is not None and self._hosts is None:
            raise RuntimeError(options.numactl_missing)  # attached hosts: their daemon says
        mesh_name = name or "procs"
        ranks = list(self._shape.ndslice)
        shape = Shape.from_extent(extent)
        state = _ProcMeshState(ready=_Cell())
        if groups._in_worker_process():
            ctx = _current()
            if ctx is None:
                raise RuntimeError(
                    "spawn_procs in a worker process must be called by an actor (the actor "
                    "owns the processes)"
                )
            mesh = ProcMesh(None, shape, owned=True, state=state, name=mesh_name)
            spawn_from_worker(self._target, ranks, extent, local, mesh_name, state, options)
            _adopt(ctx._cell, mesh)
            return mesh
        c = client()
        sessions: list[HostSession] | None
        if self._hosts is not None:
            sessions = [self._hosts[rank] for rank in ranks]
        else:
            sessions = nested_procs(c.node_layer).resolve(self._target, ranks)
        local_group: LocalWorkerGroup | None = None
        if sessions is None:
            check_spawn_method()
            layer = c.node_layer
            local_group = LocalWorkerGroup(
                [f"{mesh_name}{p}" for p in local.points()],
                layer.process_died,
                layer.current_watchdog,
            )
            state.adopt_group(local_group)
        else:
            for session in sessions:  # a host known to be gone fails now, not in the background
                if session.lost is not None:
                    raise RuntimeError(session.lost)

        def start() -> list[ProcId]:
            group = start_group(
                c, sessions, extent, local, mesh_name,
                group=local_group, commands=options.commands, numactl=options.numactl,
            )  # fmt: skip
            # The workers' actors may ask the host agent for processes once they exist. It
            # starts after the first workers, so the zygote is forked before its thread exists.
            ensure_agent(c)
            if state.adopt_group(group):  # HostMesh.kill() while it started
                group.kill()
                raise RuntimeError("the processes were killed while they started")
            return [ProcId(pid, label) for pid, label in zip(group.pids, group.labels, strict=True)]

        def cleanup() -> None:
            group = state.group
            if group is not None:
                group.killed = True  # their exits are no failures: the owner learns why
                group.kill()

        mesh = ProcMesh(None, shape, owned=True, state=state, name=mesh_name)
        ctx = _current()
        _adopt(ctx._cell if ctx is not None else c.root, mesh)
        with self._lock:
            self._spawned.append(mesh)
        bring_up(state, shape, mesh_name, start, options, cleanup)
        return mesh

    def _stop_spawned(self, then: Callable[[], None] | None = None) -> Future[None]:
        with self._lock:
            meshes = list(self._spawned)
            self._spawned.clear()
        futures = [m.stop() for m in meshes if m._owned and not m._state.stopped]  # type: ignore[union-attr]
        cell: _Cell[None] = _Cell()

        def run() -> None:
            for future in futures:
                future._cell.wait(float(_config.get("stop_actor_timeout")) + EXIT_TIMEOUT + 2)
            try:
                if then is not None:
                    then()
            finally:
                cell.set_result(None)

        threading.Thread(target=run, name="monarch-host-stop", daemon=True).start()
        return Future._create(cell)

    def stop(self) -> Future[None]:
        """Stop every proc mesh spawned from this handle or its slices (the handle and the
        hosts' worker daemons stay usable). ``RuntimeError`` on a reference."""
        if not self._owned:
            raise RuntimeError(
                "HostMesh cannot be stopped: this is a reference instead of owned "
                "(a slice or an unpickled copy)"
            )
        return self._stop_spawned()

    def shutdown(self) -> Future[None]:
        """Stop every proc mesh spawned from this handle, then end the worker daemons of
        attached hosts; later ``spawn_procs`` raise."""
        self._claim_end("shut down")
        self._forget_target()
        hosts = self._hosts
        return self._stop_spawned(None if hosts is None else lambda: _end_hosts(hosts, kill=False))

    def kill(self) -> Future[None]:
        """Force-kill: SIGKILL every process spawned from this handle at once (attached
        hosts' worker daemons kill theirs and exit immediately). The exits are not failures;
        the handle becomes unusable."""
        self._claim_end("killed")
        self._forget_target()
        with self._lock:
            meshes = list(self._spawned)
            self._spawned.clear()
        groups = [
            group
            for group in (m._state.request_kill() for m in meshes if m._state is not None)
            if group is not None
        ]  # a group still starting is killed by its starting thread
        if self._hosts is not None:
            _end_hosts(self._hosts, kill=True)
        for group in groups:
            group.kill()
        return Future._completed(None)

    def _forget_target(self) -> None:
        if self._hosts is not None and not groups._in_worker_process():
            nested_procs(client().node_layer).forget_hosts(self._target.partition(":")[2])

    def _claim_end(self, what: str) -> None:
        if not self._owned:
            raise RuntimeError(
                f"HostMesh cannot be {what}: this is a reference instead of owned "
                "(a slice or an unpickled copy)"
            )
        if self._shut_down:
            raise RuntimeError("HostMesh has already been shut down")
        self._shut_down = True

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owned and not self._shut_down:
            await self.shutdown()

    def __reduce__(self) -> tuple[Any, ...]:
        if self._hosts is not None and not self._shut_down:
            # Attached hosts: references find their sessions in the client's table.

            token = self._target.partition(":")[2]
            nested_procs(client().node_layer).register_hosts(token, self._hosts)
        return (
            _rebuild_host_mesh,
            (self._shape, self._name, self._hosts is not None, self._target),
        )

    def __repr__(self) -> str:
        owned = "owned" if self._owned else "ref"
        return f"<HostMesh {self._name} {self.extent} ({owned})>"


def _end_hosts(hosts: Sequence[HostSession], *, kill: bool) -> None:
    for session in hosts:
        session.end(kill=kill)


def _rebuild_host_mesh(
    shape: Shape, name: str, attached: bool = False, target: str = "client"
) -> HostMesh:
    return HostMesh(shape, owned=False, name=name, attached_ref=attached, target=target)


def this_host() -> HostMesh:
    """The host of this process as a host mesh with an empty extent: on the client its own
    (owned, one per client runtime); in a worker a reference to the worker's host, where
    ``spawn_procs`` starts processes owned by the calling actor (``agent``)."""
    if groups._in_worker_process():
        worker_pid = groups._worker_pid
        if worker_pid is None:
            refuse_while_importing("this_host()")
            raise RuntimeError("this worker process has not joined its client yet")
        return HostMesh(Shape.unity(), owned=False, target=f"proc:{worker_pid.hex()}")
    c = client()
    with c.host_lock:
        if c.host_mesh is None or c.host_mesh._shut_down:
            c.host_mesh = HostMesh(Shape.unity(), owned=True)
        return c.host_mesh


def _host_of(target: str) -> HostMesh:
    return HostMesh(Shape.unity(), owned=False, target=target)


def attach_to_workers(
    *,
    workers: Sequence[str | Future[str]],
    ca: str | os.PathLike[str] = _TRUST_ALL,
    name: str | None = None,
) -> HostMesh:
    """Attach the hosts whose worker loops (``run_worker_loop_forever``) listen at
    ``workers`` (``udp://HOST:PORT`` or Monarch's ``tcp://HOST:PORT``, the same over UDP; or
    futures of them; or a cluster URL such as ``slurm://JOBID``, standing for the worker loops
    that a Chrysalis address-resolver plugin finds for it) and return them as an owned host
    mesh with extent ``{hosts: len(workers)}``.

    Blocks until every host accepted (bounded by ``ATTACH_TIMEOUT``); ``RuntimeError`` naming
    the worker that could not be reached or refused (busy with another client); ``ValueError``
    for a malformed address or a ``ca`` that is not the client's cluster CA.
    """
    given = [w.get(timeout=ATTACH_TIMEOUT) if isinstance(w, Future) else w for w in workers]
    resolved = [address for w in given for address in _cluster_members(w)]
    if not resolved:
        raise ValueError("attach_to_workers needs at least one worker address")
    if len(resolved) > MAX_HOSTS:
        raise ValueError(f"at most {MAX_HOSTS} hosts per attach_to_workers call")
    addresses = [_udp_address(w) for w in resolved]
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"a worker address is listed twice in {resolved!r}")
    c = client()
    layer = c.node_layer
    _check_client_ca(layer, ca)
    layer.ensure_started(c)
    idle = float(_config.get("mesh_orphan_timeout"))
    sessions = [HostSession(layer, address) for address in addresses]

    async def connect_all() -> list[BaseException | None]:
        async def one(session: HostSession) -> None:
            await asyncio.wait_for(session.connect(layer.node, idle), ATTACH_TIMEOUT)

        return await asyncio.gather(*(one(s) for s in sessions), return_exceptions=True)

    results = asyncio.run_coroutine_threadsafe(connect_all(), c.loop.loop).result(
        ATTACH_TIMEOUT + 5
    )
    failures = [
        f"{session.address}: {result}"
        if str(result)
        else f"{session.address}: {type(result).__name__} (no answer within {ATTACH_TIMEOUT:g} s?)"
        for session, result in zip(sessions, results, strict=True)
        if result is not None
    ]
    if failures:
        for session, result in zip(sessions, results, strict=True):
            if result is None:
                asyncio.run_coroutine_threadsafe(session.detach(), c.loop.loop)
        raise RuntimeError(f"attach_to_workers could not attach {'; '.join(failures)}")
    with layer._lock:
        layer.sessions.extend(sessions)
    shape = Shape.from_extent(Extent(["hosts"], [len(sessions)]))
    return HostMesh(shape, owned=True, name=name or "hosts", hosts=sessions)


def _cluster_members(worker: str) -> list[str]:
    """``worker`` itself, or the worker loops a cluster URL of another scheme names
    (``slurm://JOBID``, ``k8s://NAMESPACE/SERVICE``: the resolvers that Chrysalis plugins, such
    as monarch-job's, contribute to the plugin registry), in the resolver's order."""
    scheme = worker.partition("://")[0] if "://" in worker else ""
    if scheme in ("", "udp", "tcp"):
        return [worker]
    try:
        settings = default_registry().resolve_address(worker)
    except LookupError:  # no resolver for the scheme: the address check says what is accepted
        return [worker]
    return [str(address) for _name, address in join_members(settings)]


def _check_client_ca(layer: ClientNodeLayer, ca: object) -> None:
    directory = _ca_directory(ca)
    if layer.cluster_ca_dir is None:
        raise RuntimeError(f"attach_to_workers needs the cluster CA: {layer.ca_problem}")
    try:
        certificate = (directory / "ca.pem").read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the CA certificate in {directory}: {exc}") from None
    if certificate.strip() != layer.ca_certificate_pem.strip():
        raise ValueError(
            f"the client's identity was issued at start-up by the CA in {layer.cluster_ca_dir}, "
            f"not by the one in {directory}: set CHRYSALIS_DEV_CA_DIR={directory} before the "
            "client starts"
        )


# ---------------------------------------------------------------------------------------------


def _new_node_layer() -> ClientNodeLayer:
    """The client's node layer, with the table of processes spawned from workers subscribed
    to its process deaths."""
    layer = ClientNodeLayer()
    NestedProcs(layer)  # subscribes itself: ``nested_procs(layer)`` finds it
    return layer


set_node_layer(_new_node_layer)  # hook H3: the client's node layer
set_host_resolver(_host_of)  # hook H4: ``ProcMesh.host_mesh``
set_nested_meshes(nested_meshes)  # the admin endpoint lists meshes actors spawned in workers
