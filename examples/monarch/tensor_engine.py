"""Distributed tensors (Monarch's tensor engine) on a 2-process CPU mesh.

Written against Meta's Monarch API only; runs unchanged under the reference ``torchmonarch``
and under this repository's ``monarch-actor`` + ``monarch-tensor``: torch operations issued
inside ``proc_mesh.activate()`` run on every process, shapes are known on the client at once,
values come back with ``fetch_shard``/``inspect``, ``remote`` functions run on every shard, and a
failure inside one surfaces at the fetch. (Collectives are not here: the reference's ``reduce``
does not run on CPU.)
"""

from __future__ import annotations

import torch

from monarch import fetch_shard, get_active_mesh, get_active_stream, inspect, no_mesh, remote
from monarch.actor import this_host


def plus_hundred(x: torch.Tensor) -> torch.Tensor:
    return x + 100


def boom(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("boom inside")


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    with procs.activate():
        print("mesh dims:", get_active_mesh().names)
        print("stream:", get_active_stream())
        a = torch.arange(6.0).reshape(2, 3)
        w = torch.ones(3, 2) * 0.5
        y = torch.relu(a @ w - 1)
        print("type:", type(y).__name__, "shape:", tuple(y.shape), "dtype:", y.dtype)
        for gpu in range(2):
            print(f"gpus={gpu}:", fetch_shard(y, gpus=gpu).get().tolist())
        print("inspect:", inspect(y.sum(dim=0)).tolist())
        try:
            a @ torch.ones(2, 2)
        except RuntimeError as error:
            print("client-side shape error:", error)
        z = remote(plus_hundred, propagate=lambda x: x)(a)
        print("remote:", fetch_shard(z, gpus=1).get().tolist())
        bad = remote(boom, propagate=lambda x: x)(a)
        later = bad * 2
        for t in (bad, later):
            try:
                fetch_shard(t, gpus=0).get()
            except Exception as error:
                print("fetch failed:", "boom inside" in str(error))
        print("still working:", fetch_shard(a + 1, gpus=0).get().tolist())
        with no_mesh.activate():
            local = torch.ones(2) * 3
            print("no_mesh:", type(local).__name__, local.tolist())
    procs.stop().get()


if __name__ == "__main__":
    main()
