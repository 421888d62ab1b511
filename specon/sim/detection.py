"""The convergence-detection benchmark: how many ticks late, or early, a classifier asks to
move a job, measured on loss curves — and whether it ever asks to move a diverging one.

**Ground truth** (issue 10, item 8). S is the smoothed loss, a centred moving average over
±``SMOOTH_HALF_WIDTH_STEPS`` steps (near the start the window shrinks symmetrically, so S
starts at the first loss; near the end it is cut off); B is its best so far, B[i] =
min(S[:i+1]). The job has converged at the first point where B is within
``GROUND_TRUTH_FRACTION`` (5 %) of its final improvement: B[i] - B[-1] < 5 % of
B[0] - B[-1]. A curve that never improves has converged at its first point. Losses are
minimised.

**Ticks.** Lateness is counted in ticks of the real Δ = 30 s. How many steps a tick covers
depends on how long the job runs: a job of the simulator's scenarios (``specon.sim.scenarios``)
runs its trace's steps in its completion time, which the calibration puts at 295-885 s under
DS (A1-A5), i.e. 10-30 ticks of 30 s. So every curve is replayed as a job of ``JOB_TICKS``
(10, 20 and 30) ticks: Δ = steps / ticks training steps (the replay's clock counts steps, so
a detector sees what the agent sees at that pace). The truth tick is the first tick at or
after the truth step (the first at which an oracle could ask); a detection is the first
tick that would send a reallocation request; lateness = detection tick - truth tick.

**Target** (per curve and job length): at most ``TARGET_LATE`` (2) ticks late, never more
than ``TARGET_EARLY`` (1) tick early, never missed, and no request on a diverging curve.

**Diverging curves** (``diverging_set``): a recorded curve that turns upward part-way and
grows exponentially, as with a learning rate too high, either to the end (``explode``) or
until it reads NaN (``nan``). The onset lies where the curve has made 30-70 % of its
improvement (in its steep fall, as a learning rate too high shows early), the growth outruns
the curve's own fall at the onset, and both come from a seed. Any request on one is a
failure.

Pure: curves in, scores out. The classifier replayed is the agent's own
(``specon.policy.replay.replay``), fed the curve's raw mini-batch losses as logged samples.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from specon.config import MonitorConfig
from specon.policy.quality_point import knee
from specon.policy.replay import replay
from specon.policy.robust_config import RobustConfig
from specon.sim.trace import Trace

GROUND_TRUTH_FRACTION = 0.05
SMOOTH_HALF_WIDTH_STEPS = 50
JOB_TICKS = (10, 20, 30)
TARGET_LATE = 2
TARGET_EARLY = 1
DIVERGE_KINDS = ("explode", "nan")
# A diverging curve's growth factor stops here (the values stay finite); ``nan`` curves read
# NaN once the factor passes NAN_AFTER.
_MAX_GROWTH = 1e6
NAN_AFTER = 10.0


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
    """Index of the first point where the smoothed best-so-far loss is within ``fraction``
    of its final improvement (module doc). ``ValueError`` for no losses."""
    if not losses:
        raise ValueError("no losses")
    return knee(losses, half_width, fraction)  # one definition with the agents' estimate


def ground_truth_step(trace: Trace, *, fraction: float = GROUND_TRUTH_FRACTION) -> int:
    """The training step at which ``trace`` has converged (module doc)."""
    half_width = max(0, round(SMOOTH_HALF_WIDTH_STEPS / trace.stride))
    return (ground_truth_index(trace.losses, half_width=half_width, fraction=fraction) + 1) * trace.stride


@dataclass(frozen=True, slots=True)
class Curve:
    """A loss curve to replay: a trace, or a diverging variant of one (NaN allowed).

    ``losses[i]`` is the loss after step ``(i + 1) * stride``. ``truth_step`` is None for a
    diverging curve (it must never be asked for).
    """

    model: str
    steps: int
    stride: int
    losses: tuple[float, ...]
    truth_step: int | None
    label: str = ""

    @property
    def diverging(self) -> bool:
        return self.truth_step is None

    @staticmethod
    def of(trace: Trace, label: str = "") -> Curve:
        return Curve(
            trace.model,
            trace.steps,
            trace.stride,
            trace.losses,
            ground_truth_step(trace),
            label or trace.source,
        )


def diverge(trace: Trace, *, onset: int, rate: float, kind: str) -> tuple[float, ...]:
    """``trace``'s losses multiplied by exp(rate·(step - onset)) after step ``onset`` (capped at
    ``_MAX_GROWTH``); ``kind`` ``nan``: NaN from the first point the factor passes NAN_AFTER."""
    if kind not in DIVERGE_KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(DIVERGE_KINDS)}")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be > 0, got {rate}")
    out = []
    blown = False
    for i, loss in enumerate(trace.losses):
        factor = min(_MAX_GROWTH, math.exp(min(700.0, rate * max(0, (i + 1) * trace.stride - onset))))
        blown = blown or (kind == "nan" and factor > NAN_AFTER)
        out.append(math.nan if blown else loss * factor)
    return tuple(out)


def diverging_set(traces: Iterable[Trace], *, seed: int) -> list[Curve]:
    """One curve of each ``DIVERGE_KINDS`` per trace (module doc), seeded by ``seed``.

    The onset is where the smoothed curve has made 30-70 % of its improvement (still in its
    steep fall, far from converged); the growth per step is at least twice the curve's
    relative fall there, so it turns upward at once, and it doubles at least every 5-15 %
    of the job.
    """
    rng = random.Random(seed)
    out = []
    for trace in traces:
        s = smooth(trace.losses, max(1, round(SMOOTH_HALF_WIDTH_STEPS / trace.stride)))
        low = min(s)
        for kind in DIVERGE_KINDS:
            made = rng.uniform(0.3, 0.7)
            i = next((j for j, v in enumerate(s) if s[0] - v >= made * (s[0] - low)), 0)
            i = min(i, len(s) - 2)
            onset = (i + 1) * trace.stride
            fall = max(0.0, (s[i] - s[i + 1]) / (trace.stride * abs(s[i]))) if s[i] else 0.0
            rate = max(2.0 * fall, math.log(2.0) / (trace.steps * rng.uniform(0.05, 0.15)))
            label = f"{trace.model} {kind} from step {onset}, x2 every {math.log(2.0) / rate:.0f} steps"
            losses = diverge(trace, onset=onset, rate=rate, kind=kind)
            out.append(Curve(trace.model, trace.steps, trace.stride, losses, None, label))
    return out


# --- replay ----------------------------------------------------------------------------------


def request_tick(curve: Curve, cfg: MonitorConfig, job_ticks: int, *, declared: bool = False) -> int | None:
    """The first tick at which ``cfg``'s classifier would ask to move ``curve`` replayed as a
    job of ``job_ticks`` ticks (module doc), or None; ``declared``: the job declared its
    length (its steps), so the classifier knows its horizon each tick."""
    interval = curve.steps / job_ticks
    records = [(float((i + 1) * curve.stride), loss) for i, loss in enumerate(curve.losses)]
    # The replay's clock starts at the first record, one stride into the job.
    length = float(curve.steps - curve.stride) if declared else None
    result = replay(records, dataclasses.replace(cfg, interval=interval), length=length)
    # The replay's clock starts at the first record; its ticks are whole multiples of Δ.
    return None if result.request_at is None else round(result.request_at / interval)


def truth_tick(curve: Curve, job_ticks: int) -> int | None:
    """The first tick at or after the truth step (None for a diverging curve)."""
    if curve.truth_step is None:
        return None
    interval = curve.steps / job_ticks
    return max(0, math.ceil((curve.truth_step - curve.stride) / interval - 1e-9))


@dataclass(frozen=True, slots=True)
class Detection:
    """One curve replayed as a job of ``job_ticks`` ticks."""

    model: str
    job_ticks: int
    truth: int | None  # truth tick; None: a diverging curve
    request: int | None  # None: never asked

    @property
    def late(self) -> int | None:
        """Request tick minus truth tick (negative: early); None if either is missing."""
        return None if self.request is None or self.truth is None else self.request - self.truth

    @property
    def failed(self) -> bool:
        """Outside the target: too late, too early, missed, or a request on a diverging curve."""
        if self.truth is None:
            return self.request is not None
        late = self.late
        return late is None or not -TARGET_EARLY <= late <= TARGET_LATE


def detect(curve: Curve, cfg: MonitorConfig, job_ticks: int, *, declared: bool = False) -> Detection:
    return Detection(
        curve.model,
        job_ticks,
        truth_tick(curve, job_ticks),
        request_tick(curve, cfg, job_ticks, declared=declared),
    )


@dataclass(frozen=True, slots=True)
class Summary:
    """Detections of one configuration on one set of curves (e.g. one model's)."""

    curves: int  # detections, i.e. curves x job lengths
    median_late: float | None  # over the detected converging curves
    max_late: int | None
    min_late: int | None
    early: int  # more than TARGET_EARLY ticks early
    too_late: int  # more than TARGET_LATE ticks late
    missed: int  # converging curves never asked for
    diverging: int  # diverging curves replayed
    diverging_requested: int
    failures: int  # detections outside the target (each counted once)

    @property
    def met(self) -> bool:
        return self.failures == 0


def summarise(detections: Iterable[Detection]) -> Summary:
    ds = list(detections)
    lates = [d.late for d in ds if d.late is not None]
    converging = [d for d in ds if d.truth is not None]
    diverging = [d for d in ds if d.truth is None]
    return Summary(
        curves=len(ds),
        median_late=statistics.median(lates) if lates else None,
        max_late=max(lates, default=None),
        min_late=min(lates, default=None),
        early=sum(late < -TARGET_EARLY for late in lates),
        too_late=sum(late > TARGET_LATE for late in lates),
        missed=sum(d.request is None for d in converging),
        diverging=len(diverging),
        diverging_requested=sum(d.request is not None for d in diverging),
        failures=sum(d.failed for d in ds),
    )


def run(
    curves: Iterable[Curve],
    cfg: MonitorConfig,
    *,
    job_ticks: Sequence[int] = JOB_TICKS,
    declared: bool = False,
) -> list[Detection]:
    """Every curve at every job length, in that order (``declared``: ``request_tick``)."""
    return [detect(c, cfg, n, declared=declared) for c in curves for n in job_ticks]


def by_model(detections: Iterable[Detection]) -> dict[str, Summary]:
    groups: dict[str, list[Detection]] = {}
    for d in detections:
        groups.setdefault(d.model, []).append(d)
    return {m: summarise(ds) for m, ds in sorted(groups.items())}


# --- the candidates the benchmark ranks ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    label: str
    monitor: MonitorConfig


def candidates(base: MonitorConfig | None = None) -> list[Candidate]:
    """The configurations the benchmark compares (Δ is set per replay): ``specon`` over alpha,
    ``robust`` with the change test at its knobs' defaults, and ``robust`` with the doubling
    test over gain x memory x confirm. ``base`` supplies every other knob."""
    b = MonitorConfig() if base is None else base
    out = [
        Candidate(f"specon a={a:g}", dataclasses.replace(b, classifier="specon", alpha=a))
        for a in (0.005, 0.01, 0.02, 0.05)
    ]
    out.append(
        Candidate(
            "robust change a=0.01",
            dataclasses.replace(b, classifier="robust", alpha=0.01, robust=RobustConfig(test="change")),
        )
    )
    for gain in (0.07, 0.09, 0.11, 0.13):
        for memory in (4.0, 5.0, 7.0, 10.0):
            for confirm in (0.0, 0.1):
                rc = RobustConfig(test="doubling", gain=gain, memory=memory, confirm=confirm)
                label = f"robust doubling gain={gain:g} memory={memory:g} confirm={confirm:g}"
                out.append(Candidate(label, dataclasses.replace(b, classifier="robust", robust=rc)))
    return out


HORIZON_GAINS = (0.06, 0.08, 0.09, 0.1, 0.11, 0.12, 0.14)


def horizon_candidates(base: MonitorConfig | None = None) -> list[Candidate]:
    """The ``horizon_gain`` settings the benchmark compares for jobs that declared their
    length (replayed with ``declared=True``); ``base`` supplies every other knob."""
    b = MonitorConfig() if base is None else base
    return [
        Candidate(
            f"horizon_gain={g:g}",
            dataclasses.replace(b, robust=dataclasses.replace(b.robust, horizon_gain=g)),
        )
        for g in HORIZON_GAINS
    ]


def rank_key(recorded: Summary, synthetic: Summary) -> tuple[float, int, float]:
    """How the benchmark ranks candidates, best first: the share of converging curves (x job
    lengths) outside the target on recorded curves plus that share on synthetic ones (equal
    weights; a request on a diverging curve, in either summary, disqualifies: 2.0), then fewer
    early, then how far the recorded median lateness is from the middle of the target window."""

    def share(s: Summary) -> float:
        converging = s.curves - s.diverging
        return (s.failures - s.diverging_requested) / converging if converging else 0.0

    total = share(recorded) + share(synthetic)
    if recorded.diverging_requested or synthetic.diverging_requested:
        total = 2.0
    middle = (TARGET_LATE - TARGET_EARLY) / 2
    off = abs((recorded.median_late if recorded.median_late is not None else 99.0) - middle)
    return total, recorded.early + synthetic.early, off


def best(scores: Mapping[str, tuple[Summary, Summary]]) -> str:
    """The label with the best ``rank_key`` (ties: the label)."""
    return min(scores, key=lambda label: (rank_key(*scores[label]), label))
