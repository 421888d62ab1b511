"""The simulated runtime: workers with CPU capacity, jobs that train on them, migrations.

Contention model (weighted processor sharing). A job uses at most ``job_cores`` cores (1:
single-threaded; a job of ``job_threads`` threads spans that many cores). A worker's
capacity is split among the jobs running on it in proportion to their CPU weights (all
equal unless a priority rule sets them, see ``specon.policy.priority``), none getting more
than ``job_cores``: what a capped job cannot use goes to the others by the same weights
(water-filling), as the kernel's fair scheduler shares a cgroup's CPU among weighted
children. A step costs ``SimParams.slowdown(r)`` times ``step_cost`` CPU-seconds, r =
``n * job_cores / capacity`` (threads per core): for single-threaded jobs
``interference * r ** interference_exponent`` once oversubscribed (r > 1; cache and
context-switch losses of time-sharing and of quota throttling), for multi-threaded ones
(``job_threads`` > 1) ``thread_overhead`` times ``interference * r ** thread_exponent``
(a thread spin-waits for a sibling the scheduler took off its core). ``SimParams()`` is
ideal sharing; ``DEFAULT_PARAMS`` holds the measured values (see there). A job alone at
full speed does ``job_cores / (step_cost * slowdown)`` steps per second.

Jobs progress continuously between events: each worker keeps one completion event (the
earliest finish among its jobs), recomputed whenever its set of jobs changes.

Samples: a job "logs" its loss at its trace's stride (job steps are mapped onto the
trace's, so a job with more steps than its trace stretches it). What it logged since the
previous tick is what Algorithm 1 reads on the next tick. Both classifiers see a tick's
samples only through ``specon.policy.monitor.aggregate_samples`` (their mean, or the last
one), so when more than ``max_samples_per_tick`` were logged they are handed over as two
values with the same mean and the same last value (computed from prefix sums in O(1)).

GPU workers and GPU jobs (``WorkerSpec.gpus``, ``JobPlan.gpu``): a GPU job's progress is
its share of its device (``specon.sim.gpu``: time-slicing, freezing, MPS, suspend and
restore costs, as measured), not of the worker's CPU; the CPU jobs share the CPU among
themselves as above.

Host failures (``specon.sim.failures``, played by ``specon.sim.hosts``): ``lose`` kills a
worker's jobs, each falling back to its last checkpoint, tracked where ``checkpoints`` is set
(else to where its current run started: a restart from scratch).

Migration cost: a moved job stops when the move is decided (saved on the source) and
runs again on the target after a downtime; no progress is lost (the job contract
checkpoints on SIGTERM). Each move draws its downtime from a log-normal law of median
``migration_downtime`` and log-spread ``downtime_spread`` (0: always the median), fitted
to measured moves (``specon/data/move_costs.json``, ``fit_downtime``); the draw is
deterministic per job, its submission time and its move number. The simulated manager
measures these downtimes and learns from them as the live one does
(``specon.policy.move_costs``). The paper reports under 5 s.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from specon.config.sections import GpuShareConfig
from specon.model import WEIGHT_DEFAULT, WorkerId
from specon.policy.monitor import MonitorState
from specon.sim.detection import ground_truth_step
from specon.sim.engine import COMPLETE, Engine, Handle
from specon.sim.failures import Checkpoints, Failures
from specon.sim.gpu import Device, GpuModel, GpuSlot, devices_of
from specon.sim.params import DEFAULT_PARAMS, SimParams, draw_downtime, fit_downtime, measured_moves
from specon.sim.trace import Trace

# The parameters live in ``specon.sim.params``; importers keep finding them here too.
__all__ = [
    "DEFAULT_PARAMS",
    "Cluster",
    "JobPlan",
    "Phase",
    "SimJob",
    "SimParams",
    "SimWorker",
    "WorkerSpec",
    "Workload",
    "draw_downtime",
    "fit_downtime",
    "gpu_fits",
    "measured_moves",
    "water_fill",
]

# A remaining run time below this (seconds) counts as finished: float round-off.
_FINISH_EPS = 1e-7


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    id: WorkerId
    cpu: float = 1.0  # cores
    gpus: int = 0  # GPU devices
    gpu_memory: int = 0  # bytes on each device
    gpu_product: str | None = None  # the GPU_PRODUCT_LABEL value (gpu_product_label's form)
    # GPU jobs one device may hold (the device plugin's time-slicing replicas): the worker
    # advertises gpus * gpu_share ``nvidia.com/gpu``.
    gpu_share: int = 1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cpu) and self.cpu > 0):
            raise ValueError(f"worker {self.id}: cpu must be > 0, got {self.cpu}")
        if self.gpus < 0 or self.gpu_share < 1 or self.gpu_memory < 0 or (self.gpus and not self.gpu_memory):
            raise ValueError(
                f"worker {self.id}: need gpus >= 0, gpu_share >= 1 and gpu_memory > 0 with gpus, "
                f"got {self.gpus}, {self.gpu_share}, {self.gpu_memory}"
            )


@dataclass(frozen=True, slots=True)
class JobPlan:
    """One job of a workload: when it arrives, what it trains and how much work it is."""

    id: str
    model: str
    submit: float
    trace: Trace
    steps: int
    step_cost: float  # CPU-seconds per step on one full core
    # Initial placement; None = the workload's round-robin by submission order.
    worker: WorkerId | None = None
    # A GPU job (1; the simulator models one-device jobs): ``step_cost`` is then seconds
    # per step alone on one GPU. ``gpu_memory``: bytes it holds on the device (0: not
    # checked); ``gpu_product``: the product it must run on (a selector); ``checkpoint``:
    # bytes a save writes (0: ``GpuParams.checkpoint_ratio`` of its memory).
    gpu: int = 0
    gpu_memory: int = 0
    gpu_product: str | None = None
    checkpoint: int = 0

    def __post_init__(self) -> None:
        if self.gpu not in (0, 1) or self.gpu_memory < 0 or self.checkpoint < 0:
            raise ValueError(
                f"job {self.id}: gpu must be 0 or 1, gpu_memory and checkpoint >= 0, "
                f"got {self.gpu}, {self.gpu_memory}, {self.checkpoint}"
            )
        if self.steps < 1:
            raise ValueError(f"job {self.id}: steps must be >= 1, got {self.steps}")
        if not (math.isfinite(self.step_cost) and self.step_cost > 0):
            raise ValueError(f"job {self.id}: step_cost must be > 0, got {self.step_cost}")
        if not (math.isfinite(self.submit) and self.submit >= 0):
            raise ValueError(f"job {self.id}: submit must be a finite time >= 0, got {self.submit}")

    @property
    def work(self) -> float:
        """Seconds of the whole job alone on one full core (a GPU job: on one GPU)."""
        return self.steps * self.step_cost


@dataclass(frozen=True, slots=True)
class Workload:
    """Workers and jobs; jobs are kept in submission order (ties by id). ``failures``: its
    hosts' failures, drawn from ``key`` (the scenario and seed)."""

    workers: tuple[WorkerSpec, ...]
    jobs: tuple[JobPlan, ...]
    failures: Failures | None = None
    key: str = ""

    def __post_init__(self) -> None:
        if not self.workers:
            raise ValueError("a workload needs at least one worker")
        wids = [w.id for w in self.workers]
        if len(set(wids)) != len(wids):
            raise ValueError("duplicate worker ids")
        jids = [j.id for j in self.jobs]
        if len(set(jids)) != len(jids):
            raise ValueError("duplicate job ids")
        unknown = {j.worker for j in self.jobs if j.worker is not None} - set(wids)
        if unknown:
            raise ValueError(f"jobs placed on unknown workers: {sorted(unknown)}")
        if self.failures is not None and (lost := {e.worker for e in self.failures.events} - set(wids)):
            raise ValueError(f"failures on unknown workers: {sorted(lost)}")
        by_id = {w.id: w for w in self.workers}
        for j in self.jobs:
            hosts = [by_id[j.worker]] if j.worker is not None else self.workers
            if j.gpu and not any(gpu_fits(w, memory=j.gpu_memory, product=j.gpu_product) for w in hosts):
                where = "no worker" if j.worker is None else f"worker {j.worker}"
                raise ValueError(f"job {j.id}: {where} can host its GPU (devices, memory, product)")
        object.__setattr__(self, "jobs", tuple(sorted(self.jobs, key=lambda j: (j.submit, j.id))))

    def placement(self) -> dict[str, WorkerId]:
        """Initial worker per job: the job's own, else round-robin by submission order
        (SPEC §8: the paper's fixed initial placement, the same for every policy)."""
        out: dict[str, WorkerId] = {}
        n = len(self.workers)
        gpu_jobs = 0  # a GPU job: round-robin over the workers that can host it
        for i, job in enumerate(self.jobs):
            if job.worker is not None:
                out[job.id] = job.worker
            elif job.gpu:
                hosts = [
                    w for w in self.workers if gpu_fits(w, memory=job.gpu_memory, product=job.gpu_product)
                ]
                out[job.id] = hosts[gpu_jobs % len(hosts)].id
                gpu_jobs += 1
            else:
                out[job.id] = self.workers[i % n].id
        return out


