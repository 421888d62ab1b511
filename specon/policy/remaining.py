"""Steps left to convergence, predicted from the loss curve alone (Optimus, EuroSys '18).

For a job that declares no total, Optimus fits l(k) = 1/(β0·k + β1) + β2 to its losses
(``specon.sim.curves.fit_optimus``: least squares by variable projection, numpy only) and
takes convergence to be where the curve has made all but ``share`` of its total
improvement l(0) - β2: 1/(β0·k + β1) <= share/β1, i.e. k* = (1/share - 1)·β1/β0. The steps
left are k* minus the steps done (0 once past it). ``share`` 0.05 matches the ground truth
of the detection benchmark (95 % of the final improvement).

A fit needs ``MIN_POINTS`` samples and a falling curve; otherwise the prediction is None
(unknown), and the priority rules treat the job as of unknown size. At most ``MAX_POINTS``
samples, evenly spaced, enter a fit, so its cost stays bounded however long a job runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from specon.sim.curves import fit_optimus

MIN_POINTS = 8
MAX_POINTS = 64
SHARE = 0.05


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
    """Predicted steps from the last sample to convergence (None: no fit)."""
    k = steps_to_converge(steps, losses, share=share)
    return None if k is None else max(0.0, k - steps[-1])
