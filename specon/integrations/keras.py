"""Keras 3: a ``Callback`` that makes ``model.fit`` a migratable job (docs/integrations.md).

    from specon.integrations import keras as specon_keras

    model.compile(optimizer="adam", loss="mse")
    specon_keras.fit(model, x, y, epochs=20, steps_per_epoch=50)  # resumes from the newest checkpoint

``Migratable`` writes a sample per batch (Keras's ``loss``: the mean over the epoch so far)
and, when training starts, the ``started`` record declaring epochs x steps per epoch.
Checkpoints are ``model.save_weights`` files (the weights and the optimizer's state) with the
epoch and the global RNG states beside them, taken at epoch ends: periodically and, on
SIGTERM/SIGINT, at the end of the epoch the job is in, then it exits 75. ``fit`` (or
``initial_epoch=callback.restore(model)``) loads the newest and starts at the next epoch.

Exactness: ``model.fit`` can start at an epoch (``initial_epoch``) but not inside one, so a
job is only stopped where it can resume exactly, at an epoch end: a moved job trains the
same batches and ends with the same weights as an unmoved one. The price is the wait for
the epoch to end: keep an epoch well inside the grace period (``steps_per_epoch`` makes
epochs as short as wanted), or the job is killed at its end and redoes the steps since its
last checkpoint.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import keras

from specon import jobkit
from specon.integrations import archive
from specon.integrations.session import Session, for_callback

FRAMEWORK = "keras"
WEIGHTS = "model.weights.h5"


class Migratable(keras.callbacks.Callback):  # keras ships no type hints: a subclass of Any
    """The job contract for ``model.fit`` (module docstring).

    ``checkpoint_every``/``checkpoint_interval``/``keep``: periodic checkpoints (taken at the
    first epoch end where due), as in ``jobkit.Job``. ``log_every``: a sample every so many
    batches (None: none).
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
        super().__init__()
        self.session = for_callback(session, log_every, checkpoint_every, checkpoint_interval, keep)
        self.log_every = log_every
        self.step = 0  # batches trained, counting those restored
        self._restored = 0
        self._pending_rng: dict[str, Any] | None = None
        self._epochs: int | None = None

    def restore(self, model: Any, directory: Path | None = None) -> int:
        """Load the newest checkpoint (weights and optimizer state) into the compiled
        ``model``; the epoch to start at (``initial_epoch``), 0 when there is none."""
        found = archive.extract_newest(FRAMEWORK, directory)
        if found is None:
            return 0
        folder, meta = found
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("compile the model before restore(): the checkpoint holds its optimizer's state")
        if not optimizer.built:
            optimizer.build(model.trainable_variables)  # its variables must exist to be loaded
        model.load_weights(str(folder / WEIGHTS))
        self._restored = int(meta["step"])
        rng = meta.get("rng")
        self._pending_rng = rng if isinstance(rng, dict) else None
        return int(meta["epoch"])

    # -- hooks ------------------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._pending_rng is not None:
            # As they were at the end of the checkpointed epoch: the next epoch's shuffle
            # and dropout draw from here, as they did in the run that was stopped.
            archive.set_rng_state(self._pending_rng)
            self._pending_rng = None
        self.session.install_signals()
        epochs, steps = self.params.get("epochs"), self.params.get("steps")
        self._epochs = epochs if isinstance(epochs, int) else None
        total = epochs * steps if isinstance(epochs, int) and isinstance(steps, int) else None
        self.step = self._restored
        self.session.begin(self.step, total)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.step += 1
        self.session.completed = self.step
        loss = (logs or {}).get("loss")
        if self.log_every is not None and self.step % self.log_every == 0 and loss is not None:
            self.session.log(self.step, float(loss))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._epochs is not None and epoch + 1 >= self._epochs:
            return  # the last epoch: on_train_end finishes (finishing beats stopping)
        session = self.session
        if session.stop_requested:
            session.stop(lambda: self._save(epoch + 1))
        if session.due():
            session.checkpoint(lambda: self._save(epoch + 1))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        epochs = self._epochs if self._epochs is not None else 0
        self.session.finish(lambda: self._save(epochs))
        self.session.restore_signals()
        self.session.close()

    def _save(self, epoch: int) -> bytes:
        """The payload: the weights with the optimizer's state, the epoch to resume at, the
        RNG states."""
        with tempfile.TemporaryDirectory(prefix="specon-keras-") as tmp:
            path = Path(tmp) / WEIGHTS
            self.model.save_weights(str(path))
            return archive.pack(FRAMEWORK, self.step, {WEIGHTS: path}, epoch=epoch, rng=archive.rng_state())


def fit(model: Any, *args: Any, callbacks: list[Any] | None = None, **kwargs: Any) -> Any:
    """``model.fit(...)`` from the newest checkpoint (``initial_epoch`` set from it), with a
    ``Migratable`` callback (one is added when ``callbacks`` has none); its ``History``. On
    a stop request it exits 75."""
    if "initial_epoch" in kwargs:
        raise TypeError("fit() resumes from the newest checkpoint itself: pass no initial_epoch")
    callbacks = list(callbacks or [])
    migratable = next((cb for cb in callbacks if isinstance(cb, Migratable)), None)
    if migratable is None:
        migratable = Migratable()
        callbacks.append(migratable)
    return model.fit(*args, initial_epoch=migratable.restore(model), callbacks=callbacks, **kwargs)
