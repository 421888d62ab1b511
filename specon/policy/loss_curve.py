"""Optimus' loss curve ``l(k) = 1/(β0·k + β1) + β2`` and its least-squares fit.

Optimus (Peng et al., EuroSys'18) models a training loss after ``k`` steps this way. The
agent predicts a job's remaining steps from it (``specon.policy.remaining``) and the simulator
fits recorded models with it (``specon.sim.curves``).

The fit works on the better-conditioned form ``l(k) = A/(1 + a·k) + β2`` (A = 1/β1,
a = β0/β1). For a fixed rate ``a`` the curve is linear in (A, β2), so those come from
ordinary least squares, and only ``a`` is searched: on a log grid, then by golden
section around the best grid point (variable projection). A noiseless Optimus curve is
recovered to within rounding. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]

# Search range of the rate a = β0/β1, per step: from "barely bends in 10^6 steps" to
# "halves within a tenth of a step".
_LOG_RATE_RANGE = (-9.0, 1.0)
_GRID = 201
_GOLDEN_ITERATIONS = 80


@dataclass(frozen=True, slots=True)
class CurveParams:
    """Optimus' β: ``loss(k) = 1/(beta0·k + beta1) + beta2``; beta0, beta1 > 0."""

    beta0: float
    beta1: float
    beta2: float

    def __post_init__(self) -> None:
        if not all(math.isfinite(b) for b in (self.beta0, self.beta1, self.beta2)):
            raise ValueError(f"β must be finite, got {self.beta0}, {self.beta1}, {self.beta2}")
        if self.beta0 <= 0 or self.beta1 <= 0:
            raise ValueError(f"beta0 and beta1 must be > 0 (a falling curve), got {self.beta0}, {self.beta1}")

    def loss(self, step: float) -> float:
        return 1.0 / (self.beta0 * step + self.beta1) + self.beta2

    def losses(self, steps: npt.ArrayLike) -> Array:
        k = np.asarray(steps, dtype=np.float64)
        out: Array = 1.0 / (self.beta0 * k + self.beta1) + self.beta2
        return out


def _project(k: Array, y: Array, log_rate: float) -> tuple[float, float, float]:
    """For rate ``10**log_rate``: least-squares (A, β2) and the squared error."""
    g = 1.0 / (1.0 + 10.0**log_rate * k)
    design = np.column_stack((g, np.ones_like(g)))
    (amp, floor), *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - (amp * g + floor)
    return float(amp), float(floor), float(resid @ resid)


def fit_optimus(steps: Iterable[float], losses: Iterable[float]) -> CurveParams:
    """Least-squares β of Optimus' curve through the points ``(steps[i], losses[i])``.

    ``ValueError`` if there are fewer than 3 finite points, fewer than 3 distinct steps,
    or the best fit does not fall (the model needs a falling curve).
    """
    k = np.asarray(list(steps), dtype=np.float64)
    y = np.asarray(list(losses), dtype=np.float64)
    if k.shape != y.shape:
        raise ValueError(f"steps and losses differ in length: {k.size} and {y.size}")
    keep = np.isfinite(k) & np.isfinite(y)
    k, y = k[keep], y[keep]
    if k.size < 3 or np.unique(k).size < 3:
        raise ValueError(f"need at least 3 finite points at distinct steps, got {k.size}")
    grid = np.linspace(*_LOG_RATE_RANGE, _GRID)
    errors = [_project(k, y, r)[2] for r in grid]
    best = int(np.argmin(errors))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, _GRID - 1)]
    # Golden-section search for the minimum of the error over log(rate) in [lo, hi].
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = hi - inv_phi * (hi - lo), lo + inv_phi * (hi - lo)
    fc, fd = _project(k, y, c)[2], _project(k, y, d)[2]
    for _ in range(_GOLDEN_ITERATIONS):
        if fc < fd:
            hi, d, fd = d, c, fc
            c = hi - inv_phi * (hi - lo)
            fc = _project(k, y, c)[2]
        else:
            lo, c, fc = c, d, fd
            d = lo + inv_phi * (hi - lo)
            fd = _project(k, y, d)[2]
    log_rate = (lo + hi) / 2.0
    amp, floor, _ = _project(k, y, log_rate)
    if not amp > 0:
        raise ValueError("the points do not fall: Optimus' curve does not fit them")
    rate = 10.0**log_rate
    return CurveParams(beta0=float(rate / amp), beta1=1.0 / amp, beta2=floor)
