"""A Lightning ``Trainer`` with DDP on a process mesh of 2 (``monarch.spmd.lightning``).

Each process runs one DDP rank in an actor; ``MeshEnvironment`` tells Lightning the ranks from
the mesh, ``setup_torch_elastic_env`` the rendezvous point. Prints the loss over the global
batch step by step, that the replicas ended equal, and the checkpoint's step
(``lightning_train.expected``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import lightning
import torch
from torch.utils.data import DataLoader, TensorDataset

from monarch.actor import Actor, endpoint, this_host
from monarch.spmd import setup_torch_elastic_env
from monarch.spmd.lightning import MeshEnvironment

STEPS = 4


class Model(lightning.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        mean = self.trainer.strategy.reduce(loss.detach(), reduce_op="mean")
        self.losses.append(round(float(mean), 4))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Trainer(Actor):
    @endpoint
    def fit(self, checkpoint: str) -> tuple[list[float], list[float]]:
        env = MeshEnvironment()  # ranks from this actor's place in the mesh
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
        data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
        trainer = lightning.Trainer(
            accelerator="cpu",
            strategy="ddp",
            devices=env.devices,  # processes per host: the mesh's last dimension
            num_nodes=env.num_nodes,  # hosts: the mesh's other dimensions
            plugins=[env],
            max_steps=STEPS,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            default_root_dir=str(Path(checkpoint).parent),
        )
        model = Model()
        trainer.fit(model, data)
        trainer.save_checkpoint(checkpoint)
        return model.losses, model.layer.weight.detach().flatten().tolist()


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        setup_torch_elastic_env(procs)  # Lightning makes the process group from it
        checkpoint = Path(tempfile.mkdtemp()) / "model.ckpt"
        trainers: Any = procs.spawn("trainer", Trainer)
        (losses, first), (_, second) = trainers.fit.call(str(checkpoint)).get(timeout=300).values()
        print("loss by step:", losses)
        print("replicas equal:", first == second)
        saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
        print("checkpoint step:", saved["global_step"])
    finally:
        procs.stop().get(timeout=60)


if __name__ == "__main__":
    main()
