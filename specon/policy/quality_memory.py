"""The cluster's memory of where jobs reach quality, per model: what the ``memory`` quality-point
estimate recalls (``specon.policy.quality_point``).

Each job that finishes is measured by its agent over the curve it logged (the share of its
steps at which it made 95 % of its loss reduction: ``quality_point.finished_share``) and
reported to the manager (``ContainerReport.quality_share``). The manager keeps, per model, the
newest ``PER_MODEL`` of them and sends every agent the median of each (``CommandBatch.quality``);
the simulator keeps the same memory for its agents. One model's jobs on a whole cluster are
what makes the median worth having: a worker alone sees few finish (docs/priority.md).

A job counts once, whatever the number of heartbeats that report it finished and whichever
manager hears them (the entries name the job and are journaled); the memory holds at most
``MODELS`` models, the least recently finished forgotten first. Pure: values in, values out.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Finished jobs remembered per model (the newest): a model's runs differ by seed and data.
PER_MODEL = 16
# Models remembered, the most recently finished kept: bounds the journal entry and the answer.
MODELS = 128


@dataclass(frozen=True, slots=True)
class QualityMemory:
    """Per model, its newest finished jobs as ``(job, share)``, oldest first; ``version`` is
    bumped by every change (an agent holding it needs nothing resent)."""

    version: int = 0
    jobs: Mapping[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)

    def finished(self, model: str, job: str, share: float) -> QualityMemory | None:
        """This memory with ``job`` of ``model`` finished at ``share`` of its steps; None
        when nothing changes (already counted, or a share outside [0, 1])."""
        if not (math.isfinite(share) and 0 <= share <= 1):
            return None
        mine = self.jobs.get(model, ())
        if any(j == job for j, _ in mine):
            return None
        jobs = {k: v for k, v in self.jobs.items() if k != model}
        jobs[model] = (*mine[-(PER_MODEL - 1) :], (job, share))  # newest last: dict order = recency
        while len(jobs) > MODELS:
            del jobs[next(iter(jobs))]
        return QualityMemory(self.version + 1, jobs)

    def shares(self) -> dict[str, float]:
        """Each model's median share: what the ``memory`` estimate recalls."""
        return {model: statistics.median(s for _, s in got) for model, got in self.jobs.items() if got}

    def to_text(self) -> str:
        return json.dumps(
            {"version": self.version, "jobs": {k: [list(e) for e in v] for k, v in self.jobs.items()}}
        )

    @staticmethod
    def from_text(text: str | None) -> QualityMemory:
        """The memory journaled as ``to_text`` (empty for none); ``ValueError`` if unreadable."""
        if text is None:
            return QualityMemory()
        try:
            raw: Any = json.loads(text)
            version = int(raw["version"])
            jobs = {
                str(model): tuple((str(j), float(s)) for j, s in entries)
                for model, entries in raw["jobs"].items()
            }
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"unreadable quality memory: {exc}") from None
        if version < 0 or any(not (0 <= s <= 1) for got in jobs.values() for _, s in got):
            raise ValueError("unreadable quality memory: a version below 0 or a share outside [0, 1]")
        return QualityMemory(version, jobs)


def recall(shares: Mapping[str, float], model: str | None) -> float | None:
    """``model``'s median share (``QualityMemory.shares``, as an agent holds them); None: none
    of its jobs finished yet, or the job names no model."""
    return None if model is None else shares.get(model)
