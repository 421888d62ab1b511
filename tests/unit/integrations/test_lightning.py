"""The Lightning callback with real Lightning (CPU, a tiny model, in this process).

A stop is asked for by a real SIGTERM sent from a callback after step ``k``; the job must
checkpoint at the next step boundary (step ``k``), exit 75, and resume to end with every step
trained once and the same weights as a run that was never stopped.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402  (after the checks)
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from specon import jobkit  # noqa: E402
from specon.integrations import lightning as specon_lightning  # noqa: E402
from specon.integrations.loader import ResumableLoader  # noqa: E402
from tests.unit.integrations.conftest import events, sample_steps  # noqa: E402

pytestmark = pytest.mark.slow

BATCHES = 6  # per epoch: 48 samples of 8


class Net(pl.LightningModule):
    """Dropout, a per-epoch LR schedule and validation every epoch: all things a resume
    must get right for the weights to match."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.8)}


def data(resumable: bool, shuffle: bool = True) -> tuple[DataLoader[Any], DataLoader[Any]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * 8, 4, generator=g)
    y = x.sum(1, keepdim=True)
    cls = ResumableLoader if resumable else DataLoader
    train = cls(TensorDataset(x, y), batch_size=8, shuffle=shuffle)
    return train, DataLoader(TensorDataset(x[:16], y[:16]), batch_size=8)


class SigtermAfter(pl.Callback):
    """Sends this process SIGTERM once step ``k`` is done, as a runtime's save does."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.k:
            os.kill(os.getpid(), signal.SIGTERM)


def run(
    steps: int, *, resumable: bool = True, shuffle: bool = True, stop_after: int | None = None, **trainer: Any
) -> dict[str, torch.Tensor]:
    """One start of the job (a fresh model, seeded as a script would); its final weights."""
    pl.seed_everything(7, verbose=False)
    model = Net()
    migratable = specon_lightning.Migratable(checkpoint_every=None, checkpoint_interval=None)
    callbacks: list[pl.Callback] = [migratable]
    if stop_after is not None:
        callbacks.append(SigtermAfter(stop_after))
    t = pl.Trainer(
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer,
    )
    train, val = data(resumable, shuffle)
    specon_lightning.fit(t, model, train_dataloaders=train, val_dataloaders=val)
    return {k: v.clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def stopped(steps: int, **kwargs: Any) -> int:
    with pytest.raises(SystemExit) as exit_:
        run(steps, **kwargs)
    return int(exit_.value.code)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def unmoved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The run nobody stopped (outside specon: no checkpoint directory)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(jobkit.ENV_CHECKPOINT_DIR, raising=False)
        mp.delenv(jobkit.ENV_PROGRESS_FILE, raising=False)
        mp.chdir(tmp_path_factory.mktemp("unmoved"))
        return run(20)


# Step 3: mid-epoch. Step 6: the last batch of epoch 0, so the next boundary is the start of
# epoch 1, after the epoch's validation and LR step. Step 13: mid-epoch 2.
@pytest.mark.parametrize("k", [3, 6, 13])
def test_a_stopped_job_resumes_exactly(job_env: Path, unmoved: dict[str, torch.Tensor], k: int) -> None:
    progress = job_env / "progress.jsonl"
    assert stopped(20, stop_after=k) == jobkit.EXIT_CHECKPOINTED
    assert events(progress)[-1]["event"] == "checkpointed" and events(progress)[-1]["step"] == k
    final = run(20)
    assert sample_steps(progress) == list(range(1, 21))  # no step redone, none skipped
    starts = [e for e in events(progress) if e["event"] == "started"]
    assert [(e["step"], e["resumed"], e["steps"]) for e in starts] == [(0, False, 20), (k, True, 20)]
    assert events(progress)[-1]["event"] == "finished" and jobkit.read_done(job_env / "checkpoints")
    assert same(final, unmoved)


def test_moved_twice_still_exact(job_env: Path, unmoved: dict[str, torch.Tensor]) -> None:
    assert stopped(20, stop_after=4) == jobkit.EXIT_CHECKPOINTED
    assert stopped(20, stop_after=11) == jobkit.EXIT_CHECKPOINTED
    final = run(20)
    assert sample_steps(job_env / "progress.jsonl") == list(range(1, 21))
    assert same(final, unmoved)


def test_a_plain_loader_stops_at_the_next_epoch(job_env: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A DataLoader restarts its epoch on resume: the stop waits for the epoch's end, where
    nothing is lost; unshuffled, the weights match too."""
    progress = job_env / "progress.jsonl"
    assert stopped(14, resumable=False, shuffle=False, stop_after=2) == jobkit.EXIT_CHECKPOINTED
    assert "cannot resume mid-epoch" in capfd.readouterr().err
    assert events(progress)[-1]["step"] == BATCHES  # the first boundary of the next epoch
    final = run(14, resumable=False, shuffle=False)
    assert sample_steps(progress) == list(range(1, 15))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(jobkit.ENV_CHECKPOINT_DIR, str(job_env / "other"))
        mp.setenv(jobkit.ENV_PROGRESS_FILE, str(job_env / "other.jsonl"))
        assert same(final, run(14, resumable=False, shuffle=False))


def test_steps_are_declared_from_epochs_and_accumulation(job_env: Path) -> None:
    """max_epochs=2 of 6 batches, two batches a step: 6 optimizer steps. A stop lands on an
    optimizer step, never inside an accumulation."""
    progress = job_env / "progress.jsonl"
    kwargs: dict[str, Any] = {"max_epochs": 2, "accumulate_grad_batches": 2}
    assert stopped(-1, stop_after=2, **kwargs) == jobkit.EXIT_CHECKPOINTED
    assert events(progress)[0]["steps"] == 6 and events(progress)[-1]["step"] == 2
    run(-1, **kwargs)
    assert sample_steps(progress) == list(range(1, 7))


def test_periodic_checkpoints_keep_the_newest(job_env: Path) -> None:
    pl.seed_everything(7, verbose=False)
    cb = specon_lightning.Migratable(checkpoint_every=4, checkpoint_interval=None, keep=2)
    t = pl.Trainer(max_steps=10, callbacks=[cb], logger=False, enable_checkpointing=False)
    t.fit(Net(), train_dataloaders=data(True)[0], ckpt_path=specon_lightning.latest_checkpoint())
    names = sorted(p.name for p in (job_env / "checkpoints").glob("ckpt-*.json"))
    assert names == ["ckpt-000000000008.json", "ckpt-000000000010.json"]  # 4 pruned; 10 is the final
    assert [e["step"] for e in events(job_env / "progress.jsonl") if e["event"] == "checkpoint"] == [4, 8]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back after fit
