"""Prometheus metrics of the manager, on a registry of its own (one per app, so tests don't clash)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specon.coordinator.effects import Event
from specon.coordinator.machine import Coordinator
from specon.model import Category
from specon_manager.cost_metrics import MoveCostCollector

_DOWNTIME_BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 10, 30, 60)
_LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1)


class ManagerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.heartbeats = Counter("specon_manager_heartbeats", "Heartbeats accepted", ["worker"], registry=r)
        self.rejected = Counter(
            "specon_manager_rejected_messages",
            "Messages refused (auth, malformed, oversized, stale)",
            ["reason"],
            registry=r,
        )
        self.logins = Counter(
            "specon_manager_logins",
            "Status-page logins in a browser by result (ok, wrong_token, forbidden, cross_site)",
            ["result"],
            registry=r,
        )
        self.decisions = Counter(
            "specon_manager_decisions", "Algorithm 2 outcomes (stay, move, refuse)", ["kind"], registry=r
        )
        self.refused = Counter("specon_manager_requests_refused", "Requests refused", ["reason"], registry=r)
        self.deferred = Counter(
            "specon_manager_requests_deferred", "Requests held back by the migration budget", registry=r
        )
        self.migrations = Counter(
            "specon_manager_migrations",
            "Finished migrations by result and reason",
            ["result", "reason"],
            registry=r,
        )
        self.downtime = Histogram(
            "specon_manager_migration_downtime_seconds",
            "Job stopped -> running again",
            buckets=_DOWNTIME_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "specon_manager_migration_duration_seconds",
            "Decided -> finished",
            buckets=_DOWNTIME_BUCKETS,
            registry=r,
        )
        self.decision_latency = Histogram(
            "specon_manager_decision_latency_seconds",
            "One decision pass (snapshot, Alg. 2, Alg. 3)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.heartbeat_latency = Histogram(
            "specon_manager_heartbeat_seconds",
            "Answering one heartbeat (ingest, decisions it triggers, its journal writes)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.relayed = Counter(
            "specon_manager_relayed_heartbeats",
            "Heartbeats a front process checked and this decider answered over its socket (--fronts)",
            registry=r,
        )
        self.forgotten = Counter(
            "specon_manager_workers_forgotten",
            "Workers pruned after prune_after x worker_timeout of silence",
            registry=r,
        )
        self.timeouts = Counter(
            "specon_manager_migration_timeouts",
            "Migrations rolled back for staying in a state past its deadline",
            ["state"],
            registry=r,
        )
        self.parked = Counter(
            "specon_manager_migrations_parked",
            "Failed migrations whose workers went silent: no longer holding the budget",
            registry=r,
        )
        self.recoveries = Counter(
            "specon_manager_recoveries",
            "Jobs that ran nowhere, restored from their newest checkpoint (recovered, crashed)",
            ["reason"],
            registry=r,
        )
        self.recoveries_skipped = Counter(
            "specon_manager_recoveries_skipped",
            "Jobs that ran nowhere and were not restored: gave_up (past recovery.limit) or "
            "waiting (no worker can host them; counted once until one can)",
            ["reason", "why"],
            registry=r,
        )
        self.in_flight = Gauge(
            "specon_manager_migrations_in_flight", "Migrations not yet finished", registry=r
        )
        # Each worker's heartbeat series: ``labels`` takes a lock and validates on every call.
        self._beats: dict[str, Counter] = {}

    def heartbeat_accepted(self, worker: str) -> None:
        child = self._beats.get(worker)
        if child is None:
            child = self._beats[worker] = self.heartbeats.labels(worker=worker)
        child.inc()

    def on_event(self, ev: Event) -> None:
        if ev.kind == "decision":
            self.decisions.labels(**ev.labels).inc()
        elif ev.kind == "request_refused":
            self.refused.labels(**ev.labels).inc()
        elif ev.kind == "request_deferred":
            self.deferred.inc()
        elif ev.kind == "worker_forgotten":
            self.forgotten.inc()
            worker = ev.labels["worker"]
            if self._beats.pop(worker, None) is not None:  # never heard from: no series to drop
                self.heartbeats.remove(worker)
        elif ev.kind == "migration_timeout":
            self.timeouts.labels(**ev.labels).inc()
        elif ev.kind == "migration_parked":
            self.parked.inc()
        elif ev.kind == "recovery":
            self.recoveries.labels(**ev.labels).inc()
        elif ev.kind in ("recovery_gave_up", "recovery_waiting"):
            self.recoveries_skipped.labels(
                reason=ev.labels["reason"], why=ev.kind.removeprefix("recovery_")
            ).inc()
        elif ev.kind == "decision_pass" and ev.duration is not None:
            self.decision_latency.observe(ev.duration)
        elif ev.kind == "migration_finished":
            self.migrations.labels(**ev.labels).inc()
            if ev.downtime is not None:
                self.downtime.observe(ev.downtime)
            if ev.duration is not None:
                self.duration.observe(ev.duration)

    def watch(self, coord: Coordinator) -> None:
        """Containers per category per worker, their CPU weights and the workers' GPUs, read
        from the live state at scrape time."""
        self.in_flight.set_function(lambda: len(coord.migrations))
        self.registry.register(_CategoryCollector(lambda: coord))
        self.registry.register(_GpuCollector(lambda: coord))
        self.registry.register(MoveCostCollector(lambda: coord))
        self.registry.register(_QualityCollector(lambda: coord))

    def watch_journal(self, failures: Callable[[], int], pruned: Callable[[], int]) -> None:
        """The journal's failed writes and pruned records, read at scrape time."""
        self.registry.register(_JournalCollector(failures, pruned))


