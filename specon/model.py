"""Shared vocabulary: ids, categories and the frozen snapshots decisions are made on.

Everything here is plain data. Policies take these snapshots in and hand decisions
out; they never read a clock, a file or the network.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, NewType

WorkerId = NewType("WorkerId", str)
ContainerId = NewType("ContainerId", str)


class Category(enum.StrEnum):
    """A container's training phase as Algorithm 1 (or the robust classifier) sees it."""

    PROGRESSING = "progressing"
    WATCHING = "watching"
    CONVERGED = "converged"
    # Only the robust classifier emits DIVERGING; STALLED marks a container whose log
    # has been silent for ``stale_ticks`` ticks in a row (SPEC §2).
    DIVERGING = "diverging"
    STALLED = "stalled"

    @property
    def short(self) -> str:
        """The paper's two-letter name (PC, WC, CC) or the first letter upper-cased."""
        return _SHORT[self]


_SHORT = {
    Category.PROGRESSING: "PC",
    Category.WATCHING: "WC",
    Category.CONVERGED: "CC",
    Category.DIVERGING: "DV",
    Category.STALLED: "ST",
}

# The paper's |PC| + |WC|: containers still training fast enough to profit from CPU a
# converged neighbour gives up. The policies add DIVERGING (and scoring STALLED) to it,
# since such a job still occupies its worker like a progressing one.
ACTIVE_CATEGORIES = frozenset({Category.PROGRESSING, Category.WATCHING})


class Direction(enum.StrEnum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


# A container's CPU weight, as cgroup v2 ``cpu.weight``: 1..10,000, 100 for a container nobody
# prioritised (the priority rules make them; every backend applies them as it can).
# The worker label naming its runtime backend (local, docker, kubernetes): what the manager
# learns move costs per (specon.policy.move_costs). A node label of the same name wins.
RUNTIME_LABEL = "specon.io/runtime"

# Node taints a worker reports (``key[=value]:Effect``) with a meaning specon acts on. A
# cordoned node carries the first (Kubernetes implies it for ``spec.unschedulable``); the
# second list is the reclaim notices clouds and autoscalers put on a node about to go
# (GKE, the AWS node termination handler, Karpenter v1 and before), and specon's own.
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
RECLAIM_TAINTS = (
    "cloud.google.com/impending-node-termination",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/scheduled-maintenance",
    "aws-node-termination-handler/rebalance-recommendation",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "specon.io/evacuate",
)

# GPUs: one vocabulary on every backend, NVIDIA's (the device plugin's resource name and the
# node labels of its GPU feature discovery). Agents set the labels from NVML, so placement
# reads a Docker host's or a local worker's GPUs as it reads a Kubernetes node's.
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # e.g. NVIDIA-H100-80GB-HBM3 (spaces as "-")
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per device (the smallest of the worker's)
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
# A job label (pod annotation on Kubernetes) "true": a restored GPU job may run on any GPU
# product; otherwise it keeps to the product it ran on.
GPU_ANY_PRODUCT_LABEL = "specon.io/gpu-any-product"
# A job label (pod annotation on Kubernetes): the GPU memory it needs on each of its GPUs, in
# bytes or as a quantity (``40Gi``): ``JobSpec.gpu_memory``.
GPU_MEMORY_NEED_LABEL = "specon.io/gpu-memory"


# What a GPU-sharing agent does with a job on its GPU: it runs, it is frozen where it stands
# (memory kept), or it was suspended to its checkpoint to free GPU memory and will be restored
# on its worker when it is next due.
GpuState = Literal["running", "frozen", "suspended"]


def gpu_product_label(name: str) -> str:
    """An NVML product name as GPU feature discovery writes it into a label value."""
    return "-".join(name.split())


WEIGHT_MIN = 1
WEIGHT_MAX = 10_000
WEIGHT_DEFAULT = 100


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource request or capacity. CPU in cores, memory in bytes, GPUs as a count."""

    cpu: float = 0.0
    memory: int = 0
    gpu: int = 0

    def fits_in(self, free: Resources) -> bool:
        return self.cpu <= free.cpu + 1e-9 and self.memory <= free.memory and self.gpu <= free.gpu

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory, self.gpu + other.gpu)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory, self.gpu - other.gpu)


@dataclass(frozen=True, slots=True)
class ContainerSnapshot:
    """What the manager knows about one container at decision time."""

    id: ContainerId
    worker: WorkerId
    category: Category
    # Seconds on the manager's clock; None when the container has never reached CC.
    t_cc: float | None = None
    # Set once Algorithm 2 has decided for it (moved or told to stay).
    migrated: bool = False
    t_migrated: float | None = None
    migrations: int = 0
    rebalances: int = 0
    requests: Resources = field(default_factory=Resources)
    # Opaque placement constraints (e.g. Kubernetes node selector labels) that a
    # worker's ``labels`` must contain for the container to run there.
    selector: tuple[tuple[str, str], ...] = ()
    # Tolerations, in the notation of ``specon.policy.placement.tolerates``
    # (``key``, ``key=value``, ``*``, each optionally ``:Effect``).
    tolerations: tuple[str, ...] = ()
    # False for a job that opted out of moves (``specon.io/migratable: "false"``): it is
    # classified and scored, but Algorithm 2 answers it "stay" and Algorithm 3 skips it.
    movable: bool = True
    # CPU-seconds on one core the job still needs (None: unknown), for work-aware moves.
    remaining_work: float | None = None
    # Since when it runs on ``worker`` (manager clock; None: unknown): the minimum
    # residence time after a move counts from here.
    since: float | None = None
    # GPU memory in bytes it needs on each of its ``requests.gpu`` devices (0: any): a worker
    # whose ``GPU_MEMORY_LABEL`` is smaller cannot take it. The product is a selector pair.
    gpu_memory: int = 0


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """What the manager knows about one worker at decision time."""

    id: WorkerId
    capacity: Resources = field(default_factory=Resources)
    # R(w, t): resource consumption, by default CPU utilisation in [0, 1] from the
    # latest heartbeat.
    usage: float = 0.0
    ready: bool = True
    # Heartbeat age in seconds at decision time (manager clock).
    heartbeat_age: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()
    # Taints the worker carries (``key[=value][:Effect]``); a container goes there only if
    # it tolerates every one (``specon.policy.placement.fits``).
    taints: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """The manager's view at one instant: workers, containers and the current time."""

    now: float
    workers: tuple[WorkerSnapshot, ...]
    containers: tuple[ContainerSnapshot, ...]

    def worker(self, wid: WorkerId) -> WorkerSnapshot:
        for w in self.workers:
            if w.id == wid:
                return w
        raise KeyError(wid)

    def on(self, wid: WorkerId) -> tuple[ContainerSnapshot, ...]:
        return tuple(c for c in self.containers if c.worker == wid)
