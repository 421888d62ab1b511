"""Algorithm 2: choose the worker a converged container should run on (SPEC §4).

Pure: a snapshot in, a decision out. ``fits`` is the one feasibility rule; Algorithm 3
(``specon.policy.rebalance``) uses it too. ``ClusterIndex`` is the per-snapshot
precomputation (one pass over the containers) that makes a request cost O(workers), so
a manager answering many requests against one snapshot builds it once and passes it in.

Scoring reads the categories this way (SPEC §4.2 names only PC, WC and CC):
DIVERGING and STALLED count with the PC weight, since such a job still occupies its
worker at least as much as a progressing one; the requesting container counts as CC on
its source whatever its reported category.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter as _get
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from specon.config import PlacementConfig, Weights
from specon.model import (
    GPU_MEMORY_LABEL,
    Category,
    ClusterSnapshot,
    ContainerId,
    ContainerSnapshot,
    Resources,
    WorkerId,
    WorkerSnapshot,
)
from specon.policy.decisions import Move, PlacementDecision, RefusalReason, Refuse, Stay

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

# Feasibility predicate: may ``container`` run on ``worker`` next to containers whose
# requests sum to ``used``?
Fits = Callable[[ContainerSnapshot, WorkerSnapshot, Resources], bool]


def fits(container: ContainerSnapshot, worker: WorkerSnapshot, used: Resources) -> bool:
    """The feasibility rule of SPEC §4.1: resources, node selector, GPU memory and taints.

    ``used`` must not include ``container`` itself (it is not on ``worker`` yet). Every
    taint of the worker must be tolerated by one of the container's tolerations
    (``tolerates``); every selector pair must be among the worker's labels (a GPU product is
    one: ``GPU_PRODUCT_LABEL``); a job that needs ``gpu_memory`` per device goes only where
    the worker's ``GPU_MEMORY_LABEL`` (MiB) says its GPUs have that much.
    """
    if not container.requests.fits_in(worker.capacity - used):
        return False
    if container.selector and not all(pair in worker.labels for pair in container.selector):
        return False
    if container.gpu_memory and container.gpu_memory > gpu_memory_of(worker):
        return False
    tolerations = container.tolerations
    return not worker.taints or all(
        taint in tolerations or any(tolerates(t, taint) for t in tolerations) for taint in worker.taints
    )


def gpu_memory_of(worker: WorkerSnapshot) -> int:
    """Bytes of memory on each of the worker's GPUs, from its ``GPU_MEMORY_LABEL`` (MiB); 0 where
    it has none or the label is not a number."""
    for key, value in worker.labels:
        if key == GPU_MEMORY_LABEL:
            try:
                mib = int(value)
            except ValueError:
                return 0
            return max(0, mib) * 2**20
    return 0


# -- taints and tolerations ----------------------------------------------------------------------
# Kubernetes' model (``ToleratesTaint``) in one string each, so snapshots and heartbeats stay
# flat and hashable:
#   taint       ``key[=value][:Effect]``   e.g. ``gpu=a100:NoSchedule``, ``drain``
#   toleration  ``key``        operator Exists: any value of ``key``
#               ``key=value``  operator Equal (``key=`` matches only an empty value)
#               ``*``          operator Exists without a key: every taint
#               each optionally ``:Effect``, which restricts it to taints of that effect;
#               without one it tolerates every effect.
# A taint without an effect is tolerated only by tolerations without one. Keys and values
# never contain ``=`` or ``:`` in Kubernetes, so the split is unambiguous.
ANY_KEY = "*"


def split_taint(text: str) -> tuple[str, str | None, str]:
    """``key[=value][:Effect]`` as (key, value or None when there is no ``=``, effect)."""
    body, colon, effect = text.rpartition(":")
    if not colon:
        body, effect = text, ""
    key, eq, value = body.partition("=")
    return key, value if eq else None, effect


def tolerates(toleration: str, taint: str) -> bool:
    """Whether ``toleration`` tolerates ``taint`` (both in the notation above)."""
    t_key, t_value, t_effect = split_taint(toleration)
    key, value, effect = split_taint(taint)
    if t_effect and t_effect != effect:
        return False
    if t_key not in (ANY_KEY, key):
        return False
    return t_value is None or t_value == (value or "")


# Score column per category: 0 = PC weight, 1 = WC weight, 2 = CC weight.
_SCORE_COLUMN: Mapping[Category, int] = MappingProxyType(
    {
        Category.PROGRESSING: 0,
        Category.DIVERGING: 0,
        Category.STALLED: 0,
        Category.WATCHING: 1,
        Category.CONVERGED: 2,
    }
)


def _weight_vector(weights: Weights) -> FloatArray:
    return np.array([weights.progressing, weights.watching, weights.converged], dtype=np.float64)


@dataclass(frozen=True, slots=True, eq=False)
class ClusterIndex:
    """Per-worker aggregates of one snapshot, computed in one pass over its containers.

    Arrays are indexed by the worker's position in ``snapshot.workers``. Treat them as
    read-only: the index may be shared by many decisions.
    """

    snapshot: ClusterSnapshot
    ids: tuple[WorkerId, ...]
    position: Mapping[WorkerId, int]
    containers: Mapping[ContainerId, ContainerSnapshot]
    # Per container, in snapshot order: the position of its worker, -1 if not in the snapshot.
    container_pos: npt.NDArray[np.int64]
    # (workers, 3) container counts per score column (see _SCORE_COLUMN).
    counts: FloatArray
    # Containers per worker (every container in the snapshot is live, hence active).
    loads: npt.NDArray[np.int64]
    used_cpu: FloatArray
    used_memory: npt.NDArray[np.int64]
    used_gpu: npt.NDArray[np.int64]
    ready: BoolArray
    heartbeat_age: FloatArray
    # R(w, t), with non-finite readings replaced by +inf so they rank last.
    usage: FloatArray
    cpu_capacity: FloatArray
    # Containers whose worker is not in the snapshot: counted, left out of every aggregate.
    orphans: int

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> ClusterIndex:
        """Index ``snapshot``; duplicate worker or container ids are a ValueError."""
        workers = snapshot.workers
        containers = snapshot.containers
        ids = tuple(map(_get("id"), workers))
        position = dict(zip(ids, range(len(ids)), strict=True))
        if len(position) != len(workers):
            raise ValueError("snapshot lists a worker id more than once")
        by_id = dict(zip(map(_get("id"), containers), containers, strict=True))
        if len(by_id) != len(containers):
            raise ValueError("snapshot lists a container id more than once")
        n_workers = len(workers)

        # map/attrgetter keep the per-container loops in C: this runs over every container.
        pos = np.fromiter(map(position.get, map(_get("worker"), containers), repeat(-1)), np.int64)
        known = pos >= 0
        wpos = pos[known]
        column = np.fromiter(map(_SCORE_COLUMN.__getitem__, map(_get("category"), containers)), np.int64)

        def per_worker(attr: str) -> FloatArray:
            weights = np.fromiter(map(_get(attr), containers), np.float64)[known]
            return np.bincount(wpos, weights=weights, minlength=n_workers).astype(np.float64)

        counts = np.bincount(wpos * 3 + column[known], minlength=3 * n_workers).astype(np.float64)
        usage = np.fromiter(map(_get("usage"), workers), np.float64)
        return cls(
            snapshot=snapshot,
            ids=ids,
            position=MappingProxyType(position),
            containers=MappingProxyType(by_id),
            container_pos=pos,
            counts=counts.reshape(n_workers, 3),
            loads=np.bincount(wpos, minlength=n_workers).astype(np.int64),
            used_cpu=per_worker("requests.cpu"),
            used_memory=np.rint(per_worker("requests.memory")).astype(np.int64),
            used_gpu=np.rint(per_worker("requests.gpu")).astype(np.int64),
            ready=np.fromiter(map(_get("ready"), workers), np.bool_),
            heartbeat_age=np.fromiter(map(_get("heartbeat_age"), workers), np.float64),
            usage=np.where(np.isfinite(usage), usage, np.inf),
            cpu_capacity=np.fromiter(map(_get("capacity.cpu"), workers), np.float64),
            orphans=int(len(pos) - len(wpos)),
        )

    def used(self, pos: int) -> Resources:
        """The summed requests of the containers on the worker at ``pos``."""
        return Resources(float(self.used_cpu[pos]), int(self.used_memory[pos]), int(self.used_gpu[pos]))

    def eligible(self, worker_timeout: float) -> BoolArray:
        """Workers that are Ready and whose heartbeat is younger than ``worker_timeout``."""
        # NaN ages compare False, so a worker with a garbled age counts as unreachable.
        return self.ready & (self.heartbeat_age < worker_timeout)


def index_for(snapshot: ClusterSnapshot, index: ClusterIndex | None = None) -> ClusterIndex:
    """``index`` if it was built for ``snapshot``, a fresh index if None; else ValueError."""
    if index is None:
        return ClusterIndex.of(snapshot)
    if index.snapshot is not snapshot:
        raise ValueError("the ClusterIndex was built for a different snapshot")
    return index


def _scores(
    index: ClusterIndex, container: ContainerSnapshot, source: int, cfg: PlacementConfig
) -> FloatArray:
    weights = _weight_vector(cfg.weights)
    scores: FloatArray = index.counts @ weights
    # The requester counts as CC on its source, whatever category it reports (-1: it runs
    # nowhere, and counts on no worker).
    if source >= 0:
        scores[source] += weights[2] - weights[_SCORE_COLUMN[container.category]]
    if cfg.score == "per_capacity":
        capacity = index.cpu_capacity
        usable = np.isfinite(capacity) & (capacity > 0)
        # A worker without a usable CPU capacity cannot be ranked per core: it ranks last.
        scores = np.divide(scores, capacity, out=np.full_like(scores, np.inf), where=usable)
    return scores


def select_target(
    snapshot: ClusterSnapshot,
    container_id: ContainerId,
    *,
    cfg: PlacementConfig,
    worker_timeout: float,
    index: ClusterIndex | None = None,
    fits: Fits = fits,
) -> PlacementDecision:
    """Algorithm 2 for one reallocation request.

    Candidates are the Ready, reachable workers that ``fits`` the container; the source
    is a candidate whenever it is Ready and reachable (the container already runs
    there). T is every candidate whose score is within ``cfg.tolerance`` of the lowest.
    Source in T -> ``Stay``; otherwise ``Move`` to the member of T with the lowest usage,
    then fewest containers, then lowest worker id.

    ``scores`` in the decision covers every Ready, reachable worker. The caller records
    the decision (``migrated``, and one more ``migrations`` for a Stay as for a Move);
    a container with ``migrations >= cfg.max_migrations_per_container`` is refused.
    """
    idx = index_for(snapshot, index)
    container = idx.containers.get(container_id)
    if container is None:
        return Refuse(container_id, RefusalReason.UNKNOWN_CONTAINER, "not in the snapshot")
    if container.migrations >= cfg.max_migrations_per_container:
        detail = f"already decided {container.migrations} time(s); limit {cfg.max_migrations_per_container}"
        return Refuse(container_id, RefusalReason.MIGRATION_LIMIT, detail)
    if not container.movable:
        return Stay(container_id, container.worker)
    source = idx.position.get(container.worker)
    if source is None:
        return Refuse(
            container_id, RefusalReason.UNKNOWN_SOURCE, f"worker {container.worker} not in the snapshot"
        )

    scores = _scores(idx, container, source, cfg)
    eligible = idx.eligible(worker_timeout)
    workers = snapshot.workers
    eligible_pos = np.flatnonzero(eligible)

    def feasible(p: int) -> bool:
        return p == source or fits(container, workers[p], idx.used(p))

    members = _lowest_tier(idx, scores, eligible_pos, cfg.tolerance, feasible)
    if not members:
        return Refuse(container_id, RefusalReason.NO_CANDIDATE, "no Ready, reachable worker can host it")
    table = MappingProxyType(
        dict(zip([idx.ids[p] for p in eligible_pos.tolist()], scores[eligible_pos].tolist(), strict=True))
    )
    if source in members:
        return Stay(container_id, container.worker, table)
    return Move(container_id, container.worker, idx.ids[_least_used(idx, members)], "converged", table)


def select_home(
    index: ClusterIndex,
    container: ContainerSnapshot,
    *,
    cfg: PlacementConfig,
    worker_timeout: float,
    fits: Fits = fits,
) -> WorkerId | None:
    """Algorithm 2 for a job that runs nowhere (its host lost, its copy ended): T is every
    Ready, reachable worker it fits whose score is within ``cfg.tolerance`` of the lowest; the
    member with the lowest usage, then fewest containers, then lowest id. None: no worker can
    host it. Its last worker is a candidate like any other, and counts it on no score."""
    homes = ranked_homes(index, container, cfg=cfg, worker_timeout=worker_timeout, fits=fits, limit=1)
    return homes[0] if homes else None


def ranked_homes(
    index: ClusterIndex,
    container: ContainerSnapshot,
    *,
    cfg: PlacementConfig,
    worker_timeout: float,
    fits: Fits = fits,
    limit: int,
) -> list[WorkerId]:
    """Up to ``limit`` workers for a job that runs nowhere, best first: ``select_home``'s
    choice, then the rest of T, then the other workers it fits by score (a new pod's preferred
    nodes). ``index`` may count the job on its lost worker (its last heartbeat listed it):
    that one is not eligible, and every other worker's load is without it."""
    scores = _scores(index, container, -1, cfg)
    eligible_pos = np.flatnonzero(index.eligible(worker_timeout))
    workers = index.snapshot.workers

    def feasible(p: int) -> bool:
        return fits(container, workers[p], index.used(p))

    members = _lowest_tier(index, scores, eligible_pos, cfg.tolerance, feasible)
    if not members:
        return []
    best = sorted(members, key=lambda p: _usage_key(index, p))
    out = best[:limit]
    if len(out) < limit:
        chosen = set(members)
        for p in eligible_pos[np.argsort(scores[eligible_pos], kind="stable")].tolist():
            if len(out) >= limit:
                break
            if p not in chosen and feasible(p):
                out.append(p)
    return [index.ids[p] for p in out]


def _lowest_tier(
    idx: ClusterIndex, scores: FloatArray, eligible_pos: npt.NDArray[np.int64], tolerance: float,
    feasible: Callable[[int], bool],
) -> list[int]:  # fmt: skip
    """T: the feasible eligible positions whose score is within ``tolerance`` of the lowest
    feasible one. Walks from the lowest score up and tests feasibility lazily: T is usually
    found after a handful of workers, so ``feasible`` rarely runs for all of them."""
    order = eligible_pos[np.argsort(scores[eligible_pos], kind="stable")]
    best = math.nan
    members: list[int] = []
    for p in order.tolist():
        score = float(scores[p])
        if members and score > best + tolerance:
            break
        if not feasible(p):
            continue
        if not members:
            best = score
        members.append(p)
    return members


def _usage_key(idx: ClusterIndex, p: int) -> tuple[float, int, WorkerId]:
    return float(idx.usage[p]), int(idx.loads[p]), idx.ids[p]


def _least_used(idx: ClusterIndex, members: list[int]) -> int:
    """The member of T a job goes to: lowest usage, then fewest containers, then lowest id."""
    return min(members, key=lambda p: _usage_key(idx, p))
