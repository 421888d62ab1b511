"""Host failures and reclaim notices in the simulator: what a scenario's ``failures:`` gives
(``Failures``), when each host goes (``FailureClock``), the jobs' periodic checkpoints
(``Checkpoints``) and the work lost (``LostWork``); ``specon.sim.hosts`` plays them out.

* A worker's MTBF: each worker fails after an exponential time of mean ``mtbf`` seconds,
  drawn from the run's seed and the worker's name (so every policy of a seed meets the same
  failures), counted from the start of the run and again from each return.
* A listed event: ``{worker, at}`` loses the host at ``at``; ``{worker, at, notice}`` is a
  reclaim notice (a spot instance's): the worker is drained at ``at`` and lost ``notice``
  seconds later.
* A lost host comes back empty ``repair`` seconds later (default 600: a replaced or rebooted
  node), so no run waits forever for a worker.

A job checkpoints as ``specon.jobkit`` does by default: every ``checkpoint_every`` steps or
``checkpoint_interval`` seconds since its last checkpoint (or its start), whichever comes
first; a loss takes the steps since then. Rates are constant between the cluster's events,
so the last checkpoint is found in closed form (``Checkpoints.last``), not by stepping.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from specon.jobkit import DEFAULT_CHECKPOINT_EVERY, DEFAULT_CHECKPOINT_INTERVAL
from specon.model import WorkerId

DEFAULT_REPAIR = 600.0


@dataclass(frozen=True, slots=True)
class HostEvent:
    """``worker`` goes at ``at`` (seconds of the run); with ``notice``: it is drained at ``at``
    and goes ``notice`` seconds later (a reclaim notice)."""

    worker: WorkerId
    at: float
    notice: float | None = None

    @property
    def lost_at(self) -> float:
        return self.at + (self.notice or 0.0)


@dataclass(frozen=True, slots=True)
class Checkpoints:
    """A job's checkpoint schedule (None: that trigger is off; both None: never)."""

    every: int | None = DEFAULT_CHECKPOINT_EVERY
    interval: float | None = DEFAULT_CHECKPOINT_INTERVAL

    def last(
        self, since: tuple[float, float], *, t0: float, s0: float, rate: float, now: float
    ) -> tuple[float, float] | None:
        """The last checkpoint (step, time) up to ``now`` of a job that ran at ``rate`` steps/s
        from step ``s0`` at ``t0``, its checkpoint before that ``since`` (step, time); None: none."""
        step, at = since
        if rate <= 0 or now <= t0:
            return None
        first = math.inf
        if self.every is not None:
            first = t0 + max(0.0, step + self.every - s0) / rate
        if self.interval is not None:
            first = min(first, max(t0, at + self.interval))
        if first > now:
            return None
        period = min(math.inf if self.every is None else self.every / rate, self.interval or math.inf)
        t = first + math.floor((now - first) / period) * period
        return s0 + rate * (t - t0), t


@dataclass(frozen=True, slots=True)
class Failures:
    """A scenario's ``failures:`` (module docstring)."""

    mtbf: float | None = None
    repair: float = DEFAULT_REPAIR
    events: tuple[HostEvent, ...] = ()
    checkpoints: Checkpoints = Checkpoints()

    def __post_init__(self) -> None:
        if self.mtbf is not None and not (math.isfinite(self.mtbf) and self.mtbf > 0):
            raise ValueError(f"failures: mtbf must be > 0, got {self.mtbf}")
        if not (math.isfinite(self.repair) and self.repair > 0):
            raise ValueError(f"failures: repair must be > 0, got {self.repair}")

    def clock(self, key: str) -> FailureClock:
        """The failure draws of one run: ``key`` names its scenario and seed."""
        return FailureClock(self, key)


class FailureClock:
    """When each worker fails next under the MTBF: one random stream per worker, so the
    k-th failure of a worker comes at the same time whatever the policy does."""

    def __init__(self, failures: Failures, key: str) -> None:
        self.failures = failures
        self.key = key
        self._streams: dict[WorkerId, random.Random] = {}

    def next_after(self, worker: WorkerId, up: float) -> float | None:
        """When ``worker``, up since ``up``, fails next (None: no MTBF)."""
        mtbf = self.failures.mtbf
        if mtbf is None:
            return None
        rng = self._streams.get(worker)
        if rng is None:
            rng = self._streams[worker] = random.Random(f"failures/{self.key}/{worker}")
        return up + rng.expovariate(1.0 / mtbf)


@dataclass(slots=True)
class LostWork:
    """What failures cost one run: hosts lost, jobs they hit, the steps those jobs trained
    and lost (and the CPU- or GPU-seconds spent on them), and the jobs brought back."""

    hosts_lost: int = 0
    notices: int = 0
    jobs_lost: int = 0
    lost_steps: float = 0.0
    lost_seconds: float = 0.0
    recoveries: int = 0

    def as_dict(self) -> dict[str, float]:
        return {
            "hosts_lost": self.hosts_lost,
            "notices": self.notices,
            "jobs_lost": self.jobs_lost,
            "lost_steps": round(self.lost_steps, 3),
            "lost_seconds": round(self.lost_seconds, 3),
            "recoveries": self.recoveries,
        }
