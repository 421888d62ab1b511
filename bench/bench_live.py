"""Real runs: DS, the live balancer and the default on the same arrivals, several seeds.

Each seed is one workload (``specon.demo.make_workload``: random models, arrivals uniform in
[0, WINDOW] s) run for real on the embedded default (``specon.demo.run_once``: W workers with
a cgroup CPU budget each, real PyTorch jobs, a real manager and agents over loopback HTTP)
once per policy. The order of the policies rotates from seed to seed (seed 0: ds, balancer,
specon; seed 1: balancer, specon, ds; ...) so that a drift of the machine over the run
favours none of them. The machine's load average before each run is recorded beside it.

Figures, per policy: average JCT (mean over the seeds, and its spread: min-max), its change
against DS on the same seed (mean, min-max), makespan, time-to-quality and the slowest job
against DS; the simulator's prediction of each policy's average JCT on the same workloads
(``specon.sim.calibration.sim_workload``, measured start-up CPU, and each model's CPU per
step measured on this machine before the runs: the traces' were recorded on another day,
and this machine's speed drifts between sessions) and its gap; the targets:
the default >= 15 % faster than DS and faster than the balancer, the simulator within 10 %.
``quick``: one seed, two policies (DS and the default).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.bench_calibration import measure_sharing, run_sim
from bench.figures import Figure
from specon import logs
from specon.config import policy_to_yaml
from specon.demo import DemoJob, make_workload, run_once
from specon.evaluation import RunResult, compare
from specon.live_policies import live_policy
from specon.sim.cluster import DEFAULT_PARAMS
from specon.sim.trace import load_traces
from specon.workloads.registry import WORKLOADS

WORKERS = 2
CPUS = 0.5
JOBS = 6
WINDOW = 20.0
STEP_SCALE = 0.35
SPREAD = 0.5  # each job's steps x uniform [1 - SPREAD, 1 + SPREAD]
SEEDS = {False: (1, 2, 3), True: (1,)}
POLICIES = {False: ("ds", "balancer", "specon"), True: ("ds", "specon")}
DEADLINE = 900.0
# CPU-seconds a job spends before its first step: the demo forks its jobs from a warm
# interpreter per worker, measured by `python -m bench bench_restore` at 0.04-0.56 per model
# (mean 0.34; a fresh interpreter's 2.06).
STARTUP_CPU = 0.34
TARGET_REDUCTION = 15.0  # %
COST_WINDOW = 6.0  # seconds of training per model when measuring the machine's step costs
GAP_TARGET = 10.0  # %
RESULTS = Path(__file__).resolve().parent / "results"


def _jobs(seed: int) -> list[DemoJob]:
    return make_workload(
        jobs=JOBS,
        window=WINDOW,
        seed=seed,
        steps=lambda m: max(50, int(WORKLOADS[m].steps * STEP_SCALE)),
        spread=SPREAD,
    )


def _order(policies: Sequence[str], i: int) -> list[str]:
    k = i % len(policies)
    return [*policies[k:], *policies[:k]]


def _run(jobs: Sequence[DemoJob], name: str, root: Path) -> RunResult:
    policy = None
    if name != "ds":
        policy = root / f"{name}.yaml"
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(policy_to_yaml(live_policy(name)), encoding="utf-8")
    return asyncio.run(
        run_once(
            jobs,
            root=root / name,
            workers=WORKERS,
            cpus_per_worker=CPUS,
            with_specon=policy is not None,
            policy=policy,
            say=lambda line: None,
            deadline=DEADLINE,
            label=name,
        )
    )


def _sim(jobs: Sequence[DemoJob], name: str, costs: Mapping[str, float]) -> RunResult:
    return run_sim(
        jobs,
        policy=name,
        params=DEFAULT_PARAMS,
        startup=STARTUP_CPU,
        workers=WORKERS,
        cpus=CPUS,
        step_costs=costs,
    )


def _step_costs(root: Path, models: Sequence[str]) -> dict[str, float]:
    """Each model's CPU-seconds per step on this machine now: one job alone on a one-core
    worker, by the worker's CPU accounting (``bench_calibration.measure_sharing``)."""
    return {
        m: asyncio.run(
            measure_sharing(root / f"cost-{m}", k=1, cpus=1.0, window=COST_WINDOW, model=m)
        ).cpu_per_step
        for m in models
    }


def _spread(xs: Sequence[float]) -> str:
    return f"min {min(xs):.1f}, max {max(xs):.1f}" + (
        f", sd {statistics.stdev(xs):.1f}" if len(xs) > 1 else ""
    )


