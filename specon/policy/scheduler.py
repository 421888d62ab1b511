"""One decision pass of the manager, pure: which request to answer, what to defer, whether to rebalance.

The manager's coordinator and the simulator both call ``decide_pass`` with a snapshot and
the migrations in flight, and act on the ``Pass`` it returns; neither has its own copy of
these rules:

* requests are taken oldest first; a container already in a migration is dropped; one
  that would exceed the migration budget (``max_concurrent`` cluster-wide,
  ``max_concurrent_per_worker`` counting migrations from *and* to a worker) is deferred;
* Algorithm 2 decides the first request that can go; refusals are reported and the pass
  moves on; a move whose target is busy is deferred; then the pass ends, so the next one
  sees this decision's effect on the scores;
* Algorithm 3 runs only when nothing is in flight and no request waits, its trigger holds
  and the budget allows; it starts its first move (the next pass re-plans on new loads).

The work model charges each move what the caller's ``learned`` costs say (the manager's
measured moves, ``specon.policy.move_costs``), or the policy's static figures without them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from specon.config import Policy
from specon.model import ClusterSnapshot, ContainerId, WorkerId
from specon.policy import work
from specon.policy.decisions import Move, Refuse, Stay
from specon.policy.move_costs import MoveCosts
from specon.policy.placement import ClusterIndex, fits, index_for, select_target
from specon.policy.rebalance import plan_rebalance, should_rebalance


@dataclass(frozen=True, slots=True)
class InFlight:
    """A migration that has been decided and has not finished."""

    container: ContainerId
    source: WorkerId
    target: WorkerId


@dataclass(frozen=True, slots=True)
class Pass:
    # Requests of containers already being migrated: nothing to decide, forget them.
    dropped: tuple[ContainerId, ...] = ()
    # Requests held back by the migration budget: keep them for a later pass.
    deferred: tuple[ContainerId, ...] = ()
    refused: tuple[Refuse, ...] = ()
    # At most one Algorithm 2 decision (Stay or Move) per pass.
    decision: Stay | Move | None = None
    # At most one Algorithm 3 move per pass.
    rebalance: Move | None = None

    @property
    def answered(self) -> tuple[ContainerId, ...]:
        """Requests this pass settled (decided or refused): remove them from the queue."""
        out = [r.container for r in self.refused]
        if self.decision is not None:
            out.append(self.decision.container)
        return tuple(out)


class _Budget:
    def __init__(self, in_flight: Iterable[InFlight], policy: Policy) -> None:
        flights = list(in_flight)
        self.total = len(flights)
        self.per_worker = Counter(w for f in flights for w in {f.source, f.target})
        self.max_total = policy.migration.max_concurrent
        self.max_worker = policy.migration.max_concurrent_per_worker

    def room(self) -> bool:
        return self.total < self.max_total

    def free(self, worker: WorkerId) -> bool:
        return self.per_worker[worker] < self.max_worker


def decide_pass(
    snapshot: ClusterSnapshot,
    *,
    requests: Sequence[ContainerId],
    in_flight: Sequence[InFlight],
    policy: Policy,
    index: ClusterIndex | None = None,
    rebalance: bool = True,
    learned: MoveCosts | None = None,
) -> Pass:
    """One pass over the pending ``requests`` (oldest first) and, if ``rebalance``, Algorithm 3."""
    idx = index_for(snapshot, index)
    costs = costs_of(policy, learned)
    budget = _Budget(in_flight, policy)
    busy = {f.container for f in in_flight}
    timeout = policy.messaging.worker_timeout
    dropped: list[ContainerId] = []
    deferred: list[ContainerId] = []
    refused: list[Refuse] = []
    decision: Stay | Move | None = None
    for pos, cid in enumerate(requests):
        if cid in busy:
            dropped.append(cid)
            continue
        c = idx.containers.get(cid)
        if not budget.room() or (c is not None and not budget.free(c.worker)):
            deferred.append(cid)
            continue
        d = select_target(snapshot, cid, cfg=policy.placement, worker_timeout=timeout, index=idx)
        if isinstance(d, Refuse):
            refused.append(d)
            continue
        if isinstance(d, Move) and policy.placement.require_gain:
            gain = work.move_gain(snapshot, d, costs)
            if gain is not None and gain <= 0:  # predicted to cost more than it saves
                d = Stay(d.container, d.source, d.scores)
        if isinstance(d, Move) and not budget.free(d.target):
            deferred.append(cid)
            continue
        decision = d
        deferred.extend(r for r in requests[pos + 1 :] if r not in busy)
        break
    waiting = bool(deferred) or decision is not None
    move = None
    if rebalance and not in_flight and not waiting and should_rebalance(snapshot, policy.rebalance):
        moves = _rebalance_moves(snapshot, policy, idx, costs)
        if moves and policy.placement.require_gain and work.unfair(snapshot, moves[0], costs):
            moves = []  # it would make a job on the target wait too long (migration.max_push)
        if moves and budget.room() and budget.free(moves[0].source) and budget.free(moves[0].target):
            move = moves[0]
    return Pass(tuple(dropped), tuple(deferred), tuple(refused), decision, move)


def costs_of(policy: Policy, learned: MoveCosts | None = None) -> work.Costs:
    """What a move costs and how a node serves its jobs, for the work model (``learned``:
    the measured costs, used only where the policy's ``migration.learn_costs`` is on)."""
    mi = policy.migration
    return work.Costs(
        downtime=mi.move_downtime,
        restore_cpu=mi.restore_cpu,
        min_residence=mi.min_residence,
        shortest_first=policy.priority.rule in SHORTEST_FIRST,
        max_push=policy.migration.max_push,
        learned=learned if mi.learn_costs else None,
    )


def learner_of(policy: Policy) -> MoveCosts:
    """An empty estimator with the policy's figures as its prior."""
    mi = policy.migration
    return MoveCosts(mi.move_downtime, mi.restore_cpu, weight=mi.cost_prior_weight, learn=mi.learn_costs)


# Priority rules under which a node runs its shortest remaining work first.
SHORTEST_FIRST = frozenset({"srpt", "fsp"})


def _rebalance_moves(
    snapshot: ClusterSnapshot, policy: Policy, idx: ClusterIndex, costs: work.Costs
) -> list[Move]:
    timeout = policy.messaging.worker_timeout
    if policy.rebalance.mode != "work":
        return plan_rebalance(
            snapshot,
            cfg=policy.rebalance,
            worker_timeout=timeout,
            index=idx,
            min_residence=policy.migration.min_residence,
        )
    best = work.best_move(
        snapshot,
        costs,
        eligible=lambda w: w.ready and w.heartbeat_age < timeout,
        fits=lambda c, w: fits(c, w, idx.used(idx.position[w.id])),
    )
    return [] if best is None else [best[0]]
