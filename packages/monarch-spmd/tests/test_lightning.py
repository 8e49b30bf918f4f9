"""A Lightning ``Trainer`` with DDP on a process mesh: two processes train a tiny model, checkpoint,
and end where single-process training on the same global batches ends."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import torch

from monarch.actor import ActorError, ProcMesh, attach_to_workers, this_host
from monarch.actor._runtime.client import client
from monarch.spmd import TorchrunRanks, setup_torch_elastic_env, torchrun_ranks
from monarch.spmd.lightning import MeshEnvironment

sys.path.insert(0, str(Path(__file__).parent))  # workers import lightning_actors by name
from lightning_actors import LightningTrainer, dataset, initial_model

T = 300.0
STEPS = 6
GLOBAL_BATCH = 8
LR = 0.05


@pytest.fixture(scope="module")
def trainers() -> Iterator[Any]:
    """Two worker processes with torchrun's environment, shared by the module's tests."""
    procs: ProcMesh = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        setup_torch_elastic_env(procs)
        yield procs.spawn("trainer", LightningTrainer)
    finally:
        procs.stop().get(timeout=T)


def _single_process(
    batches: list[list[int]],
) -> tuple[list[float], torch.Tensor, torch.Tensor]:
    """The reference: a plain torch loop over the same global batches, in this process."""
    model = initial_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    x, y, _ = dataset().tensors
    losses: list[float] = []
    for batch in batches:
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        losses.append(float(loss.detach()))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return losses, model.weight.detach().flatten(), model.bias.detach().flatten()


def test_ddp_over_two_processes_matches_single_process_training(
    trainers: Any, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "model.ckpt"
    results = trainers.fit.call(STEPS, GLOBAL_BATCH, LR, str(checkpoint)).get(timeout=T).values()
    assert [(r["rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in results] == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]
    _matches_single_process(results, checkpoint)


def _matches_single_process(results: list[dict[str, Any]], checkpoint: Path) -> None:
    # each rank trained on its own half of every global batch (Lightning's distributed sampler,
    # shuffled), and every epoch went over the whole data set once
    batches: list[list[int]] = []
    for step in range(STEPS):
        halves = [r["batches"][step] for r in results]
        assert [len(h) for h in halves] == [GLOBAL_BATCH // 2] * 2
        assert not set(halves[0]) & set(halves[1])
        batches.append(halves[0] + halves[1])
    per_epoch = len(dataset()) // GLOBAL_BATCH
    first_epoch = sorted(i for batch in batches[:per_epoch] for i in batch)
    assert first_epoch == list(range(len(dataset())))
    losses, weight, bias = _single_process(batches)
    assert losses[-1] < losses[0]  # it trains
    for r in results:  # the same model on every rank, the single-process one
        assert r["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
        assert r["weight"] == pytest.approx(weight.tolist(), rel=1e-5, abs=1e-6)
        assert r["bias"] == pytest.approx(bias.tolist(), rel=1e-5, abs=1e-6)
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert saved["global_step"] == STEPS
    assert saved["state_dict"]["layer.weight"].flatten().tolist() == pytest.approx(
        weight.tolist(), rel=1e-5, abs=1e-6
    )


def test_a_trainer_not_matching_the_mesh_is_refused(trainers: Any) -> None:
    with pytest.raises(ActorError, match="does not match the mesh"):
        trainers.slice(gpus=0).mismatched_trainer.call_one().get(timeout=T)


def test_the_environment_reports_the_ranks_it_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = torchrun_ranks(5, {"hosts": 1, "gpus": 2}, {"hosts": 2, "gpus": 3})
    env = MeshEnvironment(ranks, "node0", 29400)
    assert env.ranks == ranks
    assert env.creates_processes_externally
    assert (env.main_address, env.main_port) == ("node0", 29400)
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (6, 5, 2, 1)
    assert (env.devices, env.num_nodes) == (3, 2)
    env.set_global_rank(5)  # Lightning sets what it computed: it must be the mesh's
    env.set_world_size(6)
    with pytest.raises(ValueError, match="does not match the mesh"):
        env.set_world_size(7)
    with pytest.raises(ValueError, match="does not match the mesh"):
        env.set_global_rank(4)
    assert (env.global_rank(), env.world_size()) == (5, 6)
    env.validate_settings(3, 2)
    with pytest.raises(ValueError, match="does not match the mesh"):
        env.validate_settings(6, 1)
    with pytest.raises(ValueError, match="both main_address and main_port"):
        MeshEnvironment(ranks, "node0")


def test_the_rendezvous_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    env = MeshEnvironment(TorchrunRanks(0, 0, 1, 1, 0, 1))
    for name in ("MASTER_ADDR", "MASTER_PORT", "ROLE_NAME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="setup_torch_elastic_env"):
        _ = env.main_address
    assert not MeshEnvironment.detect()
    for name, value in TorchrunRanks(0, 0, 1, 1, 0, 1).variables("h", 1234).items():
        monkeypatch.setenv(name, value)
    assert (env.main_address, env.main_port) == ("h", 1234)
    assert MeshEnvironment.detect()
    monkeypatch.setenv("ROLE_NAME", "default")  # torchrun's own
    assert not MeshEnvironment.detect()


def test_outside_an_actor_the_environment_is_a_world_of_one() -> None:
    env = MeshEnvironment()
    assert (env.world_size(), env.global_rank(), env.devices, env.num_nodes) == (1, 0, 1, 1)


class _WorkerLoop:
    """A host started on its own (``run_worker_loop_forever`` as ``python -m
    monarch.actor._attach``) on loopback, with the client's cluster CA; ``address`` is what it
    printed."""

    def __init__(self) -> None:
        ca_dir = client().node_layer.cluster_ca_dir
        assert ca_dir is not None
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        command = [
            sys.executable,
            "-m",
            "monarch.actor._attach",
            "--address",
            "udp://127.0.0.1:0",
            "--ca",
            str(ca_dir),
        ]
        self.popen = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)
        assert self.popen.stdout is not None
        ready, _, _ = select.select([self.popen.stdout], [], [], 60)
        self.address = self.popen.stdout.readline().decode().strip() if ready else ""

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(60)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def test_ddp_across_two_attached_hosts_matches_single_process_training(tmp_path: Path) -> None:
    """Two hosts attached with ``attach_to_workers`` (worker loops on loopback), one process
    each: Lightning runs with ``num_nodes=2``, ``devices=1``, node ranks from the mesh."""
    loops = [_WorkerLoop(), _WorkerLoop()]
    try:
        assert all(loop.address.startswith("udp://127.0.0.1:") for loop in loops)
        hosts = attach_to_workers(workers=[loop.address for loop in loops], name="two_hosts")
        procs = hosts.spawn_procs(per_host={"gpus": 1})
        try:
            setup_torch_elastic_env(procs, "127.0.0.1", _free_port())
            trainer: Any = procs.spawn("trainer", LightningTrainer)
            checkpoint = tmp_path / "model.ckpt"
            results = (
                trainer.fit.call(STEPS, GLOBAL_BATCH, LR, str(checkpoint)).get(timeout=T).values()
            )
            assert [
                (r["rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in results
            ] == [(0, 0, 0, 2), (1, 0, 1, 2)]
            _matches_single_process(results, checkpoint)
        finally:
            procs.stop().get(timeout=T)
            hosts.shutdown().get(timeout=T)
    finally:
        for loop in loops:
            loop.close()


def _free_port() -> int:
    from monarch.spmd._network import find_free_port

    return find_free_port()
