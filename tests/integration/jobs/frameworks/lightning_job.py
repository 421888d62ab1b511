"""A Lightning job that specon can move: a small regression network on synthetic data.

The model, the data and the ``Trainer`` are ordinary Lightning; what makes the job migratable
is the ``Migratable`` callback and ``fit`` (docs/integrations.md shows the same lines). The
train loader is a ``ResumableLoader`` so a stop mid-epoch resumes the epoch exactly.

    python lightning_job.py --steps 300 --out final.pt [--step-seconds 0.05] [--seed 0]

``--step-seconds`` sleeps in each training step: it stands in for a bigger model, giving
specon the time to see the loss converge and move the job. ``--out`` receives the final
``state_dict`` (``torch.save``), to compare with a run that was never moved.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import TensorDataset

from specon.checkpoint import atomic_write
from specon.integrations import lightning as specon_lightning
from specon.integrations.loader import ResumableLoader


class Regression(pl.LightningModule):
    def __init__(self, step_seconds: float = 0.0) -> None:
        super().__init__()
        self.step_seconds = step_seconds
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(self.step_seconds)
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)}


def train_data(seed: int) -> ResumableLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    return ResumableLoader(TensorDataset(x, y), batch_size=32, shuffle=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)  # the same arithmetic on every worker

    pl.seed_everything(args.seed)
    model = Regression(args.step_seconds)
    trainer = pl.Trainer(
        max_steps=args.steps,
        callbacks=[specon_lightning.Migratable()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    specon_lightning.fit(trainer, model, train_dataloaders=train_data(args.seed))
    save_state(model.state_dict(), args.out)


def save_state(state: dict[str, torch.Tensor], out: str) -> None:
    """Whole or absent (the tests read it once it exists: the job logs `finished` before)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(Path(out), buf.getvalue())


if __name__ == "__main__":
    main()
