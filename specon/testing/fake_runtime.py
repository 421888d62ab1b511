"""An in-memory runtime for fast, deterministic tests of the agent and the manager.

A ``FakeVolume`` plays the shared persistent volume (who runs which job, its checkpoints,
its progress records) for any number of ``FakeRuntime`` workers, and a ``FakeClock`` is the
only time they know. A job is a ``JobScript``: it makes ``steps_per_second`` steps of fake
time, logs ``{"step", "loss"}`` records, optionally checkpoints every ``checkpoint_every``
steps, and finishes after ``spec.steps`` steps with ``{"event": "finished"}``. A save
checkpoints the current step at once; failures are injected per worker
(``fail_next_save``, ``fail_next_start``, ``crash``). Given a ``root``, progress records are
also appended to the real ``progress.jsonl`` paths whenever the clock moves, so the real
tailer can read them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specon.model import WEIGHT_MAX, WEIGHT_MIN, ContainerId, Resources, WorkerId
from specon.runtime.base import (
    AlreadyFinished,
    AlreadyRunning,
    ContainerInfo,
    ContainerState,
    JobSpec,
    NoSuchContainer,
    Runtime,
    SaveFailed,
    SaveResult,
    StartFailed,
    StillRunning,
    Supersede,
    WorkerUsage,
)
from specon.runtime.volume import JobPaths

SaveFault = Literal["timeout", "error"]
_SETTLE_ROUNDS = 20  # loop iterations that let woken tasks run before time moves on


class FakeClock:
    """Virtual time. ``sleep`` waits until ``advance`` moves time past its deadline.

    With ``autojump=True`` a ``sleep`` advances the clock itself: handy when a single
    coroutine is under test and nothing else drives time.
    """

    def __init__(self, start: float = 0.0, *, autojump: bool = False) -> None:
        self._now = start
        self.autojump = autojump
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._listeners: list[Callable[[float], None]] = []

    def now(self) -> float:
        return self._now

    def on_advance(self, listener: Callable[[float], None]) -> None:
        self._listeners.append(listener)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        if self.autojump:
            await self.advance(seconds)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking sleepers in deadline order and letting them run."""
        if seconds < 0 or not math.isfinite(seconds):
            raise ValueError(f"cannot advance a clock by {seconds}")
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._sleepers)
            self._set(max(self._now, deadline))
            if not fut.done():
                fut.set_result(None)
            await _settle()
        self._set(target)
        await _settle()

    def _set(self, now: float) -> None:
        self._now = now
        for listener in self._listeners:
            listener(now)


async def _settle() -> None:
    for _ in range(_SETTLE_ROUNDS):
        await asyncio.sleep(0)


def default_loss(step: int) -> float:
    """A plain converging curve."""
    return 1.0 / (1.0 + 0.1 * step)


@dataclass(frozen=True, slots=True)
class JobScript:
    """How a fake job behaves."""

    steps_per_second: float = 1.0
    loss: Callable[[int], float] = default_loss
    log_every: int = 1
    # Periodic checkpoints the job writes by itself (the rollback target of a forced save).
    checkpoint_every: int | None = None
    # CPU cores it burns while running.
    cpu: float = 1.0


@dataclass
class _Job:
    spec: JobSpec
    script: JobScript
    owner: WorkerId | None = None
    state: ContainerState = ContainerState.EXITED
    run_started_at: float = 0.0
    run_start_step: int = 0
    step: int = 0
    checkpoints: list[int] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    written: int = 0  # records already appended to the progress file
    exit_code: int | None = None
    finished: bool = False
    cpu_seconds: float = 0.0
    accounted_until: float = 0.0
    # Frozen (``FakeRuntime.freeze``): it makes no progress and burns no CPU until thawed.
    frozen: bool = False

    @property
    def running(self) -> bool:
        return self.owner is not None and self.state is ContainerState.RUNNING


