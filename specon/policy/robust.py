"""``classifier: robust`` — Algorithm 1 hardened against noisy and broken losses.

Same interface and state (``MonitorState``) as ``specon.policy.monitor``; what differs is
how a tick decides (knobs in ``RobustConfig``). Either test (``test``) decides when a job
has converged:

* ``doubling`` (default): would twice the training still pay? E is fitted by a line in
  log-time (u = ln t, t the ticks with an E so far), by least squares with weights
  ``(t_i / t) ** memory``, kept as running sums so a tick costs O(1). The slope per doubling
  of t is the improvement still to come if the job trained twice as long (a hyperbolic tail
  l = c + A/t falls by its whole remaining distance per e-fold). From the fourth tick, a
  job passes when that is below ``gain`` of its improvement so far (the worst E before its
  best, minus the best: the lowest tick E or fitted level), in either direction, and both
  the fitted level and the newest E sit within ``RISE`` of that above the best (a rise is
  not convergence). After ``confirm`` of its ticks so far in a row (at least one) it is
  converged and requests at once. A job that would pass at twice the gain is watching;
  one that no longer passes starts over (PC, request dropped), as specon's reset. Why
  log-time: it needs neither Δ nor the job's length, so one setting holds whether a job
  spans ten ticks or a hundred. What it cannot know is how long the job will still run
  (the ground truth's horizon), unless the job declared it: then (``horizon``: total
  steps / steps done) the test asks what the ground truth asks, would the *rest of the
  job* still pay? What the same slope leaves to come over the rest of the job, for a tail
  falling as t**-1/2 (``TAIL_EXPONENT``), must be below ``horizon_gain`` of the
  improvement so far (the job's speed so far stands in for its speed to come).
  ``bench_detection`` measures both forms.
* ``change``: E is smoothed with an EMA (``smoothing``) before differencing; each tick casts a
  vote, slow when the normalised change of the smoothed E is below alpha; a step needs ``k``
  of the last ``n`` votes to agree (hysteresis both ways: ``k`` fast votes reset to PC,
  ``k`` slow votes plus a flat trend advance one step); the trend test: the least-squares
  slope of the smoothed E over ``trend_window`` ticks, normalised like specon's G, must be
  below alpha before a job may advance.

Both tests share ``diverging``: over the trend window the smoothed E worsened (rose for
``minimize``, fell for ``maximize``) by more than ``diverge_threshold`` of its magnitude,
both along the fitted line and from the oldest to the newest value (so one spike, which
the line tilts towards but which fades from the newest value, does not count); or the
tick saw non-finite values. A diverging job never requests; it returns to PC once
neither holds. G (``last_g``, what the priority rules read) is the normalised change of
the smoothed E under either test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from operator import mul
from typing import TYPE_CHECKING

from specon.model import Category, Direction
from specon.policy.monitor import (
    MonitorState,
    aggregate_samples,
    normalised_change,
)
from specon.policy.plugin import ClassifierKind
from specon.policy.robust_config import RobustConfig, problems

if TYPE_CHECKING:  # the policy file's schema is built from the classifiers declared here
    from specon.config import MonitorConfig

# A declared job's loss is taken to end in the tail l = c + A·t**-TAIL_EXPONENT (SGD whose
# gradient noise dominates falls as t**-1/2): its log-time slope b then leaves
# |b|·(1 - r**-q)/q to come while the time grows r-fold. bench_detection chose q over
# 0.25/0.5/1/2 (ln r, the q -> 0 limit, was late on most curves).
TAIL_EXPONENT = 0.5
_PC, _WC, _CC, _DV = Category.PROGRESSING, Category.WATCHING, Category.CONVERGED, Category.DIVERGING

_LN2 = math.log(2.0)
# The doubling test decides from the fourth tick with an E: a line through fewer points is
# mostly noise (and the first tick may hold a single sample).
MIN_FIT_TICKS = 4
# A job passes only while its fitted level sits within this share of the gain limit above
# its best: more is a rise, e.g. the bottom of a U as a job starts to diverge, which a line
# through the last few ticks reads as flat (bench_detection's diverging curves).
RISE = 0.4
# Stages of the doubling test (``fit_tick``), in order.
FAR, NEAR, PASSING, CONFIRMED = 0, 1, 2, 3
# ``MonitorState.fit``: (t, Σw, Σw·u, Σw·u², Σw·y, Σw·u·y, worst y so far, the worst y when
# the best was set, best y or fitted level, passing ticks in a row), y = E signed so that lower is
# better. The improvement so far is measured from the worst y before the best, so a job
# that blew up after its best is not judged against its own blow-up.
_FIT_FIELDS = 10


@lru_cache(maxsize=64)
def _slope_weights(n: int) -> tuple[float, ...]:
    """w_i with slope = Σ w_i·y_i for the least-squares line through (i, y_i), i < n."""
    mean = (n - 1) / 2
    sxx = sum((i - mean) ** 2 for i in range(n))
    return tuple((i - mean) / sxx for i in range(n))


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` per tick (0 for fewer than two points)."""
    if len(values) < 2:
        return 0.0
    weights: tuple[float, ...] = _slope_weights(len(values))
    return sum(map(mul, weights, values), 0.0)


