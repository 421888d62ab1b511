"""The manager's picture of the cluster, built from heartbeats (the worker monitor).

It keeps, per worker, the latest heartbeat; per container, where it was last seen, its
category history and its converged time on the *manager's* clock (agent times are
translated with the same heartbeat's ``sent_at``, so clock skew between hosts does not
leak into Algorithm 3's durations). ``snapshot`` turns it into the frozen
``ClusterSnapshot`` the policies decide on. No I/O here: callers pass ``now``.

The snapshot is kept incrementally (``view``): only containers and workers whose inputs
changed since the previous one are rebuilt, so a decision pass over 10,000 containers
costs what changed, not what exists. The manager and the simulator share this code;
the simulator models no worker failures and builds it ``always_heard``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from specon.coordinator.migration import Mark, Migration, State
from specon.coordinator.retention import expired
from specon.model import (
    Category,
    ClusterSnapshot,
    ContainerId,
    ContainerSnapshot,
    Resources,
    WorkerId,
    WorkerSnapshot,
)
from specon.wire.gpu import GpuDevice
from specon.wire.protocol import ContainerReport, Heartbeat
from specon.wire.status import ContainerStatus, LossWindow, Phase, WorkerStatus

# A job's opt-out from moves, carried in its report's job labels.
MIGRATABLE_LABEL = "specon.io/migratable"
# Category history kept per container (oldest dropped first): enough for any plot.
HISTORY_LIMIT = 500
# Agents send their wall clock in microseconds as ``seq``. One further ahead of the
# manager's clock than this is forged or broken: applying it would make every honest
# heartbeat after it look stale.
MAX_SEQ_AHEAD_US = 86_400 * 10**6


@dataclass(slots=True)
class WorkerRecord:
    id: WorkerId
    address: str
    capacity: Resources
    usage: float
    last_seen: float  # manager clock
    seq: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[str, ...] = ()
    said_goodbye: bool = False
    reported: frozenset[ContainerId] = frozenset()
    # ``labels`` as its snapshot view has them (sorted items), kept in step with them.
    label_items: tuple[tuple[str, str], ...] = ()
    # Its GPUs as last reported (status only: placement reads the labels and capacity).
    gpus: tuple[GpuDevice, ...] = ()


@dataclass(slots=True)
class ContainerRecord:
    id: ContainerId
    worker: WorkerId
    report: ContainerReport
    last_seen: float
    history: list[tuple[float, Category]] = field(default_factory=list)
    # Converged stamp on the manager clock; survives moves (the new agent starts fresh).
    t_cc: float | None = None
    finished_at: float | None = None
    # When it was first reported on ``worker`` (manager clock).
    since: float = 0.0
    # The last loss window an agent sent (reports carry it only when it changed): status only.
    window: LossWindow | None = None


class ClusterState:
    def __init__(self, *, always_heard: bool = False) -> None:
        # ``always_heard``: every known worker counts as heard from at every instant (the
        # simulator, whose workers never fail, reports only what changed).
        self.always_heard = always_heard
        self.workers: dict[WorkerId, WorkerRecord] = {}
        self.containers: dict[ContainerId, ContainerRecord] = {}
        self.heartbeats = 0
        self.stale_heartbeats = 0
        # Containers whose last word is that they ended unfinished (stopped, failed, unlisted):
        # id -> since when (manager clock), for the reconciler.
        self.ended: dict[ContainerId, float] = {}
        # Workers being drained: not Ready for placement (no new jobs), shown as cordoned.
        self.cordoned: set[WorkerId] = set()
        self.pruned = 0
        # Ids in order, rebuilt only after an id came or went (status pages bisect them).
        self._worker_order: list[WorkerId] | None = None
        self._container_order: list[ContainerId] | None = None
        # The incremental snapshot: container views in first-seen order, and what changed.
        self._views: dict[ContainerId, ContainerSnapshot] = {}
        self._view_tuple: tuple[ContainerSnapshot, ...] | None = None
        self._dirty: set[ContainerId] = set()
        self._worker_tuple: tuple[WorkerSnapshot, ...] | None = None
        # Worker views by id, and the workers whose record changed (kept only when ages do
        # not move with the clock, i.e. ``always_heard``).
        self._wviews: dict[WorkerId, WorkerSnapshot] = {}
        self._dirty_workers: set[WorkerId] = set()
        self._alive: frozenset[WorkerId] | None = None

    def touch(self, cid: ContainerId) -> None:
        """``cid``'s view must be rebuilt: its marks, its migration or its placement changed."""
        self._dirty.add(cid)

    def seq_plausible(self, hb: Heartbeat, now: float) -> bool:
        """False for a ``seq`` implausibly far ahead of the manager's clock (microseconds)
        and of this worker's last one: it would lock the real agent out."""
        w = self.workers.get(hb.worker)
        base = max(now * 1e6, w.seq if w is not None else 0)
        return hb.seq <= base + MAX_SEQ_AHEAD_US

    # -- ingest ------------------------------------------------------------------------
    def ingest(self, hb: Heartbeat, now: float) -> bool:
        """Apply one heartbeat; False (and nothing changed) for a stale, reordered one."""
        w = self.workers.get(hb.worker)
        if w is not None and hb.seq <= w.seq and not w.said_goodbye:
            self.stale_heartbeats += 1
            return False
        skew = now - hb.sent_at  # agent time + skew = manager time
        reported = frozenset(c.id for c in hb.containers)
        if w is None or w.said_goodbye:
            self._alive = None  # a worker joins (or comes back)
        if w is None:
            w = WorkerRecord(hb.worker, hb.address, hb.capacity, hb.usage, now, hb.seq)
            self.workers[hb.worker] = w
            self._worker_order = None
        w.address, w.capacity, w.usage, w.last_seen, w.seq = hb.address, hb.capacity, hb.usage, now, hb.seq
        if hb.labels != w.labels:  # rare: sorted once here, not for every decision pass
            w.labels, w.label_items = dict(hb.labels), tuple(sorted(hb.labels.items()))
        w.taints, w.said_goodbye, w.gpus = hb.taints, False, hb.gpus
        # Containers this worker stopped listing are no longer running there.
        for cid in w.reported - reported:
            rec = self.containers.get(cid)
            if rec is not None and rec.worker == hb.worker and rec.report.phase == "running":
                rec.report = _with_phase(rec.report, "stopped")
                self._dirty.add(cid)
                self.ended.setdefault(cid, now)
        w.reported = reported
        self._worker_changed(w.id)
        for rep in hb.containers:
            self._ingest_container(hb.worker, rep, now, skew)
        self.heartbeats += 1
        return True

    def ingest_reports(
        self, worker: WorkerId, reports: Iterable[ContainerReport], now: float, *, usage: float | None = None
    ) -> None:
        """Apply what changed on a known worker since its last report: these containers
        (others stay as they were) and, if given, its usage. The simulator's lower-level
        heartbeat: it reports changes only, with no clock skew."""
        w = self.workers[worker]
        w.last_seen = now
        if usage is not None:
            w.usage = usage
        self._worker_changed(worker)
        listed = set(w.reported)
        for rep in reports:
            if rep.phase == "running":
                listed.add(rep.id)
            else:
                listed.discard(rep.id)
            self._ingest_container(worker, rep, now, 0.0)
        w.reported = frozenset(listed)

    def _ingest_container(self, worker: WorkerId, rep: ContainerReport, now: float, skew: float) -> None:
        rec = self.containers.get(rep.id)
        changed = rec is None or rec.worker != worker or _view_changed(rec.report, rep)
        if rec is None:
            rec = ContainerRecord(rep.id, worker, rep, now, since=now)
            self.containers[rep.id] = rec
            self._container_order = None
        elif rec.worker != worker and rep.phase != "running" and rec.report.phase == "running":
            # A stale "stopped" entry from the old host must not hide the new, running one.
            return
        if not rec.history or rec.history[-1][1] != rep.category:
            rec.history.append((now, rep.category))
            del rec.history[:-HISTORY_LIMIT]
        # Each heartbeat's skew differs by milliseconds: a shift under T_CC_JITTER is noise
        # (Algorithm 3 ranks converged durations of seconds and more).
        if rep.t_cc is not None and (rec.t_cc is None or abs(rep.t_cc + skew - rec.t_cc) > T_CC_JITTER):
            rec.t_cc = rep.t_cc + skew
            changed = True
        if rep.phase == "finished" and rec.finished_at is None:
            rec.finished_at = now
        if rec.worker != worker:
            rec.since = now
        rec.worker, rec.report, rec.last_seen = worker, rep, now
        if rep.phase in {"running", "finished"}:
            if self.ended:
                self.ended.pop(rep.id, None)
        else:
            self.ended.setdefault(rep.id, now)
        if rep.window is not None:
            rec.window = rep.window
        if changed:  # the view only: most heartbeats change a step count, not what decides
            self._dirty.add(rep.id)

    def cordon(self, worker: WorkerId, on: bool) -> None:
        """Take ``worker`` out of placement (``on``) or put it back."""
        if on:
            self.cordoned.add(worker)
        else:
            self.cordoned.discard(worker)
        self._worker_changed(worker)

    def goodbye(self, worker: WorkerId) -> None:
        w = self.workers.get(worker)
        if w is not None:
            w.said_goodbye = True
            self._alive = None
            self._worker_changed(worker)

    def prune(self, now: float, older_than: float, keep: Iterable[str] = ()) -> int:
        """Forget workers and containers unseen for ``older_than`` seconds, except ids in
        ``keep`` (those a migration in flight still names); how many were forgotten."""
        if self.always_heard:
            return 0  # every worker is heard from all the time: nothing is unseen
        kept = set(keep)
        workers = expired({w: r.last_seen for w, r in self.workers.items()}, now, older_than, kept)
        containers = expired({c: r.last_seen for c, r in self.containers.items()}, now, older_than, kept)
        for w in workers:
            del self.workers[w]
        for c in containers:
            del self.containers[c]
            self.ended.pop(c, None)
        self._dirty.update(containers)
        for w in workers:
            self._worker_changed(w)
        if workers:
            self._alive = self._worker_order = None
        if containers:
            self._container_order = None
        self.pruned += len(workers) + len(containers)
        return len(workers) + len(containers)

    def worker_order(self) -> list[WorkerId]:
        if self._worker_order is None:
            self._worker_order = sorted(self.workers)
        return self._worker_order

    def container_order(self) -> list[ContainerId]:
        if self._container_order is None:
            self._container_order = sorted(self.containers)
        return self._container_order

    # -- queries -------------------------------------------------------------------------
    def alive(self, now: float, timeout: float) -> frozenset[WorkerId]:
        if self.always_heard and self._alive is not None:
            return self._alive  # no age moves: only a change of the workers changes it
        self._alive = frozenset(w.id for w in self.workers.values() if self.reachable(w, now, timeout))
        return self._alive

    def silent_for(self, worker: WorkerId, now: float) -> float:
        """Seconds since ``worker`` was last heard from (inf: unknown or said goodbye)."""
        w = self.workers.get(worker)
        if w is None or w.said_goodbye:
            return float("inf")
        return self._age(w, now)

    def reachable(self, w: WorkerRecord, now: float, timeout: float) -> bool:
        return not w.said_goodbye and (self.always_heard or now - w.last_seen < timeout)

    def _age(self, w: WorkerRecord, now: float) -> float:
        return 0.0 if self.always_heard or now <= w.last_seen else now - w.last_seen

    def running_on(self, cid: ContainerId) -> WorkerId | None:
        rec = self.containers.get(cid)
        return rec.worker if rec is not None and rec.report.phase == "running" else None

    def finished(self, cid: ContainerId) -> bool:
        rec = self.containers.get(cid)
        return rec is not None and rec.report.phase == "finished"

    def snapshot(
        self,
        now: float,
        *,
        timeout: float,
        marks: Mapping[ContainerId, Mark],
        in_flight: Iterable[Migration] = (),
        placed: Mapping[ContainerId, WorkerId] | None = None,
    ) -> ClusterSnapshot:
        """The frozen view for the policies, built from scratch (containers by id).
        Containers in a migration count on its target; ``placed`` overrides where
        containers count (dry-run's virtual moves)."""
        moving = _moving(in_flight)
        views = (self._container_view(rec, marks, moving, placed or {}) for rec in self.containers.values())
        containers = sorted((v for v in views if v is not None), key=lambda c: c.id)
        return ClusterSnapshot(now=now, workers=self._worker_views(now), containers=tuple(containers))

    def view(
        self,
        now: float,
        *,
        marks: Mapping[ContainerId, Mark],
        in_flight: Iterable[Migration] = (),
        placed: Mapping[ContainerId, WorkerId] | None = None,
    ) -> ClusterSnapshot:
        """``snapshot``, kept incrementally: only containers whose record changed, or that
        the caller ``touch``-ed (marks, migration, placement), are rebuilt; containers in
        first-seen order (no policy depends on the order: ties break by id)."""
        if self._dirty:
            moving = _moving(in_flight)
            where = placed or {}
            for cid in self._dirty:
                rec = self.containers.get(cid)
                v = None if rec is None else self._container_view(rec, marks, moving, where)
                if v is None:
                    self._views.pop(cid, None)
                else:
                    self._views[cid] = v
            self._dirty.clear()
            self._view_tuple = None
        if self._view_tuple is None:
            self._view_tuple = tuple(self._views.values())
        if not self.always_heard:  # ages move with ``now``: every worker view is new
            return ClusterSnapshot(now=now, workers=self._worker_views(now), containers=self._view_tuple)
        if self._dirty_workers or self._worker_tuple is None:
            for wid in self._dirty_workers:
                wrec = self.workers.get(wid)
                if wrec is None:
                    self._wviews.pop(wid, None)
                else:
                    self._wviews[wid] = self._worker_view(wrec, now)
            self._dirty_workers.clear()
            self._worker_tuple = tuple(self._wviews[w] for w in self.worker_order())
        return ClusterSnapshot(now=now, workers=self._worker_tuple, containers=self._view_tuple)

    def _worker_changed(self, worker: WorkerId) -> None:
        self._worker_tuple = None
        if self.always_heard:
            self._dirty_workers.add(worker)

    def _worker_views(self, now: float) -> tuple[WorkerSnapshot, ...]:
        return tuple(self._worker_view(self.workers[w], now) for w in self.worker_order())

    def _worker_view(self, w: WorkerRecord, now: float) -> WorkerSnapshot:
        # Every worker's view is rebuilt on every decision pass (its age moves): kept lean.
        return WorkerSnapshot(
            id=w.id,
            capacity=w.capacity,
            usage=w.usage,
            ready=not w.said_goodbye and w.id not in self.cordoned,
            heartbeat_age=self._age(w, now),
            labels=w.label_items,
            taints=w.taints,
        )

    @staticmethod
    def _container_view(
        rec: ContainerRecord,
        marks: Mapping[ContainerId, Mark],
        moving: Mapping[ContainerId, Migration],
        placed: Mapping[ContainerId, WorkerId],
    ) -> ContainerSnapshot | None:
        m = moving.get(rec.id)
        # A job its worker's GPU sharing suspended runs nowhere for now but comes back there:
        # it keeps its place (its requests count on that worker) and is not moved meanwhile.
        if rec.report.phase != "running" and m is None and not suspended(rec.report):
            return None
        if m is not None:
            return ClusterState.placement_view(rec, marks, worker=m.target, since=None)
        return ClusterState.placement_view(rec, marks, worker=placed.get(rec.id, rec.worker), since=rec.since)

    @staticmethod
    def placement_view(
        rec: ContainerRecord, marks: Mapping[ContainerId, Mark], *, worker: WorkerId, since: float | None
    ) -> ContainerSnapshot:
        """What placement reads of ``rec`` (running or not), counted on ``worker``."""
        rep = rec.report
        mk = marks.get(rec.id, UNMARKED)
        migrated = rec.report.migrated or mk.migrations > 0
        selector = rec.report.selector
        return ContainerSnapshot(
            id=rec.id,
            worker=worker,
            category=Category.CONVERGED if migrated else rec.report.category,
            t_cc=rec.t_cc,
            migrated=migrated,
            t_migrated=mk.migrated_at,
            migrations=mk.migrations,
            rebalances=mk.rebalances,
            requests=rec.report.requests,
            movable=rec.report.job.get(MIGRATABLE_LABEL, "true") != "false" and not suspended(rep),
            selector=tuple(sorted(selector.items())) if selector else (),
            tolerations=rec.report.tolerations,
            remaining_work=rec.report.remaining_work,
            since=since,
            gpu_memory=rec.report.gpu_memory,
        )

    def worker_status(
        self, now: float, timeout: float, ids: Iterable[WorkerId] | None = None
    ) -> tuple[WorkerStatus, ...]:
        """Status of the workers ``ids`` (default: all, by id)."""
        out = []
        for wid in self.worker_order() if ids is None else ids:
            w = self.workers[wid]
            here = tuple(
                sorted(
                    c
                    for c in w.reported
                    if (rec := self.containers.get(c)) is not None
                    and rec.worker == w.id
                    and rec.report.phase == "running"
                )
            )
            out.append(
                WorkerStatus(
                    id=w.id,
                    address=w.address,
                    ready=not w.said_goodbye and w.id not in self.cordoned,
                    reachable=self.reachable(w, now, timeout),
                    cordoned=w.id in self.cordoned,
                    heartbeat_age=round(self._age(w, now), 3),
                    capacity=w.capacity,
                    usage=w.usage,
                    containers=here,
                    labels=dict(w.labels),
                    taints=w.taints,
                    gpus=w.gpus,
                )
            )
        return tuple(out)

    def container_status(
        self, marks: Mapping[ContainerId, Mark], ids: Iterable[ContainerId] | None = None
    ) -> tuple[ContainerStatus, ...]:
        """Status of the containers ``ids`` (default: all, by id)."""
        out = []
        for cid in self.container_order() if ids is None else ids:
            rec = self.containers[cid]
            mk = marks.get(rec.id, UNMARKED)
            rep = rec.report
            # Its GPU use while it runs; a job the GPU sharing suspended is stopped and says so.
            held = rep.gpu is not None and rep.gpu.state == "suspended"
            out.append(
                ContainerStatus(
                    id=rec.id,
                    worker=rec.worker,
                    category=rep.category,
                    phase=rep.phase,
                    history=tuple(rec.history),
                    last_g=rep.last_g,
                    t_cc=rec.t_cc,
                    migrated=rep.migrated or mk.migrations > 0,
                    stalled=rep.stalled,
                    pending_request=rep.pending_request,
                    step=rep.step,
                    migrations=mk.migrations,
                    rebalances=mk.rebalances,
                    job=dict(rep.job),
                    cpu_weight=rep.cpu_weight if rep.phase == "running" else None,
                    window=rec.window,
                    gpu=rep.gpu if rep.phase == "running" or held else None,
                )
            )
        return tuple(out)


