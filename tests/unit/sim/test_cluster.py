"""The simulated runtime: processor sharing, interference, migration downtime, samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace

import pytest

from specon.config import default_policy
from specon.model import WorkerId
from specon.sim.cluster import (
    DEFAULT_PARAMS,
    Cluster,
    JobPlan,
    Phase,
    SimJob,
    SimParams,
    WorkerSpec,
    Workload,
    draw_downtime,
    fit_downtime,
    measured_moves,
    water_fill,
)
from specon.sim.engine import Engine
from specon.sim.policies import make_policy
from specon.sim.runner import _Run
from specon.sim.trace import Trace
from specon.testing.builders import job_plan, trace, workload


def _countdown(n: int = 100, stride: int = 1) -> Trace:
    """n records n, n - 1, ..., 1, one every ``stride`` steps."""
    return trace([float(n - i) for i in range(n)], stride=stride)


T100 = _countdown(100)


IDEAL = SimParams()  # processor sharing without interference: the arithmetic below


def _run(
    workers: dict[str, float],
    jobs: list[JobPlan],
    params: SimParams = IDEAL,
    weights: dict[str, float] | None = None,
) -> Cluster:
    """Start every job at its submit time on its own worker; run to the end."""
    engine = Engine()
    wl = workload(workers, jobs)

    def weigh(running: Sequence[SimJob]) -> dict[str, float]:
        return {j.id: (weights or {}).get(j.id, 1.0) for j in running}

    cluster = Cluster(engine, wl, params, weigh=weigh if weights else None)
    for plan in wl.jobs:
        job = cluster.jobs[plan.id]
        assert plan.worker is not None
        engine.at(plan.submit, lambda job=job, w=plan.worker: cluster.start(job, w))  # type: ignore[misc]
    engine.run()
    return cluster


def test_a_job_alone_runs_at_one_core() -> None:
    c = _run({"w1": 1.0}, [job_plan("a", T100, cost=2.0)])
    assert c.jobs["a"].finish == pytest.approx(200.0)
    assert c.unfinished == 0


def test_two_jobs_on_a_one_core_worker_take_twice_as_long() -> None:
    c = _run({"w1": 1.0}, [job_plan("a", T100), job_plan("b", T100)])
    assert c.jobs["a"].finish == pytest.approx(200.0)
    assert c.jobs["b"].finish == pytest.approx(200.0)


def test_a_single_threaded_job_cannot_use_a_second_core() -> None:
    c = _run({"w1": 2.0}, [job_plan("a", T100), job_plan("b", T100)])
    assert c.jobs["a"].finish == pytest.approx(100.0)  # each has its own core
    c = _run({"w1": 2.0}, [job_plan("a", T100), job_plan("b", T100), job_plan("c", T100)])
    assert c.jobs["a"].finish == pytest.approx(150.0)  # 2 cores / 3 jobs


def test_a_job_speeds_up_when_its_neighbour_finishes() -> None:
    # a: 100 s of work; b: 50 s. Shared until b finishes at 100 s (50 s of work each done),
    # then a does its last 50 s alone.
    c = _run({"w1": 1.0}, [job_plan("a", T100), job_plan("b", _countdown(50))])
    assert c.jobs["b"].finish == pytest.approx(100.0)
    assert c.jobs["a"].finish == pytest.approx(150.0)


def test_interference_slows_oversubscribed_workers_only() -> None:
    params = SimParams(interference=1.25)
    c = _run({"w1": 1.0}, [job_plan("a", T100), job_plan("b", T100)], params)
    assert c.jobs["a"].finish == pytest.approx(250.0)
    c = _run({"w1": 1.0}, [job_plan("a", T100)], params)
    assert c.jobs["a"].finish == pytest.approx(100.0)


# Two-thread jobs on workers of real cores (job_cores = threads), made-up law constants.
THREADED = SimParams(job_threads=2, job_cores=2.0, thread_overhead=1.5, thread_exponent=1.2)


def test_the_threaded_slowdown_is_the_overhead_times_a_power_of_threads_per_core() -> None:
    assert THREADED.slowdown(0.5) == THREADED.slowdown(1.0) == 1.5  # not oversubscribed
    assert THREADED.slowdown(3.0) == pytest.approx(1.5 * 3.0**1.2)
    assert replace(THREADED, interference=1.1).slowdown(2.0) == pytest.approx(1.5 * 1.1 * 2.0**1.2)
    # One thread per job: the single-threaded law; the thread constants do nothing.
    one = replace(THREADED, job_threads=1, interference_exponent=0.072)
    assert one.slowdown(1.0) == 1.0
    assert one.slowdown(4.0) == pytest.approx(4.0**0.072)
    assert DEFAULT_PARAMS.job_threads == 1 and DEFAULT_PARAMS.job_cores == 1.0


def test_a_threaded_job_uses_as_many_cores_as_it_has_threads() -> None:
    # Alone on 2 cores: both, each step 1.5 x the one-thread cost: 100 * 1.5 / 2 s.
    c = _run({"w1": 2.0}, [job_plan("a", T100)], THREADED)
    assert c.jobs["a"].finish == pytest.approx(75.0)
    # Two on 2 cores: a core each, r = 2 threads per core.
    c = _run({"w1": 2.0}, [job_plan("a", T100), job_plan("b", T100)], THREADED)
    assert c.jobs["a"].finish == pytest.approx(100 * 1.5 * 2.0**1.2)
    # Two on 4 cores: two cores each, r = 1.
    c = _run({"w1": 4.0}, [job_plan("a", T100), job_plan("b", T100)], THREADED)
    assert [c.jobs["a"].finish, c.jobs["b"].finish] == pytest.approx([75.0, 75.0])


def test_water_filling_caps_each_job_at_the_cores_of_its_threads() -> None:
    assert water_fill(3.0, [1.0, 1.0], 2.0) == [1.5, 1.5]
    assert water_fill(3.0, [3.0, 1.0], 2.0) == pytest.approx([2.0, 1.0])  # 2.25 capped at 2
    assert water_fill(5.0, [1.0, 1.0], 2.0) == [2.0, 2.0]  # a core stays idle
    # In the simulator: on 3 cores, weights 3:1 give a 2 cores (its threads) and b 1;
    # r = 2 jobs * 2 cores / 3, and a's finish frees all 3 for b (capped at 2).
    c = _run({"w1": 3.0}, [job_plan("a", T100), job_plan("b", T100)], THREADED, weights={"a": 3.0})
    step = 1.5 * (4 / 3) ** 1.2  # both jobs' step cost multiplier while they share
    a_done = 100 * step / 2.0
    assert c.jobs["a"].finish == pytest.approx(a_done)
    b_left = 100 - a_done / step  # b did a_done seconds at one core
    assert c.jobs["b"].finish == pytest.approx(a_done + b_left * 1.5 / 2.0)


def test_a_move_costs_the_downtime_and_keeps_progress() -> None:
    engine = Engine()
    wl = workload(2, [job_plan("a", T100)])
    cluster = Cluster(engine, wl, SimParams(migration_downtime=4.0))
    job = cluster.jobs["a"]
    arrived: list[float] = []
    engine.at(0.0, lambda: cluster.start(job, WorkerId("w1")))
    engine.at(30.0, lambda: cluster.move(job, WorkerId("w2"), lambda j: arrived.append(engine.now)))
    engine.run(until=31.0)
    assert job.phase is Phase.MOVING
    assert cluster.steps_now(job) == pytest.approx(30.0)
    engine.run()
    assert arrived == [pytest.approx(34.0)]
    assert job.finish == pytest.approx(104.0)
    assert [w for _, w in job.history] == ["w1", "w2"]


def _sampled(job: SimJob, cluster: Cluster, engine: Engine, at: float) -> list[float]:
    out: list[float] = []
    engine.at(at, lambda: out.extend(cluster.take_samples(job)))
    engine.run(until=at)
    return out


def test_samples_are_the_trace_records_passed_since_the_last_tick() -> None:
    engine = Engine()
    wl = workload(1, [job_plan("a", _countdown(100, stride=5), cost=0.2)])  # 500 steps: 25 s of work
    cluster = Cluster(engine, wl, SimParams(max_samples_per_tick=64))
    job = cluster.jobs["a"]
    engine.at(0.0, lambda: cluster.start(job, WorkerId("w1")))
    # 10 s -> 50 steps -> records 1..10 (loss after steps 5, 10, ..., 50).
    assert _sampled(job, cluster, engine, 10.0) == [100.0 - i for i in range(10)]
    assert _sampled(job, cluster, engine, 10.5) == []  # 2.5 steps: no record passed
    assert _sampled(job, cluster, engine, 12.0) == [90.0, 89.0]  # steps 52.5 -> 60: records 11, 12


def test_many_samples_are_compressed_keeping_their_mean_and_last_value() -> None:
    engine = Engine()
    wl = workload(1, [job_plan("a", T100)])
    small = Cluster(engine, wl, SimParams(max_samples_per_tick=4))
    job = small.jobs["a"]
    engine.at(0.0, lambda: small.start(job, WorkerId("w1")))
    got = _sampled(job, small, engine, 37.0)
    expected = [100.0 - i for i in range(37)]
    assert len(got) == 2
    assert statistics.fmean(got) == pytest.approx(statistics.fmean(expected))
    assert got[-1] == expected[-1]


def test_bad_parameters_are_rejected_with_a_reason() -> None:
    with pytest.raises(ValueError, match="interference"):
        SimParams(interference=0.5)
    with pytest.raises(ValueError, match=r"job_threads must be >= 1.*thread_overhead.*thread_exponent"):
        SimParams(job_threads=0, thread_overhead=0.9, thread_exponent=-1.0)
    with pytest.raises(ValueError, match="cpu"):
        WorkerSpec(WorkerId("w"), cpu=0.0)
    with pytest.raises(ValueError, match="step_cost"):
        JobPlan("a", "m", 0.0, T100, 10, math.nan)
    with pytest.raises(ValueError, match="unknown workers"):
        Workload((WorkerSpec(WorkerId("w1")),), (job_plan("a", T100, worker="w9"),))


def test_round_robin_placement_by_submission_order() -> None:
    wl = workload(2, [job_plan(f"j{i}", T100, submit=10.0 - i, worker=None) for i in range(5)])
    # Submitted j4 (t=6), j3, j2, j1, j0 (t=10).
    assert wl.placement() == {"j4": "w1", "j3": "w2", "j2": "w1", "j1": "w2", "j0": "w1"}


def test_records_past_the_end_of_a_trace_repeat_its_last_loss() -> None:
    losses = [float(100 - i) for i in range(100)]
    wl = workload(1, [job_plan("a", trace(losses, steps=110))])  # 100 records, 110 steps
    for cap in (4, 1000):
        engine = Engine()
        cluster = Cluster(engine, wl, SimParams(max_samples_per_tick=cap))
        job = cluster.jobs["a"]
        engine.at(0.0, lambda job=job, cluster=cluster: cluster.start(job, WorkerId("w1")))  # type: ignore[misc]
        got = _sampled(job, cluster, engine, 109.9)
        expected = [100.0 - i for i in range(100)] + [1.0] * 9
        assert statistics.fmean(got) == pytest.approx(statistics.fmean(expected))
        assert got[-1] == 1.0


def test_each_move_draws_its_downtime_from_the_fitted_law() -> None:
    fixed = SimParams(migration_downtime=4.0)
    assert draw_downtime(fixed, "a", 0.0, 1) == 4.0  # no spread: always the median
    law = SimParams(migration_downtime=3.0, downtime_spread=0.3)
    draws = [draw_downtime(law, f"j{i}", 1.5, k) for i in range(200) for k in (1, 2)]
    assert draws == [draw_downtime(law, f"j{i}", 1.5, k) for i in range(200) for k in (1, 2)]  # deterministic
    assert len(set(draws)) == len(draws)
    assert statistics.median(draws) == pytest.approx(3.0, rel=0.1)
    spread = statistics.stdev(math.log(x) for x in draws)
    assert spread == pytest.approx(0.3, rel=0.15)
    with pytest.raises(ValueError, match="downtime_spread"):
        SimParams(downtime_spread=-1.0)


def test_a_moved_job_waits_its_drawn_downtime() -> None:
    engine = Engine()
    wl = workload(2, [job_plan("a", T100)])
    params = SimParams(migration_downtime=4.0, downtime_spread=0.5)
    cluster = Cluster(engine, wl, params)
    job = cluster.jobs["a"]
    arrived: list[float] = []
    engine.at(0.0, lambda: cluster.start(job, WorkerId("w1")))
    engine.at(30.0, lambda: cluster.move(job, WorkerId("w2"), lambda j: arrived.append(engine.now)))
    engine.run()
    drawn = draw_downtime(params, "a", job.plan.submit, 1)
    assert drawn != 4.0
    assert arrived == [pytest.approx(30.0 + drawn)]


def test_the_default_law_is_the_fit_of_the_committed_measurements() -> None:
    table = measured_moves()
    chosen = table["sets"][table["simulator"]]
    assert fit_downtime(chosen["downtime"]) == (
        DEFAULT_PARAMS.migration_downtime,
        DEFAULT_PARAMS.downtime_spread,
    )
    for s in table["sets"].values():
        assert {"command", "machine", "commit", "downtime"} <= s.keys()
        fit_downtime(s["downtime"])  # every set fits
    # From samples: their median and the spread of their logs; from a summary: its range.
    assert fit_downtime({"samples": [1.0, math.e, math.e**2]}) == (round(math.e, 2), 1.0)
    assert fit_downtime({"median": 3.0, "min": 2.0, "max": 4.0, "n": 2}) == (
        3.0,
        round(math.log(2) / 1.128, 2),
    )
    with pytest.raises(ValueError, match="two positive"):
        fit_downtime({"samples": [1.0]})
    with pytest.raises(ValueError, match="2-10 moves"):
        fit_downtime({"median": 3.0, "min": 2.0, "max": 4.0, "n": 50})


def test_the_simulated_manager_measures_the_drawn_downtimes_and_learns_from_them() -> None:
    wl = workload(2, (job_plan("a", _falling()), job_plan("b", _linear())))
    params = replace(DEFAULT_PARAMS, migration_downtime=2.0, downtime_spread=0.4)
    run = _Run(wl, make_policy("specon"), params)
    run.run(math.inf)
    moves = run.result().migrations
    assert moves, "the scenario makes a move"
    plans = {j.id: j for j in wl.jobs}
    for m in moves:  # each job moves once here
        assert m.downtime == pytest.approx(draw_downtime(params, m.job, plans[m.job].submit, 1))
    assert run.coord is not None
    learned = run.coord.core.move_costs
    [est] = learned.cells().values()  # one backend, one size
    assert est.moves == len(moves)
    prior = default_policy().migration
    k = prior.cost_prior_weight
    mean = statistics.fmean(m.downtime or 0.0 for m in moves)
    backend = (k * prior.move_downtime + len(moves) * mean) / (k + len(moves))
    assert est.downtime == pytest.approx((k * backend + len(moves) * mean) / (k + len(moves)))


def _falling(n: int = 300) -> Trace:
    return trace([0.1 + 0.9 * math.exp(-i / (0.05 * n)) for i in range(n)], model="fast")


def _linear(n: int = 300) -> Trace:
    return trace([1.0 - i / n for i in range(n)], model="linear")
