"""``phased``: each job's early, steep part soon, then shortest remaining work first
(specon's own rule; Tiresias's and Hermes's aim, SRPT's mean).

Why: shortest-first (``srpt``, ``fsp``) makes a long job wait, whole, behind every shorter
one, and with it the early part of its training, where most of its loss reduction is. A
job reaches 95 % of its final loss reduction ("time-to-quality", SLAQ's and Hermes's
measure) after only 20-60 % of its steps in the recorded traces, so under equal sharing
(DS) every job gets there early, and under shortest-first the long ones get there late.

Rule: a job is a chain of two milestones, its *quality point* (the end of its early part)
and its *completion*; the job whose next milestones come cheapest runs first. With ``r1``
the work left to its quality point and ``r`` the work left in all, a job before its
quality point is keyed ``min(r1 / quality_weight, r / (1 + quality_weight))`` (the better
of reaching its quality point, worth ``quality_weight`` completions, or reaching both),
a job past it ``r``: smallest key first. This is Sidney's ratio rule for chains (on one
machine, with every job present, the order minimising the weighted sum of milestone
times), so a job's early part goes ahead of long tails of other jobs, and short jobs
still finish first.
``quality_weight`` 0 is shortest remaining first.

The quality point is not known while a job trains: ``quality_point`` names its estimate
(``specon.policy.quality_point``, the same function in the agent and the simulator), by
default the median point of its model's finished jobs on the cluster, else what its own
curve says (while it still improves, not before ``quality_share`` of its steps: done plus
left, declared, else the loss curve's prediction). As in
``fsp``, ``aging`` times the job's deficit against equal sharing is taken off its key,
so a job that fell behind its fair-shared progress moves up; and a job whose deficit
reached ``late`` times its remaining work (1: equal sharing would already have finished
it) goes ahead of every job that is not, latest first, so no job ends far behind its DS
time. Work is steps times the job's measured CPU per step (the worker's median before its
first step); jobs with no size estimate come last, least attained service first (as
``base.least_first``). The knobs' defaults were chosen by ``bench_sim`` (docs/priority.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from specon.model import ContainerId
from specon.policy import quality_point
from specon.policy.plugin import Rule
from specon.policy.priority.base import RATIO_DOC, JobProgress, fifo_key, ranked_weights, ratio_problems


@dataclass(frozen=True, slots=True)
class Args:
    ratio: float = field(default=100.0, metadata={"doc": RATIO_DOC})
    # The recorded traces reach 95 % of their loss reduction at 20-60 % of their steps; the
    # share is the estimate's floor until a job's curve or its model's finished jobs say more.
    quality_share: float = field(
        default=0.3,
        metadata={"doc": "share of a job's steps taken as its early part (its quality point), in (0, 1]"},
    )
    # bench_quality_point and bench_sim judged the estimators (docs/priority.md).
    quality_point: str = field(
        default="memory",
        metadata={
            "doc": "how a job's quality point is estimated: share (quality_share of its steps), "
            "curve (the share until its loss curve says more or less), memory (the median of "
            "its model's finished jobs on the cluster, else as curve), oracle (the simulator's "
            "true point; elsewhere share)"
        },
    )
    # With memory, 0.55 (aging 0.3, late 1, quality_share 0.3) reaches quality no later than
    # DS on A1-A5 and the example scenarios (also over 20 seeds), no job past x2 its DS JCT,
    # with the most average-JCT gain of the grid tried (weight 0.5-0.65, share 0.25-0.35,
    # aging 0.15-0.3, late 0.5-1; docs/priority.md).
    quality_weight: float = field(
        default=0.55,
        metadata={
            "doc": "worth of reaching a job's quality point, in completions "
            "(0: plain shortest remaining first; larger: early parts further ahead)"
        },
    )
    aging: float = field(
        default=0.3,
        metadata={"doc": "share of a job's deficit against equal sharing taken off its key (as fsp's)"},
    )
    # 1: FSP's point, equal sharing would have finished the job by now. With the share as the
    # estimate 0.75 kept the slowest jobs of A5 and scenario-generated.yaml under x2 (x1.87 /
    # x2.19 at 1); with memory, 1 does (aging 0.3), with more JCT gain than 0.5 or 0.75.
    late: float = field(
        default=1.0,
        metadata={
            "doc": "a job whose deficit against equal sharing reaches this share of its remaining "
            "work goes ahead of every job that is not, in (0, 1] (1: once equal sharing would "
            "have finished it)"
        },
    )


def problems(args: Args) -> list[str]:
    out = ratio_problems(args.ratio)
    if not (math.isfinite(args.quality_share) and 0 < args.quality_share <= 1):
        out.append(f"quality_share: must be in (0, 1], got {args.quality_share}")
    if args.quality_point not in quality_point.ESTIMATORS:
        known = ", ".join(quality_point.ESTIMATORS)
        out.append(f"quality_point: must be one of {known}, got {args.quality_point!r}")
    if not (math.isfinite(args.quality_weight) and args.quality_weight >= 0):
        out.append(f"quality_weight: must be >= 0, got {args.quality_weight}")
    if not (math.isfinite(args.aging) and 0 <= args.aging <= 1):
        out.append(f"aging: must be in [0, 1], got {args.aging}")
    if not (math.isfinite(args.late) and 0 < args.late <= 1):
        out.append(f"late: must be in (0, 1], got {args.late}")
    return out


def milestone_key(done: float, left: float, early: float, args: Args) -> float:
    """CPU-seconds per milestone to the job's next milestones (module doc), before aging:
    ``done`` and ``left`` are its work done and left, ``early`` the work of its early part."""
    r1 = early - done
    if r1 <= 0 or args.quality_weight <= 0:
        return left
    return min(r1 / args.quality_weight, left / (1 + args.quality_weight))


def keys(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, tuple[bool, float] | None]:
    """Each job's key (None: its size is unknown), smallest first: whether it is on time
    against equal sharing (``late``), then its aged milestone key in CPU-seconds (late jobs:
    their remaining work less their whole deficit)."""
    costs = [c for j in jobs if (c := j.cpu_per_step) is not None]
    typical = statistics.median(costs) if costs else 1.0
    out: dict[ContainerId, tuple[bool, float] | None] = {}
    for j in jobs:
        left = j.steps_left
        cost = j.cpu_per_step or typical
        if left is None:
            out[j.id] = None
            continue
        done = j.step * cost
        deficit = j.fair_seconds - done
        late = left * cost - deficit  # negative: equal sharing would have finished it
        if deficit >= args.late * left * cost:
            out[j.id] = (False, late)
            continue
        early = cost * quality_point.estimate(
            args.quality_point,
            step=j.step,
            total=j.step + left,
            share=args.quality_share,
            steps=j.loss_steps,
            losses=j.losses,
            truth=j.quality_truth,
            recalled=j.quality_memory,
        )
        out[j.id] = (True, milestone_key(done, left * cost, early, args) - args.aging * deficit)
    return out


def order(jobs: Sequence[JobProgress], args: Args) -> list[ContainerId]:
    """Known sizes by key; unknown ones last, least attained service first (``least_first``)."""
    k = keys(jobs, args)

    def key(j: JobProgress) -> tuple[int, tuple[bool, float], tuple[float, str]]:
        mine = k[j.id]
        return (0, mine, fifo_key(j)) if mine is not None else (1, (True, j.cpu_seconds), fifo_key(j))

    return [j.id for j in sorted(jobs, key=key)]


def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
    return ranked_weights(order(jobs, args), args.ratio)


RULE = Rule(
    name="phased",
    summary="early part of each job first, then least remaining work",
    doc="phased: each job's early, steep part soon, then shortest remaining work first "
    "(milestone ratio rule with fsp's aging)",
    args=Args,
    problems=problems,
    weights=weights,
    rank=15,
)
