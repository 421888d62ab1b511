"""The policies compared on identical workloads, and the lower bound none can beat.

* ``ds`` — the default scheduler: round-robin initial placement, never migrates.
* ``specon-paper`` — Algorithms 1-3 in paper mode (``default_policy("paper")``).
* ``specon`` — Algorithms 1-3 with the shipped defaults (``default_policy()``).
* ``specon-predicted`` — the same, with jobs that declare no total: their remaining work is
  predicted from the loss curve alone (``specon.policy.remaining``, Optimus's fit).
* ``balancer`` — convergence-blind, descheduler-style: every manager pass, while the most
  and least loaded workers differ by 2 or more running jobs, move the most recently
  started job from a most-loaded to a least-loaded worker, paying the same migration
  cost and bound by the same budget. It is the manager's own decision pass
  (``decide_pass``) with no requests and ``rebalance: balanced, when: always``, on a
  view in which every job's "converged since" time is its first start, so Algorithm 3's
  "smallest d first" picks the most recently started job. No per-job move limit (the
  descheduler has none); a move only happens when it narrows the spread.
* ``optimus``, ``tiresias``, ``hermes``, ``slaq`` — the peers: DS's placement, no
  migration, and the paper's rule for sharing a worker among its jobs as CPU weights
  (``specon.policy.priority``: each module states the paper's rule and where ours
  differs). Their agents classify (Algorithm 1) where the rule reads the loss.
* ``srpt`` — DS's placement, no migration, shortest remaining work first on each worker.
* ``bound`` — not a policy but a lower bound on average JCT and makespan over *every*
  placement-and-migration policy on that workload (see ``lower_bound``).

The simulator (``specon.sim.runner``) runs all but the bound; none of them has code of its
own for Algorithms 1-3: ``SimPolicy`` only says which ``Policy`` the shared decision code
gets and how the manager sees the jobs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specon.config import (
    Policy,
    PriorityConfig,
    PriorityRule,
    default_policy,
    peer_priority,
    policy_from_dict,
    policy_to_dict,
)
from specon.policy.priority.rules import NEEDS_GAIN
from specon.sim.cluster import DEFAULT_PARAMS, SimParams, Workload

PEERS: dict[str, PriorityRule] = {
    "fsp": "fsp",
    "optimus": "optimus",
    "tiresias": "tiresias",
    "hermes": "hermes",
    "slaq": "slaq",
    "srpt": "srpt",
}
SIMULATED = ("ds", "specon-paper", "specon", "specon-predicted", "balancer", *PEERS)
POLICIES = (*SIMULATED, "bound")

# Every job the same CPU weight (DS and the balancer know no priority).
EQUAL_SHARES = peer_priority("none")

# "No limit" for the balancer's moves per job (the field is an int).
_UNLIMITED = 1 << 30


@dataclass(frozen=True, slots=True)
class SimPolicy:
    name: str
    # The policy handed to the shared decision code; None = no manager at all (ds).
    manager: Policy | None
    # Agents run Algorithm 1 (``classifier_for(manager.monitor)``) and send requests.
    classify: bool
    # The manager sees no convergence: every job progressing, "converged" since it started.
    blind: bool = False
    # How each worker's agent weights its jobs' CPU (the manager's policy's, if any).
    priority: PriorityConfig = field(default_factory=lambda: EQUAL_SHARES)
    # Jobs declare their total steps (else remaining work is predicted from the loss).
    declared: bool = True


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
    """The simulated policy ``name`` (one of ``SIMULATED``); alpha, interval and weights apply to
    the two specon policies. ``base`` (e.g. a user's policy file) replaces the shipped defaults
    under ``specon``; the overrides still apply on top of it."""
    if name == "ds":
        return SimPolicy(name, None, classify=False)
    if name in PEERS:
        priority = peer_priority(PEERS[name])
        return SimPolicy(name, None, classify=PEERS[name] in NEEDS_GAIN, priority=priority)
    if name in ("specon", "specon-paper", "specon-predicted"):
        if base is None or name == "specon-paper":
            base = default_policy("paper" if name == "specon-paper" else "default")
        policy = with_overrides(base, alpha=alpha, interval=interval, weights=weights)
        declared = name != "specon-predicted"
        return SimPolicy(name, policy, True, priority=policy.priority, declared=declared)
    if name == "balancer":
        base = default_policy()
        rebalance = replace(
            base.rebalance,
            mode="balanced",
            when="always",
            duration_from="converged",
            max_rebalances_per_container=_UNLIMITED,
        )
        balancer = replace(
            base,
            rebalance=rebalance,
            priority=EQUAL_SHARES,
            placement=replace(base.placement, require_gain=False),
            migration=replace(base.migration, min_residence=0.0),
        )
        return SimPolicy(name, balancer, classify=False, blind=True)
    if name == "bound":
        raise ValueError("bound is computed, not simulated: use lower_bound()")
    raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})")


@dataclass(frozen=True, slots=True)
class Bound:
    """Lower bounds for one workload (seconds) and each job's smallest possible JCT."""

    avg_jct: float
    makespan: float
    job_min: dict[str, float]


def lower_bound(workload: Workload, params: SimParams = DEFAULT_PARAMS) -> Bound:
    """Lower bounds on average JCT and makespan that no placement or migration policy
    can beat on ``workload`` under the simulator's model.

    Let w_j be job j's work (CPU-seconds on one core), a_j its submit time,
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
    r = min(params.job_cores, max(w.cpu for w in workload.workers))
    capacity = sum(w.cpu for w in workload.workers)
    first = min(j.submit for j in jobs)
    job_min = {j.id: j.work / r for j in jobs}
    alone = max(j.submit + j.work / r for j in jobs)
    # Work submitted at or after each submit time (jobs are in submit order).
    tail = 0.0
    pooled = -math.inf
    for j in reversed(jobs):
        tail += j.work
        pooled = max(pooled, j.submit + tail / capacity)
    makespan = max(alone, pooled) - first
    avg = max(sum(job_min.values()) / len(jobs), _srpt_total_flow(jobs, capacity) / len(jobs))
    return Bound(avg, makespan, job_min)


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