class FakeVolume:
    """The shared state of every fake worker: jobs, owners, checkpoints, progress."""

    def __init__(self, clock: FakeClock | None = None, *, root: Path | None = None) -> None:
        self.clock = clock or FakeClock()
        self.root = root
        self.jobs: dict[ContainerId, _Job] = {}
        self.scripts: dict[ContainerId, JobScript] = {}
        self.worker_cpu: dict[WorkerId, float] = {}
        self.clock.on_advance(self.materialise)

    def paths(self, job: ContainerId) -> JobPaths:
        return JobPaths(self.root or Path("/fake-volume"), job)

    def submit(self, spec: JobSpec) -> None:
        """Record ``spec`` as submitted, not yet running (what a start then runs)."""
        if spec.id not in self.jobs:
            self.jobs[spec.id] = _Job(spec, self.scripts.get(spec.id, JobScript()))

    def script(self, job: str, script: JobScript) -> None:
        """Set how ``job`` behaves from its next start on."""
        self.scripts[ContainerId(job)] = script

    def records(self, job: str) -> list[dict[str, Any]]:
        self.materialise(self.clock.now())
        return list(self.jobs[ContainerId(job)].records)

    def checkpoints(self, job: str) -> list[int]:
        return list(self.jobs[ContainerId(job)].checkpoints)

    def corrupt_latest_checkpoint(self, job: str) -> None:
        """The newest checkpoint stops verifying (it is dropped; the previous one remains)."""
        self.jobs[ContainerId(job)].checkpoints.pop()

    def materialise(self, now: float) -> None:
        """Bring every running job up to ``now``: steps, records, checkpoints, CPU, finish."""
        for job in self.jobs.values():
            if job.running and not job.frozen:
                self._advance(job, now)
        if self.root is not None:
            for job in self.jobs.values():
                self._flush(job)

    def _advance(self, job: _Job, now: float) -> None:
        total = job.spec.steps
        target = job.run_start_step + math.floor(
            (now - job.run_started_at) * job.script.steps_per_second + 1e-9
        )
        if total is not None:
            target = min(target, total)
        for step in range(job.step + 1, target + 1):
            if step % job.script.log_every == 0 or step == total:
                job.records.append({"step": step, "loss": job.script.loss(step), "time": self._at(job, step)})
            if job.script.checkpoint_every and step % job.script.checkpoint_every == 0:
                job.checkpoints.append(step)
        job.step = max(job.step, target)
        end = now
        if total is not None and job.step >= total:
            end = min(now, self._at(job, total))
            job.records.append({"event": "finished", "step": total, "time": end})
            job.state, job.exit_code, job.finished = ContainerState.EXITED, 0, True
        self._account(job, end)

    def _at(self, job: _Job, step: int) -> float:
        return job.run_started_at + (step - job.run_start_step) / job.script.steps_per_second

    def _account(self, job: _Job, until: float) -> None:
        if job.owner is not None and until > job.accounted_until:
            used = (until - job.accounted_until) * job.script.cpu
            job.cpu_seconds += used
            self.worker_cpu[job.owner] = self.worker_cpu.get(job.owner, 0.0) + used
            job.accounted_until = until

    def _flush(self, job: _Job) -> None:
        if job.written == len(job.records):
            return
        paths = self.paths(job.spec.id)
        paths.dir.mkdir(parents=True, exist_ok=True)
        with open(paths.progress, "a") as fh:
            for record in job.records[job.written :]:
                fh.write(json.dumps(record) + "\n")
        job.written = len(job.records)


