"""``srpt``: shortest remaining work first, on each worker (specon's own rule).

Rule: order the worker's jobs by the CPU-seconds they still need, ascending, and give the
first all the CPU it can use (near-strict weights). Remaining work is the steps left (the
declared total minus the steps done; where a job declared no total, the steps the loss
curve predicts, Optimus's fit) times the job's own measured CPU per step (the median of
its neighbours' before its first step). Jobs whose remaining work is unknown come last,
least attained service first among them (Tiresias's rule, which needs no knowledge).

Shortest-remaining-processing-time is optimal for mean flow time on one preemptive
machine (Schrage 1968); on a cluster without migration it is the per-node version.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from specon.model import ContainerId
from specon.policy.plugin import Rule
from specon.policy.priority.base import RATIO_DOC, JobProgress, least_first, ranked_weights, ratio_problems


@dataclass(frozen=True, slots=True)
class Args:
    ratio: float = field(default=100.0, metadata={"doc": RATIO_DOC})


def problems(args: Args) -> list[str]:
    return ratio_problems(args.ratio)


def remaining_work(jobs: Sequence[JobProgress]) -> dict[ContainerId, float | None]:
    """CPU-seconds each job still needs (None: unknown)."""
    costs = [c for j in jobs if (c := j.cpu_per_step) is not None]
    typical = statistics.median(costs) if costs else None
    out: dict[ContainerId, float | None] = {}
    for j in jobs:
        left = j.steps_left
        cost = j.cpu_per_step or typical
        out[j.id] = None if left is None else left * cost if cost is not None else left
    return out


def order(jobs: Sequence[JobProgress]) -> list[ContainerId]:
    return least_first(jobs, remaining_work(jobs))


def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
    return ranked_weights(order(jobs), args.ratio)


RULE = Rule(
    name="srpt",
    summary="least remaining work first",
    doc="srpt: shortest remaining work (declared or predicted steps x CPU per step) first",
    args=Args,
    problems=problems,
    weights=weights,
    rank=20,
)
