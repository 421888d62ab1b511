"""Convergence detection: how many ticks late or early the shipped classifier asks to move a job.

Every recorded trace (``specon/data/traces``, ``specon trace record``: real PyTorch training
of vae, gru, rnn, birnn and dynrnn, 3 seeds each) is replayed as a job of 10, 20 and 30 ticks
of Δ = 30 s (the scenarios' jobs run 295-885 s: ``specon.sim.detection``), beside diverging
variants of each (a blow-up part-way, to the end or to NaN; 3 seeds) and a seeded set of
synthetic Optimus curves fitted to the recordings (validation). The ground truth, stated in
that module: the first point where the smoothed best-so-far loss is within 5 % of its final
improvement. Target per curve and job length: at most 2 ticks late, never more than 1 tick
early, never missed, never a request on a diverging curve.

The table: per model, the shipped default's (``MonitorConfig()``) detections outside the
target, with its lateness in ticks (median / max / min over curves and job lengths) and the
counts early / too late / missed / asked on diverging curves in the detail; then the totals,
the synthetic check, a leave-one-seed-out check, the previous default (``specon``, alpha
0.01) for comparison, and the candidates the benchmark ranks (``detection.candidates``:
share of detections outside the target on recorded and on synthetic curves, equally
weighted; a request on a diverging curve disqualifies) with whether the shipped default is
the pick. Every detection of the shipped and the previous default, and the whole ranking, go
to ``bench/results/detection.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.figures import Figure
from specon.config import MonitorConfig
from specon.sim import curves, detection
from specon.sim.detection import Curve, Detection, Summary
from specon.sim.trace import load_traces

RESULTS = Path(__file__).resolve().parent / "results"
DETAIL_FILE = RESULTS / "detection.json"
SYNTHETIC_PER_MODEL = 10
SYNTHETIC_SEED = 20_240_601
DIVERGE_SEEDS = (7, 8, 9)
PREVIOUS = dataclasses.replace(
    MonitorConfig(), classifier="specon", alpha=0.01, normalize="max", aggregate="mean"
)


def _late(s: Summary) -> str:
    if s.median_late is None:
        return "never asked"
    return f"median {s.median_late:+g}, max {s.max_late:+d}, min {s.min_late:+d}"


def _detail(s: Summary) -> str:
    return (
        f"{_late(s)}; early >1 tick: {s.early}, late >2: {s.too_late}, missed: {s.missed}; "
        f"diverging asked: {s.diverging_requested}/{s.diverging}"
    )


def _per_length(ds: Sequence[Detection]) -> str:
    out = []
    for n in detection.JOB_TICKS:
        s = detection.summarise(d for d in ds if d.job_ticks == n and d.truth is not None)
        out.append("-" if s.max_late is None else f"{s.max_late:+d}")
    return "/".join(out)


def _model_figures(real: Sequence[Detection], diverging: Sequence[Detection]) -> list[Figure]:
    out = []
    lengths = "/".join(map(str, detection.JOB_TICKS))
    for model in sorted({d.model for d in real}):
        mine = [d for d in real if d.model == model]
        s = detection.summarise([*mine, *(d for d in diverging if d.model == model)])
        out.append(
            Figure(
                f"no declared steps, {model}: outside the target (shipped default)",
                s.failures,
                f"of {s.curves}",
                target=0,
                detail=f"ticks late {_detail(s)}; max by job length {lengths} ticks: {_per_length(mine)}",
            )
        )
    return out


def _scores(
    cands: Sequence[detection.Candidate],
    real: Sequence[Curve],
    synthetic: Sequence[Curve],
    diverging: Sequence[Curve],
    *,
    declared: bool = False,
) -> dict[str, tuple[Summary, Summary]]:
    """Per candidate: (recorded + diverging, synthetic) summaries."""
    out = {}
    for c in cands:
        rec = detection.run([*real, *diverging], c.monitor, declared=declared)
        syn = detection.run(synthetic, c.monitor, declared=declared)
        out[c.label] = (detection.summarise(rec), detection.summarise(syn))
    return out


def _declared_figures(
    real: Sequence[Curve], synthetic: Sequence[Curve], diverging: Sequence[Curve]
) -> tuple[list[Figure], list[Detection]]:
    """The shipped default on jobs that declared their steps (the classifier knows each
    tick's horizon), per model and in all, and the ``horizon_gain`` the benchmark picks."""
    shipped = MonitorConfig()
    ship = [
        *detection.run(real, shipped, declared=True),
        *detection.run(diverging, shipped, declared=True),
    ]
    total = detection.summarise(ship)
    synth = detection.summarise(detection.run(synthetic, shipped, declared=True))
    per_model = "; ".join(
        f"{m}: {s.failures}/{s.curves} ({_late(s)})" for m, s in detection.by_model(ship).items()
    )
    cands = detection.horizon_candidates(shipped)
    scores = _scores(cands, real, synthetic, diverging, declared=True)
    pick = detection.best(scores)
    shipped_label = f"horizon_gain={shipped.robust.horizon_gain:g}"
    ranked = sorted(scores, key=lambda label: (detection.rank_key(*scores[label]), label))
    figures = [
        Figure(
            "declared steps, all models: outside the target (shipped default)",
            total.failures,
            f"of {total.curves}",
            target=0,
            detail=f"{_detail(total)}; {per_model}",
        ),
        Figure(
            "declared steps, synthetic Optimus curves: outside the target",
            synth.failures,
            f"of {synth.curves}",
            detail=_detail(synth),
        ),
        Figure(
            "declared steps: benchmark's pick is the shipped horizon_gain",
            float(pick == shipped_label),
            "yes",
            target=1,
            better="min",
            detail="ranked: "
            + ", ".join(
                f"{label} ({scores[label][0].failures}+{scores[label][1].failures})" for label in ranked
            )
            + " (recorded+synthetic outside)",
        ),
    ]
    return figures, ship


def _held_out(
    cands: Sequence[detection.Candidate],
    real: Sequence[Curve],
    synthetic: Sequence[Curve],
    diverging: Sequence[Curve],
    shipped_label: str,
) -> list[Figure]:
    """Leave one recorded seed out: pick on the other seeds, score on it (names carry 'seed N')."""
    out = []
    for seed in range(3):
        tag = f"seed {seed},"
        test = [c for c in real if tag in c.label]
        train = [c for c in real if tag not in c.label]
        if not test:
            continue
        pick = detection.best(_scores(cands, train, synthetic, diverging))
        monitor = next(c.monitor for c in cands if c.label == pick)
        got = detection.summarise(detection.run(test, monitor))
        ship = detection.summarise(detection.run(test, MonitorConfig()))
        out.append(
            Figure(
                f"held out: recorded seed {seed}, outside the target",
                got.failures,
                f"of {got.curves}",
                detail=f"picked on the other seeds: {pick}{' (= shipped)' if pick == shipped_label else ''}; "
                f"{_detail(got)}; the shipped default: {ship.failures}",
            )
        )
    return out


def _ranking(scores: Mapping[str, tuple[Summary, Summary]], shipped_label: str, top: int) -> list[Figure]:
    ranked = sorted(scores, key=lambda label: (detection.rank_key(*scores[label]), label))
    out = []
    for i, label in enumerate(ranked[:top]):
        rec, syn = scores[label]
        share, _, _ = detection.rank_key(rec, syn)
        out.append(
            Figure(
                f"  #{i + 1} {label}",
                share,
                "outside (shares)",
                detail=f"recorded {rec.failures}/{rec.curves} ({_detail(rec)}); synthetic "
                f"{syn.failures}/{syn.curves} ({_late(syn)}, early {syn.early}, missed {syn.missed})"
                + (" <- shipped default" if label == shipped_label else ""),
            )
        )
    if shipped_label in ranked[top:]:
        out.append(
            Figure("  shipped default's rank", ranked.index(shipped_label) + 1, "", detail=shipped_label)
        )
    return out


def _rows(curves: Sequence[Curve], detections: Sequence[Detection]) -> list[dict[str, Any]]:
    """One row per detection (``detection.run`` yields every curve at every job length in order)."""
    labels = [c.label for c in curves for _ in detection.JOB_TICKS]
    return [
        {
            "curve": label,
            "model": d.model,
            "job_ticks": d.job_ticks,
            "truth_tick": d.truth,
            "request_tick": d.request,
            "late": d.late,
            "failed": d.failed,
        }
        for label, d in zip(labels, detections, strict=True)
    ]


def _write_detail(
    shipped_label: str,
    curves: Sequence[Curve],
    shipped: Sequence[Detection],
    *,
    declared: Sequence[Detection],
    previous: Sequence[Detection],
    scores: Mapping[str, tuple[Summary, Summary]],
) -> None:
    """Every detection of the shipped and the previous default, and the ranking, as JSON."""
    ranked = sorted(scores, key=lambda label: (detection.rank_key(*scores[label]), label))
    doc = {
        "target": {"late_ticks": detection.TARGET_LATE, "early_ticks": detection.TARGET_EARLY},
        "job_ticks": list(detection.JOB_TICKS),
        "interval_seconds": MonitorConfig().interval,
        "shipped": {
            "label": shipped_label,
            "by_model": {m: dataclasses.asdict(s) for m, s in detection.by_model(shipped).items()},
            "detections": _rows(curves, shipped),
        },
        "shipped_declared_steps": {
            "label": f"{shipped_label}, horizon_gain={MonitorConfig().robust.horizon_gain:g}",
            "by_model": {m: dataclasses.asdict(s) for m, s in detection.by_model(declared).items()},
            "detections": _rows(curves, declared),
        },
        "previous": {
            "label": "specon a=0.01",
            "by_model": {m: dataclasses.asdict(s) for m, s in detection.by_model(previous).items()},
            "detections": _rows(curves, previous),
        },
        "ranking": [
            {
                "label": label,
                "rank_key": list(detection.rank_key(*scores[label])),
                "recorded": dataclasses.asdict(scores[label][0]),
                "synthetic": dataclasses.asdict(scores[label][1]),
            }
            for label in ranked
        ],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    DETAIL_FILE.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def run(quick: bool) -> list[Figure]:
    recorded = load_traces()
    traces = [t for model in sorted(recorded) for t in recorded[model]]
    if not traces:
        return [Figure("recorded traces", 0, "traces", detail="none: run `specon trace record` first")]
    real = [Curve.of(t, t.source) for t in traces]
    fits = curves.fit_models(recorded)
    per_model = 3 if quick else SYNTHETIC_PER_MODEL
    synthetic = [Curve.of(t) for t in curves.synthetic_set(fits, per_model * len(fits), seed=SYNTHETIC_SEED)]
    seeds = DIVERGE_SEEDS[:1] if quick else DIVERGE_SEEDS
    diverging = [c for s in seeds for c in detection.diverging_set(traces, seed=s)]

    shipped = MonitorConfig()
    cands = detection.candidates()
    if quick:
        cands = [c for c in cands if c.monitor == shipped or c.label == "specon a=0.01"]
    shipped_label = next(
        (c.label for c in cands if c.monitor == shipped), "shipped default (not a candidate)"
    )
    if shipped_label not in {c.label for c in cands}:
        cands.append(detection.Candidate(shipped_label, shipped))

    ship_real = detection.run(real, shipped)
    ship_div = detection.run(diverging, shipped)
    total = detection.summarise([*ship_real, *ship_div])
    synth = detection.summarise(detection.run(synthetic, shipped))
    before = detection.run(real, PREVIOUS)
    before_div_runs = detection.run(diverging, PREVIOUS)
    before_div = detection.summarise(before_div_runs)
    scores = _scores(cands, real, synthetic, diverging)
    pick = detection.best(scores)
    declared_figures, declared = _declared_figures(real, synthetic, diverging)
    _write_detail(
        shipped_label,
        [*real, *diverging],
        [*ship_real, *ship_div],
        declared=declared,
        previous=[*before, *before_div_runs],
        scores=scores,
    )
    ticks = "/".join(map(str, detection.JOB_TICKS))
    steps = "/".join(f"{traces[0].steps / n:.0f}" for n in detection.JOB_TICKS)

    figures = [
        Figure(
            "curves",
            len(real),
            "recorded",
            detail=f"{', '.join(f'{m} x{len(ts)}' for m, ts in recorded.items())}; each as a job of {ticks} "
            f"ticks of 30 s (Δ = {steps} steps of a {traces[0].steps}-step job); {len(diverging)} diverging, "
            f"{len(synthetic)} synthetic; shipped: {shipped_label}",
        ),
        *declared_figures,
        *_model_figures(ship_real, ship_div),
        Figure(
            "no declared steps, all models: outside the target (shipped default)",
            total.failures,
            f"of {total.curves}",
            target=0,
            detail=_detail(total),
        ),
        Figure(
            "no declared steps, synthetic Optimus curves (validation): outside the target",
            synth.failures,
            f"of {synth.curves}",
            detail=_detail(synth),
        ),
        *_held_out(cands, real, synthetic, diverging, shipped_label),
        Figure(
            "before: specon alpha 0.01 (the previous default), outside the target",
            detection.summarise(before).failures + before_div.diverging_requested,
            f"of {len(before) + before_div.curves}",
            detail="; ".join(
                f"{m}: {_late(s)}, missed {s.missed}" for m, s in detection.by_model(before).items()
            )
            + f"; diverging asked {before_div.diverging_requested}/{before_div.curves}",
        ),
        Figure(
            "benchmark's pick is the shipped default",
            float(pick == shipped_label),
            "yes",
            target=1,
            better="min",
            detail=f"pick: {pick}",
        ),
        *_ranking(scores, shipped_label, top=3 if quick else 6),
    ]
    return figures
