"""``specon trace record``: a short real recording round-trips, is small and is repeatable."""

from __future__ import annotations

from pathlib import Path

import pytest

from specon.cli.main import main
from specon.sim.trace import Trace, load_traces, read_trace_file

pytest.importorskip("torch")
from specon.sim import record  # needs torch

STEPS = 30
STRIDE = 5


@pytest.fixture(scope="module")
def gru_trace() -> Trace:
    return record.record_trace("gru", seed=3, steps=STEPS, stride=STRIDE, machine="test machine")


@pytest.mark.slow
def test_records_every_stride_steps(gru_trace: Trace) -> None:
    assert (gru_trace.model, gru_trace.steps, gru_trace.stride) == ("gru", STEPS, STRIDE)
    assert len(gru_trace.losses) == STEPS // STRIDE
    assert gru_trace.step_cost > 0
    assert "gru seed 3" in gru_trace.source
    assert "test machine" in gru_trace.source


@pytest.mark.slow
def test_file_round_trips_and_is_small(gru_trace: Trace, tmp_path: Path) -> None:
    path = record.record_to(tmp_path / "traces", gru_trace, seed=3)
    assert path.name == "gru-seed3.json"
    assert read_trace_file(path) == [gru_trace]
    assert load_traces(tmp_path / "traces") == {"gru": [gru_trace]}
    assert path.stat().st_size < 1000


@pytest.mark.slow
def test_same_seed_same_losses(gru_trace: Trace) -> None:
    again = record.record_trace("gru", seed=3, steps=STEPS, stride=STRIDE)
    other = record.record_trace("gru", seed=4, steps=STEPS, stride=STRIDE)
    assert again.losses == gru_trace.losses
    assert other.losses != gru_trace.losses


@pytest.mark.slow
def test_raw_losses_not_averages() -> None:
    every = record.record_trace("gru", seed=3, steps=10, stride=1)
    strided = record.record_trace("gru", seed=3, steps=10, stride=5)
    assert strided.losses == (every.losses[4], every.losses[9])


@pytest.mark.parametrize(
    ("model", "steps", "stride", "message"),
    [("nope", 10, 5, "unknown model"), ("gru", 4, 5, "at least one stride"), ("gru", 10, 0, "stride")],
)
def test_bad_arguments(model: str, steps: int, stride: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        record.record_trace(model, seed=0, steps=steps, stride=stride)


@pytest.mark.slow
def test_cli_writes_one_file_per_model_and_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--models", "gru", "--seeds", "0,1", "--steps", "10", "--stride", "5", "--out", str(tmp_path)]
    code = main(["trace", "record", *args])
    out, err = capsys.readouterr()
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gru-seed0.json", "gru-seed1.json"]
    assert "gru-seed1.json" in out
    assert "gru seed 1: step 10/10" in err
    traces = load_traces(tmp_path)["gru"]
    assert [len(t.losses) for t in traces] == [2, 2]


def test_cli_unknown_model_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["trace", "record", "--models", "gru,nope", "--out", str(tmp_path)])
    assert code == 2
    assert "unknown model(s) nope" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
