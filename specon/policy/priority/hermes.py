"""``hermes``: fast-converging jobs first (Hermes, Electronics 2021).

Paper: a node scheduler time-shares each GPU among its jobs in quanta (10 s, growing at
loss milestones); every quantum it runs the job with the largest recent convergence
C_j = (loss of its previous quantum - loss of this one) / samples, the loss of a quantum
being the midpoint of its min and max; a job never run yet is scored by the range of its
first quantum; the others are suspended (checkpointed) until picked.

Ours: the convergence is Algorithm 1's normalised improvement over the last interval Δ
(``gain``), already smoothed by the classifier; a job not yet classified ranks first (the
paper runs new jobs to learn their rate). Instead of suspending, the order becomes
near-strict CPU weights, so a low-ranked job still uses what its betters leave idle and
nothing is checkpointed; the quantum is the agent's tick.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specon.model import ContainerId
from specon.policy.plugin import Rule
from specon.policy.priority.base import JobProgress, fifo_key, ranked_weights, ratio_problems


@dataclass(frozen=True, slots=True)
class Args:
    ratio: float = field(default=100.0, metadata={"doc": "weight of one rank over the next"})


def problems(args: Args) -> list[str]:
    return ratio_problems(args.ratio)


def order(jobs: Sequence[JobProgress]) -> list[ContainerId]:
    def key(j: JobProgress) -> tuple[float, tuple[float, str]]:
        return (-math.inf if j.gain is None else -j.gain), fifo_key(j)

    return [j.id for j in sorted(jobs, key=key)]


def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
    return ranked_weights(order(jobs), args.ratio)


RULE = Rule(
    name="hermes",
    summary="fastest-converging first",
    doc="hermes: the fastest-converging job first (Hermes, Electronics 2021)",
    args=Args,
    problems=problems,
    weights=weights,
    needs_gain=True,
    rank=50,
)
