"""An event-driven simulation of async-SGD jobs on a cluster (MB-ASGD Section V-B; pure, seeded).

``nodes`` one-GPU nodes; Poisson arrivals at ``load = lambda E[S(1)] / n`` (``S(1)`` a job's
service time with one worker, ``mva``'s reference); each job one of ``models`` drawn uniformly,
its size from ``dnn``. The policy (``allocation``) runs at every arrival and departure:
malleable policies reassign every node, moldable ones start waiting jobs on free nodes and
never change a running job's count. Reassigning is free (the paper's assumption; the
checkpoint cost is not modelled). A job runs at ``X(w - 1)`` steps per second on ``w`` nodes.

Measured: jobs ``warmup * jobs`` to ``jobs`` in arrival order (arrivals go on after them at
the same rate until every measured job has finished, so the last see the same load). For each,
its response time and its time to ``mark`` (40 %) of its steps (Fig. 14).

Stability: a run is **unstable** when (a) the number in system reaches ``cap`` (default
``3 * nodes``; the run stops there), or (b) it keeps growing: the time-average number in
system over the last third of the arrival horizon exceeds the middle third's by more than
``max(GROWTH_FLOOR, GROWTH_RATIO * middle)``. A stable queue's thirds have the same mean;
one that is overloaded grows linearly, so its last third is about 5/3 of its middle third.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field

from specon.sim.asgd.allocation import JobView, Settings, SpeedCurve, allocate
from specon.sim.asgd.dnn import TABLE_III, DnnModel
from specon.sim.asgd.mva import Method, check_method

GROWTH_RATIO = 0.3
GROWTH_FLOOR = 5.0
MAX_NODES = 10_000
HOUR = 3600.0
# Arrivals past this many horizons with measured jobs left: the run is not draining.
MAX_HORIZONS = 4


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated run."""

    settings: Settings = field(default_factory=Settings)
    load: float = 0.5
    models: tuple[DnnModel, ...] = TABLE_III
    nodes: int = 100
    jobs: int = 2000  # arrivals in the horizon
    warmup: float = 0.1  # fraction of the horizon's first arrivals not measured
    seed: int = 0
    method: Method = "hybrid"
    mark: float = 0.4  # fraction of a job whose time is measured too (Fig. 14)
    cap: int | None = None  # jobs in system that end the run as unstable (default 5 * nodes)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.load) and 0.0 < self.load <= 10.0):
            raise ValueError(f"load must be in (0, 10], got {self.load}")
        if not self.models:
            raise ValueError("models must name at least one model")
        if (
            isinstance(self.nodes, bool)
            or not isinstance(self.nodes, int)
            or not 2 <= self.nodes <= MAX_NODES
        ):
            raise ValueError(f"nodes must be a whole number from 2 to {MAX_NODES}, got {self.nodes!r}")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 10:
            raise ValueError(f"jobs must be a whole number of at least 10, got {self.jobs!r}")
        if not (0.0 <= self.warmup < 0.9):
            raise ValueError(f"warmup must be in [0, 0.9), got {self.warmup}")
        if not (0.0 < self.mark < 1.0):
            raise ValueError(f"mark must be in (0, 1), got {self.mark}")
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"cap must be at least 1, got {self.cap}")
        check_method(self.method)

    @property
    def in_system_cap(self) -> int:
        return self.cap if self.cap is not None else 3 * self.nodes


@dataclass(frozen=True, slots=True)
class SimResult:
    """What one run measured (times in hours)."""

    config: SimConfig
    responses: tuple[float, ...]  # measured jobs that finished, arrival order
    to_mark: tuple[float, ...]  # their times to ``mark`` of their steps
    stable: bool
    reason: str  # why unstable ("" when stable)
    mean_in_system: float  # time-average over the arrival horizon
    thirds: tuple[float, float, float]  # time-average number in system per third
    utilisation: float  # mean fraction of nodes allocated
    events: int

    @property
    def mean_response(self) -> float:
        return statistics.fmean(self.responses) if self.responses else math.nan

    @property
    def mean_to_mark(self) -> float:
        return statistics.fmean(self.to_mark) if self.to_mark else math.nan


class _Job:
    __slots__ = ("arrival", "curve", "id", "mark_at", "nodes", "remaining", "total")

    def __init__(self, jid: int, arrival: float, total: int, curve: SpeedCurve) -> None:
        self.id = jid
        self.arrival = arrival
        self.total = float(total)
        self.remaining = float(total)
        self.curve = curve
        self.nodes = 0
        self.mark_at = math.nan


def mean_service_one_worker(models: tuple[DnnModel, ...], curves: dict[str, SpeedCurve]) -> float:
    """``E[S(1)]`` in seconds: a uniformly drawn job's mean size on one worker."""
    return statistics.fmean(m.mean_steps * curves[m.name].ref for m in models)


def curves_for(models: tuple[DnnModel, ...], nodes: int, method: Method) -> dict[str, SpeedCurve]:
    """Each model's speed curve on up to ``nodes`` nodes."""
    return {m.name: SpeedCurve.from_times(m.service_times(), nodes, method) for m in models}


