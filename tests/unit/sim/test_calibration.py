"""Calibration arithmetic: sharing factors, mapping a real workload, gaps, parameter files."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.evaluation import JobResult, MigrationRecord, RunResult
from specon.sim.calibration import (
    RateSample,
    ThreadPoint,
    cpu_slowdown,
    fit_exponent,
    fit_relative_exponent,
    fit_threads,
    gap,
    load_params,
    oversubscription,
    params_from_dict,
    params_to_dict,
    pick_trace,
    predicted_rate,
    relative_gap,
    sim_workload,
    slowdown,
    smoothed,
    thread_ratios,
    thread_rows,
    truncated,
)
from specon.sim.cluster import DEFAULT_PARAMS, SimParams
from specon.sim.policies import make_policy
from specon.sim.runner import simulate
from specon.sim.trace import Trace


@dataclass(frozen=True)
class Job:  # the shape of specon.embedded.demo.DemoJob
    id: str
    model: str
    submit: float
    steps: int
    seed: int


def _trace(model: str = "m", *, records: int = 100, stride: int = 5, cost: float = 0.02) -> Trace:
    losses = tuple(1.0 / (i + 1) for i in range(records))
    return Trace(model, records * stride, cost, losses, f"{model} test", stride)


TRACES = {"a": [_trace("a", cost=0.02), _trace("a", cost=0.03)], "b": [_trace("b", cost=0.04)]}


# --- sharing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "cpus", "share"),
    [(1, 1.0, 1.0), (2, 1.0, 0.5), (4, 1.0, 0.25), (1, 0.5, 0.5), (1, 2.0, 1.0), (4, 2.0, 0.5)],
)
def test_processor_sharing_gives_each_job_its_share_of_at_most_one_core(
    k: int, cpus: float, share: float
) -> None:
    assert predicted_rate(40.0, k=k, cpus=cpus) == pytest.approx(40.0 * share)


def test_slowdown_is_predicted_over_measured() -> None:
    ideal = RateSample(k=2, cpus=1.0, rates=(20.0, 20.0))
    slow = RateSample(k=2, cpus=1.0, rates=(16.0, 16.0))
    assert slowdown(40.0, ideal) == pytest.approx(1.0)
    assert slowdown(40.0, slow) == pytest.approx(1.25)
    assert slowdown(40.0, RateSample(k=1, cpus=0.5, rates=(19.0,))) == pytest.approx(20.0 / 19.0)


def test_cpu_slowdown_compares_cpu_per_step() -> None:
    solo = RateSample(k=1, cpus=1.0, rates=(40.0,), cpu_seconds=9.0, seconds=10.0)  # 22.5 ms/step
    shared = RateSample(k=2, cpus=1.0, rates=(15.0, 15.0), cpu_seconds=7.5, seconds=10.0)  # 25 ms/step
    assert solo.cpu_per_step == pytest.approx(0.0225)
    assert cpu_slowdown(solo, shared) == pytest.approx(0.025 / 0.0225)
    assert shared.utilisation == pytest.approx(0.75)
    assert math.isnan(RateSample(k=1, cpus=1.0, rates=(1.0,)).cpu_per_step)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 2, "cpus": 1.0, "rates": (1.0,)}, "needs k rates"),
        ({"k": 0, "cpus": 1.0, "rates": ()}, "needs k rates"),
        ({"k": 1, "cpus": 0.0, "rates": (1.0,)}, "cpus"),
        ({"k": 1, "cpus": 1.0, "rates": (0.0,)}, "rates"),
        ({"k": 1, "cpus": 1.0, "rates": (math.nan,)}, "rates"),
    ],
)
def test_bad_samples_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RateSample(**kwargs)  # type: ignore[arg-type]


def test_predicted_rate_needs_a_job() -> None:
    with pytest.raises(ValueError, match="k must be"):
        predicted_rate(40.0, k=0, cpus=1.0)


# --- mapping -----------------------------------------------------------------------------


def test_truncated_keeps_the_first_steps_of_the_curve() -> None:
    t = _trace(records=100, stride=5)
    short = truncated(t, 120)
    assert short.steps == 120 and short.stride == 5 and short.step_cost == t.step_cost
    assert short.losses == t.losses[:24]
    assert short.loss_at(60) == t.loss_at(60)  # not stretched


def test_truncated_past_the_end_repeats_the_last_loss_and_short_jobs_keep_one_record() -> None:
    t = _trace(records=10, stride=5)
    long = truncated(t, 80)
    assert len(long.losses) == 16 and long.losses[10:] == (t.losses[-1],) * 6
    assert truncated(t, 3).losses == t.losses[:1]
    with pytest.raises(ValueError, match="steps"):
        truncated(t, 0)


def test_smoothed_averages_the_records_centred_on_each() -> None:
    t = Trace("m", 25, 0.01, (1.0, 2.0, 3.0, 4.0, 10.0), "test", 5)
    s = smoothed(t, 3)
    assert s.losses == pytest.approx((1.5, 2.0, 3.0, 17 / 3, 7.0))
    assert (s.steps, s.stride, s.step_cost, s.model) == (25, 5, 0.01, "m")
    assert smoothed(t, 1) is t
    assert smoothed(t, 4).losses[0] == pytest.approx(2.0)  # records 0..2 (one before is missing)
    with pytest.raises(ValueError, match="window"):
        smoothed(t, 0)


def test_sim_workload_smooths_traces_as_the_real_jobs_average_their_logs() -> None:
    jobs = [Job("j1", "a", 0.0, 200, 0)]
    wl = sim_workload(jobs, workers=1, cpus_per_worker=1.0, traces=TRACES, log_every=5)
    assert wl.jobs[0].trace.losses == smoothed(truncated(TRACES["a"][0], 200), 5).losses


def test_pick_trace_is_chosen_by_seed_and_unknown_models_are_named() -> None:
    assert pick_trace(TRACES, "a", 0) is TRACES["a"][0]
    assert pick_trace(TRACES, "a", 7) is TRACES["a"][1]
    with pytest.raises(ValueError, match="no trace of model 'zz' \\(have: a, b\\)"):
        pick_trace(TRACES, "zz", 0)


def test_sim_workload_mirrors_the_real_run() -> None:
    jobs = [Job("j1", "a", 0.0, 200, 1), Job("j2", "b", 3.0, 100, 0), Job("j3", "a", 4.5, 50, 2)]
    wl = sim_workload(jobs, workers=2, cpus_per_worker=0.5, traces=TRACES, startup_cpu={"a": 2.0})
    assert [(w.id, w.cpu) for w in wl.workers] == [("w0", 0.5), ("w1", 0.5)]
    by_id = {j.id: j for j in wl.jobs}
    assert [by_id[j].worker for j in ("j1", "j2", "j3")] == ["w0", "w1", "w0"]  # round-robin
    j1, j2 = by_id["j1"], by_id["j2"]
    assert (j1.submit, j1.steps, j1.model) == (0.0, 200, "a")
    assert j1.trace.steps == 200 and j1.trace.losses == TRACES["a"][1].losses[:40]  # seed 1
    assert j1.work == pytest.approx(200 * 0.03 + 2.0)  # start-up CPU included
    assert j2.work == pytest.approx(100 * 0.04)  # no start-up figure for b


def test_a_lone_job_finishes_after_its_start_up_and_steps_at_its_share_of_a_core() -> None:
    jobs = [Job("j1", "b", 2.0, 100, 0)]
    wl = sim_workload(jobs, workers=1, cpus_per_worker=0.5, traces=TRACES, startup_cpu=1.0)
    run = simulate(wl, make_policy("ds"), params=SimParams(interference=1.1))
    (job,) = run.jobs
    assert job.jct == pytest.approx((1.0 + 100 * 0.04) * 1.1 / 0.5)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 12),
    workers=st.integers(1, 4),
    startup=st.floats(0.0, 5.0),
    data=st.data(),
)
def test_every_job_keeps_its_identity_and_work(
    n: int, workers: int, startup: float, data: st.DataObject
) -> None:
    submits = sorted(data.draw(st.lists(st.floats(0.0, 100.0), min_size=n, max_size=n)))
    jobs = [
        Job(f"j{i}", data.draw(st.sampled_from(["a", "b"])), s, data.draw(st.integers(1, 900)), i)
        for i, s in enumerate(submits)
    ]
    wl = sim_workload(jobs, workers=workers, cpus_per_worker=1.0, traces=TRACES, startup_cpu=startup)
    by_id = {j.id: j for j in wl.jobs}
    for i, job in enumerate(jobs):
        plan = by_id[job.id]
        assert (plan.model, plan.submit, plan.steps) == (job.model, job.submit, job.steps)
        assert plan.worker == f"w{i % workers}"
        cost = pick_trace(TRACES, job.model, job.seed).step_cost
        assert plan.work == pytest.approx(job.steps * cost + startup)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers"),
        ({"startup_cpu": -1.0}, "startup_cpu"),
        ({"startup_cpu": {"a": math.inf}}, "startup_cpu of a"),
    ],
)
def test_bad_mapping_input_is_refused(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"workers": 1, "cpus_per_worker": 1.0, "traces": TRACES, **kwargs}
    with pytest.raises(ValueError, match=message):
        sim_workload([Job("j1", "a", 0.0, 10, 0)], **args)  # type: ignore[arg-type]


# --- gaps --------------------------------------------------------------------------------


def _run(jcts: dict[str, float | None], moves: int = 0) -> RunResult:
    jobs = tuple(
        JobResult(
            id=j, model="a", submit=float(i), finish=None if x is None else i + x, steps=10, steps_done=10
        )
        for i, (j, x) in enumerate(jcts.items())
    )
    migrations = tuple(MigrationRecord(f"j{i}", "w0", "w1", "converged", 1.0, 2.0) for i in range(moves))
    return RunResult(jobs=jobs, migrations=migrations)


def test_relative_gap() -> None:
    assert relative_gap(100.0, 110.0) == pytest.approx(0.10)
    assert relative_gap(100.0, 95.0) == pytest.approx(-0.05)
    assert relative_gap(None, 1.0) is None and relative_gap(1.0, None) is None
    assert relative_gap(0.0, 1.0) is None


def test_gap_compares_average_jct_makespan_and_each_job() -> None:
    real = _run({"j1": 100.0, "j2": 50.0}, moves=1)  # avg 75, makespan max(100, 51) - 0 = 100
    sim = _run({"j1": 110.0, "j2": 45.0})  # avg 77.5, makespan 110
    g = gap("ds", real, sim)
    assert (g.real_avg_jct, g.sim_avg_jct) == (75.0, 77.5)
    assert (g.real_makespan, g.sim_makespan) == (100.0, 110.0)
    assert g.avg_jct_gap == pytest.approx(2.5 / 75)
    assert g.makespan_gap == pytest.approx(0.10)
    assert g.job_gap == pytest.approx((0.10 + 0.10) / 2)
    assert (g.real_moves, g.sim_moves) == (1, 0)


def test_an_unfinished_job_leaves_the_gaps_unknown() -> None:
    g = gap("ds", _run({"j1": 100.0, "j2": None}), _run({"j1": 100.0, "j2": 10.0}))
    assert g.avg_jct_gap is None and g.makespan_gap is None and g.job_gap is None


# --- parameter files ---------------------------------------------------------------------


def test_params_round_trip_and_override_only_what_they_name() -> None:
    p = SimParams(interference=1.2, migration_downtime=7.5)
    assert params_from_dict(params_to_dict(p)) == p
    assert params_from_dict({"interference": 1.3}, base=p) == SimParams(
        interference=1.3, migration_downtime=7.5
    )
    assert params_from_dict({}) == DEFAULT_PARAMS


def test_bad_params_report_every_problem_at_once() -> None:
    with pytest.raises(ValueError) as info:
        params_from_dict({"speed": 1, "interference": True, "max_samples_per_tick": 2.5}, source="p.json")
    text = str(info.value)
    assert text.startswith("p.json: ")
    assert "speed: unknown key (known: job_cores, interference" in text
    assert "interference: expected a number, got boolean True" in text
    assert "max_samples_per_tick: expected an integer, got number 2.5" in text
    with pytest.raises(ValueError, match="interferense: unknown key; did you mean 'interference'"):
        params_from_dict({"interferense": 1.2})
    with pytest.raises(ValueError, match="interference must be >= 1"):
        params_from_dict({"interference": 0.5})
    with pytest.raises(ValueError, match="interference_exponent must be >= 0"):
        params_from_dict({"interference_exponent": -0.1})
    with pytest.raises(ValueError, match="expected a mapping"):
        params_from_dict([1, 2])


def test_params_files_in_json_and_yaml(tmp_path: Path) -> None:
    j = tmp_path / "p.json"
    j.write_text(json.dumps({"interference": 1.1, "max_samples_per_tick": 8}))
    y = tmp_path / "p.yaml"
    y.write_text("migration_downtime: 9\n")
    assert load_params(j) == replace(DEFAULT_PARAMS, interference=1.1, max_samples_per_tick=8)
    assert load_params(j, base=SimParams()) == SimParams(interference=1.1, max_samples_per_tick=8)
    assert load_params(y).migration_downtime == 9.0
    with pytest.raises(ValueError, match=r"missing\.json"):
        load_params(tmp_path / "missing.json")
    bad = tmp_path / "bad.yaml"
    bad.write_text("interference: [1\n")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        load_params(bad)


def test_params_files_are_read_as_yaml_1_2_like_the_policy(tmp_path: Path) -> None:
    # YAML 1.1 read 1e-1 as a string; the policy file's loader reads it as the number it is.
    y = tmp_path / "p.yaml"
    y.write_text("interference_exponent: 1e-1\n")
    assert load_params(y).interference_exponent == 0.1
    y.write_text("interference: 1.1\ninterference: 1.2\n")
    with pytest.raises(ValueError, match=r"p\.yaml: line 2, column 1: .*duplicate key 'interference'"):
        load_params(y)
    # A file written by the calibration benchmark (json.dumps of params_to_dict) reads back.
    old = tmp_path / "calibrated.json"
    old.write_text(
        '{\n  "job_cores": 1.0,\n  "interference": 1.0,\n  "migration_downtime": 8.4,\n'
        '  "max_samples_per_tick": 64,\n  "interference_exponent": 0.072\n}\n'
    )
    # (the thread law's and the downtime law's fields it predates keep the base's values)
    assert load_params(old, base=SimParams()) == replace(
        DEFAULT_PARAMS, thread_overhead=1.0, thread_exponent=0.0, migration_downtime=8.4, downtime_spread=0.0
    )


def test_params_files_set_the_thread_law(tmp_path: Path) -> None:
    y = tmp_path / "threads.yaml"
    y.write_text("job_threads: 2\njob_cores: 2\n")
    p = load_params(y)
    assert (p.job_threads, p.job_cores) == (2, 2.0)
    assert (p.thread_overhead, p.thread_exponent) == (
        DEFAULT_PARAMS.thread_overhead,
        DEFAULT_PARAMS.thread_exponent,
    )
    with pytest.raises(ValueError, match="job_threads: expected an integer"):
        params_from_dict({"job_threads": 1.5})
    with pytest.raises(ValueError, match="thread_overhead must be >= 1"):
        params_from_dict({"thread_overhead": 0.5})


def test_fit_exponent_recovers_a_power_law_and_skips_what_says_nothing() -> None:
    points = [(r, r**0.1) for r in (2.0, 3.0, 4.0, 8.0)]
    assert fit_exponent([*points, (1.0, 1.3), (0.5, 2.0)]) == pytest.approx(0.1)
    assert fit_exponent([(2.0, 0.9)]) == 0.0  # faster when shared: noise, not a model
    with pytest.raises(ValueError, match="no oversubscribed sample"):
        fit_exponent([(1.0, 1.2)])
    assert oversubscription(RateSample(k=2, cpus=0.5, rates=(1.0, 1.0))) == 4.0


def test_the_fitted_slowdown_is_what_the_simulator_applies() -> None:
    # Two jobs on a half-core worker: r = 4; each gets a quarter core, slowed by 4 ** 0.1.
    jobs = [Job("j1", "b", 0.0, 100, 0), Job("j2", "b", 0.0, 100, 0)]
    wl = sim_workload(jobs, workers=1, cpus_per_worker=0.5, traces=TRACES)
    run = simulate(wl, make_policy("ds"), params=SimParams(interference_exponent=0.1))
    assert [j.jct for j in run.jobs] == pytest.approx([100 * 0.04 * 4**0.1 / 0.25] * 2)


# --- threads -----------------------------------------------------------------------------


def test_fit_relative_exponent_recovers_a_power_law_against_an_oversubscribed_reference() -> None:
    # k two-thread jobs on 2 cores against one alone (r = 1), and on a reference at r = 2.
    points = [(r, 1.0, r**1.3) for r in (2.0, 3.0, 4.0)] + [(r, 2.0, (r / 2) ** 1.3) for r in (4.0, 8.0)]
    assert fit_relative_exponent(points) == pytest.approx(1.3)
    assert fit_relative_exponent([(2.0, 0.5, 2.0**0.5)]) == pytest.approx(0.5)  # r <= 1 counts as 1
    with pytest.raises(ValueError, match="no oversubscribed sample"):
        fit_relative_exponent([(1.0, 0.5, 1.1), (2.0, 2.0, 1.2)])


C1 = 0.025  # CPU-seconds per step of one one-thread job alone


def _point(threads: int, k: int, cpus: float, *, cpu: float, rate: float) -> ThreadPoint:
    """k jobs doing ``rate`` steps/s together at ``cpu`` CPU-seconds a step over a 10 s window."""
    sample = RateSample(
        k=k, cpus=cpus, rates=(rate / k,) * k, cpu_seconds=cpu * rate * 10, seconds=10.0, threads=threads
    )
    return ThreadPoint(sample, 0.0)


def _synthetic(gamma: float, overhead: float, cpu_overhead: float, *, rounds: int = 1) -> list[ThreadPoint]:
    """What the bench would measure on 2 cores if the simulator's thread law held."""
    out = []
    for rnd in range(rounds):
        noise = (1.0, 1.02, 0.98)[rnd % 3]  # a round's drift: the same for all of its points
        for cpus in (1.0, 2.0):
            out.append(_point(1, 1, cpus, cpu=C1 * noise, rate=1 / (C1 * noise)))
            alone_rate = 2 / (overhead * C1) if cpus == 2.0 else cpus / (cpu_overhead * C1)
            for k in (1, 2, 3, 4):
                factor = k**gamma  # r = k * 2 threads / 2 cores
                cpu = C1 * cpu_overhead * factor * noise
                out.append(_point(2, k, cpus, cpu=cpu, rate=alone_rate / factor / noise))
    return out


