"""The policies compared on identical workloads, and the lower bound none can beat.

The named policies are the catalogue's (``specon.policy.experiments``: ``ds``,
``specon-paper``, ``specon``, ``specon-predicted``, ``specon-oracle``, ``balancer`` and one
peer per priority rule), the very policies ``specon demo`` runs live, here laid over the shipped defaults (or,
for ``specon``, a user's policy file). ``bound`` is not a policy but a lower bound on
average JCT and makespan over *every* placement-and-migration policy on that workload (see
``lower_bound``).

The simulator (``specon.sim.runner``) runs all but the bound; none of them has code of its
own for Algorithms 1-3: ``SimPolicy`` only says which ``Policy`` the shared decision code
gets, and what of it can be skipped because it cannot change a thing (no manager where
nothing can move, no classifier where nothing reads it).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specon.config import (
    Policy,
    PriorityConfig,
    default_policy,
    peer_priority,
    policy_from_dict,
    policy_to_dict,
)
from specon.config.sections import GpuShareConfig
from specon.policy.experiments import NAMES, Experiment, experiment, moves
from specon.policy.priority.rules import NEEDS_GAIN
from specon.sim.cluster import DEFAULT_PARAMS, SimParams, Workload

SIMULATED = NAMES
POLICIES = (*SIMULATED, "bound")

# Every job the same CPU weight (where no daemon sets any).
EQUAL_SHARES = peer_priority("none")


@dataclass(frozen=True, slots=True)
class SimPolicy:
    name: str
    # The catalogue's policy, what the agents run; None = no specon daemons at all (ds).
    daemons: Policy | None
    # The policy handed to the manager's decision code; None = no manager: the policy can
    # move nothing (``moves``), so a manager would decide nothing.
    manager: Policy | None
    # Agents run Algorithm 1 (``classifier_for(daemons.monitor)``) and send its requests:
    # wherever a manager reads them or the priority rule reads the gain.
    classify: bool
    # How each worker's agent weights its jobs' CPU.
    priority: PriorityConfig
    # Jobs declare their total steps (else remaining work is predicted from the loss).
    declared: bool = True
    # Agents detect convergence by the trace's ground truth (``specon.sim.oracle``).
    oracle: bool = False
    # How agents share each GPU (the policy's ``gpu`` section); None: no agent (DS), every
    # job on a GPU runs, time-sliced.
    gpu: GpuShareConfig | None = None


def sim_policy(exp: Experiment, daemons: Policy | None) -> SimPolicy:
    """``exp`` run with ``daemons`` (its ``policy`` over some base) in the simulator."""
    if daemons is None:
        return SimPolicy(exp.name, None, None, False, EQUAL_SHARES, exp.declared)
    manager = daemons if moves(daemons) else None
    classify = manager is not None or daemons.priority.rule in NEEDS_GAIN
    return SimPolicy(
        exp.name, daemons, manager, classify, daemons.priority, exp.declared, exp.oracle, daemons.gpu
    )


def with_overrides(
    policy: Policy,
    *,
    alpha: float | None = None,
    interval: float | None = None,
    weights: Sequence[float] | None = None,
) -> Policy:
    """``policy`` with alpha, interval and the Algorithm 2 weights replaced, validated like a policy
    file (a ``PolicyError`` lists every problem)."""
    monitor: dict[str, Any] = {}
    if alpha is not None:
        monitor["alpha"] = alpha
    if interval is not None:
        monitor["interval"] = interval
    data = policy_to_dict(policy)
    data["monitor"].update(monitor)
    if weights is not None:
        if len(weights) != 3:
            raise ValueError(
                f"weights: expected 3 values (progressing, watching, converged), got {len(weights)}"
            )
        pc, wc, cc = weights
        data["placement"]["weights"] = {"progressing": pc, "watching": wc, "converged": cc}
    return policy_from_dict(data, source="sim overrides")


def make_policy(
    name: str,
    *,
    alpha: float | None = None,
    interval: float | None = None,
    weights: Sequence[float] | None = None,
    base: Policy | None = None,
) -> SimPolicy:
    """The simulated policy ``name`` (one of ``SIMULATED``) over the shipped defaults; alpha,
    interval and weights apply to the specon policies (``Experiment.tuned``). ``base`` (e.g. a
    user's policy file) replaces the shipped defaults under ``specon``, ``specon-predicted`` and
    ``specon-oracle`` (``Experiment.replaceable``); the overrides still apply on top of it."""
    if name == "bound":
        raise ValueError("bound is computed, not simulated: use lower_bound()")
    try:
        exp = experiment(name)
    except ValueError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
    daemons = exp.policy(base if base is not None and exp.replaceable else default_policy())
    if daemons is not None and exp.tuned:
        daemons = with_overrides(daemons, alpha=alpha, interval=interval, weights=weights)
    return sim_policy(exp, daemons)


@dataclass(frozen=True, slots=True)
class Bound:
    """Lower bounds for one workload (seconds) and each job's smallest possible JCT."""

    avg_jct: float
    makespan: float
    job_min: dict[str, float]


def lower_bound(workload: Workload, params: SimParams = DEFAULT_PARAMS) -> Bound:
    """Lower bounds on average JCT and makespan that no placement or migration policy
    can beat on ``workload`` under the simulator's model.

    Let w_j be job j's work (CPU-seconds on one core; a GPU job's: GPU-seconds alone on one
    GPU, bounded the same way over the GPUs instead, r = 1 and C = the number of GPUs, and
    its time-slicing taken as lossless), a_j its submit time,
    r = min(job_cores, largest worker capacity) the fastest any single job can run and
    C = the sum of all worker capacities. Relaxations: migrations are free and instant,
    sharing is perfect (interference 1; the simulator only allows >= 1), any job may be
    anywhere at any time.

    * Each job: JCT_j >= w_j / r (it cannot run faster than alone on the best worker).
    * Makespan >= max_j (a_j + w_j / r) - min_j a_j, and, for every submit time t, the
      work submitted at or after t needs the whole cluster for at least its total / C
      after t: makespan >= t + sum_{a_j >= t} w_j / C - min_j a_j.
    * Average JCT >= mean_j w_j / r, and >= the mean flow time of preemptive SRPT on one
      machine of speed C: pooling the cluster into one machine of speed C that may give
      all of it to one job relaxes every constraint, and SRPT is optimal for total flow
      time on one preemptive machine with release dates (Schrage 1968). The bound is the
      larger of the two; both assume nothing about placement, so it also holds for the
      policies that keep DS's round-robin start.
    """
    jobs = workload.jobs
    if not jobs:
        return Bound(0.0, 0.0, {})
    first = min(j.submit for j in jobs)
    job_min: dict[str, float] = {}
    end, flow = -math.inf, 0.0
    # CPU jobs share the cores, GPU jobs the GPUs (a GPU job's work is GPU-seconds alone,
    # at most one GPU each): two independent pools, each bounded as above.
    cpu = [j for j in jobs if not j.gpu]
    gpu = [j for j in jobs if j.gpu]
    pools = [
        (
            cpu,
            min(params.job_cores, max(w.cpu for w in workload.workers)),
            sum(w.cpu for w in workload.workers),
        )
    ]
    if gpu:
        pools.append((gpu, 1.0, float(sum(w.gpus for w in workload.workers))))
    for pool, r, capacity in pools:
        if not pool:
            continue
        job_min.update((j.id, j.work / r) for j in pool)
        end = max(end, *(j.submit + j.work / r for j in pool))
        # Work submitted at or after each submit time (jobs are in submit order).
        tail = 0.0
        for j in reversed(pool):
            tail += j.work
            end = max(end, j.submit + tail / capacity)
        flow += _srpt_total_flow(pool, capacity)
    avg = max(sum(job_min.values()) / len(jobs), flow / len(jobs))
    return Bound(avg, end - first, job_min)


def _srpt_total_flow(jobs: Sequence[Any], speed: float) -> float:
    """Total flow time of preemptive SRPT on one machine of ``speed`` (jobs in submit order)."""
    heap: list[tuple[float, int, float]] = []  # (remaining work, order, submit)
    t = 0.0
    total = 0.0
    for i, job in enumerate(jobs):
        a = job.submit
        while heap:
            rem, k, sub = heap[0]
            if t + rem / speed <= a:
                heapq.heappop(heap)
                t += rem / speed
                total += t - sub
            else:
                heapq.heapreplace(heap, (rem - (a - t) * speed, k, sub))
                break
        t = max(t, a)
        heapq.heappush(heap, (job.work, i, a))
    while heap:
        rem, _, sub = heapq.heappop(heap)
        t += rem / speed
        total += t - sub
    return total
