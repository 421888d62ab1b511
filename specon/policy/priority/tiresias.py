"""``tiresias``: discretized least attained service (Tiresias, NSDI '19), needing no
knowledge of a job's size.

Paper: jobs sit in K priority queues by the GPU-time they have attained (the number of
GPUs times the time run, "2D-LAS"); a job crossing a queue's threshold is demoted to the
next; queues are served in order and FIFO within a queue; a job that has waited longer
than a multiple of its run time is promoted back to the first queue (starvation guard).

Ours: the attained service is the CPU-seconds a job has used (one resource, so 1D); the
thresholds are CPU-seconds; the queues become near-strict CPU weights on the worker
rather than whole-job preemption, so a demoted job still gets the CPU its betters leave
idle; no promotion (a weighted job never starves outright: its weight is never 0).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specon.model import ContainerId
from specon.policy.plugin import Rule
from specon.policy.priority.base import JobProgress, fifo_key, ranked_weights, ratio_problems


@dataclass(frozen=True, slots=True)
class Args:
    # K thresholds make K + 1 queues. 100 CPU-s: about half the mean job of the paper
    # scenarios (A1-A5, 190-250 CPU-s).
    thresholds: tuple[float, ...] = field(
        default=(100.0,), metadata={"doc": "queue thresholds in attained CPU-seconds, ascending"}
    )
    ratio: float = field(default=100.0, metadata={"doc": "weight of one queue rank over the next"})


def problems(args: Args) -> list[str]:
    out = []
    t = args.thresholds
    if not t:
        out.append("thresholds: needs at least one threshold")
    if any(not (math.isfinite(x) and x > 0) for x in t):
        out.append(f"thresholds: every threshold must be > 0, got {list(t)}")
    if any(a >= b for a, b in itertools.pairwise(t)):
        out.append(f"thresholds: must be strictly ascending, got {list(t)}")
    out.extend(ratio_problems(args.ratio))
    return out


def order(jobs: Sequence[JobProgress], args: Args) -> list[ContainerId]:
    def key(j: JobProgress) -> tuple[int, tuple[float, str]]:
        return bisect.bisect_right(args.thresholds, j.cpu_seconds), fifo_key(j)

    return [j.id for j in sorted(jobs, key=key)]


def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
    return ranked_weights(order(jobs, args), args.ratio)


RULE = Rule(
    name="tiresias",
    summary="least attained CPU first",
    doc="tiresias: discretized least attained service (Tiresias, NSDI '19)",
    args=Args,
    problems=problems,
    weights=weights,
    rank=40,
)
