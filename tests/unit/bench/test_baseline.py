"""The regression guard: synthetic results against a synthetic baseline, the runner's end, and
the committed bench/baseline.json's shape."""

from __future__ import annotations

import json
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import baseline
from bench.__main__ import main as bench_main
from bench.figures import Figure


def _fig(
    name: str, value: float, unit: str = "s", better: str = "max", clock: str | None = None
) -> dict[str, Any]:
    return Figure(name, value, unit, better=better, clock=clock).as_dict()  # type: ignore[arg-type]


def _base(*figs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = baseline.entry({"benchmark": "bench_x", "figures": list(figs)})[
        "figures"
    ]
    return figures


def _status(base: dict[str, Any], new: dict[str, Any]) -> str:
    (v,) = baseline.judge("bench_x", _base(base), [new])
    return v.status


def test_a_figure_that_moved_more_than_ten_percent_the_wrong_way_is_flagged() -> None:
    # Lower is better (a latency): 15 % slower.
    assert _status(_fig("latency", 100.0), _fig("latency", 115.0)) == "regressed"
    # Higher is better (a rate; Figure.better "min": at least its target): 15 % fewer.
    assert _status(_fig("rate", 1000.0, "1/s", "min"), _fig("rate", 850.0, "1/s", "min")) == "regressed"


def test_an_improvement_is_not_flagged() -> None:
    assert _status(_fig("latency", 100.0), _fig("latency", 60.0)) == "improved"
    assert _status(_fig("rate", 1000.0, "1/s", "min"), _fig("rate", 2000.0, "1/s", "min")) == "improved"
    verdicts = baseline.judge("bench_x", _base(_fig("latency", 100.0)), [_fig("latency", 60.0)])
    lines = baseline.report(verdicts)
    assert not any("REGRESSED" in line for line in lines)
    assert lines[-1].startswith("no regression: 1 figure(s) judged")


@pytest.mark.parametrize(
    ("base", "value", "better", "status"),
    [
        (100.0, 110.0, "max", "steady"),  # exactly 10 %: not "more than"
        (100.0, 110.1, "max", "regressed"),
        (100.0, 90.0, "min", "steady"),
        (100.0, 89.9, "min", "regressed"),
        (0.3, 0.33, "max", "steady"),  # 0.1 x 0.3 is not exactly 0.03 in binary
        (100.0, 90.0, "max", "steady"),  # 10 % better is not yet "improved"
        (100.0, 89.9, "max", "improved"),
    ],
)
def test_the_ten_percent_edge(base: float, value: float, better: str, status: str) -> None:
    assert _status(_fig("f", base, better=better), _fig("f", value, better=better)) == status


def test_a_percentage_near_zero_may_drift_a_point_and_a_zero_count_may_not_grow() -> None:
    # "avg JCT change vs DS", lower is better: 0.5 points on a floor of 10 is 5 %.
    assert _status(_fig("jct", -2.0, "%"), _fig("jct", -1.5, "%")) == "steady"
    assert _status(_fig("jct", -2.0, "%"), _fig("jct", -0.9, "%")) == "regressed"
    assert _status(_fig("jct", -40.0, "%"), _fig("jct", -35.0, "%")) == "regressed"  # 12.5 %
    assert _status(_fig("failed", 0.0, "moves"), _fig("failed", 1.0, "moves")) == "regressed"
    assert _status(_fig("failed", 0.0, "moves"), _fig("failed", 0.0, "moves")) == "steady"
    (v,) = baseline.judge("bench_x", _base(_fig("failed", 0.0, "moves")), [_fig("failed", 1.0, "moves")])
    assert "from zero" in baseline.report([v])[-1]


def test_missing_new_and_broken_figures_are_listed_never_flagged() -> None:
    base = _base(_fig("kept", 1.0), _fig("gone", 2.0), _fig("unit", 3.0, "s"))
    measured = [_fig("kept", 1.0), _fig("fresh", 5.0), _fig("broken", math.nan), _fig("unit", 3.0, "ms")]
    by = {v.name: v.status for v in baseline.judge("bench_x", base, measured)}
    assert by == {
        "kept": "steady",
        "fresh": "new",
        "broken": "invalid",
        "unit": "invalid",
        "gone": "unmeasured",
    }
    text = "\n".join(baseline.report(baseline.judge("bench_x", base, measured)))
    assert "REGRESSED" not in text
    assert "unmeasured (1): bench_x: gone" in text
    assert "new (1): bench_x: fresh" in text
    assert "unit changed: 's' -> 'ms'" in text


def test_wall_clock_figures_are_not_judged_where_the_benchmark_has_cpu_figures() -> None:
    base = _base(
        _fig("rate (wall)", 1000.0, "1/s", "min", "wall"), _fig("cpu per beat", 0.4, "ms CPU", "max", "cpu")
    )
    slow_machine = [
        _fig("rate (wall)", 500.0, "1/s", "min", "wall"),  # a busy machine halves the wall rate
        _fig("cpu per beat", 0.41, "ms CPU", "max", "cpu"),
    ]
    by = {v.name: v.status for v in baseline.judge("bench_x", base, slow_machine)}
    assert by == {"rate (wall)": "unguarded", "cpu per beat": "steady"}
    # Without a CPU figure beside it, the wall one is all there is: judged.
    alone = baseline.judge("bench_x", {"rate (wall)": base["rate (wall)"]}, slow_machine[:1])
    assert alone[0].status == "regressed"


def _result(name: str, quick: bool, *figs: dict[str, Any]) -> dict[str, Any]:
    return {"benchmark": name, "quick": quick, "python": "3.11", "machine": "x86_64", "figures": list(figs)}


def test_quick_runs_are_compared_with_quick_baselines_only() -> None:
    doc = baseline.load(Path("/nonexistent/baseline.json"))
    baseline.update(doc, [_result("bench_x", False, _fig("latency", 100.0))])
    verdicts, notes = baseline.check(doc, [_result("bench_x", True, _fig("latency", 500.0))])
    assert verdicts == []
    assert notes == ["bench_x: no quick baseline (a full one exists: sizes are not compared); not compared"]
    baseline.update(doc, [_result("bench_x", True, _fig("latency", 400.0))])
    verdicts, _ = baseline.check(doc, [_result("bench_x", True, _fig("latency", 500.0))])
    assert [v.status for v in verdicts] == ["regressed"]
    assert doc["full"]["bench_x"]["figures"]["latency"]["value"] == 100.0  # the full one untouched


def test_the_command_line_records_compares_and_is_strict_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results, path = tmp_path / "results", tmp_path / "baseline.json"
    results.mkdir()
    (results / "bench_x.json").write_text(json.dumps(_result("bench_x", False, _fig("latency", 100.0))))
    assert baseline.main(["--results", str(results), "--baseline", str(path), "--update"]) == 0
    recorded = json.loads(path.read_text())
    assert recorded["full"]["bench_x"]["figures"]["latency"] == {
        "value": 100.0,
        "unit": "s",
        "better": "lower",
    }
    assert recorded["full"]["bench_x"]["measured"]["command"] == "python -m bench bench_x"
    (results / "bench_x.json").write_text(json.dumps(_result("bench_x", False, _fig("latency", 130.0))))
    capsys.readouterr()
    assert baseline.main(["--results", str(results), "--baseline", str(path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2:] == [
        "REGRESSED: 1 of 1 figure(s) moved more than 10 % the wrong way:",
        "  bench_x: latency: 100 -> 130 s (30.0 % worse)",
    ]
    assert baseline.main(["--results", str(results), "--baseline", str(path), "--strict"]) == 1
    path.write_text("[1, 2]")
    assert baseline.main(["--results", str(results), "--baseline", str(path)]) == 2


@pytest.fixture
def fake_bench() -> Iterator[list[Figure]]:
    """A benchmark module the runner imports as ``bench.bench_fake``; the test sets its figures."""
    figures: list[Figure] = []
    mod = types.ModuleType("bench.bench_fake", "A fake benchmark for the runner's tests.")
    mod.run = lambda quick: list(figures)  # type: ignore[attr-defined]
    sys.modules["bench.bench_fake"] = mod
    try:
        yield figures
    finally:
        del sys.modules["bench.bench_fake"]


def test_the_runner_records_the_machine_and_ends_with_the_regressions(
    tmp_path: Path, fake_bench: list[Figure], capsys: pytest.CaptureFixture[str]
) -> None:
    out, path = tmp_path / "results", tmp_path / "baseline.json"
    args = ["bench_fake", "--out", str(out), "--baseline", str(path)]
    fake_bench[:] = [Figure("beats/s", 2000.0, "1/s", better="min", clock="cpu")]
    assert bench_main([*args, "--update-baseline"]) == 0
    measured = json.loads(path.read_text())["full"]["bench_fake"]["measured"]
    assert measured["command"] == "python -m bench bench_fake"
    assert {"cpu", "cores", "python", "commit", "date"} <= measured.keys()
    fake_bench[:] = [Figure("beats/s", 1500.0, "1/s", better="min", clock="cpu")]
    capsys.readouterr()
    assert bench_main(args) == 0  # reported, not failed: --strict decides
    text = capsys.readouterr().out
    assert text.rstrip().endswith("bench_fake: beats/s: 2,000 -> 1,500 1/s (25.0 % worse)")
    assert bench_main([*args, "--strict"]) == 1
    assert "no quick baseline" in _run_quiet(capsys, [*args, "--quick", "--strict"], expect=0)
    assert json.loads((out / "bench_fake.json").read_text())["quick"] is True


def _run_quiet(capsys: pytest.CaptureFixture[str], argv: list[str], expect: int) -> str:
    capsys.readouterr()
    assert bench_main(argv) == expect
    return capsys.readouterr().out


def test_the_committed_baseline_says_what_each_figure_is_and_where_it_was_measured() -> None:
    doc = baseline.load()
    assert doc["full"], "bench/baseline.json has no full-size figures"
    for sz in ("full", "quick"):
        for name, entry in doc[sz].items():
            assert (baseline.HERE / f"{name}.py").is_file(), f"{sz} {name}: no such benchmark"
            assert {"cpu", "cores", "python", "commit", "date", "command"} <= entry["measured"].keys(), name
            for fig, e in entry["figures"].items():
                assert isinstance(e["value"], int | float) and math.isfinite(e["value"]), (name, fig)
                assert e["better"] in (baseline.HIGHER, baseline.LOWER), (name, fig)
                assert isinstance(e["unit"], str), (name, fig)