def gpu_fits(worker: WorkerSpec, *, memory: int, product: str | None) -> bool:
    """Whether ``worker`` could ever host a one-GPU job needing ``memory`` bytes of a GPU of
    ``product`` (None: any): what ``specon.policy.placement.fits`` checks of its labels."""
    return worker.gpus >= 1 and memory <= worker.gpu_memory and product in (None, worker.gpu_product)


class Phase(enum.Enum):
    WAITING = "waiting"  # not submitted yet
    RUNNING = "running"
    MOVING = "moving"  # saved on the source, not yet running on the target
    DONE = "done"
    LOST = "lost"  # its host died: it runs nowhere until restored or restarted


class _TraceData:
    """A trace's losses with prefix sums, shared by every job of that trace in a run, and
    the share of its steps after which it has reached 95 % of its final loss reduction
    (``specon.sim.detection.ground_truth_step``: time-to-quality, as SLAQ and Hermes measure)."""

    __slots__ = ("losses", "prefix", "quality_at")

    def __init__(self, trace: Trace) -> None:
        self.losses = trace.losses
        self.prefix = (0.0, *accumulate(trace.losses))
        self.quality_at = min(1.0, ground_truth_step(trace) / trace.steps)


@dataclass(slots=True, eq=False)
class SimJob:
    """A job's mutable state during one run (never leaves the simulator)."""

    plan: JobPlan
    data: _TraceData
    log_every: float  # job steps between two logged samples
    phase: Phase = Phase.WAITING
    worker: WorkerId | None = None  # host while running; the target while moving
    done: float = 0.0  # steps done as of ``updated``
    rate: float = 0.0  # steps per second now
    updated: float = 0.0
    logged: float = 0.0  # steps done at the previous Algorithm 1 tick
    cores: float = 0.0  # cores it gets now
    cpu: float = 0.0  # CPU-seconds used as of ``updated`` (attained service)
    moves: int = 0  # downtimes drawn so far
    fair: float = 0.0  # CPU-seconds an equal share of its workers gave it (virtual service)
    weight: float = 1.0  # its CPU weight on the worker
    quality_time: float | None = None  # when it reached 95 % of its final loss reduction
    gpu: GpuSlot | None = None  # a GPU job's state on its device
    state: MonitorState | None = None
    started: float | None = None
    finish: float | None = None
    history: list[tuple[float, str]] = field(default_factory=list)
    # Its last checkpoint: the step, when, and the CPU- (GPU-) seconds used by then.
    ckpt_step: float = 0.0
    ckpt_at: float = 0.0
    ckpt_cpu: float = 0.0

    @property
    def id(self) -> str:
        return self.plan.id


