"""A job's quality point, estimated online from its own loss curve: the one definition the
``phased`` priority rule uses in the agent and in the simulator alike.

The *quality point* is the step after which a job has made 95 % of its final loss reduction
(time-to-quality, as SLAQ and Hermes measure; ``specon.sim.detection.ground_truth_step``
with hindsight). While a job trains, its final loss is not known, so it is estimated:

* ``share``: ``share`` of the job's steps (the fixed default, 35 %);
* ``curve``: the curve's own point so far (``knee``: where the smoothed best loss came within
  5 % of the improvement made so far) once the curve has stayed there for ``WINDOW`` of
  the job's steps (it flattened: quality reached, possibly before the share); while it
  still improves, ``WINDOW`` of its steps ahead of now and never before ``share`` of its
  steps (the fixed share until the curve says more);
* ``memory``: the median share of the steps at which the finished jobs of the same model
  reached theirs on this cluster (``specon.policy.quality_memory``: each measured by ``knee``
  over its whole curve, the ground truth's definition), the ``curve`` estimate until one of
  that model finished;
* ``oracle``: the true point, where the caller knows it (only the simulator, from its
  trace): the yardstick of what a perfect estimate is worth; without it, ``share``.

Pure: numbers in, a step out. ``bench/bench_quality_point.py`` measures the estimates
against the recorded traces' true points (docs/priority.md).
"""

from __future__ import annotations

from collections.abc import Sequence

ESTIMATORS = ("share", "curve", "memory", "oracle")
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
    limit = fraction * total  # 0 for a fall too small to scale (subnormal): the last point
    return next((i for i, b in enumerate(best) if b - best[-1] < limit), n - 1)


def curve_knee(steps: Sequence[float], losses: Sequence[float], total: float) -> float | None:
    """The step of ``knee`` of a curve logged at ``steps``, smoothed over ``SMOOTH_SHARE`` of
    ``total`` steps (None: fewer than two points)."""
    n = min(len(steps), len(losses))
    if n < 2 or total <= 0:
        return None
    spacing = (steps[n - 1] - steps[0]) / (n - 1)
    half = round(SMOOTH_SHARE * total / spacing) if spacing > 0 else 0
    return steps[knee(losses[:n], half)]


def finished_share(steps: Sequence[float], losses: Sequence[float], total: float) -> float | None:
    """A finished job's quality point as a share of its ``total`` steps, from its whole
    curve (None: too few points to say)."""
    at = curve_knee(steps, losses, total)
    return None if at is None else min(1.0, max(0.0, at / total))


def curve_point(
    steps: Sequence[float], losses: Sequence[float], step: float, total: float, share: float
) -> float:
    """The ``curve`` estimate (module doc) from the points logged so far (``steps[i]`` the
    step of ``losses[i]``, ascending), at step ``step`` of ``total``."""
    floor = share * total
    at = curve_knee(steps, losses, total)
    if at is None:
        return floor
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
    recalled: float | None = None,
) -> float:
    """The quality step of a job at ``step`` of ``total`` by estimator ``how`` (module
    doc); ``truth`` the true quality step where known (``oracle``), ``recalled`` its model's
    share on this cluster (``memory``: ``quality_memory.recall``)."""
    if how == "oracle" and truth is not None:
        return truth
    if how == "memory" and recalled is not None:
        return recalled * total
    if how in {"curve", "memory"}:
        return curve_point(steps, losses, step, total, share)
    return share * total
