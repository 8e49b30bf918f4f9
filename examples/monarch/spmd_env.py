"""torchrun's environment on every process of a mesh (``monarch.spmd``), for several shapes.

Written against Meta's Monarch API only; runs unchanged under the reference ``torchmonarch``
and under this repository's ``monarch-actor`` + ``monarch-spmd``: the variables each process
gets must be the same.
"""

from __future__ import annotations

import os
import socket

from monarch.actor import Actor, endpoint, this_host
from monarch.spmd import setup_torch_elastic_env

NAMES = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
]


class Env(Actor):
    @endpoint
    def env(self) -> str:
        return " ".join(f"{name}={os.environ.get(name)}" for name in NAMES)

    @endpoint
    def master(self) -> tuple[bool, bool]:
        port = int(os.environ["MASTER_PORT"])
        return os.environ["MASTER_ADDR"] == socket.gethostname(), 0 < port < 65536


def main() -> None:
    for per_host in ({"gpus": 2}, {"hosts": 2, "gpus": 3}, {"x": 2, "y": 1, "z": 2}):
        procs = this_host().spawn_procs(per_host=per_host)
        setup_torch_elastic_env(procs, "localhost", 29512)
        for line in procs.spawn("env", Env).env.call().get().values():
            print(f"{per_host}: {line}")
        setup_torch_elastic_env(procs)  # the rendezvous on the first process: host, free port
        print(
            f"{per_host}: auto master", set(procs.spawn("auto", Env).master.call().get().values())
        )
        procs.stop().get()


if __name__ == "__main__":
    main()