@dataclass(slots=True, eq=False)
class SimWorker:
    spec: WorkerSpec
    jobs: dict[str, SimJob] = field(default_factory=dict)  # insertion order: deterministic
    event: Handle | None = None
    devices: list[Device] = field(default_factory=list)  # its GPUs, each with its GPU jobs

    @property
    def cpu_jobs(self) -> int:
        """Jobs sharing its CPU (a GPU job's share is its device's)."""
        return len(self.jobs) - sum(len(d.jobs) for d in self.devices)

    @property
    def id(self) -> WorkerId:
        return self.spec.id


class Cluster:
    """Workers and jobs under the contention model; schedules its own completion events."""

    def __init__(
        self,
        engine: Engine,
        workload: Workload,
        params: SimParams,
        *,
        on_finish: Callable[[SimJob], None] | None = None,
        on_change: Callable[[WorkerId], None] | None = None,
        weigh: Callable[[Sequence[SimJob]], Mapping[str, float]] | None = None,
        gpu_share: GpuShareConfig | None = None,
    ) -> None:
        self.engine = engine
        self.params = params
        self.on_finish = on_finish
        # The worker's agent's priority rule: CPU weights for a worker's jobs, asked
        # whenever the worker's jobs change and by ``reweigh`` (None: equal weights).
        self.weigh = weigh
        # Called whenever a worker's set of running jobs changes (its usage may change).
        self.on_change = on_change
        self.workers = {w.id: SimWorker(w, devices=devices_of(w)) for w in workload.workers}
        # The agents' GPU sharing (``gpu_share``: the policy's ``gpu`` section; None: no agent).
        self.gpu = GpuModel(params.gpu, gpu_share)
        cache: dict[int, _TraceData] = {}
        self.jobs: dict[str, SimJob] = {}
        for plan in workload.jobs:
            data = cache.get(id(plan.trace))
            if data is None:
                data = cache[id(plan.trace)] = _TraceData(plan.trace)
            log_every = plan.trace.stride * plan.steps / plan.trace.steps
            job = self.jobs[plan.id] = SimJob(plan, data, log_every)
            if plan.gpu:
                ckpt = plan.checkpoint or round(plan.gpu_memory * params.gpu.checkpoint_ratio)
                job.gpu = GpuSlot(plan.gpu_memory, ckpt)
        self.unfinished = len(self.jobs)
        self._live: dict[str, SimJob] = {}  # running or moving
        # The jobs' checkpoint schedule, where a loss falls back to it (None: not tracked).
        self.checkpoints: Checkpoints | None = None
        self.restored = 0  # lost jobs started again

    # -- contention --------------------------------------------------------------------
    def _settle(self, w: SimWorker) -> None:
        """Bring every job on ``w`` up to now at its current rate."""
        now = self.engine.now
        n = w.cpu_jobs
        fair = min(self.params.job_cores, w.spec.cpu / n) if n else 0.0
        law = self.checkpoints
        for job in w.jobs.values():
            dt = now - job.updated
            job.fair += (fair if job.gpu is None else job.gpu.fair) * dt
            before = job.done
            since = (job.ckpt_step, job.ckpt_at)
            if law is not None and (ck := law.last(since, t0=job.updated, s0=before, rate=job.rate, now=now)):
                job.ckpt_step, job.ckpt_at = min(ck[0], job.plan.steps), ck[1]
                job.ckpt_cpu = job.cpu + job.cores * (ck[1] - job.updated)
            job.done = min(job.plan.steps, before + job.rate * dt)
            if job.quality_time is None and job.done >= (q := job.data.quality_at * job.plan.steps):
                # The rate was constant since ``updated``: the crossing is exact.
                job.quality_time = job.updated + (q - before) / job.rate if job.rate > 0 else now
            job.cpu += job.cores * dt
            job.updated = now

    def _rerate(self, w: SimWorker) -> None:
        """New rates for ``w``'s jobs after its set changed; reschedule its completion."""
        if w.event is not None:
            w.event.cancel()
            w.event = None
        if self.on_change is not None:
            self.on_change(w.id)
        n = len(w.jobs)
        if n == 0:
            return
        p = self.params
        jobs = list(w.jobs.values())
        first = math.inf
        if w.devices:
            first = self._rerate_gpus(w)
            jobs = [j for j in jobs if j.gpu is None]
            n = len(jobs)
        if n == 0:
            self._schedule(w, first)
            return
        if self.weigh is not None:
            weights = self.weigh(jobs)
            for job in jobs:
                job.weight = weights[job.id]
        shares = water_fill(w.spec.cpu, [j.weight for j in jobs], p.job_cores)
        slowdown = p.slowdown(n * p.job_cores / w.spec.cpu)
        for job, cores in zip(jobs, shares, strict=True):
            job.cores = cores
            job.rate = cores / (job.plan.step_cost * slowdown)
            if job.rate > 0:
                first = min(first, (job.plan.steps - job.done) / job.rate)
        self._schedule(w, first)

    def _schedule(self, w: SimWorker, first: float) -> None:
        """``w``'s next event ``first`` seconds from now: a finish, or a GPU job's restore."""
        if math.isinf(first):
            return
        w.event = self.engine.at(
            self.engine.now + max(first, 0.0), lambda: self._complete(w), priority=COMPLETE
        )

    def _gpu_weights(self, w: SimWorker, dev: Device) -> dict[str, int]:
        """The agent's priority rule over the jobs sharing ``dev`` (equal without one)."""
        if self.weigh is None:
            return dict.fromkeys(dev.jobs, WEIGHT_DEFAULT)
        got = self.weigh([w.jobs[j] for j in dev.jobs])
        return {j: round(got[j]) for j in dev.jobs}

    def _rerate_gpus(self, w: SimWorker) -> float:
        """Apply the sharing decision on each of ``w``'s devices and rate its GPU jobs;
        seconds until the first of them finishes or a restoring one starts to run."""
        now, first = self.engine.now, math.inf
        for dev in w.devices:
            if not dev.jobs:
                continue
            weights = self._gpu_weights(w, dev)
            self.gpu.replan(dev, weights, now)
            first = min(first, self.gpu.rate(dev, now) - now)
            for jid, slot in dev.jobs.items():
                job = w.jobs[jid]
                job.weight = weights[jid]
                job.cores = slot.share  # its attained service counts GPU-seconds
                job.rate = slot.share / job.plan.step_cost
                if job.rate > 0:
                    first = min(first, (job.plan.steps - job.done) / job.rate)
        return first

    def reweigh(self, worker: WorkerId) -> None:
        """Ask the priority rule again (its inputs moved on: steps, CPU used, losses)."""
        w = self.workers[worker]
        if w.jobs and any(d.jobs for d in w.devices) and (self.weigh is not None or self.gpu.planned):
            # The sharing decision moves with time too (its quantum): planned every tick.
            self._settle(w)
            self._rerate(w)
            return
        if self.weigh is None or not w.jobs:
            return
        weights = self.weigh(list(w.jobs.values()))
        if all(weights[j.id] == j.weight for j in w.jobs.values()):
            return  # same shares, same rates: nothing to recompute
        self._settle(w)
        self._rerate(w)

    def _complete(self, w: SimWorker) -> None:
        w.event = None
        self._settle(w)
        now = self.engine.now
        finished = [j for j in w.jobs.values() if (j.plan.steps - j.done) <= j.rate * _FINISH_EPS]
        for job in finished:
            del w.jobs[job.id]
            if job.gpu is not None:
                self.gpu.detach(w.devices, job.id, job.gpu)
            job.done = job.plan.steps
            job.rate = job.cores = 0.0
            if job.quality_time is None:
                job.quality_time = now
            job.phase = Phase.DONE
            job.finish = now
            self.unfinished -= 1
            del self._live[job.id]
        self._rerate(w)
        if self.on_finish is not None:
            for job in finished:
                self.on_finish(job)

    # -- placement ---------------------------------------------------------------------
    def start(self, job: SimJob, worker: WorkerId) -> None:
        """Run ``job`` on ``worker`` from its current step."""
        w = self.workers[worker]
        self._settle(w)
        now = self.engine.now
        self.restored += job.phase is Phase.LOST
        job.phase = Phase.RUNNING
        job.worker = worker
        job.updated = now
        job.rate = 0.0
        # A run starts from a checkpoint (or from scratch) and counts its interval from now.
        job.ckpt_step, job.ckpt_at, job.ckpt_cpu = job.done, now, job.cpu
        if job.started is None:
            job.started = now
            self._live[job.id] = job
        job.history.append((now, worker))
        w.jobs[job.id] = job
        if job.gpu is not None:
            dev = self.gpu.attach(w.devices, job.id, job.gpu, now)
            self.gpu.started(dev, job.id, self._gpu_weights(w, dev))
        self._rerate(w)

    def suspend(self, job: SimJob) -> None:
        """Stop ``job`` (saved on its worker); it keeps the steps it has done."""
        if job.phase is not Phase.RUNNING or job.worker is None:
            raise ValueError(f"job {job.id} is not running")
        w = self.workers[job.worker]
        self._settle(w)
        del w.jobs[job.id]
        if job.gpu is not None:
            self.gpu.detach(w.devices, job.id, job.gpu)
        job.rate = job.cores = 0.0
        job.phase = Phase.MOVING
        self._rerate(w)

    def lose(self, worker: WorkerId, *, from_scratch: bool = False) -> list[tuple[SimJob, float, float]]:
        """``worker``'s host dies: its running jobs fall back to their last checkpoint (to step 0
        ``from_scratch``) and run nowhere (``LOST``), as do the jobs restoring onto it; each
        with the steps it lost and the CPU- (GPU-) seconds spent on them since that point (on
        its current run, ``from_scratch``)."""
        w = self.workers[worker]
        self._settle(w)
        out = []
        for job in list(w.jobs.values()):
            del w.jobs[job.id]
            if job.gpu is not None:
                self.gpu.detach(w.devices, job.id, job.gpu)
            kept = 0.0 if from_scratch else job.ckpt_step
            out.append((job, job.done - kept, job.cpu - job.ckpt_cpu))
            job.done = kept
            job.logged = min(job.logged, job.done)  # it logs those steps' losses again
            if job.quality_time is not None and job.done < job.data.quality_at * job.plan.steps:
                job.quality_time = None
        out += [(j, 0.0, 0.0) for j in self._live.values() if j.phase is Phase.MOVING and j.worker == worker]
        for job, _, _ in out:
            job.phase, job.worker, job.rate, job.cores = Phase.LOST, None, 0.0, 0.0
        self._rerate(w)
        return out

    def downtime(self, job: SimJob) -> float:
        """The downtime of ``job``'s next move (``draw_downtime``)."""
        job.moves += 1
        if job.gpu is not None:
            return self.params.gpu.move_downtime(job.gpu.checkpoint)
        return draw_downtime(self.params, job.id, job.plan.submit, job.moves)

    def move(self, job: SimJob, target: WorkerId, on_arrived: Callable[[SimJob], None]) -> None:
        """Save ``job`` now; it runs on ``target`` after its move's downtime."""
        if target not in self.workers:
            raise ValueError(f"unknown worker {target}")
        self.suspend(job)
        job.worker = target

        def arrive() -> None:
            self.start(job, target)
            on_arrived(job)

        self.engine.after(self.downtime(job), arrive, priority=COMPLETE)

    # -- observation -------------------------------------------------------------------
    def steps_now(self, job: SimJob) -> float:
        if job.phase is not Phase.RUNNING:
            return job.done
        return min(job.plan.steps, job.done + job.rate * (self.engine.now - job.updated))

    def take_samples(self, job: SimJob) -> list[float]:
        """The losses ``job`` logged since the previous call (see the module docstring)."""
        now_steps = self.steps_now(job)
        every = job.log_every
        first = math.floor(job.logged / every) + 1
        last = math.floor(now_steps / every + 1e-9)
        job.logged = now_steps
        if last < first:
            return []
        data = job.data
        top = len(data.losses)
        count = last - first + 1
        if count <= self.params.max_samples_per_tick:
            return [data.losses[min(i, top) - 1] for i in range(first, last + 1)]
        # Records past the end of the trace repeat its last value.
        real_hi = min(last, top)
        n_real = max(0, real_hi - first + 1)
        total = (data.prefix[real_hi] - data.prefix[first - 1] if n_real else 0.0) + (
            count - n_real
        ) * data.losses[top - 1]
        final = data.losses[real_hi - 1]
        return [2.0 * total / count - final, final]

    def cpu_now(self, job: SimJob) -> float:
        """CPU-seconds ``job`` has used so far."""
        return job.cpu + job.cores * (self.engine.now - job.updated)

    def usage(self, worker: WorkerId) -> float:
        """R(w, t): the share of the worker's CPU its running jobs use, in [0, 1]; on a GPU
        worker, the share of its devices in use where that is more."""
        w = self.workers[worker]
        cpu = min(1.0, w.cpu_jobs * self.params.job_cores / w.spec.cpu)
        if not w.devices:
            return cpu
        return max(cpu, sum(1 for d in w.devices if d.jobs) / len(w.devices))

    def live(self) -> list[SimJob]:
        """Running or moving jobs, in the order they first started."""
        return list(self._live.values())


def water_fill(capacity: float, weights: Sequence[float], cap: float) -> list[float]:
    """Cores per job: ``capacity`` split by ``weights`` (> 0), none over ``cap``, what a capped
    job cannot use shared again by the same weights among the rest."""
    n = len(weights)
    if n and min(weights) == max(weights):  # equal weights: the plain fair share
        return [min(cap, capacity / n)] * n
    shares = [0.0] * n
    open_ = list(range(len(weights)))
    left = capacity
    while open_ and left > 1e-12:
        total = sum(weights[i] for i in open_)
        capped = [i for i in open_ if left * weights[i] / total >= cap]
        if not capped:
            for i in open_:
                shares[i] = left * weights[i] / total
            break
        for i in capped:
            shares[i] = cap
        left -= cap * len(capped)
        open_ = [i for i in open_ if i not in capped]
    return shares
