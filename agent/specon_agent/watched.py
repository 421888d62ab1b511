"""What the agent keeps per container: the classifier's view (``Watched``), its counters, and
the loss curve a job with no declared total is sized by (``specon.policy.remaining``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specon.policy.monitor import MonitorState
from specon.policy.remaining import Fit, refit
from specon.progress import SkipReason, Tailer
from specon.runtime.base import ContainerInfo


@dataclass(slots=True)
class Watched:
    """One container this agent classifies."""

    info: ContainerInfo
    tailer: Tailer
    state: MonitorState
    step: int | None = None
    first_step: int | None = None  # the first step this agent saw it log
    # (step, mean loss) per tick, for the loss-curve prediction of a job with no declared
    # total (``specon.policy.remaining``); thinned to every other point when full.
    curve: list[tuple[float, float]] = field(default_factory=list)
    curve_samples: int = 0  # points ever added to ``curve`` (thinned ones included)
    fit: Fit = field(default_factory=Fit)  # its last fit (``remaining.refit``)
    last_sample_at: float | None = None
    nonfinite_seen: int = 0
    # Skipped lines per reason already added to the agent's counters.
    skipped_seen: dict[SkipReason, int] = field(default_factory=dict)


@dataclass(slots=True)
class AgentCounters:
    ticks: int = 0
    samples: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    requests_sent: int = 0
    commands: dict[str, int] = field(default_factory=dict)
    command_failures: int = 0
    state_write_failures: int = 0
    states_forgotten: int = 0


# Loss-curve points kept per job for the prediction (thinned to every other point when full).
CURVE_POINTS = 256


def append_curve(w: Watched, step: float, values: list[float]) -> None:
    """Add a tick's mean finite loss at ``step`` to ``w``'s curve (thinned when full)."""
    finite = [v for v in values if math.isfinite(v)]
    if finite:
        w.curve.append((step, sum(finite) / len(finite)))
        w.curve_samples += 1
        if len(w.curve) > CURVE_POINTS:
            del w.curve[::2]


def predicted_steps(w: Watched) -> float | None:
    """Steps left to convergence from the loss curve of a job that declared no total
    (refitted once its curve grew by ``remaining.REFIT_GROWTH``)."""
    if w.info.spec.steps is not None or not w.curve or w.step is None:
        return None
    curve = w.curve
    w.fit = refit(w.fit, w.curve_samples, lambda: ([k for k, _ in curve], [v for _, v in curve]))
    return w.fit.steps_left(w.step)
