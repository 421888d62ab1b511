"""Draining a worker: it takes no new jobs and its jobs move off, each with a fresh checkpoint
(``specon drain``, a reclaim notice or a cordon: ``specon.coordinator.evacuation``; SPEC §6.6).
A part of ``specon.coordinator.machine.Coordinator``: the cordons are journaled, and the
reconciler (``specon.coordinator.reconcile``) opens the ``evacuated`` moves; the coordinator
gives their saves the drain's deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from specon.config import Policy
from specon.coordinator.effects import Effect, PutCordons
from specon.coordinator.evacuation import evacuations
from specon.coordinator.migration import Cordon
from specon.coordinator.state import ClusterState
from specon.model import ContainerId, WorkerId


class UnknownWorkerError(LookupError):
    """No worker of that id has been heard from."""


class Draining:
    """Cordon and uncordon workers (a mixin of ``Coordinator``)."""

    policy: Policy
    state: ClusterState
    cordons: dict[WorkerId, Cordon]
    revision: int
    _written: int
    _effects: list[Effect]

    if TYPE_CHECKING:  # the coordinator's, used here
        _log: Callable[..., None]

        def tick(self, now: float, *, rebalance: bool = True) -> bool: ...
        def _reconcile(self, now: float) -> None: ...

    def drain(self, worker: WorkerId, now: float, *, deadline: float | None = None) -> Cordon:
        """Cordon ``worker`` and move each of its jobs off with a fresh checkpoint (``evacuated``),
        outside the migration budget; ``deadline``: seconds from now by which each job is saved
        (past it, a save is cut short and the job restored from its newest complete checkpoint).
        Draining again sets the new deadline. ``UnknownWorkerError`` for a worker never heard of."""
        if worker not in self.state.workers:
            raise UnknownWorkerError(worker)
        old = self.cordons.get(worker)
        c = Cordon(worker, old.since if old else now, None if deadline is None else now + deadline)
        self._cordon(c)
        self._log("specon.manager.drain", worker=worker, deadline=c.deadline,
                  jobs=len(self.jobs_on(worker)))  # fmt: skip
        self.tick(now, rebalance=False)
        self._reconcile(now)
        return c

    def uncordon(self, worker: WorkerId, now: float) -> bool:
        """Let ``worker`` take jobs again (moves already under way go on); False if it was not
        cordoned. ``UnknownWorkerError`` for a worker never heard of."""
        if worker not in self.state.workers and worker not in self.cordons:
            raise UnknownWorkerError(worker)
        if worker not in self.cordons:
            return False
        self._cordon(Cordon(worker, now), off=True)
        self._log("specon.manager.uncordon", worker=worker)
        return True

    def _evacuate(self, now: float) -> None:
        """Drain the workers a reclaim notice or a cordon taints; let go those it no longer does."""
        todo = evacuations(self.state.workers.values(), self.cordons, self.policy.recovery, now)
        for c in todo.put:
            self._cordon(c)
            self._log("specon.manager.evacuate", worker=c.worker, taint=c.taint, deadline=c.deadline,
                      jobs=len(self.jobs_on(c.worker)))  # fmt: skip
        for worker in todo.lift:
            self._cordon(Cordon(worker, now), off=True)
            self._log("specon.manager.evacuate_lifted", worker=worker)

    def _forget_notice(self, worker: WorkerId, now: float) -> None:
        """A forgotten worker's cordon that a notice put goes with it (a reclaimed node is
        deleted: no heartbeat will ever show the taint gone); an operator's drain stays."""
        c = self.cordons.get(worker)
        if c is not None and c.taint is not None:
            self._cordon(Cordon(worker, now), off=True)
            self._log("specon.manager.evacuate_lifted", worker=worker)

    def _cordon(self, c: Cordon, *, off: bool = False) -> None:
        if off:
            self.cordons.pop(c.worker, None)
        else:
            self.cordons[c.worker] = c
        self.state.cordon(c.worker, not off)
        self.revision += 1
        self._written += 1
        self._effects.append(PutCordons(self._written, tuple(self.cordons.values())))

    def jobs_on(self, worker: WorkerId) -> list[ContainerId]:
        """The jobs heartbeats list running on ``worker``."""
        w = self.state.workers.get(worker)
        return sorted(c for c in (w.reported if w else ()) if self.state.running_on(c) == worker)
