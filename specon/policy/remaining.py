"""Steps left to convergence, predicted from the loss curve alone (Optimus, EuroSys '18).

For a job that declares no total, Optimus fits l(k) = 1/(β0·k + β1) + β2 to its losses
(``specon.policy.loss_curve.fit_optimus``: least squares by variable projection, numpy only) and
takes convergence to be where the curve has made all but ``share`` of its total
improvement l(0) - β2: 1/(β0·k + β1) <= share/β1, i.e. k* = (1/share - 1)·β1/β0. The steps
left are k* minus the steps done (0 once past it). ``share`` 0.05 matches the ground truth
of the detection benchmark (95 % of the final improvement).

**The fairness bound.** A prediction may be far off: early in a job the fit often puts
convergence thousands of times further than the job will run (a curve still in its steep
fall bends little yet), and a job predicted that long would wait behind every other job
whatever its deficit against equal sharing (the rules age a job by that deficit, ``fsp``
and ``phased``, but no deficit catches up with a prediction that large). So the steps left
are never predicted above ``ATTAINED_BOUND`` times the steps the job has done: a job held
back grows its deficit while its bound stays put, so it reaches the front after waiting
at most about that multiple of its own attained service, however wrong the fit.
``ATTAINED_BOUND`` 8 was chosen on ``bench_sim``'s ``specon-predicted`` row (on A4, 3 and
16 did no better; 1 and 2, close to Tiresias's order, lost most of the gain).

A fit needs ``MIN_POINTS`` (3) samples and a falling curve; otherwise the prediction is None
(unknown), and the priority rules treat the job as of unknown size, after every job of
known size. So a fit is made as soon as a curve has as many points as parameters: a job
held back before its first fit logs its samples slowly and would stay unknown, and last,
for long (with 8 points, up to x4.7 its DS time in ``bench_sim``); an early fit is often
far off, and the bound keeps that harmless. At most ``MAX_POINTS``
samples, evenly spaced, enter a fit, so its cost stays bounded however long a job runs.
A job's fit (``Fit``) is redone only once it has logged ``REFIT_GROWTH`` times the samples
of its last fit (``refit``); between fits the steps left count down from the predicted
convergence step. The agent and the simulator keep one ``Fit`` per job alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specon.policy.loss_curve import fit_optimus

# As few points as a curve has parameters: an early fit is often far off, but the bound
# below keeps it harmless, and a job with no fit at all is ranked after every job with one
# (bench_sim: 8 points let a job held back before its eighth sample wait x4.7 its DS time).
MIN_POINTS = 3
MAX_POINTS = 64
SHARE = 0.05
# A fit costs about 6 ms: redo it once the samples grew by a tenth, not every tick.
REFIT_GROWTH = 1.1
# Predicted steps left <= this times the steps done (the fairness bound, module doc).
ATTAINED_BOUND = 8.0


def steps_to_converge(
    steps: Sequence[float], losses: Sequence[float], *, share: float = SHARE
) -> float | None:
    """k*: the step at which the fitted curve is within ``share`` of its floor (None: no fit)."""
    if len(steps) != len(losses) or len(steps) < MIN_POINTS:
        return None
    stride = max(1, math.ceil(len(steps) / MAX_POINTS))
    try:
        fit = fit_optimus(steps[::stride], losses[::stride])
    except ValueError:
        return None
    k = (1.0 / share - 1.0) * fit.beta1 / fit.beta0
    return k if math.isfinite(k) else None


def steps_left(steps: Sequence[float], losses: Sequence[float], *, share: float = SHARE) -> float | None:
    """Predicted steps from the last sample to convergence, within the fairness bound
    (``bounded``; None: no fit)."""
    k = steps_to_converge(steps, losses, share=share)
    return None if k is None else bounded(k, steps[-1])


def bounded(converge_at: float, step: float) -> float:
    """Steps from ``step`` to ``converge_at``, at least 0 and at most ``ATTAINED_BOUND``
    times ``step`` (the fairness bound: a wrong prediction delays a job only so long)."""
    return min(max(0.0, converge_at - step), ATTAINED_BOUND * max(0.0, step))


@dataclass(frozen=True, slots=True)
class Fit:
    """A job's last loss-curve fit: how many samples it had logged then, and the step at
    which the fit predicts convergence (None: no fit)."""

    samples: int = 0
    converge_at: float | None = None

    def stale(self, samples: int) -> bool:
        """Whether a job that has logged ``samples`` is due for a new fit."""
        return samples >= max(REFIT_GROWTH * self.samples, self.samples + 1)

    def steps_left(self, step: float) -> float | None:
        """Steps from ``step`` to the predicted convergence, within the fairness bound
        (``bounded``; None: no fit)."""
        return None if self.converge_at is None else bounded(self.converge_at, step)


def refit(fit: Fit, samples: int, points: Callable[[], tuple[Sequence[float], Sequence[float]]]) -> Fit:
    """``fit``, redone on ``points()`` (steps, losses; built only then) if the job has logged
    ``samples`` (all it ever logged, thinned ones included) >= ``REFIT_GROWTH`` times the
    samples of ``fit``."""
    if not fit.stale(samples):
        return fit
    steps, losses = points()
    return Fit(samples, steps_to_converge(steps, losses))