def tick(
    state: MonitorState,
    samples: Sequence[float],
    now: float,
    cfg: MonitorConfig,
    *,
    nonfinite: int = 0,
    horizon: float | None = None,
) -> MonitorState:
    """One tick of the robust classifier; ``nonfinite`` counts NaN/inf values this tick;
    ``horizon`` is the job's declared length over its length so far (total steps / steps
    done, >= 1), None when it declared none (module doc: the doubling test's two forms).

    Written for speed (it runs for every container every Δ): states are built
    positionally and config lookups are hoisted.
    """
    if state.migrated:
        return state
    rc = cfg.robust
    e = aggregate_samples(samples, cfg.aggregate)
    # A tick that saw only non-finite values is not silent: the job is alive and broken.
    run = 0 if e is not None or nonfinite > 0 else state.stale_run + 1
    if e is None and nonfinite == 0 and cfg.stale == "zero" and state.last_e is not None:
        e = state.last_e  # paper mode: the previous value is returned
    stalled = 0 < cfg.stale_ticks <= run

    if e is None:
        category = _DV if nonfinite > 0 else state.category
        return MonitorState(
            category,
            state.direction,
            state.ticks + 1,
            state.last_e,
            state.last_g,
            state.max_abs_e,
            run,
            stalled,
            state.t_cc,
            False,
            state.pending_request and category is not _DV,
            False,
            None,
            state.smoothed,
            state.votes,
            _reset_run(state.fit) if category is _DV else state.fit,
        )

    alpha = cfg.alpha
    max_abs = state.max_abs_e if state.max_abs_e >= abs(e) else abs(e)
    window = state.smoothed
    prev = window[-1] if window else None
    smoothing = rc.smoothing
    ema = e if prev is None else smoothing * e + (1.0 - smoothing) * prev
    size = rc.trend_window
    window = (*window[len(window) - size + 1 :], ema) if len(window) >= size else (*window, ema)
    category, t_cc, pending, wants = state.category, state.t_cc, state.pending_request, False
    g: float | None = None
    votes = state.votes
    doubling = rc.test == "doubling"
    if prev is not None:
        g = normalised_change(ema - prev, prev, max_abs, cfg.normalize)
        if not doubling:  # only the change test votes
            n = rc.n
            votes = (*votes[len(votes) - n + 1 :], g < alpha) if len(votes) >= n else (*votes, g < alpha)

    full = len(window) >= size >= 2
    # Worse from oldest to newest at all? One subtraction screens out the usual case
    # before the full divergence test (a call and a fit) runs.
    sign = 1.0 if state.direction is Direction.MINIMIZE else -1.0
    fit = state.fit
    stage = FAR
    if doubling:
        fit, stage = fit_tick(fit, sign * e, rc, horizon)
    if nonfinite > 0 or (
        full and sign * (window[-1] - window[0]) > 0.0 and _diverging(window, sign, rc.diverge_threshold)
    ):
        category, pending = _DV, False
        fit = _reset_run(fit)
    elif category is _DV:
        category = _PC  # recovered: start over
    elif doubling:
        if stage == CONFIRMED:
            if category is not _CC:
                category, t_cc = _CC, now
            wants = True
        else:  # not (or no longer) converged: a converged job starts over, as specon's reset
            category, pending = (_PC if stage == FAR or category is _CC else _WC), False
    elif prev is not None:
        slow = sum(votes)
        k = rc.k
        if len(votes) - slow >= k:
            category, pending = _PC, False
        elif (
            slow >= k
            and full
            and normalised_change(slope(window), sum(window) / size, max_abs, cfg.normalize) < alpha
        ):
            if category is _PC:
                category = _WC
            elif category is _WC:
                category, t_cc = _CC, now
            else:
                wants = True
    return MonitorState(
        category,
        state.direction,
        state.ticks + 1,
        e,
        g,
        max_abs,
        run,
        stalled,
        t_cc,
        wants,
        pending,
        False,
        None,
        window,
        votes,
        fit,
    )