# The marks of a container nothing was decided for (its id is never read).
UNMARKED = Mark(ContainerId(""))
T_CC_JITTER = 0.5  # seconds


def _view_changed(old: ContainerReport, new: ContainerReport) -> bool:
    """Whether ``new`` changes what the container's snapshot view is built from."""
    return (
        old.category is not new.category
        or old.phase != new.phase
        or old.migrated != new.migrated
        or old.requests != new.requests
        or old.job.get(MIGRATABLE_LABEL) != new.job.get(MIGRATABLE_LABEL)
        or old.selector != new.selector
        or old.tolerations != new.tolerations
        or old.gpu_memory != new.gpu_memory
        or (old.gpu is None) != (new.gpu is None)
        or (old.gpu is not None and new.gpu is not None and old.gpu.state != new.gpu.state)
        or (old.remaining_work != new.remaining_work and _work_moved(old.remaining_work, new.remaining_work))
    )


# Remaining work is an estimate that changes with every step: a view is rebuilt for it
# only when it moved by more than this share (moves are decided on gains of seconds).
WORK_RESOLUTION = 0.05


def _work_moved(old: float | None, new: float | None) -> bool:
    if old is None or new is None:
        return old is not new
    return abs(new - old) > WORK_RESOLUTION * max(abs(old), 1.0)


def _moving(in_flight: Iterable[Migration]) -> dict[ContainerId, Migration]:
    """Migrations whose container counts on the target (all but failed ones)."""
    return {m.container: m for m in in_flight if m.state is not State.FAILED}


def suspended(rep: ContainerReport) -> bool:
    """A job its worker's GPU sharing suspended: it runs nowhere for now but resumes there."""
    return rep.phase == "stopped" and rep.gpu is not None and rep.gpu.state == "suspended"


def _with_phase(rep: ContainerReport, phase: Phase) -> ContainerReport:
    return replace(rep, phase=phase)
