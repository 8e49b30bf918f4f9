"""A tensor worker killed in the middle of a sequence: the client gets a clear error for that
process, the other process goes on, and the mesh can still be stopped."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import torch

import monarch.actor
from monarch.actor import MeshFailure, SupervisionError, this_host
from monarch.tensor import fetch_shard, no_mesh, remote

sys.path.insert(0, str(Path(__file__).parent))  # workers import tensor_helpers by name
from tensor_helpers import pid_of

T = 60.0


def test_a_killed_worker_fails_its_fetches_and_the_mesh_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The death is also a supervision event for the client (the default hook would exit): kept
    # here; whether it arrives before the mesh is stopped is the supervision tests' business.
    failures: list[MeshFailure] = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", failures.append)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        with procs.activate():
            pid = remote(pid_of, propagate=lambda x: torch.tensor(0))(torch.ones(1))
            victim = int(fetch_shard(pid, gpus=1).get(timeout=T))
            a = torch.ones(3)
            os.kill(victim, signal.SIGKILL)
            b = a + 1
            with pytest.raises(SupervisionError, match=r"tensor_engine_workers\.fetch"):
                fetch_shard(b, gpus=1).get(timeout=T)
            survivor = fetch_shard(b, gpus=0).get(timeout=T)
            with no_mesh.activate():
                assert torch.equal(survivor, torch.full((3,), 2.0))
    finally:
        procs.stop().get(timeout=T)
