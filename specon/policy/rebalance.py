"""Algorithm 3: even out the number of containers per worker (SPEC §5).

Pure: a snapshot in, a list of ``Move(reason="rebalance")`` out, in the order to run them.
The manager asks ``should_rebalance`` first and calls ``plan_rebalance`` only when it says
so.

Readings fixed here:
* W is the set of *eligible* workers (Ready, heartbeat younger than ``worker_timeout``);
  |w| counts every container on w (every container in a snapshot is live); bf and all
  loads are taken over W only. Containers on other workers are neither counted nor moved.
* d_c = now - t_cc (``duration_from: converged``), now - t_migrated (``migrated``) or the
  time since it was placed on its worker (``placed``: the most recently placed moves first,
  what a convergence-blind balancer does).
  A container may move only if its d is defined and finite and it was rebalanced fewer
  than ``max_rebalances_per_container`` times, whatever its current category (under
  ``when: all_migrated`` all are frozen in CC anyway); within one plan it moves at most once.
* Ties: equal d -> lower container id (in ``balanced``, between the heads of two equally
  loaded workers -> lower worker id); equal loads -> lower worker id.
* A move the target cannot host (``fits``, the rule Algorithm 2 uses) is skipped and the
  search goes on in the algorithm's own order: in ``paper`` mode the target takes the
  smallest-d container that fits it; in ``balanced`` mode the container goes to the
  least-loaded worker (load <= max - 2) that fits it, or is dropped from this plan if none
  does. Taking any such worker, not only a minimum one, keeps one unfit idle worker (a
  taint, a full GPU) from blocking every other move.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from specon.config import RebalanceConfig
from specon.model import ClusterSnapshot, ContainerSnapshot, Resources
from specon.policy.decisions import Move
from specon.policy.placement import BoolArray, ClusterIndex, Fits, fits, index_for

_STAMPS = {"converged": "t_cc", "migrated": "t_migrated", "placed": "since"}


def should_rebalance(snapshot: ClusterSnapshot, cfg: RebalanceConfig) -> bool:
    """The trigger. ``all_migrated``: there are live containers and all are ``migrated``."""
    if cfg.mode == "off":
        return False
    if cfg.when == "always":
        return True
    return bool(snapshot.containers) and all(c.migrated for c in snapshot.containers)


def plan_rebalance(
    snapshot: ClusterSnapshot,
    *,
    cfg: RebalanceConfig,
    worker_timeout: float,
    index: ClusterIndex | None = None,
    fits: Fits = fits,
    min_residence: float = 0.0,
) -> list[Move]:
    """Algorithm 3 in ``cfg.mode``: the moves to run, in order (``off`` -> none; ``work`` is
    ``specon.policy.work``'s, not planned here). A container that has been on its worker for
    less than ``min_residence`` seconds stays."""
    if cfg.mode in ("off", "work"):
        return []
    plan = _Plan.of(index_for(snapshot, index), cfg, worker_timeout, fits, min_residence)
    if not plan.workers:
        return []
    if cfg.mode == "paper":
        return plan.paper()
    return plan.balanced()


def _movable(
    index: ClusterIndex, cfg: RebalanceConfig, eligible: BoolArray, min_residence: float
) -> tuple[list[int], list[float]]:
    """The movable containers on eligible workers (snapshot indices) and their d, grouped
    by worker position and ordered by (worker position, d, container id)."""
    containers = index.snapshot.containers
    stamp = _STAMPS[cfg.duration_from]
    # A float array turns None into NaN, which the finiteness test below drops.
    d = index.snapshot.now - np.array(list(map(attrgetter(stamp), containers)), dtype=np.float64)
    rebalances = np.fromiter(map(attrgetter("rebalances"), containers), np.int64)
    pos = index.container_pos
    movable = np.fromiter(map(attrgetter("movable"), containers), np.bool_, len(containers))
    ok = (pos >= 0) & np.isfinite(d) & (rebalances < cfg.max_rebalances_per_container) & movable
    if min_residence > 0:
        since = np.array([-math.inf if c.since is None else c.since for c in containers], dtype=np.float64)
        ok &= index.snapshot.now - since >= min_residence
    ok[ok] = eligible[pos[ok]]
    chosen = np.flatnonzero(ok)
    chosen = chosen[np.lexsort((d[chosen], pos[chosen]))]
    order: list[int] = chosen.tolist()
    ds: list[float] = d[chosen].tolist()
    # lexsort keeps snapshot order among equal d; put those runs in container-id order.
    same = np.flatnonzero((pos[chosen][1:] == pos[chosen][:-1]) & (d[chosen][1:] == d[chosen][:-1]))
    for first, last in _runs(same.tolist()):
        order[first : last + 1] = sorted(order[first : last + 1], key=lambda i: containers[i].id)
    return order, ds


def _runs(links: list[int]) -> list[tuple[int, int]]:
    """[i, ...] where item i ties with item i+1 -> the maximal tied ranges (first, last)."""
    runs: list[tuple[int, int]] = []
    for i in links:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


@dataclass(slots=True)
class _Plan:
    """Mutable working state of one planning run; never escapes ``plan_rebalance``."""

    index: ClusterIndex
    fits: Fits
    # Eligible worker positions, ordered by worker id so every tie-break is by id.
    workers: list[int]
    # Containers per worker position (only eligible positions are meaningful).
    loads: list[int]
    # Movable containers as snapshot indices with their d; worker p's share is
    # order[start[p]:end[p]], smallest d first.
    order: list[int]
    d: list[float]
    start: list[int]
    end: list[int]
    # Summed requests per worker position, updated as moves are planned.
    used_cpu: list[float]
    used_memory: list[int]
    used_gpu: list[int]
    moves: list[Move]

    @classmethod
    def of(
        cls,
        index: ClusterIndex,
        cfg: RebalanceConfig,
        worker_timeout: float,
        fits: Fits,
        min_residence: float,
    ) -> _Plan:
        eligible = index.eligible(worker_timeout)
        workers = sorted(np.flatnonzero(eligible).tolist(), key=index.ids.__getitem__)
        order, d = _movable(index, cfg, eligible, min_residence)
        grouped = index.container_pos[order] if order else np.zeros(0, np.int64)
        every = np.arange(len(index.ids))
        start = np.searchsorted(grouped, every, side="left").tolist()
        end = np.searchsorted(grouped, every, side="right").tolist()
        return cls(
            index,
            fits,
            workers,
            index.loads.tolist(),
            order,
            d,
            start,
            end,
            index.used_cpu.tolist(),
            index.used_memory.tolist(),
            index.used_gpu.tolist(),
            [],
        )

    def _can_host(self, container: ContainerSnapshot, pos: int) -> bool:
        used = Resources(self.used_cpu[pos], self.used_memory[pos], self.used_gpu[pos])
        return self.fits(container, self.index.snapshot.workers[pos], used)

    def _move(self, container: ContainerSnapshot, source: int, target: int) -> None:
        r = container.requests
        self.used_cpu[source] -= r.cpu
        self.used_memory[source] -= r.memory
        self.used_gpu[source] -= r.gpu
        self.used_cpu[target] += r.cpu
        self.used_memory[target] += r.memory
        self.used_gpu[target] += r.gpu
        self.loads[source] -= 1
        self.loads[target] += 1
        ids = self.index.ids
        self.moves.append(Move(container.id, ids[source], ids[target], "rebalance"))

    # -- rebalance: paper ------------------------------------------------------------

    def paper(self) -> list[Move]:
        """The printed algorithm with the repairs SPEC §5 lists (see module docstring)."""
        loads, containers = self.loads, self.index.snapshot.containers
        bf = sum(loads[p] for p in self.workers) // len(self.workers)
        # D across every eligible worker: (d, container id, snapshot index, worker position).
        pool = sorted(
            (self.d[k], containers[self.order[k]].id, self.order[k], p)
            for p in self.workers
            for k in range(self.start[p], self.end[p])
        )
        taken: set[int] = set()

        def take(target: int, excluded_sources: set[int]) -> None:
            for _, _, i, source in pool:
                if i in taken or source in excluded_sources or not self._can_host(containers[i], target):
                    continue
                taken.add(i)  # D.remove(d_c)
                self._move(containers[i], source, target)
                return

        idle = [p for p in self.workers if loads[p] == 0]
        if idle:
            for p in idle:
                if loads[p] < bf:
                    take(p, {p})
        else:
            targets = [p for p in self.workers if loads[p] < bf - 1]
            excluded = set(targets)
            for p in targets:
                if loads[p] < bf - 1:  # line 27 reads the target's own, current load
                    take(p, excluded)
        return self.moves

    # -- rebalance: balanced ---------------------------------------------------------

    def balanced(self) -> list[Move]:
        """While max|w| - min|w| >= 2, move the smallest-d movable container of a
        most-loaded worker to the least-loaded worker (load <= max - 2) that fits it.

        Every round either moves a container or drops one from this plan, so it ends
        after at most one round per movable container. The source drops from max to
        max - 1 and the target rises to at most max - 1, so max never rises and min never
        falls: the spread never widens.
        """
        loads, order, ds, end, workers = self.loads, self.order, self.d, self.end, self.workers
        containers = self.index.snapshot.containers
        head = list(self.start)  # next movable entry per worker position
        top = max(loads[p] for p in workers)
        bottom = min(loads[p] for p in workers)
        per_load = [0] * (top + 1)  # how many eligible workers carry each load
        # Lazy heaps per load level, workers named by rank = index into ``workers`` (id
        # order). An entry is stale once its worker's load, or for a source its head,
        # has moved on; it is dropped when it surfaces.
        sources: list[list[tuple[float, int, int]]] = [[] for _ in per_load]  # (d of head, rank, head)
        targets: list[list[int]] = [[] for _ in per_load]  # rank
        for rank, p in enumerate(workers):
            per_load[loads[p]] += 1
            targets[loads[p]].append(rank)  # ascending ranks: already a heap
            if head[p] < end[p]:
                sources[loads[p]].append((ds[head[p]], rank, head[p]))
        for heap in sources:
            heapq.heapify(heap)

        def offer_source(rank: int) -> None:
            p = workers[rank]
            k = head[p]
            if k < end[p]:
                heapq.heappush(sources[loads[p]], (ds[k], rank, k))

        while top - bottom >= 2:
            heap = sources[top]
            while heap:
                _, rank, k = heap[0]
                p = workers[rank]
                if loads[p] == top and head[p] == k:
                    break
                heapq.heappop(heap)
            if not heap:
                break  # no most-loaded worker has anything left to move
            source_rank = heapq.heappop(heap)[1]
            source = workers[source_rank]
            container = containers[order[head[source]]]
            head[source] += 1

            target_rank = -1
            for level in range(bottom, top - 1):
                heap_t = targets[level]
                passed: list[int] = []
                while heap_t:
                    rank = heapq.heappop(heap_t)
                    if loads[workers[rank]] != level:
                        continue  # stale
                    if self._can_host(container, workers[rank]):
                        target_rank = rank
                        break
                    passed.append(rank)
                for rank in passed:
                    heapq.heappush(heap_t, rank)
                if target_rank >= 0:
                    break

            if target_rank >= 0:
                target = workers[target_rank]
                per_load[loads[source]] -= 1
                per_load[loads[target]] -= 1
                self._move(container, source, target)
                per_load[loads[source]] += 1
                per_load[loads[target]] += 1
                heapq.heappush(targets[loads[source]], source_rank)
                heapq.heappush(targets[loads[target]], target_rank)
                offer_source(target_rank)
                while per_load[top] == 0:
                    top -= 1
                while per_load[bottom] == 0:
                    bottom += 1
            offer_source(source_rank)
        return self.moves
