"""Quality-point estimators against the recorded traces' true points (error in steps, early share).

The true point of a trace is where it has made 95 % of its final loss reduction
(``specon.sim.detection.ground_truth_step``: what the simulator's time-to-quality counts).
Each estimator sees only the losses a job has logged by 10, 25 and 50 % of its steps and
its declared total, as the agent does:

* ``share``: 35 % of the steps (``phased``'s fixed share before its default became ``memory``);
* ``curve``: ``specon.policy.quality_point``'s ``curve`` (the share until the curve says more);
* ``knee``: the curve's own point so far (``quality_point.knee`` of the losses so far);
* ``fit``: where Optimus's fit of the losses so far comes within 5 % of its floor
  (``specon.policy.remaining.steps_to_converge``), at most the job's steps;
* ``memory``: ``quality_point``'s ``memory`` having seen the other traces of the same model
  finish on the cluster (leave-one-out over the recorded seeds: the median of their true
  shares, ``specon.policy.quality_memory``).

Per model and point of life: the median absolute error in steps and as a share of the job's
steps, and the share of estimates before the true point (early: the rule stops favouring
the job before it reached quality). ``--out DIR`` gets ``bench_quality_point.md`` and
``.csv`` beside the figures' JSON.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Callable
from pathlib import Path

from bench.figures import Figure
from specon.policy import quality_memory, quality_point
from specon.policy.quality_memory import QualityMemory
from specon.policy.remaining import steps_to_converge
from specon.sim.detection import ground_truth_step
from specon.sim.trace import Trace, load_traces

SHARE = 0.35
LIFE = (0.1, 0.25, 0.5)
ESTIMATORS = ("share", "curve", "knee", "fit", "memory")
RESULTS = Path(__file__).resolve().parent / "results"

# (trace, step now, its steps and losses so far, same-model others' true shares) -> step
Estimator = Callable[[Trace, float, list[float], list[float], list[float]], float]


def _knee(tr: Trace, now: float, steps: list[float], losses: list[float], others: list[float]) -> float:
    half = round(quality_point.SMOOTH_SHARE * tr.steps / tr.stride)
    return steps[quality_point.knee(losses, half)] if losses else 0.0


def _fit(tr: Trace, now: float, steps: list[float], losses: list[float], others: list[float]) -> float:
    k = steps_to_converge(steps, losses)
    return SHARE * tr.steps if k is None else min(float(tr.steps), max(0.0, k))


def _recalled(model: str, others: list[float]) -> float | None:
    """What a cluster that saw ``others`` (shares) of ``model`` finish recalls."""
    memory = QualityMemory()
    for i, share in enumerate(others):
        memory = memory.finished(model, f"job-{i}", share) or memory
    return quality_memory.recall(memory.shares(), model)


ESTIMATE: dict[str, Estimator] = {
    "share": lambda tr, now, s, x, o: SHARE * tr.steps,
    "curve": lambda tr, now, s, x, o: quality_point.estimate(
        "curve", step=now, total=tr.steps, share=SHARE, steps=s, losses=x
    ),
    "knee": _knee,
    "fit": _fit,
    "memory": lambda tr, now, s, x, o: quality_point.estimate(
        "memory", step=now, total=tr.steps, share=SHARE, recalled=_recalled(tr.model, o)
    ),
}


def measure(traces: dict[str, list[Trace]]) -> list[dict[str, object]]:
    """One row per estimator, model and point of life (module doc)."""
    truths = {id(t): ground_truth_step(t) for ts in traces.values() for t in ts}
    rows: list[dict[str, object]] = []
    for name in ESTIMATORS:
        for model, ts in sorted(traces.items()):
            for life in LIFE:
                errors: list[float] = []
                for tr in ts:
                    now = life * tr.steps
                    n = int(now // tr.stride)
                    steps = [float((i + 1) * tr.stride) for i in range(n)]
                    others = [truths[id(o)] / o.steps for o in ts if o is not tr]
                    got = ESTIMATE[name](tr, now, steps, list(tr.losses[:n]), others)
                    errors.append(got - truths[id(tr)])
                total = statistics.fmean(t.steps for t in ts)
                med = statistics.median(abs(e) for e in errors)
                rows.append(
                    {
                        "estimator": name,
                        "model": model,
                        "life": life,
                        "jobs": len(errors),
                        "median_abs_error_steps": round(med, 1),
                        "median_abs_error_share": round(med / total, 4),
                        "early_share": round(sum(e < 0 for e in errors) / len(errors), 3),
                    }
                )
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    """Per estimator and model: median |error| (steps, % of steps) / early share at each point."""
    head = " | ".join(f"at {round(100 * x)} %" for x in LIFE)
    out = [
        f"| estimator | model | {head} |",
        "|---|---|" + "---|" * len(LIFE),
    ]
    keyed = {(r["estimator"], r["model"], r["life"]): r for r in rows}
    models = sorted({str(r["model"]) for r in rows})
    for name in ESTIMATORS:
        for model in models:
            cells = []
            for life in LIFE:
                r = keyed[(name, model, life)]
                share, early = (100 * float(str(r[k])) for k in ("median_abs_error_share", "early_share"))
                cells.append(f"{r['median_abs_error_steps']:g} ({share:.0f} %) / {early:.0f} %")
            out.append(f"| {name} | {model} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def to_csv(rows: list[dict[str, object]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def run(quick: bool, out: Path | None = None) -> list[Figure]:
    rows = measure(load_traces())
    table = markdown(rows)
    print(table, flush=True)
    where = out or RESULTS
    where.mkdir(parents=True, exist_ok=True)
    (where / "bench_quality_point.md").write_text(table, encoding="utf-8")
    (where / "bench_quality_point.csv").write_text(to_csv(rows), encoding="utf-8")
    figures = []
    for name in ESTIMATORS:
        mine = [r for r in rows if r["estimator"] == name]
        med = statistics.median(float(str(r["median_abs_error_share"])) for r in mine)
        early = statistics.fmean(float(str(r["early_share"])) for r in mine)
        figures.append(
            Figure(
                f"quality point {name}: median |error| (models x points)",
                round(100 * med, 2),
                "% steps",
                better="max",
                detail=f"early {100 * early:.0f} % of estimates",
            )
        )
    return figures
