"""Progress log formats: JSON lines, CSV (Keras / Lightning CSVLogger shapes), free text, detection."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from specon.config import ProgressConfig
from specon.progress import (
    CsvParser,
    JsonlParser,
    LineParser,
    ProgressStats,
    Sample,
    SkipReason,
    TextParser,
    compile_metric_regex,
    detect_format,
    make_parser,
    read_file,
)

DEFAULT = ProgressConfig()


def parse_all(parser: LineParser, lines: list[bytes]) -> list[Sample | SkipReason]:
    return [parser.parse(line) for line in lines]


def block_results(parser: LineParser, block: bytes) -> tuple[list[Sample], ProgressStats]:
    out: list[Sample] = []
    stats = ProgressStats()
    parser.parse_block(block, out, stats)
    return out, stats


# --- free text -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "value"),
    [
        (b"loss: 0.123", 0.123),
        (b"loss=0.123", 0.123),
        (b"Loss 0.123", 0.123),
        (b"Epoch 3 ... loss: 1.2e-3", 1.2e-3),
        (b"LOSS=-2.5E+01", -25.0),
        (b"step 7 | train loss .5 | lr 0.01", 0.5),
        # PyTorch's MNIST example.
        (b"Train Epoch: 1 [0/60000 (0%)]\tLoss: 2.305134", 2.305134),
        (b"Epoch 00012: loss = 0.0421, acc = 0.98\r", 0.0421),
    ],
)
def test_text_default_regex_reads_common_prints(line: bytes, value: float) -> None:
    assert TextParser(DEFAULT).parse(line) == Sample(value)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"lr: 0.3", SkipReason.NO_METRIC),  # a number, but no loss
        (b"Starting training", SkipReason.NO_METRIC),
        (b"loss increased", SkipReason.NO_METRIC),
        (b"loss: nan", SkipReason.NONFINITE),
        (b"loss: NaN", SkipReason.NONFINITE),
        (b"loss = inf", SkipReason.NONFINITE),
        (b"loss: -Infinity", SkipReason.NONFINITE),
        (b"   ", SkipReason.BLANK),
        (b"\xff\xfe loss: 1.0", SkipReason.UNPARSABLE),
    ],
)
def test_text_skips(line: bytes, reason: SkipReason) -> None:
    assert TextParser(DEFAULT).parse(line) is reason


def test_text_reads_the_chosen_metric_not_a_substring_match() -> None:
    parser = TextParser(DEFAULT)
    assert parser.parse(b"loss: 0.5") == Sample(0.5)
    assert parser.parse(b"val_loss: 0.3") is SkipReason.NO_METRIC


def test_text_metric_name_is_escaped_and_configurable() -> None:
    parser = TextParser(ProgressConfig(metric="acc@1"))
    assert parser.parse(b"epoch 2 acc@1: 71.5 loss: 1.1") == Sample(71.5)
    assert parser.parse(b"epoch 2 accX1: 71.5") is SkipReason.NO_METRIC


def test_text_named_groups_give_value_step_and_time() -> None:
    config = ProgressConfig(regex=r"^(?P<ts>\S+) it=(?P<step>\d+) {metric}=(?P<value>\S+)")
    parsed = TextParser(config).parse(b"2024-01-01T00:00:00+00:00 it=42 loss=0.25")
    assert parsed == Sample(0.25, ts=1704067200.0, step=42)


def test_text_regex_capturing_a_non_number_is_unparsable() -> None:
    parser = TextParser(ProgressConfig(regex=r"{metric}=(\S*)"))
    assert parser.parse(b"loss=abc") is SkipReason.UNPARSABLE
    assert parser.parse(b"loss= ") is SkipReason.UNPARSABLE


@pytest.mark.parametrize(
    ("regex", "message"), [(r"{metric}: ([0-9", "does not compile"), (r"{metric}", "group")]
)
def test_bad_regex_is_a_clear_error(regex: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compile_metric_regex(regex, "loss")
    with pytest.raises(ValueError, match=message):
        TextParser(ProgressConfig(regex=regex))


# --- JSON lines ------------------------------------------------------------------------------


def test_jsonl_reads_value_step_and_epoch_seconds() -> None:
    parsed = JsonlParser(DEFAULT).parse(b'{"step": 10, "loss": 0.5, "ts": 1700000000.1}')
    assert parsed == Sample(0.5, ts=1700000000.1, step=10)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"loss": 1}', Sample(1.0)),
        (b'{"loss": "0.25"}', Sample(0.25)),
        (b'{"epoch": 3, "loss": 1.5}', Sample(1.5, step=3)),
        (b'{"iteration": 7, "loss": 1.5}', Sample(1.5, step=7)),
        (b'{"epoch": 3, "step": 300, "loss": 1.5}', Sample(1.5, step=300)),  # step wins over epoch
        (b'{"step": 4.0, "loss": 1.5}', Sample(1.5, step=4)),
        (b'{"step": "12", "loss": 1.5}', Sample(1.5, step=12)),
        (b'{"step": 4.5, "loss": 1.5}', Sample(1.5)),  # not a step
        (b'{"loss": 2, "time": 1700000000}', Sample(2.0, ts=1700000000.0)),
        (b'{"loss": 2, "timestamp": "2024-01-01T00:00:00Z"}', Sample(2.0, ts=1704067200.0)),
        (b'{"loss": 2, "ts": "2024-01-01T02:00:00+02:00"}', Sample(2.0, ts=1704067200.0)),
        (b'{"loss": 2, "ts": "1700000000.5"}', Sample(2.0, ts=1700000000.5)),
        (b'{"loss": 2, "ts": "yesterday"}', Sample(2.0)),
        (b'{"loss": 2, "ts": NaN}', Sample(2.0)),
        (b'\xef\xbb\xbf{"loss": 2}', Sample(2.0)),  # BOM on the first line
        (b'  {"loss": 2}\r', Sample(2.0)),
        (b'{"loss": 1, "loss": 3}', Sample(3.0)),  # duplicate keys: the last wins, as in json
    ],
)
def test_jsonl_records(line: bytes, expected: Sample) -> None:
    assert JsonlParser(DEFAULT).parse(line) == expected


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"loss": NaN}', SkipReason.NONFINITE),
        (b'{"loss": Infinity}', SkipReason.NONFINITE),
        (b'{"loss": -Infinity}', SkipReason.NONFINITE),
        (b'{"loss": "NaN"}', SkipReason.NONFINITE),
        (b'{"loss": 1e999}', SkipReason.NONFINITE),
        (b'{"loss": ' + b"9" * 400 + b"}", SkipReason.NONFINITE),  # an int beyond float range
        (b'{"loss": null}', SkipReason.NO_METRIC),
        (b'{"loss": ""}', SkipReason.NO_METRIC),
        (b'{"acc": 0.9}', SkipReason.NO_METRIC),
        (b'{"val": {"loss": 0.5}}', SkipReason.NO_METRIC),  # flat keys only
        (b'{"loss": true}', SkipReason.UNPARSABLE),
        (b'{"loss": [0.5]}', SkipReason.UNPARSABLE),
        (b'{"loss": "low"}', SkipReason.UNPARSABLE),
        (b"[1, 2]", SkipReason.UNPARSABLE),
        (b"0.5", SkipReason.UNPARSABLE),
        (b'{"loss": 0.5', SkipReason.UNPARSABLE),
        (b"loss: 0.5", SkipReason.UNPARSABLE),
        (b'{"loss": 0.5, "note": "\xff"}', SkipReason.UNPARSABLE),
        (b"[" * 100_000, SkipReason.UNPARSABLE),  # deep nesting must not escape as RecursionError
        (b"", SkipReason.BLANK),
        (b" \t\r", SkipReason.BLANK),
    ],
)
def test_jsonl_skips(line: bytes, reason: SkipReason) -> None:
    assert JsonlParser(DEFAULT).parse(line) is reason


@pytest.mark.parametrize("metric", ["val/loss", "train_loss", "val.loss", "loss/train_epoch"])
def test_jsonl_metric_names_match_flat_keys_literally(metric: str) -> None:
    parser = JsonlParser(ProgressConfig(metric=metric))
    assert parser.parse(json.dumps({metric: 0.75, "step": 5}).encode()) == Sample(0.75, step=5)
    assert parser.parse(b'{"val": {"loss": 0.75}}') is SkipReason.NO_METRIC


def test_over_long_lines_are_skipped_by_every_parser() -> None:
    config = ProgressConfig(max_line_bytes=16, format="csv")
    for parser in (JsonlParser(config), TextParser(config), CsvParser(config)):
        assert parser.parse(b'{"loss": 0.123456789}') is SkipReason.TOO_LONG
        assert parser.parse(b"x" * 16) is not SkipReason.TOO_LONG


def test_jsonl_block_matches_line_by_line_on_the_fast_path() -> None:
    lines = [json.dumps({"step": i, "loss": i / 10, "ts": 1e9 + i}).encode() for i in range(50)]
    lines += [b'{"loss": NaN}', b'{"acc": 1}', b'{"loss": null, "step": 3}', b'{"loss": 1, "step": "x"}']
    parser = JsonlParser(DEFAULT)
    out, stats = block_results(parser, b"\n".join(lines))
    expected = parse_all(parser, lines)
    assert out == [r for r in expected if isinstance(r, Sample)]
    assert stats.lines == len(lines) == stats.samples + stats.total_skipped
    assert stats.skipped[SkipReason.NONFINITE] == 1 and stats.skipped[SkipReason.NO_METRIC] == 2


def test_jsonl_block_is_not_fooled_by_records_spanning_lines() -> None:
    # Joined into one JSON array these lines would parse as three objects, two with a
    # loss; read one by one, none is a valid record.
    lines = [b'{"loss": 1},{"loss": 2}', b'{"a": [{}', b"{}]}", b'{"x": "}', b'{"}']
    parser = JsonlParser(DEFAULT)
    out, stats = block_results(parser, b"\n".join(lines))
    assert out == []
    assert stats.skipped[SkipReason.UNPARSABLE] == len(lines)


# --- CSV -------------------------------------------------------------------------------------


def write_keras_csv(path: Path, rows: list[dict[str, object]], *, sep: str = ",") -> None:
    """What keras.callbacks.CSVLogger writes: ``epoch`` then the sorted log keys, excel
    dialect (CRLF line ends), ``NA`` for a key missing from an epoch's logs."""
    keys = sorted({k for row in rows for k in row})

    class Dialect(csv.excel):
        delimiter = sep

    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["epoch", *keys], dialect=Dialect)
        writer.writeheader()
        for epoch, row in enumerate(rows):
            writer.writerow({"epoch": epoch, **{k: row.get(k, "NA") for k in keys}})


