"""The runtime interface every backend implements: list, usage, save, start, stop, and a clock.

A node agent owns one runtime for its worker. The manager decides *what* to save and start;
a runtime only does it, reports what happened, and refuses what would break the job
contract (SPEC §6): a job never runs twice at once and never loses progress beyond its last
complete checkpoint. The clock belongs to the backend (gidgethub's ``now``/``sleep``) so
tests and the simulator control time.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from specon.checkpoint import CheckpointInfo
from specon.checkpoint import key as checkpoint_key
from specon.model import WEIGHT_MAX, WEIGHT_MIN, ContainerId, Resources, WorkerId
from specon.wire import codec
from specon.wire.validate import valid_id

# The job contract's environment (SPEC §6): what every backend sets for a job.
ENV_JOB_ID = "SPECON_JOB_ID"
ENV_WORKER = "SPECON_WORKER"
ENV_PROGRESS_FILE = "SPECON_PROGRESS_FILE"
ENV_CHECKPOINT_DIR = "SPECON_CHECKPOINT_DIR"
ENV_DONE_FILE = "SPECON_DONE_FILE"


# cgroup v1 ``cpu.shares`` bounds (the kernel clamps to them; Docker's ``cpu_shares`` too).
SHARES_MIN = 2
SHARES_MAX = 262_144


def cpu_shares(weight: int) -> int:
    """cgroup v1 ``cpu.shares`` (and Docker ``cpu_shares``) for a cgroup-v2 ``cpu.weight``.

    ``weight * 1024 / 100`` (rounded) clamped to [2, 262144]: the default weight 100 is the
    default 1024 shares and ratios between weights are kept; 1..10,000 maps to 10..102,400,
    inside the kernel's bounds.
    """
    if not WEIGHT_MIN <= weight <= WEIGHT_MAX:
        raise ValueError(f"CPU weight must be within [{WEIGHT_MIN}, {WEIGHT_MAX}], got {weight}")
    return min(SHARES_MAX, max(SHARES_MIN, round(weight * 1024 / 100)))


def valid_job_id(value: str) -> ContainerId:
    """``value`` as a ContainerId; ``ValueError`` unless it is a safe path component."""
    return valid_id(value, what="job id")


# A start's leave to fence a run of the job instead of refusing it: the worker the manager
# has taken for lost (True: of whichever worker the job's last run was, a 1.5 manager's).
Supersede = WorkerId | bool


def supersede_of(supersede: bool, lost: WorkerId | None) -> Supersede:
    """A start command's leave (``Command.supersede``, ``Command.lost``): the worker it names,
    any (a 1.5 manager names none), or none."""
    return (lost or True) if supersede else False


class ContainerState(enum.StrEnum):
    RUNNING = "running"
    # A save (SIGTERM, wait for the checkpoint) or stop is in progress on this worker.
    SAVING = "saving"
    STOPPING = "stopping"
    # Ended with exit status 0 (finished, or stopped cleanly).
    EXITED = "exited"
    # Ended with a non-zero status, by a signal, or vanished without a record.
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What to run for one container, and metadata the daemons report."""

    id: ContainerId
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    requests: Resources = field(default_factory=Resources)
    # Free-form key/value labels (e.g. the progress metric and its direction).
    labels: tuple[tuple[str, str], ...] = ()
    steps: int | None = None
    model: str | None = None
    # Backend-specific recipe for re-creating the container elsewhere, as JSON text (the
    # Kubernetes backend: the pod manifest without status, uid, resourceVersion, nodeName).
    # Text, not a dict, so the spec stays hashable and is carried through unchanged.
    template: str | None = None
    # Placement constraints the manager honours when it chooses a target: node labels the
    # worker must carry (Kubernetes: the pod's nodeSelector) and the taints the job
    # tolerates, in the notation of ``specon.policy.placement.tolerates``.
    selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[str, ...] = ()
    # GPU memory in bytes the job needs on each of its ``requests.gpu`` devices (0: any).
    # Its GPU product, where it needs one, is a selector pair (``model.GPU_PRODUCT_LABEL``).
    gpu_memory: int = 0

    def __post_init__(self) -> None:
        valid_job_id(self.id)
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ValueError(f"job {self.id}: command must be a non-empty tuple of non-empty strings")
        if self.steps is not None and self.steps < 0:
            raise ValueError(f"job {self.id}: steps must be >= 0, got {self.steps}")
        if self.gpu_memory < 0:
            raise ValueError(f"job {self.id}: gpu_memory must be >= 0, got {self.gpu_memory}")

    def to_json(self) -> dict[str, Any]:
        """``spec.json``'s shape, through the one codec (``specon.wire.codec``).

        ``template``, ``selector`` and ``tolerations`` only when set: specs of the other
        backends serialise exactly as before they existed.
        """
        data: dict[str, Any] = codec.to_data(self, JobSpec)
        if data["template"] is None:
            del data["template"]
        for key in ("selector", "tolerations", "gpu_memory"):
            if not data[key]:
                del data[key]
        return data

    @classmethod
    def from_json(cls, raw: Any) -> JobSpec:
        """Parse ``to_json`` output; ``ValueError`` naming every wrong field.

        Keys a newer writer added are ignored (the volume is shared across versions).
        """
        try:
            return codec.from_data(JobSpec, raw, strict=False)
        except codec.SchemaError as e:
            raise ValueError(f"bad job spec: {codec.explain(e)}") from None


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """One container as its worker's runtime sees it now."""

    id: ContainerId
    worker: WorkerId
    spec: JobSpec
    state: ContainerState
    progress_path: Path
    checkpoint_dir: Path
    # Wall-clock seconds (the runtime's ``now``) of the current run's start.
    started_at: float
    pid: int | None = None
    # Backend handle when there is no pid (a Docker container id, a pod name).
    handle: str | None = None
    exit_code: int | None = None
    # The job completed its work (done marker or final "finished" progress record).
    finished: bool = False
    # Cores it may use at most, where the backend knows (a pod's CPU limit); None: unlimited
    # within its worker.
    cpu_limit: float | None = None

    @property
    def alive(self) -> bool:
        return self.state in {ContainerState.RUNNING, ContainerState.SAVING, ContainerState.STOPPING}


