"""``fsp``: the Fair Sojourn Protocol on each worker (Friedman & Henderson, SIGMETRICS '03).

Rule: run first the job that would finish first if the worker were shared equally
(processor sharing, what DS does). Under equal sharing every job advances at the same
rate, so that order is the order of each job's *virtual* remaining work: its total work
minus the CPU an equal share would have given it so far (``fair_seconds``). The first
gets near-strict priority (``ratio``), as in ``srpt``.

Why not plain ``srpt``: SRPT's order uses the CPU a job actually got, so a long job behind
a stream of short ones never moves up and can take many times its fair-shared time. FSP's
key falls for every job as time passes, whether it ran or not, so a starved job reaches the
front by the time equal sharing would have finished it: on one machine with known sizes no
job finishes later than under processor sharing, and the mean stays close to SRPT's.

Ours: total work is the steps done plus the steps left (declared, else the loss curve's
prediction) times the job's measured CPU per step (the worker's median before its first
step); the equal share is the worker's CPU over its running jobs, at most the job's own
limit (accumulated by the agent, or by the simulator). Migration, interference and jobs
that arrive on the worker late make the guarantee approximate, not exact. Jobs with no
size estimate come last, least attained service first among them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from specon.model import ContainerId
from specon.policy.plugin import Rule
from specon.policy.priority.base import RATIO_DOC, JobProgress, least_first, ranked_weights, ratio_problems


@dataclass(frozen=True, slots=True)
class Args:
    ratio: float = field(default=100.0, metadata={"doc": RATIO_DOC})
    # The deficit against equal sharing is the CPU a job would have had minus the CPU it got.
    aging: float = field(
        default=1.0,
        metadata={
            "doc": "share of a job's deficit against equal sharing taken off its remaining "
            "work (1: FSP, no job far behind fair sharing; 0: plain shortest remaining first)"
        },
    )


def problems(args: Args) -> list[str]:
    out = ratio_problems(args.ratio)
    if not (math.isfinite(args.aging) and 0 <= args.aging <= 1):
        out.append(f"aging: must be in [0, 1], got {args.aging}")
    return out


def virtual_remaining(jobs: Sequence[JobProgress], aging: float = 1.0) -> dict[ContainerId, float | None]:
    """Each job's work left under equal sharing, CPU-seconds (None: its size is unknown):
    its remaining work less ``aging`` times its deficit against equal sharing."""
    costs = [c for j in jobs if (c := j.cpu_per_step) is not None]
    typical = statistics.median(costs) if costs else 1.0
    out: dict[ContainerId, float | None] = {}
    for j in jobs:
        left = j.steps_left
        cost = j.cpu_per_step or typical
        deficit = j.fair_seconds - j.step * cost
        out[j.id] = None if left is None else left * cost - aging * deficit
    return out


def order(jobs: Sequence[JobProgress], aging: float = 1.0) -> list[ContainerId]:
    return least_first(jobs, virtual_remaining(jobs, aging))


def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
    return ranked_weights(order(jobs, args.aging), args.ratio)


RULE = Rule(
    name="fsp",
    summary="first to finish under equal sharing first",
    doc="fsp: the job that would finish first under equal sharing first "
    "(Fair Sojourn Protocol: SRPT's mean, no job far behind its fair-shared time)",
    args=Args,
    problems=problems,
    weights=weights,
    rank=10,
)
