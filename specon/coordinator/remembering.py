"""The cluster's quality memory in the coordinator: each finished job's quality point, as its
agent measured it (``ContainerReport.quality_share``), remembered per model and journaled;
each model's median sent back to the agents that do not hold it yet
(``CommandBatch.quality``; ``specon.policy.quality_memory``). A part of
``specon.coordinator.machine.Coordinator``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from specon.coordinator.effects import Effect, PutQuality
from specon.policy.quality_memory import QualityMemory
from specon.wire.protocol import ContainerReport, QualityPoint


class Remembering:
    """Finished jobs' quality points in, each model's median out (a mixin of ``Coordinator``)."""

    quality: QualityMemory
    _points: tuple[QualityPoint, ...] = ()  # each model's median, built when first sent
    _written: int
    _effects: list[Effect]

    if TYPE_CHECKING:  # the coordinator's, used here
        _log: Callable[..., None]

    def _remember(self, rep: ContainerReport) -> None:
        """Count ``rep``'s job if it finished with a measured quality point (once per job)."""
        model = rep.job.get("model")
        if rep.phase != "finished" or rep.quality_share is None or not model:
            return
        got = self.quality.finished(model, rep.id, rep.quality_share)
        if got is None:
            return
        self.quality = got
        self._points = ()  # rebuilt when next sent
        self._written += 1
        self._effects.append(PutQuality(self._written, got))
        self._log("specon.manager.quality_point", container=rep.id, model=model, share=rep.quality_share,
                  median=got.shares()[model], version=got.version)  # fmt: skip

    def quality_for(self, held: int | None) -> tuple[int | None, tuple[QualityPoint, ...]]:
        """``(version, points)`` for an agent holding version ``held``: ``(None, ())`` when it
        holds the current one or there is nothing to send."""
        if self.quality.version in (0, held):
            return None, ()
        if not self._points:
            self._points = tuple(QualityPoint(m, s) for m, s in sorted(self.quality.shares().items()))
        return self.quality.version, self._points
