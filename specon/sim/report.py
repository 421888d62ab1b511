"""Scenario results as a markdown table beside the paper's numbers, as JSON, and as PNGs.

Sign convention in the tables: "vs DS" is the change against DS on the same seed
(negative = faster), the paper's reductions shown the same way. ``bound`` rows are lower
bounds (its "vs DS" the most any policy could gain; its jobs-improved and best-job
figures upper bounds on what any policy could reach).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specon.sim.cluster import SimParams
from specon.sim.experiment import FAILURE_METRICS, PointResult, ScenarioResult, Summary
from specon.sim.failures import Failures
from specon.sim.scenarios import PaperNumbers

_NA = "-"
ALPHA, DELTA = "\N{GREEK SMALL LETTER ALPHA}", "\N{GREEK CAPITAL LETTER DELTA}"


def _num(x: float | None, digits: int = 0) -> str:
    return _NA if x is None or not math.isfinite(x) else f"{x:,.{digits}f}"


def _pm(s: Summary, key: str, digits: int = 0) -> str:
    m, ci = s.mean.get(key, math.nan), s.ci95.get(key, math.nan)
    if not math.isfinite(m):
        return _NA
    return f"{m:,.{digits}f} ± {ci:,.{digits}f}" if math.isfinite(ci) and s.seeds > 1 else f"{m:,.{digits}f}"


def _change(s: Summary, key: str) -> str:
    """A reduction as a signed change in percent, with its CI."""
    m, ci = s.mean.get(key, math.nan), s.ci95.get(key, math.nan)
    if not math.isfinite(m):
        return _NA
    text = _signed(-100 * m)
    return f"{text} ± {100 * ci:.1f}" if math.isfinite(ci) and s.seeds > 1 else text


def _share(s: Summary, key: str) -> str:
    m = s.mean.get(key, math.nan)
    return _NA if not math.isfinite(m) else f"{100 * m:.0f} %"


def _signed(percent: float) -> str:
    # Rounds to 0.0 without a sign: "-0.0 %" reads as a gain that is not there.
    return f"{percent:+.1f} %" if round(percent, 1) != 0 else "0.0 %"


def _paper_change(x: float | None) -> str:
    return _NA if x is None else _signed(-100 * x)


def _paper_share(x: float | None) -> str:
    return _NA if x is None else f"{100 * x:.0f} %"


_HEADER = (
    "| policy | avg JCT (s) | vs DS | makespan (s) | vs DS | jobs improved | best job | worst job "
    "| time-to-quality vs DS | moves |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
)


def _worst(s: Summary) -> str:
    """The slowest job against its DS JCT, the worst over the seeds (x1.50 = 50 % slower)."""
    x = s.high.get("worst_slowdown", math.nan)
    return _NA if not math.isfinite(x) else f"x{x:.2f}"


def point_table(point: PointResult, *, policies: tuple[str, ...]) -> list[str]:
    lines = list(_HEADER)
    for name in policies:
        s = point.summaries.get(name)
        if s is None:
            continue
        label = f"{name} (lower bound)" if name == "bound" else name
        if name == "ds":
            row = [label, _pm(s, "avg_jct"), _NA, _pm(s, "makespan"), _NA, _NA, _NA, _NA, _NA, "0"]
        else:
            moves = _NA if name == "bound" else _num(s.mean.get("migrations"), 1)
            row = [
                label,
                _pm(s, "avg_jct"),
                _change(s, "avg_jct_reduction"),
                _pm(s, "makespan"),
                _change(s, "makespan_reduction"),
                _share(s, "jobs_improved"),
                _change(s, "best_reduction"),
                _worst(s),
                _change(s, "ttq_reduction"),
                moves,
            ]
        lines.append("| " + " | ".join(row) + " |")
    p = point.paper
    if p is not None and p.given:  # a user's own scenario has no paper rows
        if p.ds_avg_jct is not None or p.ds_makespan is not None:
            cells = [_num(p.ds_avg_jct, 1), _NA, _num(p.ds_makespan), _NA, _NA, _NA, _NA, _NA, _NA]
            lines.append("| *paper: DS* | " + " | ".join(cells) + " |")
        lines.append(
            "| *paper: SpeCon* | "
            + " | ".join(
                [
                    _num(p.specon_avg_jct, 1),
                    _paper_change(p.avg_jct_reduction),
                    _num(p.specon_makespan),
                    _paper_change(p.makespan_reduction),
                    _paper_share(p.jobs_improved),
                    _paper_change(p.best_reduction),
                    _NA,
                    _NA,
                    _NA,
                ]
            )
            + " |"
        )
    return lines


def sweep_table(result: ScenarioResult) -> list[str]:
    """Table III: ours beside the paper's, per (alpha, interval) and specon policy (the
    other policies do not depend on alpha or the interval: see the main table)."""
    names = [p for p in result.policies if p in ("specon-paper", "specon")]
    lines = [
        f"| {ALPHA}, {DELTA} | policy | jobs improved | avg JCT | best job | makespan | time-to-quality |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for point in result.sweep:
        where = f"{point.alpha:g}, {point.interval:g} s"
        for name in names:
            s = point.summaries[name]
            lines.append(
                f"| {where} | {name} | {_share(s, 'jobs_improved')} | {_change(s, 'avg_jct_reduction')} | "
                f"{_change(s, 'best_reduction')} | {_change(s, 'makespan_reduction')} | "
                f"{_change(s, 'ttq_reduction')} |"
            )
        p = point.paper
        if p is not None:
            cells = [
                _paper_share(p.jobs_improved),
                _paper_change(p.avg_jct_reduction),
                _paper_change(p.best_reduction),
                _paper_change(p.makespan_reduction),
                _NA,
            ]
            lines.append(f"| {where} | *paper* | " + " | ".join(cells) + " |")
    return lines


def contention_law(pr: SimParams) -> str:
    """The slowdown law the run used, as ``SimParams.slowdown`` applies it (r: threads per core)."""
    if pr.job_threads > 1:
        exp = f" x r^{pr.thread_exponent:.3g}" if pr.thread_exponent else ""
        return (
            f"{pr.job_threads} threads per job: step time x {pr.thread_overhead:g}, oversubscribed "
            f"also x {pr.interference:g}{exp}"
        )
    exp = f" x r^{pr.interference_exponent:.3g}" if pr.interference_exponent else ""
    return f"interference {pr.interference:g}{exp}"


def markdown(result: ScenarioResult) -> str:
    sc = result.scenario
    n = len(result.seeds)
    weights = "" if result.weights is None else f", weights {','.join(f'{w:g}' for w in result.weights)}"
    pr = result.params
    lines = [
        f"### {sc.name}: {sc.title}",
        "",
        f"{ALPHA} {result.main.alpha:g}, {DELTA} {result.main.interval:g} s{weights}; "
        f"{n} seed{'s' if n != 1 else ''} (mean ± 95 % CI); "
        f"migration downtime {pr.migration_downtime:g} s, {contention_law(pr)}. "
        "“vs DS”: change against DS on the same seed (negative = faster).",
        "",
        *point_table(result.main, policies=result.policies),
    ]
    if sc.failures is not None:
        lines += ["", failures_line(sc.failures), "", *failure_table(result.main, policies=result.policies)]
    if result.sweep:
        lines += ["", f"Table III sweep ({sc.name}): change against DS, ours beside the paper's.", ""]
        lines += sweep_table(result)
    return "\n".join(lines) + "\n"


def failures_line(f: Failures) -> str:
    """What failed in the run, and how jobs checkpointed."""
    what = [f"MTBF {f.mtbf:g} s per worker"] if f.mtbf is not None else []
    if f.events:
        notices = sum(e.notice is not None for e in f.events)
        what.append(f"{len(f.events)} listed event{'s' if len(f.events) != 1 else ''} ({notices} notices)")
    ck = f.checkpoints
    every = " or ".join(
        x for x in (f"{ck.every} steps" if ck.every else "", f"{ck.interval:g} s" if ck.interval else "") if x
    )
    return (
        f"Host failures: {', '.join(what)}; a lost worker is back after {f.repair:g} s; jobs "
        f"checkpoint every {every or 'never'}. Lost work per run (mean ± 95 % CI): steps trained "
        "and lost, and the CPU-seconds spent on them; recoveries: lost jobs started again."
    )


def failure_table(point: PointResult, *, policies: tuple[str, ...]) -> list[str]:
    lines = [
        "| policy | hosts lost | jobs hit | steps lost | CPU-s lost | recoveries |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in policies:
        s = point.summaries.get(name)
        if s is None or "lost_steps" not in s.mean:
            continue
        digits = (1, 1, 0, 0, 1)  # per FAILURE_METRICS
        cells = (_pm(s, k, d) for k, d in zip(FAILURE_METRICS, digits, strict=True))
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return lines


def _summary_json(s: Summary) -> dict[str, Any]:
    def clean(x: float) -> float | None:
        return None if not math.isfinite(x) else round(x, 6)

    keys = s.metrics
    out: dict[str, Any] = {k: clean(s.mean[k]) for k in keys}
    out["ci95"] = {k: clean(s.ci95[k]) for k in keys}
    out["max"] = {k: clean(s.high.get(k, math.nan)) for k in keys}
    out["seeds"] = s.seeds
    return out


def _paper_json(p: PaperNumbers | None) -> dict[str, Any] | None:
    if p is None or not p.given:
        return None
    return asdict(p)


def _point_json(point: PointResult) -> dict[str, Any]:
    return {
        "alpha": point.alpha,
        "interval": point.interval,
        "policies": {name: _summary_json(s) for name, s in point.summaries.items()},
        "paper": _paper_json(point.paper),
    }


def to_json(result: ScenarioResult) -> dict[str, Any]:
    """``{"scenario", "policies": {NAME: {"avg_jct", "makespan", "jobs_improved",
    "best_reduction", "worst_slowdown", "ttq_reduction", "migrations", "ci95": {...},
    "max": {...}, ...}}, ...}``: seconds and fractions, means over the seeds (``max``: the
    largest over the seeds); reductions, jobs_improved, best_reduction, worst_slowdown
    (slowest job's JCT over its DS JCT) and ttq_reduction (mean time-to-quality) against
    DS on the same seed; ``migrations`` counts every move (``rebalances`` those by
    rebalancing). Where hosts fail, each policy also has ``hosts_lost``, ``jobs_lost``,
    ``lost_steps``, ``lost_seconds`` (CPU-, or GPU-, seconds spent on the lost steps) and
    ``recoveries`` (lost jobs started again), means per run, and the run has ``failures`` (its
    ``failures:`` section)."""
    sc = result.scenario
    main = _point_json(result.main)
    out: dict[str, Any] = {
        "scenario": sc.name,
        "title": sc.title,
        "seeds": len(result.seeds),
        "alpha": result.main.alpha,
        "interval": result.main.interval,
        "weights": list(result.weights) if result.weights is not None else None,
        "params": {
            "job_cores": result.params.job_cores,
            "interference": result.params.interference,
            "interference_exponent": result.params.interference_exponent,
            "migration_downtime": result.params.migration_downtime,
            "job_threads": result.params.job_threads,
            "thread_overhead": result.params.thread_overhead,
            "thread_exponent": result.params.thread_exponent,
        },
        "policies": main["policies"],
        "paper": main["paper"],
        **({"failures": _failures_json(sc.failures)} if sc.failures is not None else {}),
        "cpu_seconds": round(result.seconds, 3),
    }
    if result.sweep:
        out["sweep"] = [_point_json(p) for p in result.sweep]
    return out


def _failures_json(f: Failures) -> dict[str, Any]:
    return {
        "mtbf": f.mtbf,
        "repair": f.repair,
        "checkpoint_every": f.checkpoints.every,
        "checkpoint_interval": f.checkpoints.interval,
        "events": [asdict(e) for e in f.events],
    }


def write_plots(result: ScenarioResult, directory: Path) -> list[Path]:
    """``jct_cdf.png`` (every simulated policy, all seeds pooled) and ``timelines.png``
    (seed 0: DS and each simulated policy). Returns the files written."""
    from specon.plots import plot_jct_cdfs, plot_timelines  # noqa: PLC0415  (matplotlib: only for --plot)

    directory.mkdir(parents=True, exist_ok=True)
    runs = result.main.runs
    order = [p for p in result.policies if p in runs]
    cdf: list[tuple[str, list[float]]] = []
    for name in order:
        cdf.append((name, [j.jct for r in runs[name] for j in r.jobs if j.jct is not None]))
    out = []
    path = directory / "jct_cdf.png"
    plot_jct_cdfs(cdf, path, title=f"{result.scenario.name}: JCT over {len(result.seeds)} seed(s)")
    out.append(path)
    path = directory / "timelines.png"
    plot_timelines([(f"{name} (seed 0)", runs[name][0]) for name in order], path)
    out.append(path)
    return out


def summary_line(name: str, summaries: Mapping[str, Summary]) -> str:
    """A one-line digest: avg JCT and makespan change of each policy against DS."""
    parts = []
    for policy, s in summaries.items():
        if policy == "ds":
            continue
        parts.append(f"{policy} {_change(s, 'avg_jct_reduction')} / {_change(s, 'makespan_reduction')}")
    return f"{name}: " + "; ".join(parts)
