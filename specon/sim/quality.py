"""What a simulated job's agent knows toward its quality-point estimate
(``specon.policy.quality_point``, through the ``phased`` rule): its loss curve so far, where
the rule reads it; its model's finished jobs on the cluster, as the manager gathers them from
the agents and sends them back (``specon.policy.quality_memory``); and its true point, the
``oracle`` yardstick's."""

from __future__ import annotations

import math
from typing import NamedTuple

from specon.policy import quality_memory
from specon.policy.priority.rules import Settings
from specon.sim.cluster import SimJob


class Known(NamedTuple):
    steps: list[float]
    losses: list[float]
    truth: float
    recalled: float | None


class QualityInputs:
    """One run's inputs to the estimate, per the policy's ``quality_point`` knob."""

    def __init__(self, priority: Settings, *, declared: bool = True) -> None:
        how = getattr(getattr(priority, priority.rule, None), "quality_point", "share")
        # An agent measures only a job of declared steps that trained on its worker from its start.
        self.remembers = how == "memory" and declared
        self.curves = how in {"curve", "memory"}  # memory: the curve until a job of its model finished
        self.memory = quality_memory.QualityMemory()
        self._shares: dict[str, float] = {}

    def finished(self, job: SimJob) -> None:
        """``job`` completed: its agent measures its quality point and the manager remembers it,
        unless it moved (no agent saw its whole curve)."""
        if not self.remembers or job.moves or job.worker is None:
            return
        # What its agent measures over its whole curve is its trace's true point
        # (``quality_point.finished_share``: tests/unit/policy/test_quality_point.py).
        got = self.memory.finished(job.plan.model, job.id, job.data.quality_at, job.worker)
        if got is not None:
            self.memory, self._shares = got, got.shares()

    def of(self, job: SimJob, step: float) -> Known:
        """What ``job``'s agent knows at ``step`` (its curve only where the estimate reads it:
        not once its model's point is known)."""
        steps: list[float] = []
        losses: list[float] = []
        recalled = quality_memory.recall(self._shares, job.plan.model) if self.remembers else None
        if self.curves and recalled is None:
            n = min(math.floor(step / job.log_every), len(job.data.losses))
            steps, losses = [(i + 1) * job.log_every for i in range(n)], list(job.data.losses[:n])
        return Known(steps, losses, job.data.quality_at * job.plan.steps, recalled)
