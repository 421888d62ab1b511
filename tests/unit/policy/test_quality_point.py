"""The quality-point estimate (``specon.policy.quality_point``): known curves give known points,
never before the job's first logged step, steady under noise; and the agent and the simulator
both reach it through the ``phased`` rule (one definition)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from specon_agent.priority import Running, decide

from specon.config import PriorityConfig
from specon.model import ContainerId
from specon.policy import quality_point
from specon.policy.priority import phased
from specon.sim.detection import ground_truth_index, ground_truth_step, smooth
from specon.sim.policies import make_policy
from specon.sim.runner import simulate
from specon.sim.trace import load_traces
from specon.testing.builders import job_plan, trace, workload

TOTAL = 1000.0


def _falling_then_flat(knee_at: int, n: int = 200) -> list[float]:
    """A loss falling linearly from 100 to 0 over ``knee_at`` points, then flat at 0."""
    return [max(0.0, 100.0 * (1 - i / knee_at)) for i in range(n)]


def _steps(n: int, every: float = 5.0) -> list[float]:
    return [(i + 1) * every for i in range(n)]


def test_the_knee_of_a_known_curve() -> None:
    # Within 5 % of the 100 fall once below 5: the first point past 95 % of the way.
    assert quality_point.knee(_falling_then_flat(50), 0) == 48
    assert quality_point.knee([], 3) == 0
    assert quality_point.knee([1.0, 1.0, 2.0], 1) == 0  # never improved: its first point


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-1e3, max_value=1e3), min_size=1, max_size=80), st.integers(0, 6))
def test_the_knee_is_the_simulators_ground_truth_definition(losses: list[float], half: int) -> None:
    """The estimate's point of a whole curve is the one time-to-quality counts (the detection
    benchmark's ground truth, which calls it), against a plain reading of that definition."""
    best = list(itertools.accumulate(smooth(losses, half), min))
    total = best[0] - best[-1]
    want = next((i for i, b in enumerate(best) if b - best[-1] < 0.05 * total), len(best) - 1)
    assert quality_point.knee(losses, half) == (want if total > 0 else 0)
    assert ground_truth_index(losses, half_width=half) == quality_point.knee(losses, half)


def test_share_and_oracle() -> None:
    assert quality_point.estimate("share", step=10.0, total=TOTAL, share=0.35) == 350.0
    assert quality_point.estimate("oracle", step=10.0, total=TOTAL, share=0.35, truth=612.0) == 612.0
    # Outside the simulator the truth is unknown: the share.
    assert quality_point.estimate("oracle", step=10.0, total=TOTAL, share=0.35) == 350.0


def test_curve_calls_a_point_reached_once_the_curve_stayed_flat_past_it() -> None:
    losses = _falling_then_flat(30)  # flat from step 150 of 1,000 (5 steps a point)
    n = 120  # at step 600: flat for far more than the window
    got = quality_point.curve_point(_steps(n), losses[:n], 600.0, TOTAL, 0.35)
    assert got == pytest.approx(5.0 * (quality_point.knee(losses[:n], 5) + 1))
    assert got < 0.35 * TOTAL  # the curve says less than the share


def test_curve_keeps_a_still_improving_job_before_its_point() -> None:
    losses = [100.0 - 0.4 * i for i in range(200)]  # still falling as fast at the end
    seen = []
    for n in range(2, 200, 7):
        step = 5.0 * n
        got = quality_point.curve_point(_steps(n), losses[:n], step, TOTAL, 0.35)
        assert got >= max(0.35 * TOTAL, step + quality_point.WINDOW * TOTAL) - 1e-9
        seen.append(got)
    assert seen == sorted(seen)  # it only moves forward while the job improves


def test_curve_without_a_curve_is_the_share() -> None:
    assert quality_point.curve_point([], [], 100.0, TOTAL, 0.35) == 350.0
    assert quality_point.curve_point([5.0], [3.0], 100.0, TOTAL, 0.35) == 350.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=100), min_size=2, max_size=150),
    st.floats(min_value=0, max_value=5e3),
)
def test_never_before_the_job_started(losses: list[float], first: float) -> None:
    """A restored job's curve starts at its checkpoint: its point is never before that."""
    steps = [first + 5.0 * i for i in range(len(losses))]
    now = steps[-1]
    got = quality_point.curve_point(steps, losses, now, now + TOTAL, 0.35)
    assert got >= first
    assert math.isfinite(got)