def lightning_metrics_csv(rows: list[dict[str, object]]) -> str:
    """What Lightning's CSVLogger writes to metrics.csv: sorted keys, DictWriter, every
    row carrying only the metrics logged at that step (the other cells empty)."""
    keys = sorted({k for row in rows for k in row})
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def test_keras_csvlogger_file(tmp_path: Path) -> None:
    path = tmp_path / "training.log"
    write_keras_csv(
        path,
        [
            {"loss": 0.91, "accuracy": 0.7, "val_loss": 0.8, "val_accuracy": 0.72},
            {"loss": 0.52, "accuracy": 0.85, "val_loss": 0.49, "val_accuracy": 0.86},
            {"loss": float("nan"), "accuracy": 0.1, "val_loss": 0.6, "val_accuracy": 0.5},
            {"loss": 0.31, "accuracy": 0.9},  # no validation this epoch: NA cells
        ],
    )
    assert path.read_bytes().startswith(b"epoch,accuracy,loss,val_accuracy,val_loss\r\n")
    samples, stats = read_file(path)
    assert samples == [Sample(0.91, step=0), Sample(0.52, step=1), Sample(0.31, step=3)]
    assert stats.skipped[SkipReason.HEADER] == 1 and stats.skipped[SkipReason.NONFINITE] == 1

    val, _ = read_file(path, ProgressConfig(metric="val_loss"))
    assert val == [Sample(0.8, step=0), Sample(0.49, step=1), Sample(0.6, step=2)]
    _, val_stats = read_file(path, ProgressConfig(metric="val_loss"))
    assert val_stats.skipped[SkipReason.NO_METRIC] == 1  # the NA cell


