"""``specon classify`` on the sample logs in tests/data/logs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specon.cli.main import main

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
CLASSIFIERS = ["specon", "robust"]


def classify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["classify", "--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, docs, err = classify(capsys, str(LOGS / "converging.jsonl"))
    assert (code, err) == (0, "")
    (doc,) = docs
    assert list(doc) == [
        "file",
        "format",
        "metric",
        "records",
        "skipped",
        "spacing",
        "transitions",
        "request_at",
        "final",
    ]
    assert doc["file"] == str(LOGS / "converging.jsonl")
    assert (doc["format"], doc["metric"], doc["records"], doc["skipped"]) == ("jsonl", "loss", 300, 0)
    assert doc["spacing"] is None  # every record has its timestamp
    assert isinstance(doc["request_at"], float)
    assert doc["transitions"][0] == {"t": doc["transitions"][0]["t"], "from": "progressing", "to": "watching"}
    for tr in doc["transitions"]:
        assert list(tr) == ["t", "from", "to"] and isinstance(tr["t"], float)
        assert {tr["from"], tr["to"]} <= {"progressing", "watching", "converged", "diverging", "stalled"}


@pytest.mark.parametrize("classifier", CLASSIFIERS)
def test_converging_job_converges_and_requests(capsys: pytest.CaptureFixture[str], classifier: str) -> None:
    _, (doc,), _ = classify(capsys, "--classifier", classifier, str(LOGS / "converging.jsonl"))
    assert doc["final"] == "converged"
    assert doc["request_at"] is not None
    converged_at = min(t["t"] for t in doc["transitions"] if t["to"] == "converged")
    assert doc["request_at"] >= converged_at  # the robust test may request on the tick it converges


@pytest.mark.parametrize("classifier", CLASSIFIERS)
def test_diverging_job_never_requests(capsys: pytest.CaptureFixture[str], classifier: str) -> None:
    _, (doc,), _ = classify(capsys, "--classifier", classifier, str(LOGS / "diverging.jsonl"))
    assert doc["request_at"] is None
    assert doc["skipped"] == 24  # the NaN tail
    assert all(t["to"] != "converged" for t in doc["transitions"])
    if classifier == "robust":
        assert doc["final"] == "diverging"


@pytest.mark.parametrize("classifier", CLASSIFIERS)
def test_lr_drop_goes_from_converged_back_to_progressing(
    capsys: pytest.CaptureFixture[str], classifier: str
) -> None:
    _, (doc,), _ = classify(capsys, "--classifier", classifier, str(LOGS / "lr_drop.jsonl"))
    steps = [(t["from"], t["to"]) for t in doc["transitions"]]
    assert ("converged", "progressing") in steps
    first_cc = steps.index(("watching", "converged"))
    assert steps.index(("converged", "progressing")) > first_cc
    assert doc["request_at"] is not None


@pytest.mark.parametrize(
    ("name", "args", "records", "skipped"),
    [
        ("keras_training.csv", ["--seconds-per-record", "10"], 60, 0),
        ("lightning_metrics.csv", ["--metric", "train_loss", "--seconds-per-record", "5"], 120, 12),
        ("train.log", ["--format", "text", "--seconds-per-record", "10"], 110, 12),
    ],
)
def test_other_formats_are_read_and_replayed(
    capsys: pytest.CaptureFixture[str], name: str, args: list[str], records: int, skipped: int
) -> None:
    code, (doc,), _ = classify(capsys, *args, str(LOGS / name))
    assert code == 0
    assert (doc["records"], doc["skipped"]) == (records, skipped)
    assert doc["final"] == "converged"


def test_seconds_per_record_sets_the_time_of_untimed_records(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(LOGS / "keras_training.csv")
    _, (slow,), _ = classify(capsys, "--seconds-per-record", "20", path)
    _, (fast,), _ = classify(capsys, "--seconds-per-record", "10", path)
    assert slow["request_at"] > fast["request_at"]


def test_missing_file_is_reported_and_the_others_still_processed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nope.jsonl"
    code, docs, err = classify(capsys, str(missing), str(LOGS / "converging.jsonl"))
    assert code == 2
    assert str(missing) in err
    assert [d["file"] for d in docs] == [str(LOGS / "converging.jsonl")]


@pytest.mark.slow
def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "categories.png"
    code = main(["classify", "--plot", str(out), str(LOGS / "lr_drop.jsonl"), str(LOGS / "diverging.jsonl")])
    assert code == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 100 and height > width / 2  # two stacked subplots
    assert "final:" in capsys.readouterr().out


@pytest.mark.slow
def test_unwritable_plot_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["classify", "--plot", str(tmp_path / "no" / "dir.png"), str(LOGS / "converging.jsonl")])
    assert code == 2
    assert "plot" in capsys.readouterr().err


def test_text_output_is_a_timeline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", "--classifier", "specon", str(LOGS / "diverging.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "156 records, 24 skipped" in out
    assert "24 nonfinite" in out
    assert "final: progressing (no request)" in out


def test_policy_file_supplies_settings_and_options_win(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("apiVersion: specon/v1alpha1\nkind: Policy\nmonitor:\n  classifier: robust\n")
    _, (doc,), _ = classify(capsys, "--policy", str(policy), str(LOGS / "diverging.jsonl"))
    assert doc["final"] == "diverging"
    _, (doc,), _ = classify(
        capsys, "--policy", str(policy), "--classifier", "specon", str(LOGS / "diverging.jsonl")
    )
    assert doc["final"] == "progressing"


def test_invalid_settings_are_reported_together(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", "--alpha", "-1", "--interval", "0", str(LOGS / "converging.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "monitor.alpha" in err and "monitor.interval" in err


def test_negative_seconds_per_record_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["classify", "--seconds-per-record", "-2", str(LOGS / "keras_training.csv")])
    assert exc.value.code == 2
    assert "seconds-per-record" in capsys.readouterr().err
