"""The convergence-detection benchmark: how late, and how often too early, a classifier
asks to move a job, measured on loss-curve traces.

**Ground truth.** A job has converged at the first recorded step after which its smoothed
loss improves by less than ``GROUND_TRUTH_FRACTION`` (5 %) of its total improvement until
the end of training. The smoothed loss S is a centred moving average over
±``SMOOTH_HALF_WIDTH_STEPS`` steps (near the start the window shrinks symmetrically, so S
starts at the first loss; near the end it is cut off); the total improvement is
``S[0] - min S``; the improvement still to come after point i is ``S[i] - min(S[i:])``
(so a noisy rise late in training does not count as improvement). A curve that never
improves has converged at its first point. Losses are minimised.

**Replay.** Each trace is replayed alone through ``specon.replay.replay`` (the very
classifier code the agent runs) with the tick Δ expressed in *steps*: the replay's clock
counts training steps, so a detector behaves the same on a fast or a slow worker, and
Δ in seconds is ``Δ_steps · step_cost / cpu_share``. The first tick that would send a
reallocation request is the detection. The classifier sees the trace's values as logged
samples, one per stride — raw mini-batch losses, as the simulator's jobs log them — so
the mini-batch noise is part of the test.

**Metrics** per detector, over a set of traces:

* *false-early*: share of curves whose first request comes before the ground truth;
* *missed*: share of curves without any request;
* *delay*: request step - ground-truth step (signed), over the detected curves, as a
  fraction of the job's steps (comparable across models) and in CPU-seconds at one full core;
* *lateness*: the mean of max(0, delay), a miss counting as "detected at the end" — the
  cost of waiting, which the recommendation minimises subject to a bound on false-early.

Pure: traces in, scores out.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from specon.config import Aggregate, MonitorConfig, Normalize, RobustConfig
from specon.replay import replay
from specon.sim.trace import Trace

GROUND_TRUTH_FRACTION = 0.05
SMOOTH_HALF_WIDTH_STEPS = 50
DEFAULT_MAX_FALSE_EARLY = 0.10

ALPHAS = (0.005, 0.01, 0.02, 0.05, 0.1)  # the brief's four and the paper's upper end
TICK_STEPS = (50, 100, 200)  # 40, 20 and 10 ticks over a 2000-step job
NORMALIZE: tuple[Normalize, ...] = ("max", "previous")
AGGREGATE: tuple[Aggregate, ...] = ("mean", "last")
ROBUST_VARIANTS: dict[str, RobustConfig] = {
    "default": RobustConfig(),
    "fast": RobustConfig(smoothing=0.5, k=2, n=3, trend_window=4),
    "smooth": RobustConfig(smoothing=0.2, k=3, n=5, trend_window=8),
}


def smooth(values: Sequence[float], half_width: int) -> list[float]:
    """Centred moving average over ±``half_width`` points (edge rules in the module doc)."""
    if half_width < 0:
        raise ValueError(f"half width must be >= 0, got {half_width}")
    n = len(values)
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for i in range(n):
        reach = min(half_width, i)  # symmetric near the start
        lo, hi = i - reach, min(n, i + reach + 1)  # cut off near the end
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def ground_truth_index(
    losses: Sequence[float], *, half_width: int, fraction: float = GROUND_TRUTH_FRACTION
) -> int:
    """Index of the first point after which the smoothed loss improves by less than
    ``fraction`` of its total improvement (module doc). ``ValueError`` for no losses."""
    if not losses:
        raise ValueError("no losses")
    s = smooth(losses, half_width)
    # best_after[i] = min(s[i:])
    best_after = s[:]
    for i in range(len(s) - 2, -1, -1):
        best_after[i] = min(s[i], best_after[i + 1])
    total = s[0] - best_after[0]
    if total <= 0:
        return 0
    limit = fraction * total
    return next(i for i in range(len(s)) if s[i] - best_after[i] < limit)


def ground_truth_step(trace: Trace, *, fraction: float = GROUND_TRUTH_FRACTION) -> int:
    """The training step at which ``trace`` has converged (module doc)."""
    half_width = max(0, round(SMOOTH_HALF_WIDTH_STEPS / trace.stride))
    return (ground_truth_index(trace.losses, half_width=half_width, fraction=fraction) + 1) * trace.stride


@dataclass(frozen=True, slots=True)
class Detector:
    """One classifier configuration; ``monitor.interval`` is Δ in training steps.

    ``family`` names the configuration without Δ (detectors differing only in Δ share it).
    """

    family: str
    monitor: MonitorConfig

    @property
    def tick_steps(self) -> float:
        return self.monitor.interval

    @property
    def label(self) -> str:
        return f"{self.family} D={self.tick_steps:g}"


def make_detector(
    classifier: str,
    *,
    alpha: float,
    tick_steps: int,
    normalize: Normalize = "max",
    aggregate: Aggregate = "mean",
    robust: str = "default",
) -> Detector:
    """A detector for ``specon`` or ``robust`` (``robust`` names a ``ROBUST_VARIANTS`` entry)."""
    if classifier not in ("specon", "robust"):
        raise ValueError(f"unknown classifier {classifier!r}")
    if robust not in ROBUST_VARIANTS:
        raise ValueError(f"unknown robust variant {robust!r}; choose from {', '.join(ROBUST_VARIANTS)}")
    cfg = dataclasses.replace(
        MonitorConfig(),
        classifier="specon" if classifier == "specon" else "robust",
        alpha=alpha,
        interval=float(tick_steps),
        normalize=normalize,
        aggregate=aggregate,
        robust=ROBUST_VARIANTS[robust],
    )
    knobs = f"{normalize}/{aggregate}" if classifier == "specon" else f"{normalize}/{robust}"
    return Detector(f"{classifier} a={alpha:g} {knobs}", cfg)


def detector_grid(
    *, alphas: Iterable[float] = ALPHAS, tick_steps: Iterable[int] = TICK_STEPS
) -> list[Detector]:
    """Every configuration the benchmark compares: specon over alpha x normalize x aggregate,
    robust over alpha x normalize x variant, and specon paper mode (absolute G, last value)
    at alpha 0.01 — each at every Δ."""
    alphas, ticks = tuple(alphas), tuple(tick_steps)
    out: list[Detector] = []
    for d in ticks:
        out += [
            make_detector("specon", alpha=a, tick_steps=d, normalize=nz, aggregate=ag)
            for a in alphas
            for nz in NORMALIZE
            for ag in AGGREGATE
        ]
        out += [
            make_detector("robust", alpha=a, tick_steps=d, normalize=nz, robust=v)
            for a in alphas
            for nz in NORMALIZE
            for v in ROBUST_VARIANTS
        ]
        paper = make_detector("specon", alpha=0.01, tick_steps=d, normalize="none", aggregate="last")
        out.append(dataclasses.replace(paper, family="specon-paper a=0.01 none/last"))
    return out


@dataclass(frozen=True, slots=True)
class Detection:
    """One trace through one detector."""

    model: str
    steps: int
    step_cost: float
    truth_step: int
    request_step: float | None  # None: never asked

    @property
    def missed(self) -> bool:
        return self.request_step is None

    @property
    def early(self) -> bool:
        return self.request_step is not None and self.request_step < self.truth_step

    @property
    def delay(self) -> float | None:
        """Request minus ground truth, in steps (negative: too early)."""
        return None if self.request_step is None else self.request_step - self.truth_step

    @property
    def lateness(self) -> float:
        """max(0, delay) as a fraction of the job; a miss counts as detected at the end."""
        at = self.steps if self.request_step is None else self.request_step
        return max(0.0, at - self.truth_step) / self.steps


def detect(trace: Trace, detector: Detector, *, truth_step: int | None = None) -> Detection:
    """Replay ``trace`` through ``detector`` (steps as the clock) and compare to the truth."""
    records = [(float((i + 1) * trace.stride), loss) for i, loss in enumerate(trace.losses)]
    result = replay(records, detector.monitor)
    # The replay's clock starts at the first record, which sits at step ``stride``.
    request = None if result.request_at is None else result.request_at + trace.stride
    return Detection(
        model=trace.model,
        steps=trace.steps,
        step_cost=trace.step_cost,
        truth_step=ground_truth_step(trace) if truth_step is None else truth_step,
        request_step=request,
    )


@dataclass(frozen=True, slots=True)
class Score:
    """One detector over a set of traces (fractions are of curves or of job length)."""

    label: str
    family: str
    classifier: str
    alpha: float
    tick_steps: float
    curves: int
    false_early: float
    missed: float
    mean_lateness: float
    mean_delay: float | None  # signed, fraction of the job, over detected curves
    median_delay: float | None
    mean_delay_seconds: float | None  # signed, CPU-seconds at one full core

    def row(self) -> str:
        def pct(x: float | None) -> str:
            return "    -" if x is None else f"{100 * x:+5.1f}"

        secs = "    -" if self.mean_delay_seconds is None else f"{self.mean_delay_seconds:+6.1f}"
        return (
            f"{self.label:<40} late {100 * self.mean_lateness:5.1f}%  early {100 * self.false_early:5.1f}%"
            f"  missed {100 * self.missed:5.1f}%  delay mean {pct(self.mean_delay)}%"
            f" median {pct(self.median_delay)}%  ({secs} s)  n={self.curves}"
        )


def score(detector: Detector, detections: Sequence[Detection]) -> Score:
    """Summarise the detections of one detector (``ValueError`` for none)."""
    if not detections:
        raise ValueError("no detections to score")
    n = len(detections)
    found = [d for d in detections if d.delay is not None]
    fractions = [d.delay / d.steps for d in found if d.delay is not None]
    seconds = [d.delay * d.step_cost for d in found if d.delay is not None]
    return Score(
        label=detector.label,
        family=detector.family,
        classifier=detector.monitor.classifier,
        alpha=detector.monitor.alpha,
        tick_steps=detector.tick_steps,
        curves=n,
        false_early=sum(d.early for d in detections) / n,
        missed=sum(d.missed for d in detections) / n,
        mean_lateness=sum(d.lateness for d in detections) / n,
        mean_delay=statistics.fmean(fractions) if fractions else None,
        median_delay=statistics.median(fractions) if fractions else None,
        mean_delay_seconds=statistics.fmean(seconds) if seconds else None,
    )


def evaluate(traces: Sequence[Trace], detectors: Iterable[Detector]) -> list[Score]:
    """Score every detector on ``traces`` (each ground truth computed once)."""
    truths = [ground_truth_step(t) for t in traces]
    return [
        score(det, [detect(t, det, truth_step=gt) for t, gt in zip(traces, truths, strict=True)])
        for det in detectors
    ]


@dataclass(frozen=True, slots=True)
class FamilyScore:
    """One configuration over every Δ it was run at: Δ in steps varies with the worker's
    load, so a default must hold up at all of them."""

    label: str  # the family
    classifier: str
    alpha: float
    mean_lateness: float  # mean over the Δ values
    false_early: float  # the worst over the Δ values
    missed: float  # the worst over the Δ values
    tick_steps: tuple[float, ...]


def by_family(scores: Iterable[Score]) -> list[FamilyScore]:
    """Group ``scores`` by family (in first-seen order)."""
    groups: dict[str, list[Score]] = {}
    for s in scores:
        groups.setdefault(s.family, []).append(s)
    return [
        FamilyScore(
            label=family,
            classifier=group[0].classifier,
            alpha=group[0].alpha,
            mean_lateness=statistics.fmean(s.mean_lateness for s in group),
            false_early=max(s.false_early for s in group),
            missed=max(s.missed for s in group),
            tick_steps=tuple(s.tick_steps for s in group),
        )
        for family, group in groups.items()
    ]


class Ranked(Protocol):
    """What ``recommend`` ranks: a ``Score`` or a ``FamilyScore``."""

    @property
    def label(self) -> str: ...
    @property
    def mean_lateness(self) -> float: ...
    @property
    def false_early(self) -> float: ...
    @property
    def missed(self) -> float: ...


R = TypeVar("R", bound=Ranked)


def recommend(scores: Iterable[R], *, max_false_early: float = DEFAULT_MAX_FALSE_EARLY) -> R | None:
    """The score with the least lateness among those at most ``max_false_early`` too early
    (ties: fewer false-early, then the label); None if none qualifies."""
    ok = [s for s in scores if s.false_early <= max_false_early]
    return min(ok, key=lambda s: (s.mean_lateness, s.false_early, s.label), default=None)
