"""Lightning on process meshes: a cluster environment that takes its ranks from the mesh.

Needs the ``lightning`` extra (``pip install 'monarch-spmd[lightning]'``). Inside an actor spawned
on a process mesh, after :func:`monarch.spmd.setup_torch_elastic_env` (or
:func:`monarch.spmd.init_process_group`) gave the processes their rendezvous point::

    env = MeshEnvironment()
    trainer = lightning.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=env.devices,
        num_nodes=env.num_nodes,
        plugins=[env],
    )

Lightning then runs one DDP rank per process of the mesh, creating no processes of its own.
"""

from __future__ import annotations

import os

from monarch.actor import context
from monarch.spmd._env import ROLE_NAME, TorchrunRanks, torchrun_ranks

try:
    from lightning.fabric.plugins.environments import ClusterEnvironment
except ImportError as _error:
    raise ImportError(
        f"monarch.spmd.lightning needs Lightning, which cannot be imported here ({_error});"
        " install it with: pip install 'monarch-spmd[lightning]'"
    ) from _error

__all__ = ["MeshEnvironment"]


def _spawn_ranks() -> TorchrunRanks:
    """The ranks of the running actor's spawn position (not of the slice that sent the message
    being handled, as ``current_rank()`` would be); the client's is a world of one."""
    point = context().actor_instance.rank
    return torchrun_ranks(point.rank, dict(point), dict(point.extent))


class MeshEnvironment(ClusterEnvironment):  # type: ignore[misc]
    """A Lightning ``ClusterEnvironment`` whose ranks are the process's place in its mesh.

    ``ranks``: default the spawn position of the actor that makes it (``global_rank`` is the
    linear rank, ``local_rank`` the coordinate along the mesh's last dimension, ``node_rank`` the
    host's number), computed as :class:`monarch.spmd.SPMDActor` computes them. The rendezvous
    point is ``main_address``/``main_port`` if given, else ``MASTER_ADDR``/``MASTER_PORT`` from
    the environment (``RuntimeError`` if unset: run ``setup_torch_elastic_env`` first). The mesh
    creates the processes, so Lightning does not (``creates_processes_externally``).
    """

    def __init__(
        self,
        ranks: TorchrunRanks | None = None,
        main_address: str | None = None,
        main_port: int | None = None,
    ) -> None:
        super().__init__()
        self._ranks = ranks if ranks is not None else _spawn_ranks()
        if main_address is not None or main_port is not None:
            if main_address is None or main_port is None:
                raise ValueError("give both main_address and main_port or neither")
            self._ranks.variables(main_address, main_port)  # validates them
        self._main_address = main_address
        self._main_port = main_port

    @property
    def ranks(self) -> TorchrunRanks:
        return self._ranks

    @property
    def devices(self) -> int:
        """``Trainer(devices=...)``: the processes per host (the mesh's last dimension)."""
        return self._ranks.local_world_size

    @property
    def num_nodes(self) -> int:
        """``Trainer(num_nodes=...)``: the hosts (groups) of the mesh."""
        return self._ranks.group_world_size

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        if self._main_address is not None:
            return self._main_address
        return self._from_environment("MASTER_ADDR")

    @property
    def main_port(self) -> int:
        if self._main_port is not None:
            return self._main_port
        return int(self._from_environment("MASTER_PORT"))

    @staticmethod
    def _from_environment(name: str) -> str:
        value = os.environ.get(name)
        if not value:
            raise RuntimeError(
                f"{name} is not set in this process: run monarch.spmd.setup_torch_elastic_env"
                " (or init_process_group) on the mesh first, or pass main_address and main_port"
            )
        return value

    @staticmethod
    def detect() -> bool:
        """True in a process whose environment monarch.spmd set (``ROLE_NAME=rank`` with the
        torchrun variables); torchrun itself sets ``ROLE_NAME=default``."""
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        return os.environ.get("ROLE_NAME") == ROLE_NAME and all(n in os.environ for n in names)

    def world_size(self) -> int:
        return self._ranks.world_size

    def set_world_size(self, size: int) -> None:
        """Lightning sets ``num_nodes * devices``: it must be the mesh's size (``ValueError``
        otherwise, as the data would be sharded for a different world)."""
        if size != self._ranks.world_size:
            raise ValueError(
                f"the Trainer's world of {size} processes does not match the mesh of"
                f" {self._ranks.world_size} (use devices=env.devices, num_nodes=env.num_nodes)"
            )

    def global_rank(self) -> int:
        return self._ranks.rank

    def set_global_rank(self, rank: int) -> None:
        """Lightning sets ``node_rank * devices + local_rank``: it must be the mesh rank."""
        if rank != self._ranks.rank:
            raise ValueError(
                f"the Trainer's global rank {rank} does not match the mesh rank"
                f" {self._ranks.rank} (use devices=env.devices, num_nodes=env.num_nodes)"
            )

    def local_rank(self) -> int:
        return self._ranks.local_rank

    def node_rank(self) -> int:
        return self._ranks.group_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        if (num_devices, num_nodes) != (self.devices, self.num_nodes):
            raise ValueError(
                f"Trainer(devices={num_devices}, num_nodes={num_nodes}) does not match the mesh:"
                f" {self.devices} processes per host on {self.num_nodes} hosts"
                " (use devices=env.devices, num_nodes=env.num_nodes)"
            )
