"""The Keras callback with real Keras 3 on its torch backend (CPU, a tiny model, in this process).

Keras starts a fit at an epoch, never inside one: a SIGTERM mid-epoch is honoured at the end
of that epoch (the next boundary a resume can start from exactly), the job exits 75, and the
resumed job ends with every step trained once and the same weights as an unstopped run.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
np = pytest.importorskip("numpy")

from specon import jobkit  # noqa: E402  (after the checks)
from specon.integrations import keras as specon_keras  # noqa: E402
from tests.unit.integrations.conftest import events, sample_steps  # noqa: E402

pytestmark = pytest.mark.slow

EPOCHS, BATCHES = 5, 6  # 48 samples of 8 an epoch, a quarter of them for validation


class SigtermAt(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, step: int) -> None:
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen += 1
        if self.seen == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def model() -> Any:
    m = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(16, "relu"), keras.layers.Dropout(0.2), keras.layers.Dense(1)]
    )
    m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return m


def run(*, signal_at: int | None = None) -> list[Any]:
    """One start of the job (a fresh model, seeded as a script would); its final weights."""
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    m = model()
    callbacks: list[Any] = [specon_keras.Migratable(checkpoint_every=None, checkpoint_interval=None)]
    if signal_at is not None:
        callbacks.append(SigtermAt(signal_at))
    fit = {"batch_size": 8, "epochs": EPOCHS, "validation_split": 0.25, "verbose": 0}
    specon_keras.fit(m, x, y, callbacks=callbacks, **fit)
    return [w.copy() for w in m.get_weights()]


@pytest.fixture(scope="module")
def unmoved() -> list[Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(jobkit.ENV_CHECKPOINT_DIR, raising=False)
        mp.delenv(jobkit.ENV_PROGRESS_FILE, raising=False)
        return run()


def test_a_stop_mid_epoch_waits_for_its_end_and_resumes_exactly(job_env: Path, unmoved: list[Any]) -> None:
    progress = job_env / "progress.jsonl"
    with pytest.raises(SystemExit) as exit_:
        run(signal_at=BATCHES + 2)  # in the second epoch
    assert exit_.value.code == jobkit.EXIT_CHECKPOINTED
    assert events(progress)[-1]["event"] == "checkpointed" and events(progress)[-1]["step"] == 2 * BATCHES
    final = run()
    assert sample_steps(progress) == list(range(1, EPOCHS * BATCHES + 1))
    starts = [e for e in events(progress) if e["event"] == "started"]
    total = EPOCHS * BATCHES
    assert [(e["step"], e["steps"]) for e in starts] == [(0, total), (2 * BATCHES, total)]
    assert events(progress)[-1]["event"] == "finished" and jobkit.read_done(job_env / "checkpoints")
    assert all(np.array_equal(a, b) for a, b in zip(final, unmoved, strict=True))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back after fit


def test_a_stop_in_the_last_epoch_finishes_instead(job_env: Path) -> None:
    run(signal_at=(EPOCHS - 1) * BATCHES + 1)
    kinds = [e["event"] for e in events(job_env / "progress.jsonl")]
    assert kinds == ["started", "finished"]


def test_restore_needs_a_compiled_model(job_env: Path) -> None:
    with pytest.raises(SystemExit):
        run(signal_at=1)
    bare = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="compile the model"):
        specon_keras.Migratable().restore(bare)