class FakeRuntime:
    """One fake worker over a shared ``FakeVolume``."""

    def __init__(
        self,
        worker: str,
        volume: FakeVolume,
        *,
        capacity: Resources | None = None,
        save_seconds: float = 0.0,
        start_seconds: float = 0.0,
        labels: Mapping[str, str] | None = None,
        taints: tuple[str, ...] = (),
    ) -> None:
        self._worker = WorkerId(worker)
        # Placement facts of this worker, as a Kubernetes node would have them.
        self.labels = dict(labels or {})
        self.taints = taints
        self.volume = volume
        self.clock = volume.clock
        self.capacity = capacity or Resources(cpu=1.0)
        self.save_seconds = save_seconds
        self.start_seconds = start_seconds
        self.calls: list[tuple[str, ContainerId]] = []
        # CPU weights set on this worker's containers, the latest per container; turn
        # ``weights_supported`` off to play a backend that cannot apply them.
        self.weights: dict[ContainerId, int] = {}
        self.weights_supported = True
        # Freezing (``freeze``/``thaw``); host PIDs per container, as NVML would see them.
        self.freezing_supported = True
        self.host_pids: dict[ContainerId, frozenset[int]] = {}
        self._save_faults: list[SaveFault] = []
        self._start_faults: list[str] = []
        self._start_deaths: list[int] = []
        self._last_usage = (self.clock.now(), volume.worker_cpu.get(self._worker, 0.0))

    # -- fault injection ---------------------------------------------------------------------
    def fail_next_save(self, mode: SaveFault = "timeout") -> None:
        """``timeout``: the job ignores SIGTERM and is killed at the grace period (forced
        rollback); ``error``: no checkpoint can be had and the job is left running."""
        self._save_faults.append(mode)

    def fail_next_start(self, message: str = "injected start failure") -> None:
        self._start_faults.append(message)

    def die_at_next_start(self, exit_code: int = 1) -> None:
        """The next start launches a copy that exits with ``exit_code`` before it logs
        anything (a crash on restore, an OOM kill, a kubelet's refusal)."""
        self._start_deaths.append(exit_code)

    def crash(self, container_id: str, *, exit_code: int = 1) -> None:
        job = self._mine(ContainerId(container_id))
        self.volume.materialise(self.clock.now())
        job.state, job.exit_code = ContainerState.FAILED, exit_code

    # -- the Runtime interface -----------------------------------------------------------
    @property
    def worker(self) -> WorkerId:
        return self._worker

    def now(self) -> float:
        return self.clock.now()

    async def sleep(self, seconds: float) -> None:
        await self.clock.sleep(seconds)

    async def list_containers(self) -> list[ContainerInfo]:
        self.volume.materialise(self.clock.now())
        return [self._info(j) for j in self.volume.jobs.values() if j.owner == self._worker]

    async def usage(self) -> WorkerUsage:
        now = self.clock.now()
        self.volume.materialise(now)
        mine = [j for j in self.volume.jobs.values() if j.owner == self._worker]
        total = self.volume.worker_cpu.get(self._worker, 0.0)
        last_t, last_cpu = self._last_usage
        self._last_usage = (now, total)
        if now > last_t:
            used = (total - last_cpu) / (now - last_t)
        else:  # no time passed: the instantaneous demand
            used = sum(j.script.cpu for j in mine if j.running)
        return WorkerUsage(
            worker=self._worker,
            capacity=self.capacity,
            cpu_utilisation=min(1.0, max(0.0, used / self.capacity.cpu)) if self.capacity.cpu > 0 else 0.0,
            cpu_seconds=total,
            per_container=tuple(sorted((j.spec.id, j.cpu_seconds) for j in mine if j.running)),
            enforcement="simulated",
        )

    @property
    def node_labels(self) -> dict[str, str]:
        return dict(self.labels)

    @property
    def node_taints(self) -> tuple[str, ...]:
        return self.taints

    async def publish_state(self, container_id: ContainerId, annotations: Mapping[str, str]) -> bool:
        return False  # the agent's state file on the volume is the record here

    def job_spec(self, container_id: ContainerId) -> JobSpec | None:
        job = self.volume.jobs.get(container_id)
        return job.spec if job is not None else None

    async def freeze(self, container_id: ContainerId) -> bool:
        """The job stops where it stands (no steps, no CPU) until ``thaw``; False for a
        container not running here or while ``freezing_supported`` is off."""
        self.calls.append(("freeze", container_id))
        job = self.volume.jobs.get(container_id)
        if not (self.freezing_supported and job is not None and job.owner == self._worker and job.running):
            return False
        self.volume.materialise(self.clock.now())
        job.frozen = job.running  # it may have finished meanwhile
        return job.frozen

    async def thaw(self, container_id: ContainerId) -> bool:
        self.calls.append(("thaw", container_id))
        job = self.volume.jobs.get(container_id)
        if job is None or job.owner != self._worker:
            return False
        self._thaw(job)
        return True

    def _thaw(self, job: _Job) -> None:
        if job.frozen:  # it goes on from its step as if started now
            now = self.clock.now()
            job.frozen, job.run_started_at, job.run_start_step, job.accounted_until = (
                False,
                now,
                job.step,
                now,
            )

    async def pids(self) -> dict[ContainerId, frozenset[int]]:
        """``host_pids`` of the containers running here (set by tests)."""
        running = {j.spec.id for j in self.volume.jobs.values() if j.owner == self._worker and j.running}
        return {cid: pids for cid, pids in self.host_pids.items() if cid in running}

    async def set_cpu_weight(self, container_id: ContainerId, weight: int) -> bool:
        """Records the weight (``weights``); False for a container not running here, a weight
        out of 1..10,000, or while ``weights_supported`` is off."""
        job = self.volume.jobs.get(container_id)
        here = job is not None and job.owner == self._worker and job.running
        if not (self.weights_supported and here and WEIGHT_MIN <= weight <= WEIGHT_MAX):
            return False
        self.weights[container_id] = weight
        return True

    async def start(
        self, spec: JobSpec, *, checkpoint: Path | None = None, supersede: Supersede = False
    ) -> ContainerInfo:
        self.calls.append(("start", spec.id))  # ``supersede``: one fake volume sees every run
        self.volume.materialise(self.clock.now())
        if self._start_faults:
            raise StartFailed(spec.id, self._start_faults.pop(0))
        job = self.volume.jobs.get(spec.id)
        if job is not None and job.running:
            raise AlreadyRunning(spec.id, f"already running on worker {job.owner}")
        if job is not None and job.finished:
            raise AlreadyFinished(spec.id, "already finished")
        if job is None:
            job = self.volume.jobs[spec.id] = _Job(spec, self.volume.scripts.get(spec.id, JobScript()))
        if checkpoint is not None and checkpoint not in {self._ckpt_path(job, s) for s in job.checkpoints}:
            raise StartFailed(spec.id, f"checkpoint does not verify: {checkpoint}")
        if self.start_seconds > 0:
            await self.clock.sleep(self.start_seconds)
        now = self.clock.now()
        job.spec, job.script = spec, self.volume.scripts.get(spec.id, job.script)
        job.owner, job.state, job.exit_code, job.frozen = self._worker, ContainerState.RUNNING, None, False
        job.step = job.run_start_step = job.checkpoints[-1] if job.checkpoints else 0
        job.run_started_at = job.accounted_until = now
        if self._start_deaths:
            info = self._info(job)  # what the start returns: the copy was launched
            job.state, job.exit_code = ContainerState.FAILED, self._start_deaths.pop(0)
            return info
        job.records.append({"event": "resumed", "step": job.step, "worker": self._worker, "time": now})
        return self._info(job)

    async def save(self, container_id: ContainerId, *, grace: float) -> SaveResult:
        self.calls.append(("save", container_id))
        job = self._mine(container_id)
        self.volume.materialise(self.clock.now())
        self._thaw(job)  # a frozen job sees no SIGTERM: every backend thaws before it saves
        fault = self._save_faults.pop(0) if self._save_faults and job.running else None
        if fault == "error":
            raise SaveFailed(container_id, "injected: no checkpoint could be made; left running")
        forced = fault == "timeout"
        before = job.checkpoints[-1] if job.checkpoints else None
        seconds = grace if forced else self.save_seconds
        if seconds > 0:  # the job runs on (and may checkpoint or finish) meanwhile
            await self.clock.sleep(seconds)
            self.volume.materialise(self.clock.now())
        if job.running and not forced:
            job.checkpoints.append(job.step)
        step = job.checkpoints[-1] if job.checkpoints else None
        job.owner = None
        if job.state is ContainerState.RUNNING:
            job.state, job.exit_code = (ContainerState.FAILED, None) if forced else (ContainerState.EXITED, 0)
        return SaveResult(
            container=container_id,
            worker=self._worker,
            step=step,
            checkpoint=None if step is None else self._ckpt_path(job, step),
            seconds=seconds,
            forced=forced,
            rolled_back=step is None or step == before,
            finished=job.finished,
        )

    async def stop(self, container_id: ContainerId, *, grace: float) -> ContainerInfo:
        self.calls.append(("stop", container_id))
        job = self._mine(container_id)
        self.volume.materialise(self.clock.now())
        self._thaw(job)
        if job.running:
            job.checkpoints.append(job.step)  # the job contract: checkpoint on SIGTERM
            job.state, job.exit_code = ContainerState.EXITED, 0
        return self._info(job)

    async def forget(self, container_id: ContainerId) -> None:
        self.calls.append(("forget", container_id))
        job = self._mine(container_id)
        self.volume.materialise(self.clock.now())
        if job.running:
            raise StillRunning(container_id, "cannot forget a running container")
        job.owner = None

    # -- internals ---------------------------------------------------------------------------
    def _mine(self, container_id: ContainerId) -> _Job:
        job = self.volume.jobs.get(container_id)
        if job is None or job.owner != self._worker:
            raise NoSuchContainer(container_id, f"not on worker {self._worker}")
        return job

    def _ckpt_path(self, job: _Job, step: int) -> Path:
        return self.volume.paths(job.spec.id).checkpoints / f"ckpt-{step:012d}.json"

    def _info(self, job: _Job) -> ContainerInfo:
        paths = self.volume.paths(job.spec.id)
        return ContainerInfo(
            id=job.spec.id,
            worker=self._worker,
            spec=job.spec,
            state=job.state,
            progress_path=paths.progress,
            checkpoint_dir=paths.checkpoints,
            started_at=job.run_started_at,
            handle=f"fake:{job.spec.id}",
            exit_code=job.exit_code,
            finished=job.finished,
        )


def _implements_runtime(rt: FakeRuntime) -> Runtime:
    return rt  # mypy proves FakeRuntime satisfies the Runtime protocol
