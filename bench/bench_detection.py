"""Convergence detection: delay and false-early rate of each classifier configuration.

Every recorded trace (``specon/data/traces``, made by ``specon trace record``) and a seeded
set of synthetic Optimus curves fitted to them are replayed through each configuration
(``specon.sim.detection``: ``specon`` over alpha x normalize x aggregate, ``robust`` over
alpha x normalize x variant, paper mode at alpha 0.01; each at Δ = 50, 100 and 200
training steps, i.e. 40, 20 and 10 ticks per 2000-step job — the simulator's scenarios
give a job 10-30 ticks of 30 s). The ground truth, stated in that module: the first step
after which the smoothed loss improves by less than 5 % of its total improvement.

Figures: the Optimus fit per model; per configuration, its lateness on the real curves
(mean of max(0, delay), a miss counting as "detected at the end", in % of the job) with
false-early / missed / delay in the detail and the synthetic check beside it; then the
recommendations — per Δ and across every Δ, the least lateness with false-early <= 10 %
(overall, and per classifier) — and the shipped default's own result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bench.figures import Figure
from specon.config import MonitorConfig
from specon.sim import curves, detection
from specon.sim.detection import Ranked, Score
from specon.sim.trace import load_traces

SYNTHETIC_PER_MODEL = 10
SYNTHETIC_SEED = 20_240_601
MAX_FALSE_EARLY = detection.DEFAULT_MAX_FALSE_EARLY


def _fit_figures(fits: Mapping[str, curves.ModelCurve]) -> list[Figure]:
    ticks = "/".join(str(d) for d in detection.TICK_STEPS)
    out = []
    for model, c in fits.items():
        p = c.params
        seconds = "/".join(f"{d * c.step_cost:.1f}" for d in detection.TICK_STEPS)
        out.append(
            Figure(
                f"{model}: Optimus fit rmse",
                c.rmse,
                "loss",
                detail=f"beta0 {p.beta0:.4g}, beta1 {p.beta1:.4g}, beta2 {p.beta2:.4g}; noise sigma "
                f"{c.noise:.3g}; {c.step_cost * 1e3:.2f} ms CPU/step, so D={ticks} steps = {seconds} s "
                f"on one core; {c.traces} traces",
            )
        )
    return out


def _detail(r: Score, s: Score) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:+.1f}%"

    secs = "-" if r.mean_delay_seconds is None else f"{r.mean_delay_seconds:+.1f}"
    return (
        f"early {100 * r.false_early:.0f}% missed {100 * r.missed:.0f}% delay mean {pct(r.mean_delay)} "
        f"median {pct(r.median_delay)} ({secs} s at 1 core), n={r.curves}; synthetic: late "
        f"{100 * s.mean_lateness:.1f}% early {100 * s.false_early:.0f}% missed {100 * s.missed:.0f}%, "
        f"n={s.curves}"
    )


def _shipped_family() -> str:
    """The family label of the shipped default (``MonitorConfig()``)."""
    d = MonitorConfig()
    return detection.make_detector(
        d.classifier, alpha=d.alpha, tick_steps=1, normalize=d.normalize, aggregate=d.aggregate
    ).family


def _pick(name: str, best: Ranked | None, synth: Mapping[str, Ranked], *, worst: bool) -> Figure:
    """A recommendation figure: lateness on the real curves, the synthetic check beside it."""
    if best is None:
        return Figure(name, float("nan"), "% late", detail=f"none has false-early <= {MAX_FALSE_EARLY:.0%}")
    s = synth.get(best.label)
    check = (
        ""
        if s is None
        else f"; synthetic: late {100 * s.mean_lateness:.1f}%, early {100 * s.false_early:.0f}%, "
        f"missed {100 * s.missed:.0f}%"
    )
    which = "worst " if worst else ""
    return Figure(
        name,
        100 * best.mean_lateness,
        "% late",
        detail=f"{best.label}: {which}false-early {100 * best.false_early:.0f}%, "
        f"{which}missed {100 * best.missed:.0f}%{check}",
    )


def _recommendations(real: Sequence[Score], synth: Mapping[str, Score]) -> list[Figure]:
    """Per Δ, then across every Δ: the best overall, the best of each classifier, and the
    shipped default's own result."""
    out: list[Figure] = []
    shipped = _shipped_family()
    families = detection.by_family(real)
    synth_families = {f.label: f for f in detection.by_family(synth.values())}
    groups: list[tuple[str, Sequence[Ranked], Mapping[str, Ranked], bool]] = [
        (f"D={d:g}", [s for s in real if s.tick_steps == d], synth, False)
        for d in sorted({s.tick_steps for s in real})
    ]
    groups.append(("all D (mean lateness, worst rates)", families, synth_families, True))
    for where, scores, check, worst in groups:
        best = detection.recommend(scores, max_false_early=MAX_FALSE_EARLY)
        out.append(_pick(f"recommended at {where}", best, check, worst=worst))
        for clf in ("specon", "robust"):
            mine = [s for s in scores if s.label.startswith(f"{clf} ")]
            out.append(
                _pick(
                    f"  best {clf} at {where}",
                    detection.recommend(mine, max_false_early=MAX_FALSE_EARLY),
                    check,
                    worst=worst,
                )
            )
        own = next((s for s in scores if s.label.startswith(f"{shipped} D=") or s.label == shipped), None)
        if own is not None:
            out.append(_pick(f"  shipped default at {where}", own, check, worst=worst))
    return out


def run(quick: bool) -> list[Figure]:
    recorded = load_traces()
    real = [t for model in sorted(recorded) for t in recorded[model]]
    if not real:
        return [Figure("recorded traces", 0, "traces", detail="none: run `specon trace record` first")]
    fits = curves.fit_models(recorded)
    per_model = 3 if quick else SYNTHETIC_PER_MODEL
    synthetic = curves.synthetic_set(fits, per_model * len(fits), seed=SYNTHETIC_SEED)
    grid = (
        detection.detector_grid(alphas=(0.01, 0.05), tick_steps=(100,))
        if quick
        else detection.detector_grid()
    )
    real_scores = detection.evaluate(real, grid)
    synth_scores = {s.label: s for s in detection.evaluate(synthetic, grid)}

    truth = [detection.ground_truth_step(t) / t.steps for t in real]
    figures = [
        Figure(
            "recorded traces",
            len(real),
            "traces",
            detail=", ".join(f"{m} x{len(ts)}" for m, ts in recorded.items()),
        ),
        Figure(
            "ground truth: mean convergence point (real)",
            100 * sum(truth) / len(truth),
            "% of job",
            detail=f"range {100 * min(truth):.0f}-{100 * max(truth):.0f}%",
        ),
        *_fit_figures(fits),
    ]
    for r in real_scores:
        figures.append(
            Figure(r.label, 100 * r.mean_lateness, "% late", detail=_detail(r, synth_scores[r.label]))
        )
    figures += _recommendations(real_scores, synth_scores)
    return figures
