"""The Docker backend: a worker is one Docker engine, a job one labelled container.

Containers are the engine's containers labelled ``specon.io/managed=true``; a job's id is its
``specon.io/job`` label (else the container's name). Everything durable lives on the shared
volume, as with the local backend (``specon.runtime.volume``): the progress log and
checkpoints in the job's directory, and ``owner.json`` naming the worker, the engine and the
container of the current run, so a restarted agent re-adopts its containers by listing them
and no job is started while any engine runs it. That record's code (write-ahead, host checks,
stop, forget) is ``specon.runtime.owners``, shared with the local backend; here are its hooks
for containers. The package's docstring lists its modules; only it imports ``docker``.

- **save** (job contract, ``migration.mode: checkpoint``): SIGTERM, wait the grace period for
  the job to checkpoint to the volume and exit, SIGKILL past it, judge the checkpoint (the
  shared ``saving.run_save``), then remove the container: its recipe is on record.
- **save** (``criu``): the engine checkpoints the whole process tree (CRIU) into the volume's
  agent area and stops the container; the next start of the job, on any engine, restores it
  there. Refused with a reason (then the job contract is used) for GPU jobs, engines without
  CRIU, or a recipe the image cannot carry (``docker_criu``).
- **start**: create a container from the recorded recipe (``docker_recipe``), checked
  against this host's rules, with the job's own directory as its only writable mount and the
  job contract's environment; a write-ahead owner record names the run before it exists.
- **R(w, t)**: the engine's per-container CPU counters (``stats``, one shot). **priority**:
  ``cpu_shares`` (``docker update``); on a GPU, ``docker pause`` and host PIDs (``freezer``).
- **GPUs**: device requests run where this host's rules allow (``recipe``); the spec carries
  their count, memory and product for placement (``gpu``).
- **standbys** (``standby``, ``standby_pool``): a primed container per GPU and image this host
  names; a start that may use one is handed to it (renamed to the job), not created anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import ParamSpec, TypeVar

import docker
import docker.errors
import structlog
from docker.models.containers import Container

from specon import checkpoint as ckpt
from specon.config import MigrationMode
from specon.model import GPU_PRODUCT_LABEL, RUNTIME_LABEL, ContainerId, Resources, WorkerId
from specon.runtime.base import (
    AlreadyFinished,
    AlreadyRunning,
    ContainerInfo,
    ContainerState,
    JobSpec,
    NoSuchContainer,
    Runtime,
    RuntimeFailure,
    SaveFailed,
    SaveResult,
    StartFailed,
    Supersede,
    WorkerUsage,
    cpu_shares,
    valid_job_id,
)
from specon.runtime.docker.cgroup import ContainerCounters, CpuTotals
from specon.runtime.docker.criu_store import CriuStore
from specon.runtime.docker.engine import (
    connect,
    container_info,
    container_job,
    cpu_seconds,
    create_kwargs,
    engine_id,
    engine_labels,
    import_image,
    init_pid,
    live,
    started_at,
)
from specon.runtime.docker.freezer import LIVE, RUNNING, Freezer
from specon.runtime.docker.gpu import with_gpu_needs
from specon.runtime.docker.recipe import (
    LABEL_MIGRATION,
    LABEL_RUN,
    MANAGED,
    HostRules,
    Recipe,
    from_inspect,
    problems,
    unsafe_host_config,
)
from specon.runtime.docker.stale import Owners, stop_superseded
from specon.runtime.docker.standby import LABEL_STANDBY, StandbyConfig, idle_standby
from specon.runtime.docker.standby_pool import StandbyContainers
from specon.runtime.owners import OwnerRecords
from specon.runtime.saving import run_save
from specon.runtime.volume import CorruptRecordError, JobPaths, Owner, read_spec, write_spec

# connect, import_image: engine helpers (``engine``) the agent, embedded hosts and tests import here.
__all__ = ["DockerRuntime", "connect", "import_image"]

log = structlog.get_logger()

P = ParamSpec("P")
R = TypeVar("R")

_POLL_S = 0.1
_KILL_WAIT_S = 10.0


class DockerRuntime(OwnerRecords[Container]):
    """One Docker engine as one worker: a run is a container, which the shared owner-record
    code (``OwnerRecords``) acts on once the record names this engine."""

    _EVENTS = "specon.docker"
    _HOST_NOUN = "engine"
    # Teardown goes on past a container that resists or an engine error.
    _STOP_ALL_SKIPS = (RuntimeFailure, docker.errors.APIError)

    def __init__(
        self,
        root: Path,
        worker: WorkerId,
        client: docker.DockerClient,
        *,
        rules: HostRules | None = None,
        migration_mode: MigrationMode = "checkpoint",
        cpus: float | None = None,
        gpu_product: str | None = None,
        standby: StandbyConfig | None = None,
    ) -> None:
        """``gpu_product``: this host's GPU product (NVML's name, or its label value) that a GPU
        job first started here keeps to (default: the engine's ``nvidia.com/gpu.product`` label);
        ``standby``: the standby containers to keep (``standby``; ``ValueError`` if refused here)."""
        try:
            valid_job_id(worker)
        except ValueError as exc:
            raise ValueError(f"invalid worker name: {exc}") from exc
        self.root = root
        self._owners = Owners(root)  # each job's owner.json, read when it changed
        self._worker = worker
        self.client = client
        self.rules = rules or HostRules(volume=str(root))
        self.migration_mode = migration_mode
        info = client.info()
        self._host = engine_id(info)
        self._labels = engine_labels(info.get("Labels") or [])
        cores = float(cpus or info.get("NCPU") or 1)
        # GPUs: what this host's rules let a job request (a host that allows none offers none).
        memory = int(info.get("MemTotal") or 0)
        self.capacity = Resources(cpu=cores, memory=memory, gpu=self.rules.gpus)
        self.gpu_product = gpu_product or self._labels.get(GPU_PRODUCT_LABEL) or None
        data_root = Path(str(info.get("DockerRootDir") or "/var/lib/docker"))
        self._criu = CriuStore(self._agent_dir / "criu", client.api, info, data_root)
        self._busy: dict[ContainerId, ContainerState] = {}
        self._freezer = Freezer(client, self._busy)
        self._counters = ContainerCounters()
        self._cpu = CpuTotals()
        self.skipped_records = 0
        (root / "jobs").mkdir(parents=True, exist_ok=True)
        self._agent_dir.mkdir(parents=True, exist_ok=True)
        adopted = self._adopt()
        self.standbys: StandbyContainers | None = None
        if standby is not None and standby.images and standby.gpus:
            where = standby.socket_dir or self._agent_dir / "standby" / worker
            self.standbys = StandbyContainers(
                client, worker, standby, self.rules, socket_dir=where, migration_mode=migration_mode
            )
        log.info(
            "specon.docker.ready",
            worker=worker,
            engine=self._host,
            cpus=self.capacity.cpu,
            adopted=adopted,
            migration_mode=migration_mode,
            gpus=self.rules.gpus,
            criu="possible" if info.get("ExperimentalBuild") is True else "off (engine not --experimental)",
        )

    # -- the Runtime interface -------------------------------------------------------------
    @property
    def worker(self) -> WorkerId:
        return self._worker

    @property
    def enforcement(self) -> str:
        return "docker"

    @property
    def node_labels(self) -> dict[str, str]:
        return {RUNTIME_LABEL: "docker", **self._labels}

    @property
    def node_taints(self) -> tuple[str, ...]:
        return ()

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def publish_state(self, container_id: ContainerId, annotations: Mapping[str, str]) -> bool:
        return False  # container labels are immutable; the agent's state file is the record

    def job_spec(self, container_id: ContainerId) -> JobSpec | None:
        """The spec the agents recorded (outside the job's own, job-writable directory)."""
        try:
            return read_spec(self._spec_path(valid_job_id(container_id)))
        except (CorruptRecordError, ValueError) as exc:
            log.warning("specon.docker.spec_unreadable", container=container_id, error=str(exc))
            return None

    async def list_containers(self) -> list[ContainerInfo]:
        return await asyncio.to_thread(self._list)

    def _list(self) -> list[ContainerInfo]:
        managed = stop_superseded(self._managed(), self._owners)  # a lost host's copy, come back
        return [i for i in (self._info(job, c) for job, c in managed.items()) if i is not None]

    async def usage(self) -> WorkerUsage:
        """CPU use since the previous call from the engine's per-container counters."""
        running = await asyncio.to_thread(live, self.client, RUNNING)
        from_cgroups = await asyncio.to_thread(self._cgroup_seconds, running)
        # Only where the cgroup cannot be read: the engine's stats, a second per call.
        others = [job for job in running if job not in from_cgroups]
        sampled = await asyncio.gather(*(asyncio.to_thread(cpu_seconds, running[j]) for j in others))
        per_job = {**from_cgroups, **{j: s for j, s in zip(others, sampled, strict=True) if s is not None}}
        used, elapsed = self._cpu.add({str(running[j].id): s for j, s in per_job.items()}, time.monotonic())
        share = used / (elapsed * self.capacity.cpu) if elapsed > 0 else 0.0
        return WorkerUsage(
            worker=self._worker,
            capacity=self.capacity,
            cpu_utilisation=min(1.0, max(0.0, share)),
            cpu_seconds=self._cpu.cumulative,
            per_container=tuple(sorted(per_job.items())),
            enforcement="docker",
        )

    async def freeze(self, container_id: ContainerId) -> bool:
        """``docker pause``: the cgroup freezer stops every process of the container."""
        return await self._freezer.set(container_id, frozen=True)

    async def thaw(self, container_id: ContainerId) -> bool:
        return await self._freezer.set(container_id, frozen=False)

    async def pids(self) -> dict[ContainerId, frozenset[int]]:
        return await self._freezer.pids()

    async def set_cpu_weight(self, container_id: ContainerId, weight: int) -> bool:
        c = (await asyncio.to_thread(live, self.client, RUNNING)).get(container_id)
        if c is None:
            log.info("specon.docker.weight_skipped", container=container_id, reason="not running here")
            return False
        try:
            await asyncio.to_thread(c.update, cpu_shares=cpu_shares(weight))
        except docker.errors.APIError as exc:
            log.warning("specon.docker.weight_failed", container=container_id, error=str(exc))
            return False
        return True

    async def start(
        self, spec: JobSpec, *, checkpoint: Path | None = None, supersede: Supersede = False
    ) -> ContainerInfo:
        paths = JobPaths(self.root, spec.id)
        if checkpoint is not None:
            manifest = checkpoint.with_suffix(".json")
            if manifest.parent.resolve() != paths.checkpoints.resolve():
                raise StartFailed(spec.id, f"{checkpoint} is not in the job's checkpoint directory")
            try:
                await asyncio.to_thread(ckpt.verify, manifest)
            except ckpt.CheckpointError as exc:
                raise StartFailed(spec.id, f"checkpoint does not verify: {exc}") from exc
        recipe = self._recipe_of(spec)
        why = problems(recipe, self.rules)
        if why:
            raise StartFailed(spec.id, "this host refuses its recorded container config: " + "; ".join(why))
        try:
            spec = with_gpu_needs(spec, recipe, product=self.gpu_product)
        except ValueError as exc:
            raise StartFailed(spec.id, str(exc)) from exc
        try:
            paths.create()
        except OSError as exc:
            raise StartFailed(spec.id, f"cannot create the job's directories: {exc}") from exc
        async with self._locked(paths):
            await self._offload(self._refuse_running, paths, supersede=supersede)
            here = (await asyncio.to_thread(self._managed)).get(spec.id)
            if here is not None and here.status in ("running", "restarting", "paused", "created"):
                raise AlreadyRunning(spec.id, f"container {here.short_id} of this job exists on this engine")
            if paths.finished():
                raise AlreadyFinished(spec.id, "already finished (done marker or final progress record)")
            try:
                self._write_spec(spec)
            except OSError as exc:
                raise StartFailed(spec.id, f"cannot record the job spec: {exc}") from exc
            if here is not None:  # an ended run of it here: its name is needed again
                with contextlib.suppress(docker.errors.NotFound):
                    await asyncio.to_thread(here.remove, force=True)
            owner, restored = await self._launch(spec, recipe, paths)
        log.info(
            "specon.docker.started",
            worker=self._worker,
            container=spec.id,
            handle=owner.handle,
            restored=restored,
        )
        c = (await asyncio.to_thread(self._managed)).get(spec.id)
        info = None if c is None else await asyncio.to_thread(self._info, spec.id, c)
        if info is None:
            raise StartFailed(spec.id, "started but the container vanished at once")
        return info

    async def save(self, container_id: ContainerId, *, grace: float) -> SaveResult:
        paths, owner, c = await self._require(container_id)
        self._savable(container_id)
        if c.status == "paused":  # frozen: neither SIGTERM nor CRIU would reach it
            await self._unpause(c)
        criu_why = await asyncio.to_thread(self._criu.refusal, c, self.migration_mode_of(c))
        use_criu = criu_why is None

        async def halt(_t0: float) -> bool:
            if use_criu:
                try:
                    await asyncio.to_thread(self._criu.dump, container_id, owner.run_id, c)
                    return False
                except RuntimeFailure as exc:
                    log.warning("specon.docker.criu_fallback", container=container_id, error=str(exc))
            return await self._terminate(paths, c, grace, saving=True)

        async def release() -> None:
            async with self._locked(paths):
                await self._offload(self._clear_owner, paths, owner)
            await self._discard(c)

        if self.migration_mode_of(c) == "criu" and criu_why is not None:
            log.info("specon.docker.criu_refused", container=container_id, reason=criu_why)
        return await run_save(
            container_id,
            self._worker,
            grace=grace,
            checkpoints=paths.checkpoints,
            busy=self._busy,
            halt=halt,
            finished=paths.finished,
            release=release,
            events="specon.docker",
            context={"worker": self._worker, "mode": "criu" if use_criu else "checkpoint"},
            corrupt="it exited without a verifiable checkpoint and every earlier one is corrupt",
        )

    def _savable(self, job: ContainerId) -> None:
        """``SaveFailed`` (it keeps running) where this host would refuse to re-create it: saved,
        it could come back nowhere that shares these rules (its recipe)."""
        spec = self.job_spec(job)
        if spec is None or not spec.template:
            return  # nothing to judge (a target refuses it with its reason)
        try:
            why = problems(self._recipe_of(spec), self.rules)
        except StartFailed as exc:
            why = [str(exc)]
        if why:
            refused = "; ".join(why)
            raise SaveFailed(job, f"not saved, it keeps running: this host refuses its recipe: {refused}")

    async def _unpause(self, c: Container) -> None:
        with contextlib.suppress(docker.errors.APIError):  # not paused (any more), or gone
            await asyncio.to_thread(self.client.api.unpause, c.id)
            log.info("specon.docker.thawed", container=container_job(c), reason="saving or stopping")
        with contextlib.suppress(docker.errors.NotFound):
            await asyncio.to_thread(c.reload)

    # -- housekeeping ------------------------------------------------------------------------
    def close(self) -> bool:
        if self.standbys is not None:
            self.standbys.close()
        self.client.close()
        return True

    def migration_mode_of(self, c: Container) -> MigrationMode:
        """``migration.mode``, unless the job's label overrides it."""
        label = (c.labels or {}).get(LABEL_MIGRATION)
        if label == "criu":
            return "criu"
        return "checkpoint" if label == "checkpoint" else self.migration_mode

    # -- records on the volume ---------------------------------------------------------------
    @property
    def _agent_dir(self) -> Path:
        """Agents' own area of the volume: never mounted into a job's container."""
        return self.root / "docker"

    def _spec_path(self, job: ContainerId) -> Path:
        return self._agent_dir / "specs" / f"{job}.json"

    def _write_spec(self, spec: JobSpec) -> None:
        path = self._spec_path(spec.id)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_spec(path, spec)

    def _recipe_of(self, spec: JobSpec) -> Recipe:
        if not spec.template:
            raise StartFailed(spec.id, "no container recipe on record (spec.template is empty)")
        try:
            recipe = Recipe.from_json(spec.template)
        except ValueError as exc:
            raise StartFailed(spec.id, str(exc)) from exc
        # The spec's command and env win: they are what the job contract records.
        env = {**dict(recipe.env), **dict(spec.env)}
        return replace(recipe, command=spec.command, env=tuple(sorted(env.items())))

    # -- the engine ----------------------------------------------------------------------------
    def _managed(self) -> dict[ContainerId, Container]:
        """This engine's managed containers by job id (the newest of each; one removed meanwhile left out)."""
        found = self.client.containers.list(all=True, filters=MANAGED, ignore_removed=True)
        out: dict[ContainerId, Container] = {}
        for c in found:
            job = container_job(c)
            if job is None:
                if not idle_standby(c.labels or {}, c.name or ""):  # an idle standby is no job
                    self.skipped_records += 1
                    log.warning("specon.docker.container_skipped", container=c.name, reason="no valid job id")
                continue
            if job not in out or c.attrs.get("Created", "") > out[job].attrs.get("Created", ""):
                out[job] = c
        return out

    def _cgroup_seconds(self, running: Mapping[ContainerId, Container]) -> dict[ContainerId, float]:
        self._counters.keep(str(c.id) for c in running.values())
        out = {}
        for job, c in running.items():
            seconds = self._counters.seconds(str(c.id), functools.partial(init_pid, self.client, c))
            if seconds is not None:
                out[job] = seconds
        return out

    def _adopt(self) -> int:
        """Record the jobs of managed containers a user started, and our own after a restart."""
        adopted = 0
        for job, c in self._managed().items():
            if c.status != "running":
                continue
            paths = JobPaths(self.root, job)
            unsafe = unsafe_host_config(c.attrs)
            if unsafe:
                log.warning("specon.docker.container_refused", container=job, reason=", ".join(unsafe))
                continue
            with contextlib.suppress(CorruptRecordError):
                if self._read_owner(paths) is not None:
                    adopted += 1
                    continue
            if LABEL_STANDBY in (c.labels or {}):  # its config is a standby's, no recipe of the job
                log.warning("specon.docker.container_refused", container=job, reason="standby, no owner")
                continue
            recipe = from_inspect(c.attrs, volume=self.rules.volume, all_gpus=self.rules.gpus)
            spec = JobSpec(
                id=job,
                command=recipe.command or ("true",),
                env=recipe.env,
                labels=tuple((k, v) for k, v in recipe.labels if not k.startswith("specon.io/")),
                template=recipe.to_json(),
            )
            try:
                spec = with_gpu_needs(spec, recipe, product=self.gpu_product)
            except ValueError as exc:  # adopted all the same; placement sees no memory need
                self.skipped_records += 1
                log.warning("specon.docker.gpu_label_skipped", container=job, error=str(exc))
                spec = replace(spec, requests=replace(spec.requests, gpu=recipe.gpus))
            paths.create()
            self._write_spec(spec)
            paths.write_owner(
                Owner(
                    worker=self._worker,
                    run_id=(c.labels or {}).get(LABEL_RUN) or uuid.uuid4().hex,
                    started_at=started_at(c.attrs),
                    host=self._host,
                    handle=c.id,
                )
            )
            adopted += 1
            log.info("specon.docker.adopted", worker=self._worker, container=job, handle=c.short_id)
        return adopted

    def _info(self, job: ContainerId, c: Container) -> ContainerInfo | None:
        paths = JobPaths(self.root, job)
        try:
            spec = read_spec(self._spec_path(job))
        except CorruptRecordError as exc:
            self.skipped_records += 1
            log.warning("specon.docker.record_skipped", container=job, error=str(exc))
            return None
        owner = None  # a standby handed the job started before it: the run, when its record says
        with contextlib.suppress(CorruptRecordError):
            owner = paths.read_owner() if LABEL_STANDBY in (c.labels or {}) else None
        started = owner.started_at if owner is not None and owner.handle == c.id else None
        busy = self._busy.get(job)
        return container_info(job, c, worker=self._worker, spec=spec, paths=paths, busy=busy, started=started)

    async def _launch(self, spec: JobSpec, recipe: Recipe, paths: JobPaths) -> tuple[Owner, bool]:
        """Create and start the job's container (restoring a CRIU image of its last run, if on
        record); the owner record written ahead (off the loop: it fsyncs), completed after. A CRIU
        restore continues the run it captured: no new generation (the dump stopped it)."""
        fence = not self._criu.has_image(spec.id)
        provisional = await self._offload(self._write_ahead, spec.id, paths, fence=fence)
        if self.standbys is not None:
            handed = await asyncio.to_thread(self.standbys.launch, recipe, spec.id, paths, provisional)
            if handed is not None:
                return handed, False
        kwargs = create_kwargs(spec, recipe, run_id=provisional.run_id, worker=self._worker,
                               job_dir=paths.dir, generation=provisional.generation)  # fmt: skip
        try:
            c = await asyncio.to_thread(self.client.containers.create, **kwargs)
            restored = await asyncio.to_thread(self._criu.restore, spec.id, c)
            if not restored:
                if c.status != "created":  # a restore that failed half-way: begin afresh
                    await asyncio.to_thread(c.remove, force=True)
                    c = await asyncio.to_thread(self.client.containers.create, **kwargs)
                await asyncio.to_thread(c.start)
        except (docker.errors.APIError, docker.errors.ImageNotFound) as exc:
            with contextlib.suppress(docker.errors.APIError, UnboundLocalError):
                await asyncio.to_thread(c.remove, force=True)
            paths.clear_owner()
            raise StartFailed(spec.id, f"cannot create or start the container: {exc}") from exc
        owner = replace(provisional, handle=c.id)
        with contextlib.suppress(OSError):  # completed from the run label at the next read
            await self._offload(paths.write_owner, owner)
        return owner, restored

    # -- OwnerRecords hooks: a run is a container of this engine --------------------------------
    async def _offload(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(fn, *args, **kwargs)  # the SDK's calls block

    def _find_run(self, owner: Owner) -> Owner | None:
        found = self.client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={owner.run_id}"})
        return replace(owner, handle=found[0].id) if found else None

    def _alive_here(self, owner: Owner) -> bool:
        if owner.handle is None:
            return False  # provisional and no container carries its run: never created
        try:
            c = self.client.containers.get(owner.handle)
        except docker.errors.NotFound:
            return False
        return c.status in ("running", "restarting", "paused", "created")

    async def _run(self, paths: JobPaths, owner: Owner) -> Container:
        c = (await asyncio.to_thread(self._managed)).get(paths.job)
        if c is None:
            raise NoSuchContainer(paths.job, f"no managed container of it on worker {self._worker}")
        return c

    async def _stoppable(self, run: Container) -> bool:
        return run.status in LIVE

    async def _still_running(self, run: Container) -> bool:
        await asyncio.to_thread(run.reload)
        return run.status in ("running", "restarting", "paused")

    async def _discard(self, run: Container) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            await asyncio.to_thread(run.remove, force=True)

    async def _report(self, paths: JobPaths, run: Container) -> ContainerInfo | None:
        return await asyncio.to_thread(self._info, paths.job, run)

    async def _live_jobs(self) -> list[ContainerId]:
        return [job for job, c in (await asyncio.to_thread(self._managed)).items() if c.status in LIVE]

    async def _send_term(self, run: Container) -> None:
        if run.status == "paused":  # frozen, it would get SIGTERM only once thawed
            await self._unpause(run)
        await asyncio.to_thread(run.kill, signal="SIGTERM")

    async def _wait_ended(self, run: Container, timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                await asyncio.to_thread(run.reload)
            except docker.errors.NotFound:
                return True
            if run.status not in ("running", "restarting", "paused"):
                return True
            if run.status == "paused":  # frozen by a race with the busy mark: it must see SIGTERM
                await self._unpause(run)
            if time.monotonic() >= deadline:
                return False
            await self.sleep(_POLL_S)

    async def _kill(self, paths: JobPaths, run: Container) -> None:
        with contextlib.suppress(docker.errors.APIError):
            await asyncio.to_thread(run.kill, signal="SIGKILL")
        if not await self._wait_ended(run, _KILL_WAIT_S):
            raise RuntimeFailure(paths.job, f"container {run.short_id} survived SIGKILL")
        log.warning("specon.docker.killed", worker=self._worker, container=paths.job)


def _implements_runtime(rt: DockerRuntime) -> Runtime:
    return rt  # mypy proves DockerRuntime satisfies the Runtime protocol
