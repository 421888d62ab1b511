"""The Docker backend: a worker is one Docker engine, a job one labelled container.

The only module that imports ``docker`` (an import contract keeps it so). Containers are the
engine's containers labelled ``specon.io/managed=true``; a job's id is its
``specon.io/job`` label (else the container's name). Everything durable lives on the shared
volume, as with the local backend (``specon.runtime.volume``): the progress log and
checkpoints in the job's directory, and ``owner.json`` naming the worker, the engine and the
container of the current run, so a restarted agent re-adopts its containers by listing them
and no job is started while any engine runs it.

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
- **R(w, t)**: the engine's per-container CPU counters (``stats``, one shot).
- **priority**: ``cpu_shares`` of the container (``docker update``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import shutil
import tarfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import structlog
from docker.models.containers import Container

from specon import checkpoint as ckpt
from specon.config import MigrationMode
from specon.model import ContainerId, Resources, WorkerId
from specon.runtime.base import (
    ENV_CHECKPOINT_DIR,
    ENV_DONE_FILE,
    ENV_JOB_ID,
    ENV_PROGRESS_FILE,
    ENV_WORKER,
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
    StillRunning,
    WorkerUsage,
    cpu_shares,
    valid_job_id,
)
from specon.runtime.docker import criu as docker_criu
from specon.runtime.docker.cgroup import ContainerCounters
from specon.runtime.docker.recipe import (
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_MIGRATION,
    LABEL_RUN,
    HostRules,
    Recipe,
    from_inspect,
    problems,
    unsafe_host_config,
)
from specon.runtime.saving import run_save, unrecoverable
from specon.runtime.volume import CorruptRecordError, JobPaths, Owner, job_lock, read_spec, write_spec

log = structlog.get_logger()

_POLL_S = 0.1
_KILL_WAIT_S = 10.0


def job_of(labels: Mapping[str, str], name: str) -> ContainerId | None:
    """The job id of a managed container (label, else name); None if it is not a valid id."""
    with contextlib.suppress(ValueError):
        return valid_job_id(labels.get(LABEL_JOB) or name)
    return None


def container_job(c: Container) -> ContainerId | None:
    return job_of(c.labels or {}, c.name or "")


def _started_at(attrs: Mapping[str, Any]) -> float:
    raw = str((attrs.get("State") or {}).get("StartedAt") or "")
    with contextlib.suppress(ValueError):
        # Docker writes nanoseconds; fromisoformat takes at most microseconds.
        head, _, frac = raw.rstrip("Z").partition(".")
        return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()
    return 0.0


class DockerRuntime:
    """One Docker engine as one worker."""

    def __init__(
        self,
        root: Path,
        worker: WorkerId,
        client: docker.DockerClient,
        *,
        rules: HostRules | None = None,
        migration_mode: MigrationMode = "checkpoint",
        cpus: float | None = None,
    ) -> None:
        try:
            valid_job_id(worker)
        except ValueError as exc:
            raise ValueError(f"invalid worker name: {exc}") from exc
        self.root = root
        self._worker = worker
        self.client = client
        self.rules = rules or HostRules(volume=str(root))
        self.migration_mode = migration_mode
        info = client.info()
        # A container id means something only on the engine that issued it. Engines of one
        # machine may share an ID (it comes from /etc/docker/key.json), never a data root.
        self._engine = f"docker:{info.get('ID') or info.get('Name')}@{info.get('DockerRootDir')}"
        self._data_root = Path(str(info.get("DockerRootDir") or "/var/lib/docker"))
        self._labels = _engine_labels(info.get("Labels") or [])
        cores = float(cpus or info.get("NCPU") or 1)
        self.capacity = Resources(cpu=cores, memory=int(info.get("MemTotal") or 0))
        self._info_raw = info
        self._busy: dict[ContainerId, ContainerState] = {}
        self._cpu_last: dict[str, float] = {}
        self._counters = ContainerCounters()
        self._last: tuple[float, float] | None = None
        self.skipped_records = 0
        (root / "jobs").mkdir(parents=True, exist_ok=True)
        self._agent_dir.mkdir(parents=True, exist_ok=True)
        adopted = self._adopt()
        log.info(
            "specon.docker.ready",
            worker=worker,
            engine=self._engine,
            cpus=self.capacity.cpu,
            adopted=adopted,
            migration_mode=migration_mode,
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
        return dict(self._labels)

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
            return self._read_spec(valid_job_id(container_id))
        except (CorruptRecordError, ValueError) as exc:
            log.warning("specon.docker.spec_unreadable", container=container_id, error=str(exc))
            return None

    async def list_containers(self) -> list[ContainerInfo]:
        return await asyncio.to_thread(self._list)

    def _list(self) -> list[ContainerInfo]:
        infos = (self._info(job, c) for job, c in self._managed().items())
        return [i for i in infos if i is not None]

    async def usage(self) -> WorkerUsage:
        """CPU use since the previous call from the engine's per-container counters."""
        running = await asyncio.to_thread(self._running)
        from_cgroups = await asyncio.to_thread(self._cgroup_seconds, running)
        # Only where the cgroup cannot be read: the engine's stats, a second per call.
        others = [job for job in running if job not in from_cgroups]
        sampled = await asyncio.gather(*(asyncio.to_thread(_cpu_seconds, running[j]) for j in others))
        per_job = {**from_cgroups, **{j: s for j, s in zip(others, sampled, strict=True) if s is not None}}
        # Counters restart with each container: sum increments per container id, never negative.
        ids = {job: running[job].id for job in per_job}
        total_inc = 0.0
        for job, s in per_job.items():
            cid = str(ids[job])
            total_inc += max(0.0, s - self._cpu_last.get(cid, s if self._last is None else 0.0))
            self._cpu_last[cid] = s
        for cid in set(self._cpu_last) - {str(i) for i in ids.values()}:
            del self._cpu_last[cid]
        now = time.monotonic()
        last_t, cumulative = self._last or (now, 0.0)
        cumulative += total_inc
        self._last = (now, cumulative)
        elapsed = now - last_t
        share = total_inc / (elapsed * self.capacity.cpu) if elapsed > 0 else 0.0
        return WorkerUsage(
            worker=self._worker,
            capacity=self.capacity,
            cpu_utilisation=min(1.0, max(0.0, share)),
            cpu_seconds=cumulative,
            per_container=tuple(sorted(per_job.items())),
            enforcement="docker",
        )

    async def set_cpu_weight(self, container_id: ContainerId, weight: int) -> bool:
        c = (await asyncio.to_thread(self._running)).get(container_id)
        if c is None:
            log.info("specon.docker.weight_skipped", container=container_id, reason="not running here")
            return False
        try:
            await asyncio.to_thread(c.update, cpu_shares=cpu_shares(weight))
        except docker.errors.APIError as exc:
            log.warning("specon.docker.weight_failed", container=container_id, error=str(exc))
            return False
        return True

    async def start(self, spec: JobSpec, *, checkpoint: Path | None = None) -> ContainerInfo:
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
            paths.create()
        except OSError as exc:
            raise StartFailed(spec.id, f"cannot create the job's directories: {exc}") from exc
        async with self._locked(paths):
            try:
                owner = await asyncio.to_thread(self._read_owner, paths)
            except CorruptRecordError as exc:
                raise StartFailed(spec.id, f"cannot tell whether it runs elsewhere: {exc}") from exc
            if owner is not None and await asyncio.to_thread(self._alive, owner):
                raise AlreadyRunning(spec.id, f"already running on worker {owner.worker} ({owner.host})")
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
        criu_why = await asyncio.to_thread(self._criu_unusable, c)
        use_criu = criu_why is None

        async def halt(_t0: float) -> bool:
            if use_criu:
                try:
                    await asyncio.to_thread(self._criu_dump, container_id, owner, c)
                    return False
                except RuntimeFailure as exc:
                    log.warning("specon.docker.criu_fallback", container=container_id, error=str(exc))
            await asyncio.to_thread(c.kill, signal="SIGTERM")
            if await self._wait_exited(c, grace):
                return False
            if await unrecoverable(paths.checkpoints):
                log.error("specon.docker.save_failed", container=container_id, left_running=True)
                raise SaveFailed(
                    container_id,
                    f"no checkpoint verified within {grace:g}s and every earlier one is corrupt;"
                    " killing it would lose its progress, so it was left running",
                )
            await self._kill(c)
            return True

        async def release() -> None:
            async with self._locked(paths):
                await asyncio.to_thread(self._clear_owner, paths, owner)
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(c.remove, force=True)

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

    async def stop(self, container_id: ContainerId, *, grace: float) -> ContainerInfo:
        _paths, _owner, c = await self._require(container_id)
        if container_id in self._busy:
            raise RuntimeFailure(container_id, f"a {self._busy[container_id].value} is in progress")
        if c.status == "running":
            self._busy[container_id] = ContainerState.STOPPING
            try:
                await asyncio.to_thread(c.kill, signal="SIGTERM")
                if not await self._wait_exited(c, grace):
                    await self._kill(c)
            finally:
                self._busy.pop(container_id, None)
            log.info("specon.docker.stopped", worker=self._worker, container=container_id)
        info = await asyncio.to_thread(self._info, container_id, c)
        if info is None:
            raise NoSuchContainer(container_id, "its records vanished while stopping")
        return info

    async def forget(self, container_id: ContainerId) -> None:
        paths, owner, c = await self._require(container_id)
        async with self._locked(paths):
            await asyncio.to_thread(c.reload)
            if container_id in self._busy or c.status in ("running", "restarting", "paused"):
                raise StillRunning(container_id, "cannot forget a running container; stop or save it first")
            await asyncio.to_thread(self._clear_owner, paths, owner)
            with contextlib.suppress(docker.errors.NotFound):
                await asyncio.to_thread(c.remove, force=True)
        log.info("specon.docker.forgotten", worker=self._worker, container=container_id)

    # -- housekeeping ------------------------------------------------------------------------
    async def stop_all(self, *, grace: float = 0.0) -> int:
        """Terminate every running managed container of this engine (demo teardown)."""
        stopped = 0
        for job, c in (await asyncio.to_thread(self._managed)).items():
            if job in self._busy or c.status != "running":
                continue
            with contextlib.suppress(RuntimeFailure, docker.errors.APIError):
                await self.stop(job, grace=grace)
                stopped += 1
        return stopped

    def close(self) -> bool:
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

    def _criu_dir(self, job: ContainerId) -> Path:
        return self._agent_dir / "criu" / job

    def _read_spec(self, job: ContainerId) -> JobSpec:
        return read_spec(self._spec_path(job))

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
        """This engine's managed containers by job id (the newest container of each job)."""
        found = self.client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"})
        out: dict[ContainerId, Container] = {}
        for c in found:
            job = container_job(c)
            if job is None:
                self.skipped_records += 1
                log.warning("specon.docker.container_skipped", container=c.name, reason="no valid job id")
                continue
            if job not in out or c.attrs.get("Created", "") > out[job].attrs.get("Created", ""):
                out[job] = c
        return out

    def _running(self) -> dict[ContainerId, Container]:
        """This engine's running managed containers by job id, from one list call: the
        engine's summaries carry labels and state, so no container is inspected (``_managed``
        inspects each, for the details a listing reports). Called every agent tick."""
        found = self.client.containers.list(
            sparse=True, filters={"label": f"{LABEL_MANAGED}=true", "status": "running"}
        )
        out: dict[ContainerId, Container] = {}
        for c in found:
            job = job_of(c.attrs.get("Labels") or {}, (c.attrs.get("Names") or [""])[0].lstrip("/"))
            if job is not None:
                out[job] = c
        return out

    def _cgroup_seconds(self, running: Mapping[ContainerId, Container]) -> dict[ContainerId, float]:
        self._counters.keep(str(c.id) for c in running.values())
        out = {}
        for job, c in running.items():
            seconds = self._counters.seconds(str(c.id), functools.partial(_init_pid, self.client, c))
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
            recipe = from_inspect(c.attrs, volume=self.rules.volume)
            spec = JobSpec(
                id=job,
                command=recipe.command or ("true",),
                env=recipe.env,
                labels=tuple((k, v) for k, v in recipe.labels if not k.startswith("specon.io/")),
                template=recipe.to_json(),
            )
            paths.create()
            self._write_spec(spec)
            paths.write_owner(
                Owner(
                    worker=self._worker,
                    run_id=(c.labels or {}).get(LABEL_RUN) or uuid.uuid4().hex,
                    started_at=_started_at(c.attrs),
                    host=self._engine,
                    handle=c.id,
                )
            )
            adopted += 1
            log.info("specon.docker.adopted", worker=self._worker, container=job, handle=c.short_id)
        return adopted

    def _info(self, job: ContainerId, c: Container) -> ContainerInfo | None:
        paths = JobPaths(self.root, job)
        try:
            spec = self._read_spec(job)
        except CorruptRecordError as exc:
            self.skipped_records += 1
            log.warning("specon.docker.record_skipped", container=job, error=str(exc))
            return None
        state_raw = c.attrs.get("State") or {}
        exit_code: int | None = None
        if job in self._busy:
            state = self._busy[job]
        elif c.status in ("running", "restarting", "paused", "created"):
            state = ContainerState.RUNNING
        else:
            exit_code = int(state_raw.get("ExitCode", -1))
            state = ContainerState.EXITED if exit_code == 0 else ContainerState.FAILED
        nano = (c.attrs.get("HostConfig") or {}).get("NanoCpus") or 0
        return ContainerInfo(
            id=job,
            worker=self._worker,
            spec=spec,
            state=state,
            progress_path=paths.progress,
            checkpoint_dir=paths.checkpoints,
            started_at=_started_at(c.attrs),
            pid=None,
            handle=c.id,
            exit_code=exit_code,
            finished=state in (ContainerState.EXITED, ContainerState.FAILED) and paths.finished(),
            cpu_limit=nano / 1e9 if nano else None,
        )

    async def _require(self, container_id: ContainerId) -> tuple[JobPaths, Owner, Container]:
        try:
            paths = JobPaths.of(self.root, container_id)
        except ValueError as exc:
            raise NoSuchContainer(container_id, str(exc)) from exc
        c = (await asyncio.to_thread(self._managed)).get(paths.job)
        if c is None:
            raise NoSuchContainer(container_id, f"no managed container of it on worker {self._worker}")
        try:
            owner = await asyncio.to_thread(self._read_owner, paths)
        except CorruptRecordError as exc:
            raise NoSuchContainer(container_id, str(exc)) from exc
        if owner is None or owner.worker != self._worker or owner.host != self._engine:
            where = "nowhere" if owner is None else f"on worker {owner.worker}"
            raise NoSuchContainer(container_id, f"its record says it runs {where}, not here")
        return paths, owner, c

    def _read_owner(self, paths: JobPaths) -> Owner | None:
        """``owner.json``; a provisional record of this engine (no container yet) is completed
        from the container labelled with its run, if that exists."""
        owner = paths.read_owner()
        if owner is None or owner.handle is not None or owner.host != self._engine:
            return owner
        found = self.client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={owner.run_id}"})
        if not found:
            return owner
        full = replace(owner, handle=found[0].id)
        with contextlib.suppress(OSError):
            paths.write_owner(full)
        log.warning("specon.docker.owner_completed", worker=self._worker, container=paths.job)
        return full

    def _alive(self, owner: Owner) -> bool:
        if owner.host != self._engine:
            return True  # another engine's container: cannot be verified here (never run twice)
        if owner.handle is None:
            return False  # provisional and no container carries its run: never created
        try:
            c = self.client.containers.get(owner.handle)
        except docker.errors.NotFound:
            return False
        return c.status in ("running", "restarting", "paused", "created")

    def _clear_owner(self, paths: JobPaths, owner: Owner) -> None:
        try:
            current = paths.read_owner()
        except CorruptRecordError:
            current = None
        if current is not None and current.run_id == owner.run_id:
            paths.clear_owner()

    async def _launch(self, spec: JobSpec, recipe: Recipe, paths: JobPaths) -> tuple[Owner, bool]:
        """Create and start the job's container (restoring a CRIU image of its last run, if
        one is on record); the owner record is written ahead and completed after."""
        run_id = uuid.uuid4().hex
        provisional = Owner(worker=self._worker, run_id=run_id, started_at=self.now(), host=self._engine)
        try:
            paths.write_owner(provisional)
        except OSError as exc:
            raise StartFailed(spec.id, f"cannot record the owner: {exc}") from exc
        kwargs = self._create_kwargs(spec, recipe, run_id)
        try:
            c = await asyncio.to_thread(self.client.containers.create, **kwargs)
            restored = await asyncio.to_thread(self._criu_restore, spec.id, c)
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
            paths.write_owner(owner)
        return owner, restored

    def _create_kwargs(self, spec: JobSpec, recipe: Recipe, run_id: str) -> dict[str, Any]:
        inside = PurePosixPath(recipe.volume_target) / "jobs" / spec.id
        env = dict(recipe.env)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(
            {
                ENV_JOB_ID: spec.id,
                ENV_WORKER: self._worker,
                ENV_PROGRESS_FILE: str(inside / "progress.jsonl"),
                ENV_CHECKPOINT_DIR: str(inside / "checkpoints"),
                ENV_DONE_FILE: str(inside / "done"),
            }
        )
        volumes = {b.source: {"bind": b.target, "mode": "ro"} for b in recipe.binds}
        volumes[str(JobPaths(self.root, spec.id).dir)] = {"bind": str(inside), "mode": "rw"}
        labels = {k: v for k, v in recipe.labels if not k.startswith("specon.io/")}
        labels.update({LABEL_MANAGED: "true", LABEL_JOB: spec.id, LABEL_RUN: run_id})
        migration = dict(recipe.labels).get(LABEL_MIGRATION)
        if migration:
            labels[LABEL_MIGRATION] = migration
        kwargs: dict[str, Any] = {
            "image": recipe.image,
            "command": list(recipe.command),
            "name": f"specon-{spec.id}-{run_id[:8]}",
            "environment": env,
            "volumes": volumes,
            "labels": labels,
            "network_mode": recipe.network_mode,
            "working_dir": recipe.working_dir or str(inside),
            "init": recipe.init or None,
            "detach": True,
        }
        for key in ("nano_cpus", "cpu_shares", "mem_limit", "user"):
            value = getattr(recipe, key)
            if value is not None:
                kwargs[key] = value
        return kwargs

    async def _wait_exited(self, c: Container, timeout: float) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                await asyncio.to_thread(c.reload)
            except docker.errors.NotFound:
                return True
            if c.status not in ("running", "restarting", "paused"):
                return True
            if time.monotonic() >= deadline:
                return False
            await self.sleep(_POLL_S)

    async def _kill(self, c: Container) -> None:
        with contextlib.suppress(docker.errors.APIError):
            await asyncio.to_thread(c.kill, signal="SIGKILL")
        if not await self._wait_exited(c, _KILL_WAIT_S):
            raise RuntimeFailure(container_job(c) or str(c.name), f"container {c.short_id} survived SIGKILL")
        log.warning("specon.docker.killed", worker=self._worker, container=container_job(c))

    # -- CRIU ----------------------------------------------------------------------------------
    def _criu_unusable(self, c: Container) -> str | None:
        """Why this save cannot be a CRIU checkpoint (None: it will be)."""
        if self.migration_mode_of(c) != "criu":
            return "migration mode is checkpoint"
        return docker_criu.criu_refusal(c.attrs, self._info_raw)

    def _criu_dump(self, job: ContainerId, owner: Owner, c: Container) -> None:
        """Checkpoint the container's processes into the agents' area of the volume (never
        a job's own directory: a job must not be able to forge the image it is restored from)
        and stop it; the image is named after the run it captures."""
        target = self._criu_dir(job)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        docker_criu.checkpoint(self.client.api, str(c.id), owner.run_id, target)

    def _criu_restore(self, job: ContainerId, c: Container) -> bool:
        """Restore the job's CRIU image into ``c`` if one of its last run is on record; the
        image is used once, whatever happens. False: start normally (the job contract)."""
        store = self._criu_dir(job)
        names = sorted(d.name for d in store.iterdir() if d.is_dir()) if store.is_dir() else []
        if not names:
            return False
        try:
            if self._info_raw.get("ExperimentalBuild") is not True:
                why = "engine not --experimental"
                log.warning("specon.docker.criu_restore_refused", container=job, reason=why)
                return False
            docker_criu.restore(self.client.api, str(c.id), names[-1], store, self._data_root)
            return True
        except RuntimeFailure as exc:
            log.warning("specon.docker.criu_restore_failed", container=job, error=str(exc))
            with contextlib.suppress(docker.errors.APIError):
                c.reload()
            return False
        finally:
            shutil.rmtree(store, ignore_errors=True)

    def _locked(self, paths: JobPaths) -> contextlib.AbstractAsyncContextManager[None]:
        return job_lock(paths, self.sleep)