def test_fit_threads_recovers_a_known_exponent_and_overhead() -> None:
    fit = fit_threads(_synthetic(1.25, 1.8, 1.5), threads=2, cores=2)
    assert fit.exponent == pytest.approx(1.25)
    assert (fit.overhead, fit.cpu_overhead) == pytest.approx((1.8, 1.5))
    assert len(fit.ratios) == 2 * 3  # budgets x k > 1
    # Rounds that drift alike move the medians alike: the same fit.
    drifting = fit_threads(_synthetic(1.25, 1.8, 1.5, rounds=3), threads=2, cores=2)
    assert drifting.exponent == pytest.approx(1.25, abs=0.02)
    assert (drifting.overhead, drifting.cpu_overhead) == pytest.approx((1.8, 1.5))
    # The simulator with these constants reproduces the synthetic multipliers.
    params = SimParams(
        job_threads=2, job_cores=2.0, thread_overhead=fit.overhead, thread_exponent=fit.exponent
    )
    for k in (2, 3, 4):
        assert params.slowdown(k * 2 / 2) / params.slowdown(1.0) == pytest.approx(k**1.25)
    with pytest.raises(ValueError, match="alone on 2 CPUs"):
        fit_threads([p for p in _synthetic(1.0, 1.8, 1.5) if p.sample.cpus == 1.0], threads=2, cores=2)


