"""Oracle detection (``specon-oracle``): the classifier's verdict replaced by the trace's true
convergence point, fed to the same policy."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from specon.cli import cmd_demo
from specon.config import MonitorConfig
from specon.embedded.live_policies import NAMES, live_policy
from specon.model import Category, ContainerId
from specon.policy.classifier import classifier_for
from specon.policy.experiments import CATALOGUE
from specon.policy.monitor import MonitorState, initial, mark_migrated
from specon.sim import oracle, runner
from specon.sim.cluster import DEFAULT_PARAMS
from specon.sim.detection import ground_truth_step
from specon.sim.experiment import PointResult, ScenarioResult, Summary
from specon.sim.policies import make_policy
from specon.sim.runner import simulate
from specon.sim.scenarios import scenario
from specon.sim.summary import table, target_misses
from specon.testing.builders import job_plan, trace, workload

A, B = ContainerId("a"), ContainerId("b")


def test_before_the_truth_a_job_progresses_and_from_it_it_is_converged_and_wants_a_move() -> None:
    # The classifier would call this one converged; the oracle says not yet.
    cc = MonitorState(category=Category.CONVERGED, t_cc=5.0, wants_request=True)
    before = oracle.verdict(initial(), cc, converged=False, now=10.0)
    assert before.category is Category.PROGRESSING
    assert not (before.wants_request or before.pending_request)
    first = oracle.verdict(before, before, converged=True, now=20.0)
    assert (first.category, first.t_cc, first.wants_request) == (Category.CONVERGED, 20.0, True)
    # Later ticks keep the time it converged and a request still pending.
    pending = MonitorState(category=Category.CONVERGED, t_cc=20.0, pending_request=True)
    later = oracle.verdict(pending, initial(), converged=True, now=30.0)
    assert (later.t_cc, later.pending_request, later.category) == (20.0, True, Category.CONVERGED)
    # A job the manager decided for stays frozen as the classifier froze it.
    moved = mark_migrated(initial(), 25.0)
    assert oracle.verdict(moved, moved, converged=False, now=30.0) == moved


def test_the_workers_request_rule_raises_the_oracles_requests_once() -> None:
    clf = classifier_for(MonitorConfig())
    states = {A: initial(), B: initial()}
    converged = {A: True, B: False}
    first = oracle.detect_worker(clf, states, {A: [1.0], B: [1.0]}, 30.0, converged)
    assert first.requests == (A,)  # b is still active, so a may ask
    assert first.states[A].pending_request and first.states[B].category is Category.PROGRESSING
    again = oracle.detect_worker(clf, first.states, {A: [0.9], B: [0.9]}, 60.0, converged)
    assert again.requests == () and again.states[A].pending_request  # repeated by heartbeats only
    assert again.states[A].t_cc == 30.0


def test_the_simulated_agents_call_a_job_converged_exactly_past_its_true_convergence_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fast = trace([0.1 + 0.9 * math.exp(-i / 15.0) for i in range(300)], model="fast")
    linear = trace([1.0 - i / 300 for i in range(300)], model="linear")
    wl = workload(2, (job_plan("a", fast), job_plan("b", linear)))
    seen: dict[str, list[tuple[float, bool]]] = {"a": [], "b": []}
    real = runner._Run._past_truth

    def spy(self: Any, job: Any) -> bool:
        verdict = real(self, job)
        seen[job.id].append((self.cluster.steps_now(job), verdict))
        return verdict

    monkeypatch.setattr(runner._Run, "_past_truth", spy)
    run = simulate(wl, make_policy("specon-oracle"))
    truth = {"a": ground_truth_step(fast), "b": ground_truth_step(linear)}
    for jid, ticks in seen.items():
        assert ticks and all(v == (step >= truth[jid]) for step, v in ticks), jid
    assert any(v for _, v in seen["a"])  # a reached its truth while both ran
    # The converged job is moved off the crowded worker, as the classifier's would be.
    assert [(m.job, m.reason) for m in run.migrations] == [("a", "converged")]
    assert all(j.finish is not None for j in run.jobs)


def test_only_the_simulator_runs_the_oracle() -> None:
    assert CATALOGUE["specon-oracle"].oracle and not CATALOGUE["specon-oracle"].live
    assert "specon-oracle" not in NAMES
    with pytest.raises(ValueError, match="unknown live policy 'specon-oracle'"):
        live_policy("specon-oracle")
    sim = make_policy("specon-oracle")
    # Otherwise the very policy specon runs.
    assert sim.oracle and sim.declared and sim.daemons == make_policy("specon").daemons
    assert not make_policy("specon").oracle


def test_the_demo_refuses_the_oracle_by_name(tmp_path: Path) -> None:
    for name in ("specon-oracle", "specon-predicted"):
        with pytest.raises(ValueError, match=f"policy '{name}' runs only in the simulator"):
            cmd_demo._policy_file(name, tmp_path)


def test_the_oracle_is_a_yardstick_not_a_competitor_the_default_falls_short_of() -> None:
    def figures(jct: float) -> Summary:
        mean = {"avg_jct_reduction": jct, "makespan_reduction": 0.1, "ttq_reduction": 0.05}
        return Summary(mean, {}, 1, {"worst_slowdown": 1.5})

    summaries = {"ds": Summary({}, {}, 1), "specon": figures(0.5), "specon-oracle": figures(0.6)}
    point = PointResult(alpha=0.01, interval=30.0, summaries=summaries)
    result = ScenarioResult(scenario("A3"), (0,), tuple(summaries), None, DEFAULT_PARAMS, point)
    assert target_misses([result]) == []
    assert any(line.startswith("| specon-oracle | -60.0 %") for line in table([result]))
