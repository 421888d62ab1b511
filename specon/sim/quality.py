"""What a simulated job's agent knows toward its quality-point estimate
(``specon.policy.quality_point``, through the ``phased`` rule): its loss curve so far, where
the rule reads it; its model's finished jobs on its worker, as the agent remembers them
(``specon_agent.weights``); and its true point, the ``oracle`` yardstick's."""

from __future__ import annotations

import math
from typing import NamedTuple

from specon.policy import quality_point
from specon.policy.priority.rules import Settings
from specon.sim.cluster import SimJob


class Known(NamedTuple):
    steps: list[float]
    losses: list[float]
    truth: float
    recalled: float | None


class QualityInputs:
    """One run's inputs to the estimate, per the policy's ``quality_point`` knob."""

    def __init__(self, priority: Settings) -> None:
        how = getattr(getattr(priority, priority.rule, None), "quality_point", "share")
        self.curves = how == "curve"
        self.remembers = how == "memory"
        self.memory: dict[str, dict[str, tuple[float, ...]]] = {}  # worker -> model -> shares

    def finished(self, job: SimJob) -> None:
        """``job`` completed on its worker: its agent remembers its quality point."""
        if not self.remembers or job.worker is None:
            return
        every, losses = job.log_every, job.data.losses
        share = quality_point.finished_share(
            [(i + 1) * every for i in range(len(losses))], losses, job.plan.steps
        )
        if share is not None:
            mine = self.memory.get(job.worker, {})
            self.memory[job.worker] = quality_point.remember(mine, job.plan.model, share)

    def of(self, job: SimJob, step: float) -> Known:
        """What ``job``'s agent knows at ``step``."""
        steps: list[float] = []
        losses: list[float] = []
        if self.curves:
            n = min(math.floor(step / job.log_every), len(job.data.losses))
            steps, losses = [(i + 1) * job.log_every for i in range(n)], list(job.data.losses[:n])
        mine = self.memory.get(job.worker or "", {}) if self.remembers else {}
        return Known(
            steps, losses, job.data.quality_at * job.plan.steps, quality_point.recall(mine, job.plan.model)
        )
