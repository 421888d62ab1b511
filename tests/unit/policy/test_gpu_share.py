"""Priority on a GPU (``specon.policy.gpu_share``): the rule on cases, and its invariants on
generated ones."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.config.sections import GpuShareConfig
from specon.model import ContainerId, GpuState
from specon.policy.gpu_share import GpuJob, GpuPlan, after, budget, mps_percentage, plan, ranked

GB = 1 << 30
CFG = GpuShareConfig()  # freeze, concurrency 1, quantum 2 s, 5 % headroom
NOW = 1000.0


def job(
    name: str,
    weight: int = 100,
    state: GpuState = "running",
    *,
    memory: int = GB,
    since: float = 0.0,
    exempt: bool = False,
) -> GpuJob:
    return GpuJob(ContainerId(name), weight, memory, state, since, exempt)


def ids(*names: str) -> tuple[ContainerId, ...]:
    return tuple(ContainerId(n) for n in names)


# --- the rule on cases -----------------------------------------------------------------------


def test_the_heaviest_job_runs_and_the_others_freeze() -> None:
    p = plan([job("a", 10), job("b", 5000), job("c", 100)], 80 * GB, CFG, NOW)
    assert p == GpuPlan(run=ids("b"), freeze=ids("c", "a"))


def test_a_frozen_job_that_becomes_due_is_thawed() -> None:
    p = plan([job("a", 10), job("b", 5000, "frozen")], 80 * GB, CFG, NOW)
    assert p == GpuPlan(run=ids("b"), freeze=ids("a"), thaw=ids("b"))


def test_a_job_switched_in_keeps_the_gpu_for_its_quantum() -> None:
    jobs = [job("a", 10, since=NOW - 1.0), job("b", 5000, "frozen")]
    assert plan(jobs, 80 * GB, CFG, NOW) == GpuPlan(run=ids("a"))  # weights flipped 1 s after a switch
    later = plan(jobs, 80 * GB, CFG, NOW + 1.5)
    assert later == GpuPlan(run=ids("b"), freeze=ids("a"), thaw=ids("b"))


def test_a_running_due_job_is_never_frozen_to_keep_a_held_one() -> None:
    # b arrived running and outweighs a, switched in 1 s ago: one of them must freeze, and
    # freezing b to keep a would be a switch of its own.
    p = plan([job("a", 10, since=NOW - 1.0), job("b", 5000, since=NOW)], 80 * GB, CFG, NOW)
    assert p == GpuPlan(run=ids("b"), freeze=ids("a"))


def test_equal_weights_take_turns_a_quantum_each() -> None:
    jobs = [job("a"), job("b", state="frozen"), job("c", state="frozen", since=10.0)]
    now, ran = NOW, []
    for _ in range(6):
        p = plan(jobs, 80 * GB, CFG, now)
        ran.append(p.run)
        jobs = after(jobs, p, now)
        assert plan(jobs, 80 * GB, CFG, now).changes == 0
        now += CFG.quantum + 0.1
    # The one waiting longest goes next: b (since 0) before c (since 10), then a.
    assert ran == [ids("b"), ids("c"), ids("a"), ids("b"), ids("c"), ids("a")]


def test_concurrency_runs_the_top_jobs_together() -> None:
    cfg = replace(CFG, concurrency=2)
    p = plan([job("a", 1), job("b", 50), job("c", 500)], 80 * GB, cfg, NOW)
    assert p == GpuPlan(run=ids("c", "b"), freeze=ids("a"))


def test_frozen_jobs_that_leave_no_room_are_suspended_lowest_first() -> None:
    jobs = [
        job("a", 9000, memory=40 * GB),
        job("b", 500, "frozen", memory=20 * GB),
        job("c", 50, "frozen", memory=10 * GB),
        job("d", 5, memory=10 * GB),
    ]
    # 80 GB with 5 % kept free: 76 GB. a + b + c + d = 80: d, the lowest, goes (70 left).
    assert plan(jobs, 80 * GB, CFG, NOW) == GpuPlan(run=ids("a"), suspend=ids("d"))
    big = replace(jobs[3], memory=4 * GB)
    assert plan([*jobs[:3], big], 80 * GB, CFG, NOW) == GpuPlan(run=ids("a"), freeze=ids("d"))
    assert plan(jobs, 70 * GB, CFG, NOW) == GpuPlan(run=ids("a"), suspend=ids("d", "c"))


def test_a_suspended_due_job_resumes_once_lower_ones_make_room() -> None:
    jobs = [
        job("a", 100, memory=30 * GB),
        job("b", 9000, "suspended", memory=40 * GB),
        job("c", 10, "frozen", memory=20 * GB),
    ]
    p = plan(jobs, 80 * GB, CFG, NOW)
    # b comes back, a freezes; a + b + c = 90 > 76: c (lowest) is suspended, 70 fits.
    assert p == GpuPlan(run=ids("b"), freeze=ids("a"), suspend=ids("c"), resume=ids("b"))


def test_a_suspended_due_job_that_cannot_fit_lets_the_next_one_run() -> None:
    cfg = replace(CFG, concurrency=2)
    jobs = [
        job("a", 9000, memory=60 * GB),
        job("b", 5000, "suspended", memory=30 * GB),
        job("c", 10, "frozen"),
    ]
    assert plan(jobs, 80 * GB, cfg, NOW) == GpuPlan(run=ids("a", "c"), thaw=ids("c"))


def test_exempt_jobs_always_run() -> None:
    jobs = [job("a", 1, "frozen", exempt=True), job("b", 9000), job("c", 5000)]
    # They take no slot: the heaviest other job runs beside them.
    assert plan(jobs, 80 * GB, CFG, NOW) == GpuPlan(run=ids("b", "a"), freeze=ids("c"), thaw=ids("a"))
    assert plan(jobs, 80 * GB, replace(CFG, concurrency=2), NOW).run == ids("b", "c", "a")
    # Nor are they suspended to make room: the lowest other job is.
    tight = [replace(jobs[0], memory=50 * GB), jobs[1], replace(jobs[2], memory=30 * GB)]
    assert plan(tight, 80 * GB, CFG, NOW).suspend == ids("c")


@pytest.mark.parametrize("mechanism", ["none", "mps"])
def test_without_freezing_everything_runs_and_suspended_jobs_come_back_when_they_fit(
    mechanism: str,
) -> None:
    cfg = replace(CFG, mechanism=mechanism)  # type: ignore[arg-type]
    jobs = [
        job("a", 1, "frozen", memory=30 * GB),
        job("b", 9000, memory=30 * GB),
        job("c", 500, "suspended", memory=20 * GB),
        job("d", 600, "suspended", memory=10 * GB),
    ]
    # 76 GB: a and b hold 60; d (heavier) fits, then c no longer does.
    assert plan(jobs, 80 * GB, cfg, NOW) == GpuPlan(run=ids("b", "d", "a"), thaw=ids("a"), resume=ids("d"))


def test_an_unknown_gpu_size_bounds_nothing() -> None:
    jobs = [job("a", memory=500 * GB), job("b", 1, "suspended", memory=500 * GB)]
    assert budget(0, CFG) == float("inf")
    assert plan(jobs, 0, replace(CFG, mechanism="none"), NOW).resume == ids("b")


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="listed twice: a"):
        plan([job("a"), job("a", 5)], GB, CFG, NOW)
    with pytest.raises(ValueError, match="weight"):
        job("a", 0)
    with pytest.raises(ValueError, match="memory"):
        job("a", memory=-1)
    with pytest.raises(ValueError, match="state"):
        job("a", state="paused")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="since"):
        job("a", since=float("nan"))


def test_mps_percentages_follow_the_weights() -> None:
    both = replace(CFG, mechanism="both")
    assert mps_percentage(100, [], both) == 100
    assert mps_percentage(9000, [1000], both) == 90
    assert mps_percentage(1000, [9000], both) == 10
    assert mps_percentage(1, [9999], both) == 10  # never under mps_min_percentage
    assert mps_percentage(1, [9999], replace(both, mps_min_percentage=1)) == 1
    assert mps_percentage(100, [100, 100], replace(CFG, mechanism="mps")) == 33
    assert mps_percentage(1, [9999], CFG) == 100  # freeze alone uses no MPS


# --- invariants on generated cases -----------------------------------------------------------

STATES: tuple[GpuState, ...] = ("running", "frozen", "suspended")
Case = tuple[list[GpuJob], int, GpuShareConfig, float]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    n = draw(st.integers(0, 7))
    jobs = [
        GpuJob(
            id=ContainerId(f"j{i}"),
            weight=draw(st.sampled_from([1, 10, 100, 100, 5000, 10_000])),
            memory=draw(st.integers(0, 40)) * GB,
            state=draw(st.sampled_from(STATES)),
            since=draw(st.sampled_from([0.0, 5.0, 9.0, 10.0])),
            exempt=draw(st.booleans()) and draw(st.booleans()),
        )
        for i in range(n)
    ]
    cfg = GpuShareConfig(
        mechanism=draw(st.sampled_from(["none", "freeze", "mps", "both"])),
        concurrency=draw(st.integers(1, 3)),
        quantum=draw(st.sampled_from([0.0, 2.0, 30.0])),
        memory_headroom=draw(st.sampled_from([0.0, 0.05, 0.5])),
    )
    total = draw(st.sampled_from([0, 40 * GB, 80 * GB, 140 * GB]))
    return jobs, total, cfg, 10.0


def _states(jobs: Sequence[GpuJob]) -> dict[ContainerId, GpuState]:
    return {j.id: j.state for j in jobs}


def _every_job_ends_in_exactly_one_state_by_a_legal_change(
    case: Case,
) -> None:
    jobs, total, cfg, now = case
    p = plan(jobs, total, cfg, now)
    before = _states(jobs)
    changed = [*p.freeze, *p.thaw, *p.suspend, *p.resume]
    assert len(changed) == len(set(changed)) and len(p.run) == len(set(p.run))
    assert all(before[c] == "running" for c in p.freeze)
    assert all(before[c] == "frozen" for c in p.thaw)
    assert all(before[c] != "suspended" for c in p.suspend)
    assert all(before[c] == "suspended" for c in p.resume)
    now_in = _states(after(jobs, p, now))
    assert {c for c, s in now_in.items() if s == "running"} == set(p.run)
    if cfg.mechanism in ("none", "mps"):
        assert not p.freeze and not p.suspend
        assert "frozen" not in now_in.values()


def _never_more_than_concurrency_run_under_freezing_and_no_slot_idles(
    case: Case,
) -> None:
    jobs, total, cfg, now = case
    if cfg.mechanism not in ("freeze", "both"):
        return
    p = plan(jobs, total, cfg, now)
    exempt = {j.id for j in jobs if j.exempt}
    assert not exempt & {*p.freeze, *p.suspend}
    running = [c for c in p.run if c not in exempt]
    assert len(running) <= cfg.concurrency
    if len(running) < cfg.concurrency:  # a free slot: only jobs that cannot fit beside the runners wait
        memory = {j.id: j.memory for j in jobs}
        used = sum(memory[c] for c in p.run)
        assert all(used + memory[c] > budget(total, cfg) for c in _states(jobs) if c not in p.run)


def _memory_stays_within_the_budget_whenever_the_runners_fit(
    case: Case,
) -> None:
    jobs, total, cfg, now = case
    p = plan(jobs, total, cfg, now)
    limit = budget(total, cfg)
    memory = {j.id: j.memory for j in jobs}
    resident_runners = sum(memory[c] for c in p.run if c not in p.resume)
    runners = sum(memory[c] for c in p.run)
    if resident_runners <= limit:
        assert runners <= limit  # a resume never overflows the GPU
        held = sum(j.memory for j in after(jobs, p, now) if j.state != "suspended")
        assert held <= limit
    # Suspended lowest rank first, and only jobs ranked below every runner.
    order = [j.id for j in ranked(jobs, cfg, now)]
    assert list(p.suspend) == sorted(p.suspend, key=order.index, reverse=True)


def _the_plan_is_deterministic_and_idempotent(case: Case, rng: random.Random) -> None:
    jobs, total, cfg, now = case
    p = plan(jobs, total, cfg, now)
    shuffled = list(jobs)
    rng.shuffle(shuffled)
    assert plan(shuffled, total, cfg, now) == p
    again = plan(after(jobs, p, now), total, cfg, now)
    assert again.changes == 0 and set(again.run) == set(p.run)


def _a_suspended_job_is_resumed_once_it_is_due_and_fits(
    case: Case,
) -> None:
    jobs, total, cfg, _ = case
    if not jobs:
        return
    half = jobs[0].memory if total == 0 else min(jobs[0].memory, int(budget(total, cfg) / 2))
    top = replace(jobs[0], weight=10_000, state="suspended", memory=half)
    others = [replace(j, weight=min(j.weight, 9999), exempt=False) for j in jobs[1:]]
    now = 1000.0  # every runner's quantum is over
    p = plan([top, *others], total, cfg, now)
    runners = sum(j.memory for j in others if j.id in p.run)
    if runners + top.memory <= budget(total, cfg):
        assert top.id in p.resume


def _invariants(case: Case, rng: random.Random) -> None:
    _every_job_ends_in_exactly_one_state_by_a_legal_change(case)
    _never_more_than_concurrency_run_under_freezing_and_no_slot_idles(case)
    _memory_stays_within_the_budget_whenever_the_runners_fit(case)
    _the_plan_is_deterministic_and_idempotent(case, rng)
    _a_suspended_job_is_resumed_once_it_is_due_and_fits(case)


@settings(max_examples=20, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_the_invariants_hold(case: Case, rng: random.Random) -> None:
    """Every job in one state by a legal change; at most ``concurrency`` running under
    freezing and no slot idle while a job could run; memory within the budget whenever the
    runners fit; the same plan for any order of the jobs, and none left to do when it is
    applied; a suspended job that is due and fits resumes."""
    _invariants(case, rng)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_the_invariants_hold_on_many_cases(case: Case, rng: random.Random) -> None:
    _invariants(case, rng)
