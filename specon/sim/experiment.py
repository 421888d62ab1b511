"""Run a scenario over seeds and policies on identical workloads; summarise with 95 % CIs.

Every seed builds one workload; every policy runs on it, and is compared with DS on that
same seed (``specon.evaluation.compare``). ``bound`` is computed, not run. Means over
seeds come with the half-width of a two-sided 95 % confidence interval from Student's t
(``t95``; a small table, so scipy is not needed).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from specon.config import Policy
from specon.evaluation import RunResult, compare
from specon.sim.cluster import DEFAULT_PARAMS, SimParams, Workload
from specon.sim.policies import POLICIES, Bound, lower_bound, make_policy
from specon.sim.runner import simulate
from specon.sim.scenarios import TABLE_III, PaperNumbers, Scenario
from specon.sim.trace import Trace

# Two-sided 95 % quantiles of Student's t by degrees of freedom (1..30), then sparse.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_T95_TAIL = ((40, 2.021), (60, 2.000), (120, 1.980))


def t95(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T95):
        return _T95[df - 1]
    for limit, value in _T95_TAIL:
        if df <= limit:
            return value
    return 1.960


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 95 % CI half-width (0 for a single value; NaN mean for none)."""
    if not values:
        return math.nan, math.nan
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, 0.0
    return m, t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


# The per-run figures summarised for every policy, in report order.
METRICS = (
    "avg_jct",
    "makespan",
    "avg_jct_reduction",
    "makespan_reduction",
    "jobs_improved",
    "best_reduction",
    "worst_slowdown",
    "ttq_reduction",
    "migrations",
    "rebalances",
)
# Summarised too where hosts fail (``specon.sim.failures.LostWork``): per run, hosts lost, jobs
# they hit, steps trained and lost, CPU- (GPU-) seconds spent on those, jobs brought back.
FAILURE_METRICS = ("hosts_lost", "jobs_lost", "lost_steps", "lost_seconds", "recoveries")


@dataclass(frozen=True, slots=True)
class Summary:
    """Mean and CI half-width of each of ``METRICS`` (and ``FAILURE_METRICS``, where hosts
    failed) over the seeds."""

    mean: Mapping[str, float]
    ci95: Mapping[str, float]
    seeds: int
    # The largest value over the seeds (the worst job's slowdown is a promise, not an average).
    high: Mapping[str, float] = field(default_factory=dict)

    @property
    def metrics(self) -> tuple[str, ...]:
        """The figures it summarises, in report order."""
        return METRICS + tuple(k for k in FAILURE_METRICS if k in self.mean)


def summarise(rows: Sequence[Mapping[str, float | None]]) -> Summary:
    mean: dict[str, float] = {}
    ci: dict[str, float] = {}
    high: dict[str, float] = {}
    failed = any("lost_steps" in r for r in rows)
    for key in METRICS + (FAILURE_METRICS if failed else ()):
        values = [v for r in rows if (v := r.get(key)) is not None]
        mean[key], ci[key] = mean_ci(values)
        high[key] = max(values, default=math.nan)
    return Summary(mean, ci, len(rows), high)


def run_figures(ds: RunResult, run: RunResult) -> dict[str, float | None]:
    c = compare(ds, run)
    lost = run.meta.get("failures", {})
    return {
        **{k: float(lost[k]) for k in FAILURE_METRICS if k in lost},
        "avg_jct": run.avg_jct,
        "makespan": run.makespan,
        "avg_jct_reduction": c.avg_jct_reduction,
        "makespan_reduction": c.makespan_reduction,
        "jobs_improved": c.jobs_improved,
        "best_reduction": c.best_reduction,
        "worst_slowdown": c.worst_slowdown,
        "ttq_reduction": c.ttq_reduction,
        "migrations": float(len(run.migrations)),
        "rebalances": float(c.rebalances),
    }


def bound_figures(ds: RunResult, bound: Bound) -> dict[str, float | None]:
    """The bound's figures against DS. Its jobs_improved and best_reduction are upper
    bounds too: the share of jobs that could beat DS at all, and the most one could gain."""
    base = {j.id: j.jct for j in ds.jobs}
    gains = [(b - bound.job_min[i]) / b for i, b in base.items() if b is not None and b > 0]
    ds_avg, ds_span = ds.avg_jct, ds.makespan
    return {
        "avg_jct": bound.avg_jct,
        "makespan": bound.makespan,
        "avg_jct_reduction": None if not ds_avg else (ds_avg - bound.avg_jct) / ds_avg,
        "makespan_reduction": None if not ds_span else (ds_span - bound.makespan) / ds_span,
        "jobs_improved": sum(g > 1e-9 for g in gains) / len(gains) if gains else None,
        "best_reduction": max(gains) if gains else None,
        "worst_slowdown": None,
        "ttq_reduction": None,
        "migrations": 0.0,
        "rebalances": 0.0,
    }


