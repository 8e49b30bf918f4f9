"""A tiny regression trained with Lightning DDP inside actors (the workers import this by name).

The data and the initial model are shared with the single-process reference of the test; the
training loops are not (Lightning's here, a plain torch loop there)."""

from __future__ import annotations

from typing import Any

import lightning
import torch
from torch.utils.data import DataLoader, TensorDataset

from monarch.actor import Actor, endpoint

FEATURES = 4
SAMPLES = 32


def dataset() -> TensorDataset:
    """``(x, y, index)``: a noisy linear target, the same on every process."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    w = torch.tensor([[1.5], [-2.0], [0.5], [3.0]])
    y = x @ w + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(x, y, torch.arange(SAMPLES))


def initial_model() -> torch.nn.Linear:
    torch.manual_seed(7)
    return torch.nn.Linear(FEATURES, 1)


class Regression(lightning.LightningModule):  # type: ignore[misc]
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.layer = initial_model()
        self.lr = lr
        self.losses: list[float] = []  # the loss over the global batch, step by step
        self.batches: list[list[int]] = []  # the samples this rank trained on, step by step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y, index = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        mean = self.trainer.strategy.reduce(loss.detach(), reduce_op="mean")
        self.losses.append(float(mean))
        self.batches.append([int(i) for i in index])
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class LightningTrainer(Actor):
    @endpoint
    def fit(self, steps: int, global_batch: int, lr: float, checkpoint: str) -> dict[str, Any]:
        from monarch.spmd.lightning import MeshEnvironment

        env = MeshEnvironment()
        model = Regression(lr)
        loader = DataLoader(dataset(), batch_size=global_batch // env.world_size(), shuffle=False)
        trainer = lightning.Trainer(
            accelerator="cpu",
            strategy="ddp",
            devices=env.devices,
            num_nodes=env.num_nodes,
            plugins=[env],
            max_steps=steps,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            default_root_dir=checkpoint + ".d",
        )
        trainer.fit(model, loader)
        trainer.save_checkpoint(checkpoint)
        return {
            "rank": trainer.global_rank,
            "local_rank": trainer.local_rank,
            "node_rank": trainer.node_rank,
            "world_size": trainer.world_size,
            "losses": model.losses,
            "batches": model.batches,
            "weight": model.layer.weight.detach().flatten().tolist(),
            "bias": model.layer.bias.detach().flatten().tolist(),
        }

    @endpoint
    def mismatched_trainer(self) -> None:
        from monarch.spmd.lightning import MeshEnvironment

        env = MeshEnvironment()
        lightning.Trainer(
            accelerator="cpu",
            strategy="ddp",
            devices=env.devices + 1,
            num_nodes=env.num_nodes,
            plugins=[env],
            logger=False,
        )
