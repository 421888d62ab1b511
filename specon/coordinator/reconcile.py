"""Level-triggered recovery: every unfinished job the manager knows keeps one live copy (SPEC §6.5).

Migrations act on the edges of a move; this module looks at the level, as a Kubernetes
controller does. At each ticker pass ``Reconciler.due`` lists the jobs that run nowhere and
that no migration is moving:

* ``recovered`` — its worker has been silent for ``recovery.after`` while its last heartbeat
  listed the job running (a lost host); or a restarted manager never heard of the job again
  (its journaled ``home`` says where it ran); or its copy stopped without finishing (stopped
  after a checkpoint, or no longer listed) with nothing restarting it;
* ``crashed`` — its copy ended with an error (a crash, an OOM kill) outside a migration.

The coordinator restores each from the job's newest complete checkpoint on the worker
Algorithm 2 picks (``specon.policy.placement.select_home``), as a journaled migration that
begins at ``saved``. A start is refused while any host may still run the job, so a false
loss costs a refused start, never a second copy. Attempts for one job back off
(``recovery.backoff`` doubling to ``max_backoff``); restarts of a copy that ended, or of a job
nobody reported, count against ``recovery.limit`` (journaled in the job's ``Mark``), losses of a
host do not. Pure: no I/O, no clock; the in-memory back-off starts afresh with a new manager.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace

from specon.config import Policy, RecoveryConfig
from specon.coordinator.migration import Cordon, Mark, Migration, Reason, State
from specon.coordinator.state import ClusterState, suspended
from specon.model import Category, ContainerId, ContainerSnapshot, WorkerId
from specon.policy.placement import ClusterIndex, select_home


@dataclass(frozen=True, slots=True)
class Recovery:
    """A job to restore: where it ran, why, and since when it runs nowhere (manager clock)."""

    container: ContainerId
    source: WorkerId
    reason: Reason
    since: float
    # Counts against ``recovery.limit`` (its copy ended, or nobody reported it).
    counted: bool


@dataclass(frozen=True, slots=True)
class Restore:
    """Open ``migration`` (a recovery, at ``saved``); ``restarts``: the job's new count, if counted."""

    migration: Migration
    restarts: int | None


@dataclass(frozen=True, slots=True)
class Skip:
    """Not now: ``why``; ``gave_up``: the job is over ``recovery.limit`` and left failed."""

    recovery: Recovery
    why: str
    gave_up: bool = False


def lost_after(policy: Policy) -> float:
    """Seconds of silence after which a worker is lost: never before it is unreachable."""
    return max(policy.recovery.after, policy.messaging.worker_timeout)


def backoff(attempts: int, cfg: RecoveryConfig) -> float:
    """Seconds to wait after ``attempts`` attempts before the next (0 before the first)."""
    if attempts == 0:
        return 0.0
    return float(min(cfg.max_backoff, cfg.backoff * 2.0 ** min(attempts - 1, 32)))