@dataclass(frozen=True, slots=True)
class PointResult:
    """One (alpha, interval, weights) setting of a scenario, all seeds."""

    alpha: float
    interval: float
    summaries: Mapping[str, Summary]
    # Per policy, one run per seed (``bound`` has none); kept for plots.
    runs: Mapping[str, tuple[RunResult, ...]] = field(default_factory=dict)
    paper: PaperNumbers | None = None


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    scenario: Scenario
    seeds: tuple[int, ...]
    policies: tuple[str, ...]
    weights: tuple[float, float, float] | None
    params: SimParams
    main: PointResult
    sweep: tuple[PointResult, ...] = ()
    seconds: float = 0.0


Progress = Callable[[str], None]


def run_point(
    workloads: Sequence[Workload],
    *,
    policies: Sequence[str],
    alpha: float,
    interval: float,
    weights: Sequence[float] | None = None,
    params: SimParams = DEFAULT_PARAMS,
    paper: PaperNumbers | None = None,
    label: str = "",
    progress: Progress | None = None,
    base: Policy | None = None,
) -> PointResult:
    """Every policy of ``policies`` (DS always runs: the others are compared with it) on
    every workload; ``base`` replaces the ``specon`` policy's defaults (``make_policy``)."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown} (known: {', '.join(POLICIES)})")
    sims = {
        name: make_policy(name, alpha=alpha, interval=interval, weights=weights, base=base)
        for name in policies
        if name != "bound"
    }
    sims.setdefault("ds", make_policy("ds"))
    rows: dict[str, list[dict[str, float | None]]] = {p: [] for p in ("ds", *policies)}
    runs: dict[str, list[RunResult]] = {p: [] for p in sims}
    for k, workload in enumerate(workloads, start=1):
        t0 = time.process_time()
        ds = simulate(workload, sims["ds"], params=params)
        for name, sim in sims.items():
            run = ds if name == "ds" else simulate(workload, sim, params=params)
            runs[name].append(run)
            rows[name].append(run_figures(ds, run))
        if "bound" in policies:
            rows["bound"].append(bound_figures(ds, lower_bound(workload, params)))
        if progress is not None:
            progress(f"{label}seed {k}/{len(workloads)} done ({time.process_time() - t0:.2f} s CPU)")
    return PointResult(
        alpha=alpha,
        interval=interval,
        summaries={name: summarise(r) for name, r in rows.items()},
        runs={name: tuple(r) for name, r in runs.items()},
        paper=paper,
    )


def run_scenario(
    scenario: Scenario,
    traces: Mapping[str, Sequence[Trace]],
    *,
    policies: Sequence[str] = POLICIES,
    seeds: int = 10,
    alpha: float | None = None,
    interval: float | None = None,
    weights: Sequence[float] | None = None,
    params: SimParams = DEFAULT_PARAMS,
    sweep: bool | None = None,
    progress: Progress | None = None,
    base: Policy | None = None,
) -> ScenarioResult:
    """``scenario`` over seeds 0..seeds-1. The main point uses ``alpha``/``interval`` (or the
    scenario's); a scenario with a sweep (A2) also runs every point of it unless alpha or interval
    was given (``sweep`` forces either way). ``base``: see ``run_point``."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    started = time.process_time()
    seed_list = tuple(range(seeds))
    workloads = [scenario.workload(s, traces) for s in seed_list]
    a = scenario.alpha if alpha is None else alpha
    d = scenario.interval if interval is None else interval
    w = None if weights is None else (float(weights[0]), float(weights[1]), float(weights[2]))
    do_sweep = bool(scenario.sweep) and (alpha is None and interval is None) if sweep is None else sweep
    points: list[PointResult] = []
    main: PointResult | None = None
    if do_sweep and scenario.sweep:
        for pa, pd in scenario.sweep:
            point = run_point(
                workloads,
                policies=policies,
                alpha=pa,
                interval=pd,
                weights=w,
                params=params,
                paper=TABLE_III.get((pa, pd)),
                label=f"[{scenario.name} alpha={pa:g} interval={pd:g}s] ",
                progress=progress,
                base=base,
            )
            points.append(point)
            if (pa, pd) == (a, d):
                main = point
    if main is None:
        main = run_point(
            workloads,
            policies=policies,
            alpha=a,
            interval=d,
            weights=w,
            params=params,
            paper=TABLE_III.get((a, d)) if scenario.sweep else scenario.paper,
            label=f"[{scenario.name}] ",
            progress=progress,
            base=base,
        )
    return ScenarioResult(
        scenario=scenario,
        seeds=seed_list,
        policies=tuple(dict.fromkeys(("ds", *policies))),
        weights=w,
        params=params,
        main=main,
        sweep=tuple(points),
        seconds=time.process_time() - started,
    )