class _JournalCollector(Collector):
    def __init__(self, failures: Callable[[], int], pruned: Callable[[], int]) -> None:
        self._failures, self._pruned = failures, pruned

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "specon_manager_journal_failures",
            "Journal writes and prunings that failed (retried; see specon.manager.journal_failed)",
            value=self._failures(),
        )
        yield CounterMetricFamily(
            "specon_manager_journal_pruned",
            "Ended migrations deleted from the journal past SPECON_MANAGER_JOURNAL_RETENTION",
            value=self._pruned(),
        )


class _CategoryCollector(Collector):
    def __init__(self, get: Callable[[], Coordinator]) -> None:
        self._get = get

    def collect(self) -> Iterator[GaugeMetricFamily]:
        coord = self._get()
        fam = GaugeMetricFamily(
            "specon_manager_containers",
            "Running containers per worker and category",
            labels=["worker", "category"],
        )
        tally: Tally[tuple[str, str]] = Tally()
        for rec in coord.state.containers.values():
            if rec.report.phase == "running":
                tally[(rec.worker, rec.report.category.value)] += 1
        for w in coord.state.workers:
            for category in (Category.PROGRESSING, Category.WATCHING, Category.CONVERGED):
                tally.setdefault((w, category.value), 0)
        for (worker, name), n in sorted(tally.items()):
            fam.add_metric([worker, name], n)
        yield fam
        # Per container, read at scrape time: a container that stopped or was pruned has no
        # series any more, so nothing is left to remove.
        weights = GaugeMetricFamily(
            "specon_manager_container_cpu_weight",
            "CPU weight (cgroup-v2 units, 1-10000) of each running container on its worker",
            labels=["worker", "container"],
        )
        for cid in coord.state.container_order():
            rec = coord.state.containers[cid]
            if rec.report.phase == "running" and rec.report.cpu_weight is not None:
                weights.add_metric([rec.worker, cid], rec.report.cpu_weight)
        yield weights


class _GpuCollector(Collector):
    """Each worker's GPUs as its agent last reported them, read at scrape time: a forgotten
    worker's series go with it, and there are at most ``MAX_GPU_DEVICES`` per worker."""

    def __init__(self, get: Callable[[], Coordinator]) -> None:
        self._get = get

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._get().state
        count = GaugeMetricFamily(
            "specon_manager_worker_gpus", "GPUs of each worker (NVML)", labels=["worker"]
        )
        labels = ["worker", "gpu"]
        util = GaugeMetricFamily(
            "specon_manager_worker_gpu_utilisation",
            "SM utilisation of each GPU of each worker (%)",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "specon_manager_worker_gpu_memory_used_bytes",
            "GPU memory in use on each GPU (bytes)",
            labels=labels,
        )
        total = GaugeMetricFamily(
            "specon_manager_worker_gpu_memory_total_bytes", "GPU memory of each GPU (bytes)", labels=labels
        )
        for wid in state.worker_order():
            gpus = state.workers[wid].gpus
            if not gpus:
                continue  # most workers have none: no series for them
            count.add_metric([wid], len(gpus))
            for d in gpus:
                key = [wid, str(d.index)]
                if d.utilisation is not None:
                    util.add_metric(key, d.utilisation)
                used.add_metric(key, d.memory_used)
                total.add_metric(key, d.memory_total)
        yield from (count, util, used, total)


class _QualityCollector(Collector):
    """The cluster's quality memory (``specon.coordinator.remembering``), read at scrape time."""

    def __init__(self, get: Callable[[], Coordinator]) -> None:
        self._get = get

    def collect(self) -> Iterator[GaugeMetricFamily]:
        memory = self._get().quality
        points = GaugeMetricFamily(
            "specon_manager_quality_point",
            "Median share of their steps at which a model's finished jobs reached quality",
            labels=["model"],
        )
        jobs = GaugeMetricFamily(
            "specon_manager_quality_jobs", "Finished jobs remembered per model (the newest)", labels=["model"]
        )
        for model, share in sorted(memory.shares().items()):
            points.add_metric([model], share)
            jobs.add_metric([model], len(memory.jobs[model]))
        yield points
        yield jobs
