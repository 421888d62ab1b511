"""A job's quality point, estimated online from its own loss curve: the one definition the
``phased`` priority rule uses in the agent and in the simulator alike.

The *quality point* is the step after which a job has made 95 % of its final loss reduction
(time-to-quality, as SLAQ and Hermes measure; ``specon.sim.detection.ground_truth_step``
with hindsight). While a job trains, its final loss is not known, so it is estimated:

* ``share``: ``share`` of the job's steps (the fixed default, 35 %);
* ``curve``: the curve's own point so far (``knee``: where the smoothed best loss came within
  5 % of the improvement made so far) once the curve has stayed there for ``window`` of
  the job's steps (it flattened: quality reached); while it is still improving, no earlier
  than ``window`` of its steps ahead of now, and never before ``share`` of its steps (the
  fixed share until the curve says more);
* ``oracle``: the true point, where the caller knows it (only the simulator, from its
  trace): the yardstick of what a perfect estimate is worth; without it, ``share``.

Pure: numbers in, a step out. ``bench/bench_quality_point.py`` measures the estimates
against the recorded traces' true points (docs/priority.md).
"""

from __future__ import annotations

from collections.abc import Sequence

ESTIMATORS = ("share", "curve", "oracle")
# The share of its final improvement a job may still miss at its quality point.
FRACTION = 0.05
# Smoothing half-width as a share of the job's steps: the ground truth's ±50 steps of the
# recorded traces' 2,000.
SMOOTH_SHARE = 0.025
# How long (a share of the job's steps) a curve must stay within 5 % of its improvement so
# far before its point counts as reached, and how far ahead of now a still-improving job's
# point is put.
WINDOW = 0.2


def knee(losses: Sequence[float], half_width: int, fraction: float = FRACTION) -> int:
    """Index of the first loss whose smoothed best-so-far is within ``fraction`` of the
    improvement the whole sequence made (centred moving average over ±``half_width``
    points, shrunk symmetrically at the start and cut off at the end); 0 for none or a
    curve that never improved."""
    n = len(losses)
    if n == 0:
        return 0
    prefix = [0.0]
    for v in losses:
        prefix.append(prefix[-1] + v)
    best: list[float] = []
    for i in range(n):
        reach = min(half_width, i)
        lo, hi = i - reach, min(n, i + reach + 1)
        s = (prefix[hi] - prefix[lo]) / (hi - lo)
        best.append(s if not best or s < best[-1] else best[-1])
    total = best[0] - best[-1]
    if not total > 0:
        return 0
    limit = fraction * total
    return next(i for i, b in enumerate(best) if b - best[-1] < limit)


def curve_point(
    steps: Sequence[float], losses: Sequence[float], step: float, total: float, share: float
) -> float:
    """The ``curve`` estimate (module doc) from the points logged so far (``steps[i]`` the
    step of ``losses[i]``, ascending), at step ``step`` of ``total``."""
    floor = share * total
    n = min(len(steps), len(losses))
    if n < 2 or total <= 0:
        return floor
    spacing = (steps[n - 1] - steps[0]) / (n - 1)
    half = round(SMOOTH_SHARE * total / spacing) if spacing > 0 else 0
    at = steps[knee(losses[:n], half)]
    if step - at >= WINDOW * total:
        return at
    return max(floor, step + WINDOW * total)


def estimate(
    how: str,
    *,
    step: float,
    total: float,
    share: float,
    steps: Sequence[float] = (),
    losses: Sequence[float] = (),
    truth: float | None = None,
) -> float:
    """The quality step of a job at ``step`` of ``total`` by estimator ``how`` (module
    doc); ``truth`` the true quality step where known (``oracle``)."""
    if how == "oracle" and truth is not None:
        return truth
    if how == "curve":
        return curve_point(steps, losses, step, total, share)
    return share * total
