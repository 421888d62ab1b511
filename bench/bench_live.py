"""Real runs: DS, the live balancer and the default on the same arrivals, several seeds.

Each seed is one workload (``specon.embedded.demo.make_workload``: random models, arrivals uniform in
[0, WINDOW] s) run for real on the embedded default (``specon.embedded.demo.run_once``: W workers with
a cgroup CPU budget each, real PyTorch jobs, a real manager and agents over loopback HTTP).

**Paired arms.** One run proves nothing: the same arrivals once favoured specon by 27.6 % on
a loaded machine and once lost 26.1 % on a quiet one, and a seed's DS average moved by a
quarter between two runs on an idle machine. The spread comes from the machine (its speed
drifts between and within sessions: ``bench_live`` measured each model's CPU per step at
1.1-2.1x the traces', and a run that shares the CPUs with anything else is slowed), so each
policy runs *at the same time* as a DS twin of the same arrivals: the two clusters' workers
share the machine's CPUs alike (each worker pinned to one CPU under its own CPU quota, the
two arms' workers side by side on each CPU), and both see the same machine. Each policy is
compared with its own twin. DS thus runs once per other policy and seed, and the spread of
those DS runs of one seed (run at different moments) is the spread a sequential comparison
would carry; it is reported beside the figures. Which pair runs first rotates from seed to
seed. The machine's load average before each pair is recorded beside it.

Figures, per policy: average JCT (mean over the seeds, and its spread: min-max), its change
against its DS twin (mean, min-max), makespan and the slowest job against DS; beside each,
time-to-quality (a job's seconds to 95 % of its final loss reduction,
``specon.evaluation.JobResult.time_to_quality``; the mean over the jobs) and its change
against the DS twin. The simulator's prediction of each on the same workloads
(``specon.sim.calibration.sim_workload``, measured start-up CPU, and each model's CPU per
step measured on this machine before the runs: the traces' were recorded on another day,
and this machine's speed drifts between sessions) and its gap. The targets (issue 24): the
default >= 25 % faster than DS and faster than the balancer, its time-to-quality no later
than DS, the simulator within 10 % of each. ``quick``: one seed, one pair (DS and the default).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from bench.bench_calibration import measure_sharing, run_sim
from bench.figures import Figure
from specon.config import policy_to_yaml
from specon.daemon import logs
from specon.embedded.demo import DemoJob, make_workload, run_once
from specon.embedded.live_policies import live_policy
from specon.evaluation import Comparison, RunResult, compare
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
# Each runs beside a DS twin of its arrivals (module doc).
POLICIES = {False: ("balancer", "specon"), True: ("specon",)}
DEADLINE = 900.0
# CPU-seconds a job spends before its first step: the demo forks its jobs from a warm
# interpreter per worker, measured by `python -m bench bench_restore` at 0.04-0.56 per model
# (mean 0.34; a fresh interpreter's 2.06).
STARTUP_CPU = 0.34
TARGET_REDUCTION = 25.0  # % average JCT below the DS twin
TTQ_TARGET = 0.0  # % time-to-quality below the DS twin: no later than DS
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


async def _run(jobs: Sequence[DemoJob], name: str, root: Path) -> RunResult:
    policy = None
    if name != "ds":
        policy = root / f"{name}.yaml"
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(policy_to_yaml(live_policy(name)), encoding="utf-8")
    return await run_once(
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


def _pair(jobs: Sequence[DemoJob], name: str, root: Path) -> tuple[RunResult, RunResult]:
    """``name`` and its DS twin on the same arrivals at the same time: (DS, ``name``)."""

    async def both() -> tuple[RunResult, RunResult]:
        ds, other = await asyncio.gather(_run(jobs, "ds", root / f"twin-{name}"), _run(jobs, name, root))
        return ds, other

    return asyncio.run(both())


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
    """Each model's CPU-seconds per step on this machine now, as a paired run loads it: one
    job on each of two arms' workers (2 x WORKERS workers of CPUS each, side by side on the
    CPUs), by the first worker's CPU accounting (``bench_calibration.measure_sharing``). A
    CPU that time-slices two workers' jobs costs more per step than one job alone on it."""
    return {
        m: asyncio.run(
            measure_sharing(
                root / f"cost-{m}", k=1, cpus=CPUS, workers=2 * WORKERS, window=COST_WINDOW, model=m
            )
        ).cpu_per_step
        for m in models
    }


def _finished(runs: Sequence[RunResult]) -> bool:
    return all(r.avg_jct is not None for r in runs)


Measure = Callable[[RunResult], float | None]


def _jct(r: RunResult) -> float | None:
    return r.avg_jct


