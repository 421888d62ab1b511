"""Write real training logs of Lightning, Keras, Hugging Face transformers and TensorBoard.

Each framework trains a tiny model on synthetic data on the CPU for a few seconds (nothing is
downloaded: the transformers models are built from a config) and its own loggers write the
files. ``--variant main`` makes the fixtures in this folder (README.md lists them);
``--variant heldout`` makes a second set with other models, lengths and settings, which the
tests never read (for checking the readers on logs they were not written against).

    .venv/bin/python tests/data/frameworks/make_logs.py                     # this folder
    .venv/bin/python tests/data/frameworks/make_logs.py --variant heldout --out /tmp/heldout

Needs the lightning, keras, transformers and tensorboard extras (and torch). Each run is a
child process: Keras reads its backend from the environment at import, and the Trainer's
console is its stdout and stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUNS = ("lightning", "keras", "transformers", "transformers-json")


def lightning_run(out: Path, heldout: bool) -> None:
    import lightning  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger  # noqa: PLC0415

    torch.set_num_threads(1)
    lightning.seed_everything(1 if heldout else 0, verbose=False)
    n, features = (768, 10) if heldout else (512, 8)
    x = torch.randn(n, features)
    if heldout:  # classification, three classes
        y = (x[:, :3] + 0.3 * torch.randn(n, 3)).argmax(dim=1)
    else:  # regression
        y = x @ torch.randn(features, 1) + 0.1 * torch.randn(n, 1)

    class Model(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            width, outputs = (32, 3) if heldout else (16, 1)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(features, width), torch.nn.Tanh(), torch.nn.Linear(width, outputs)
            )

        def _loss(self, batch: Any) -> Any:
            inputs, target = batch
            out = self.net(inputs)
            if heldout:
                return torch.nn.functional.cross_entropy(out, target)
            return torch.nn.functional.mse_loss(out, target)

        def training_step(self, batch: Any, index: int) -> Any:
            loss = self._loss(batch)
            if heldout:  # step-level only: the column is plain train_loss
                self.log("train_loss", loss)
            else:
                self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch: Any, index: int) -> None:
            self.log("val_loss", self._loss(batch))

        def configure_optimizers(self) -> Any:
            if heldout:
                return torch.optim.Adam(self.parameters(), lr=0.01)
            return torch.optim.SGD(self.parameters(), lr=0.05)

    data = torch.utils.data.TensorDataset(x, y)
    train = torch.utils.data.DataLoader(data, batch_size=48 if heldout else 32, shuffle=True)
    val = torch.utils.data.DataLoader(data, batch_size=256)
    trainer = lightning.Trainer(
        max_epochs=12 if heldout else 8,
        logger=[
            CSVLogger(out, name="csv", flush_logs_every_n_steps=20 if heldout else 100),
            TensorBoardLogger(out, name="tb", default_hp_metric=False),
        ],
        log_every_n_steps=5 if heldout else 2,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
    )
    trainer.fit(Model(), train, val)


def keras_run(out: Path, heldout: bool) -> None:
    import keras  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    keras.utils.set_random_seed(1 if heldout else 0)
    rng = np.random.default_rng(1 if heldout else 0)
    x = rng.normal(size=(320, 8)).astype("float32")
    if heldout:
        y = (x[:, 0] + x[:, 1] > 0).astype("float32")
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(24, activation="relu"), keras.layers.Dense(1, "sigmoid")]
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
        model.fit(
            x, y, epochs=25, batch_size=64, verbose=0, callbacks=[keras.callbacks.CSVLogger(out / "log.csv")]
        )
    else:
        y = (x @ rng.normal(size=(8, 1))).astype("float32")
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.02), loss="mse", metrics=["mae"])
        model.fit(
            x,
            y,
            epochs=40,
            batch_size=32,
            validation_split=0.2,
            verbose=0,
            callbacks=[keras.callbacks.CSVLogger(out / "training.csv")],
        )


def transformers_run(out: Path, heldout: bool, json_console: bool) -> None:
    import torch  # noqa: PLC0415
    import transformers as hf  # noqa: PLC0415

    torch.set_num_threads(1)
    hf.set_seed(2 if json_console else (1 if heldout else 0))
    length, vocab = 12, 32

    class Tokens(torch.utils.data.Dataset[dict[str, Any]]):
        def __init__(self, n: int, seed: int) -> None:
            g = torch.Generator().manual_seed(seed)
            self.x = torch.randint(1, vocab, (n, length), generator=g)
            if heldout:  # a sequence that repeats: the language model can learn it
                self.x[:, 1::2] = self.x[:, 0::2]

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, Any]:
            ids = self.x[i]
            label = ids if heldout else (ids[0] > vocab // 2).long()
            return {"input_ids": ids, "attention_mask": torch.ones(length, dtype=torch.long), "labels": label}

    model: Any
    if heldout:
        model = hf.GPT2LMHeadModel(
            hf.GPT2Config(vocab_size=vocab, n_positions=16, n_embd=32, n_layer=2, n_head=2)
        )
    else:
        model = hf.BertForSequenceClassification(
            hf.BertConfig(
                vocab_size=vocab,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=16,
            )
        )
    steps_per_eval = 24 if heldout else 20
    args = hf.TrainingArguments(
        output_dir=str(out / "trainer"),
        num_train_epochs=4 if heldout else 3,
        per_device_train_batch_size=16,
        learning_rate=3e-3 if heldout else 5e-3,
        logging_steps=3 if heldout else 2,
        eval_strategy="steps",
        eval_steps=steps_per_eval,
        save_steps=steps_per_eval,
        save_total_limit=1,
        report_to=[] if json_console else ["tensorboard"],
        disable_tqdm=json_console,
        use_cpu=True,
        dataloader_num_workers=0,
    )

    class JsonLines(hf.TrainerCallback):
        """Prints each log as one JSON object, as many training scripts do."""

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            print(json.dumps(logs), flush=True)

    trainer = hf.Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(288 if heldout else 320, 0),
        eval_dataset=Tokens(64, 1),
    )
    if json_console:
        trainer.remove_callback(hf.trainer_callback.PrinterCallback)
        trainer.add_callback(JsonLines())
    trainer.train()


def child(run: str, out: Path, heldout: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if run == "lightning":
        lightning_run(out, heldout)
    elif run == "keras":
        keras_run(out, heldout)
    else:
        transformers_run(out, heldout, json_console=run == "transformers-json")


def spawn(run: str, work: Path, heldout: bool, console: Path | None) -> None:
    command = [sys.executable, __file__, "--child", run, "--out", str(work)]
    if heldout:
        command += ["--variant", "heldout"]
    env = {**os.environ, "KERAS_BACKEND": "torch", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    with open(console or os.devnull, "wb") as sink:
        subprocess.run(command, check=True, stdout=sink, stderr=subprocess.STDOUT, env=env)


def one(pattern: str, root: Path) -> Path:
    found = sorted(root.glob(pattern))
    if len(found) != 1:
        raise SystemExit(f"expected one {pattern} under {root}, found {found}")
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variant", choices=("main", "heldout"), default="main")
    parser.add_argument("--out", type=Path, help="where the logs go (default: this folder for main)")
    parser.add_argument(
        "--runs", default=",".join(RUNS), help=f"comma-separated runs (default: {','.join(RUNS)})"
    )
    parser.add_argument("--child", choices=RUNS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    heldout = args.variant == "heldout"
    if args.child:
        child(args.child, args.out, heldout)
        return
    if args.out is None and heldout:
        parser.error("--variant heldout needs --out (it must not land beside the fixtures)")
    out: Path = args.out or HERE
    runs = [r for r in args.runs.split(",") if r]
    with tempfile.TemporaryDirectory(prefix="specon-logs-") as tmp:
        work = Path(tmp)
        for run in runs:
            target = out / run.split("-")[0]
            target.mkdir(parents=True, exist_ok=True)
            print(f"{run}: training", flush=True)
            if run == "lightning":
                spawn(run, work / run, heldout, None)
                shutil.copyfile(one("csv/version_0/metrics.csv", work / run), target / "metrics.csv")
                shutil.copyfile(
                    one("tb/version_0/events.out.tfevents.*", work / run),
                    target / "events.out.tfevents.lightning",
                )
            elif run == "keras":
                spawn(run, work / run, heldout, None)
                name = "log.csv" if heldout else "training.csv"
                shutil.copyfile(work / run / name, target / name)
            elif run == "transformers":
                spawn(run, work / run, heldout, target / "console.log")
                shutil.copyfile(
                    one("trainer/checkpoint-*/trainer_state.json", work / run), target / "trainer_state.json"
                )
                shutil.copyfile(
                    one("trainer/runs/*/events.out.tfevents.*", work / run),
                    target / "events.out.tfevents.trainer",
                )
            else:
                spawn(run, work / run, heldout, target / "console-json.log")
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.suffix not in (".py", ".md"):
            print(f"{path.relative_to(out)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
