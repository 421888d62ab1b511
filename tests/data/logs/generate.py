"""Regenerate the sample progress logs in this directory (deterministic).

    .venv/bin/python tests/data/logs/generate.py

Each log imitates a real training run's output format; the curves are simple
exponential decays with noise, shaped to exercise the classifiers:

* converging.jsonl     - JSON lines with epoch timestamps: a loss that flattens out.
* keras_training.csv   - a Keras ``CSVLogger`` file (one row per epoch, no timestamps).
* lightning_metrics.csv - a Lightning ``CSVLogger`` ``metrics.csv``: train rows and
  validation rows leave each other's cells empty.
* train.log            - a free-text log with the loss inside other chatter.
* diverging.jsonl      - a too-high learning rate: the loss falls, then climbs, then NaN.
* lr_drop.jsonl        - a step learning-rate schedule: a plateau, then a drop at the
  decay, then a second plateau.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
T0 = 1_714_557_600.0  # 2024-05-01T10:00:00Z


def _decay(t: np.ndarray, *, start: float, floor: float, tau: float) -> np.ndarray:
    return np.asarray(floor + (start - floor) * np.exp(-t / tau))


def _jsonl(path: Path, rows: Sequence[Mapping[str, object]]) -> None:
    # allow_nan: json writes NaN/Infinity as the bare tokens training scripts emit.
    path.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))


def converging(rng: np.random.Generator) -> None:
    t = np.arange(0.0, 1500.0, 5.0)  # a record every 5 s for 25 min
    loss = _decay(t, start=2.3, floor=0.12, tau=180.0) + rng.normal(0.0, 0.01, t.size)
    rows = [
        {"step": int(i * 20), "epoch": int(i // 60), "loss": round(float(v), 5), "ts": round(T0 + s, 3)}
        for i, (s, v) in enumerate(zip(t, loss, strict=True))
    ]
    _jsonl(HERE / "converging.jsonl", rows)


def keras(rng: np.random.Generator) -> None:
    epochs = np.arange(60)
    loss = _decay(epochs, start=1.9, floor=0.25, tau=8.0) + rng.normal(0.0, 0.004, epochs.size)
    acc = 1.0 - 0.45 * np.exp(-epochs / 8.0) - 0.08 + rng.normal(0.0, 0.003, epochs.size)
    val_loss = loss + 0.05 + rng.normal(0.0, 0.01, epochs.size)
    val_acc = acc - 0.02 + rng.normal(0.0, 0.005, epochs.size)
    lines = ["epoch,accuracy,loss,val_accuracy,val_loss"]
    lines += [
        f"{e},{a:.4f},{lo:.4f},{va:.4f},{vl:.4f}"
        for e, a, lo, va, vl in zip(epochs, acc, loss, val_acc, val_loss, strict=True)
    ]
    (HERE / "keras_training.csv").write_text("\n".join(lines) + "\n")


def lightning(rng: np.random.Generator) -> None:
    lines = ["epoch,step,train_loss,val_loss"]
    steps_per_epoch, log_every = 500, 50
    for epoch in range(12):
        for k in range(log_every - 1, steps_per_epoch, log_every):
            step = epoch * steps_per_epoch + k
            v = float(_decay(np.array(step), start=2.0, floor=0.3, tau=1200.0)) + rng.normal(0.0, 0.02)
            lines.append(f"{epoch},{step},{v:.5f},")
        val = float(_decay(np.array((epoch + 1) * steps_per_epoch), start=2.0, floor=0.35, tau=1200.0))
        lines.append(f"{epoch},{(epoch + 1) * steps_per_epoch - 1},,{val + rng.normal(0.0, 0.01):.5f}")
    (HERE / "lightning_metrics.csv").write_text("\n".join(lines) + "\n")


def text(rng: np.random.Generator) -> None:
    lines = [
        "Starting training: model=vae dataset=mnist batch_size=128",
        "WARNING: cudnn not found, using CPU",
    ]
    step = 0
    for epoch in range(1, 11):
        for batch in range(0, 469, 50):
            step += 1
            v = float(_decay(np.array(step), start=180.0, floor=98.0, tau=14.0)) + rng.normal(0.0, 0.4)
            lines.append(f"Train Epoch: {epoch} [{batch * 128}/60000] loss: {v:.4f} lr=0.001")
        lines.append(f"====> Epoch: {epoch} Average loss: {v:.4f}")
        lines.append(f"Saving checkpoint to /ckpt/epoch-{epoch}.pt")
    (HERE / "train.log").write_text("\n".join(lines) + "\n")


def diverging(rng: np.random.Generator) -> None:
    t = np.arange(0.0, 900.0, 5.0)
    # Falls for two minutes, then the too-high learning rate makes it climb ever faster.
    loss = 2.3 * np.exp(-t / 40.0) + 0.6 + 0.003 * t + 0.002 * np.exp(t / 100.0)
    loss += rng.normal(0.0, 0.01, t.size)
    rows: list[dict[str, object]] = []
    for i, (s, v) in enumerate(zip(t, loss, strict=True)):
        value = float(v) if s < 780.0 else math.nan
        rows.append(
            {"step": i * 20, "loss": round(value, 5) if math.isfinite(value) else value, "ts": T0 + s}
        )
    _jsonl(HERE / "diverging.jsonl", rows)


def lr_drop(rng: np.random.Generator) -> None:
    t = np.arange(0.0, 2400.0, 5.0)
    drop_at = 1200.0
    first = _decay(t, start=2.3, floor=1.0, tau=150.0)
    after = np.clip(t - drop_at, 0.0, None)
    # At the decay the loss falls from the first plateau towards a lower one.
    second = np.where(t >= drop_at, -0.45 * (1.0 - np.exp(-after / 120.0)), 0.0)
    loss = first + second + rng.normal(0.0, 0.008, t.size)
    lr = np.where(t >= drop_at, 0.01, 0.1)
    rows = [
        {"step": int(i * 20), "loss": round(float(v), 5), "lr": float(r), "time": T0 + s}
        for i, (s, v, r) in enumerate(zip(t, loss, lr, strict=True))
    ]
    _jsonl(HERE / "lr_drop.jsonl", rows)


def main() -> None:
    for seed, make in enumerate((converging, keras, lightning, text, diverging, lr_drop)):
        make(np.random.default_rng(seed))


if __name__ == "__main__":
    main()
