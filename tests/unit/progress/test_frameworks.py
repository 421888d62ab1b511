"""The agent's tailer on framework logs as the frameworks write them: each log of
tests/data/frameworks is written again, piece by piece, by the framework's own writer
(Lightning's and Keras's ``CSVLogger``, the Trainer's ``TrainerState.save_to_json``,
PyTorch's ``SummaryWriter``) or appended as the Trainer's console grew, with a poll between
pieces; every record is read exactly once, as reading the finished file reads it."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from specon.progress import Sample, SkipReason, Tailer, read_log

FRAMEWORKS = Path(__file__).resolve().parents[2] / "data" / "frameworks"


def steps_of(samples: list[Sample]) -> list[int | None]:
    return [s.step for s in samples]


def test_the_trainer_console_read_as_it_grows(tmp_path: Path) -> None:
    data = (FRAMEWORKS / "transformers" / "console.log").read_bytes()
    whole = read_log(FRAMEWORKS / "transformers" / "console.log")
    path = tmp_path / "progress.jsonl"
    got: list[Sample] = []
    with Tailer(path) as tailer:
        for start in range(0, len(data), 97):  # lines cut anywhere, progress bars and all
            with path.open("ab") as f:
                f.write(data[start : start + 97])
            got += tailer.poll()
        got += tailer.flush()
        assert tailer.decoder is not None and tailer.decoder.format == "text"
    assert got == whole.samples and len(got) == 30


@pytest.mark.slow
def test_lightning_csvlogger_growing_and_rewriting_its_header(tmp_path: Path) -> None:
    from lightning.fabric.loggers import CSVLogger  # noqa: PLC0415

    fixture = FRAMEWORKS / "lightning" / "metrics.csv"
    with fixture.open(newline="") as f:
        rows = list(csv.DictReader(f))
    logger = CSVLogger(tmp_path, name="", version="", flush_logs_every_n_steps=10**9)
    path = Path(logger.experiment.metrics_file_path)
    got: list[Sample] = []
    headers = set()
    with Tailer(path) as tailer:
        for i, row in enumerate(rows, 1):
            metrics = {k: float(v) for k, v in row.items() if v and k != "step"}
            logger.log_metrics(metrics, step=int(row["step"]))
            if i % 7 == 0 or i == len(rows):
                logger.save()  # new keys: Lightning rewrites the file with a wider header
                headers.add(path.read_text().splitlines()[0])
                got += tailer.poll()
        stats = tailer.stats
    assert len(headers) > 1  # the header did grow, so the file was rewritten
    assert stats.skipped[SkipReason.REPLAYED] > 0
    assert got == read_log(fixture).samples
    assert len(got) == 64 and tailer.choice.chosen == "train_loss_step"


@pytest.mark.slow
def test_keras_csvlogger_epoch_by_epoch_and_after_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERAS_BACKEND", os.environ.get("KERAS_BACKEND", "torch"))  # read at first import
    from keras.callbacks import CSVLogger  # noqa: PLC0415

    fixture = FRAMEWORKS / "keras" / "training.csv"
    with fixture.open(newline="") as f:
        rows = list(csv.DictReader(f))
    path = tmp_path / "progress.jsonl"
    got: list[Sample] = []
    with Tailer(path) as tailer:
        for part in (rows[:25], rows[25:]):  # a migration between: the job resumes, appending
            logger = CSVLogger(str(path), append=True)
            logger.on_train_begin()
            for row in part:
                logger.on_epoch_end(int(row["epoch"]), {k: float(v) for k, v in row.items() if k != "epoch"})
                got += tailer.poll()
            logger.on_train_end()
    assert got == read_log(fixture).samples and len(got) == 40


@pytest.mark.slow
@pytest.mark.parametrize("how", ["in_place", "replaced"])
def test_trainer_state_saved_at_each_checkpoint(tmp_path: Path, how: str) -> None:
    from transformers import TrainerState  # noqa: PLC0415

    fixture = FRAMEWORKS / "transformers" / "trainer_state.json"
    history = json.loads(fixture.read_text())["log_history"]
    path = tmp_path / "trainer_state.json"
    got: list[Sample] = []
    with Tailer(path) as tailer:
        for end in range(4, len(history) + 4, 4):  # a save every four logs
            state = TrainerState(log_history=history[:end], global_step=history[:end][-1]["step"])
            if how == "in_place":
                state.save_to_json(str(path))
            else:  # checkpoint-N/trainer_state.json copied over the progress file
                checkpoint = tmp_path / f"checkpoint-{end}"
                checkpoint.mkdir()
                state.save_to_json(str(checkpoint / "trainer_state.json"))
                shutil.copyfile(checkpoint / "trainer_state.json", tmp_path / "next")
                (tmp_path / "next").rename(path)
            got += tailer.poll()
    assert got == read_log(fixture).samples and len(got) == 30
    assert steps_of(got) == sorted(set(steps_of(got)))  # each step once, in order


@pytest.mark.slow
def test_summary_writer_scalars_read_as_they_are_flushed(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

    writer = SummaryWriter(str(tmp_path), flush_secs=3600)
    (path,) = tmp_path.glob("events.out.tfevents.*")
    expected: list[tuple[float, int]] = []
    got: list[Sample] = []
    with Tailer(path) as tailer:
        for step in range(1, 61):
            loss = 2.0 / step
            writer.add_scalar("train/loss", loss, step)
            writer.add_scalar("train/learning_rate", 0.1, step)
            expected.append((loss, step))
            if step % 9 == 0:
                writer.flush()
                got += tailer.poll()
        writer.close()
        got += tailer.poll()
        assert tailer.choice.chosen == "train/loss"
    assert [(s.value, s.step) for s in got] == [(pytest.approx(v, rel=1e-6), k) for v, k in expected]
    assert all(s.ts is not None for s in got)
