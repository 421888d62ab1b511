"""``optimus``: shares by marginal gain in remaining time (Optimus, EuroSys '18).

Paper: Optimus fits each job's loss curve online, l = 1/(β0·k + β1) + β2 (non-negative
least squares), to predict the steps left to convergence, and models a job's speed as a
function of its parameter servers and workers; it then hands out resources one unit at a
time, each to the job whose estimated remaining time falls the most per unit
(marginal gain), until none is left or no job gains.

Ours: one resource, the worker's CPU. With a job's speed proportional to its share s,
remaining time is W/s for remaining work W, and the gain of a small extra share is W/s²;
handing out small units greedily equalises W/s², so shares end proportional to √W. The
weights are (remaining CPU-seconds) ** ``exponent`` (0.5); remaining work is the declared steps left, else
the curve fit's prediction, times the measured CPU per step (``srpt.remaining_work``); a
job with no estimate yet gets the mean weight of those with one. Note that this favours
long jobs, as the paper's rule does for jobs far from convergence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specon.model import ContainerId
from specon.policy.plugin import Rule
from specon.policy.priority.base import JobProgress, proportional_weights
from specon.policy.priority.srpt import remaining_work


@dataclass(frozen=True, slots=True)
class Args:
    # 0.5 is the greedy marginal-gain hand-out when a job's speed is linear in its share
    # (see above).
    exponent: float = field(
        default=0.5,
        metadata={"doc": "shares proportional to remaining work ** exponent (0.5: the paper's greedy)"},
    )


def problems(args: Args) -> list[str]:
    ok = math.isfinite(args.exponent) and 0 <= args.exponent <= 2
    return [] if ok else [f"exponent: must be in [0, 2], got {args.exponent}"]


def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
    roots = {cid: w**args.exponent for cid, w in remaining_work(jobs).items() if w is not None}
    mean = sum(roots.values()) / len(roots) if roots else 1.0
    return proportional_weights({j.id: roots.get(j.id, mean) for j in jobs})


RULE = Rule(
    name="optimus",
    summary="shares by remaining work",
    doc="optimus: shares by marginal gain in remaining time (Optimus, EuroSys '18)",
    args=Args,
    problems=problems,
    weights=weights,
    rank=30,
)