def simulate(cfg: SimConfig, curves: dict[str, SpeedCurve] | None = None) -> SimResult:
    """Run ``cfg`` to the end of its measured jobs (or to instability)."""
    curves = curves if curves is not None else curves_for(cfg.models, cfg.nodes, cfg.method)
    rng = random.Random(cfg.seed)
    rate = cfg.load * cfg.nodes / mean_service_one_worker(cfg.models, curves)
    first, last = int(cfg.warmup * cfg.jobs), cfg.jobs
    cap = cfg.in_system_cap

    now = 0.0
    next_arrival = rng.expovariate(rate)
    arrived = 0
    active: list[_Job] = []
    responses: dict[int, float] = {}
    marks: dict[int, float] = {}
    area = [0.0, 0.0, 0.0]  # number-in-system x time, per third of the arrival horizon
    span = [0.0, 0.0, 0.0]
    busy_area = total_time = 0.0
    horizon_end = math.inf  # the time of arrival ``jobs``
    events = 0
    reason = ""

    while True:
        if len(active) >= cap:
            reason = f"{len(active)} jobs in system reached the cap of {cap}"
            break
        done_measured = arrived >= last and all(j.id < first or j.id >= last for j in active)
        if done_measured:
            break
        if arrived > MAX_HORIZONS * cfg.jobs:
            reason = "measured jobs still running after many horizons of arrivals"
            break
        # Allocate, then advance to the next arrival or departure.
        events += 1
        views = [JobView(j.id, j.remaining, j.curve, 1.0 - j.remaining / j.total, j.nodes) for j in active]
        alloc = allocate(views, cfg.nodes, cfg.settings, cfg.load)
        speeds: list[float] = []
        for j in active:
            j.nodes = alloc[j.id]
            speeds.append(1.0 / float(j.curve.step_time[j.nodes]) if j.nodes else 0.0)
        t_done, first_done = math.inf, -1
        for i, (j, sp) in enumerate(zip(active, speeds, strict=True)):
            if sp > 0 and j.remaining / sp < t_done:
                t_done, first_done = j.remaining / sp, i
        departure = t_done < next_arrival - now
        dt = t_done if departure else next_arrival - now
        # Accounting over [now, now + dt].
        if now < horizon_end:
            seg = min(dt, horizon_end - now)
            third = min(2, 3 * arrived // cfg.jobs)
            area[third] += len(active) * seg
            span[third] += seg
        busy_area += sum(j.nodes for j in active) * dt
        total_time += dt
        left_share = 1.0 - cfg.mark
        for j, sp in zip(active, speeds, strict=True):
            if sp <= 0:
                continue
            before = j.remaining
            j.remaining = before - sp * dt
            if math.isnan(j.mark_at) and j.remaining <= left_share * j.total:
                j.mark_at = now + (before - left_share * j.total) / sp
        now += dt
        if departure:
            active[first_done].remaining = 0.0
            gone = {j.id for j in active if j.remaining <= 1e-9 * j.total}
            for j in active:
                if j.id in gone and first <= j.id < last:
                    responses[j.id] = (now - j.arrival) / HOUR
                    marks[j.id] = (j.mark_at - j.arrival) / HOUR
            active = [j for j in active if j.id not in gone]
        else:
            model = cfg.models[rng.randrange(len(cfg.models))]
            active.append(_Job(arrived, now, model.draw_steps(rng), curves[model.name]))
            arrived += 1
            if arrived == cfg.jobs:
                horizon_end = now
            next_arrival = now + rng.expovariate(rate)

    thirds = tuple(a / s if s > 0 else 0.0 for a, s in zip(area, span, strict=True))
    th = (thirds[0], thirds[1], thirds[2])
    if not reason:
        growth = th[2] - th[1]
        if growth > max(GROWTH_FLOOR, GROWTH_RATIO * th[1]):
            reason = f"jobs in system grew from {th[1]:.1f} to {th[2]:.1f} (middle to last third)"
    order = sorted(responses)
    return SimResult(
        config=cfg,
        responses=tuple(responses[i] for i in order),
        to_mark=tuple(marks[i] for i in order),
        stable=not reason,
        reason=reason,
        mean_in_system=sum(area) / sum(span) if sum(span) > 0 else 0.0,
        thirds=th,
        utilisation=busy_area / (cfg.nodes * total_time) if total_time > 0 else 0.0,
        events=events,
    )


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def confidence(values: list[float] | tuple[float, ...], batches: int = 10) -> float:
    """Half-width of a 95 % interval of the mean: by batch means when given one run's jobs
    (``batches`` consecutive groups, the jobs of one run being correlated)."""
    vals = [v for v in values if math.isfinite(v)]
    if len(vals) < 2:
        return math.nan
    if len(vals) > 2 * batches:
        size = len(vals) // batches
        vals = [statistics.fmean(vals[i * size : (i + 1) * size]) for i in range(batches)]
    df = len(vals) - 1
    t = T95.get(df, 2.0 if df < 30 else 1.96)
    return t * statistics.stdev(vals) / math.sqrt(len(vals))
