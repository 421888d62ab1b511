"""``specon classify`` on the logs the frameworks wrote (tests/data/frameworks), with the
defaults: the format and metric found, the records read, the spacing said; and the errors
of a log that yields nothing, an ignored ``--alpha``."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from specon.cli.main import main
from specon.progress import tfevents

FRAMEWORKS = Path(__file__).resolve().parents[2] / "data" / "frameworks"


def fixture_copy(tmp_path: Path, name: str) -> Path:
    """A fresh copy: written in one go, so its file times tell nothing (the tick rule)."""
    copy = tmp_path / Path(name).name
    shutil.copyfile(FRAMEWORKS / name, copy)
    return copy


def classify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["classify", "--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("lightning/metrics.csv", ("csv", "train_loss_step", 64)),
        ("keras/training.csv", ("csv", "loss", 40)),
        ("transformers/trainer_state.json", ("trainer_state", "loss", 30)),
        ("transformers/console.log", ("text", "loss", 30)),
        ("transformers/console-json.log", ("jsonl", "loss", 30)),
    ],
)
def test_untimed_framework_logs_are_read_with_the_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, expected: tuple[str, str, int]
) -> None:
    code, (doc,), err = classify(capsys, str(fixture_copy(tmp_path, name)))
    assert (code, err) == (0, "")
    assert (doc["format"], doc["metric"], doc["records"]) == expected
    # No timestamps, and a copy's times tell nothing: one record per 30 s tick.
    assert doc["spacing"] == {"untimed": expected[2], "seconds": 30.0, "rule": "tick"}
    # Read one per tick, each of these training runs converges (Keras's stayed "progressing"
    # when its records were placed 1 s apart).
    assert doc["final"] == "converged"


@pytest.mark.parametrize(
    ("name", "metric", "records"),
    [
        ("lightning/events.out.tfevents.lightning", "train_loss_step", 64),
        ("transformers/events.out.tfevents.trainer", "train/loss", 30),
    ],
)
def test_tensorboard_event_files_are_read_with_their_times(
    capsys: pytest.CaptureFixture[str], name: str, metric: str, records: int
) -> None:
    code, (doc,), err = classify(capsys, str(FRAMEWORKS / name))
    assert (code, err) == (0, "")
    assert (doc["format"], doc["metric"], doc["records"], doc["spacing"]) == (
        "tensorboard",
        metric,
        records,
        None,
    )
    # The runs took seconds of wall time: the whole log falls in the first ticks.
    assert doc["final"] == "progressing" and doc["request_at"] is None


def test_the_text_output_says_the_metric_the_rule_chose_and_the_spacing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = fixture_copy(tmp_path, "lightning/metrics.csv")
    assert main(["classify", str(path)]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith(
        f"{path}: csv, metric train_loss_step (no 'loss' in the log: the metric rule chose it); "
    )
    assert "64 records, 16 skipped" in first and "(robust, doubling test, gain 0.11)" in first
    assert "alpha" not in first  # the default classifier does not use it
    assert "64 records without timestamps, placed 30 s apart (one per categorisation interval" in out


def test_a_file_written_over_time_spreads_its_records_over_its_lifetime(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = fixture_copy(tmp_path, "keras/training.csv")
    now = time.time()
    os.utime(path, (now, now + 1200))  # last written 20 minutes after it was created
    code, (doc,), _ = classify(capsys, str(path))
    assert code == 0
    spacing = doc["spacing"]
    assert spacing["rule"] == "lifetime" and spacing["untimed"] == 40
    assert spacing["seconds"] == pytest.approx(1200 / 40, rel=0.01)
    _, (given,), _ = classify(capsys, "--seconds-per-record", "5", str(path))
    assert given["spacing"] == {"untimed": 40, "seconds": 5.0, "rule": "given"}


def test_a_misspelt_metric_lists_the_columns_and_suggests_the_nearest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = FRAMEWORKS / "lightning" / "metrics.csv"
    code, docs, err = classify(capsys, "--metric", "trian_loss", str(path))
    assert (code, docs) == (2, [])
    assert err == (
        f"specon classify: {path}: no records of the metric in this csv log, 81 lines (80 no_metric, "
        "1 header): no column 'trian_loss'; columns seen: epoch, step, train_loss_epoch, train_loss_step, "
        "val_loss; did you mean --metric train_loss_step?\n"
    )


def test_an_event_file_without_the_metric_lists_its_tags(capsys: pytest.CaptureFixture[str]) -> None:
    path = FRAMEWORKS / "transformers" / "events.out.tfevents.trainer"
    code, _, err = classify(capsys, "--metric", "eval/los", str(path))
    assert code == 2
    assert "no tag 'eval/los'; tags seen: train/loss, train/grad_norm" in err
    assert err.rstrip().endswith("did you mean --metric eval/loss?")


def test_a_log_with_no_loss_at_all_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "acc.csv"
    path.write_text("epoch,accuracy,val_accuracy\n0,0.5,0.4\n1,0.6,0.5\n")
    code, _, err = classify(capsys, str(path))
    assert code == 2
    assert err.endswith(
        "no column 'loss'; columns seen: epoch, accuracy, val_accuracy; choose one with --metric NAME\n"
    )


def test_an_empty_log_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    code, docs, err = classify(capsys, str(empty), str(fixture_copy(tmp_path, "keras/training.csv")))
    assert code == 2
    assert err == f"specon classify: {empty}: empty file: no records to classify\n"
    assert [d["format"] for d in docs] == ["csv"]  # the other file is still classified


def test_an_event_file_without_the_extra_names_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tfevents, "_MISSING", ImportError("No module named 'tensorboard'"))
    path = FRAMEWORKS / "lightning" / "events.out.tfevents.lightning"
    code, _, err = classify(capsys, str(path))
    assert code == 2
    assert (
        "a TensorBoard event file: reading it needs the tensorboard extra (pip install 'specon[tensorboard]')"
        in err
    )


def test_alpha_is_said_to_be_ignored_by_the_doubling_test(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = str(fixture_copy(tmp_path, "keras/training.csv"))
    _, plain, _ = classify(capsys, path)
    code, with_alpha, err = classify(capsys, "--alpha", "0.5", path)
    assert code == 0 and with_alpha == plain
    assert err.startswith("specon classify: --alpha 0.5 is ignored: the robust classifier's doubling test")
    # Where alpha is read, it is applied and shown, and nothing is said.
    assert main(["classify", "--classifier", "specon", "--alpha", "0.5", path]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "(specon, alpha 0.5)" in out
