"""``slaq``: CPU to the jobs that improve their loss the most (SLAQ, SoCC '17).

Paper: every scheduling epoch SLAQ predicts each job's normalised loss reduction from its
loss curve (an online fit) and hands out the cluster's cores one at a time, each to the
job whose predicted reduction grows the most with one more core; quality over the
whole cluster rises fastest, and jobs near convergence get little.

Ours: the predicted reduction is Algorithm 1's normalised improvement over the last
interval (``gain``; the recent rate stands in for the fit's next-epoch prediction), and
the cores of one worker are shared by CPU weights proportional to it (the greedy
hand-out in the limit of small units with reductions linear in the share); a job not yet
classified gets the full weight, a job with no improvement ``floor`` of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specon.model import ContainerId
from specon.policy.plugin import Rule
from specon.policy.priority.base import JobProgress, proportional_weights


@dataclass(frozen=True, slots=True)
class Args:
    # A job improving nothing still keeps this share of the top weight (never starved).
    floor: float = field(default=0.01, metadata={"doc": "share of the top weight every job keeps, in (0, 1]"})


def problems(args: Args) -> list[str]:
    return [] if 0 < args.floor <= 1 else [f"floor: must be in (0, 1], got {args.floor}"]


def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
    known = [j.gain for j in jobs if j.gain is not None]
    top = max([*known, 0.0])
    if top <= 0:  # nothing known yet, or nothing improves: share evenly
        return proportional_weights(dict.fromkeys((j.id for j in jobs), 1.0))
    least = args.floor * top
    return proportional_weights({j.id: max(least, j.gain if j.gain is not None else top) for j in jobs})


RULE = Rule(
    name="slaq",
    summary="weights by recent loss improvement",
    doc="slaq: weights proportional to the recent loss improvement (SLAQ, SoCC '17)",
    args=Args,
    problems=problems,
    weights=weights,
    needs_gain=True,
    rank=60,
)
