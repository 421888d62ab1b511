"""What the simulated agents report of a job to the manager (``specon.sim.runner``): its phase
as a heartbeat words it, and its container report, sent only when it changed."""

from __future__ import annotations

import math

from specon.coordinator.state import WORK_RESOLUTION
from specon.model import Category, ContainerId, Resources
from specon.sim import gpu_placement
from specon.sim.cluster import Phase, SimJob
from specon.wire.protocol import ContainerReport
from specon.wire.status import Phase as ReportPhase

REPORTED: dict[Phase, ReportPhase] = {
    Phase.WAITING: "stopped",
    Phase.RUNNING: "running",
    Phase.MOVING: "stopped",
    Phase.DONE: "finished",
    Phase.LOST: "stopped",  # never said: its agent died with it
}

# What the manager sees of a job; a report travels only when it changes (the remaining
# work as its agent estimates it, in steps of the manager's ``WORK_RESOLUTION``).
Seen = tuple[ReportPhase, Category, float | None, bool, bool, float | None]


def report_of(job: SimJob, seen: Seen) -> ContainerReport:
    phase, category, t_cc, migrated, pending, remaining = seen
    plan = job.plan
    return ContainerReport(
        id=ContainerId(job.id),
        category=category,
        phase=phase,
        t_cc=t_cc,
        migrated=migrated,
        pending_request=pending,
        remaining_work=remaining,
        # A GPU job's request, as its pod or recipe gives it (a CPU job's: none).
        requests=gpu_placement.requests(plan) if plan.gpu else Resources(),
        selector=gpu_placement.selector(plan),
        gpu_memory=plan.gpu_memory,
    )


def quantised(work: float | None) -> float | None:
    """``work`` rounded to the manager's resolution (geometric steps of WORK_RESOLUTION)."""
    if work is None or work <= 1.0:
        return None if work is None else round(work, 1)
    step = math.log1p(WORK_RESOLUTION)
    return math.exp(round(math.log(work) / step) * step)
