"""``setup_torch_elastic_env``: spawn ``SPMDActor`` on a mesh and set torchrun's environment."""

from __future__ import annotations

import logging
from typing import Any

from monarch.actor import ProcMesh
from monarch.spmd._actor import SPMDActor
from monarch.spmd._network import AddrType

__all__ = ["setup_torch_elastic_env", "setup_torch_elastic_env_async"]

logger = logging.getLogger(__name__)

#: The name the actors are spawned under (Monarch's).
ACTOR_NAME = "_SPMDActor"


def check_master(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise ValueError(
            "Either both master_addr and master_port must be specified or neither must be"
            f" specified (got master_addr={master_addr!r}, master_port={master_port!r})"
        )


def rank_zero(actors: Any, proc_mesh: ProcMesh) -> Any:
    return actors.slice(**dict.fromkeys(proc_mesh._labels, 0))


def setup_torch_elastic_env(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """Set torchrun's environment variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...) in
    every process of ``proc_mesh``, so code there can ``torch.distributed.init_process_group()``
    from the environment.

    Without ``master_addr``/``master_port`` the rendezvous is on the mesh's first process
    (every coordinate 0): its host name (or its address of ``use_ipaddr``'s family) and a port
    free there. Give both or neither (``ValueError``).
    """
    check_master(master_addr, master_port)
    actors: Any = proc_mesh.spawn(ACTOR_NAME, SPMDActor)
    if master_addr is None:
        master_addr, master_port = (
            rank_zero(actors, proc_mesh).get_host_port.call_one(use_ipaddr).get()
        )
    logger.info(
        "torch elastic environment: MASTER_ADDR=%s MASTER_PORT=%s", master_addr, master_port
    )
    actors.setup_env.call(master_addr, master_port).get()


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: AddrType | None = None,
) -> None:
    """:func:`setup_torch_elastic_env` for ``async`` code (awaits instead of blocking)."""
    check_master(master_addr, master_port)
    actors: Any = proc_mesh.spawn(ACTOR_NAME, SPMDActor)
    if master_addr is None:
        master_addr, master_port = await rank_zero(actors, proc_mesh).get_host_port.call_one(
            use_ipaddr
        )
    logger.info(
        "torch elastic environment: MASTER_ADDR=%s MASTER_PORT=%s", master_addr, master_port
    )
    await actors.setup_env.call(master_addr, master_port)