def _ttq(r: RunResult) -> float | None:
    return r.avg_time_to_quality


def _gaps(sim: Sequence[RunResult], real: Sequence[RunResult], of: Measure = _jct) -> list[float]:
    """The simulator's |figure - the real one| / the real one, %, per seed (avg JCT by default)."""
    return [
        100 * abs((of(s) or 0.0) - (of(r) or 0.0)) / (of(r) or 1.0) for s, r in zip(sim, real, strict=True)
    ]


def _mean(runs: Sequence[RunResult], of: Measure) -> float:
    return statistics.fmean(of(r) or 0.0 for r in runs)


def _ttq_known(runs: Sequence[RunResult]) -> bool:
    return all(r.avg_time_to_quality is not None for r in runs)


def _ds_figures(twins: Mapping[str, Sequence[RunResult]], sim: Sequence[RunResult]) -> list[Figure]:
    """DS: each seed's twins (one beside each policy, run at different moments) and their
    spread, the spread a sequential comparison carries, and the simulator's gap to them."""
    runs = list(zip(*twins.values(), strict=True))  # per seed: its DS twins
    if not runs or not all(_finished(seed) for seed in runs):
        return [Figure("live ds: twins with unfinished jobs", sum(not _finished(s) for s in runs), "seeds")]
    means = [statistics.fmean(r.avg_jct or 0.0 for r in seed) for seed in runs]
    figures = [
        Figure(
            f"live ds: average JCT (mean of {len(means)} seeds)",
            statistics.fmean(means),
            "s",
            detail=f"{_spread(means)}; each seed the mean of its {len(runs[0])} twin run(s); "
            f"simulated {statistics.fmean(s.avg_jct or 0.0 for s in sim):.1f} s",
        ),
        Figure(
            "live ds: simulator's avg JCT gap (mean |%|)",
            statistics.fmean(
                g for seed, s in zip(runs, sim, strict=True) for g in _gaps([s] * len(seed), seed)
            ),
            "%",
            target=GAP_TARGET,
            better="max",
        ),
    ]
    flat = [r for seed in runs for r in seed]
    if _ttq_known(flat):
        ttqs = [statistics.fmean(r.avg_time_to_quality or 0.0 for r in seed) for seed in runs]
        figures += [
            Figure(
                f"live ds: time-to-quality (mean of {len(ttqs)} seeds)",
                statistics.fmean(ttqs),
                "s",
                detail=f"{_spread(ttqs)}; simulated {_mean(sim, _ttq):.1f} s",
            ),
            Figure(
                "live ds: simulator's time-to-quality gap (mean |%|)",
                statistics.fmean(
                    g for seed, s in zip(runs, sim, strict=True) for g in _gaps([s] * len(seed), seed, _ttq)
                ),
                "%",
                target=GAP_TARGET,
                better="max",
            ),
        ]
    if len(runs[0]) > 1:
        repeat = [
            100 * (max(r.avg_jct or 0.0 for r in seed) / min(r.avg_jct or 1.0 for r in seed) - 1)
            for seed in runs
        ]
        figures.append(
            Figure(
                "live ds: same arrivals run again, avg JCT apart (mean)",
                statistics.fmean(repeat),
                "%",
                detail="per seed " + ", ".join(f"{x:.1f}" for x in repeat) + " (max / min - 1 of its twins)",
            )
        )
    return figures


