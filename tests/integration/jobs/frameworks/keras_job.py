"""A Keras 3 job (torch backend) that specon can move: a small regression network on
synthetic data.

The model and ``fit`` are ordinary Keras; what makes the job migratable is
``specon_keras.fit`` (docs/integrations.md shows the same lines). Keras resumes at epoch
boundaries only: an epoch here is 16 batches.

    python keras_job.py --epochs 20 --out final.npz [--step-seconds 0.05] [--seed 0]

``--step-seconds`` sleeps after each batch: it stands in for a bigger model, giving specon the
time to see the loss converge and move the job. ``--out`` receives the final weights
(``numpy.savez``), to compare with a run that was never moved.
"""

from __future__ import annotations

import argparse
import io
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
import torch

from specon.checkpoint import atomic_write
from specon.integrations import keras as specon_keras


class Slow(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        time.sleep(self.seconds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)  # the same arithmetic on every worker

    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(512, 1))).astype("float32")
    layers = [keras.layers.Dense(32, "relu"), keras.layers.Dropout(0.1), keras.layers.Dense(1)]
    model = keras.Sequential([keras.Input((8,)), *layers])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    slow = Slow(args.step_seconds)
    specon_keras.fit(model, x, y, batch_size=32, epochs=args.epochs, verbose=0, callbacks=[slow])
    buf = io.BytesIO()
    np.savez(buf, *model.get_weights())
    atomic_write(Path(args.out), buf.getvalue())  # whole or absent: the tests read it once it exists


if __name__ == "__main__":
    main()
