"""The cluster's quality memory in the coordinator: each finished job's quality point, as its
agent measured it (``ContainerReport.quality_share``), remembered per model and journaled;
each model's median sent back to the agents that hold another version
(``CommandBatch.quality``; ``specon.policy.quality_memory``). A part of
``specon.coordinator.machine.Coordinator``.

A job counts once (the journaled memory keeps the digests of the jobs it counted), and only
from the worker the manager saw it run on (its ``home`` mark). Points go out only
once the write that holds them is durable, so no agent holds a version a restarted or
failed-over manager never had.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from specon.coordinator.effects import Effect, PutQuality
from specon.coordinator.migration import Mark
from specon.model import ContainerId, WorkerId
from specon.policy.quality_memory import QualityMemory, model_ok
from specon.wire.protocol import ContainerReport, QualityPoint


class Remembering:
    """Finished jobs' quality points in, each model's median out (a mixin of ``Coordinator``)."""

    quality: QualityMemory
    marks: dict[ContainerId, Mark]
    _points: tuple[QualityPoint, ...] = ()  # each model's median, built when first sent
    _quality_seq = 0  # the journal write holding ``quality``
    _written: int
    _durable: int
    _effects: list[Effect]

    if TYPE_CHECKING:  # the coordinator's, used here
        _log: Callable[..., None]

    def _remember(self, worker: WorkerId, rep: ContainerReport) -> None:
        """Count ``rep``'s job if it finished here with a measured quality point (the agent
        measures it a tick after the job ended: the report may come after the first to say so)."""
        if rep.phase != "finished" or rep.quality_share is None:
            return
        mk, model = self.marks.get(rep.id), rep.job.get("model", "")
        if mk is None or mk.home != worker or self.quality.counted(rep.id):
            return  # never seen running here, or counted before
        if not model_ok(model):
            why = "no model, or a model name not printable or over 63 characters"
            self._log("specon.manager.quality_point_skipped", level="warning", container=rep.id,
                      worker=worker, reason=why)  # fmt: skip
            return
        got = self.quality.finished(model, rep.id, rep.quality_share, worker)
        if got is None:
            return
        self.quality, self._points = got, ()
        self._written += 1
        self._quality_seq = self._written
        self._effects.append(PutQuality(self._written, got))
        self._log("specon.manager.quality_point", container=rep.id, worker=worker, model=model,
                  share=rep.quality_share, median=got.share(model), version=got.version)  # fmt: skip

    def quality_for(self, held: int | None) -> tuple[int | None, tuple[QualityPoint, ...]]:
        """``(version, points)`` for an agent holding version ``held`` (0: none; None: an agent
        that takes none, protocol 1.6): ``(None, ())`` when there is nothing to send, or the
        memory is not durable yet."""
        version = self.quality.version
        if held is None or version in (0, held) or self._durable < self._quality_seq:
            return None, ()
        if not self._points:
            self._points = tuple(QualityPoint(m, s) for m, s in sorted(self.quality.shares().items()))
        return version, self._points
