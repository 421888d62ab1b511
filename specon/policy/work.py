"""Work-aware moves: a move is made only when the predicted total completion time of the
jobs it touches falls by more than the move costs.

Pure: a snapshot in, a ``Move`` (or nothing) out. Each container may report its remaining
work (``ContainerSnapshot.remaining_work``: CPU-seconds on one core, the agent's estimate
from declared or predicted steps and its measured CPU per step). A worker is modelled as
serving its jobs in the order of the node's priority rule: shortest remaining work first
(``srpt``/``fsp``: the first job gets the worker, up to one core) or equal sharing
(no rule). The total completion time of the jobs on worker w, with remaining works
x_1 <= ... <= x_n on C cores, is then

* shortest first: sum_k max(x_k, (x_1 + ... + x_k) / C);
* equal sharing:  sum_k max(x_k, (x_1 + ... + x_{k-1} + (n - k + 1) x_k) / C).

Moving job j from s to t changes the total by F(s - j) + F(t + j) - F(s) - F(t); the move
also costs j its downtime (``migration.move_downtime``: measured SIGTERM to first record on
the target) and every job on t the restore's CPU (``migration.restore_cpu`` CPU-seconds
shared over C_t cores). Pollux charges a restart the same way. Both figures are the policy's
unless ``Costs.learned`` holds what the manager measured (``specon.policy.move_costs``: per
backend and job size, the policy's figures as the prior). The plan takes the single
move with the largest net gain, if it is positive, among jobs that have stayed on their
worker for ``migration.min_residence`` seconds (no ping-pong: a job just moved stays), on
workers that fit them. Jobs that report no remaining work count on their worker at the
median of the known ones and are never moved by this rule.

To stay cheap on large clusters only the ``CANDIDATES`` workers with the most and the least
predicted total completion time are searched as sources and targets.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from specon.model import ClusterSnapshot, ContainerSnapshot, WorkerSnapshot
from specon.policy.decisions import Move
from specon.policy.move_costs import MoveCosts

CANDIDATES = 16
# Cores one job can use (the jobs are single-process trainers; a worker's capacity above
# this is shared by more jobs at once).
JOB_CORES = 1.0


@dataclass(frozen=True, slots=True)
class Costs:
    downtime: float  # seconds a moved job does not run
    restore_cpu: float  # CPU-seconds the restore takes from the target's jobs
    min_residence: float  # seconds a job stays on a worker before it may move again
    shortest_first: bool  # the node serves shortest remaining work first (else shares equally)
    # Fairness: a moved job may go ahead of a job on the target (shortest first) only if its
    # work is at most this share of that job's own remaining work (inf: no limit).
    max_push: float = math.inf
    # What the manager measured (None: the two figures above, the policy's, for every move).
    learned: MoveCosts | None = field(default=None, compare=False)

    def of(self, container: ContainerSnapshot, target: WorkerSnapshot) -> tuple[float, float]:
        """(downtime, restore CPU) of moving ``container`` onto ``target``."""
        if self.learned is None:
            return self.downtime, self.restore_cpu
        return self.learned.for_move(container, target)


def flow(works: Sequence[float], cpu: float, *, shortest_first: bool) -> float:
    """Total completion time of ``works`` (sorted ascending) on ``cpu`` cores."""
    cpu = max(cpu, 1e-9)
    total = 0.0
    prefix = 0.0
    n = len(works)
    for k, x in enumerate(works):
        ahead = prefix + x if shortest_first else prefix + (n - k) * x
        total += max(x / JOB_CORES, ahead / cpu)
        prefix += x
    return total


def _typical(snapshot: ClusterSnapshot) -> float | None:
    """The median reported remaining work: what a job that reports none counts as."""
    known = [c.remaining_work for c in snapshot.containers if c.remaining_work is not None]
    return statistics.median(known) if known else None


def _gain(
    x: float,
    saved: float,
    target: Sequence[float],
    target_flow: float,
    target_cpu: float,
    *,
    shortest_first: bool,
    charge: tuple[float, float],
) -> float:
    """Net gain of moving a job of work ``x`` that saves ``saved`` on its source onto a
    worker with works ``target`` (sorted, total completion time ``target_flow``), the move
    charged ``charge`` (downtime, restore CPU)."""
    grown = list(target)
    bisect.insort(grown, x)
    added = flow(grown, target_cpu, shortest_first=shortest_first) - target_flow
    downtime, restore_cpu = charge
    penalty = downtime + restore_cpu * len(target) / max(target_cpu, 1e-9)
    return saved - added - penalty


def _saved(x: float, source: Sequence[float], source_flow: float, source_cpu: float, costs: Costs) -> float:
    """What taking a job of work ``x`` off a worker with works ``source`` (sorted) saves."""
    rest = list(source)
    i = bisect.bisect_left(rest, x)
    if i < len(rest) and rest[i] == x:
        del rest[i]
    return source_flow - flow(rest, source_cpu, shortest_first=costs.shortest_first)


@dataclass(slots=True)
class _Worker:
    snap: WorkerSnapshot
    works: list[float]  # sorted remaining works of its jobs
    flow: float


def best_move(
    snapshot: ClusterSnapshot,
    costs: Costs,
    *,
    eligible: Callable[[WorkerSnapshot], bool],
    fits: Callable[[ContainerSnapshot, WorkerSnapshot], bool],
    min_gain: float = 0.0,
) -> tuple[Move, float] | None:
    """The move with the largest predicted net gain (seconds of total completion time saved),
    if any exceeds ``min_gain``; ``eligible`` says which workers may take part."""
    typical = _typical(snapshot)
    if typical is None:
        return None
    workers = {w.id: _Worker(w, [], 0.0) for w in snapshot.workers if eligible(w)}
    if len(workers) < 2:
        return None
    movable: dict[str, list[ContainerSnapshot]] = {wid: [] for wid in workers}
    for c in snapshot.containers:
        w = workers.get(c.worker)
        if w is None:
            continue
        w.works.append(typical if c.remaining_work is None else c.remaining_work)
        settled = c.since is None or snapshot.now - c.since >= costs.min_residence
        if c.remaining_work is not None and c.movable and settled:
            movable[c.worker].append(c)
    for w in workers.values():
        w.works.sort()
        w.flow = flow(w.works, w.snap.capacity.cpu, shortest_first=costs.shortest_first)
    ranked = sorted(workers.values(), key=lambda w: (w.flow, w.snap.id))
    sources = [w for w in reversed(ranked[-CANDIDATES:]) if movable[w.snap.id]]
    targets = ranked[:CANDIDATES]
    best: tuple[Move, float] | None = None
    for s in sources:
        for c in movable[s.snap.id]:
            x = c.remaining_work
            assert x is not None
            saved = _saved(x, s.works, s.flow, s.snap.capacity.cpu, costs)
            for t in targets:
                if t is s or not fits(c, t.snap):
                    continue
                if costs.shortest_first and pushes_too_far(x, t.works, costs.max_push):
                    continue
                gain = _gain(x, saved, t.works, t.flow, t.snap.capacity.cpu,
                             shortest_first=costs.shortest_first, charge=costs.of(c, t.snap))  # fmt: skip
                if gain > min_gain and (best is None or gain > best[1]):
                    best = (Move(c.id, s.snap.id, t.snap.id, reason="rebalance"), gain)
    return best


def pushes_too_far(work: float, target: Sequence[float], max_push: float) -> bool:
    """Whether a job of ``work`` would go ahead of a job on the target whose own remaining
    work is less than ``work / max_push`` (it would wait more than that share of it)."""
    return any(work < r < work / max_push for r in target) if max_push > 0 else any(r > work for r in target)


def unfair(snapshot: ClusterSnapshot, move: Move, costs: Costs) -> bool:
    """Whether ``move`` would push its job too far ahead of one on the target (``max_push``)."""
    if not costs.shortest_first:
        return False
    moved = next((c.remaining_work for c in snapshot.containers if c.id == move.container), None)
    if moved is None:
        return False
    target = [
        c.remaining_work
        for c in snapshot.containers
        if c.worker == move.target and c.remaining_work is not None
    ]
    return pushes_too_far(moved, target, costs.max_push)


def move_gain(snapshot: ClusterSnapshot, move: Move, costs: Costs) -> float | None:
    """The predicted net gain of ``move`` (None: the moved job reports no remaining work)."""
    typical = _typical(snapshot) or 0.0
    by_worker: dict[str, list[float]] = {}
    moved = None
    mover: ContainerSnapshot | None = None
    for c in snapshot.containers:
        by_worker.setdefault(c.worker, []).append(typical if c.remaining_work is None else c.remaining_work)
        if c.id == move.container:
            moved, mover = c.remaining_work, c
    if moved is None or mover is None:
        return None
    s_works = sorted(by_worker.get(move.source, []))
    t_works = sorted(by_worker.get(move.target, []))
    if costs.shortest_first and pushes_too_far(moved, t_works, costs.max_push):
        return -math.inf
    s_cpu = snapshot.worker(move.source).capacity.cpu
    target = snapshot.worker(move.target)
    t_cpu = target.capacity.cpu
    sf = costs.shortest_first
    saved = _saved(moved, s_works, flow(s_works, s_cpu, shortest_first=sf), s_cpu, costs)
    t_flow = flow(t_works, t_cpu, shortest_first=sf)
    return _gain(moved, saved, t_works, t_flow, t_cpu, shortest_first=sf, charge=costs.of(mover, target))