def run(quick: bool) -> list[Figure]:
    logs.configure(level="warning", fmt="console")
    seeds, policies = SEEDS[quick], POLICIES[quick]
    real: dict[str, list[RunResult]] = {p: [] for p in policies}
    sims: dict[str, list[RunResult]] = {p: [] for p in policies}
    loads: list[str] = []
    with tempfile.TemporaryDirectory(prefix="specon-bench-live-") as tmp:
        # The simulator's twin needs this machine's speed today, not the traces' day's.
        models = sorted({j.model for seed in seeds for j in _jobs(seed)})
        costs = _step_costs(Path(tmp), models)
        recorded = {m: statistics.fmean(t.step_cost for t in ts) for m, ts in load_traces().items()}
        now = ", ".join(f"{m} {c * 1e3:.1f} ms ({recorded[m] * 1e3:.1f})" for m, c in costs.items())
        print(f"  [bench_live] CPU per step now (traces): {now}", flush=True)
        for i, seed in enumerate(seeds):
            jobs = _jobs(seed)
            for name in _order(policies, i):
                load = os.getloadavg()[0]
                t0 = time.monotonic()
                result = _run(jobs, name, Path(tmp) / f"seed{seed}")
                real[name].append(result)
                loads.append(f"seed {seed} {name}: load {load:.2f}, {time.monotonic() - t0:.0f} s")
                print(f"  [bench_live] seed {seed} {name}: avg JCT {result.avg_jct or 0:.1f} s "
                      f"(load before {load:.2f})", flush=True)  # fmt: skip
            for name in policies:
                sims[name].append(_sim(jobs, name, costs))
    figures: list[Figure] = [
        Figure(
            "machine speed: CPU per step now / the traces' (mean over models)",
            statistics.fmean(costs[m] / recorded[m] for m in costs),
            "x",
            detail=", ".join(f"{m} {costs[m] * 1e3:.1f} ms vs {recorded[m] * 1e3:.1f}" for m in costs)
            + "; the simulator's twin uses the costs measured now",
        )
    ]
    base = real["ds"]
    for name in policies:
        runs = real[name]
        avg = [r.avg_jct for r in runs if r.avg_jct is not None]
        if len(avg) < len(runs):
            figures.append(Figure(f"live {name}: runs with unfinished jobs", len(runs) - len(avg), "runs"))
            continue
        sim_avg = [s.avg_jct or 0.0 for s in sims[name]]
        gaps = [100 * abs(s - r) / r for s, r in zip(sim_avg, avg, strict=True)]
        spans = [r.makespan or 0.0 for r in runs]
        figures.append(
            Figure(
                f"live {name}: average JCT (mean of {len(avg)} seeds)",
                statistics.fmean(avg),
                "s",
                detail=f"{_spread(avg)}; makespan mean {statistics.fmean(spans):.1f} s ({_spread(spans)}); "
                f"simulated {statistics.fmean(sim_avg):.1f} s",
            )
        )
        figures.append(
            Figure(
                f"live {name}: simulator's avg JCT gap (mean |%|)",
                statistics.fmean(gaps),
                "%",
                target=GAP_TARGET,
                better="max",
                detail="per seed " + ", ".join(f"{g:.1f}" for g in gaps),
            )
        )
        if name == "ds":
            continue
        cmps = [compare(b, r) for b, r in zip(base, runs, strict=True)]
        red = [100 * (c.avg_jct_reduction or 0.0) for c in cmps]
        worst = max((c.worst_slowdown or 0.0) for c in cmps)
        ttq = [100 * c.ttq_reduction for c in cmps if c.ttq_reduction is not None]
        figures.append(
            Figure(
                f"live {name}: avg JCT reduction vs DS (mean of {len(red)} seeds)",
                statistics.fmean(red),
                "%",
                target=TARGET_REDUCTION if name == "specon" else None,
                better="min",
                detail=f"per seed {', '.join(f'{x:+.1f}' for x in red)}; "
                f"slowest job x{worst:.2f} its DS JCT; "
                f"time-to-quality {statistics.fmean(ttq) if ttq else float('nan'):+.1f} %; moves "
                f"{statistics.fmean(len(r.migrations) for r in runs):.1f} per run",
            )
        )
    if "balancer" in real and "specon" in real:
        ahead = [
            100 * ((b.avg_jct or 0.0) - (s.avg_jct or 0.0)) / (b.avg_jct or 1.0)
            for b, s in zip(real["balancer"], real["specon"], strict=True)
        ]
        figures.append(
            Figure(
                "live specon: avg JCT reduction vs the balancer (mean)",
                statistics.fmean(ahead),
                "%",
                target=0.0,
                better="min",
                detail="per seed " + ", ".join(f"{x:+.1f}" for x in ahead),
            )
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_live.log").write_text("\n".join(loads) + "\n", encoding="utf-8")
    return figures
