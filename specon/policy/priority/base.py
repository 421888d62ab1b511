"""What a priority rule sees of a job, and how an order becomes CPU weights."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specon.model import WEIGHT_DEFAULT, WEIGHT_MAX, WEIGHT_MIN, ContainerId


@dataclass(frozen=True, slots=True)
class JobProgress:
    """One job on the worker, as its agent knows it.

    ``cpu_seconds`` is the CPU the job has used so far (Tiresias's attained service);
    ``fair_seconds`` the CPU an equal share of its workers would have given it since it
    started (each interval: the worker's cores over its running jobs, at most the job's own
    CPU limit), the attained service of a virtual processor-sharing run;
    ``total`` the steps the job declared it will train (None: it declared none);
    ``gain`` Algorithm 1's last normalised improvement per interval (None: not classified
    yet) and ``predicted_steps`` the steps the loss curve predicts until convergence
    (Optimus's fit, None where there is no fit yet).
    """

    id: ContainerId
    started: float
    step: float = 0.0
    total: int | None = None
    cpu_seconds: float = 0.0
    fair_seconds: float = 0.0
    gain: float | None = None
    predicted_steps: float | None = None
    # CPU-seconds per step measured over its steps alone, without its start-up (the agent
    # knows it: ``specon_agent.priority.Running.cpu_per_step``); None: ``cpu_seconds / step``.
    cost: float | None = None
    # ``cost`` is measured by the agent, without the job's start-up: None then means "not yet"
    # (it has trained no step past the first it was seen at), and ``cpu_seconds / step``, which
    # counts the start-up's CPU (imports, set-up) as training, is not used instead. A job just
    # started would otherwise look many times longer than it is, be put last and, frozen on a
    # GPU, never train the step that measures it.
    measured: bool = False
    # The agent's clock when this was read (the clock of ``started``); None: not given (the
    # learned rule's trainer reads it, no rule's decision depends on it).
    now: float | None = None
    # Its loss curve so far (``loss_steps[i]`` the step of ``losses[i]``), for the quality-point
    # estimate (``specon.policy.quality_point``); empty where the caller's rule needs none.
    loss_steps: Sequence[float] = ()
    losses: Sequence[float] = ()
    # Its true quality step: only the simulator knows it (the ``oracle`` yardstick).
    quality_truth: float | None = None
    # The median share of the steps at which its model's finished jobs reached theirs on
    # this worker (``quality_point.recall``; None: none yet).
    quality_memory: float | None = None

    @property
    def cpu_per_step(self) -> float | None:
        """Measured CPU-seconds per step (None before the first step)."""
        if self.cost is not None or self.measured:
            return self.cost
        return self.cpu_seconds / self.step if self.step > 0 and self.cpu_seconds > 0 else None

    @property
    def steps_left(self) -> float | None:
        """Steps left: declared, else predicted from the loss curve, else unknown."""
        if self.total is not None:
            return max(0.0, self.total - self.step)
        return self.predicted_steps


def ranked_weights(order: Sequence[ContainerId], ratio: float) -> dict[ContainerId, int]:
    """Weights for jobs in priority order: the first ``WEIGHT_MAX``, each next one ``ratio``
    times less, never under ``WEIGHT_MIN``. Ratio 1 is plain fair sharing."""
    out: dict[ContainerId, int] = {}
    w = float(WEIGHT_MAX)
    for k, cid in enumerate(order):
        if w < WEIGHT_MIN and ratio >= 1:  # the rest all get the floor (a worker of 1,000 jobs)
            out.update(dict.fromkeys(order[k:], WEIGHT_MIN))
            break
        out[cid] = max(WEIGHT_MIN, round(w))
        w /= ratio
    return out


def proportional_weights(values: Mapping[ContainerId, float]) -> dict[ContainerId, int]:
    """Weights proportional to ``values`` (>= 0), the largest at ``WEIGHT_MAX``; all equal
    (the default weight) when every value is zero."""
    top = max(values.values(), default=0.0)
    if top <= 0:
        return dict.fromkeys(values, WEIGHT_DEFAULT)
    return {cid: max(WEIGHT_MIN, round(WEIGHT_MAX * v / top)) for cid, v in values.items()}


def fifo_key(job: JobProgress) -> tuple[float, str]:
    """Ties go to the job that started first (then the id, so the order is total)."""
    return job.started, str(job.id)


# The help of a ``ratio`` knob (the rules that rank their jobs).
RATIO_DOC = "weight of one rank over the next (100: near-strict; 1: fair sharing)"


def ratio_problems(ratio: float) -> list[str]:
    """The check of a rank-to-rank weight ratio (1: fair sharing; larger: stricter)."""
    return [] if math.isfinite(ratio) and ratio >= 1 else [f"ratio: must be >= 1, got {ratio}"]


def least_first(jobs: Sequence[JobProgress], work: Mapping[ContainerId, float | None]) -> list[ContainerId]:
    """Jobs by ``work`` ascending; those whose work is unknown last, least attained service
    first among them (Tiresias's rule, which needs no knowledge); ties to the oldest."""

    def key(j: JobProgress) -> tuple[int, float, tuple[float, str]]:
        w = work[j.id]
        return (0, w, fifo_key(j)) if w is not None else (1, j.cpu_seconds, fifo_key(j))

    return [j.id for j in sorted(jobs, key=key)]
