"""Sweeps of the MB-ASGD cluster simulation over loads and seeds, and their tables and JSON.

A load's figures pool its seeds: the mean response is the mean of the runs' means, its 95 %
interval is over the runs (by batch means within the run when there is one), and the load is
stable only when every run is. Past a load where a policy was unstable, higher loads are
not run (an overloaded queue only grows with the load) and are reported unstable, skipped.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specon.sim.asgd.allocation import SpeedCurve
from specon.sim.asgd.cluster import SimConfig, SimResult, confidence, curves_for, simulate
from specon.sim.asgd.mva import METHODS, MIN_NODES, Method, ServiceTimes, solutions


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One policy at one load, over its seeds (hours)."""

    load: float
    mean_response: float
    ci: float
    mean_to_mark: float
    stable: bool
    skipped: bool  # not run: unstable at a lower load
    reasons: tuple[str, ...]  # one per unstable run
    runs: int
    mean_in_system: float
    utilisation: float
    responses: tuple[float, ...]  # every measured job of every seed

    def cell(self) -> str:
        """The table's cell: mean +- CI, marked when unstable."""
        if self.skipped:
            return "unstable (skipped)"
        text = (
            f"{self.mean_response:.1f} ± {self.ci:.1f}"
            if math.isfinite(self.ci)
            else f"{self.mean_response:.1f}"
        )
        unstable = len(self.reasons)
        return text if self.stable else f"{text} UNSTABLE ({unstable}/{self.runs} runs)"


def point(load: float, runs: Sequence[SimResult]) -> LoadPoint:
    """The pooled figures of one load's runs."""
    means = [r.mean_response for r in runs if math.isfinite(r.mean_response)]
    marks = [r.mean_to_mark for r in runs if math.isfinite(r.mean_to_mark)]
    if len(runs) == 1:
        ci = confidence(runs[0].responses)
    else:
        ci = confidence(means, batches=len(means)) if len(means) > 1 else math.nan
    return LoadPoint(
        load=load,
        mean_response=statistics.fmean(means) if means else math.nan,
        ci=ci,
        mean_to_mark=statistics.fmean(marks) if marks else math.nan,
        stable=all(r.stable for r in runs),
        skipped=False,
        reasons=tuple(r.reason for r in runs if r.reason),
        runs=len(runs),
        mean_in_system=statistics.fmean(r.mean_in_system for r in runs),
        utilisation=statistics.fmean(r.utilisation for r in runs),
        responses=tuple(x for r in runs for x in r.responses),
    )


def skipped(load: float) -> LoadPoint:
    return LoadPoint(
        load,
        math.nan,
        math.nan,
        math.nan,
        False,
        True,
        ("unstable at a lower load",),
        0,
        math.nan,
        math.nan,
        (),
    )


def sweep(
    base: SimConfig,
    loads: Sequence[float],
    seeds: int,
    progress: Callable[[str], None] | None = None,
    curves: dict[str, SpeedCurve] | None = None,
) -> list[LoadPoint]:
    """``base`` at each load (ascending) over seeds 0..seeds-1."""
    curves = curves if curves is not None else curves_for(base.models, base.nodes, base.method)
    out: list[LoadPoint] = []
    unstable = False
    for load in sorted(loads):
        if unstable:
            out.append(skipped(load))
            continue
        runs = []
        for seed in range(seeds):
            runs.append(simulate(dataclasses.replace(base, load=load, seed=seed), curves))
        p = point(load, runs)
        if progress is not None:
            s = base.settings
            progress(f"{s.mode} {s.policy} gamma={s.gamma:g} load {load:g}: {p.cell()} h")
        out.append(p)
        unstable = not p.stable
    return out


def table(title: str, series: Mapping[str, Sequence[LoadPoint]]) -> str:
    """A markdown table: one row per load, one column per policy (mean response, hours)."""
    names = list(series)
    loads = sorted({p.load for ps in series.values() for p in ps})
    lines = [f"### {title}", "", "| load | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for load in loads:
        cells = []
        for n in names:
            p = next((p for p in series[n] if p.load == load), None)
            cells.append(p.cell() if p is not None else "")
        lines.append(f"| {load:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def stable_up_to(points: Sequence[LoadPoint]) -> float:
    """The highest load below which every load was stable (0 when the first was not)."""
    top = 0.0
    for p in sorted(points, key=lambda p: p.load):
        if not p.stable:
            break
        top = p.load
    return top


def points_json(points: Sequence[LoadPoint]) -> list[dict[str, Any]]:
    """JSON-ready points (without the per-job responses)."""
    return [
        {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in dataclasses.asdict(p).items()
            if k != "responses"
        }
        for p in points
    ]


def model_table(times: ServiceTimes, max_workers: int, methods: Sequence[Method] = METHODS) -> str:
    """Throughput, speedup and efficiency per worker count, one column group per method."""
    sols = {m: solutions(times, max_workers, m) for m in methods}
    head = "| workers | nodes | " + " | ".join(f"{m} X/s | {m} speedup | {m} E" for m in methods) + " |"
    lines = [head, "|---" * (2 + 3 * len(methods)) + "|"]
    for w in range(1, max_workers + 1):
        cells = []
        for m in methods:
            x, x1 = sols[m][w - 1].throughput, sols[m][0].throughput
            cells.append(f"{x:.4g} | {x / x1:.3f} | {x / x1 / (w + 1):.3f}")
        lines.append(f"| {w} | {w + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def choices(times: ServiceTimes, max_workers: int, alpha: float, method: Method) -> dict[str, int]:
    """KNEE's and HELL's node counts for one job on ``max_workers + 1`` nodes."""
    c = SpeedCurve.from_times(times, max_workers + MIN_NODES - 1, method)
    n = c.max_nodes
    return {"knee_nodes": c.knee(alpha, n), "hell_nodes": c.hell(n), "fastest_nodes": c.best(n)}
