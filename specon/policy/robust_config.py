"""The knobs of ``classifier: robust`` and their checks (``monitor.robust`` in the policy file).

Kept apart from ``specon.policy.robust`` so that the knobs can be read without the
classifier; each field's help (``metadata["doc"]``) is its line in the policy file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

RobustTest = Literal["doubling", "change"]


@dataclass(frozen=True, slots=True)
class RobustConfig:
    """Knobs of the ``robust`` classifier (used only when ``classifier: robust``)."""

    # Exponential smoothing factor applied to E before differencing (1 = no smoothing).
    smoothing: float = field(
        default=0.3, metadata={"doc": "exponential smoothing factor for E, in (0, 1]; 1 = none"}
    )
    # k-of-n hysteresis (test: change): a category step needs k of the last n ticks to agree.
    k: int = field(
        default=3, metadata={"doc": "change test: a category step needs k of the last n ticks to agree"}
    )
    n: int = field(default=4, metadata={"doc": "change test: window of the k-of-n vote"})
    # Ticks of history for the trend and divergence tests (least-squares slope of smoothed E).
    trend_window: int = field(
        default=6, metadata={"doc": "ticks in the least-squares trend and divergence tests (>= 2)"}
    )
    # Relative rise of smoothed E over the trend window that counts as diverging.
    diverge_threshold: float = field(
        default=0.05,
        metadata={"doc": "relative rise of smoothed E over the window that means diverging"},
    )
    # What "converged" means. doubling: the loss is predicted to improve by less than ``gain``
    # of its improvement so far if training ran twice as long (a slope in log-time); change:
    # k of n ticks with the normalised change of smoothed E below alpha, and a flat trend.
    # Chosen by `python -m bench bench_detection` (specon.sim.detection).
    test: RobustTest = field(
        default="doubling",
        metadata={
            "doc": "doubling: converged when twice the training is predicted to improve E by "
            "less than gain of its improvement so far; change: k of n ticks with G below alpha, "
            "flat trend"
        },
    )
    gain: float = field(
        default=0.11, metadata={"doc": "doubling test: share of the improvement so far, in (0, 1)"}
    )
    # Memory of the log-time fit: a tick from time t_i weighs (t_i / t) ** memory at time t.
    memory: float = field(
        default=5.0,
        metadata={"doc": "doubling test: a tick from time t_i weighs (t_i/t)**memory in the log-time fit"},
    )
    # The doubling test must hold for this share of the ticks seen so far (at least one).
    confirm: float = field(
        default=0.0,
        metadata={"doc": "doubling test: share of the ticks so far it must hold for (at least one)"},
    )
    # For a job that declared its length (a horizon): it has converged when the log-time fit
    # predicts less than this share of its improvement so far over the rest of the job (in
    # place of ``gain``'s doubling). Chosen by `python -m bench bench_detection`.
    horizon_gain: float = field(
        default=0.1,
        metadata={
            "doc": "doubling test, for a job that declared its steps: share of the improvement so "
            "far the rest of the job may still bring, in (0, 1)"
        },
    )


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