@given(st.floats(0.0, 3.0), st.floats(1.0, 4.0))
@settings(max_examples=50, deadline=None)
def test_fit_threads_recovers_any_exponent(gamma: float, overhead: float) -> None:
    fit = fit_threads(_synthetic(gamma, overhead, 1.0), threads=2, cores=2)
    assert fit.exponent == pytest.approx(gamma, abs=1e-9)
    assert fit.overhead == pytest.approx(overhead)


def test_thread_rows_take_ratios_to_the_median_job_alone() -> None:
    points = [
        _point(1, 1, 1.0, cpu=0.020, rate=50.0), _point(1, 1, 1.0, cpu=0.021, rate=48.0),
        _point(1, 1, 1.0, cpu=0.080, rate=12.0),  # disturbed: the median leaves it out
        _point(1, 2, 1.0, cpu=0.022, rate=45.0), _point(1, 2, 1.0, cpu=0.0231, rate=40.0),
        _point(1, 2, 1.0, cpu=0.0252, rate=36.0),
        _point(2, 2, 1.0, cpu=0.5, rate=1.0),  # no two-thread job alone: no row
    ]  # fmt: skip
    solo, pair = thread_rows(points, cores=2)
    assert (pair.threads, pair.cpus, pair.k, pair.r) == (1, 1.0, 2, 1.0)
    assert (pair.slowdown.median, pair.slowdown.lo, pair.slowdown.hi) == pytest.approx(
        (1.1, 0.022 / 0.021, 1.2)
    )
    assert (pair.throughput.median, pair.throughput.hi) == pytest.approx((40 / 48, 45 / 48))
    assert pair.ms_per_step.median == pytest.approx(23.1)
    assert solo.slowdown.median == 1.0
    assert len(pair.cells()) == 9
    ratios = thread_ratios(points, threads=1, cores=2)
    assert [(r, ref) for r, ref, _ in ratios] == [(1.0, 0.5)] * 3
    assert [f for _, _, f in ratios] == pytest.approx([0.022 / 0.021, 1.1, 1.2])
