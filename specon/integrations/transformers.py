"""Hugging Face Trainer: a ``TrainerCallback`` that makes ``Trainer.train`` a migratable job
(docs/integrations.md).

    from specon.integrations import transformers as specon_hf

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[specon_hf.Migratable()])
    specon_hf.train(trainer)  # resumes from the newest checkpoint

``Migratable`` asks the Trainer to log every ``log_every`` steps (``control.should_log``) and
writes each logged ``loss`` as a sample (the mean over the steps since the previous log);
when training starts, the ``started`` record declares ``state.max_steps``. Checkpoints are the
Trainer's own (``control.should_save``: ``checkpoint-N/`` with model, optimizer, scheduler,
RNG and trainer state), taken after an optimizer step, periodically and on SIGTERM/SIGINT,
packed into the job's checkpoint directory; the ``checkpoint-N/`` folders it asked for are
removed from ``output_dir`` once packed. After the one a signal asked for it exits 75.

Exactness: the Trainer resumes mid-epoch by itself (it skips the batches of the epoch
already trained and restores the RNG states it saved), so a moved job trains the same
batches as an unmoved one and ends with the same weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from specon import jobkit
from specon.integrations import archive
from specon.integrations.session import Session, for_callback, warn

FRAMEWORK = "transformers"
# Numeric fields of a Trainer log copied into the sample beside ``loss``.
_METRICS = ("learning_rate", "grad_norm")


class Migratable(TrainerCallback):
    """The job contract for ``Trainer.train`` (module docstring).

    ``checkpoint_every``/``checkpoint_interval``/``keep``: periodic checkpoints, as in
    ``jobkit.Job``. ``log_every``: a sample every so many steps (None: only when the
    Trainer's own ``logging_steps`` log).
    """

    def __init__(
        self,
        *,
        checkpoint_every: int | None = jobkit.DEFAULT_CHECKPOINT_EVERY,
        checkpoint_interval: float | None = jobkit.DEFAULT_CHECKPOINT_INTERVAL,
        keep: int = 2,
        log_every: int | None = 1,
        session: Session | None = None,
    ) -> None:
        self.session = for_callback(session, log_every, checkpoint_every, checkpoint_interval, keep)
        self.log_every = log_every
        self._wanted = False  # the next save is one this callback asked for
        self._ours = False  # ... and the Trainer's own settings would not have saved there

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if args.save_only_model:
            warn("save_only_model=True: checkpoints hold no optimizer state, a resumed job is not exact")
        if getattr(args, "enable_jit_checkpoint", False):
            warn("enable_jit_checkpoint=True: the Trainer's SIGTERM handler is replaced by specon's")
        self.session.install_signals()
        self.session.begin(state.global_step, state.max_steps if state.max_steps > 0 else None)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        session = self.session
        session.completed = state.global_step
        if self.log_every is not None and state.global_step % self.log_every == 0:
            control.should_log = True
        last = 0 < state.max_steps <= state.global_step
        if session.stop_requested or session.due() or last:
            self._ours = not control.should_save
            self._wanted = True
            control.should_save = True  # the Trainer saves right after this hook, then on_save

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        loss = (logs or {}).get("loss")
        if isinstance(loss, int | float):
            extra = {k: float(v) for k in _METRICS if isinstance(v := (logs or {}).get(k), int | float)}
            self.session.log(state.global_step, float(loss), **extra)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self._wanted:
            return
        self._wanted = False
        session = self.session
        session.completed = state.global_step
        folder = Path(args.output_dir or ".") / f"checkpoint-{state.global_step}"

        def save() -> bytes:
            return archive.pack(FRAMEWORK, state.global_step, {folder.name: folder}, folder=folder.name)

        last = 0 < state.max_steps <= state.global_step
        try:
            if session.stop_requested and not last:  # finishing beats stopping
                session.stop(save)
            session.checkpoint(save, event=None if last else "checkpoint")
        finally:
            if self._ours:
                shutil.rmtree(folder, ignore_errors=True)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.session.completed = state.global_step
        self.session.finish(None)  # the last step's checkpoint was taken in on_save
        self.session.restore_signals()
        self.session.close()


def latest_checkpoint(directory: Path | None = None) -> str | None:
    """The newest complete checkpoint of this job (``$SPECON_CHECKPOINT_DIR``), extracted to a
    temporary ``checkpoint-N/`` for ``trainer.train(resume_from_checkpoint=...)``; None when
    there is none."""
    found = archive.extract_newest(FRAMEWORK, directory)
    if found is None:
        return None
    folder, meta = found
    return str(folder / str(meta["folder"]))


def train(trainer: Trainer, **kwargs: Any) -> Any:
    """``trainer.train()`` from the newest checkpoint, with a ``Migratable`` callback (one is
    added when the trainer has none); its ``TrainOutput``. On a stop request it exits 75."""
    if "resume_from_checkpoint" in kwargs:
        raise TypeError("train() resumes from the newest checkpoint itself: pass no resume_from_checkpoint")
    if not any(isinstance(cb, Migratable) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(Migratable())
    return trainer.train(resume_from_checkpoint=latest_checkpoint(), **kwargs)