def _engine_labels(labels: list[str]) -> dict[str, str]:
    out = {}
    for item in labels:
        key, _, value = str(item).partition("=")
        if key:
            out[key] = value
    return out


def _init_pid(client: docker.DockerClient, c: Container) -> int | None:
    with contextlib.suppress(docker.errors.APIError, docker.errors.NotFound):
        return int((client.api.inspect_container(c.id).get("State") or {}).get("Pid") or 0) or None
    return None


def _cpu_seconds(c: Container) -> float | None:
    """Cumulative CPU seconds of a running container, from one stats sample."""
    try:
        stats = c.stats(stream=False, one_shot=True)
    except (docker.errors.APIError, docker.errors.NotFound):
        return None
    total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    return None if total is None else float(total) / 1e9


def import_image(client: docker.DockerClient, rootfs: Path, tag: str) -> str:
    """``docker import`` of the directory ``rootfs`` as ``tag``, unless the engine has it."""
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(tag)
        return tag
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(rootfs), arcname=".")
    repo, _, version = tag.partition(":")
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=version or "latest")
    return tag


def connect(url: str | None = None) -> docker.DockerClient:
    """A client of the engine at ``url`` (default: ``$DOCKER_HOST``, then the local socket)."""
    if url:
        return docker.DockerClient(base_url=url, timeout=60)
    return docker.from_env(timeout=60)


def _implements_runtime(rt: DockerRuntime) -> Runtime:
    return rt  # mypy proves DockerRuntime satisfies the Runtime protocol