@dataclass(frozen=True, slots=True)
class SaveResult:
    """The outcome of ``save``: the checkpoint a restart will resume from.

    ``checkpoint``/``step`` are None only for a job that never checkpointed: it restarts
    from step 0, which loses nothing the job contract promised to keep.
    """

    container: ContainerId
    worker: WorkerId
    step: int | None
    # The checkpoint's manifest (``specon.checkpoint`` ``ckpt-<step>.json``).
    checkpoint: Path | None
    seconds: float
    # The job outlived the grace period and was SIGKILLed.
    forced: bool = False
    # No checkpoint newer than the save request verified: the result is the previous one.
    rolled_back: bool = False
    # The job completed its work meanwhile; there is nothing to restart.
    finished: bool = False

    @classmethod
    def after(
        cls,
        container: ContainerId,
        worker: WorkerId,
        *,
        latest: CheckpointInfo | None,
        before: tuple[int, float] | None,
        seconds: float,
        forced: bool,
        finished: bool,
    ) -> SaveResult:
        """The result of a save whose newest complete checkpoint is now ``latest`` and was
        ``before`` (``checkpoint.key``) when the save began: every backend judges alike."""
        now = checkpoint_key(latest)
        return cls(
            container=container,
            worker=worker,
            step=None if latest is None else latest.step,
            checkpoint=None if latest is None else latest.manifest,
            seconds=seconds,
            forced=forced,
            rolled_back=now is None or (before is not None and now <= before),
            finished=finished,
        )


@dataclass(frozen=True, slots=True)
class WorkerUsage:
    """R(w, t) and its ingredients for one worker."""

    worker: WorkerId
    capacity: Resources
    # CPU used since the previous ``usage()`` call as a share of the worker's CPU budget, in
    # [0, 1] (saturates at 1 where the budget is not enforced).
    cpu_utilisation: float
    # Cumulative CPU seconds used by the worker's containers.
    cpu_seconds: float
    # Cumulative CPU seconds per running container, where the backend can tell.
    per_container: tuple[tuple[ContainerId, float], ...] = ()
    # How the budget is enforced: "cgroup", "affinity", "none", "simulated"...
    enforcement: str = "none"


# The brief's name; an ``...Error`` suffix would read like the builtin RuntimeError.
class RuntimeFailure(Exception):  # noqa: N818
    """Base of every runtime error; ``container`` names the container concerned."""

    def __init__(self, container: str, message: str) -> None:
        super().__init__(f"{container}: {message}")
        self.container = container


class NoSuchContainer(RuntimeFailure):
    """The container is not on this worker."""


class SaveFailed(RuntimeFailure):
    """No verified checkpoint and nothing to roll back to; says whether the job still runs."""


