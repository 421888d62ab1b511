"""Host failures played out in one simulated run (``specon.sim.failures`` says when).

A lost host kills its jobs (``Cluster.lose``: each falls back to its last checkpoint) and its
agent: it stops reporting, its commands go nowhere. While a worker lives its agent tells the
manager so every heartbeat (``ping``), so the manager's own reconciler
(``specon.coordinator.reconcile``, ``recovery.enabled``) finds the silence after
``recovery.after`` and restores the jobs elsewhere, from their checkpoints, as ``recovered``
migrations. Where no manager restores them (DS, or a policy with recovery off) the scheduler
restarts each lost job from scratch, after the same detection delay, on the live worker with
the fewest jobs per core (a Kubernetes Job's new pod, spread by the default scheduler).

A reclaim notice drains the worker (``Coordinator.drain`` with the notice as its deadline:
its jobs move off with a fresh checkpoint); DS has no drain and loses the host at the
deadline. A lost worker comes back empty after ``repair`` seconds (cordon lifted), and new
jobs meanwhile start elsewhere (``unavailable``).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from specon.model import WorkerId
from specon.sim.cluster import Phase, SimJob, Workload
from specon.sim.engine import COMPLETE, Handle
from specon.sim.failures import Failures, HostEvent, LostWork

if TYPE_CHECKING:
    from specon.sim.runner import _Run


class Hosts:
    def __init__(self, run: _Run, failures: Failures, key: str, *, restores: bool, delay: float) -> None:
        """``restores``: a manager restores lost jobs (else they restart from scratch after
        ``delay`` seconds)."""
        self.run = run
        self.failures = failures
        self.restores = restores
        self.delay = delay
        self.lost = LostWork()
        self.down: set[WorkerId] = set()
        self.draining: set[WorkerId] = set()  # noticed: no new jobs, going at the deadline
        # Bumped at each loss: a start the dead agent had under way never happens.
        self.epoch: dict[WorkerId, int] = dict.fromkeys(run.cluster.workers, 0)
        self._clock = failures.clock(key)
        self._next: dict[WorkerId, Handle] = {}  # each worker's next MTBF failure
        self._homeless: list[SimJob] = []  # lost jobs waiting for a worker to restart on

    @property
    def unavailable(self) -> set[WorkerId]:
        return self.down | self.draining

    def start(self) -> None:
        """Schedule the listed events and each worker's first MTBF failure."""
        engine = self.run.engine
        for e in sorted(self.failures.events, key=lambda e: (e.at, e.worker)):
            if e.notice is None:
                engine.at(e.at, partial(self._lose, e.worker), priority=COMPLETE)
            else:
                engine.at(e.at, partial(self._notice, e), priority=COMPLETE)
        for wid in sorted(self.run.cluster.workers):
            self._schedule(wid, 0.0)

    def ping(self) -> None:
        """Every live worker's heartbeat: the manager hears it (a dead one stays silent)."""
        coord = self.run.coord
        if coord is not None:
            now = self.run.engine.now
            for wid in sorted(self.run.cluster.workers):
                if wid not in self.down:
                    coord.core.reports(wid, now, step=False)

    def _schedule(self, wid: WorkerId, up: float) -> None:
        if (old := self._next.pop(wid, None)) is not None:
            old.cancel()
        at = self._clock.next_after(wid, up)
        if at is not None:
            self._next[wid] = self.run.engine.at(at, partial(self._lose, wid), priority=COMPLETE)

    def _notice(self, e: HostEvent) -> None:
        if e.worker in self.down:
            return
        self.lost.notices += 1
        coord = self.run.coord
        if coord is not None:
            self.draining.add(e.worker)
            coord.on_drain(e.worker, deadline=e.notice)
        self.run.engine.at(e.lost_at, partial(self._lose, e.worker), priority=COMPLETE)

    def _lose(self, wid: WorkerId) -> None:
        if wid in self.down:
            return  # already gone
        run, lost = self.run, self.lost
        self.down.add(wid)
        self.draining.discard(wid)
        self.epoch[wid] += 1
        lost.hosts_lost += 1
        for job, steps, seconds in run.cluster.lose(wid, from_scratch=not self.restores):
            lost.jobs_lost += 1
            lost.lost_steps += steps
            lost.lost_seconds += seconds
            run.forget(job)
            if not self.restores:
                run.engine.after(self.delay, partial(self._restart, job), priority=COMPLETE)
        run.engine.after(self.failures.repair, partial(self._back, wid), priority=COMPLETE)

    def _back(self, wid: WorkerId) -> None:
        """``wid`` comes back empty: it says hello again, is uncordoned, takes jobs again."""
        run = self.run
        self.down.discard(wid)
        coord = run.coord
        if coord is not None:
            run.hello(wid)
            if wid in coord.core.cordons:
                coord.on_uncordon(wid)
        self._schedule(wid, run.engine.now)
        homeless, self._homeless = self._homeless, []
        for job in homeless:
            self._restart(job)
        run.place_waiting()

    def _restart(self, job: SimJob) -> None:
        """The scheduler starts lost ``job`` again, from scratch (its steps were reset)."""
        if job.phase is not Phase.LOST:
            return
        run = self.run
        target = run.host(job) if job.plan.gpu else self.spare()
        if target is None:
            self._homeless.append(job)
            return
        run.cluster.start(job, target)
        run.report(job, target)

    def spare(self) -> WorkerId | None:
        """The available worker with the fewest CPU jobs per core (the first by id on a tie)."""
        workers = self.run.cluster.workers
        up = [w for w in sorted(workers) if w not in self.unavailable]
        return min(up, key=lambda w: workers[w].cpu_jobs / workers[w].spec.cpu, default=None)


# A run with failures stops here at the latest: jobs that never finish (hosts failing faster
# than the jobs checkpoint) must not keep the simulator going forever.
HORIZON_FACTOR = 100.0


def horizon_of(workload: Workload) -> float:
    """The latest time a run of ``workload`` with failures may reach: its last submission plus
    ``HORIZON_FACTOR`` times its whole work (seconds alone on one core or GPU)."""
    jobs = workload.jobs
    return max((j.submit for j in jobs), default=0.0) + HORIZON_FACTOR * sum(j.work for j in jobs)