def _policy_figures(
    name: str,
    runs: Sequence[RunResult],
    twins: Mapping[str, Sequence[RunResult]],
    sim: Sequence[RunResult],
    sim_ds: Sequence[RunResult],
) -> list[Figure]:
    avg = [r.avg_jct or 0.0 for r in runs]
    spans = [r.makespan or 0.0 for r in runs]
    gaps = _gaps(sim, runs)
    cmps = [compare(t, r) for t, r in zip(twins[name], runs, strict=True)]
    red = [100 * (c.avg_jct_reduction or 0.0) for c in cmps]
    worst = max((c.worst_slowdown or 0.0) for c in cmps)
    # The simulator's prediction of the same comparison: the policy's twin against DS's.
    sim_cmps = [compare(d, s) for d, s in zip(sim_ds, sim, strict=True)]
    sim_red = statistics.fmean(100 * (c.avg_jct_reduction or 0.0) for c in sim_cmps)
    # What a sequential comparison would have said: against another policy's twin, a DS run
    # of the same arrivals at another moment.
    others = [p for p in twins if p != name]
    crossed = [
        100 * (compare(t, r).avg_jct_reduction or 0.0)
        for p in others
        for t, r in zip(twins[p], runs, strict=True)
    ]
    figures = [
        Figure(
            f"live {name}: average JCT (mean of {len(avg)} seeds)",
            statistics.fmean(avg),
            "s",
            detail=f"{_spread(avg)}; makespan mean {statistics.fmean(spans):.1f} s ({_spread(spans)}); "
            f"simulated {_mean(sim, _jct):.1f} s",
        ),
        Figure(
            f"live {name}: simulator's avg JCT gap (mean |%|)",
            statistics.fmean(gaps),
            "%",
            target=GAP_TARGET,
            better="max",
            detail="per seed " + ", ".join(f"{g:.1f}" for g in gaps),
        ),
        Figure(
            f"live {name}: avg JCT reduction vs its DS twin (mean of {len(red)} seeds)",
            statistics.fmean(red),
            "%",
            target=TARGET_REDUCTION if name == "specon" else None,
            better="min",
            detail=f"per seed {', '.join(f'{x:+.1f}' for x in red)} ({_spread(red)}); "
            f"simulated {sim_red:+.1f} %; slowest job x{worst:.2f} its DS JCT; moves "
            f"{statistics.fmean(len(r.migrations) for r in runs):.1f} per run"
            + (
                f"; against the other DS runs of its seeds instead: {', '.join(f'{x:+.1f}' for x in crossed)}"
                if crossed
                else ""
            ),
        ),
    ]
    return figures + _ttq_figures(name, runs, cmps, sim, sim_cmps)


def _ttq_figures(
    name: str,
    runs: Sequence[RunResult],
    cmps: Sequence[Comparison],
    sim: Sequence[RunResult],
    sim_cmps: Sequence[Comparison],
) -> list[Figure]:
    """Time-to-quality beside the average JCT: the policy's, its change against its DS twin
    (positive: sooner) with the simulator's prediction of both, and the simulator's gap."""
    ttq = [100 * c.ttq_reduction for c in cmps if c.ttq_reduction is not None]
    if len(ttq) < len(cmps) or not _ttq_known(runs):
        return [
            Figure(f"live {name}: runs whose jobs logged no time-to-quality", len(cmps) - len(ttq), "runs")
        ]
    sim_ttq = [100 * c.ttq_reduction for c in sim_cmps if c.ttq_reduction is not None]
    predicted = f"simulated {statistics.fmean(sim_ttq):+.1f} %" if sim_ttq else "not simulated"
    means = [r.avg_time_to_quality or 0.0 for r in runs]
    gaps = _gaps(sim, runs, _ttq)
    return [
        Figure(
            f"live {name}: time-to-quality (mean of {len(means)} seeds)",
            statistics.fmean(means),
            "s",
            detail=f"{_spread(means)}; simulated {_mean(sim, _ttq):.1f} s",
        ),
        Figure(
            f"live {name}: time-to-quality reduction vs its DS twin (mean of {len(ttq)} seeds)",
            statistics.fmean(ttq),
            "%",
            target=TTQ_TARGET if name == "specon" else None,
            better="min",
            detail=f"per seed {', '.join(f'{x:+.1f}' for x in ttq)} ({_spread(ttq)}); {predicted}",
        ),
        Figure(
            f"live {name}: simulator's time-to-quality gap (mean |%|)",
            statistics.fmean(gaps),
            "%",
            target=GAP_TARGET,
            better="max",
            detail="per seed " + ", ".join(f"{g:.1f}" for g in gaps),
        ),
    ]


def _said(r: RunResult) -> str:
    """One run in a progress line: its average JCT and time-to-quality, or what is missing."""
    if r.avg_jct is None:
        return f"{len(r.jobs) - len(r.finished)} of {len(r.jobs)} jobs unfinished"
    ttq = r.avg_time_to_quality
    return f"avg JCT {r.avg_jct:.1f} s, time-to-quality " + ("n/a" if ttq is None else f"{ttq:.1f} s")


def _spread(xs: Sequence[float]) -> str:
    return f"min {min(xs):.1f}, max {max(xs):.1f}" + (
        f", sd {statistics.stdev(xs):.1f}" if len(xs) > 1 else ""
    )


