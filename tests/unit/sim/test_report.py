"""The simulator report states the contention law the run used."""

from __future__ import annotations

from specon.sim.cluster import DEFAULT_PARAMS, SimParams
from specon.sim.experiment import PointResult, ScenarioResult, Summary
from specon.sim.report import contention_law, sweep_table
from specon.sim.scenarios import TABLE_III, scenario


def test_single_threaded_jobs_show_the_interference_law() -> None:
    assert contention_law(SimParams()) == "interference 1"
    assert contention_law(SimParams(interference=1.1, interference_exponent=0.072)) == (
        "interference 1.1 x r^0.072"
    )


def test_multi_threaded_jobs_show_the_thread_law_not_the_single_thread_one() -> None:
    pr = SimParams(job_threads=2, job_cores=2, thread_overhead=1.47, thread_exponent=1.06)
    law = contention_law(pr)
    assert law == "2 threads per job: step time x 1.47, oversubscribed also x 1 x r^1.06"
    assert "interference" not in law


def test_the_shipped_parameters_are_single_threaded() -> None:
    assert contention_law(DEFAULT_PARAMS).startswith("interference ")


def test_the_table_iii_sweep_reports_time_to_quality_beside_average_jct() -> None:
    mine = Summary(
        {
            "jobs_improved": 0.9,
            "avg_jct_reduction": 0.3,
            "best_reduction": 0.7,
            "makespan_reduction": 0.05,
            "ttq_reduction": -0.04,
        },
        {
            "jobs_improved": 0.0,
            "avg_jct_reduction": 0.01,
            "best_reduction": 0.02,
            "makespan_reduction": 0.0,
            "ttq_reduction": 0.03,
        },
        3,
    )
    point = PointResult(alpha=0.01, interval=30.0, summaries={"specon": mine}, paper=TABLE_III[(0.01, 30.0)])
    result = ScenarioResult(
        scenario("A2"), (0, 1, 2), ("ds", "specon"), None, DEFAULT_PARAMS, point, (point,)
    )
    header, _, ours, paper = sweep_table(result)
    assert header.endswith("| makespan | time-to-quality |")
    assert ours.startswith("| 0.01, 30 s | specon | 90 % | -30.0 % ± 1.0 |")
    assert ours.endswith("| +4.0 % ± 3.0 |")
    assert paper.endswith("| - |")
