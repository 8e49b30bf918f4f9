"""A torch.distributed process group over the processes of a mesh, living as long as the mesh.

``init_process_group(proc_mesh)`` spawns one :class:`ProcessGroupActor` per process; each sets
torchrun's environment and calls ``torch.distributed.init_process_group`` (every process's default
group, so any actor of the process can run collectives on it). The actor's ``__cleanup__``
destroys the group, so stopping the mesh (or :meth:`MeshProcessGroup.destroy`) tears it down.

Failures stay bounded: ``rendezvous_timeout`` bounds the start, ``timeout`` every collective
(gloo raises when it expires or a peer's connection breaks; nccl's watchdog aborts the process,
which its owner sees as a supervision event), so a dead rank surfaces as an error at the caller
and a supervision event at the owner instead of hanging the others.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from monarch.actor import Future, ProcMesh, endpoint
from monarch.spmd._actor import SPMDActor
from monarch.spmd._network import AddrType
from monarch.spmd._setup import check_master, rank_zero
from monarch.spmd._torch import require_torch

__all__ = ["MeshProcessGroup", "ProcessGroupActor", "init_process_group"]

logger = logging.getLogger(__name__)

#: The name the group's actors are spawned under.
ACTOR_NAME = "_SPMDProcessGroup"
#: What the client allows beyond ``timeout`` for the workers to import torch.
_IMPORT_ALLOWANCE_S = 120.0
_FEATURE = "monarch.spmd.init_process_group"


class ProcessGroupActor(SPMDActor):
    """One per process: makes and destroys that process's default torch.distributed group."""

    def __init__(self) -> None:
        super().__init__()
        self._created = False

    @endpoint
    def init_process_group(
        self,
        master_addr: str,
        master_port: int,
        backend: str | None,
        timeout: float,
        rendezvous_timeout: float,
    ) -> str:
        """Set torchrun's environment and join the group (collective: every rank at once).
        Returns the backend used: ``backend``, else nccl where CUDA is available, else gloo."""
        dist = require_torch(_FEATURE)
        import torch

        if dist.is_initialized():
            raise RuntimeError(
                f"process of rank {self.rank} already has a default process group"
                " (destroy it first: MeshProcessGroup.destroy() or"
                " torch.distributed.destroy_process_group())"
            )
        self._setup_env(master_addr, master_port)
        cuda = torch.cuda.is_available()
        chosen = backend or ("nccl" if cuda else "gloo")
        options: dict[str, Any] = {}
        if cuda and "nccl" in chosen:
            device = torch.device("cuda", self.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
            options["device_id"] = device
        logger.info(
            "rank %d/%d joins a %s process group at %s:%d (collective timeout %.1f s)",
            self.rank,
            self.world_size,
            chosen,
            master_addr,
            master_port,
            timeout,
        )
        # The store (rank 0 serves it) waits up to rendezvous_timeout for every rank to
        # connect; the group's own timeout bounds each collective after that.
        store = dist.TCPStore(
            host_name=master_addr,
            port=master_port,
            world_size=self.world_size,
            is_master=self.rank == 0,
            timeout=timedelta(seconds=rendezvous_timeout),
            wait_for_workers=True,
        )
        dist.init_process_group(
            backend=chosen,
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout),
            **options,
        )
        self._created = True
        return chosen

    @endpoint
    def state(self) -> dict[str, Any]:
        """This process's view: whether a default group exists, its backend, rank and size."""
        dist = require_torch(_FEATURE)
        if not dist.is_initialized():
            return {"initialized": False, "pid": os.getpid()}
        return {
            "initialized": True,
            "backend": str(dist.get_backend()),
            "rank": dist.get_rank(),
            "world_size": dist.get_world_size(),
            "pid": os.getpid(),
        }

    def __cleanup__(self, exc: BaseException | None) -> None:
        if not self._created:
            return
        self._created = False
        dist = require_torch(_FEATURE)
        if dist.is_initialized():
            dist.destroy_process_group()
            logger.info("rank %d destroyed its process group", self.rank)


@dataclass(frozen=True)
class MeshProcessGroup:
    """The process group of a mesh (see :func:`init_process_group`)."""

    proc_mesh: ProcMesh
    #: The ``ProcessGroupActor`` mesh that holds the group (one actor per process).
    actors: Any
    backend: str
    world_size: int
    master_addr: str
    master_port: int
    #: Seconds that bound every collective.
    timeout: float
    #: Seconds that bounded the rendezvous (every rank connecting to the store).
    rendezvous_timeout: float

    def destroy(self) -> Future[None]:
        """Destroy the group in every process (stopping its actors); the mesh lives on, and a
        new group may be made on it. Stopping the mesh does the same."""
        stopped: Future[None] = self.actors.stop("process group destroyed")
        return stopped


def init_process_group(
    proc_mesh: ProcMesh,
    *,
    backend: str | None = None,
    timeout: float = 60.0,
    rendezvous_timeout: float | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> MeshProcessGroup:
    """Make the default ``torch.distributed`` process group of every process of ``proc_mesh``,
    over exactly those processes, ranked as :class:`SPMDActor` ranks them (torchrun's
    environment is set too). Blocks until every rank joined.

    ``backend``: default nccl where the workers have CUDA, else gloo. ``timeout`` (seconds)
    bounds every collective: a rank that does not take part, or dies, makes the others' call
    raise within it instead of hanging. ``rendezvous_timeout`` (default: ``timeout``) bounds the
    wait for every rank to connect at the start. The rendezvous is at ``master_addr:master_port``
    (both or neither, ``ValueError``), by default the first process's host and a free port there.
    The group is destroyed when the mesh stops, or by :meth:`MeshProcessGroup.destroy`.

    Raises ``ActorError`` when a rank cannot join (an ``ImportError`` in it where the workers have
    no torch; a ``RuntimeError`` where a group already exists there).
    """
    check_master(master_addr, master_port)
    timeout = _seconds("timeout", timeout)
    rendezvous = (
        timeout
        if rendezvous_timeout is None
        else _seconds("rendezvous_timeout", rendezvous_timeout)
    )
    actors: Any = proc_mesh.spawn(ACTOR_NAME, ProcessGroupActor)
    bound = max(rendezvous, timeout) + _IMPORT_ALLOWANCE_S
    try:
        if master_addr is None:
            master_addr, master_port = (
                rank_zero(actors, proc_mesh).get_host_port.call_one(use_ipaddr).get(timeout=bound)
            )
        assert master_port is not None
        backends = set(
            actors.init_process_group.call(master_addr, master_port, backend, timeout, rendezvous)
            .get(timeout=bound)
            .values()
        )
    except BaseException:
        actors.stop("process group failed to form")  # ranks that joined destroy theirs
        raise
    if len(backends) != 1:
        actors.stop("process group has mixed backends")
        raise RuntimeError(f"the ranks chose different backends: {sorted(backends)}; pass one")
    (chosen,) = backends
    world_size = math.prod(proc_mesh.size(label) for label in proc_mesh._labels)
    logger.info(
        "%s process group of %d ranks at %s:%d", chosen, world_size, master_addr, master_port
    )
    return MeshProcessGroup(
        proc_mesh=proc_mesh,
        actors=actors,
        backend=chosen,
        world_size=world_size,
        master_addr=master_addr,
        master_port=master_port,
        timeout=timeout,
        rendezvous_timeout=rendezvous,
    )


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number of seconds: {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be positive and finite: {value!r}")
    return float(value)
