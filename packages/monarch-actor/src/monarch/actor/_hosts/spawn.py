"""Bringing up the processes of one ``spawn_procs``: start them, then run the owner's setup.

Why a module of its own: the client's own spawns (``host_mesh.HostMesh.spawn_procs``), the
spawns the host agent serves for workers (``nested.NestedProcs.spawn``) and a worker's own
request (``agent.spawn_from_worker``) share it. ``start_group`` starts the processes of one
call, on this host (a ``LocalWorkerGroup``) or on attached hosts (``spawn_on_hosts``), after
starting the client's node; it does not start the host agent (``HostMesh.spawn_procs`` does,
after its first group, so that the zygote is forked before the agent's thread exists).
``bring_up`` runs a start on a thread of its own and resolves the mesh's pending state;
``run_setup`` runs the owner's ``bootstrap`` and ``cpus`` binding on the new processes through
a ``ProcSetup`` actor (the reference's ``SetupActor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from monarch.actor._base.actor import Actor
from monarch.actor._base.endpoint import endpoint
from monarch.actor._base.ids import ProcId
from monarch.actor._base.shape import Extent, Shape
from monarch.actor._hosts.attach_session import spawn_on_hosts
from monarch.actor._hosts.commands import SETUP_TIMEOUT, BootstrapCommand, _SpawnOptions, bind_cpus
from monarch.actor._hosts.groups import LocalWorkerGroup, WorkerGroup
from monarch.actor._mesh.meshes import (
    ProcMesh,
    _forget,
    _ProcMeshState,
)
from monarch.actor._runtime.context import (
    context,
)

if TYPE_CHECKING:
    from monarch.actor._hosts.attach_session import HostSession
    from monarch.actor._runtime.client import (
        _Client,
    )

__all__ = ["ProcSetup", "bring_up", "run_setup", "start_group"]


def start_group(
    client: _Client,
    sessions: Sequence[HostSession] | None,
    extent: Extent,
    local: Extent,
    mesh_name: str,
    *,
    group: LocalWorkerGroup | None = None,
    commands: Sequence[BootstrapCommand | None] | None = None,
    numactl: Sequence[Sequence[str]] | None = None,
) -> WorkerGroup:
    """Start the processes of one ``spawn_procs``: ``local`` on this host (``sessions`` is
    None; into ``group`` when given) or on every host of ``sessions`` (``extent``: the host
    dimensions, then ``local``). ``commands`` and ``numactl``: per rank, this host only."""
    layer = client.node_layer
    parent, authority, ca_dir = layer.ensure_started(client)
    if sessions is None:
        labels = [f"{mesh_name}{p}" for p in local.points()]
        local_group = group or LocalWorkerGroup(labels, layer.process_died, layer.current_watchdog)
        with layer._lock:
            if layer.closed:  # shut down since ensure_started: it would never kill the group
                raise RuntimeError("the client runtime was shut down")
            layer.groups.append(local_group)
        local_group.start(parent, authority, ca_dir, commands=commands, numactl=numactl)
        return local_group
    return spawn_on_hosts(
        layer, sessions, extent, local, mesh_name, commands=commands, numactl=numactl
    )


def run_setup(procs: Sequence[ProcId], shape: Shape, name: str, options: _SpawnOptions) -> None:
    """Run the owner's setup on every new process (``ProcSetup``), as the calling
    actor (or client); ``ActorError`` if ``bootstrap`` raised on a process."""
    mesh = ProcMesh(procs, shape, owned=False, name=name)
    setup: Any = mesh._spawn("setup", f"monarch-setup-{uuid.uuid4().hex[:12]}", ProcSetup, (), {})
    _forget(setup)
    future = setup.setup.call(options.bootstrap, options.cpus)
    try:
        future.get(timeout=SETUP_TIMEOUT)
    except TimeoutError:
        raise RuntimeError(
            f"the bootstrap of proc mesh {name!r} did not finish within {SETUP_TIMEOUT:.0f} s"
        ) from None


def bring_up(
    state: _ProcMeshState,
    shape: Shape,
    name: str,
    start: Callable[[], list[ProcId]],
    options: _SpawnOptions,
    cleanup: Callable[[], None],
) -> None:
    """Start the processes of one ``spawn_procs`` on a thread of its own (in the caller's
    context: the setup is sent as the owner) and resolve ``state.ready``: with the process
    ids once ``start()`` returned and the setup ran, or with the error, after ``cleanup()``
    ended whatever had started. Every step is bounded, so ``ready`` always resolves."""
    ready = state.ready
    assert ready is not None
    context = contextvars.copy_context()

    def run() -> None:
        try:
            procs = tuple(start())
            if options.needs_setup and not state.stopped:
                run_setup(procs, shape, name, options)
        except BaseException as exc:  # every outcome resolves ``ready``
            with contextlib.suppress(Exception):
                cleanup()
            ready.set_exception(exc)
        else:
            ready.set_result(procs)

    threading.Thread(
        target=context.run, args=(run,), name="monarch-spawn-procs", daemon=True
    ).start()


class ProcSetup(Actor):
    """Runs the owner's setup on each new process of a ``spawn_procs`` before its mesh is
    ready (the reference's ``SetupActor``): the ``cpus`` binding, then ``bootstrap``. A
    ``bootstrap`` that raises reaches the owner as ``ActorError`` (through this call), which
    fails the mesh's ``initialized``."""

    @endpoint
    def setup(
        self, bootstrap: Callable[[], Any] | None, cpus: Sequence[Sequence[int] | None] | None
    ) -> None:
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
