"""Loss-curve traces: validation, interpolation, JSON round trip, loading a directory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specon.sim.trace import Trace, TraceError, load_traces, read_trace_file, write_trace_file


def _trace(model: str = "vae", stride: int = 10) -> Trace:
    return Trace(model, 40, 0.02, (4.0, 3.0, 2.5, 2.25), "test", stride)


def test_loss_at_reads_records_and_interpolates_between_them() -> None:
    t = _trace(stride=10)  # records after steps 10, 20, 30, 40
    assert t.loss_at(10) == 4.0
    assert t.loss_at(15) == pytest.approx(3.5)
    assert t.loss_at(40) == 2.25
    assert t.loss_at(0) == 4.0  # before the first record
    assert t.loss_at(1000) == 2.25  # after the last
    assert t.duration == pytest.approx(0.8)


def test_json_round_trip() -> None:
    t = _trace()
    assert Trace.from_json(json.loads(json.dumps(t.to_json()))) == t


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": 0}, "steps"),
        ({"step_cost": -1.0}, "step_cost"),
        ({"losses": []}, "losses is empty"),
        ({"losses": [1.0, math.nan]}, "non-finite"),
        ({"stride": 0}, "stride"),
        ({"steps": 2.5}, "integer"),
        ({"losses": "abc"}, "trace"),
    ],
)
def test_bad_traces_are_rejected_with_the_reason(change: dict[str, object], message: str) -> None:
    data = {**_trace().to_json(), **change}
    with pytest.raises(TraceError, match=message):
        Trace.from_json(data)


def test_missing_fields_are_named() -> None:
    with pytest.raises(TraceError, match="missing steps, losses"):
        Trace.from_json({"model": "vae", "step_cost": 1.0})


def test_load_traces_reads_objects_and_lists_by_model(tmp_path: Path) -> None:
    write_trace_file(tmp_path / "a.json", _trace("vae"))
    write_trace_file(tmp_path / "b.json", [_trace("gru"), _trace("vae", stride=5)])
    (tmp_path / "notes.txt").write_text("not a trace")
    got = load_traces(tmp_path)
    assert sorted(got) == ["gru", "vae"]
    assert [t.stride for t in got["vae"]] == [10, 5]  # file name order


def test_a_missing_directory_is_empty_and_a_bad_file_names_itself(tmp_path: Path) -> None:
    assert load_traces(tmp_path / "nowhere") == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TraceError, match=r"bad\.json"):
        read_trace_file(bad)
    with pytest.raises(TraceError, match=r"bad\.json"):
        load_traces(tmp_path)