def run(quick: bool) -> list[Figure]:
    logs.configure(level="warning", fmt="console")
    seeds, policies = SEEDS[quick], POLICIES[quick]
    real: dict[str, list[RunResult]] = {p: [] for p in policies}
    twins: dict[str, list[RunResult]] = {p: [] for p in policies}  # each run's DS twin
    sims: dict[str, list[RunResult]] = {p: [] for p in ("ds", *policies)}
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
                twin, result = _pair(jobs, name, Path(tmp) / f"seed{seed}")
                real[name].append(result)
                twins[name].append(twin)
                loads.append(f"seed {seed} {name} + ds: load {load:.2f}, {time.monotonic() - t0:.0f} s")
                print(f"  [bench_live] seed {seed} {name}: {_said(result)}; its DS twin {_said(twin)} "
                      f"(load before {load:.2f})", flush=True)  # fmt: skip
            for name in ("ds", *policies):
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
    figures += _ds_figures(twins, sims["ds"])
    for name in policies:
        runs = real[name]
        avg = [r.avg_jct for r in runs if r.avg_jct is not None]
        if len(avg) < len(runs) or any(t.avg_jct is None for t in twins[name]):
            figures.append(Figure(f"live {name}: runs with unfinished jobs", len(runs) - len(avg), "runs"))
            continue
        figures += _policy_figures(name, runs, twins, sims[name], sims["ds"])
    pair = ("balancer", "specon")
    if all(p in real and _finished(real[p]) and _finished(twins[p]) for p in pair):
        # Each against its own twin, then the two ratios: the machine's moment cancels out.
        ahead = [
            100 * (1 - (s.avg_jct or 0.0) / (st.avg_jct or 1.0) / ((b.avg_jct or 0.0) / (bt.avg_jct or 1.0)))
            for s, st, b, bt in zip(
                real["specon"], twins["specon"], real["balancer"], twins["balancer"], strict=True
            )
        ]
        figures.append(
            Figure(
                "live specon: avg JCT reduction vs the balancer (mean, each against its DS twin)",
                statistics.fmean(ahead),
                "%",
                target=0.0,
                better="min",
                detail=f"per seed {', '.join(f'{x:+.1f}' for x in ahead)}; {_spread(ahead)}",
            )
        )
    table = _table(real, twins, sims)
    print(table, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_live.log").write_text("\n".join(loads) + "\n", encoding="utf-8")
    (RESULTS / "bench_live.md").write_text(table + "\n", encoding="utf-8")
    return figures


def _table(
    real: Mapping[str, Sequence[RunResult]],
    twins: Mapping[str, Sequence[RunResult]],
    sims: Mapping[str, Sequence[RunResult]],
) -> str:
    """The real-run table (markdown): per policy, its average JCT and time-to-quality over the
    seeds with the spread, each one's change against the DS twin per seed, and the
    simulator's prediction of each."""
    rows = [
        "| policy | avg JCT, mean of seeds (min-max, sd) | vs its DS twin, per seed | simulator (mean gap) "
        "| time-to-quality, mean of seeds | vs its DS twin, per seed | simulator (mean gap) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(runs: Sequence[RunResult], of: Measure) -> str:
        xs = [x for r in runs if (x := of(r)) is not None]
        if len(xs) < len(runs) or not xs:
            return "unfinished jobs" if of is _jct else "n/a"
        return f"{statistics.fmean(xs):.1f} s ({_spread(xs)})"

    def sim_cell(sim: Sequence[RunResult], runs: Sequence[RunResult], of: Measure) -> str:
        known = all(of(r) is not None for r in runs)
        gap = f" ({statistics.fmean(_gaps(sim, runs, of)):.1f} %)" if known and runs else ""
        return f"{_mean(sim, of):.1f} s{gap}"

    def change(base: Sequence[RunResult], runs: Sequence[RunResult], of: Measure) -> str:
        pairs = [(of(b), of(r)) for b, r in zip(base, runs, strict=True)]
        red = [100 * (b - r) / b for b, r in pairs if b is not None and r is not None and b > 0]
        if len(red) < len(pairs) or not red:
            return "-"
        return " / ".join(f"{x:+.1f}" for x in red) + f" % sooner (mean {statistics.fmean(red):.1f} %)"

    seeds = list(zip(*twins.values(), strict=True))
    ds_runs = [r for seed in seeds for r in seed]
    ds_sim = [s for s, seed in zip(sims["ds"], seeds, strict=True) for _ in seed]
    rows.append(
        f"| ds ({len(ds_runs)} twins) | {cell(ds_runs, _jct)} | - | {sim_cell(ds_sim, ds_runs, _jct)} "
        f"| {cell(ds_runs, _ttq)} | - | {sim_cell(ds_sim, ds_runs, _ttq)} |"
    )
    for name, runs in real.items():
        if not (_finished(runs) and _finished(twins[name])):
            rows.append(f"| {name} | {cell(runs, _jct)} | - | - | - | - | - |")
            continue
        cols = [
            f"{cell(runs, of)} | {change(twins[name], runs, of)} | {sim_cell(sims[name], runs, of)}"
            for of in (_jct, _ttq)
        ]
        rows.append(f"| {name} | {cols[0]} | {cols[1]} |")
    return "\n".join(rows)
