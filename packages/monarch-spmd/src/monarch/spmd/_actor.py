"""``SPMDActor``: torchrun's environment on every process of a mesh, and scripts run under it."""

from __future__ import annotations

import logging
import os
import runpy
import socket
import sys

from monarch.actor import Actor, current_rank, current_size, endpoint
from monarch.spmd._env import TorchrunRanks, torchrun_ranks
from monarch.spmd._network import AddrType, find_free_port, get_ipaddr

__all__ = ["SPMDActor"]

logger = logging.getLogger(__name__)


class SPMDActor(Actor):
    """Sets torchrun's environment variables in its process and runs SPMD scripts there.

    Spawned on a process mesh (one actor per process), it takes its ranks from the spawn
    position (``current_rank()``/``current_size()``): ``RANK`` is the linear rank,
    ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` the coordinate along and size of the mesh's last
    dimension, ``GROUP_RANK``/``GROUP_WORLD_SIZE`` the host number and count, ``ROLE_RANK``,
    ``ROLE_WORLD_SIZE`` and ``ROLE_NAME`` (``"rank"``) as Monarch sets them; ``MASTER_ADDR`` and
    ``MASTER_PORT`` come with the call (see :func:`monarch.spmd.setup_torch_elastic_env`).
    """

    def __init__(self) -> None:
        super().__init__()
        point = current_rank()
        self.ranks: TorchrunRanks = torchrun_ranks(point.rank, dict(point), current_size())

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def local_rank(self) -> int:
        return self.ranks.local_rank

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    @property
    def local_world_size(self) -> int:
        return self.ranks.local_world_size

    @property
    def group_rank(self) -> int:
        return self.ranks.group_rank

    @property
    def group_world_size(self) -> int:
        return self.ranks.group_world_size

    def _setup_env(self, master_addr: str, master_port: int) -> dict[str, str]:
        variables = self.ranks.variables(master_addr, master_port)
        os.environ.update(variables)
        logger.debug("torchrun environment of rank %d: %s", self.ranks.rank, variables)
        return variables

    @endpoint
    def get_host_port(self, use_ipaddr: AddrType | None = None) -> tuple[str, int]:
        """This host's name (or, with ``use_ipaddr``, its address of that family) and a port
        free on it now: the rendezvous point when this is rank 0."""
        hostname = socket.gethostname()
        port = find_free_port()
        if use_ipaddr is None:
            return hostname, port
        return get_ipaddr(hostname, port, use_ipaddr), port

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set the torchrun environment variables of this process (``os.environ``)."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set the environment, then run a script as ``__main__`` the way torchrun would.

        ``script_args`` is ``["-m", module, *args]`` for a module or ``[path, *args]`` for a
        script file; ``sys.argv`` becomes ``[module or path, *args]``. Returns True once the
        script returned or exited with status 0 (``sys.exit(0)``); a non-zero exit status is a
        ``RuntimeError`` and what the script raises reaches the caller as itself (an
        ``ActorError`` wrapping it). ``ValueError`` when no script or module is given.
        """
        if not script_args:
            raise ValueError("No script or module specified: script_args is empty")
        if script_args[0] == "-m" and len(script_args) < 2:
            raise ValueError("No module specified after '-m'")
        self._setup_env(master_addr, master_port)
        try:
            self._run(script_args)
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise RuntimeError(
                    f"{' '.join(script_args)} exited with status {exit_.code!r} on rank"
                    f" {self.ranks.rank}"
                ) from None
        return True

    def _run(self, script_args: list[str]) -> None:
        if script_args[0] == "-m":
            module_name = script_args[1]
            sys.argv = [module_name, *script_args[2:]]
            logger.info("rank %d runs module %s", self.ranks.rank, module_name)
            runpy.run_module(module_name, run_name="__main__", alter_sys=True)
        else:
            script_path = script_args[0]
            sys.argv = list(script_args)
            logger.info("rank %d runs script %s", self.ranks.rank, script_path)
            runpy.run_path(script_path, run_name="__main__")