def test_curve_is_steady_under_noise() -> None:
    """5 % noise on a curve that flattens at a fifth of its steps moves its point by little."""
    clean = [math.exp(-i / 10) * 100 + 10 for i in range(200)]
    rng = random.Random(7)
    noisy = [v * (1 + rng.uniform(-0.05, 0.05)) for v in clean]
    n = 160
    a = quality_point.curve_point(_steps(n), clean[:n], 5.0 * n, TOTAL, 0.35)
    b = quality_point.curve_point(_steps(n), noisy[:n], 5.0 * n, TOTAL, 0.35)
    assert a < 5.0 * n - quality_point.WINDOW * TOTAL  # called reached
    assert abs(a - b) <= 0.05 * TOTAL


def test_a_finished_jobs_point_from_its_whole_curve_is_its_true_point() -> None:
    """What a worker remembers of a finished job is what time-to-quality counts."""
    for ts in load_traces().values():
        for tr in ts:
            steps = [float((i + 1) * tr.stride) for i in range(len(tr.losses))]
            share = quality_point.finished_share(steps, tr.losses, tr.steps)
            assert share == pytest.approx(ground_truth_step(tr) / tr.steps)


def test_memory_is_the_recalled_share_else_the_curve_estimate() -> None:
    assert quality_point.estimate("memory", step=1.0, total=TOTAL, share=0.35, recalled=0.5) == 500.0
    assert quality_point.estimate("memory", step=1.0, total=TOTAL, share=0.35) == 350.0  # no curve yet
    steps = [float(k) for k in range(1, 601)]
    flat = [max(0.0, 100.0 - k) for k in range(1, 601)]  # flat from step 100, 500 steps ago
    by_curve = quality_point.estimate("curve", step=600.0, total=TOTAL, share=0.35, steps=steps, losses=flat)
    assert by_curve < 350.0
    assert (
        quality_point.estimate("memory", step=600.0, total=TOTAL, share=0.35, steps=steps, losses=flat)
        == by_curve
    )


def test_the_rule_checks_the_knob() -> None:
    assert phased.problems(phased.Args(quality_point="knee")) == [
        "quality_point: must be one of share, curve, memory, oracle, got 'knee'"
    ]
    assert phased.problems(phased.Args(quality_point="curve")) == []


def test_the_agent_and_the_simulator_estimate_through_the_same_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, Any]] = []
    real = quality_point.estimate

    def spy(how: str, **kw: Any) -> float:
        calls.append({"how": how, **kw})
        return real(how, **kw)

    monkeypatch.setattr(quality_point, "estimate", spy)
    cfg = PriorityConfig(rule="phased", phased=phased.Args(quality_point="curve"))
    curve = ((10.0, 5.0), (20.0, 4.0), (30.0, 3.5))
    running = [
        Running(
            ContainerId("a"),
            0.0,
            step=30,
            total=100,
            first_step=10,
            first_cpu=1.0,
            cpu_seconds=3.0,
            curve=curve,
        ),
        Running(ContainerId("b"), 0.0, step=5, total=100, first_step=1, first_cpu=0.5, cpu_seconds=1.0),
    ]
    decide(running, {}, cfg)
    agent = [c for c in calls if c["how"] == "curve"]
    assert [list(c["losses"]) for c in agent] == [[5.0, 4.0, 3.5], []]
    assert list(agent[0]["steps"]) == [10.0, 20.0, 30.0]

    calls.clear()
    tr = trace([float(100 - i) for i in range(100)])
    wl = workload(1, [job_plan("j1", tr, cost=1.0), job_plan("j2", tr, cost=2.0)])
    base = make_policy("phased")
    policy = dataclasses.replace(base, priority=cfg)
    simulate(wl, policy)
    assert calls and all(c["how"] == "curve" for c in calls)
    assert any(len(c["losses"]) > 0 for c in calls)  # the simulator hands its curves over
    assert all(c["truth"] is not None for c in calls)  # and its true points (the oracle's)
