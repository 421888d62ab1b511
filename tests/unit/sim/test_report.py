"""The simulator report states the contention law the run used."""

from __future__ import annotations

from specon.sim.cluster import DEFAULT_PARAMS, SimParams
from specon.sim.report import contention_law


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
