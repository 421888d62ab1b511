"""The agent's priority action, its pure half: what the agent sees of its running containers
in, the CPU weights of the policy's priority rule out (``specon.policy.priority``).

Nothing here reads a file, a clock or the runtime: ``specon_agent.weights`` gathers the inputs,
applies the weights that changed and keeps ``fair_seconds`` across restarts.

What a rule is told of each job (``JobProgress``): its steps (the last logged), the steps it
declared it will train (``JobSpec.steps``: ``steps`` in a local job's spec, the pod
annotation ``specon.io/steps`` on Kubernetes; None when it declared none), the CPU seconds the
runtime counted for it on this worker, Algorithm 1's last normalised improvement as its gain,
and ``fair_seconds``: the CPU an equal share of this worker would have given it since it
arrived, accumulated each tick as ``dt * min(its CPU limit, else the worker's CPUs; the
worker's CPUs / the running containers)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specon.config import PriorityConfig
from specon.model import ContainerId
from specon.policy import quality_memory, quality_point
from specon.policy.monitor import MonitorState
from specon.policy.priority.base import JobProgress
from specon.policy.priority.rules import weighs, weights
from specon.runtime.base import ContainerInfo
from specon_agent.labels import job_labels


@dataclass(frozen=True, slots=True)
class Running:
    """One running container at a tick, as the priority rule needs it."""

    id: ContainerId
    started: float
    step: int | None = None
    total: int | None = None
    gain: float | None = None
    cpu_limit: float | None = None
    cpu_seconds: float = 0.0
    # The first step this agent saw it log (a restored job starts at its checkpoint's) and its
    # CPU seconds then, so the CPU per step is measured over the steps trained on this worker
    # only, without what it spent before its first step (start-up: imports, set-up, CUDA).
    first_step: int | None = None
    first_cpu: float = 0.0
    # Steps left to convergence predicted from its loss curve (None: no fit, or not needed).
    predicted_steps: float | None = None
    # Its loss curve, (step, mean loss) per tick (``watched.append_curve``): the quality-point
    # estimate reads it (``specon.policy.quality_point``).
    curve: tuple[tuple[float, float], ...] = ()  # a tuple: the GPU sharing state file holds it
    # The model it trains (``JobSpec.model``): the memory of finished jobs is kept per model.
    model: str | None = None

    @property
    def cpu_per_step(self) -> float | None:
        """CPU-seconds per step on this worker since its first step here (None before it
        trained a step after that one)."""
        if self.step is None or self.first_step is None or self.step <= self.first_step:
            return None
        used = self.cpu_seconds - self.first_cpu
        return used / (self.step - self.first_step) if used > 0 else None

    @property
    def remaining_work(self) -> float | None:
        """CPU-seconds (one core) it still needs: steps left (declared, else predicted) times
        its CPU per step; None when either is unknown (reported to the manager's work model)."""
        cost = self.cpu_per_step
        if cost is None:
            return None
        if self.total is not None:
            return max(0, self.total - (self.step or 0)) * cost
        return None if self.predicted_steps is None else self.predicted_steps * cost


def running_of(
    info: ContainerInfo,
    step: int | None,
    state: MonitorState,
    cpu_seconds: float,
    *,
    first_step: int | None = None,
    first_cpu: float = 0.0,
    predicted_steps: float | None = None,
    curve: Sequence[tuple[float, float]] = (),
) -> Running:
    """``info``'s container with its last logged step, its monitor state and its CPU seconds."""
    g = state.last_g
    return Running(
        id=info.id,
        started=info.started_at,
        step=step,
        total=info.spec.steps,
        gain=g if g is not None and math.isfinite(g) else None,
        cpu_limit=info.cpu_limit,
        cpu_seconds=cpu_seconds if math.isfinite(cpu_seconds) else 0.0,
        first_step=first_step,
        first_cpu=first_cpu if math.isfinite(first_cpu) else 0.0,
        predicted_steps=predicted_steps,
        curve=tuple(curve),
        model=job_labels(info.spec).get("model"),  # as its reports name it (the manager's key)
    )


def fair_shares(running: Sequence[Running], capacity: float) -> dict[ContainerId, float]:
    """Each container's equal share of the worker now, in cores: the worker's CPUs over the
    running containers, at most its own limit (0 where the capacity is unknown)."""
    if not running or not math.isfinite(capacity) or capacity <= 0:
        return {r.id: 0.0 for r in running}
    even = capacity / len(running)
    return {r.id: min(capacity if r.cpu_limit is None else r.cpu_limit, even) for r in running}


def accrue(
    fair: Mapping[ContainerId, float],
    running: Sequence[Running],
    capacity: float,
    dt: float,
    *,
    now: float | None = None,
) -> dict[ContainerId, float]:
    """``fair_seconds`` after ``dt`` more seconds of ``running`` sharing the worker equally;
    containers not running now keep theirs (a clock that went back adds nothing). With
    ``now``, a container that started less than ``dt`` ago accrues only since its start, as
    the simulator's does (``dt`` may be inf: the agent's first tick)."""
    out = dict(fair)
    if math.isnan(dt) or dt <= 0:
        return out
    started = {r.id: r.started for r in running}
    for cid, share in fair_shares(running, capacity).items():
        span = dt if now is None else min(dt, now - started[cid])
        if math.isfinite(span) and span > 0:
            out[cid] = out.get(cid, 0.0) + span * share
    return out


def progress(
    running: Sequence[Running], fair: Mapping[ContainerId, float], shares: Mapping[str, float] | None = None
) -> list[JobProgress]:
    """What the rule is told of each job; ``shares`` each model's quality point on the cluster
    (``CommandBatch.quality``, as a share of a job's steps)."""
    return [
        JobProgress(
            id=r.id,
            started=r.started,
            step=float(r.step or 0),
            total=r.total,
            cpu_seconds=r.cpu_seconds,
            fair_seconds=fair.get(r.id, 0.0),
            gain=r.gain,
            predicted_steps=r.predicted_steps,
            cost=r.cpu_per_step,
            # The agent measures its cost once it has seen a step (its baseline follows a tick
            # later: "not yet" meanwhile, never CPU over steps); none seen: CPU over steps.
            measured=r.step is not None,
            loss_steps=[k for k, _ in r.curve],
            losses=[v for _, v in r.curve],
            quality_memory=quality_memory.recall(shares or {}, r.model),
        )
        for r in running
    ]


def decide(
    running: Sequence[Running],
    fair: Mapping[ContainerId, float],
    cfg: PriorityConfig,
    shares: Mapping[str, float] | None = None,
) -> dict[ContainerId, int]:
    """The weight of every running container under ``cfg.rule``; none under a rule that sets
    no weights (``none``: the runtime's defaults stay untouched)."""
    if not weighs(cfg) or not running:
        return {}
    return weights(progress(running, fair, shares), cfg)


# A job gone once it trained this share of its declared steps finished (it exits between two
# ticks, after the last step the agent saw); its curve must start within the first tenth
# (a job restored here mid-training has seen only part of its own).
FINISHED = 0.9
SEEN_FROM = 0.1


def finished_shares(before: Sequence[Running], now: Sequence[Running]) -> dict[ContainerId, float]:
    """The quality point, as a share of its steps, of each job of a known model that ran at the
    last tick, is gone now and finished here (``FINISHED``, ``SEEN_FROM``), measured over its
    whole curve (``quality_point.finished_share``): what its ended report tells the manager."""
    out: dict[ContainerId, float] = {}
    still = {r.id for r in now}
    for r in before:
        if r.id in still or r.model is None or not r.total or not r.curve:
            continue
        if (r.step or 0) < FINISHED * r.total or r.curve[0][0] > SEEN_FROM * r.total:
            continue
        share = quality_point.finished_share([k for k, _ in r.curve], [v for _, v in r.curve], r.total)
        if share is not None:
            out[r.id] = share
    return out


def changed(wanted: Mapping[ContainerId, int], applied: Mapping[ContainerId, int]) -> dict[ContainerId, int]:
    """The weights to apply: new ones and those that differ from what is in effect."""
    return {cid: w for cid, w in wanted.items() if applied.get(cid) != w}