class Reconciler:
    def __init__(self, policy: Policy, marks: Mapping[ContainerId, Mark]) -> None:
        self.policy = policy
        self.cfg = policy.recovery
        # Jobs a restarted manager knows from its journal until some worker reports them.
        self._unheard: dict[ContainerId, WorkerId] = {
            c: m.home for c, m in marks.items() if m.home is not None and not m.finished
        }
        # Recovery attempts per job since it last ran (count, last at): the back-off.
        self._tries: dict[ContainerId, tuple[int, float]] = {}
        # Jobs over the limit: left failed (logged once).
        self.gave_up: set[ContainerId] = set()
        # Jobs no worker can host now (logged once until one can).
        self._waiting: set[ContainerId] = set()
        # Open recoveries that counted a restart (``refund``); a new manager starts without.
        self._counted: set[str] = set()

    @property
    def lost_after(self) -> float:
        return lost_after(self.policy)

    def running(self, cid: ContainerId, now: float) -> None:
        """``cid`` was reported running: it is heard of, and once it has run ``max_backoff``
        seconds since the last attempt its back-off starts afresh (as a crash loop's does)."""
        if self._unheard:
            self._unheard.pop(cid, None)
        if (
            self._tries
            and (tried := self._tries.get(cid)) is not None
            and now - tried[1] >= self.cfg.max_backoff
        ):
            del self._tries[cid]
        if self.gave_up:
            self.gave_up.discard(cid)
        if self._waiting:
            self._waiting.discard(cid)

    def opened(self, restore: Restore) -> None:
        if restore.restarts is not None:
            self._counted.add(restore.migration.id)

    def closed(self, mid: str) -> None:
        self._counted.discard(mid)

    def refund(
        self, m: Migration, detail: Mapping[str, object], marks: Mapping[ContainerId, Mark]
    ) -> Mark | None:
        """The job's mark with the restart recovery ``m`` counted given back, when its start was
        refused because a copy of the job runs elsewhere (``detail``: the result's): the job was
        not restarted. Else None. A copy the manager cannot hear from (a partition, a start it
        gave up on that ran after all) is refused at every attempt, and those refusals must not
        use up ``recovery.limit`` and leave the job failed once that copy is lost too."""
        if detail.get("running_elsewhere") is not True or m.id not in self._counted:
            return None
        self._counted.discard(m.id)
        mark = marks.get(m.container)
        return None if mark is None or mark.restarts == 0 else replace(mark, restarts=mark.restarts - 1)

    def tried(self, cid: ContainerId, now: float) -> None:
        n, _ = self._tries.get(cid, (0, now))
        self._tries[cid] = (n + 1, now)

    def plan(
        self,
        state: ClusterState,
        marks: Mapping[ContainerId, Mark],
        moving: Collection[ContainerId],
        now: float,
        started_at: float,
        *,
        cordons: Mapping[WorkerId, Cordon],
        index: Callable[[], ClusterIndex],
        new_id: Callable[[], str],
    ) -> Iterator[Restore | Skip]:
        """What to do for each job due (``due``, then ``evacuations``), one at a time: the
        caller opens each ``Restore`` before asking for the next, so that ``index`` (the
        cluster now) counts it on its target and the next job's choice sees it."""
        recoveries = self.due(state, marks, moving, now, started_at)
        for r in [*recoveries, *self.evacuations(state, cordons, moving, now)]:
            restarts = marks[r.container].restarts if r.container in marks else 0
            if r.counted and restarts >= self.cfg.limit:
                self.gave_up.add(r.container)
                yield Skip(r, f"restarted {restarts} time(s); limit {self.cfg.limit}", gave_up=True)
                continue
            rec = state.containers.get(r.container)
            job = (
                ContainerSnapshot(r.container, r.source, Category.CONVERGED)  # known from the journal only
                if rec is None
                else ClusterState.placement_view(rec, marks, worker=r.source, since=None)
            )
            cfg = self.policy
            target = select_home(index(), job, cfg=cfg.placement, worker_timeout=cfg.messaging.worker_timeout)
            if target is None:
                # Looked for again at every pass, said once: no attempt was made.
                if r.container not in self._waiting:
                    self._waiting.add(r.container)
                    yield Skip(r, "no Ready, reachable worker can host it")
                continue
            self._waiting.discard(r.container)
            self.tried(r.container, now)
            if cfg.migration.dry_run:
                yield Skip(r, f"dry-run: decided for {target}, not executed")
            else:
                # An evacuation is a move (its job runs: save, then restore); a recovery restores.
                state0 = State.DECIDED if r.reason == "evacuated" else State.SAVED
                since = None if r.reason == "evacuated" else r.since
                m = Migration(new_id(), r.container, r.source, target, r.reason, state0, now, now,
                              stopped_at=since)  # fmt: skip
                yield Restore(m, restarts + 1 if r.counted else None)

    def due(
        self,
        state: ClusterState,
        marks: Mapping[ContainerId, Mark],
        moving: Collection[ContainerId],
        now: float,
        started_at: float,
    ) -> list[Recovery]:
        """The recoveries to open now (``moving``: containers a migration has in flight)."""
        if not self.cfg.enabled:
            return []
        out: dict[ContainerId, Recovery] = {}
        for r in self._candidates(state, marks, now, started_at):
            if r.container in moving or r.container in self.gave_up or r.container in out:
                continue
            n, last = self._tries.get(r.container, (0, r.since))
            if now - max(last, r.since) >= backoff(n, self.cfg):
                out[r.container] = r
        return list(out.values())

    def evacuations(
        self,
        state: ClusterState,
        cordons: Mapping[WorkerId, Cordon],
        moving: Collection[ContainerId],
        now: float,
    ) -> list[Recovery]:
        """The jobs running on a reachable cordoned worker that no migration moves yet, back-off
        permitting (a silent one's jobs are recovered once it is lost, not saved)."""
        out = []
        timeout = self.policy.messaging.worker_timeout
        for c in cordons.values():
            w = state.workers.get(c.worker)
            if w is None or not state.reachable(w, now, timeout):
                continue
            for cid in sorted(w.reported):
                if cid in moving or state.running_on(cid) != c.worker:
                    continue
                n, last = self._tries.get(cid, (0, c.since))
                if now - max(last, c.since) >= backoff(n, self.cfg):
                    out.append(Recovery(cid, c.worker, "evacuated", c.since, counted=False))
        return out

    def _candidates(
        self, state: ClusterState, marks: Mapping[ContainerId, Mark], now: float, started_at: float
    ) -> Iterator[Recovery]:
        for cid, since in state.ended.items():
            rec = state.containers.get(cid)
            mk = marks.get(cid)
            # A worker listed it ended: it ran there, if only for a moment no heartbeat saw (a
            # host lost right after a start, a copy that died at once), and keeps its copy. A
            # GPU-suspended one resumes where it is.
            if rec is None or (mk is not None and mk.finished) or suspended(rec.report):
                continue
            reason: Reason = "crashed" if rec.report.phase == "failed" else "recovered"
            yield Recovery(cid, rec.worker, reason, since, counted=True)
        # Workers with unfinished jobs are never pruned (``Coordinator.prune``): a lost one stays.
        after = self.lost_after
        for w in state.workers.values():
            if now - w.last_seen < after:
                continue
            for cid in sorted(w.reported):  # one order whatever the hash seed (the simulator's runs)
                rec = state.containers.get(cid)
                if rec is not None and rec.worker == w.id and rec.report.phase == "running":
                    yield Recovery(cid, w.id, "recovered", w.last_seen, counted=False)
        if self._unheard and now - started_at >= after:
            for cid, home in self._unheard.items():
                if cid not in state.containers:
                    yield Recovery(cid, home, "recovered", started_at, counted=True)
