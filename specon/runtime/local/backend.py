"""The local runtime: a worker is a CPU budget on this machine, a container a process group.

Each agent owns one ``LocalRuntime`` for its worker. All durable state lives on the shared
volume (``specon.runtime.volume``): a job runs detached from the agent (its own session,
output to files in its job directory, under ``launcher.py`` which records its exit), and
``owner.json`` names the worker, pid and process start time of the current run. Nothing
else is remembered in memory, so a restarted agent re-adopts its running jobs simply by
reading the volume, and a job's liveness is always checked against ``/proc`` (pid *and*
start time, so a reused pid never passes for the job).

Save (SPEC §6): SIGTERM the job's process group and wait, up to the grace period, for it
to exit; the checkpoint it wrote is the result. Past the grace period the group is
SIGKILLed and the job rolled back to its newest complete checkpoint (``forced``). Decision
for a job without any verified checkpoint:

* it never wrote one (no checkpoint files at all): restarting from step 0 is a valid
  rollback, because the job contract only keeps progress up to the last checkpoint;
* it did, but none verifies: restarting would silently lose checkpointed progress, so the
  save fails with ``SaveFailed``; if the job still runs it is *left running* rather than
  killed, so a container is never left without a running copy.

Starting refuses a job that runs anywhere (``AlreadyRunning``); a job that ended on another
worker without being forgotten there simply moves here. Start, forget and clearing the
owner after a save are serialised across agents by an ``flock`` on the job's lock file. The
owner record's code (write-ahead, host checks, stop, forget) is ``specon.runtime.owners``,
shared with the Docker backend; here are its hooks for process groups. Commands run with the
job directory as working directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import structlog

from specon import checkpoint as ckpt  # the name `checkpoint` is start()'s parameter
from specon.model import RUNTIME_LABEL, ContainerId, Resources, WorkerId
from specon.runtime.base import (
    AlreadyFinished,
    ContainerInfo,
    ContainerState,
    JobSpec,
    NoSuchContainer,
    Runtime,
    RuntimeFailure,
    SaveResult,
    StartFailed,
    Supersede,
    WorkerUsage,
    valid_job_id,
)
from specon.runtime.local import cold
from specon.runtime.local.cgroups import (
    CGROUP_ROOT,
    PROC,
    CpuBudget,
    Mode,
    boot_id,
    group_alive,
    process_alive,
    read_stat,
)
from specon.runtime.local.freezer import report, report_refusal
from specon.runtime.local.launcher import (
    REASON_FENCED,
    REASON_KILLED,
    REASON_LOST,
    ExitRecord,
    find_launcher,
)
from specon.runtime.local.standby_pool import StandbyPool, StandbySpec
from specon.runtime.local.warm import WarmInterpreter, WarmLaunchError, WarmNoAnswerError, WarmSpec
from specon.runtime.local.zygote import Request
from specon.runtime.owners import OwnerRecords
from specon.runtime.saving import run_save
from specon.runtime.volume import CorruptRecordError, JobPaths, Owner, iter_job_ids

log = structlog.get_logger()

_POLL_S = 0.05  # between liveness checks while waiting for a job to exit
_KILL_WAIT_S = 5.0  # for a SIGKILLed group to disappear


class LocalRuntime(OwnerRecords[Owner]):
    """One worker on this machine: a CPU budget and the jobs the volume says it owns.

    A run is the process group of a job's launcher, recognised by pid *and* start time; its
    owner record (``OwnerRecords``) is what the shared code acts on."""

    _EVENTS = "specon.runtime"
    _HOST_NOUN = "boot"
    _STOP_ALL_SKIPS = (NoSuchContainer,)  # forgotten or moved since it was listed

    def __init__(
        self,
        root: Path,
        worker: WorkerId,
        cpus: float,
        cgroup_parent: str = "specon",
        *,
        cluster: str = "default",
        budget: Mode = "auto",
        memory: int = 0,
        cgroup_root: Path = CGROUP_ROOT,
        proc: Path = PROC,
        affinity_offset: int = 0,
        per_container_usage: bool = True,
        warm: bool | WarmSpec = False,
        standby_gpus: Sequence[int] = (),
        standby: StandbySpec | None = None,
    ) -> None:
        try:
            valid_job_id(worker)
            valid_job_id(cluster)
        except ValueError as exc:
            raise ValueError(f"invalid worker or cluster name: {exc}") from exc
        self.root = root
        self._worker = worker
        # Per-job CPU seconds in usage(): an agent that reads only the worker total turns
        # them off (they cost a scan of every process on the host).
        self.per_container_usage = per_container_usage
        self._proc = proc
        self.capacity = Resources(cpu=cpus, memory=memory)
        self._budget = CpuBudget.establish(
            cpus=cpus,
            path=(cgroup_parent, cluster, worker),
            mode=budget,
            cgroup_root=cgroup_root,
            proc=proc,
            affinity_offset=affinity_offset,
        )
        self._host = boot_id(proc=proc)
        # Saves/stops in flight; everything else is read from the volume on demand.
        self._busy: dict[ContainerId, ContainerState] = {}
        self._warned: set[Path] = set()
        self.skipped_records = 0
        self._closed = False
        # Built-in workloads fork from a pre-imported interpreter (``specon.runtime.local.warm``).
        spec = WarmSpec() if warm is True else warm or None
        self.warm = WarmInterpreter(worker, spec) if spec is not None else None
        # GPU jobs become a primed standby of their GPU (``specon.runtime.local.standby_pool``).
        self.standby = StandbyPool(worker, standby_gpus, standby) if standby_gpus else None
        (root / "jobs").mkdir(parents=True, exist_ok=True)
        running = {p.job: o for p, o in self._owned() if self._alive(o)}
        for job, owner in running.items():
            log.info("specon.runtime.adopted", worker=worker, container=job, pid=owner.pid)
        self._last = (time.monotonic(), self._budget.cpu_seconds(self._groups(running))[0])
        log.info(
            "specon.runtime.ready",
            worker=worker,
            cpus=cpus,
            enforcement=self._budget.enforcement.value,
            cgroup=str(self._budget.group.cpu_dir) if self._budget.group else None,
            adopted=len(running),
        )

    # -- the Runtime interface -------------------------------------------------------------
    @property
    def worker(self) -> WorkerId:
        return self._worker

    @property
    def enforcement(self) -> str:
        return self._budget.enforcement.value

    @property
    def budget(self) -> CpuBudget:
        return self._budget

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    @property
    def node_labels(self) -> dict[str, str]:
        return {RUNTIME_LABEL: "local"}

    @property
    def node_taints(self) -> tuple[str, ...]:
        return ()

    async def publish_state(self, container_id: ContainerId, annotations: Mapping[str, str]) -> bool:
        return False  # the agent's state file on the volume is the record here

    def job_spec(self, container_id: ContainerId) -> JobSpec | None:
        try:
            return JobPaths.of(self.root, container_id).read_spec()
        except (CorruptRecordError, ValueError) as exc:
            log.warning("specon.runtime.spec_unreadable", container=container_id, error=str(exc))
            return None

    async def list_containers(self) -> list[ContainerInfo]:
        out = []
        for paths, owner in self._owned():
            info = self._info(paths, owner)
            if info is not None:
                out.append(info)
        return out

    async def usage(self) -> WorkerUsage:
        """CPU use since the previous call, as a share of this worker's budget."""
        running = {p.job: o for p, o in self._owned() if self._alive(o)}
        self._budget.prune_jobs(running)  # the groups of jobs that ended here
        total, per_job = self._budget.cpu_seconds(self._groups(running), per_job=self.per_container_usage)
        now = time.monotonic()
        last_t, last_cpu = self._last
        self._last = (now, total)
        elapsed = now - last_t
        share = (total - last_cpu) / (elapsed * self._budget.cpus) if elapsed > 0 else 0.0
        return WorkerUsage(
            worker=self._worker,
            capacity=self.capacity,
            cpu_utilisation=min(1.0, max(0.0, share)),
            cpu_seconds=total,
            per_container=tuple(sorted(per_job.items())),
            enforcement=self._budget.enforcement.value,
        )

    async def freeze(self, container_id: ContainerId) -> bool:
        """Freeze every process of the running job (``specon.runtime.local.freezer``); False,
        logged, where it cannot be (not running here, a save or stop under way)."""
        try:
            _paths, owner, _ = await self._require(container_id)
            busy = self._busy.get(container_id)
            why = f"a {busy.value} is in progress" if busy else None if self._alive(owner) else "not running"
        except RuntimeFailure as exc:
            why, owner = str(exc), None
        if why is not None or owner is None or owner.pid is None:
            return report_refusal("freeze", why, worker=self._worker, container=container_id)
        result = await self._budget.freezer.freeze(container_id, owner.pid)
        return report("freeze", result, worker=self._worker, container=container_id)

    async def thaw(self, container_id: ContainerId) -> bool:
        """Let a frozen job run again; True also where it was not frozen or no longer runs
        (its group is thawed all the same, for the next start)."""
        try:
            _paths, owner, _ = await self._require(container_id)
        except RuntimeFailure as exc:
            return report_refusal("thaw", str(exc), worker=self._worker, container=container_id)
        result = await self._budget.freezer.thaw(container_id, owner.pid if self._alive(owner) else None)
        return report("thaw", result, worker=self._worker, container=container_id)

    async def pids(self) -> dict[ContainerId, frozenset[int]]:
        """Each running job's pids: its process group's and its own cgroups' (this process's
        PID namespace: the host's, as NVML reports them, unless the agent has its own)."""
        running = {p.job: o for p, o in self._owned() if self._alive(o)}
        return self._budget.job_pids(self._groups(running))

    async def set_cpu_weight(self, container_id: ContainerId, weight: int) -> bool:
        """The job's own cgroup's ``cpu.shares``; the first weight pins the worker to whole
        CPUs, where shares take effect (``CpuBudget.set_weight``, which logs a refusal)."""
        return self._budget.set_weight(container_id, weight)

    async def start(
        self, spec: JobSpec, *, checkpoint: Path | None = None, supersede: Supersede = False
    ) -> ContainerInfo:
        self._check_open()
        paths = JobPaths(self.root, spec.id)
        if checkpoint is not None:
            manifest = checkpoint.with_suffix(".json")
            if manifest.parent.resolve() != paths.checkpoints.resolve():
                raise StartFailed(spec.id, f"{checkpoint} is not in the job's checkpoint directory")
            try:  # hashing a large payload takes a while: off the event loop
                from_ckpt = await asyncio.to_thread(ckpt.verify, manifest)
            except ckpt.CheckpointError as exc:
                raise StartFailed(spec.id, f"checkpoint does not verify: {exc}") from exc
            log.debug("specon.runtime.checkpoint_verified", container=spec.id, step=from_ckpt.step)
        try:
            paths.create()
        except OSError as exc:  # e.g. a full volume
            raise StartFailed(spec.id, f"cannot create the job's directories: {exc}") from exc
        async with self._locked(paths):
            stale = self._refuse_running(paths, supersede=supersede)
            if stale is not None and stale.host == self._host:
                # One kernel (workers of the embedded default, namespace hosts): the lost
                # worker's copy is in reach, so it ends before the new one starts rather than
                # at its launcher's next look. Elsewhere the generation fences it.
                await self._kill(paths, stale, reason=REASON_FENCED)
            if paths.finished():
                raise AlreadyFinished(spec.id, "already finished (done marker or final progress record)")
            try:
                paths.write_spec(spec)
            except OSError as exc:  # e.g. a full volume: nothing started
                raise StartFailed(spec.id, f"cannot record the job spec: {exc}") from exc
            owner = await self._launch(spec, paths)
        newest = ckpt.latest_complete(paths.checkpoints)
        log.info(
            "specon.runtime.started",
            worker=self._worker,
            container=spec.id,
            pid=owner.pid,
            resume_step=None if newest is None else newest.step,
            enforcement=self._budget.enforcement.value,
        )
        info = self._info(paths, owner)
        if info is None:  # pragma: no cover - spec.json was just written
            raise StartFailed(spec.id, "started but its records cannot be read back")
        return info

    async def save(self, container_id: ContainerId, *, grace: float) -> SaveResult:
        paths, owner, _ = await self._require(container_id)

        async def halt(_t0: float) -> bool:
            # A frozen job would not see its SIGTERM (saving marks it busy: no new freeze).
            await self._budget.freezer.thaw(container_id, owner.pid if self._alive(owner) else None)
            return await self._terminate(paths, owner, grace, saving=True)

        async def release() -> None:
            async with self._locked(paths):
                self._clear_owner(paths, owner)

        return await run_save(
            container_id,
            self._worker,
            grace=grace,
            checkpoints=paths.checkpoints,
            busy=self._busy,
            halt=halt,
            finished=paths.finished,
            release=release,
            events="specon.runtime",
            context={"worker": self._worker},
            corrupt="it exited without a verifiable checkpoint and every earlier one is corrupt;"
            " it stays listed (failed) for inspection",
        )

    async def stop(self, container_id: ContainerId, *, grace: float) -> ContainerInfo:
        """``OwnerRecords.stop``, thawing a frozen job first: it would not see its SIGTERM."""
        with contextlib.suppress(RuntimeFailure):  # the shared stop reports those
            _paths, owner, _ = await self._require(container_id)
            if container_id not in self._busy and self._alive(owner):
                await self._budget.freezer.thaw(container_id, owner.pid)
        return await super().stop(container_id, grace=grace)

    # -- housekeeping ------------------------------------------------------------------------
    def set_cpus(self, cpus: float) -> None:
        """Change the worker's CPU budget; with cgroups it applies to running jobs at once."""
        self._budget.set_cpus(cpus)
        self.capacity = Resources(cpu=cpus, memory=self.capacity.memory, gpu=self.capacity.gpu)

    def close(self) -> bool:
        """Release the worker's cgroup if no job is left in it; never kills a job.

        True when nothing was left behind.
        """
        self._closed = True
        if self.warm is not None:
            self.warm.close()
        if self.standby is not None:
            self.standby.close()
        clean = self._budget.close()
        if not clean:
            log.info("specon.runtime.cgroup_kept", worker=self._worker, reason="jobs still running")
        return clean

    # -- internals ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"LocalRuntime for {self._worker} is closed")

    def _owned(self) -> list[tuple[JobPaths, Owner]]:
        """Every job whose owner.json names this worker; unreadable records are skipped."""
        out = []
        for job in iter_job_ids(self.root):
            paths = JobPaths(self.root, job)
            try:
                owner = self._read_owner(paths)
            except CorruptRecordError as exc:
                self._skip(paths.owner, exc)
                continue
            if owner is not None and owner.worker == self._worker:
                out.append((paths, owner))
        return out

    def _skip(self, path: Path, exc: Exception) -> None:
        self.skipped_records += 1
        if path not in self._warned:
            self._warned.add(path)
            log.warning("specon.runtime.record_skipped", worker=self._worker, path=str(path), error=str(exc))

    @staticmethod
    def _groups(running: dict[ContainerId, Owner]) -> dict[ContainerId, int]:
        return {job: o.pid for job, o in running.items() if o.pid is not None}

    def _info(self, paths: JobPaths, owner: Owner) -> ContainerInfo | None:
        if owner.pid is None and owner.host == self._host and paths.job not in self._busy:
            return None  # provisional, no launcher: a launch under way or one that never ran
        try:
            spec = paths.read_spec()
        except CorruptRecordError as exc:
            self._skip(paths.spec, exc)
            return None
        alive = self._alive(owner)
        exit_code = None
        if paths.job in self._busy:
            state = self._busy[paths.job]
        elif alive:
            state = ContainerState.RUNNING
        else:
            record = paths.exit_of(owner.run_id)
            if record is None:
                # The launcher records every exit it lives to see; none means the group was
                # killed from outside (OOM killer, reboot). Record that once.
                record = self._exit_record(owner, REASON_LOST, None)
                try:
                    paths.append_exit(record)
                except OSError as exc:  # a full volume: recorded at a later listing instead
                    log.warning("specon.runtime.exit_unrecorded", container=paths.job, error=str(exc))
                log.warning("specon.runtime.exit_lost", worker=self._worker, container=paths.job)
            exit_code = record.exit_code
            state = ContainerState.EXITED if exit_code == 0 else ContainerState.FAILED
        return ContainerInfo(
            id=paths.job,
            worker=self._worker,
            spec=spec,
            state=state,
            progress_path=paths.progress,
            checkpoint_dir=paths.checkpoints,
            started_at=owner.started_at,
            pid=owner.pid,
            exit_code=exit_code,
            # Reading the log's tail is the costly part of a listing: only ended jobs need it.
            finished=state in (ContainerState.EXITED, ContainerState.FAILED) and paths.finished(),
        )

    def _exit_record(self, owner: Owner, reason: str, sig: int | None) -> ExitRecord:
        # The run's worker, not ours: a start superseding a lost worker's run ends that run here.
        return ExitRecord(owner.run_id, owner.worker, owner.pid or 0, None, sig, reason, time.time())

    async def _launch(self, spec: JobSpec, paths: JobPaths) -> Owner:
        """Start the job detached, in the worker's budget, and record it as the owner."""
        # Write-ahead: the run is on record before it exists, so a runtime killed between the
        # launch and the full record below leaves a record that names it (``_find_run``
        # finds its launcher by ``run_id``) instead of a running copy no record names.
        ahead = self._write_ahead(spec.id, paths)
        run_id = ahead.run_id
        pid = self._launch_warm(spec, paths, run_id, ahead.generation)
        if pid is None:
            pid = await self._launch_cold(spec, paths, ahead)
        stat = read_stat(pid, proc=self._proc)  # an unreaped child is readable even if dead
        owner = Owner(
            worker=self._worker,
            run_id=run_id,
            started_at=self.now(),
            host=self._host,
            pid=pid,
            start_ticks=None if stat is None else stat.start_ticks,
            generation=ahead.generation,
        )
        try:
            paths.write_owner(owner)
        except OSError as exc:
            self._abandon(paths, ahead, lambda: os.killpg(pid, signal.SIGKILL))
            raise StartFailed(spec.id, f"cannot record the owner, job killed: {exc}") from exc
        return owner

    def _launch_warm(self, spec: JobSpec, paths: JobPaths, run_id: str, generation: int | None) -> int | None:
        """Hand the job to its GPU's primed standby, else fork it from the warm interpreter;
        None where neither can run it (start cold)."""
        standby = None if self.standby is None else self.standby.take(spec)
        server = standby or self.warm
        args = None if server is None else server.runs(spec.command)
        if server is None or args is None:
            return None
        req = Request(
            module=server.module,
            args=args,
            cwd=str(paths.dir),
            env=paths.env(spec, self._worker, generation) | ({} if standby is None else standby.env),
            stdout=str(paths.stdout),
            stderr=str(paths.stderr),
            exits=str(paths.exits),
            run_id=run_id,
            worker=self._worker,
            entry=self._budget.entry(spec.id),
        )
        try:
            return server.launch(req)
        except WarmLaunchError as exc:
            paths.clear_owner()
            raise StartFailed(spec.id, f"cannot launch it warm: {exc}") from exc
        except WarmNoAnswerError as exc:  # the provisional record stays: it names the run
            raise StartFailed(spec.id, f"{exc}; a later start finds it if it runs") from exc

    async def _launch_cold(self, spec: JobSpec, paths: JobPaths, ahead: Owner) -> int:
        """Start the job under ``launcher.py`` in a fresh interpreter; the launcher's pid."""
        try:
            return await cold.launch(
                spec.command,
                exits=paths.exits,
                run_id=ahead.run_id,
                worker=self._worker,
                entry=self._budget.entry(spec.id),
                cwd=paths.dir,
                env=paths.env(spec, self._worker, ahead.generation),
                stdout=paths.stdout,
                stderr=paths.stderr,
            )
        except cold.LaunchError as exc:  # nothing runs: no record may name it
            with contextlib.suppress(OSError):
                self._clear_owner(paths, ahead)
            raise StartFailed(spec.id, f"cannot launch {spec.command[0]!r}: {exc}") from exc

    # -- OwnerRecords hooks: a run is a process group on this host ------------------------------
    # ``_offload`` stays inline: reading /proc is quick, and ``_reap`` must not run in two
    # threads at once.
    def _find_run(self, owner: Owner) -> Owner | None:
        pid = find_launcher(owner.run_id, self._proc)
        stat = None if pid is None else read_stat(pid, proc=self._proc)
        if pid is None or stat is None:
            return None
        return replace(owner, pid=pid, start_ticks=stat.start_ticks)

    def _alive_here(self, owner: Owner) -> bool:
        cold.reap()  # an exited child stays a zombie (its /proc entry) until reaped
        return process_alive(owner.pid, owner.start_ticks, proc=self._proc)

    async def _run(self, paths: JobPaths, owner: Owner) -> Owner:
        return owner

    async def _stoppable(self, run: Owner) -> bool:
        return self._alive(run)

    async def _still_running(self, run: Owner) -> bool:
        return self._alive(run)

    async def _report(self, paths: JobPaths, run: Owner) -> ContainerInfo | None:
        return self._info(paths, run)

    async def _live_jobs(self) -> list[ContainerId]:
        return [p.job for p, o in self._owned() if o.host == self._host and self._alive(o)]

    async def _send_term(self, run: Owner) -> None:
        if run.pid is None or not self._alive(run):
            return  # never signal a pid that is no longer the job's
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGTERM)

    def _gone(self, owner: Owner) -> bool:
        return not self._alive(owner) and (owner.pid is None or not group_alive(owner.pid, proc=self._proc))

    async def _wait_ended(self, run: Owner, timeout: float) -> bool:
        """Wait until the job's whole process group has exited; False on timeout."""
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._gone(run):
            if time.monotonic() >= deadline:
                return False
            await self.sleep(_POLL_S)
        return True

    async def _kill(self, paths: JobPaths, run: Owner, *, reason: str = REASON_KILLED) -> None:
        # The group, not only the launcher: a job's children may outlive it.
        if run.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
        if not await self._wait_ended(run, _KILL_WAIT_S):
            raise RuntimeFailure(paths.job, f"process group {run.pid} survived SIGKILL")
        if paths.exit_of(run.run_id) is None:
            paths.append_exit(self._exit_record(run, reason, int(signal.SIGKILL)))
        log.warning(
            "specon.runtime.killed", worker=self._worker, container=paths.job, pid=run.pid, reason=reason
        )


def _implements_runtime(rt: LocalRuntime) -> Runtime:
    return rt  # mypy proves LocalRuntime satisfies the Runtime protocol
