"""One simulated run: a workload, a policy, the shared decision code, a virtual clock.

The run plays the agents and the manager the way the daemons do, calling the same pure
code (``specon.policy``) and nothing else for the decisions:

* every Δ (``monitor.interval``, from the first submission) each worker's agent hands
  the samples its jobs logged since the last tick to ``classifier_for(cfg).tick_worker``;
  requests it raises reach the manager at once;
* the manager runs decision passes (``specon.policy.scheduler.decide_pass``) right after
  requests arrive, every ``heartbeat_interval`` (when, as in the daemons, each agent
  repeats its still-pending requests) and when a migration finishes. One pass decides at
  most one request and one rebalancing move, like one ``Coordinator.step``; a burst of
  passes is run until a pass decides nothing, at most one per worker heartbeat plus one
  per waiting request (the real manager gets that many steps per heartbeat interval);
* the manager acts on a pass as ``manager.coordinator`` does: Stay -> mark migrated
  (the agent freezes the job in CC); Move -> mark migrated, save, restore on the target
  after the migration downtime, where the job arrives frozen in CC; a rebalancing move
  -> mark rebalanced and move the same way (a job never decided for keeps being
  classified on its new worker); a refusal for the migration limit -> mark again.

Job completions are seen at the next heartbeat pass, as the manager sees them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from specon.evaluation import JobResult, MigrationRecord, RunResult
from specon.model import (
    Category,
    ClusterSnapshot,
    ContainerId,
    ContainerSnapshot,
    Resources,
    WorkerId,
    WorkerSnapshot,
)
from specon.policy.classifier import Classifier, classifier_for
from specon.policy.decisions import Move, RefusalReason, Stay
from specon.policy.monitor import MonitorState
from specon.policy.scheduler import InFlight, Pass, decide_pass
from specon.sim.cluster import DEFAULT_PARAMS, Cluster, Phase, SimJob, SimParams, Workload
from specon.sim.engine import ARRIVE, PASS, TICK, Engine
from specon.sim.policies import SimPolicy


@dataclass(slots=True)
class RunStats:
    events: int = 0
    ticks: int = 0
    passes: int = 0
    requests: int = 0
    stays: int = 0
    refusals: dict[str, int] = field(default_factory=dict)


def simulate(
    workload: Workload,
    policy: SimPolicy,
    *,
    params: SimParams = DEFAULT_PARAMS,
    max_time: float = math.inf,
) -> RunResult:
    """Run ``workload`` under ``policy``; jobs unfinished at ``max_time`` have no finish."""
    run = _Run(workload, policy, params)
    run.run(max_time)
    return run.result()


class _Run:
    def __init__(self, workload: Workload, policy: SimPolicy, params: SimParams) -> None:
        self.workload = workload
        self.policy = policy
        self.params = params
        self.engine = Engine()
        self.cluster = Cluster(
            self.engine, workload, params, on_finish=self._finished, on_change=self._worker_changed
        )
        self.placement = workload.placement()
        self.manager = policy.manager
        self.classifier: Classifier | None = (
            classifier_for(policy.manager.monitor) if policy.classify and policy.manager is not None else None
        )
        # Waiting requests, oldest first (insertion order = arrival order: time only grows).
        self.requests: dict[ContainerId, float] = {}
        self.flights: dict[str, InFlight] = {}
        self.records: list[MigrationRecord] = []
        self.stats = RunStats()
        # Running jobs whose agent holds a request the manager has not answered.
        self._pending: set[str] = set()
        # The manager's view, rebuilt piecewise: per live job (in start order) and per
        # worker (by id), only what changed since the previous pass.
        self._views: dict[str, ContainerSnapshot | None] = {}
        self._stale_views: set[str] = set()
        self._containers: tuple[ContainerSnapshot, ...] | None = None
        self._workers = sorted(self.cluster.workers)
        self._wviews: dict[str, WorkerSnapshot | None] = dict.fromkeys(self._workers)
        self._stale_workers: set[str] = set(self._workers)
        self._wtuple: tuple[WorkerSnapshot, ...] = ()

    # -- schedule ----------------------------------------------------------------------
    def run(self, max_time: float) -> None:
        jobs = self.workload.jobs
        if not jobs:
            return
        for plan in jobs:
            self.engine.at(plan.submit, partial(self._arrive, self.cluster.jobs[plan.id]), priority=ARRIVE)
        t0 = jobs[0].submit
        if self.classifier is not None:
            self._every(t0, self.classifier.cfg.interval, self._tick, TICK)
        if self.manager is not None:
            self._every(t0, self.manager.messaging.heartbeat_interval, self._heartbeat, PASS)
        self.engine.run(until=max_time, stop=lambda: self.cluster.unfinished == 0)
        self.stats.events = self.engine.events

    def _every(self, t0: float, period: float, action: Callable[[], None], priority: int) -> None:
        """Run ``action`` at t0 + k * period, k = 1, 2, ..., while jobs are unfinished."""

        def fire(k: int) -> None:
            action()
            if self.cluster.unfinished:
                self.engine.at(t0 + (k + 1) * period, partial(fire, k + 1), priority=priority)

        self.engine.at(t0 + period, partial(fire, 1), priority=priority)

    # -- agents ------------------------------------------------------------------------
    def _arrive(self, job: SimJob) -> None:
        if self.classifier is not None:
            job.state = self.classifier.initial()
        self.cluster.start(job, self.placement[job.id])
        self._stale(job)

    def _finished(self, job: SimJob) -> None:
        del self._views[job.id]
        self._stale_views.discard(job.id)
        self._pending.discard(job.id)
        self._containers = None

    def _worker_changed(self, worker: str) -> None:
        self._stale_workers.add(worker)

    def _stale(self, job: SimJob) -> None:
        self._views[job.id] = None
        self._stale_views.add(job.id)
        self._containers = None

    def _tick(self) -> None:
        classifier = self.classifier
        assert classifier is not None
        now = self.engine.now
        self.stats.ticks += 1
        raised = False
        take = self.cluster.take_samples
        for w in self.cluster.workers.values():
            if not w.jobs:
                continue
            states: dict[ContainerId, MonitorState] = {}
            samples: dict[ContainerId, list[float]] = {}
            for job in w.jobs.values():
                cid = ContainerId(job.id)
                assert job.state is not None
                states[cid] = job.state
                got = take(job)
                if got:
                    samples[cid] = got
            result = classifier.tick_worker(states, samples, now)
            for cid, st in result.states.items():
                job = w.jobs[cid]
                old = job.state
                assert old is not None
                if st.display is not old.display or st.t_cc != old.t_cc:
                    self._stale(job)
                job.state = st
                if st.pending_request:
                    self._pending.add(job.id)
                else:
                    self._pending.discard(job.id)
            for cid in result.requests:
                self.requests.setdefault(cid, now)
                self.stats.requests += 1
                raised = True
        if raised:
            self._passes()

    def _heartbeat(self) -> None:
        assert self.manager is not None
        now = self.engine.now
        for jid in sorted(self._pending, key=self._views_order):
            if self.cluster.jobs[jid].phase is Phase.RUNNING:
                self.requests.setdefault(ContainerId(jid), now)
        if self.requests or self.manager.rebalance.mode != "off":
            self._passes()

    # -- manager -----------------------------------------------------------------------
    def _passes(self) -> None:
        manager = self.manager
        assert manager is not None
        for _ in range(len(self._workers) + len(self.requests)):
            p = decide_pass(
                self._snapshot(),
                requests=list(self.requests),
                in_flight=list(self.flights.values()),
                policy=manager,
            )
            self.stats.passes += 1
            self._apply(p)
            if p.decision is None and p.rebalance is None:
                break

    def _apply(self, p: Pass) -> None:
        jobs = self.cluster.jobs
        for cid in (*p.dropped, *p.answered):
            self.requests.pop(cid, None)
        for r in p.refused:
            self.stats.refusals[r.reason.value] = self.stats.refusals.get(r.reason.value, 0) + 1
            job = jobs.get(r.container)
            if r.reason is RefusalReason.MIGRATION_LIMIT and job is not None:
                self._freeze(job)  # already decided: the agent missed its mark, send it again
        d = p.decision
        if isinstance(d, Stay):
            self.stats.stays += 1
            job = jobs[d.container]
            self._mark(job)
            self._freeze(job)
        elif isinstance(d, Move):
            job = jobs[d.container]
            self._mark(job)
            self._begin(job, d)
        if p.rebalance is not None:
            job = jobs[p.rebalance.container]
            job.rebalances += 1
            self._stale(job)
            self._begin(job, p.rebalance)

    def _mark(self, job: SimJob) -> None:
        job.migrations += 1
        job.t_migrated = self.engine.now
        self._stale(job)

    def _freeze(self, job: SimJob) -> None:
        if self.classifier is not None and job.state is not None and job.phase is Phase.RUNNING:
            job.state = self.classifier.mark_migrated(job.state, self.engine.now)
            self._pending.discard(job.id)
            self._stale(job)

    def _begin(self, job: SimJob, move: Move) -> None:
        self.flights[job.id] = InFlight(move.container, move.source, move.target)
        self.records.append(
            MigrationRecord(
                job=job.id,
                source=move.source,
                target=move.target,
                reason=move.reason,
                t=self.engine.now,
                downtime=self.params.migration_downtime,
            )
        )
        self._stale(job)
        self.cluster.move(job, move.target, self._arrived)

    def _arrived(self, job: SimJob) -> None:
        del self.flights[job.id]
        if job.migrations > 0:
            self._freeze(job)  # restored with ``migrated``: frozen in CC on the target
        self._stale(job)
        self._passes()

    def _snapshot(self) -> ClusterSnapshot:
        cluster = self.cluster
        if self._stale_workers:
            for wid in self._stale_workers:
                self._wviews[wid] = WorkerSnapshot(
                    id=WorkerId(wid),
                    capacity=Resources(cpu=cluster.workers[WorkerId(wid)].spec.cpu),
                    usage=cluster.usage(WorkerId(wid)),
                )
            self._stale_workers.clear()
            self._wtuple = tuple(w for w in self._wviews.values() if w is not None)
        if self._containers is None:
            views, jobs = self._views, cluster.jobs
            for jid in self._stale_views:
                views[jid] = self._view(jobs[jid])
            self._stale_views.clear()
            self._containers = tuple(v for v in views.values() if v is not None)
        return ClusterSnapshot(now=self.engine.now, workers=self._wtuple, containers=self._containers)

    def _views_order(self, jid: str) -> tuple[float, str]:
        """Requests repeated in a heartbeat queue in the order their jobs started."""
        started = self.cluster.jobs[jid].started
        return (math.inf if started is None else started), jid

    def _view(self, job: SimJob) -> ContainerSnapshot:
        assert job.worker is not None
        cid = ContainerId(job.id)
        if self.policy.blind:
            snap = ContainerSnapshot(
                id=cid,
                worker=job.worker,
                category=Category.PROGRESSING,
                t_cc=job.started,
                rebalances=job.rebalances,
            )
        else:
            st = job.state
            assert st is not None
            migrated = job.migrations > 0 or st.migrated
            snap = ContainerSnapshot(
                id=cid,
                worker=job.worker,
                category=Category.CONVERGED if migrated else st.display,
                t_cc=st.t_cc,
                migrated=migrated,
                t_migrated=job.t_migrated,
                migrations=job.migrations,
                rebalances=job.rebalances,
            )
        return snap

    # -- result ------------------------------------------------------------------------
    def result(self) -> RunResult:
        jobs = tuple(
            JobResult(
                id=j.id,
                model=j.plan.model,
                submit=j.plan.submit,
                finish=j.finish,
                steps=j.plan.steps,
                steps_done=round(self.cluster.steps_now(j)),
                worker_history=tuple(j.history),
            )
            for j in self.cluster.jobs.values()
        )
        s = self.stats
        meta = {
            "policy": self.policy.name,
            "events": s.events,
            "ticks": s.ticks,
            "passes": s.passes,
            "requests": s.requests,
            "stays": s.stays,
            "refusals": dict(sorted(s.refusals.items())),
        }
        return RunResult(jobs=jobs, migrations=tuple(self.records), meta=meta)
