"""What a command's result does to its migration: a save's checkpoint recorded, a start's
copy running, a refusal retried, a finished job's move ended. A part of
``specon.coordinator.machine.Coordinator``, whose ``heartbeat`` and ``reports`` apply the
results an agent sends; each result is applied once (its command leaves the outbox).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from specon.coordinator.migration import FINISHED_DURING, Mark, Migration, State, save_lost_steps
from specon.coordinator.outbox import Outbox
from specon.coordinator.reconcile import Reconciler
from specon.model import ContainerId, WorkerId
from specon.wire.protocol import Action, CommandResult


class CommandResults:
    """Apply the agents' command results (a mixin of ``Coordinator``)."""

    commands: Outbox
    migrations: dict[str, Migration]
    marks: dict[ContainerId, Mark]
    refusals: dict[str, int]
    reconciler: Reconciler

    if TYPE_CHECKING:  # the coordinator's, used here
        _log: Callable[..., None]

        def record(self, m: Migration) -> None: ...
        def _put_mark(self, new: Mark) -> None: ...
        def _advance(self, m: Migration, state: State, now: float, *, error: str | None = None) -> None: ...
        def _finished(self, m: Migration, result: str, now: float) -> None: ...

    def result(self, worker: WorkerId, res: CommandResult, at: float) -> None:
        """Apply one command result (repeats and results for finished work are ignored)."""
        cmd = self.commands.pop(worker, res.command)
        if cmd is None:
            return  # a repeat of a result already applied
        if cmd.action is Action.MARK_MIGRATED or cmd.migration is None:
            return
        m = self.migrations.get(cmd.migration)
        if m is None:
            return
        rollback = cmd.rollback  # the command as we queued it, not the id the agent echoed
        if cmd.action is Action.START and not res.ok and res.detail.get("finished"):
            # The runtime says the job has completed (e.g. during a save cut short): there is
            # nothing to start, and retrying would hold the budget for ever.
            mk = self.marks.get(m.container) or Mark(m.container)
            if not mk.finished:
                self._put_mark(replace(mk, finished=True))  # nothing for the reconciler to restart
            if m.state is not State.FAILED:
                self._advance(m, State.FAILED, at, error=FINISHED_DURING)
            self._advance(self.migrations[m.id], State.ROLLED_BACK, at)
            return
        if not res.ok:
            self._log("specon.manager.command_failed", level="warning", command=res.command, worker=worker,
                      error=res.error)  # fmt: skip
            if (refunded := self.reconciler.refund(m, res.detail, self.marks)) is not None:
                self._put_mark(refunded)
            if not rollback and m.state in (State.SAVING, State.RESTORING):
                self.record(new := m.to(State.FAILED, at=at, error=res.error, attempts=m.attempts + 1))
                self.migrations[m.id] = new
            elif rollback and m.state is State.FAILED:
                # E.g. refused because a copy still runs somewhere: retry later, fresh id.
                self.refusals[m.id] = self.refusals.get(m.id, 0) + 1
                self.record(new := replace(m, attempts=m.attempts + 1, updated_at=at))
                self.migrations[m.id] = new
            return
        if cmd.action is Action.SAVE and m.state is State.SAVING and res.detail.get("finished"):
            # The job completed meanwhile: nothing to move (the heartbeats may not say so yet).
            self._advance(m, State.FAILED, at, error=FINISHED_DURING)
            return
        if cmd.action is Action.SAVE and m.state is State.SAVING:
            # The job stopped training at the SIGTERM, before the checkpoint was written.
            began = res.detail.get("began_at")
            stopped = at - (res.finished_at - began) if isinstance(began, float) and res.finished_at else at
            lost = save_lost_steps(res)
            new = m.to(State.SAVED, at=at, checkpoint=res.checkpoint, checkpoint_step=res.checkpoint_step,
                       stopped_at=stopped, lost_steps=lost)  # fmt: skip
            self.record(new)
            self.migrations[m.id] = new
        elif cmd.action is Action.SAVE and m.state is State.FAILED:
            # A save that outlived its migration stopped the job: it restarts from this checkpoint,
            # at once (restarts refused while it saved were no news of this one).
            self.record(new := replace(m, checkpoint=res.checkpoint, checkpoint_step=res.checkpoint_step))
            self.migrations[m.id] = new
            self.refusals.pop(m.id, None)
        elif cmd.action is Action.START and not rollback and m.state is State.RESTORING:
            self.record(new := m.to(State.RUNNING, at=at, started_at=at))
            self.migrations[m.id] = new
        elif cmd.action is Action.START and rollback and m.state is State.FAILED:
            self.record(new := m.to(State.ROLLED_BACK, at=at, started_at=at))
            self._finished(new, "rolled_back", at)
