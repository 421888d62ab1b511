"""The manager's control loop: requests -> Algorithm 2, trigger -> Algorithm 3, journal -> commands.

Each ``step`` takes a snapshot of the cluster, answers pending reallocation requests
within the migration budget, starts rebalancing moves when the trigger holds, and drives
every journaled migration one step further with ``specon.migration.next_step``. Commands
for an agent wait in its outbox until the agent's heartbeat or poll collects them and a
result says they ran; each is idempotent on the agent, so repeats are harmless.

Dry-run is a swapped executor (``DryRunExecutor``): decisions are taken, journaled and
reported exactly as in a live run, but no save or start is ever sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import structlog

from manager.journal import JournalStore
from manager.state import ClusterState, Marks
from specon.config import Policy
from specon.migration import Advance, IssueSave, IssueStart, Migration, Reason, State, Wait, next_step
from specon.model import ClusterSnapshot, ContainerId, WorkerId
from specon.policy.decisions import Move, RefusalReason, Stay
from specon.policy.placement import ClusterIndex
from specon.policy.scheduler import InFlight, decide_pass
from specon.protocol import Action, Command, CommandBatch, CommandResult, Heartbeat, ReallocationRequest

log = structlog.get_logger()

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Event:
    """Something the metrics and the status page count (decoupled from prometheus here)."""

    # "decision", "migration_finished", "request_refused", "request_deferred", "worker_forgotten"
    kind: str
    labels: dict[str, str] = field(default_factory=dict)
    downtime: float | None = None
    duration: float | None = None


class Executor(Protocol):
    """How a decided move is carried out: for real, or recorded only (dry-run)."""

    def begin(self, coord: Coordinator, move: Move, now: float) -> None: ...


class LiveExecutor:
    def begin(self, coord: Coordinator, move: Move, now: float) -> None:
        coord.open_migration(move, now)


class DryRunExecutor:
    """Journal the decision as a migration that never touched anything."""

    def begin(self, coord: Coordinator, move: Move, now: float) -> None:
        coord.record_dry_run(move, now)


class NotHostedError(ValueError):
    """A worker asked about a container it does not run."""


# Finished migrations the status keeps in memory (the journal keeps them all).
RECENT_MIGRATIONS = 1000


class Coordinator:
    def __init__(
        self,
        *,
        policy: Policy,
        journal: JournalStore,
        state: ClusterState | None = None,
        clock: Clock = time.time,
        executor: Executor | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.policy = policy
        self.journal = journal
        self.state = state or ClusterState()
        self.clock = clock
        self.executor: Executor = executor or (
            DryRunExecutor() if policy.migration.dry_run else LiveExecutor()
        )
        self.on_event = on_event
        self.generation = 1
        # Reallocation requests waiting for a decision: container -> first seen (manager clock).
        self.requests: dict[ContainerId, float] = {}
        self.outbox: dict[WorkerId, dict[str, Command]] = {}
        self.marks: dict[ContainerId, Marks] = {
            c: Marks(m.migrated_at, m.migrations, m.rebalances) for c, m in journal.marks().items()
        }
        self.migrations: dict[str, Migration] = {m.id: m for m in journal.in_flight()}
        # The newest finished migrations, oldest first, for the status (never the whole journal).
        self.recent: deque[Migration] = deque(
            sorted((m for m in journal.all() if not m.in_flight), key=lambda m: m.updated_at)[
                -RECENT_MIGRATIONS:
            ],
            maxlen=RECENT_MIGRATIONS,
        )
        self._pruned_at = clock()
        # Bumped by every change a status reader could see (cached pages compare it).
        self.revision = 0
        # A restarted manager has heard from nobody yet: until every worker had a
        # worker_timeout to report, silence is not evidence that it is gone.
        self.started_at = clock()
        # Refused restarts per migration, for the retry backoff (not journaled: a restarted
        # manager simply retries at once).
        self._refusals: dict[str, int] = {}
        # A journal that a manager has opened before means a restart into a running
        # cluster: decisions wait until every worker could have reported (see ``step``).
        self.restarted = journal.get_meta("started_at") is not None
        journal.set_meta("started_at", repr(self.started_at))
        self._ids = itertools.count(1)
        self._wakeups: dict[WorkerId, asyncio.Event] = {}
        # Command ids each worker has already been sent (by a reply or a poll).
        self._delivered: dict[WorkerId, set[str]] = {}
        # Requests counted as deferred (once each, not once per pass).
        self._deferred: set[ContainerId] = set()
        # Dry-run only: where decided moves would have put containers, so the next
        # decisions see the loads a live run would see.
        self.virtual: dict[ContainerId, WorkerId] = {}

        self.decision_seconds: list[float] = []
        if self.migrations:
            log.info("specon.manager.recovered", in_flight=len(self.migrations), ids=sorted(self.migrations))

    # -- inputs ------------------------------------------------------------------------
    def on_heartbeat(self, hb: Heartbeat) -> CommandBatch:
        now = self.clock()
        ingested = self.state.ingest(hb, now)
        if ingested:
            self.revision += 1
            for res in hb.results:
                self.on_result(hb.worker, res, now - (hb.sent_at - (res.finished_at or hb.sent_at)))
            for rep in hb.containers:
                if rep.pending_request and rep.phase == "running":
                    self.requests.setdefault(rep.id, now)
            self.step()
        # Only an applied heartbeat's results may be forgotten by the agent.
        return self.batch_for(hb.worker, ack=hb.seq if ingested else None)

    def on_request(self, req: ReallocationRequest) -> CommandBatch:
        """Queue ``req`` for Algorithm 2; ``NotHostedError`` unless the container runs on the
        worker that asks (a worker may only ask to move its own containers)."""
        if self.state.running_on(req.container) != req.worker:
            raise NotHostedError(f"container {req.container} is not running on worker {req.worker}")
        self.requests.setdefault(req.container, self.clock())
        self.step()
        return self.batch_for(req.worker)

    def on_goodbye(self, worker: WorkerId) -> None:
        self.state.goodbye(worker)
        self.revision += 1
        self.step()

    def batch_for(self, worker: WorkerId, *, ack: int | None = None) -> CommandBatch:
        box = self.outbox.get(worker, {})
        if box or worker in self._delivered:  # nothing is kept for a worker never sent anything
            delivered = self._delivered.setdefault(worker, set())
            delivered.intersection_update(box)
            delivered.update(box)
        return CommandBatch(
            manager_time=self.clock(),
            policy_generation=self.generation,
            commands=tuple(box.values()),
            ack=ack,
        )

    async def wait_for_commands(self, worker: WorkerId, timeout: float) -> CommandBatch:
        """Long poll: return as soon as ``worker`` has a command no poll delivered yet.

        Commands stay in the outbox until their result arrives (heartbeat replies repeat
        them); a poll only wakes for ones not sent yet, so it does not spin during a save.
        """
        if worker not in self.state.workers:
            # Not heard from (yet, or pruned): it has no commands, and keeps no state here.
            await asyncio.sleep(min(timeout, 1.0))
            return self.batch_for(worker)
        seen = self._delivered.setdefault(worker, set())
        if all(cid in seen for cid in self.outbox.get(worker, {})):
            ev = self._wakeups.setdefault(worker, asyncio.Event())
            ev.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ev.wait(), timeout)
        return self.batch_for(worker)

    # -- the loop ----------------------------------------------------------------------
    def step(self, *, rebalance: bool = False) -> None:
        """One pass: drive migrations, answer requests and, if asked, consider Algorithm 3.

        Heartbeats call it without ``rebalance`` (cheap: nothing is built unless a request
        waits); the manager's 1 s ticker calls it with ``rebalance=True``, which catches
        job completions within a second as well.
        """
        now = self.clock()
        timeout = self.policy.messaging.worker_timeout
        if rebalance and now - self._pruned_at >= self.policy.messaging.heartbeat_interval:
            self.prune(now)
        if self.migrations:
            self._drive(now, self.state.alive(now, timeout))
        if self.restarted and now - self.started_at < timeout:
            return  # a restarted manager decides only once every worker could have reported
        rebalance = rebalance and self._rebalance_may_trigger()
        if not (self.requests or rebalance):
            return
        t0 = time.perf_counter()
        snap = self.state.snapshot(
            now, timeout=timeout, marks=self.marks, in_flight=self.migrations.values(), placed=self.virtual
        )
        # One index per pass, shared by Algorithms 2 and 3 (building it dominates both).
        index = ClusterIndex.of(snap)
        self._decide(snap, index, now, rebalance=rebalance)
        self.decision_seconds.append(time.perf_counter() - t0)
        del self.decision_seconds[:-1000]

    def prune(self, now: float) -> int:
        """Forget workers and containers unseen for ``prune_after`` worker timeouts, with
        what the coordinator holds for them; ids a migration in flight names stay."""
        self._pruned_at = now
        self.revision += 1
        msg = self.policy.messaging
        keep = {x for m in self.migrations.values() for x in (m.container, m.source, m.target)}
        before_w = set(self.state.workers)
        n = self.state.prune(now, msg.prune_after * msg.worker_timeout, keep)
        if n:
            for w in before_w - self.state.workers.keys():
                self.emit(Event("worker_forgotten", {"worker": w}))
                self.outbox.pop(w, None)
                self._delivered.pop(w, None)
                ev = self._wakeups.pop(w, None)
                if ev is not None:
                    ev.set()
            for cid in [c for c in self.requests if c not in self.state.containers]:
                del self.requests[cid]
                self._deferred.discard(cid)
            log.info("specon.manager.pruned", forgotten=n)
        return n

    def record(self, m: Migration) -> None:
        """Journal ``m`` (write-ahead: durable before anything acts on it)."""
        self.journal.put(m)
        self.revision += 1
        if m.state.terminal:
            self.recent.append(m)

    def _rebalance_may_trigger(self) -> bool:
        """A cheap pre-check of Algorithm 3's trigger, before any snapshot is built."""
        cfg = self.policy.rebalance
        if cfg.mode == "off" or self.migrations:
            return False
        if cfg.when == "always":
            return True
        running = [r for r in self.state.containers.values() if r.report.phase == "running"]
        return bool(running) and all(
            r.report.migrated or self.marks.get(r.id, Marks()).migrations > 0 for r in running
        )

    def _drive(self, now: float, alive: frozenset[WorkerId]) -> None:
        warming_up = now - self.started_at < self.policy.messaging.worker_timeout
        for mid in list(self.migrations):
            for _ in range(8):  # a few Advances may chain in one pass; never loop forever
                m = self.migrations[mid]
                if warming_up and not {m.source, m.target} <= self.state.workers.keys():
                    break  # recovered migration: wait until its workers could have reported
                where = self.state.running_on(m.container)
                step = next_step(
                    m,
                    # A silent worker's last heartbeat is no evidence the job still runs there.
                    running_on=where if where in alive else None,
                    finished=self.state.finished(m.container),
                    alive=alive,
                )
                if isinstance(step, Advance):
                    self._advance(m, step.state, now)
                    if step.state.terminal:
                        break
                    continue
                if isinstance(step, IssueSave):
                    self._send(step.worker, self._command(m, Action.SAVE, step.worker, now))
                elif isinstance(step, IssueStart):
                    if step.rollback and not self._retry_due(m, now):
                        pass  # a refused restart is retried with backoff, by the ticker
                    elif not self._start_outstanding(m):  # never two starts of one job at once
                        cmd = self._command(m, Action.START, step.worker, now, rollback=step.rollback)
                        self._send(step.worker, cmd)
                elif isinstance(step, Wait):
                    pass
                break

    def _advance(self, m: Migration, state: State, now: float) -> None:
        changes: dict[str, object] = {}
        if state is State.RUNNING and m.started_at is None:
            # Seen running on the target before the start result arrived: the heartbeat
            # time bounds the restart from above.
            changes["started_at"] = now
        if state is State.FAILED and m.error is None:
            changes["error"] = _why_failed(
                m, self.state.running_on(m.container), self.state.finished(m.container)
            )
        new = m.to(state, at=now, **changes)
        self.record(new)
        self._retract(m)
        if new.state.terminal:
            del self.migrations[m.id]
            result = "done" if new.state is State.DONE else "rolled_back"
            self.emit(
                Event(
                    "migration_finished",
                    {"result": result, "reason": m.reason},
                    downtime=new.downtime,
                    duration=now - m.decided_at,
                )
            )
            log.info(
                "specon.manager.migration_finished",
                migration=m.id,
                container=m.container,
                result=result,
                downtime=new.downtime,
                error=new.error,
            )
        else:
            self.migrations[m.id] = new
            log.info(
                "specon.manager.migration_state", migration=m.id, container=m.container, state=state.value
            )

    # -- Algorithm 2 -------------------------------------------------------------------
    def _decide(self, snap: ClusterSnapshot, index: ClusterIndex, now: float, *, rebalance: bool) -> None:
        """Act on one ``decide_pass``: answer a request, defer, or start a rebalancing move."""
        queue = sorted(self.requests, key=self.requests.__getitem__)
        flights = [InFlight(m.container, m.source, m.target) for m in self.migrations.values()]
        p = decide_pass(
            snap, requests=queue, in_flight=flights, policy=self.policy, index=index, rebalance=rebalance
        )
        for cid in (*p.dropped, *p.answered):
            self.requests.pop(cid, None)
            self._deferred.discard(cid)
        for cid in p.deferred:
            if cid not in self._deferred:  # count a request once, not once per pass
                self._deferred.add(cid)
                self.emit(Event("request_deferred"))
        for r in p.refused:
            self.emit(Event("decision", {"kind": "refuse"}))
            if r.reason is RefusalReason.MIGRATION_LIMIT:
                # Already answered (e.g. the agent missed our mark): answer again.
                self._mark_command(r.container, now)
                continue
            log.warning("specon.manager.request_refused", container=r.container, reason=r.reason.value,
                        detail=r.detail)  # fmt: skip
            self.emit(Event("request_refused", {"reason": r.reason.value}))
        d = p.decision
        if d is not None:
            self.emit(Event("decision", {"kind": type(d).__name__.lower()}))
            self._mark(d.container, now)
            scores = {str(k): round(v, 3) for k, v in d.scores.items()}
            if isinstance(d, Stay):
                log.info("specon.manager.stay", container=d.container, worker=d.worker, scores=scores)
                self._mark_command(d.container, now)
            elif isinstance(d, Move):
                log.info("specon.manager.move", container=d.container, source=d.source, target=d.target,
                         scores=scores)  # fmt: skip
                self.executor.begin(self, d, now)
                if isinstance(self.executor, DryRunExecutor):
                    self._mark_command(d.container, now)
        if p.rebalance is not None:
            mv = p.rebalance
            self._mark(mv.container, now, rebalanced=True)
            log.info("specon.manager.rebalance", container=mv.container, source=mv.source, target=mv.target)
            self.executor.begin(self, mv, now)

    def _mark(self, cid: ContainerId, now: float, *, rebalanced: bool = False) -> None:
        mk = self.journal.mark(cid, migrated_at=None if rebalanced else now, rebalanced=rebalanced)
        self.revision += 1
        self.marks[cid] = Marks(mk.migrated_at, mk.migrations, mk.rebalances)

    def _mark_command(self, cid: ContainerId, now: float) -> None:
        worker = self.state.running_on(cid)
        if worker is None:
            return
        cmd = Command(
            id=f"mark:{cid}",
            action=Action.MARK_MIGRATED,
            container=cid,
            deadline=now + self.policy.messaging.worker_timeout,
        )
        self._send(worker, cmd)

    # -- migrations and commands -------------------------------------------------------
    def new_migration(self, move: Move, now: float) -> Migration:
        reason: Reason = move.reason
        mid = f"m{int(now * 1000):x}-{next(self._ids)}"
        return Migration(mid, move.container, move.source, move.target, reason, State.DECIDED, now, now)

    def record_dry_run(self, move: Move, now: float) -> Migration:
        """Journal ``move`` as decided but never executed (dry-run), and let later decisions
        count the container on its target, as they would after a live move."""
        self.virtual[move.container] = move.target
        m = self.new_migration(move, now)
        m = m.to(State.FAILED, at=now, error="dry-run: decided, not executed")
        m = m.to(State.ROLLED_BACK, at=now)
        self.record(m)
        self.emit(Event("migration_finished", {"result": "dry_run", "reason": m.reason}))
        log.info(
            "specon.manager.dry_run_move",
            container=move.container,
            source=move.source,
            target=move.target,
            reason=move.reason,
        )
        return m

    def open_migration(self, move: Move, now: float) -> None:
        m = self.new_migration(move, now)
        self.record(m)
        self.migrations[m.id] = m
        log.info(
            "specon.manager.migration_decided",
            migration=m.id,
            container=m.container,
            source=m.source,
            target=m.target,
            reason=m.reason,
        )
        self._drive(now, self.state.alive(now, self.policy.messaging.worker_timeout))

    def _command(
        self, m: Migration, action: Action, worker: WorkerId, now: float, *, rollback: bool = False
    ) -> Command:
        grace = self.policy.migration.grace_period
        kind = "rollback" if rollback else action.value
        return Command(
            # A retry after a failed result is a new command: the agent answers a repeated
            # id from its memory instead of running it again. The id is unique per step and
            # attempt; what the command means is in its fields (``rollback``), never parsed
            # back out of the id.
            id=f"{m.id}:{kind}:{worker}:{m.attempts}",
            action=action,
            container=m.container,
            deadline=now + grace + self.policy.messaging.worker_timeout,
            migration=m.id,
            checkpoint=m.checkpoint,
            checkpoint_step=m.checkpoint_step,
            target=m.target if action is Action.SAVE else None,
            # The container arrives frozen in CC only if Algorithm 2 has decided for it; a
            # rebalanced container that never requested keeps being classified.
            migrated=action is Action.START and self.marks.get(m.container, Marks()).migrations > 0,
            # No spec: the target starts the job as it was submitted (its own runtime's
            # record), never as a save result reported it (SPEC §6, security model).
            rollback=rollback,
        )

    def _send(self, worker: WorkerId, cmd: Command) -> None:
        box = self.outbox.setdefault(worker, {})
        if cmd.id not in box:
            box[cmd.id] = cmd
            log.info("specon.manager.command_queued", worker=worker, command=cmd.id, action=cmd.action.value)
            ev = self._wakeups.get(worker)
            if ev is not None:
                ev.set()

    def _retry_due(self, m: Migration, now: float) -> bool:
        """After n refused restarts, wait heartbeat_interval * 2^(n-1), at most worker_timeout."""
        n = self._refusals.get(m.id, 0)
        if n == 0:
            return True
        msg = self.policy.messaging
        wait = min(msg.worker_timeout, msg.heartbeat_interval * float(2 ** min(n - 1, 16)))
        return now - m.updated_at >= wait

    def wake_all(self) -> None:
        """Release every parked long poll (shutdown must not wait for them)."""
        for ev in self._wakeups.values():
            ev.set()

    def _start_outstanding(self, m: Migration) -> bool:
        return any(
            c.migration == m.id and c.action is Action.START
            for box in self.outbox.values()
            for c in box.values()
        )

    def _retract(self, m: Migration) -> None:
        for box in self.outbox.values():
            for cid in [c for c, cmd in box.items() if cmd.migration == m.id]:
                del box[cid]

    def on_result(self, worker: WorkerId, res: CommandResult, at: float) -> None:
        """Apply one command result (repeats and results for finished work are ignored)."""
        box = self.outbox.get(worker, {})
        cmd = box.pop(res.command, None)
        if cmd is None:
            return  # a repeat of a result already applied
        if cmd.action is Action.MARK_MIGRATED or cmd.migration is None:
            return
        m = self.migrations.get(cmd.migration)
        if m is None:
            return
        rollback = cmd.rollback  # the command as we queued it, not the id the agent echoed
        if not res.ok:
            log.warning("specon.manager.command_failed", command=res.command, worker=worker, error=res.error)
            if not rollback and m.state in (State.SAVING, State.RESTORING):
                self.record(new := m.to(State.FAILED, at=at, error=res.error, attempts=m.attempts + 1))
                self.migrations[m.id] = new
            elif rollback and m.state is State.FAILED:
                # E.g. refused because a copy still runs somewhere: retry later, fresh id.
                self._refusals[m.id] = self._refusals.get(m.id, 0) + 1
                self.record(new := replace(m, attempts=m.attempts + 1, updated_at=at))
                self.migrations[m.id] = new
            return
        if cmd.action is Action.SAVE and m.state is State.SAVING and res.detail.get("finished"):
            self._advance(m, State.FAILED, at)  # the job completed meanwhile: nothing to move
            return
        if cmd.action is Action.SAVE and m.state is State.SAVING:
            # The job stopped training at the SIGTERM, before the checkpoint was written.
            began = res.detail.get("began_at")
            stopped = at - (res.finished_at - began) if isinstance(began, float) and res.finished_at else at
            new = m.to(
                State.SAVED,
                at=at,
                checkpoint=res.checkpoint,
                checkpoint_step=res.checkpoint_step,
                stopped_at=stopped,
            )
            self.record(new)
            self.migrations[m.id] = new
        elif cmd.action is Action.START and not rollback and m.state is State.RESTORING:
            self.record(new := m.to(State.RUNNING, at=at, started_at=at))
            self.migrations[m.id] = new
        elif cmd.action is Action.START and rollback and m.state is State.FAILED:
            self.record(new := m.to(State.ROLLED_BACK, at=at, started_at=at))
            del self.migrations[m.id]
            self.emit(Event("migration_finished", {"result": "rolled_back", "reason": m.reason}))
        self.step()

    def emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)


def _why_failed(m: Migration, running_on: WorkerId | None, finished: bool) -> str:
    if finished:
        return "job finished during the migration"
    if running_on is not None and running_on not in (m.source, m.target):
        return f"container seen running on {running_on}"
    return f"gave up in state {m.state.value} (worker unreachable or container moved)"
