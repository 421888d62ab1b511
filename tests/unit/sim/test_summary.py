"""The one table of every policy on every scenario, and the default's target check."""

from __future__ import annotations

import pytest

from specon.sim.cluster import DEFAULT_PARAMS
from specon.sim.experiment import PointResult, ScenarioResult, Summary, run_scenario
from specon.sim.scenarios import scenario
from specon.sim.summary import table, target_misses
from specon.sim.trace import load_traces


@pytest.mark.slow
def test_the_summary_has_a_row_per_policy_a_column_per_scenario_and_the_paper_and_targets() -> None:
    traces = load_traces()
    results = [
        run_scenario(scenario(name), traces, policies=("ds", "specon", "balancer"), seeds=1)
        for name in ("A1", "A3")
    ]
    lines = table(results)
    header = next(line for line in lines if line.startswith("| policy"))
    assert header == "| policy | A1 | A3 |"
    rows = {line.split(" | ")[0] for line in lines if line.startswith("| ")}
    assert {"| **specon** (default)", "| balancer", "| *paper: SpeCon*", "| *target (default)*"} <= rows
    assert "| *paper: SpeCon* | -14.7 % / -5.6 % | -13.6 % / -24.7 % |" in lines
    # The check names each shortfall in words; the balancer's row is compared with the default's.
    for miss in target_misses(results):
        assert miss.startswith(("A1:", "A3:"))


def _summary(figures: dict[str, float]) -> Summary:
    keys = ("avg_jct_reduction", "makespan_reduction", "ttq_reduction")
    return Summary({k: figures[k] for k in keys}, {}, 1, {"worst_slowdown": figures["worst_slowdown"]})


def _result(name: str, specon: dict[str, float], **peers: dict[str, float]) -> ScenarioResult:
    """A result of ``name`` with the default's figures and the peers' given (no simulation)."""
    summaries = {"ds": Summary({}, {}, 1), "specon": _summary(specon)}
    summaries.update({p: _summary(f) for p, f in peers.items()})
    point = PointResult(alpha=0.01, interval=30.0, summaries=summaries)
    return ScenarioResult(scenario(name), (0,), tuple(summaries), None, DEFAULT_PARAMS, point)


def test_every_cell_carries_time_to_quality_and_a_late_one_is_a_shortfall() -> None:
    late = _result(
        "A3",
        {"avg_jct_reduction": 0.5, "makespan_reduction": 0.1, "ttq_reduction": -0.12, "worst_slowdown": 1.5},
    )
    row = next(line for line in table([late]) if line.startswith("| **specon**"))
    assert row == "| **specon** (default) | -50.0 % / -10.0 % / TTQ +12.0 % / x1.50 |"
    assert target_misses([late]) == ["A3: time-to-quality +12.0 % against DS"]
    sooner = _result(
        "A3",
        {"avg_jct_reduction": 0.5, "makespan_reduction": 0.1, "ttq_reduction": 0.05, "worst_slowdown": 1.5},
    )
    assert target_misses([sooner]) == []


def test_a_peer_is_ahead_only_if_faster_without_reaching_quality_later_than_ds() -> None:
    mine = {"avg_jct_reduction": 0.5, "makespan_reduction": 0.1, "ttq_reduction": 0.02, "worst_slowdown": 1.5}
    faster_later = {**mine, "avg_jct_reduction": 0.6, "ttq_reduction": -1.1}
    faster_sooner = {**mine, "avg_jct_reduction": 0.55, "ttq_reduction": 0.0}
    result = _result("A3", mine, srpt=faster_later, other=faster_sooner)
    assert target_misses([result]) == ["A3: other ahead (-55.0 % against -50.0 %)"]
