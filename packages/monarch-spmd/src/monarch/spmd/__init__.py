"""SPMD on Monarch meshes (``from monarch.spmd import SPMDActor, setup_torch_elastic_env``).

Run torchrun-style (Single Program, Multiple Data) training over a process mesh: every process
gets torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_*``, ``MASTER_ADDR``, ``MASTER_PORT``) computed from
its place in the mesh, the mesh's last dimension being the one within a host.

- :class:`SPMDActor`: sets the environment and runs a script or module as torchrun would.
- :func:`setup_torch_elastic_env` / :func:`setup_torch_elastic_env_async`: spawn it on a mesh and
  set the environment everywhere (rendezvous on the first process unless given).
- :func:`init_process_group`: a torch.distributed process group over the mesh's processes (gloo on
  CPU, nccl with CUDA), with bounded collective timeouts, destroyed when the mesh stops.
- :mod:`monarch.spmd.lightning` (the ``lightning`` extra): ``MeshEnvironment``, a Lightning cluster
  environment with the mesh's ranks, for ``Trainer(strategy="ddp")`` on a mesh.

Importing this module does not import torch; what needs torch says so when torch is missing.
"""

from __future__ import annotations

from monarch.spmd._actor import SPMDActor
from monarch.spmd._env import TorchrunRanks, torchrun_ranks
from monarch.spmd._group import MeshProcessGroup, ProcessGroupActor, init_process_group
from monarch.spmd._network import AddrType
from monarch.spmd._setup import setup_torch_elastic_env, setup_torch_elastic_env_async

__all__ = [
    "AddrType",
    "MeshProcessGroup",
    "ProcessGroupActor",
    "SPMDActor",
    "TorchrunRanks",
    "setup_torch_elastic_env",
    "setup_torch_elastic_env_async",
    "init_process_group",
    "torchrun_ranks",
]

for _public in (AddrType, MeshProcessGroup, ProcessGroupActor, SPMDActor, TorchrunRanks):
    _public.__module__ = __name__
del _public
