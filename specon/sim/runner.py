"""One simulated run: a workload, a policy, the manager's own coordinator, a virtual clock.

The manager is not re-implemented here: the run drives ``specon.coordinator.machine.Coordinator``
(through the inline shell, with an in-memory journal) exactly as the manager's shell
does, and plays the agents around it:

* every Δ (``monitor.interval``, from the first submission) each worker's agent hands
  the samples its jobs logged since the last tick to ``classifier_for(cfg).tick_worker``
  and reports the containers whose view changed (``Coordinator.reports``, the
  lower-level heartbeat: simulated workers never fail, so only changes travel); a
  request it raises reaches the manager at once, as a ``ReallocationRequest``;
* every ``heartbeat_interval`` the agents repeat their still-pending requests, as real
  heartbeats do, and the manager runs decision passes: like the real manager, which
  gets one pass per heartbeat, a burst of passes runs until one decides nothing, at
  most one per worker plus one per waiting request; also after requests arrive and
  when a migration finishes;
* the agents carry out the coordinator's commands: ``mark_migrated`` freezes the job in
  CC; ``save`` stops it on its worker and reports the checkpoint; ``start`` runs it on
  the target after the migration downtime (frozen in CC if Algorithm 2 decided for it).
  So every simulated migration passes through ``specon.coordinator.migration.next_step`` and the
  journal, as a real one does.

Agents that do not classify (where nothing reads it: ``SimPolicy.classify``) report every
job as progressing since its start; under a priority rule they still tick every Δ, to
re-weigh their jobs as the real agent does. Under ``SimPolicy.oracle`` the agents call a job
converged at its trace's true convergence point instead (``specon.sim.oracle``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from specon.config import Policy, default_policy
from specon.coordinator.effects import CommandQueued, Event, MemoryJournal
from specon.coordinator.inline import InlineCoordinator
from specon.coordinator.migration import State
from specon.coordinator.reconcile import lost_after
from specon.coordinator.state import ClusterState
from specon.evaluation import JobResult, MigrationRecord, RunResult
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.policy.classifier import Classifier, classifier_for, horizon
from specon.policy.monitor import MonitorState
from specon.policy.priority.base import JobProgress
from specon.policy.priority.rules import weighs
from specon.policy.priority.rules import weights as priority_weights
from specon.policy.remaining import Fit, refit
from specon.sim import gpu_placement, oracle
from specon.sim.cluster import DEFAULT_PARAMS, Cluster, Phase, SimJob, SimParams, Workload
from specon.sim.engine import ARRIVE, COMPLETE, PASS, TICK, Engine
from specon.sim.hosts import Hosts, horizon_of
from specon.sim.policies import SimPolicy
from specon.sim.quality import QualityInputs
from specon.sim.reports import REPORTED, Seen, quantised, report_of
from specon.wire.protocol import (
    Action,
    Command,
    CommandResult,
    Heartbeat,
    ReallocationRequest,
)


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
    """Run ``workload`` under ``policy``; jobs unfinished at ``max_time`` have no finish (with
    failures, at the latest ``failures.horizon``)."""
    run = _Run(workload, policy, params)
    run.run(max_time if workload.failures is None else min(max_time, horizon_of(workload)))
    return run.result()


def simulated_manager(
    policy: Policy,
    clock: Callable[[], float],
    *,
    journal: MemoryJournal | None = None,
    on_event: Callable[[Event], None] | None = None,
    on_command: Callable[[CommandQueued], None] | None = None,
    failures: bool = False,
) -> InlineCoordinator:
    """The manager as the simulator runs it: the real coordinator, its effects performed
    inline, an in-memory journal; without ``failures``, workers that never fail
    (``always_heard``) and nothing to recover."""
    if not failures:
        # Its jobs end only by finishing: nothing to recover (a job waiting for a slot is
        # reported stopped, and is the simulator's to start).
        policy = dataclasses.replace(policy, recovery=dataclasses.replace(policy.recovery, enabled=False))
    return InlineCoordinator(
        policy=policy,
        journal=journal if journal is not None else MemoryJournal(),
        clock=clock,
        state=ClusterState(always_heard=not failures),
        on_event=on_event,
        on_command=on_command,
    )


class _Run:
    def __init__(self, workload: Workload, policy: SimPolicy, params: SimParams) -> None:
        self.workload = workload
        self.policy = policy
        self.params = params
        self.engine = Engine()
        self.prioritised = weighs(policy.priority)
        self._fits: dict[str, Fit] = {}  # job -> its last loss-curve fit
        # Toward each job's quality point.
        self._quality = QualityInputs(policy.priority, declared=policy.declared)
        self._declarations: dict[str, int] = {}  # job -> the steps it declared (``_declared``)
        self._misdeclared = params.declared_error > 0
        # Agents report remaining work where the manager's policy uses it.
        m = policy.manager
        self.reports_work = m is not None and (m.rebalance.mode == "work" or m.placement.require_gain)
        self.cluster = Cluster(
            self.engine,
            workload,
            params,
            on_finish=self._finished,
            on_change=self._worker_changed,
            weigh=self._weigh if self.prioritised else None,
            gpu_share=policy.gpu,
        )
        # Agents re-plan every Δ: their priority rule's weights, and each GPU's sharing.
        gpu_jobs = any(j.gpu for j in workload.jobs)
        self.reweighs = self.prioritised or (gpu_jobs and self.cluster.gpu.planned)
        self.placement = workload.placement()
        # GPU jobs that arrived where no GPU was free, in arrival order.
        self._waiting: list[SimJob] = []
        monitor = (policy.daemons or default_policy()).monitor
        self.interval = monitor.interval  # Δ, the agents' tick
        self.classifier: Classifier | None = classifier_for(monitor) if policy.classify else None
        self.stats = RunStats()
        self.journal = MemoryJournal()
        self.coord: InlineCoordinator | None = None
        failures = workload.failures
        # Where hosts fail, every policy with daemons has its manager: the recovery is its.
        manager = policy.manager or (policy.daemons if failures is not None else None)
        if manager is not None:
            self.coord = simulated_manager(
                manager,
                lambda: self.engine.now,
                journal=self.journal,
                on_event=self._event,
                on_command=self._command,
                failures=failures is not None,
            )
        # Running jobs whose agent holds a request the manager has not answered.
        self._pending: set[str] = set()
        self._seen: dict[str, Seen] = {}
        self._stale_workers: set[WorkerId] = set()
        self.hosts: Hosts | None = None
        if failures is not None:
            restores = manager is not None and manager.recovery.enabled
            if restores:
                self.cluster.checkpoints = failures.checkpoints
            delay = lost_after(manager or default_policy())  # when a loss is seen
            self.hosts = Hosts(self, failures, workload.key, restores=restores, delay=delay)

    # -- schedule ----------------------------------------------------------------------
    def run(self, max_time: float) -> None:
        jobs = self.workload.jobs
        if not jobs:
            return
        if self.coord is not None:
            for wid in sorted(self.cluster.workers):
                self.hello(wid)
        if self.hosts is not None:
            self.hosts.start()
        for plan in jobs:
            self.engine.at(plan.submit, partial(self._arrive, self.cluster.jobs[plan.id]), priority=ARRIVE)
        t0 = jobs[0].submit
        if self.classifier is not None:
            self._every(t0, self.classifier.cfg.interval, self._tick, TICK)
        elif self.reweighs:
            self._every(t0, self.interval, self._reweigh, TICK)
        if self.coord is not None:
            self._every(t0, self.coord.policy.messaging.heartbeat_interval, self._heartbeat, PASS)
        self.engine.run(until=max_time, stop=lambda: self.cluster.unfinished == 0)
        self.stats.events = self.engine.events

    def _every(self, t0: float, period: float, action: Callable[[], None], priority: int) -> None:
        """Run ``action`` at t0 + k * period, k = 1, 2, ..., while jobs are unfinished."""

        def fire(k: int) -> None:
            action()
            if self.cluster.unfinished:
                self.engine.at(t0 + (k + 1) * period, partial(fire, k + 1), priority=priority)

        self.engine.at(t0 + period, partial(fire, 1), priority=priority)

    def hello(self, wid: WorkerId) -> None:
        """An agent's first heartbeat: its worker and capacity, nothing running yet."""
        assert self.coord is not None
        spec = self.cluster.workers[wid].spec
        w = self.coord.state.workers.get(wid)
        hb = Heartbeat(
            worker=wid,
            address=f"{wid}:0",
            seq=1 if w is None else w.seq + 1,
            sent_at=self.engine.now,
            capacity=gpu_placement.capacity(spec),
            usage=0.0,
            labels=gpu_placement.labels(spec),
        )
        self.coord.on_heartbeat(hb)

    def forget(self, job: SimJob) -> None:
        """``job`` was lost with its host: its agent's view of it went too."""
        self._pending.discard(job.id)
        self._seen.pop(job.id, None)  # its next report, from a new host, travels
        if self.classifier is not None:
            job.state = self.classifier.initial()

    # -- agents: what they report ----------------------------------------------------------
    def _seen_of(self, job: SimJob) -> Seen:
        """What the job's agent reports of it (one that does not classify: no convergence)."""
        st = job.state
        remaining = self._remaining(job) if self.reports_work else None
        if st is None:
            return (REPORTED[job.phase], Category.PROGRESSING, job.started, False, False, remaining)
        return (REPORTED[job.phase], st.display, st.t_cc, st.migrated, st.pending_request, remaining)

    def _remaining(self, job: SimJob) -> float | None:
        """The job's remaining work as its agent reports it (None until it stepped)."""
        if job.phase is not Phase.RUNNING:
            return None
        p = self._progress(job)
        left, cost = p.steps_left, p.cpu_per_step
        return None if left is None or cost is None else quantised(left * cost)

    def report(
        self, job: SimJob, worker: WorkerId, *, result: CommandResult | None = None, drive: bool = False
    ) -> None:
        """Send ``job``'s report from ``worker`` if it changed, and ``result`` if any (a
        worker reports only the jobs it hosts); ``drive``: the migrations take their next
        step (the decisions wait for the next pass)."""
        if self.coord is None:
            return
        seen = self._seen_of(job)
        changed = job.worker == worker and self._seen.get(job.id) != seen
        if not (changed or result):
            return
        if changed:
            self._seen[job.id] = seen
        self._flush_usage()
        core, now = self.coord.core, self.engine.now
        core.reports(
            worker,
            now,
            containers=(report_of(job, seen),) if changed else (),
            results=() if result is None else (result,),
            step=False,
        )
        if drive:
            core.drive(now)
        self.coord.perform()

    def _flush_usage(self) -> None:
        """Workers whose jobs changed report their new usage R(w, t)."""
        assert self.coord is not None
        down = self.hosts.down if self.hosts is not None else ()
        for wid in sorted(self._stale_workers):
            if wid not in down:
                self.coord.core.reports(wid, self.engine.now, usage=self.cluster.usage(wid), step=False)
        self._stale_workers.clear()

    def _arrive(self, job: SimJob) -> None:
        if self.classifier is not None:
            job.state = self.classifier.initial()
        worker = self.host(job)
        if worker is None:
            self._waiting.append(job)
            return
        self.cluster.start(job, worker)
        self.report(job, worker)

    def host(self, job: SimJob) -> WorkerId | None:
        """Where an arriving job starts: its initial worker; a GPU job the first worker from
        there (round-robin; only its own where the file pins it) with a GPU free for it by
        ``placement.fits``, the rule the manager's moves follow; None: none is free. A worker
        down or drained is skipped (a CPU job then starts on ``Hosts.spare``)."""
        preferred = self.placement[job.id]
        out = self.hosts.unavailable if self.hosts is not None else ()
        if not job.plan.gpu:
            return preferred if preferred not in out or self.hosts is None else self.hosts.spare()
        specs = [w.spec for w in self.cluster.workers.values()]
        if job.plan.worker is not None:
            order = [self.cluster.workers[preferred].spec]
        else:
            at = next(i for i, s in enumerate(specs) if s.id == preferred)
            order = specs[at:] + specs[:at]
        used: dict[WorkerId, Resources] = {}
        for other in self.cluster.live():  # running, or moving to its target
            if other.plan.gpu and other.worker is not None:
                used[other.worker] = used.get(other.worker, Resources()) + gpu_placement.requests(other.plan)
        return gpu_placement.first_fit(job.plan, [w for w in order if w.id not in out], used)

    def place_waiting(self) -> None:
        """A GPU or a worker was freed: start the waiting jobs that fit now, first come first."""
        for job in list(self._waiting):
            worker = self.host(job)
            if worker is not None:
                self._waiting.remove(job)
                self.cluster.start(job, worker)
                self.report(job, worker)

    def _finished(self, job: SimJob) -> None:
        self._pending.discard(job.id)
        self._quality.finished(job)
        if job.worker is not None:
            self.report(job, job.worker)
        if self._waiting and job.plan.gpu:
            self.place_waiting()

    def _worker_changed(self, worker: str) -> None:
        self._stale_workers.add(WorkerId(worker))

    def _weigh(self, jobs: Sequence[SimJob]) -> dict[str, float]:
        """The agent's priority rule over a worker's jobs (``Cluster.weigh``)."""
        progress = [self._progress(j) for j in jobs]
        return {str(cid): float(w) for cid, w in priority_weights(progress, self.policy.priority).items()}

    def _progress(self, j: SimJob) -> JobProgress:
        """What ``j``'s agent knows of its progress now."""
        known = self._quality.of(j, self.cluster.steps_now(j))
        return JobProgress(
            id=ContainerId(j.id),
            started=j.started if j.started is not None else self.engine.now,
            step=self.cluster.steps_now(j),
            total=None
            if not self.policy.declared
            else self._declared(j)
            if self._misdeclared
            else j.plan.steps,
            cpu_seconds=self.cluster.cpu_now(j),
            fair_seconds=j.fair,
            gain=j.state.last_g if j.state is not None else None,
            predicted_steps=None if self.policy.declared else self._predicted(j),
            now=self.engine.now,
            loss_steps=known.steps,
            losses=known.losses,
            quality_truth=known.truth,
            quality_memory=known.recalled,
        )

    def _declared(self, j: SimJob) -> int:
        """The steps ``j`` declared: its true steps, off by up to ``params.declared_error``."""
        error = self.params.declared_error
        if error <= 0:
            return j.plan.steps
        got = self._declarations.get(j.id)
        if got is None:
            factor = random.Random(f"declared/{j.id}").uniform(1.0 - error, 1.0 + error)
            got = self._declarations[j.id] = max(1, round(j.plan.steps * factor))
        return got

    def _predicted(self, j: SimJob) -> float | None:
        """Steps left to convergence from the losses ``j`` logged so far (Optimus's fit,
        ``remaining.refit``: redone once its samples grew by a tenth)."""
        step = self.cluster.steps_now(j)
        n = min(math.floor(step / j.log_every), len(j.data.losses))
        every, losses = j.log_every, j.data.losses
        fit = self._fits[j.id] = refit(
            self._fits.get(j.id, Fit()), n, lambda: ([(i + 1) * every for i in range(n)], losses[:n])
        )
        return fit.steps_left(step)

    def _tick(self) -> None:
        classifier = self.classifier
        assert classifier is not None
        now = self.engine.now
        self.stats.ticks += 1
        raised: list[SimJob] = []
        take = self.cluster.take_samples
        declared = self.policy.declared  # as the agent's: a job's steps, where it declared them
        for w in self.cluster.workers.values():
            if not w.jobs:
                continue
            states: dict[ContainerId, MonitorState] = {}
            samples: dict[ContainerId, list[float]] = {}
            horizons: dict[ContainerId, float] = {}
            for job in w.jobs.values():
                cid = ContainerId(job.id)
                assert job.state is not None
                states[cid] = job.state
                got = take(job)
                if got:
                    samples[cid] = got
                steps = self._declared(job) if self._misdeclared else job.plan.steps
                if declared and (h := horizon(steps, self.cluster.steps_now(job))) is not None:
                    horizons[cid] = h
            if self.policy.oracle:
                converged = {ContainerId(j.id): self._past_truth(j) for j in w.jobs.values()}
                result = oracle.detect_worker(classifier, states, samples, now, converged)
            else:
                result = classifier.tick_worker(states, samples, now, horizons=horizons or None)
            for cid, st in result.states.items():
                job = w.jobs[cid]
                job.state = st
                if st.pending_request:
                    self._pending.add(job.id)
                else:
                    self._pending.discard(job.id)
                self.report(job, w.id)
            raised += (w.jobs[cid] for cid in result.requests)
            if self.reweighs:
                self.cluster.reweigh(w.id)
        if raised and self.coord is not None:
            for job in raised:
                assert job.worker is not None and job.state is not None
                self.stats.requests += 1
                req = ReallocationRequest(
                    worker=job.worker,
                    container=ContainerId(job.id),
                    t_cc=job.state.t_cc or now,
                    g=0.0,
                    sent_at=now,
                )
                self.coord.core.request(req, now, step=False)
            self._passes()

    def _reweigh(self) -> None:
        """The tick of agents that do not classify: their priority rule runs again, as the
        real agent's does every Δ (a rule's order moves with the jobs' progress and deficits,
        not only when jobs come and go)."""
        self.stats.ticks += 1
        for wid in self.cluster.workers:
            self.cluster.reweigh(wid)

    def _past_truth(self, job: SimJob) -> bool:
        """Whether ``job`` has trained past its trace's true convergence point."""
        return self.cluster.steps_now(job) >= job.data.quality_at * job.plan.steps

    def _heartbeat(self) -> None:
        assert self.coord is not None
        if self.hosts is not None:
            self.hosts.ping()
        core = self.coord.core
        for jid in sorted(self._pending, key=self._start_order):
            job = self.cluster.jobs[jid]
            if job.phase is Phase.RUNNING:
                core.requests.setdefault(ContainerId(jid), self.engine.now)  # the heartbeat repeats it
        self._passes()

    def _start_order(self, jid: str) -> tuple[float, str]:
        """Requests repeated in a heartbeat queue in the order their jobs started."""
        started = self.cluster.jobs[jid].started
        return (math.inf if started is None else started), jid

    # -- manager -----------------------------------------------------------------------
    def _passes(self) -> None:
        coord = self.coord
        assert coord is not None
        self._flush_usage()
        for _ in range(len(self.cluster.workers) + len(coord.requests)):
            self.stats.passes += 1
            if not coord.step(rebalance=True):
                break

    def _event(self, ev: Event) -> None:
        if ev.kind == "decision" and ev.labels.get("kind") == "stay":
            self.stats.stays += 1
        elif ev.kind == "request_refused":
            reason = ev.labels["reason"]
            self.stats.refusals[reason] = self.stats.refusals.get(reason, 0) + 1

    # -- agents: carrying out commands ---------------------------------------------------
    def _command(self, queued: CommandQueued) -> None:
        """An agent receives a command: it runs on the simulated clock, never inside the
        coordinator's own call."""
        self.engine.at(
            self.engine.now, partial(self._execute, queued.worker, queued.command), priority=COMPLETE
        )

    def _execute(self, worker: WorkerId, cmd: Command) -> None:
        job = self.cluster.jobs.get(cmd.container)
        now = self.engine.now
        hosts = self.hosts
        if job is None or (hosts is not None and worker in hosts.down):
            return  # a dead agent does nothing
        if cmd.action is Action.MARK_MIGRATED:
            if self.classifier is not None and job.state is not None and job.phase is Phase.RUNNING:
                job.state = self.classifier.mark_migrated(job.state, now)
                self._pending.discard(job.id)
            self.report(job, worker, result=CommandResult(command=cmd.id, ok=True, finished_at=now))
        elif cmd.action is Action.SAVE:
            if job.phase is Phase.RUNNING and job.worker == worker:
                self.cluster.suspend(job)
                self._pending.discard(job.id)
                steps = round(self.cluster.steps_now(job))
                done = CommandResult(command=cmd.id, ok=True, checkpoint=f"sim:{job.id}:{steps}",
                                     checkpoint_step=steps, finished_at=now)  # fmt: skip
            elif job.phase is Phase.DONE:  # nothing left to move
                done = CommandResult(command=cmd.id, ok=True, finished_at=now, detail={"finished": True})
            else:
                done = CommandResult(command=cmd.id, ok=False, error="not running here", finished_at=now)
            self.report(job, worker, result=done, drive=True)
            if self._waiting and job.plan.gpu and job.phase is Phase.MOVING:
                self.place_waiting()  # its GPU on the source is free
        elif cmd.action is Action.START:
            epoch = None if hosts is None else hosts.epoch[worker]
            self.engine.after(
                self.cluster.downtime(job), partial(self._started, worker, cmd, epoch), priority=COMPLETE
            )

    def _started(self, worker: WorkerId, cmd: Command, epoch: int | None = None) -> None:
        job = self.cluster.jobs[cmd.container]
        now = self.engine.now
        if self.hosts is not None and self.hosts.epoch[worker] != epoch:
            return  # its host died during the restore
        if job.phase is Phase.RUNNING or job.phase is Phase.DONE:
            res = CommandResult(command=cmd.id, ok=False, error="already running", finished_at=now)
            self.report(job, worker, result=res, drive=True)
            return
        self.cluster.start(job, worker)
        if cmd.migrated and self.classifier is not None and job.state is not None:
            job.state = self.classifier.mark_migrated(job.state, now)  # restored frozen in CC
        self.report(job, worker, result=CommandResult(command=cmd.id, ok=True, finished_at=now))
        self._passes()  # the pass drives the migration to done first

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
                quality_time=j.quality_time,
            )
            for j in self.cluster.jobs.values()
        )
        journaled = self.journal.all()
        moves = tuple(
            MigrationRecord(
                job=m.container,
                source=m.source,
                target=m.target,
                reason=m.reason,
                t=m.decided_at,
                downtime=m.downtime,
            )
            for m in journaled
            if m.state is State.DONE
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
            "rolled_back": sum(m.state is State.ROLLED_BACK for m in journaled),
            "in_flight": sum(m.in_flight for m in journaled),
        }
        if any(j.gpu is not None for j in self.cluster.jobs.values()):
            meta["gpu"] = dataclasses.asdict(self.cluster.gpu.stats)
        if self.hosts is not None:
            self.hosts.lost.recoveries = self.cluster.restored
            meta["failures"] = self.hosts.lost.as_dict()
        return RunResult(jobs=jobs, migrations=moves, meta=meta)
