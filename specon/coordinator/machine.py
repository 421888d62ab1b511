"""The manager's control logic as a sans-I/O state machine, shared with the simulator.

Inputs, each with the time passed in: a heartbeat (or the simulator's lower-level
``reports``), a reallocation request, a command result (riding on a heartbeat), a tick,
a goodbye. Outputs: effects (``specon.coordinator.effects``) the caller performs — journal writes,
commands for agents, metric and log events — and the command batch for a worker.

Each pass (``tick``) takes the cluster view, answers pending reallocation requests
within the migration budget (Algorithm 2), starts rebalancing moves when the trigger
holds (Algorithm 3), and drives every journaled migration one step further with
``specon.coordinator.migration.next_step``. Commands for an agent wait in its outbox until a
result says they ran; each is idempotent on the agent, so repeats are harmless.

Dry-run (``migration.dry_run``): decisions are taken, journaled and reported as in a live
run where a move begins (``_begin``), but no save or start is ever sent. The coordinator reads
no clock: inputs carry their time; a decision pass is timed by its shell's ``timer``.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Literal

from specon.config import Policy
from specon.coordinator.command_results import CommandResults
from specon.coordinator.deadlines import deadline_passed, fenced_side, parked, retry_due, save_may_stop
from specon.coordinator.deciding import Ask, Deciding, answer
from specon.coordinator.draining import Draining
from specon.coordinator.effects import (
    CommandQueued,
    Effect,
    Event,
    Log,
    PutMark,
    PutMigration,
    Recovered,
)
from specon.coordinator.migration import (
    Advance,
    Cordon,
    IssueSave,
    IssueStart,
    Mark,
    Migration,
    State,
    Wait,
    learn_cost,
    next_step,
    why_failed,
)
from specon.coordinator.outbox import Outbox, migration_command
from specon.coordinator.reconcile import Reconciler, Skip
from specon.coordinator.remembering import Remembering
from specon.coordinator.retention import expired
from specon.coordinator.state import UNMARKED, ClusterState
from specon.model import ClusterSnapshot, ContainerId, WorkerId
from specon.policy.placement import ClusterIndex
from specon.policy.scheduler import learner_of
from specon.wire.protocol import (
    Action,
    Command,
    CommandBatch,
    CommandResult,
    ContainerReport,
    Heartbeat,
    ReallocationRequest,
)

# Finished migrations the status keeps in memory (the journal keeps them all).
RECENT_MIGRATIONS = 1000


class NotHostedError(ValueError):
    """A worker asked about a container it does not run."""


class Coordinator(Deciding, Draining, Remembering, CommandResults):
    def __init__(
        self,
        *,
        policy: Policy,
        now: float,
        recovered: Recovered | None = None,
        state: ClusterState | None = None,
        timer: Callable[[], float] | None = None,
    ) -> None:
        recovered = recovered or Recovered()
        self.policy = policy
        self.state = state or ClusterState()
        # Times a decision pass for the ``decision_pass`` event (the shell's ``perf_counter``);
        # without one the event says 0.
        self.timer: Callable[[], float] = timer or (lambda: 0.0)
        self.generation = 1
        # Reallocation requests waiting for a decision: container -> first seen.
        self.requests: dict[ContainerId, float] = {}
        self.commands = Outbox()
        self.marks: dict[ContainerId, Mark] = {m.container: m for m in recovered.marks}
        self.migrations: dict[str, Migration] = {m.id: m for m in recovered.in_flight}
        # The newest finished migrations, oldest first, for the status (never the whole journal).
        self.recent: deque[Migration] = deque(
            sorted(recovered.finished, key=lambda m: m.updated_at)[-RECENT_MIGRATIONS:],
            maxlen=RECENT_MIGRATIONS,
        )
        self._pruned_at = now
        # Bumped by every change a status reader could see (cached pages compare it).
        self.revision = 0
        # A restarted manager has heard from nobody yet: until every worker had a
        # worker_timeout to report, silence is not evidence that it is gone.
        self.started_at = now
        self.restarted = recovered.restarted
        # Refused restarts per migration, for the retry backoff and the rollback's home (read
        # by the admission webhook too); not journaled: a restarted manager retries at once.
        self.refusals: dict[str, int] = {}
        self._ids = itertools.count(1)
        # Requests counted as deferred (once each, not once per pass).
        self._deferred: set[ContainerId] = set()
        # Dry-run only: where decided moves would have put containers, so the next
        # decisions see the loads a live run would see.
        self.virtual: dict[ContainerId, WorkerId] = {}
        # Write-ahead: journal writes are numbered; a command waits for the writes made
        # before it to be durable (``journaled``).
        self._written = 0
        self._durable = 0
        self._effects: list[Effect] = []
        # When each request was last answered (decided, refused, dropped): asked again within
        # ``_quiet`` seconds it waits for the ticker instead of buying a pass of its own.
        self._answered: dict[ContainerId, float] = {}
        self._quiet = policy.messaging.heartbeat_interval
        # Failed migrations whose workers are all silent: they no longer hold the budget.
        self._parked: set[str] = set()
        # Bumped whenever a migration claims budget (``Deciding._stale``).
        self.claims = 0
        self.move_costs = learner_of(policy)  # what moves cost, learned (the policy's as the prior)
        self.reconciler = Reconciler(policy, self.marks)
        # Jobs whose ``home`` or ``finished`` mark changed since the last ticker pass journaled them.
        self._placed: set[ContainerId] = set()
        # Workers being drained (journaled): no new jobs, and their jobs move off.
        self.cordons: dict[WorkerId, Cordon] = {c.worker: c for c in recovered.cordons}
        for w in self.cordons:
            self.state.cordon(w, True)
        self.quality = recovered.quality  # finished jobs' quality points (``Remembering``)
        if self.migrations:
            self._log("specon.manager.recovered", in_flight=len(self.migrations), ids=sorted(self.migrations))

    # -- effects -------------------------------------------------------------------------
    def take_effects(self) -> list[Effect]:
        """The effects left by the inputs since the last call, in the order they arose."""
        out, self._effects = self._effects, []
        return out

    def journaled(self, seq: int) -> None:
        """Journal writes up to number ``seq`` are durable: commands after them may go."""
        self._durable = max(self._durable, seq)

    def _log(self, event: str, *, level: Literal["info", "warning"] = "info", **fields: object) -> None:
        self._effects.append(Log(event, fields, level))

    def emit(self, event: Event) -> None:
        self._effects.append(event)

    # -- inputs ------------------------------------------------------------------------
    def heartbeat(self, hb: Heartbeat, now: float) -> int | None:
        """Apply one heartbeat; the ``ack`` for its reply (None: stale, nothing applied)."""
        if not self.state.ingest(hb, now):
            return None
        # A result's time on the manager clock: the agent's, shifted by this heartbeat's skew.
        self._ingested(hb.worker, hb.containers, hb.results, now, skew=now - hb.sent_at)
        # Only an applied heartbeat's results may be forgotten by the agent.
        return hb.seq

    def reports(
        self,
        worker: WorkerId,
        now: float,
        *,
        containers: Iterable[ContainerReport] = (),
        results: Iterable[CommandResult] = (),
        usage: float | None = None,
        step: bool = True,
    ) -> None:
        """The lower-level heartbeat: what changed on a known worker (the simulator's agents
        report changes only; a container not listed stays as it was). ``step=False``
        leaves the pass to the caller (the simulator batches many workers' reports)."""
        listed = tuple(containers)
        self.state.ingest_reports(worker, listed, now, usage=usage)
        self._ingested(worker, listed, tuple(results), now, skew=0.0, step=step)

    def _ingested(
        self,
        worker: WorkerId,
        containers: Iterable[ContainerReport],
        results: Iterable[CommandResult],
        now: float,
        *,
        skew: float,
        step: bool = True,
    ) -> None:
        self.revision += 1
        in_flight = len(self.migrations)
        for res in results:
            self.result(worker, res, now if res.finished_at is None else res.finished_at + skew)
        fresh = False
        for rep in containers:
            if rep.phase in {"running", "finished"}:
                if rep.quality_share is not None:  # a finished job's, measured
                    self._remember(worker, rep)
                self._note_place(rep.id, worker, now)
            if rep.pending_request and rep.phase == "running" and rep.id not in self.requests:
                self.requests[rep.id] = now
                # Asked again right after an answer (the agent has not applied it yet): no news.
                fresh = fresh or now - self._answered.get(rep.id, -math.inf) >= self._quiet
        if not step:
            return
        if not fresh:
            # A heartbeat with nothing new to decide drives migrations only: requests already
            # waiting are decided by the next tick (every second), not by every heartbeat:
            # 1,000 agents must not buy 1,000 decision passes a second. A migration that
            # ended frees budget: that is news for the waiting requests.
            self.drive(now)
            fresh = bool(self.requests) and len(self.migrations) < in_flight
        if fresh:
            self.tick(now, rebalance=False)

    def request(self, req: ReallocationRequest, now: float, *, step: bool = True) -> None:
        """Queue ``req`` for Algorithm 2; ``NotHostedError`` unless the container runs on the
        worker that asks (a worker may only ask to move its own containers). ``step=False``
        leaves the pass to the caller (the simulator answers a tick's requests together)."""
        if self.state.running_on(req.container) != req.worker:
            raise NotHostedError(f"container {req.container} is not running on worker {req.worker}")
        self.requests.setdefault(req.container, now)
        if step:
            self.tick(now, rebalance=False)

    def goodbye(self, worker: WorkerId, now: float) -> None:
        self.state.goodbye(worker)
        self.revision += 1
        self.tick(now, rebalance=False)

    # -- outputs -------------------------------------------------------------------------
    def batch_for(
        self, worker: WorkerId, now: float, *, ack: int | None = None, quality_held: int | None = None
    ) -> CommandBatch:
        """Its commands whose journal writes are durable (counted as sent); quality points if due."""
        ready = self.commands.deliver(worker, self._durable)
        version, points = self.quality_for(quality_held) if ack is not None else (None, ())
        return CommandBatch(now, self.generation, ready, ack, quality_version=version, quality=points)

    def has_unsent(self, worker: WorkerId) -> bool:
        """``worker`` has a deliverable command no reply or poll carried yet (wakes a long poll)."""
        return self.commands.has_unsent(worker, self._durable)

    @property
    def outbox(self) -> dict[WorkerId, dict[str, Command]]:
        """Each worker's queued commands by id (read-only by convention)."""
        return self.commands.boxes

    # -- the loop ----------------------------------------------------------------------
    def tick(self, now: float, *, rebalance: bool = True) -> bool:
        """One pass: drive migrations, answer requests and, if asked, consider Algorithm 3;
        True if it decided something (the simulator runs passes until one decides nothing).

        Inputs call it without ``rebalance`` (cheap: nothing is built unless a request
        waits); the manager's 1 s ticker calls it with ``rebalance=True``, which catches
        job completions within a second as well (``prepare``, ``answer`` in a thread,
        ``settle``: the same pass with its costly part off the event loop).
        """
        ask = self.prepare(now, rebalance=rebalance)
        return ask is not None and self.settle(answer(ask, self.timer))

    def prepare(self, now: float, *, rebalance: bool = True) -> Ask | None:
        """``tick`` up to its decision pass; what that pass reads (None: no pass is due)."""
        timeout = self.policy.messaging.worker_timeout
        if rebalance:
            self._journal_placed()
        if rebalance and now - self._pruned_at >= self.policy.messaging.heartbeat_interval:
            self.prune(now)
        self.drive(now)
        if self.restarted and now - self.started_at < timeout:
            return None  # a restarted manager decides only once every worker could have reported
        if rebalance:
            self._evacuate(now)
            self._reconcile(now)
        rebalance = rebalance and self._rebalance_may_trigger()
        if not (self.requests or rebalance):
            return None
        return self._ask(now, rebalance=rebalance)

    def drive(self, now: float) -> None:
        """Drive every migration in flight one step further (part of every ``tick``)."""
        if self.migrations:
            alive = self.state.alive(now, self.policy.messaging.worker_timeout)
            for mid in list(self.migrations):
                self._drive(mid, now, alive)

    def prune(self, now: float) -> int:
        """Forget workers and containers unseen for ``prune_after`` worker timeouts, with
        what the coordinator holds for them; ids a migration in flight names stay."""
        self._pruned_at = now
        self.revision += 1
        msg = self.policy.messaging
        keep = {x for m in self.migrations.values() for x in (m.container, m.source, m.target)}
        # An unfinished job and its last worker stay until the job runs again (the reconciler's).
        keep.update(
            x
            for c in self.state.containers.values()
            if c.report.phase != "finished"
            for x in (c.id, c.worker)
        )
        before_w = set(self.state.workers)
        n = self.state.prune(now, msg.prune_after * msg.worker_timeout, keep)
        if n:
            for w in before_w - self.state.workers.keys():
                self.emit(Event("worker_forgotten", {"worker": w}))
                self.commands.forget(w)
                self._forget_notice(w, now)
            for cid in [c for c in self.requests if c not in self.state.containers]:
                del self.requests[cid]
                self._deferred.discard(cid)
            self._log("specon.manager.pruned", forgotten=n)
        for cid in expired(self._answered, now, self._quiet):
            del self._answered[cid]
        return n

    def record(self, m: Migration) -> None:
        """Journal ``m`` (write-ahead: commands queued after this wait until it is durable)."""
        self._written += 1
        self._effects.append(PutMigration(self._written, m))
        if m.id not in self.migrations:  # it begins (a dry run too): it claims budget
            self.claims += 1
        self.state.touch(m.container)
        self.revision += 1
        if m.state.terminal:
            self.recent.append(m)

    def _view(self, now: float) -> ClusterSnapshot:
        """The cluster now, as the policies read it."""
        return self.state.view(now, marks=self.marks, in_flight=self.migrations.values(), placed=self.virtual)

    def index(self, now: float) -> ClusterIndex:
        """The cluster now, indexed (the admission webhook ranks new pods' nodes by it too)."""
        return ClusterIndex.of(self._view(now))

    def _reconcile(self, now: float) -> None:
        """Open a recovery for every job that runs nowhere (``specon.coordinator.reconcile``)."""
        moving = {m.container for m in self.migrations.values()}
        steps = self.reconciler.plan(
            self.state, self.marks, moving, now, self.started_at, cordons=self.cordons,
            index=lambda: self.index(now), new_id=lambda: self._new_id(now),
        )  # fmt: skip
        for step in steps:
            if isinstance(step, Skip):
                r = step.recovery
                self.emit(
                    Event("recovery_gave_up" if step.gave_up else "recovery_waiting", {"reason": r.reason})
                )
                self._log("specon.manager.recovery_skipped", level="warning", container=r.container,
                          reason=r.reason, why=step.why)  # fmt: skip
                continue
            m = step.migration
            if step.restarts is not None:
                self._put_mark(
                    replace(self.marks.get(m.container) or Mark(m.container), restarts=step.restarts)
                )
            self.reconciler.opened(step)
            self.record(m)
            self.migrations[m.id] = m
            self.emit(Event("recovery", {"reason": m.reason}))
            down = round(now - (m.stopped_at or now), 3)
            self._log("specon.manager.recovery", migration=m.id, container=m.container, reason=m.reason,
                      source=m.source, target=m.target, down_for=down)  # fmt: skip
            self._drive(m.id, now, self.state.alive(now, self.policy.messaging.worker_timeout))

    def _drive(self, mid: str, now: float, alive: frozenset[WorkerId]) -> None:
        """Drive migration ``mid`` one step further (a few Advances may chain)."""
        warming_up = now - self.started_at < self.policy.messaging.worker_timeout
        for _ in range(8):  # never loop forever
            m = self.migrations.get(mid)
            if m is None:
                return
            if warming_up and not {m.source, m.target} <= self.state.workers.keys():
                return  # recovered migration: wait until its workers could have reported
            if not warming_up and self._overdue(m, now):
                continue
            where = self.state.running_on(m.container)
            step = next_step(
                m,
                # A silent worker's last heartbeat is no evidence the job still runs there.
                running_on=where if where in alive else None,
                finished=self.state.finished(m.container),
                alive=alive,
                saving=save_may_stop(self.commands.awaited_save(m.id, m.source), now, self.policy),
                cordoned=self.state.cordoned,
                refused=self.refusals.get(m.id, 0),
            )
            if isinstance(step, Advance):
                self._advance(m, step.state, now)
                if step.state.terminal:
                    return
                continue
            if isinstance(step, Wait):
                self._park_if_abandoned(m, now)
                return
            if mid in self._parked:  # a worker to act on is back: it holds the budget again
                self._parked.discard(mid)
                self.claims += 1
            if isinstance(step, IssueSave):
                self._send(step.worker, self.command(m, Action.SAVE, step.worker, now))
            elif isinstance(step, IssueStart):
                refused = self.refusals.get(m.id, 0)
                if step.rollback and not retry_due(refused, now - m.updated_at, self.policy):
                    pass  # a refused restart is retried with backoff, by the ticker
                elif not self.commands.has_start(m.id, (m.source, m.target)):  # never two at once
                    cmd = self.command(m, Action.START, step.worker, now, rollback=step.rollback)
                    self._send(step.worker, cmd)
            return

    def _overdue(self, m: Migration, now: float) -> bool:
        """Roll ``m`` back if it stayed in a save or a start past its deadline (time in the
        state as this manager saw it: a restart does not count its own downtime)."""
        error = deadline_passed(m, now - max(m.updated_at, self.started_at), self.policy.migration)
        if error is None:
            return False
        self.emit(Event("migration_timeout", {"state": m.state.value}))
        self._log("specon.manager.migration_timeout", level="warning", migration=m.id, container=m.container,
                  state=m.state.value, error=error)  # fmt: skip
        self._advance(m, State.FAILED, now, error=error)
        return True

    def holds_budget(self, m: Migration) -> bool:
        """False for a parked migration (see ``_park_if_abandoned``)."""
        return m.id not in self._parked

    def _park_if_abandoned(self, m: Migration, now: float) -> None:
        """A failed migration waiting for a live worker whose source and target have both
        been silent for ``park_after`` worker timeouts stops holding the budget (journaled
        once); it still restarts the job when one of them comes back."""
        silent = min(self.state.silent_for(m.source, now), self.state.silent_for(m.target, now))
        note = parked(m, silent, self.policy)
        if note is not None and m.id not in self._parked:
            self._parked.add(m.id)
            self.record(new := replace(m, error=f"{m.error}; {note}" if m.error else note))
            self.migrations[m.id] = new
            self.emit(Event("migration_parked"))
            self._log("specon.manager.migration_parked", level="warning", migration=m.id,
                      container=m.container, source=m.source, target=m.target)  # fmt: skip

    def _advance(self, m: Migration, state: State, now: float, *, error: str | None = None) -> None:
        changes: dict[str, object] = {}
        if error is not None:
            changes["error"] = error
        if state is State.FAILED and m.error is None and error is None:
            where = self.state.running_on(m.container)
            changes["error"] = why_failed(m, where, self.state.finished(m.container))
        new = m.to(state, at=now, **changes)
        self.record(new)
        # A save that reached the source may still stop the job: its result is awaited.
        awaited = now if (m.state, state) == (State.SAVING, State.FAILED) else None
        self.commands.retract(m.id, (m.source, m.target), await_saves_at=awaited)
        if new.state.terminal:
            self._finished(new, "done" if new.state is State.DONE else "rolled_back", now)
        else:
            self.migrations[m.id] = new
            self._log("specon.manager.migration_state", migration=m.id, container=m.container,
                      state=state.value)  # fmt: skip

    def _finished(self, m: Migration, result: str, now: float) -> None:
        del self.migrations[m.id]
        self._parked.discard(m.id)
        self.reconciler.closed(m.id)
        self.emit(Event("migration_finished", {"result": result, "reason": m.reason}, downtime=m.downtime,
                        duration=now - m.decided_at))  # fmt: skip
        self._log("specon.manager.migration_finished", migration=m.id, container=m.container,
                  result=result, downtime=m.downtime, error=m.error)  # fmt: skip
        if fields := learn_cost(self.move_costs, m, self.state):
            self._effects.append(Log("specon.manager.move_cost", fields, "info"))  # new estimates

    def _note_place(self, cid: ContainerId, worker: WorkerId, now: float) -> None:
        """Note where ``cid`` runs, or that it finished, when that changed (the reconciler's).
        Journaled by the next ticker pass, not with this heartbeat: no command waits for it, and
        a manager meeting thousands of jobs at once writes them in one transaction."""
        mk = self.marks.get(cid)
        if self.state.running_on(cid) == worker:
            if mk is None or mk.home != worker:
                self.marks[cid] = replace(mk or Mark(cid), home=worker)
                self._placed.add(cid)
            self.reconciler.running(cid, now)
        elif self.state.finished(cid) and (mk is None or not mk.finished):
            self.marks[cid] = replace(mk or Mark(cid), finished=True)
            self._placed.add(cid)

    def _journal_placed(self) -> None:
        for cid in self._placed:
            self._written += 1
            self._effects.append(PutMark(self._written, self.marks[cid]))
        self._placed.clear()

    def _put_mark(self, new: Mark) -> None:
        cid = new.container
        self.marks[cid] = new
        self._placed.discard(cid)  # written whole now
        self.state.touch(cid)
        self.revision += 1
        self._written += 1
        self._effects.append(PutMark(self._written, new))

    # -- migrations and commands -------------------------------------------------------
    def _new_id(self, now: float) -> str:
        return f"m{int(now * 1000):x}-{next(self._ids)}"

    def command(
        self, m: Migration, action: Action, worker: WorkerId, now: float, *, rollback: bool = False
    ) -> Command:
        """The save, start or rollback start of ``m`` on ``worker`` as it is sent (also what
        the pod broker allows after a restart: ``outbox.decided``)."""
        # The container arrives frozen in CC only if Algorithm 2 has decided for it; a
        # rebalanced container that never requested keeps being classified.
        migrated = action is Action.START and self.marks.get(m.container, UNMARKED).migrations > 0
        cmd = migration_command(m, action, worker, now, self.policy, migrated=migrated, rollback=rollback)
        drain = self.cordons.get(m.source) if m.reason == "evacuated" and action is Action.SAVE else None
        if drain is not None and drain.deadline is not None:  # the agent saves within what is left
            cmd = replace(cmd, deadline=min(cmd.deadline, drain.deadline))
        if action is not Action.START:
            return cmd
        # The other side of the move is silent: a copy it may still run is fenced, not waited for.
        lost = fenced_side(m, worker, rollback=rollback, silent_for=lambda w: self.state.silent_for(w, now),
                           policy=self.policy)  # fmt: skip
        return cmd if lost is None else replace(cmd, supersede=True, lost=lost)

    def _send(self, worker: WorkerId, cmd: Command) -> None:
        if self.commands.put(worker, cmd, after_write=self._written):
            self._log("specon.manager.command_queued", worker=worker, command=cmd.id, action=cmd.action.value)
            self._effects.append(CommandQueued(worker, cmd))
