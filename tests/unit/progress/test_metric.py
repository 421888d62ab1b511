"""The metric rule (``specon.progress.metric``): which name a log is read for, and what a
log that yields nothing says; and the printed dicts the text format reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from specon.config import ProgressConfig
from specon.progress import ProgressStats, Sample, SkipReason, Tailer, TextParser
from specon.progress.csvlog import CsvParser
from specon.progress.jsonl import JsonlParser
from specon.progress.metric import FALLBACKS, MAX_SEEN, MetricChoice, choose, is_lossy, no_records


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (["epoch", "step", "loss", "train_loss_step"], "loss"),  # the configured name first
        (["epoch", "step", "train_loss_epoch", "train_loss_step", "val_loss"], "train_loss_step"),
        (["epoch", "train_loss", "val_loss"], "train_loss"),
        (["train/loss", "train/grad_norm", "eval/loss"], "train/loss"),
        (["val_loss", "train_loss_epoch"], "train_loss_epoch"),
        (["epoch_loss", "epoch_accuracy"], "epoch_loss"),
        (["eval_loss", "eval_runtime"], "eval_loss"),
        (["val_acc", "val_loss"], "val_loss"),
        # No listed name: the first one ending in the word loss, training before validation.
        (["lr", "val_mse_loss", "train_mse_loss"], "train_mse_loss"),
        (["loss/train", "loss/val"], "loss/train"),
        (["val_total_loss"], "val_total_loss"),
        (["loss_scale", "lossy", "accuracy"], None),  # not a loss
        ([], None),
    ],
)
def test_the_default_metric_falls_back_by_the_rule(names: list[str], chosen: str | None) -> None:
    assert choose("loss", names) == chosen


def test_a_metric_named_on_purpose_has_no_fallback() -> None:
    assert choose("val_loss", ["train_loss", "val_loss"]) == "val_loss"
    assert choose("trian_loss", ["train_loss", "val_loss"]) is None


def test_fallbacks_are_all_losses() -> None:
    assert all(is_lossy(name) for name in FALLBACKS)
    assert not is_lossy("loss_scale") and is_lossy("Loss") and is_lossy("train_loss_step")


def test_the_choice_is_made_once_and_kept() -> None:
    choice = MetricChoice()
    assert choice.offer(["event", "step"]) is None  # no candidate yet: still open
    assert choice.offer(["eval_loss", "step"]) == "eval_loss"
    assert choice.offer(["loss", "step"]) == "eval_loss"  # a better name later changes nothing
    assert choice.fallback and choice.metric == "eval_loss"
    assert choice.seen == ["event", "step", "eval_loss"]  # names stop being noted once chosen
    assert "eval_loss" in choice.describe() and "rule" in choice.describe()


def test_names_seen_are_bounded() -> None:
    choice = MetricChoice("nothing")
    for i in range(3):
        choice.offer(f"name{i}_{j}" for j in range(MAX_SEEN))
    assert len(choice.seen) == MAX_SEEN


def test_no_records_lists_the_names_and_suggests_the_nearest() -> None:
    choice = MetricChoice("trian_loss")
    choice.offer(["epoch", "step", "train_loss_epoch", "train_loss_step", "val_loss"])
    message = no_records(choice, kind="columns")
    assert message == (
        "no column 'trian_loss'; columns seen: epoch, step, train_loss_epoch, train_loss_step, "
        "val_loss; did you mean --metric train_loss_step?"
    )
    choice = MetricChoice()
    choice.offer(["epoch", "accuracy"])
    assert no_records(choice, kind="tags").endswith("choose one with --metric NAME")
    assert no_records(MetricChoice(), kind="keys") == "no keys with numbers found"
    chosen = MetricChoice()
    chosen.offer(["loss"])
    assert no_records(chosen, kind="keys") == "the key 'loss' holds no finite number"


def test_csv_parser_chooses_the_column_from_the_header() -> None:
    parser = CsvParser(ProgressConfig())
    lines = [
        b"epoch,step,train_loss_epoch,train_loss_step,val_loss",
        b"0,3,,7.5,",
        b"0,3,,,0.25",
        b"0,3,3.9,,",
    ]
    assert [parser.parse(line) for line in lines] == [
        SkipReason.HEADER,
        Sample(7.5, step=3),
        SkipReason.NO_METRIC,
        SkipReason.NO_METRIC,
    ]
    assert parser.choice.chosen == "train_loss_step"


def test_jsonl_parser_chooses_at_the_first_record_with_a_candidate() -> None:
    parser = JsonlParser(ProgressConfig())
    block = b'{"event": "started"}\n{"step": 5, "eval_loss": 0.7}\n{"step": 6, "loss": 0.5, "eval_loss": 0.6}'
    out: list[Sample] = []
    stats = ProgressStats()
    parser.parse_block(block, out, stats)
    assert out == [Sample(0.7, step=5), Sample(0.6, step=6)]
    assert stats.skipped[SkipReason.NO_METRIC] == 1 and parser.choice.chosen == "eval_loss"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # The Trainer's console (transformers 5 prints numbers as strings), after its bars.
        (
            b"\r 15%|#5  | 9/60\r          \r{'loss': '0.6518', 'grad_norm': '0.9153', 'epoch': '0.5'}",
            Sample(0.6518),
        ),
        (b"{'loss': 1.9, 'grad_norm': 0.5, 'learning_rate': 4e-05, 'epoch': 0.1}", Sample(1.9)),
        (b'{"loss": 1.9, "step": 4, "epoch": 0.1}', Sample(1.9, step=4)),  # JSON style
        (b"{'loss': nan, 'epoch': 1.0}", SkipReason.NONFINITE),
        (b"{'eval_loss': '0.1', 'epoch': '1'}", SkipReason.NO_METRIC),  # once loss is chosen
        (b"{'train_runtime': '52.9', 'train_loss': '0.21', 'epoch': '3'}", SkipReason.NO_METRIC),
    ],
)
def test_text_reads_printed_dicts(line: bytes, expected: Sample | SkipReason) -> None:
    parser = TextParser(ProgressConfig())
    parser.parse(b"loss: 1.0")  # a log that has loss
    assert parser.parse(line) == expected


def test_text_chooses_a_named_number_when_the_log_has_no_loss() -> None:
    parser = TextParser(ProgressConfig())
    assert parser.parse(b"epoch 1 lr: 0.1") is SkipReason.NO_METRIC
    assert parser.parse(b"epoch 1 train_loss: 0.5 val_loss=0.7") == Sample(0.5)
    assert parser.parse(b"epoch 2 train_loss: 0.4 val_loss=0.6") == Sample(0.4)
    assert parser.choice.chosen == "train_loss"


def test_text_follows_a_choice_made_by_a_printed_dict() -> None:
    parser = TextParser(ProgressConfig())
    assert parser.parse(b"{'train/loss': '0.5'}") == Sample(0.5)
    assert parser.parse(b"step 2 train/loss: 0.25") == Sample(0.25)


def test_the_tailer_logs_the_metric_the_rule_chose(tmp_path: Path) -> None:
    log = tmp_path / "metrics.csv"
    log.write_bytes(b"epoch,step,train_loss_step\n0,1,2.5\n")
    with structlog.testing.capture_logs() as logs, Tailer(log) as tailer:
        assert tailer.poll() == [Sample(2.5, step=1)]
        tailer.poll()
    chosen = [entry for entry in logs if entry["event"] == "specon.progress.metric_chosen"]
    assert chosen == [
        {
            "event": "specon.progress.metric_chosen",
            "log_level": "info",
            "log": f"Tailer({str(log)!r})",
            "metric": "train_loss_step",
            "requested": "loss",
        }
    ]
