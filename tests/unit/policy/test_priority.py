"""Priority rules: the CPU weights a worker's agent gives its jobs, and the simulator's
weighted sharing of a worker."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.config import PolicyError, PriorityConfig, default_policy, policy_from_dict, policy_to_dict
from specon.model import WEIGHT_DEFAULT, WEIGHT_MAX, WEIGHT_MIN, ContainerId
from specon.policy.priority import hermes, mbasgd, optimus, phased, slaq, srpt, tiresias
from specon.policy.priority.base import JobProgress, ranked_weights
from specon.policy.priority.rules import weights
from specon.sim.cluster import SimParams, water_fill
from specon.sim.policies import SimPolicy, make_policy
from specon.sim.runner import simulate
from specon.testing.builders import job_plan, trace, workload


def _job(cid: str, **kw: float | int | None) -> JobProgress:
    kw.setdefault("started", 0.0)
    return JobProgress(id=ContainerId(cid), **kw)  # type: ignore[arg-type]


def _ids(*names: str) -> list[ContainerId]:
    return [ContainerId(n) for n in names]


def test_ranked_weights_fall_by_the_ratio_and_never_reach_zero() -> None:
    w = ranked_weights(_ids("a", "b", "c", "d"), 100.0)
    assert list(w.values()) == [WEIGHT_MAX, 100, WEIGHT_MIN, WEIGHT_MIN]
    assert set(ranked_weights(_ids("a", "b"), 1.0).values()) == {WEIGHT_MAX}


def test_srpt_puts_the_least_remaining_cpu_first_and_unknown_sizes_last_by_attained_service() -> None:
    jobs = [
        _job("long", step=10, total=1000, cpu_seconds=10),  # 990 CPU-s left
        _job("short-but-slow", step=10, total=100, cpu_seconds=100),  # 90 steps x 10 = 900
        _job("short", step=50, total=100, cpu_seconds=50),  # 50
        _job("unknown-old", step=10, cpu_seconds=80),
        _job("unknown-new", step=1, cpu_seconds=5),
    ]
    assert srpt.order(jobs) == _ids("short", "short-but-slow", "long", "unknown-new", "unknown-old")


def test_srpt_costs_a_job_without_steps_yet_like_its_neighbours() -> None:
    jobs = [_job("a", step=10, total=110, cpu_seconds=20), _job("new", started=5.0, step=0, total=40)]
    assert srpt.remaining_work(jobs) == {"a": 200.0, "new": 80.0}
    assert srpt.order(jobs) == _ids("new", "a")


def test_tiresias_demotes_past_each_threshold_and_is_fifo_within_a_queue() -> None:
    args = tiresias.Args(thresholds=(10.0, 100.0))
    jobs = [
        _job("big", started=0.0, cpu_seconds=500),
        _job("mid", started=1.0, cpu_seconds=50),
        _job("young-late", started=3.0, cpu_seconds=5),
        _job("young-early", started=2.0, cpu_seconds=9),
    ]
    assert tiresias.order(jobs, args) == _ids("young-early", "young-late", "mid", "big")


def test_hermes_runs_unclassified_jobs_first_then_the_fastest_converging() -> None:
    jobs = [_job("slow", gain=0.001), _job("fast", gain=0.2), _job("new", started=9.0)]
    assert hermes.order(jobs) == _ids("new", "fast", "slow")


def test_slaq_weights_follow_the_improvement_and_keep_a_floor() -> None:
    jobs = [_job("a", gain=0.2), _job("b", gain=0.05), _job("c", gain=0.0)]
    got = slaq.weights(jobs, slaq.Args(floor=0.01))
    assert got == {"a": WEIGHT_MAX, "b": WEIGHT_MAX // 4, "c": WEIGHT_MAX // 100}
    assert len(set(slaq.weights([_job("a"), _job("b", gain=0.0)], slaq.Args()).values())) == 1  # even


def test_mbasgd_weighs_remaining_work_by_the_fraction_trained() -> None:
    # Equal CPU per step: "fresh" has 900 steps left of 1000, "late" 450 of 4500 (90 % done).
    jobs = [
        _job("fresh", step=100, total=1000, cpu_seconds=100),
        _job("late", step=4050, total=4500, cpu_seconds=4050),
    ]
    assert srpt.order(jobs) == _ids("late", "fresh")
    # gamma 0 is srpt; gamma 1 orders by whole size (1000 against 4500): the fresh job first.
    assert mbasgd.weights(jobs, mbasgd.Args(gamma=0.0)) == srpt.weights(jobs, srpt.Args())
    assert list(mbasgd.weights(jobs, mbasgd.Args(gamma=1.0))) == _ids("fresh", "late")
    values = mbasgd.priority_values(jobs, 1.0)
    assert values["fresh"] == pytest.approx(1000.0) and values["late"] == pytest.approx(4500.0)
    # Without a declared total it is srpt's value (the predicted steps), unknown ones last.
    loose = [_job("p", step=10, predicted_steps=50, cpu_seconds=10), _job("u", cpu_seconds=1)]
    assert mbasgd.priority_values(loose, 1.05) == {"p": 50.0, "u": None}


def test_the_early_termination_factor_is_the_papers_and_stays_finite() -> None:
    assert mbasgd.early_termination_factor(0.0, 1.05) == 1.0
    assert mbasgd.early_termination_factor(0.5, 1.0) == pytest.approx(2.0)
    assert mbasgd.early_termination_factor(0.4, 1.05) == pytest.approx((1 / 0.6) ** 1.05)
    assert math.isfinite(mbasgd.early_termination_factor(1.0, 1.05))
    assert mbasgd.early_termination_factor(-3.0, 2.0) == 1.0  # clamped


def test_optimus_shares_grow_with_the_square_root_of_remaining_work() -> None:
    jobs = [_job("a", step=1, total=401, cpu_seconds=1), _job("b", step=1, total=101, cpu_seconds=1)]
    got = optimus.weights(jobs, optimus.Args())
    assert got == {"a": WEIGHT_MAX, "b": WEIGHT_MAX // 2}


def test_rule_none_gives_every_job_the_default_weight() -> None:
    equal = PriorityConfig(rule="none")
    assert weights([_job("a"), _job("b")], equal) == {"a": WEIGHT_DEFAULT, "b": WEIGHT_DEFAULT}


def test_each_rule_validates_its_own_arguments_in_the_policy_file() -> None:
    data = {
        "apiVersion": "specon/v1alpha1",
        "kind": "Policy",
        "priority": {
            "rule": "tiresias",
            "tiresias": {"thresholds": [50, 10]},
            "srpt": {"ratio": 0.5},
            "slaq": {"floor": 0},
            "optimus": {"exponent": -1},
            "mbasgd": {"gamma": -0.5},
        },
    }
    with pytest.raises(PolicyError) as err:
        policy_from_dict(data)
    assert set(err.value.errors) == {
        "priority.srpt.ratio: must be >= 1, got 0.5",
        "priority.optimus.exponent: must be in [0, 2], got -1.0",
        "priority.tiresias.thresholds: must be strictly ascending, got [50.0, 10.0]",
        "priority.slaq.floor: must be in (0, 1], got 0.0",
        "priority.mbasgd.gamma: must be in [0, 10], got -0.5",
    }


_weights = st.lists(st.floats(1.0, 10_000.0), min_size=1, max_size=8)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(_weights, st.floats(0.25, 8.0), st.floats(0.25, 2.0))
def test_water_filling_uses_the_capacity_caps_each_job_and_keeps_the_weights_order(
    ws: list[float], capacity: float, cap: float
) -> None:
    shares = water_fill(capacity, ws, cap)
    assert all(0 < s <= cap * (1 + 1e-9) for s in shares)
    assert math.isclose(sum(shares), min(capacity, cap * len(ws)), rel_tol=1e-9)
    for i in range(len(ws) - 1):
        if ws[i] > ws[i + 1]:
            assert shares[i] >= shares[i + 1] * (1 - 1e-9)


def test_srpt_on_one_worker_finishes_short_jobs_first() -> None:
    # Four 100-step jobs of 1, 2, 3, 4 CPU-s a step at once on one core: fair sharing
    # finishes them at 400, 700, 900, 1000 s (mean 750); shortest first at 100, 300,
    # 600, 1000 (mean 500), less the ~1 % the next job gets beside the first.
    tr = trace([float(100 - i) for i in range(100)])
    wl = workload(1, [job_plan(f"j{c}", tr, cost=float(c)) for c in (4, 3, 2, 1)])
    fair = simulate(wl, make_policy("ds"), params=SimParams())
    first = simulate(wl, make_policy("srpt"), params=SimParams())
    assert fair.avg_jct == pytest.approx(750.0)
    assert first.avg_jct == pytest.approx(500.0, rel=0.02)
    assert [j.id for j in sorted(first.jobs, key=lambda j: j.finish or 0)] == ["j1", "j2", "j3", "j4"]


def test_phased_keys_a_job_by_its_next_milestones() -> None:
    args = phased.Args(quality_weight=0.75, quality_share=0.35)
    # Before its quality point: the cheaper of the early part alone (350 / 0.75) or both
    # milestones (1000 / 1.75); past it: the work left.
    assert phased.milestone_key(0.0, 1000.0, 350.0, args) == pytest.approx(350 / 0.75)
    assert phased.milestone_key(0.0, 1000.0, 900.0, args) == pytest.approx(1000 / 1.75)
    assert phased.milestone_key(500.0, 500.0, 350.0, args) == 500.0
    assert phased.milestone_key(0.0, 1000.0, 350.0, phased.Args(quality_weight=0.0)) == 1000.0


def test_phased_runs_a_long_jobs_early_part_before_a_short_jobs_tail_where_srpt_does_not() -> None:
    jobs = [
        _job("long-fresh", step=0, total=1000, cpu_seconds=0),  # its early part: 350 CPU-s
        _job("tail", step=500, total=1000, cpu_seconds=500),  # past its early part: 500 left
        _job("unknown", step=5, cpu_seconds=5),
    ]
    # The fixed share: an early part of 35 % of the steps worth 0.75 of a completion.
    no_aging = phased.Args(aging=0.0, quality_point="share", quality_share=0.35, quality_weight=0.75)
    assert phased.order(jobs, no_aging) == _ids("long-fresh", "tail", "unknown")
    assert srpt.order(jobs) == _ids("tail", "long-fresh", "unknown")
    # Quality weight 0 is shortest remaining first.
    assert phased.order(jobs, phased.Args(aging=0.0, quality_weight=0.0)) == srpt.order(jobs)
    # Its model's jobs on the cluster reached quality at 20 % of their steps: cheaper still.
    learned = [dataclasses.replace(j, quality_memory=0.2) for j in jobs]
    assert phased.order(learned, phased.Args(aging=0.0))[0] == "long-fresh"


def test_phased_puts_a_job_late_against_equal_sharing_ahead_of_every_job_on_time() -> None:
    short = _job("short", started=5.0, step=0, total=10, cpu_seconds=0)
    # 100 CPU-s left and 100 behind its equal share: DS would have finished it by now.
    late = _job("late", step=100, total=200, cpu_seconds=100, fair_seconds=200)
    assert phased.order([short, late], phased.Args()) == _ids("late", "short")
    # 50 behind: on time by default, late where half its remaining work behind counts.
    behind = _job("late", step=100, total=200, cpu_seconds=100, fair_seconds=150)
    assert phased.order([short, behind], phased.Args()) == _ids("short", "late")
    assert phased.order([short, behind], phased.Args(late=0.5)) == _ids("late", "short")


def test_phased_checks_its_arguments_in_the_policy_file() -> None:
    data = {
        "apiVersion": "specon/v1alpha1",
        "kind": "Policy",
        "priority": {
            "phased": {"quality_share": 0, "quality_weight": -1, "aging": 2, "ratio": 0.5, "late": 0}
        },
    }
    with pytest.raises(PolicyError) as err:
        policy_from_dict(data)
    assert set(err.value.errors) == {
        "priority.phased.ratio: must be >= 1, got 0.5",
        "priority.phased.quality_share: must be in (0, 1], got 0.0",
        "priority.phased.quality_weight: must be >= 0, got -1.0",
        "priority.phased.aging: must be in [0, 1], got 2.0",
        "priority.phased.late: must be in (0, 1], got 0.0",
    }


def _on_one_worker(rule: str) -> SimPolicy:
    """``specon`` with ``rule`` (its agents re-weigh every Δ, as a real agent every tick)."""
    data = policy_to_dict(default_policy())
    data["priority"]["rule"] = rule
    return make_policy("specon", base=policy_from_dict(data))


def test_phased_on_one_worker_reaches_quality_far_sooner_than_srpt_and_finishes_sooner_than_ds() -> None:
    # Six jobs of similar size at once on one core, a loss that falls fast then flattens
    # (its quality point a quarter in): shortest first leaves the longer jobs' early parts
    # to the end; phased runs every early part first, then the tails shortest first.
    tr = trace([100.0 * math.exp(-i / 80) + 1.0 for i in range(1000)])
    wl = workload(1, [job_plan(f"j{c}", tr, cost=c / 10) for c in (1.5, 1.4, 1.3, 1.2, 1.1, 1.0)])
    ds = simulate(wl, make_policy("ds"), params=SimParams())
    first = simulate(wl, _on_one_worker("srpt"), params=SimParams())
    mine = simulate(wl, _on_one_worker("phased"), params=SimParams())
    ds_ttq, srpt_ttq, ttq_ = (r.avg_time_to_quality for r in (ds, first, mine))
    ds_jct, jct_ = ds.avg_jct, mine.avg_jct
    assert ds_ttq is not None and srpt_ttq is not None and ttq_ is not None
    assert ds_jct is not None and jct_ is not None
    assert ttq_ < 0.8 * srpt_ttq  # 221 s against 314 s
    # 185 s: the early parts overrun by up to a tick (Δ 30 s), and late jobs go first.
    assert ttq_ <= 1.25 * ds_ttq
    assert jct_ < 0.8 * ds_jct  # 500 s against 692 s
