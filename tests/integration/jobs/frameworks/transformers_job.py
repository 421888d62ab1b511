"""A Hugging Face Trainer job that specon can move: a tiny GPT-2, built from a config (nothing
downloaded), learning synthetic token sequences.

The model, the data and the ``Trainer`` are ordinary Hugging Face; what makes the job
migratable is the ``Migratable`` callback and ``train`` (docs/integrations.md shows the same
lines).

    python transformers_job.py --steps 200 --out final.pt [--step-seconds 0.05] [--seed 0]

``--step-seconds`` sleeps after each step: it stands in for a bigger model, giving specon the
time to see the loss converge and move the job. ``--out`` receives the final ``state_dict``
(``torch.save``), to compare with a run that was never moved.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from specon.checkpoint import atomic_write
from specon.integrations import transformers as specon_hf

VOCAB, LENGTH = 32, 12


class Counting(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sequences that count up from a random start (mod VOCAB): learnable in a few hundred steps."""

    def __init__(self, seed: int, size: int = 256) -> None:
        starts = torch.randint(0, VOCAB, (size, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (starts + torch.arange(LENGTH)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Slow(TrainerCallback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)  # the same arithmetic on every worker

    set_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=LENGTH))
    training = TrainingArguments(
        output_dir="hf-output",
        max_steps=args.steps,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=args.seed,
    )
    callbacks = [specon_hf.Migratable(), Slow(args.step_seconds)]
    trainer = Trainer(model=model, args=training, train_dataset=Counting(args.seed), callbacks=callbacks)
    specon_hf.train(trainer)
    save_state(model.state_dict(), args.out)


def save_state(state: dict[str, torch.Tensor], out: str) -> None:
    """Whole or absent (the tests read it once it exists: the job logs `finished` before)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(Path(out), buf.getvalue())


if __name__ == "__main__":
    main()
