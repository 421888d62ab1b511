"""The knobs of ``classifier: robust`` and their checks (``monitor.robust`` in the policy file).

Kept apart from ``specon.config`` (which re-exports ``RobustConfig``) so that the policy
file's module stays small and this one imports nothing that could import it back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

RobustTest = Literal["doubling", "change"]


@dataclass(frozen=True, slots=True)
class RobustConfig:
    """Knobs of the ``robust`` classifier (used only when ``classifier: robust``)."""

    # Exponential smoothing factor applied to E before differencing (1 = no smoothing).
    smoothing: float = 0.3
    # k-of-n hysteresis (test: change): a category step needs k of the last n ticks to agree.
    k: int = 3
    n: int = 4
    # Ticks of history for the trend and divergence tests (least-squares slope of smoothed E).
    trend_window: int = 6
    # Relative rise of smoothed E over the trend window that counts as diverging.
    diverge_threshold: float = 0.05
    # What "converged" means. doubling: the loss is predicted to improve by less than ``gain``
    # of its improvement so far if training ran twice as long (a slope in log-time); change:
    # k of n ticks with the normalised change of smoothed E below alpha, and a flat trend.
    # Chosen by `python -m bench bench_detection` (specon.sim.detection).
    test: RobustTest = "doubling"
    gain: float = 0.11
    # Memory of the log-time fit: a tick from time t_i weighs (t_i / t) ** memory at time t.
    memory: float = 5.0
    # The doubling test must hold for this share of the ticks seen so far (at least one).
    confirm: float = 0.0
    # For a job that declared its length (a horizon): it has converged when the log-time fit
    # predicts less than this share of its improvement so far over the rest of the job (in
    # place of ``gain``'s doubling). Chosen by `python -m bench bench_detection`.
    horizon_gain: float = 0.1


def problems(cfg: RobustConfig) -> list[str]:
    """Every knob that is out of range, as ``field: problem``."""
    out: list[str] = []
    if not 0 < cfg.smoothing <= 1:
        out.append(f"smoothing: must be in (0, 1], got {cfg.smoothing}")
    for name, value, low in (("k", cfg.k, 1), ("n", cfg.n, 1), ("trend_window", cfg.trend_window, 2)):
        if value < low:
            out.append(f"{name}: must be >= {low}, got {value}")
    if cfg.k > cfg.n:
        out.append(f"k: must be <= n ({cfg.n}), got {cfg.k}")
    if not cfg.diverge_threshold > 0:
        out.append(f"diverge_threshold: must be > 0, got {cfg.diverge_threshold}")
    if not (math.isfinite(cfg.gain) and 0 < cfg.gain < 1):
        out.append(f"gain: must be in (0, 1), got {cfg.gain}")
    if not (math.isfinite(cfg.horizon_gain) and 0 < cfg.horizon_gain < 1):
        out.append(f"horizon_gain: must be in (0, 1), got {cfg.horizon_gain}")
    if not (math.isfinite(cfg.memory) and cfg.memory > 0):
        out.append(f"memory: must be > 0, got {cfg.memory}")
    if not (math.isfinite(cfg.confirm) and 0 <= cfg.confirm <= 1):
        out.append(f"confirm: must be in [0, 1], got {cfg.confirm}")
    return out
