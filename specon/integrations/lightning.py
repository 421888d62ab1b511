"""Lightning: a ``Callback`` that makes ``Trainer.fit`` a migratable job (docs/integrations.md).

    import lightning as L
    from specon.integrations import lightning as specon_lightning

    trainer = L.Trainer(max_steps=2000, callbacks=[specon_lightning.Migratable()])
    specon_lightning.fit(trainer, model, datamodule=data)  # resumes from the newest checkpoint

``Migratable`` writes a sample per step (the ``training_step``'s loss) and, when training
starts, the ``started`` record declaring ``trainer.estimated_stepping_batches`` (``max_steps``,
else epochs x batches / accumulation). Checkpoints are ``trainer.save_checkpoint`` files,
taken at the start of a step before it trains (the step boundary: the previous optimizer
step is done, the next batch not yet trained), periodically and on SIGTERM/SIGINT; after
the one a signal asked for it exits 75. ``fit`` (or ``ckpt_path=latest_checkpoint()``)
resumes from the newest.

Exactness. Lightning restores the model, optimizers, schedulers and its loop counters, and a
train loader's position only when the loader has ``state_dict``/``load_state_dict``. This
callback adds the global RNG states (restored just before the first resumed step), so with
``specon.integrations.loader.ResumableLoader`` as the train loader a moved job trains the same
batches in the same order with the same dropout as an unmoved one: same final weights. With
any other loader the stop waits for the start of the next epoch (``stop_at="auto"``): the
step count stays exact, but the resumed epoch's shuffle is drawn anew (``shuffle=False``
keeps the order). One process per job: multi-device strategies are not handled.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl

from specon import jobkit
from specon.integrations import archive
from specon.integrations.loader import ResumableLoader
from specon.integrations.session import Session, for_callback, warn

FRAMEWORK = "lightning"
CKPT = "lightning.ckpt"

StopAt = Literal["auto", "step", "epoch"]


class Migratable(pl.Callback):
    """The job contract for ``Trainer.fit`` (module docstring).

    ``checkpoint_every``/``checkpoint_interval``/``keep``: periodic checkpoints, as in
    ``jobkit.Job``. ``log_every``: a sample every so many steps (None: none).
    ``stop_at``: where a stop request is honoured: ``"step"`` (the next step; exact with a
    ``ResumableLoader``), ``"epoch"`` (the next epoch start) or ``"auto"`` (``"step"`` when
    every train loader is a ``ResumableLoader``, else ``"epoch"``).
    """

    def __init__(
        self,
        *,
        checkpoint_every: int | None = jobkit.DEFAULT_CHECKPOINT_EVERY,
        checkpoint_interval: float | None = jobkit.DEFAULT_CHECKPOINT_INTERVAL,
        keep: int = 2,
        log_every: int | None = 1,
        stop_at: StopAt = "auto",
        session: Session | None = None,
    ) -> None:
        if stop_at not in ("auto", "step", "epoch"):
            raise ValueError(f"stop_at must be 'auto', 'step' or 'epoch', got {stop_at!r}")
        self.session = for_callback(session, log_every, checkpoint_every, checkpoint_interval, keep)
        self.log_every = log_every
        self.stop_at: StopAt = stop_at
        self.mode: Literal["step", "epoch"] = "step"
        self._pending_rng: dict[str, Any] | None = None
        self._step_before = -1  # trainer.global_step when the current batch started

    # -- hooks ------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.session.install_signals()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning put its own SIGTERM handler over ours when fit began: it would end the
        # process (SIGTERMException, exit 0) without a checkpoint.
        self.session.install_signals()
        self.mode = self._resolve_mode(trainer)
        self.session.begin(trainer.global_step, declared_steps(trainer))

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._pending_rng is not None:
            # The state when the checkpoint was taken, here: everything the resumed run
            # did since (sanity check, loader iterators) drew from the generators.
            archive.set_rng_state(self._pending_rng)
            self._pending_rng = None
        self._step_before = trainer.global_step
        if batch_idx % trainer.accumulate_grad_batches:
            return  # inside a gradient accumulation: no optimizer step ends here
        session = self.session
        session.completed = trainer.global_step
        if session.stop_requested and (self.mode == "step" or batch_idx == 0):
            session.stop(lambda: self._save(trainer, in_hand=1))
        if session.due():
            session.checkpoint(lambda: self._save(trainer, in_hand=1))

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._step_before or self.log_every is None or step % self.log_every:
            return  # no optimizer step ended with this batch (accumulating), or not logged
        loss = _loss(outputs, trainer.callback_metrics)
        if loss is not None:
            self.session.log(step, loss)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.session.completed = trainer.global_step
        self.session.finish(lambda: self._save(trainer, in_hand=0))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.session.restore_signals()
            self.session.close()

    def state_dict(self) -> dict[str, Any]:
        return {"rng": archive.rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        rng = state_dict.get("rng")
        self._pending_rng = rng if isinstance(rng, dict) else None

    # -- helpers ----------------------------------------------------------------------------
    def _resolve_mode(self, trainer: pl.Trainer) -> Literal["step", "epoch"]:
        if self.stop_at != "auto":
            return self.stop_at
        loaders = list(_leaves(trainer.train_dataloader))
        if loaders and all(isinstance(dl, ResumableLoader) for dl in loaders):
            return "step"
        if any(hasattr(dl, "state_dict") and not isinstance(dl, ResumableLoader) for dl in loaders):
            # e.g. torchdata's StatefulDataLoader: its position counts the batch already
            # fetched for the step about to run, which a resume would then skip.
            warn("a stateful train loader other than ResumableLoader: a resume skips the batch in hand")
        warn(
            "the train loader cannot resume mid-epoch (use specon.integrations.loader.ResumableLoader):"
            f" a stop waits for the next epoch ({trainer.num_training_batches} batches an epoch)"
        )
        return "epoch"

    def _save(self, trainer: pl.Trainer, *, in_hand: int) -> bytes:
        loaders = [dl for dl in _leaves(trainer.train_dataloader) if isinstance(dl, ResumableLoader)]
        for dl in loaders:
            dl.in_hand = in_hand
        try:
            with tempfile.TemporaryDirectory(prefix="specon-lightning-") as tmp:
                path = Path(tmp) / CKPT
                trainer.save_checkpoint(path)
                return archive.pack(FRAMEWORK, trainer.global_step, {CKPT: path})
        finally:
            for dl in loaders:
                dl.in_hand = 0


def declared_steps(trainer: pl.Trainer) -> int | None:
    """The optimizer steps ``fit`` will take (``max_steps``, else epochs x batches over the
    accumulation), or None when Lightning cannot tell (an endless iterable loader)."""
    steps = trainer.estimated_stepping_batches
    return int(steps) if math.isfinite(steps) and steps >= 0 else None


def latest_checkpoint(directory: Path | None = None) -> str | None:
    """The newest complete checkpoint of this job (``$SPECON_CHECKPOINT_DIR``), extracted to a
    temporary file for ``trainer.fit(..., ckpt_path=...)``; None when there is none."""
    found = archive.extract_newest(FRAMEWORK, directory)
    return None if found is None else str(found[0] / CKPT)


def fit(
    trainer: pl.Trainer,
    model: pl.LightningModule,
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    datamodule: pl.LightningDataModule | None = None,
) -> None:
    """``trainer.fit(...)`` from the newest checkpoint, with a ``Migratable`` callback (one is
    added when the trainer has none). On a stop request it exits 75."""
    callbacks: list[pl.Callback] = getattr(trainer, "callbacks")  # noqa: B009  (set by Lightning, untyped)
    if not any(isinstance(cb, Migratable) for cb in callbacks):
        callbacks.append(Migratable())
    trainer.fit(
        model,
        train_dataloaders=train_dataloaders,
        val_dataloaders=val_dataloaders,
        datamodule=datamodule,
        ckpt_path=latest_checkpoint(),
    )


def _leaves(loaders: object) -> Iterator[object]:
    """The loaders of ``trainer.train_dataloader`` (one, or a list/dict of them)."""
    if isinstance(loaders, Mapping):
        for value in loaders.values():
            yield from _leaves(value)
    elif isinstance(loaders, list | tuple):
        for value in loaders:
            yield from _leaves(value)
    elif loaders is not None:
        yield loaders


def _loss(outputs: Any, metrics: Mapping[str, Any]) -> float | None:
    """The step's loss: what ``training_step`` returned, else a logged ``train_loss``/``loss``."""
    value = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if value is None:
        value = metrics.get("train_loss", metrics.get("loss"))
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of many values
        return None