class StartFailed(RuntimeFailure):
    """The container could not be started."""


class AlreadyRunning(StartFailed):
    """The job is running somewhere already: a job never runs twice at once."""


class AlreadyFinished(StartFailed):
    """The job has completed its work (done marker or final progress record): nothing to start."""


class StillRunning(RuntimeFailure):
    """The operation needs a container that has stopped (e.g. ``forget``)."""


@runtime_checkable
class Runtime(Protocol):
    """One worker's containers. All waiting goes through ``sleep`` so tests control time."""

    @property
    def worker(self) -> WorkerId: ...

    async def list_containers(self) -> list[ContainerInfo]:
        """Containers on this worker: running ones and ended ones not yet forgotten."""
        ...

    async def usage(self) -> WorkerUsage: ...

    async def save(self, container_id: ContainerId, *, grace: float) -> SaveResult:
        """Checkpoint and stop a running container; afterwards it runs nowhere.

        Past ``grace`` seconds the container is killed and rolled back to its newest complete
        checkpoint (``forced``). ``SaveFailed`` when there is nothing safe to roll back to.
        """
        ...

    async def start(
        self, spec: JobSpec, *, checkpoint: Path | None = None, supersede: Supersede = False
    ) -> ContainerInfo:
        """Start (or resume, from the newest complete checkpoint) a container here, in a new
        generation of the job (``generation.json``: older runs are stale from then on).

        ``checkpoint``, if given, must still verify. ``AlreadyRunning`` if the job runs
        anywhere; ``StartFailed`` for any other refusal. ``supersede``: the manager has taken
        that worker (True: a protocol-1.5 manager's, the last run's) for lost; a run of it is
        fenced by the new generation instead of refusing the start; any other still refuses.
        """
        ...

    async def stop(self, container_id: ContainerId, *, grace: float) -> ContainerInfo:
        """Terminate a container (SIGTERM, then SIGKILL past ``grace``); it stays listed."""
        ...

    async def forget(self, container_id: ContainerId) -> None:
        """Drop an ended container's record; ``StillRunning`` if it is alive."""
        ...

    def job_spec(self, container_id: ContainerId) -> JobSpec | None:
        """The job as submitted, from this backend's own record (None: unknown): the
        ``spec.json`` on the volume locally, the original pod (or its restore record) on
        Kubernetes. The one source of what a ``start`` runs: never a recipe from the wire.
        May block (an API call): agents call it off the event loop.
        """
        ...

    @property
    def node_labels(self) -> dict[str, str]:
        """Labels of this worker for placement (Kubernetes node labels; empty elsewhere)."""
        ...

    @property
    def node_taints(self) -> tuple[str, ...]:
        """Taints that keep containers off this worker, ``key[=value][:Effect]`` (the notation
        of ``specon.policy.placement.tolerates``; empty where there are none)."""
        ...

    async def publish_state(self, container_id: ContainerId, annotations: Mapping[str, str]) -> bool:
        """Publish a container's monitor state where the platform shows it (pod annotations);
        False where there is no such place. Best effort: the agent's state file rules."""
        ...

    async def set_cpu_weight(self, container_id: ContainerId, weight: int) -> bool:
        """Give a running container CPU weight ``weight`` among this worker's containers, in
        cgroup-v2 ``cpu.weight`` units (1..10,000, 100 by default; cgroup v1 and Docker get
        ``cpu_shares(weight)``). True when it was applied; False (logged by the backend) where
        it cannot be: no writable cgroups, no such container. Never raises for that.
        """
        ...

    async def freeze(self, container_id: ContainerId) -> bool:
        """Suspend every process of a running container where it stands (cgroup freezer, Docker
        pause, else ``SIGSTOP`` to its process group), keeping its memory, GPU memory included.
        True when frozen; False (logged by the backend) where it cannot be. Never raises for that.
        """
        ...

    async def thaw(self, container_id: ContainerId) -> bool:
        """Undo ``freeze``; True when the container runs again (or was not frozen)."""
        ...

    async def pids(self) -> dict[ContainerId, frozenset[int]]:
        """Host PIDs of each running container's processes, as NVML reports them (empty where
        this agent cannot see them, e.g. a pod agent without the host's PID namespace)."""
        ...

    def now(self) -> float:
        """Wall-clock seconds, comparable with timestamps this runtime records."""
        ...

    async def sleep(self, seconds: float) -> None: ...
