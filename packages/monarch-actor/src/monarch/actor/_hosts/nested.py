"""The client's table of processes spawned from inside workers (``NestedProcs``).

Why the client spawns every process: in the reference Monarch the processes an actor spawns
with ``this_host().spawn_procs`` (or on a host mesh it was handed) are started by the host's
agent, which for the client's own host lives in the client, so they are OS children of the
client, not of the spawning worker. Here too: a worker never forks; the client's host agent
(``agent``) serves its request and this table starts the processes exactly as a client spawn
does (``spawn.start_group``), joined under the client's node.

Ownership is the spawning actor's; the client remembers which process asked for which group:
when that process exits (killed, crashed or stopped), every group it still owns is SIGKILLed
at once, so children never outlive their parent, also under ``kill -9``, and the rule applies
again one level down. The table learns of exits as an observer of the client's node layer
(``ClientNodeLayer.observe``), subscribed when the layer is made (``host_mesh``).

Bounds: ``MAX_SPAWN_DEPTH`` levels of processes below the client, ``MAX_NESTED_PROCS`` processes
spawned from workers alive at once, ``MAX_REQUESTS_IN_FLIGHT`` requests being served (each
spawn is at most 1 024 processes, as on the client), ``MAX_HOST_TOKENS`` attached host meshes
handed to actors. Exceeding one is a ``RuntimeError`` for the spawning actor that says which
bound.

Where the processes go (as in the reference): ``this_host()`` in a worker is the host of that
worker (the client's host for local workers, the attached host for workers of an attached
host); a host mesh passed to an actor keeps meaning the hosts it named at the client
(``this_host()`` of the client, or a slice of an attached host mesh: this table keeps a token ->
host sessions map for attached host meshes that were pickled).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from chrysalis.core import Pid
from monarch.actor._base.future import Future
from monarch.actor._base.ids import ProcId
from monarch.actor._base.shape import Extent, Shape
from monarch.actor._hosts.attach_session import HostSession, RemoteWorkerGroup
from monarch.actor._hosts.client_node import ClientNodeLayer
from monarch.actor._hosts.commands import BootstrapCommand
from monarch.actor._hosts.groups import WorkerGroup
from monarch.actor._hosts.spawn import start_group
from monarch.actor._mesh.meshes import (
    ProcMesh,
    _ProcMeshState,
)
from monarch.actor._runtime.client import current_client

if TYPE_CHECKING:
    from monarch.actor._runtime.client import (
        _Client,
    )

__all__ = [
    "MAX_HOST_TOKENS",
    "MAX_NESTED_PROCS",
    "MAX_REQUESTS_IN_FLIGHT",
    "MAX_SPAWN_DEPTH",
    "nested_meshes",
    "NestedProcs",
    "nested_procs",
]

#: Levels of processes below the client (its own workers are level 1).
MAX_SPAWN_DEPTH: Final = 8
#: Processes spawned from inside workers that may run at once.
MAX_NESTED_PROCS: Final = 1024
#: Spawn and stop requests the agent serves at once (more are refused, not queued).
MAX_REQUESTS_IN_FLIGHT: Final = 64
#: Host meshes of attached hosts that may be handed to actors (pickled) per client.
MAX_HOST_TOKENS: Final = 1024
_DEAD_REMEMBERED: Final = 4096


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
        """A table for ``layer``, subscribed to its process deaths (``observe``)."""
        self._layer = layer
        self._lock = threading.Lock()
        self._groups: dict[str, _Nested] = {}
        self._by_owner: dict[bytes, set[str]] = {}
        self._depth: dict[bytes, int] = {}
        self._dead: OrderedDict[bytes, None] = OrderedDict()
        self._hosts: dict[str, list[HostSession]] = {}
        self._in_flight = 0
        layer.observe(self)

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
        group = start_group(
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

    def meshes(self) -> list[tuple[ProcMesh, str]]:
        """The groups spawned for workers, as proc meshes, each with the label of the process
        that asked for it (its PID's first 8 hex digits once that process is gone)."""
        with self._lock:
            nested = list(self._groups.values())
        with self._layer._lock:
            groups = list(self._layer.groups)
        labels = {
            pid.raw: label
            for group in groups
            for pid, label in zip(group.pids, group.labels, strict=False)
        }
        return [(n.mesh, labels.get(n.owner, n.owner.hex()[:8])) for n in nested]

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


def nested_procs(layer: ClientNodeLayer) -> NestedProcs:
    """The table of ``layer`` (made with it, see ``host_mesh``)."""
    return layer.observer(NestedProcs)


def nested_meshes() -> list[tuple[ProcMesh, str]]:
    """The current client's process groups spawned for workers, with their owners' labels
    (``NestedProcs.meshes``; none without a client): what the admin endpoint lists besides
    the client's own meshes (``_mesh.admin.set_nested_meshes``)."""
    current = current_client()
    if current is None:
        return []
    try:
        return nested_procs(current.node_layer).meshes()
    except LookupError:
        return []
