"""Simulated runs of the policies on tiny hand-made workloads, and the lower bound."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specon.policy
import specon.sim
from specon.coordinator import inline as coordinator_inline
from specon.policy import classifier
from specon.sim import runner
from specon.sim.cluster import DEFAULT_PARAMS, SimParams, Workload
from specon.sim.policies import SIMULATED, lower_bound, make_policy
from specon.sim.runner import simulate
from specon.sim.trace import Trace
from specon.testing.builders import job_plan, trace, workload

STEPS = 300


def _falling(tau: float, n: int = STEPS) -> Trace:
    """Loss decaying with time constant ``tau`` (a share of the run) to a floor of 0.1."""
    return trace([0.1 + 0.9 * math.exp(-i / (tau * n)) for i in range(n)], model="fast")


def _linear(n: int = STEPS) -> Trace:
    """Loss falling by the same amount every step: never converges before the end."""
    return trace([1.0 - i / n for i in range(n)], model="linear")


def _moves(
    policy: str, workload: Workload, params: SimParams = DEFAULT_PARAMS
) -> list[tuple[str, str, str, str]]:
    run = simulate(workload, make_policy(policy), params=params)
    return [(m.job, m.source, m.target, m.reason) for m in run.migrations]


def _moved(policy: str, workload: Workload) -> list[tuple[str, str, str]]:
    return [(job, source, reason) for job, source, _, reason in _moves(policy, workload)]


def test_specon_moves_a_converged_job_off_a_crowded_worker_and_both_jobs_gain() -> None:
    wl = workload(2, (job_plan("a", _falling(0.05)), job_plan("b", _linear())))
    ds = simulate(wl, make_policy("ds"))
    run = simulate(wl, make_policy("specon"))
    # The default classifier (robust, its doubling test) calls a converged and requests a
    # move on the same tick, so Algorithm 2 moves it (a saves its wait behind b: a gain).
    assert [(m.job, m.source, m.target, m.reason) for m in run.migrations] == [("a", "w1", "w2", "converged")]
    by_id = {j.id: j for j in ds.jobs}
    for job in run.jobs:
        jct, base = job.jct, by_id[job.id].jct
        assert jct is not None and base is not None
        assert jct < base
    assert simulate(wl, make_policy("ds"), params=SimParams()).makespan == 600.0  # ideal sharing


def test_ds_never_migrates() -> None:
    wl = workload(4, tuple(job_plan(f"j{i}", _falling(0.05)) for i in range(6)))
    run = simulate(wl, make_policy("ds"))
    assert run.migrations == ()
    assert all(len(j.worker_history) == 1 for j in run.jobs)


def test_paper_mode_and_defaults_differ_on_a_crowded_worker() -> None:
    # Loads [3, 0, 0, 0]: a converges first, then b, while c keeps training. Both modes
    # move a; only the defaults move b (paper mode's Algorithm 2 needs |PC| + |WC| > 1,
    # SPEC §3.3, and its Algorithm 3 never acts on [3, 0, 0, 0]).
    jobs = (job_plan("a", _falling(0.03)), job_plan("b", _falling(0.15)), job_plan("c", _linear()))
    wl = workload(4, jobs)
    # The defaults' classifier requests on the tick it calls a job converged: Algorithm 2
    # moves both.
    assert _moved("specon", wl) == [("a", "w1", "converged"), ("b", "w1", "converged")]
    assert _moved("specon-paper", wl) == [("a", "w1", "converged")]


def test_the_balancer_moves_the_most_recently_placed_job_to_the_least_loaded_worker() -> None:
    # All on w1: at 10 s loads are [2, 0, 0] -> b moves; at 20 s c arrives: [2, 1, 0] -> c
    # (placed last) moves; then [1, 1, 1].
    jobs = (
        job_plan("a", _linear()),
        job_plan("b", _linear(), submit=10.0),
        job_plan("c", _linear(), submit=20.0),
    )
    wl = workload(3, jobs)
    assert _moves("balancer", wl) == [("b", "w1", "w2", "rebalance"), ("c", "w1", "w3", "rebalance")]


def test_the_balancer_counts_a_moved_job_from_its_arrival_on_its_new_worker() -> None:
    # a and b start on w2 at 30 s: loads [0, 2] -> a moves to w1, running there from 43.4 s
    # (a fixed 8.4 s downtime), where c started at 40 s. When b finishes, loads are [2, 0]:
    # the most recently placed job moves back, a (as a descheduler sees a moved job: a new
    # pod), not c, the most recently started one (``rebalance.duration_from: placed``).
    jobs = (
        job_plan("a", _linear(), submit=30.0, worker="w2"),
        job_plan("b", _linear(), submit=30.0, worker="w2"),
        job_plan("c", _linear(), submit=40.0, worker="w1"),
    )
    assert _moves("balancer", workload(2, jobs), SimParams(migration_downtime=8.4)) == [
        ("a", "w2", "w1", "rebalance"),
        ("a", "w1", "w2", "rebalance"),
    ]


@pytest.mark.slow
def test_same_workload_same_result() -> None:
    jobs = tuple(job_plan(f"j{i}", _falling(0.05 + 0.05 * i), submit=15.0 * i, worker=None) for i in range(8))
    wl = workload(3, jobs)
    for policy in SIMULATED:
        first = simulate(wl, make_policy(policy)).to_json()
        assert simulate(wl, make_policy(policy)).to_json() == first


_curves = st.sampled_from([0.02, 0.1, 0.4, None])  # None: linear


@st.composite
def _workloads(draw: st.DrawFn) -> Workload:
    workers = {f"w{i + 1}": draw(st.sampled_from([1.0, 2.0])) for i in range(draw(st.integers(1, 3)))}
    jobs = []
    for i in range(draw(st.integers(1, 6))):
        tau = draw(_curves)
        tr = _linear(100) if tau is None else _falling(tau, 100)
        submit = draw(st.floats(0.0, 200.0, allow_nan=False))
        cost = draw(st.floats(0.3, 3.0, allow_nan=False))
        jobs.append(job_plan(f"j{i}", tr, submit=round(submit, 1), worker=None, cost=cost))
    return workload(workers, jobs)


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(_workloads())
def test_no_policy_beats_the_lower_bound(wl: Workload) -> None:
    params = SimParams(migration_downtime=1.0)
    bound = lower_bound(wl, params)
    for policy in SIMULATED:
        run = simulate(wl, make_policy(policy, interval=10.0), params=params)
        assert run.avg_jct is not None and run.makespan is not None
        assert bound.avg_jct <= run.avg_jct * (1 + 1e-9)
        assert bound.makespan <= run.makespan * (1 + 1e-9)
        for job in run.jobs:
            assert job.jct is not None
            assert bound.job_min[job.id] <= job.jct * (1 + 1e-9)


def test_the_bound_of_one_job_alone_is_its_run_time() -> None:
    wl = workload(2, (job_plan("a", _linear(), submit=5.0, cost=2.0),))
    b = lower_bound(wl)
    assert (b.avg_jct, b.makespan) == (600.0, 600.0)


def test_the_bound_pools_the_cluster_when_it_is_full() -> None:
    # Four 100 s jobs at once on one one-core worker: makespan >= 400 s; SRPT on the
    # pooled machine finishes them at 100, 200, 300, 400 -> mean 250 s.
    wl = workload(1, tuple(job_plan(f"j{i}", _linear(100)) for i in range(4)))
    b = lower_bound(wl)
    assert b.makespan == 400.0
    assert b.avg_jct == 250.0
    assert simulate(wl, make_policy("ds"), params=SimParams()).avg_jct == 400.0  # ideal sharing


@pytest.mark.slow
def test_the_simulator_drives_the_managers_coordinator_and_copies_none_of_it() -> None:
    assert vars(runner)["InlineCoordinator"] is coordinator_inline.InlineCoordinator
    assert vars(runner)["classifier_for"] is classifier.classifier_for
    assert "decide_pass" not in vars(runner) and "next_step" not in vars(runner)
    shared = {"decide_pass", "select_target", "plan_rebalance", "should_rebalance", "tick_worker",
              "apply_request_rule", "mark_migrated", "normalised_change", "next_step", "snapshot",
              "record", "open_migration", "batch_for"}  # fmt: skip
    for path in Path(specon.sim.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert not defined & shared, f"{path.name} defines {sorted(defined & shared)}"


def test_no_simulation_branches_in_the_policy_code() -> None:
    for path in Path(specon.policy.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {
            a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs
        }
        assert not [n for n in names if "simulat" in n.lower()], path.name


def test_jobs_tell_the_classifier_their_horizon_only_where_they_declare_their_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: dict[str, list[dict[str, float]]] = {"specon": [], "specon-predicted": []}
    real = classifier.tick_worker
    current = ["specon"]

    def spy(*args: Any, horizons: Any = None, **kw: Any) -> Any:
        seen[current[0]].append(dict(horizons or {}))
        return real(*args, horizons=horizons, **kw)

    monkeypatch.setattr(classifier, "tick_worker", spy)
    wl = workload(2, (job_plan("a", _falling(0.05)), job_plan("b", _linear())))
    for name in seen:
        current[0] = name
        simulate(wl, make_policy(name))
    declared = [h for tick in seen["specon"] for h in tick.values()]
    # As the agent's: total steps / steps done, >= 1, shrinking towards 1 as a job runs.
    assert declared and all(h >= 1.0 for h in declared)
    assert min(declared) < 1.5 < max(declared)
    assert not any(seen["specon-predicted"])  # no declared steps, no horizon


def test_peers_re_weigh_every_tick_as_the_agent_does() -> None:
    # Two like jobs on one worker. ``phased`` runs ``a`` to its estimated quality point,
    # then ``b``'s early part goes first: an order that changes while no job comes or goes,
    # so only a re-weighing every Δ (as the real agent's) sees it. ``srpt``'s order never
    # changes: ``a`` runs whole, then ``b``.
    wl = workload(1, (job_plan("a", _falling(0.05)), job_plan("b", _falling(0.05))))
    run = simulate(wl, make_policy("phased"))
    phased = {j.id: j for j in run.jobs}
    assert run.meta["ticks"] > 0
    assert phased["b"].quality_time is not None and phased["a"].finish is not None
    assert phased["b"].quality_time < phased["a"].finish
    srpt = {j.id: j for j in simulate(wl, make_policy("srpt")).jobs}
    assert srpt["b"].quality_time is not None and srpt["a"].finish is not None
    assert srpt["b"].quality_time > srpt["a"].finish
