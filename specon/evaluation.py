"""How runs are scored, as the paper measures them (SPEC §8): one definition for demo and simulator.

JCT of a job = finish - submit; average JCT over all jobs; makespan = last finish -
first submit; the share of jobs whose JCT fell against the baseline, and the best
single-job reduction. Times are seconds from the run's start.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from specon.coordinator.migration import Reason


@dataclass(frozen=True, slots=True)
class JobResult:
    id: str
    model: str
    submit: float
    finish: float | None  # None: did not finish within the run
    steps: int
    steps_done: int
    # (time, worker) at the start and at every move, oldest first.
    worker_history: tuple[tuple[float, str], ...] = ()
    # When it reached 95 % of its final loss reduction (None: not known or not reached).
    quality_time: float | None = None

    @property
    def jct(self) -> float | None:
        return None if self.finish is None else self.finish - self.submit

    @property
    def time_to_quality(self) -> float | None:
        """Seconds from submission to 95 % of the final loss reduction (SLAQ's, Hermes's measure)."""
        return None if self.quality_time is None else self.quality_time - self.submit


@dataclass(frozen=True, slots=True)
class MigrationRecord:
    job: str
    source: str
    target: str
    reason: Reason
    t: float  # when it was decided
    downtime: float | None  # job stopped -> running again, seconds


@dataclass(frozen=True, slots=True)
class RunResult:
    jobs: tuple[JobResult, ...]
    migrations: tuple[MigrationRecord, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> tuple[JobResult, ...]:
        return tuple(j for j in self.jobs if j.finish is not None)

    @property
    def avg_jct(self) -> float | None:
        jcts = [j.jct for j in self.jobs if j.jct is not None]
        return statistics.fmean(jcts) if jcts and len(jcts) == len(self.jobs) else None

    @property
    def avg_time_to_quality(self) -> float | None:
        """Mean time-to-quality; None unless every job has one."""
        ttqs = [t for j in self.jobs if (t := j.time_to_quality) is not None]
        return statistics.fmean(ttqs) if ttqs and len(ttqs) == len(self.jobs) else None

    @property
    def makespan(self) -> float | None:
        if not self.jobs or any(j.finish is None for j in self.jobs):
            return None
        return max(j.finish for j in self.jobs if j.finish is not None) - min(j.submit for j in self.jobs)

    def to_json(self) -> dict[str, Any]:
        """The demo's RUN object: ``{"avg_jct", "makespan", "jobs": [...], "migrations": [...]}``."""
        return {
            "avg_jct": _r(self.avg_jct),
            "makespan": _r(self.makespan),
            "avg_time_to_quality": _r(self.avg_time_to_quality),
            "jobs": [
                {
                    "id": j.id,
                    "model": j.model,
                    "submit": _r(j.submit),
                    "finish": _r(j.finish),
                    "jct": _r(j.jct),
                    "time_to_quality": _r(j.time_to_quality),
                    "steps": j.steps,
                    "steps_done": j.steps_done,
                    "worker_history": [[_r(t), w] for t, w in j.worker_history],
                }
                for j in self.jobs
            ],
            "migrations": [{**asdict(m), "t": _r(m.t), "downtime": _r(m.downtime)} for m in self.migrations],
            **({"meta": dict(self.meta)} if self.meta else {}),
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """A run against its baseline on the same workload."""

    avg_jct_reduction: float | None  # fraction, positive = better
    makespan_reduction: float | None
    jobs_improved: float | None  # share of jobs whose JCT fell
    best_reduction: float | None  # the largest single-job JCT reduction (fraction)
    migrations: int
    rebalances: int
    # The largest single-job JCT over its baseline JCT (1.5 = one job took 50 % longer).
    worst_slowdown: float | None = None
    # Mean time-to-quality against the baseline's (fraction, positive = sooner).
    ttq_reduction: float | None = None


def compare(baseline: RunResult, run: RunResult) -> Comparison:
    base = {j.id: j.jct for j in baseline.jobs}
    reductions = [
        (b - j.jct) / b for j in run.jobs if j.jct is not None and (b := base.get(j.id)) is not None and b > 0
    ]
    complete = len(reductions) == len(run.jobs) and bool(reductions)
    return Comparison(
        avg_jct_reduction=_reduction(baseline.avg_jct, run.avg_jct),
        makespan_reduction=_reduction(baseline.makespan, run.makespan),
        jobs_improved=sum(r > 0 for r in reductions) / len(reductions) if complete else None,
        best_reduction=max(reductions) if reductions else None,
        migrations=sum(m.reason == "converged" for m in run.migrations),
        rebalances=sum(m.reason == "rebalance" for m in run.migrations),
        worst_slowdown=max((1 - r for r in reductions), default=None),  # JCT / baseline JCT
        ttq_reduction=_reduction(baseline.avg_time_to_quality, run.avg_time_to_quality),
    )


def _reduction(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or before <= 0:
        return None
    return (before - after) / before


def _r(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 3)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