# ``classifier: robust`` (``specon.policy.classifier``), its knobs ``monitor.robust``.
CLASSIFIER = ClassifierKind(
    name="robust",
    summary="smoothed, with the doubling or the change test and a diverging state",
    doc="Knobs of the robust classifier (used only with classifier: robust)",
    args=RobustConfig,
    problems=problems,
    tick=tick,
    rank=20,
)


def fit_tick(
    fit: tuple[float, ...], y: float, rc: RobustConfig, horizon: float | None = None
) -> tuple[tuple[float, ...], int]:
    """Add one tick's ``y`` (E signed so that lower is better) to the doubling test's fit;
    ``horizon`` (total / done, None: undeclared) picks the test's form (module doc).

    Returns the new fit and the stage the test reached: ``FAR``, ``NEAR`` (it would pass at
    twice the gain: watching), ``PASSING`` (not yet confirmed) or ``CONFIRMED`` (module doc).
    A fit of another length (e.g. from an older agent) starts over.
    """
    if len(fit) == _FIT_FIELDS:
        t0, s0, s1, s2, sy, suy, worst, start, best, streak = fit
        t = t0 + 1.0
        u = math.log(t)
        decay = (t0 / t) ** rc.memory
        s0 = s0 * decay + 1.0
        s1 = s1 * decay + u
        s2 = s2 * decay + u * u
        sy = sy * decay + y
        suy = suy * decay + u * y
        worst = y if y > worst else worst
        if y < best:
            best, start = y, worst
    else:  # the first tick: t = 1, u = 0
        t, u, s0, s1, s2, sy, suy, worst, start, best, streak = 1.0, 0.0, 1.0, 0.0, 0.0, y, 0.0, y, y, y, 0.0
    stage = FAR
    den = s0 * s2 - s1 * s1
    if t >= MIN_FIT_TICKS and den > 0.0:
        per_efold = (s0 * suy - s1 * sy) / den
        level = (sy - per_efold * s1) / s0 + per_efold * u
        if level < best:
            best, start = level, worst
        if horizon is None:  # would twice the training still pay?
            limit, ahead = rc.gain * (start - best), _LN2
        else:  # would the rest of the job still pay?
            limit, ahead = rc.horizon_gain * (start - best), _tail_left(horizon)
        # How far from passing: the larger of the gain still to come and the rise (fitted
        # level, newest E) above the best, each against its own limit.
        need = max(abs(per_efold) * ahead, (level - best) / RISE, (y - best) / RISE)
        if limit > 0.0 and need < 2.0 * limit:
            stage = NEAR
            if need < limit:
                streak += 1.0
                stage = CONFIRMED if streak >= rc.confirm * t else PASSING
    if stage < PASSING:
        streak = 0.0
    return (t, s0, s1, s2, sy, suy, worst, start, best, streak), stage


def _tail_left(horizon: float) -> float:
    """The e-folds of improvement a tail at ``TAIL_EXPONENT`` still has in ``horizon`` x time."""
    q = TAIL_EXPONENT
    return (1.0 - math.pow(max(1.0, horizon), -q)) / q


def trend(fit: tuple[float, ...]) -> tuple[float, float] | None:
    """The doubling test's view of ``fit``: (fitted level now, improvement a doubling of the
    training would bring; negative when rising), y-units, or None before the line exists."""
    if len(fit) != _FIT_FIELDS or fit[0] < 2:
        return None
    t, s0, s1, s2, sy, suy = fit[:6]
    den = s0 * s2 - s1 * s1
    if den <= 0.0:
        return None
    per_efold = (s0 * suy - s1 * sy) / den
    return (sy - per_efold * s1) / s0 + per_efold * math.log(t), -per_efold * _LN2


def _reset_run(fit: tuple[float, ...]) -> tuple[float, ...]:
    """The fit with its run of passing ticks cleared (a diverging tick breaks it)."""
    return (*fit[:-1], 0.0) if len(fit) == _FIT_FIELDS else fit


def _diverging(window: Sequence[float], sign: float, threshold: float) -> bool:
    """Whether the window worsened by more than ``threshold`` of its magnitude (see module doc).

    ``sign`` is +1 when a rise is bad (minimize), -1 when a fall is. The magnitude is the
    larger of |oldest| and |newest|; the cheap end-to-end test runs before the fit.
    """
    first, last = window[0], window[-1]
    limit = threshold * max(abs(first), abs(last))
    return sign * (last - first) > limit and sign * slope(window) * (len(window) - 1) > limit
