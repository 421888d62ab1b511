"""The status API's messages (``GET /v1/status``: workers, jobs, migrations) and the parts a
heartbeat shares with them (a job's phase, its loss window); part of the wire protocol
(``specon.wire.protocol``, which names every message and encodes and decodes them all)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specon.config import Mode
from specon.coordinator.migration import Migration, Reason, State
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire.gpu import GpuDevice, GpuUse
from specon.wire.limits import (
    COUNT,
    MAX_GPU_DEVICES,
    MAX_STEP_RATE,
    MAX_WINDOW_POINTS,
    SHORT_TEXT,
    Items,
    Range,
    limit,
)

# Where a container's process is, as the agent sees it. The migration state machine
# reads "running" and "finished" (``specon.coordinator.migration.next_step``).
Phase = Literal["running", "stopped", "finished", "failed"]


@dataclass(frozen=True, slots=True)
class LossWindow:
    """A job's loss curve for the status page (protocol 1.3): the mean of ``metric`` over each
    categorisation tick since its agent adopted it, resampled to evenly spaced steps from
    ``first_step`` to ``last_step`` (one point when they are equal); and its step rate over its
    latest ticks, which with its declared total steps gives the time it has left."""

    first_step: int = field(metadata=limit(COUNT))
    last_step: int = field(metadata=limit(COUNT))
    loss: tuple[float, ...] = field(default=(), metadata=limit(Items(MAX_WINDOW_POINTS)))
    steps_per_second: float | None = field(default=None, metadata=limit(Range(0, MAX_STEP_RATE)))
    metric: str = field(default="loss", metadata=limit(SHORT_TEXT))


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    id: WorkerId
    address: str
    ready: bool
    reachable: bool  # heartbeat younger than worker_timeout
    heartbeat_age: float | None  # seconds, manager clock; None: never heard from
    capacity: Resources
    usage: float
    containers: tuple[ContainerId, ...] = ()
    labels: dict[str, str] = field(default_factory=dict, hash=False)
    taints: tuple[str, ...] = ()
    # Protocol 1.4: its GPUs as its agent last reported them (empty: none, or no NVML).
    gpus: tuple[GpuDevice, ...] = field(default=(), metadata=limit(Items(MAX_GPU_DEVICES, unique="index")))
    # Being drained (``specon drain``): it takes no new jobs and its jobs move off.
    cordoned: bool = False


@dataclass(frozen=True, slots=True)
class ContainerStatus:
    id: ContainerId
    worker: WorkerId
    category: Category
    phase: Phase = "running"
    # (manager time, category) at every change, oldest first.
    history: tuple[tuple[float, Category], ...] = ()
    last_g: float | None = None
    t_cc: float | None = None  # manager clock
    migrated: bool = False
    stalled: bool = False
    pending_request: bool = False
    step: int | None = None
    migrations: int = 0
    rebalances: int = 0
    job: dict[str, str] = field(default_factory=dict, hash=False)
    # Its CPU weight on its worker, as its agent last reported it (protocol 1.2).
    cpu_weight: int | None = None
    # Protocol 1.3: the last loss window its agents sent (kept across moves); its declared
    # total steps (``job[STEPS_LABEL]``); and the seconds it has left at the window's step rate.
    window: LossWindow | None = None
    total_steps: int | None = None
    eta: float | None = None
    # Protocol 1.4: its GPU use as its agent last reported it while it ran (None: no GPU
    # process seen), or its state under the GPU sharing (frozen, suspended).
    gpu: GpuUse | None = None


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    """A journaled migration (``specon.coordinator.migration.Migration``) as the status API shows it."""

    id: str
    container: ContainerId
    source: WorkerId
    target: WorkerId
    reason: Reason
    state: State
    decided_at: float
    updated_at: float
    checkpoint: str | None = None
    checkpoint_step: int | None = None
    stopped_at: float | None = None
    started_at: float | None = None
    downtime: float | None = None
    error: str | None = None
    attempts: int = 0
    # Steps trained past the checkpoint it moved with (a drain's deadline cut the save short).
    lost_steps: int | None = None

    @classmethod
    def of(cls, m: Migration) -> MigrationStatus:
        return cls(
            id=m.id,
            container=m.container,
            source=m.source,
            target=m.target,
            reason=m.reason,
            state=m.state,
            decided_at=m.decided_at,
            updated_at=m.updated_at,
            checkpoint=m.checkpoint,
            checkpoint_step=m.checkpoint_step,
            stopped_at=m.stopped_at,
            started_at=m.started_at,
            downtime=m.downtime,
            error=m.error,
            attempts=m.attempts,
            lost_steps=m.lost_steps,
        )


@dataclass(frozen=True, slots=True)
class Status:
    """The manager's ``GET /v1/status``: the whole cluster as it sees it."""

    now: float  # manager clock
    mode: Mode
    policy_generation: int
    dry_run: bool = False
    workers: tuple[WorkerStatus, ...] = ()
    containers: tuple[ContainerStatus, ...] = ()
    migrations: tuple[MigrationStatus, ...] = ()
    # Paging (protocol 1.1): the cursor of the next page (``?after=``), None on the last;
    # the totals count every entry, not only this page's.
    next: str | None = None
    total_workers: int = 0
    total_containers: int = 0
    total_migrations: int = 0