def test_keras_csvlogger_with_semicolon_separator(tmp_path: Path) -> None:
    path = tmp_path / "training.log"
    write_keras_csv(path, [{"loss": 0.9}, {"loss": 0.4}], sep=";")
    samples, _ = read_file(path, ProgressConfig(format="csv"))
    assert samples == [Sample(0.9, step=0), Sample(0.4, step=1)]


def test_lightning_metrics_csv_with_empty_cells(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"epoch": 0, "step": 49, "train_loss": 0.69},
        {"epoch": 0, "step": 99, "train_loss": 0.61},
        {"epoch": 0, "step": 99, "val_loss": 0.55, "val_acc": 0.81},
        {"epoch": 1, "step": 149, "train_loss": 0.48},
        {"epoch": 1, "step": 199, "val_loss": 0.44, "val_acc": 0.86},
    ]
    path = tmp_path / "metrics.csv"
    path.write_text(lightning_metrics_csv(rows), newline="")
    assert path.read_bytes().splitlines()[:3] == [
        b"epoch,step,train_loss,val_acc,val_loss",
        b"0,49,0.69,,",
        b"0,99,0.61,,",
    ]
    train, stats = read_file(path, ProgressConfig(metric="train_loss"))
    assert train == [Sample(0.69, step=49), Sample(0.61, step=99), Sample(0.48, step=149)]
    # Rows logging other metrics are "no metric", not errors.
    assert stats.skipped[SkipReason.NO_METRIC] == 2 and stats.skipped[SkipReason.UNPARSABLE] == 0
    val, _ = read_file(path, ProgressConfig(metric="val_loss"))
    assert val == [Sample(0.55, step=99), Sample(0.44, step=199)]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # Tab-delimited, with the metric's cell empty at the line end.
        (
            [b"step\tloss\tacc", b"1\t0.5\t0.1", b"2\t\t0.2", b"3\t0.25\t"],
            [Sample(0.5, step=1), Sample(0.25, step=3)],
        ),
        # Quoted header and cells.
        ([b'"step","loss"', b'"5","0.5"'], [Sample(0.5, step=5)]),
        # Timestamps in a ts column (numbers or ISO-8601).
        (
            [b"ts,loss", b"1700000000,1.5", b"2024-01-01T00:00:00Z,1.0"],
            [Sample(1.5, ts=1.7e9), Sample(1.0, ts=1704067200.0)],
        ),
        # Blank lines before the header are skipped.
        ([b"", b"\xef\xbb\xbfepoch,loss", b"0,2"], [Sample(2.0, step=0)]),
    ],
)
def test_csv_shapes(lines: list[bytes], expected: list[Sample]) -> None:
    results = parse_all(CsvParser(DEFAULT), lines)
    assert [r for r in results if isinstance(r, Sample)] == expected


