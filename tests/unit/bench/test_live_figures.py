"""bench_live's figures from synthetic runs: time-to-quality beside every average JCT, against
the DS twin, with the simulator's prediction of each."""

from __future__ import annotations

import pytest

from bench.figures import Figure
from specon.evaluation import JobResult, RunResult

pytestmark = pytest.mark.slow  # bench_live imports the workloads (torch): seconds


def _run(*jobs: tuple[float, float | None, float | None]) -> RunResult:
    """(submit, finish, quality_time) per job."""
    return RunResult(
        tuple(
            JobResult(f"job-{i}", "gru", submit, finish, 100, 100, quality_time=q)
            for i, (submit, finish, q) in enumerate(jobs)
        )
    )


DS = _run((0, 100, 50), (0, 200, 100))  # avg JCT 150, time-to-quality 75
OURS = _run((0, 80, 40), (0, 180, 80))  # 130 (13.3 % sooner), 60 (20 % sooner)
SIM_DS = _run((0, 110, 55), (0, 190, 95))  # 150, 75
SIM_OURS = _run((0, 90, 50), (0, 160, 70))  # 125 (16.7 %), 60 (20 %)


def _by_name(figures: list[Figure]) -> dict[str, Figure]:
    return {f.name: f for f in figures}


def test_every_average_jct_has_its_time_to_quality_and_the_simulators_beside_it() -> None:
    from bench.bench_live import TTQ_TARGET, _policy_figures  # noqa: PLC0415

    figs = _by_name(_policy_figures("specon", [OURS], {"specon": [DS]}, [SIM_OURS], [SIM_DS]))
    assert figs["live specon: average JCT (mean of 1 seeds)"].value == pytest.approx(130.0)
    red = figs["live specon: avg JCT reduction vs its DS twin (mean of 1 seeds)"]
    assert red.value == pytest.approx(100 * 20 / 150)
    assert "simulated +16.7 %" in red.detail
    ttq = figs["live specon: time-to-quality (mean of 1 seeds)"]
    assert ttq.value == pytest.approx(60.0)
    assert "simulated 60.0 s" in ttq.detail
    sooner = figs["live specon: time-to-quality reduction vs its DS twin (mean of 1 seeds)"]
    assert sooner.value == pytest.approx(20.0)
    assert (sooner.target, sooner.better, sooner.met) == (TTQ_TARGET, "min", True)
    assert "simulated +20.0 %" in sooner.detail
    assert figs["live specon: simulator's time-to-quality gap (mean |%|)"].value == pytest.approx(0.0)
    assert figs["live specon: simulator's avg JCT gap (mean |%|)"].value == pytest.approx(100 * 5 / 130)


def test_later_quality_misses_its_target_and_unknown_quality_is_said() -> None:
    from bench.bench_live import _policy_figures  # noqa: PLC0415

    late = _run((0, 80, 60), (0, 180, 110))  # faster, but quality 85 s against 75
    figs = _by_name(_policy_figures("specon", [late], {"specon": [DS]}, [SIM_OURS], [SIM_DS]))
    assert figs["live specon: time-to-quality reduction vs its DS twin (mean of 1 seeds)"].met is False
    blind = _run((0, 80, None), (0, 180, 80))  # one job logged no loss
    figs = _by_name(_policy_figures("specon", [blind], {"specon": [DS]}, [SIM_OURS], [SIM_DS]))
    assert figs["live specon: runs whose jobs logged no time-to-quality"].value == 1
    assert "live specon: average JCT (mean of 1 seeds)" in figs  # JCT is still reported


def test_a_run_past_its_deadline_says_so_in_its_progress_line() -> None:
    from bench.bench_live import _said  # noqa: PLC0415

    assert _said(OURS) == "avg JCT 130.0 s, time-to-quality 60.0 s"
    assert _said(_run((0, 80, 40), (0, None, None))) == "1 of 2 jobs unfinished"


def test_ds_and_the_table_carry_time_to_quality_too() -> None:
    from bench.bench_live import _ds_figures, _table  # noqa: PLC0415

    figs = _by_name(_ds_figures({"specon": [DS]}, [SIM_DS]))
    assert figs["live ds: time-to-quality (mean of 1 seeds)"].value == pytest.approx(75.0)
    assert figs["live ds: simulator's time-to-quality gap (mean |%|)"].value == pytest.approx(0.0)
    table = _table({"specon": [OURS]}, {"specon": [DS]}, {"ds": [SIM_DS], "specon": [SIM_OURS]}).splitlines()
    assert "time-to-quality" in table[0]
    assert table[3] == (
        "| specon | 130.0 s (min 130.0, max 130.0) | +13.3 % sooner (mean 13.3 %) | 125.0 s (3.8 %) "
        "| 60.0 s (min 60.0, max 60.0) | +20.0 % sooner (mean 20.0 %) | 60.0 s (0.0 %) |"
    )
