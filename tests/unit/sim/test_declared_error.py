"""``SimParams.declared_error``: jobs declare their steps wrongly, and still train their own."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from specon.policy.dl2.explore import exploring
from specon.policy.priority.base import JobProgress
from specon.sim.cluster import DEFAULT_PARAMS, SimParams
from specon.sim.policies import make_policy
from specon.sim.runner import simulate
from specon.sim.scenarios import scenario
from specon.sim.trace import load_traces


class _Seen:
    """Records the totals the rule is told, and keeps the jobs' order."""

    def __init__(self) -> None:
        self.totals: dict[str, set[int | None]] = {}

    def decide(self, jobs: Sequence[JobProgress], x: np.ndarray) -> Sequence[int]:
        for j in jobs:
            self.totals.setdefault(str(j.id), set()).add(j.total)
        return range(len(jobs))


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan")])
def test_the_error_is_a_fraction_below_one(bad: float) -> None:
    with pytest.raises(ValueError, match="declared_error must be in"):
        SimParams(declared_error=bad)


@pytest.mark.slow
def test_agents_see_steps_off_by_the_error_while_jobs_train_their_own() -> None:
    workload = scenario("A3").workload(0, load_traces())
    truth = {p.id: p.steps for p in workload.jobs}
    policy = make_policy("dl2")
    seen: dict[float, _Seen] = {}
    for error in (0.0, 0.2):
        seen[error] = _Seen()
        params = dataclasses.replace(DEFAULT_PARAMS, declared_error=error)
        with exploring(seen[error]):
            result = simulate(workload, policy, params=params)
        assert all(j.steps_done == j.steps == truth[j.id] for j in result.jobs)
    exact, off = seen[0.0].totals, seen[0.2].totals
    assert all(totals == {truth[j]} for j, totals in exact.items())
    # One declaration per job, within 20 % of its steps, and not all exact.
    assert all(len(totals) == 1 for totals in off.values())
    ratios = [next(iter(off[j])) / truth[j] for j in off]  # type: ignore[operator]
    assert all(0.8 - 1e-3 <= r <= 1.2 + 1e-3 for r in ratios)
    assert sum(abs(r - 1) > 0.01 for r in ratios) > len(ratios) / 2