def test_csv_skips() -> None:
    parser = CsvParser(DEFAULT)
    results = parse_all(
        parser,
        [b"0.5,0.4", b"epoch,loss", b"1,0.5,9", b"2,abc", b"3,inf", b"4,NaN", b'5,"0.5', b"\xff,1", b"6,0.1"],
    )
    assert results == [
        SkipReason.UNPARSABLE,  # numbers before any header
        SkipReason.HEADER,
        SkipReason.UNPARSABLE,  # wrong cell count
        SkipReason.UNPARSABLE,
        SkipReason.NONFINITE,
        SkipReason.NONFINITE,
        SkipReason.UNPARSABLE,  # broken quoting
        SkipReason.UNPARSABLE,  # not UTF-8
        Sample(0.1, step=6),
    ]
    assert parser.header == ("epoch", "loss")


def test_csv_without_the_metric_column_reports_no_metric() -> None:
    assert parse_all(CsvParser(DEFAULT), [b"epoch,acc", b"0,0.9"]) == [
        SkipReason.HEADER,
        SkipReason.NO_METRIC,
    ]


def test_csv_restart_reads_a_headerless_continuation_with_the_old_header() -> None:
    parser = CsvParser(DEFAULT)
    parse_all(parser, [b"epoch,loss,val_loss", b"0,0.9,0.8"])
    for rewritten in (False, True):
        after = parser.restart(rewritten=rewritten)
        assert parse_all(after, [b"1,0.5,0.4"]) == [Sample(0.5, step=1)]


