"""Simulated runs with the learned rule's decisions taken by an explorer, and what each
decision led to.

Every run uses the ``dl2`` policy (the default with the learned order): what differs is who
orders each worker's jobs. ``Teacher`` answers as the default's rule would (imitation's
data), ``Sampler`` draws from the network being trained (reinforcement learning) and
``Greedy`` takes its best order (validation). A decision's return is minus the mean time
its worker's jobs still took to finish, over the workload's DS average JCT: the sum of the
jobs' completion times is what average JCT adds up, so ordering to raise it is ordering
for average JCT.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specon.config import PriorityConfig
from specon.evaluation import RunResult
from specon.policy.dl2.explore import exploring
from specon.policy.dl2.features import Matrix
from specon.policy.dl2.network import Network
from specon.policy.priority.base import JobProgress
from specon.policy.priority.dl2 import greedy
from specon.policy.priority.rules import weights
from specon.sim.cluster import DEFAULT_PARAMS, SimParams, Workload
from specon.sim.dl2.objectives import Decision
from specon.sim.policies import SimPolicy
from specon.sim.runner import simulate


def _record(out: list[Decision], jobs: Sequence[JobProgress], x: Matrix, order: Sequence[int]) -> None:
    if len(jobs) > 1:  # one job: nothing to decide
        now = jobs[0].now if jobs[0].now is not None else 0.0
        out.append(Decision(x, tuple(int(i) for i in order), now, tuple(str(j.id) for j in jobs)))


@dataclass(slots=True)
class Teacher:
    """Orders as ``priority`` (the default's rule) weighs, heaviest first, ties to the
    first started; records every decision."""

    priority: PriorityConfig
    decisions: list[Decision] = field(default_factory=list)

    def decide(self, jobs: Sequence[JobProgress], x: Matrix) -> Sequence[int]:
        w = weights(jobs, self.priority)
        order = sorted(range(len(jobs)), key=lambda i: (-w[jobs[i].id], jobs[i].started, str(jobs[i].id)))
        _record(self.decisions, jobs, x, order)
        return order


@dataclass(slots=True)
class Sampler:
    """Draws an order from ``net``'s Plackett-Luce policy (Gumbel keys); with probability
    ``epsilon`` a job drawn uniformly goes first instead (epsilon-greedy, which keeps
    trying jobs the policy has stopped choosing; DL2's own epsilon step is job-aware, a fixed
    corrective action in states it knows to be poor); records every decision."""

    net: Network
    rng: np.random.Generator
    epsilon: float
    decisions: list[Decision] = field(default_factory=list)

    def decide(self, jobs: Sequence[JobProgress], x: Matrix) -> Sequence[int]:
        n = len(jobs)
        if n == 1:
            return [0]
        keys = self.net.scores(x) + self.rng.gumbel(size=n)
        order = [int(i) for i in np.argsort(-keys, kind="stable")]
        if self.rng.random() < self.epsilon:
            first = int(self.rng.integers(n))
            order.remove(first)
            order.insert(0, first)
        _record(self.decisions, jobs, x, order)
        return order


@dataclass(slots=True)
class Greedy:
    """``net``'s best order, as the daemons take it; records nothing."""

    net: Network

    def decide(self, jobs: Sequence[JobProgress], x: Matrix) -> Sequence[int]:
        return greedy(jobs, self.net.scores(x))


def run(
    workload: Workload,
    policy: SimPolicy,
    explorer: Teacher | Sampler | Greedy,
    params: SimParams = DEFAULT_PARAMS,
) -> RunResult:
    """``workload`` under ``policy`` with the rule's decisions taken by ``explorer``."""
    with exploring(explorer):
        return simulate(workload, policy, params=params)


def slowdowns(result: RunResult, ds: RunResult) -> dict[str, float]:
    """Each job's JCT over its DS JCT (an unfinished job: infinite)."""
    base = {j.id: j.jct for j in ds.jobs}
    return {
        j.id: (j.jct / b if j.jct is not None else math.inf) for j in result.jobs if (b := base.get(j.id))
    }


def returns(
    decisions: Sequence[Decision],
    result: RunResult,
    ds: RunResult,
    *,
    free: float = 1.5,
    penalty: float = 1.0,
) -> Matrix:
    """Each decision's return: minus its jobs' mean time left to finish, over DS's average
    JCT, less ``penalty`` x how far their JCTs ended beyond ``free`` times DS's (the learned
    order must not starve a job to shorten the others)."""
    assert ds.avg_jct is not None
    finish = {j.id: j.finish for j in result.jobs}
    last = max((f for f in finish.values() if f is not None), default=0.0)
    slow = slowdowns(result, ds)
    out = np.empty(len(decisions))
    for k, d in enumerate(decisions):
        left = [(f if (f := finish.get(i)) is not None else last) - d.now for i in d.ids]
        over = [max(0.0, min(slow.get(i, 1.0), 10.0) - free) for i in d.ids]
        out[k] = -float(np.mean(left)) / ds.avg_jct - penalty * float(np.mean(over))
    return out
