"""``classifier: robust`` — Algorithm 1 hardened against noisy and broken losses.

Same interface and state (``MonitorState``) as ``specon.policy.monitor``; what differs is
how a tick decides (knobs in ``RobustConfig``):

* E is smoothed with an EMA (``smoothing``) before differencing, so mini-batch noise does
  not read as "slowing" or "progressing";
* each tick casts a vote, slow when the normalised change of the smoothed E is below alpha;
  a step needs ``k`` of the last ``n`` votes to agree (hysteresis in both directions:
  ``k`` fast votes reset to PC, ``k`` slow votes plus a flat trend advance one step);
* the trend test: the least-squares slope of the smoothed E over ``trend_window`` ticks,
  normalised like specon's G, must be below alpha before a job may advance;
* ``diverging``: over the trend window the smoothed E worsened (rose for ``minimize``,
  fell for ``maximize``) by more than ``diverge_threshold`` of its magnitude, both along
  the fitted line and from the oldest to the newest value (so one spike, which the line
  tilts towards but which fades from the newest value, does not count); or the tick saw
  non-finite values. A diverging job never requests; it returns to PC once neither holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from operator import mul

from specon.config import MonitorConfig
from specon.model import Category, Direction
from specon.policy.monitor import (
    MonitorState,
    aggregate_samples,
    normalised_change,
)

_PC, _WC, _CC, _DV = Category.PROGRESSING, Category.WATCHING, Category.CONVERGED, Category.DIVERGING


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
) -> MonitorState:
    """One tick of the robust classifier; ``nonfinite`` counts NaN/inf values this tick.

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
    if prev is not None:
        g = normalised_change(ema - prev, prev, max_abs, cfg.normalize)
        n = rc.n
        votes = (*votes[len(votes) - n + 1 :], g < alpha) if len(votes) >= n else (*votes, g < alpha)

    full = len(window) >= size >= 2
    # Worse from oldest to newest at all? One subtraction screens out the usual case
    # before the full divergence test (a call and a fit) runs.
    sign = 1.0 if state.direction is Direction.MINIMIZE else -1.0
    if nonfinite > 0 or (
        full and sign * (window[-1] - window[0]) > 0.0 and _diverging(window, sign, rc.diverge_threshold)
    ):
        category, pending = _DV, False
    elif category is _DV:
        category = _PC  # recovered: start over
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
    )


def _diverging(window: Sequence[float], sign: float, threshold: float) -> bool:
    """Whether the window worsened by more than ``threshold`` of its magnitude (see module doc).

    ``sign`` is +1 when a rise is bad (minimize), -1 when a fall is. The magnitude is the
    larger of |oldest| and |newest|; the cheap end-to-end test runs before the fit.
    """
    first, last = window[0], window[-1]
    limit = threshold * max(abs(first), abs(last))
    return sign * (last - first) > limit and sign * slope(window) * (len(window) - 1) > limit