def test_csv_rewrite_with_a_wider_header_skips_the_rows_written_again() -> None:
    # Lightning rewrites metrics.csv with the new header when new keys appear.
    before = [b"epoch,step,train_loss", b"0,49,0.69", b"0,99,0.61"]
    after = [b"epoch,step,train_loss,val_loss", b"0,49,0.69,", b"0,99,0.61,", b"0,99,,0.55", b"1,149,0.48,"]
    parser = CsvParser(ProgressConfig(metric="train_loss"))
    parse_all(parser, before)
    rewritten = parse_all(parser.restart(rewritten=True), after)
    assert rewritten[1:3] == [SkipReason.REPLAYED, SkipReason.REPLAYED]
    assert [r for r in rewritten if isinstance(r, Sample)] == [Sample(0.48, step=149)]
    # A new file (rotation), the same header or other first rows (a restarted job) are read in full.
    new_run = [after[0], b"0,49,0.95,", *after[2:]]
    for restarted, lines in (
        (parser.restart(rewritten=False), after),
        (parser.restart(rewritten=True), before),
        (parser.restart(rewritten=True), new_run),
    ):
        assert SkipReason.REPLAYED not in parse_all(restarted, lines)


# --- detection and construction ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "fmt"),
    [
        ([b'{"step": 1, "loss": 0.5}'], "jsonl"),
        ([b"", b'  {"loss": 0.5}  ', b"junk"], "jsonl"),
        ([b"starting", b'{"loss": 0.5}'], "jsonl"),
        ([b"epoch,loss,val_loss", b"0,0.5,0.4"], "csv"),
        ([b"epoch,loss,val_loss"], "csv"),
        ([b"epoch;loss", b"0;0.5"], "csv"),
        ([b"step\tloss", b"0\t0.5"], "csv"),
        ([b"epoch,step,train_loss,val_loss", b"0,49,0.69,"], "csv"),
        ([b"epoch,loss", b"a line of text"], "text"),
        ([b"Epoch 1, loss: 0.5"], "text"),
        ([b"2024-01-01 10:00:00,123 INFO loss: 0.5"], "text"),
        ([b"Train Epoch: 1 [0/60000 (0%)]\tLoss: 2.305134"], "text"),
        ([b"loss"], "text"),
        ([b"{not json"], "text"),
        ([], "text"),
        ([b"\x00\xff\xfe"], "text"),
    ],
)
def test_detect_format(lines: list[bytes], fmt: str) -> None:
    assert detect_format(lines) == fmt


def test_make_parser() -> None:
    assert isinstance(make_parser("csv", DEFAULT), CsvParser)
    with pytest.raises(ValueError, match="unknown progress format"):
        make_parser("xml", DEFAULT)  # type: ignore[arg-type]
