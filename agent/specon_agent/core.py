"""The agent's work, without the network: watch containers, classify, execute commands.

``Agent`` owns one worker's runtime. ``tick`` tails every running container's progress
log and runs Algorithm 1 (through ``specon.policy.classifier``) for the whole worker;
``heartbeat`` builds the message the manager expects; ``execute`` carries out one
manager command, idempotently per command id, and queues its result until a reply
acknowledges it. Monitor states are persisted after every change, so a restarted agent
keeps each container's category, pending request and ``migrated`` freeze. ``sample_usage``
also reads the worker's GPUs (``specon_agent.gpus``), which the heartbeat reports.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import assert_never

import structlog

from specon import checkpoint as ckpt  # the name `checkpoint` is a command's field
from specon.config import Policy, ProgressConfig
from specon.coordinator.retention import expired
from specon.daemon.settings import AgentSettings
from specon.jobkit import EXIT_CHECKPOINTED
from specon.model import RUNTIME_LABEL, ContainerId, Direction, GpuState, Resources, WorkerId
from specon.policy.classifier import classifier_for, horizon
from specon.policy.monitor import MonitorState, StateError
from specon.progress import SkipReason, Tailer
from specon.progress.last import last_record
from specon.runtime.base import (
    AlreadyFinished,
    AlreadyRunning,
    ContainerInfo,
    ContainerState,
    JobSpec,
    Runtime,
    RuntimeFailure,
    Supersede,
    supersede_of,
)
from specon.runtime.gpu.nvml import NvmlReader
from specon.runtime.gpu.sample import GpuSample, gpu_capacity, gpu_labels
from specon.wire.limits import COUNT
from specon.wire.protocol import Action, Command, CommandBatch, CommandResult, Heartbeat
from specon.wire.status import Phase
from specon_agent.gpu_share import GpuShare, gpu_state_path
from specon_agent.gpus import GpuUsage, device_reports, gpu_use
from specon_agent.priority import Running, running_of
from specon_agent.reports import ended_report, running_report, suspended_reports
from specon_agent.resumed import FirstRecord, first_record_after, log_size, start_or_fall_back
from specon_agent.taints_file import TaintsFile
from specon_agent.watched import AgentCounters, Watched, append_curve, declare_steps, predicted_steps
from specon_agent.weights import CpuWeights, state_path
from specon_agent.window import LossWindows

log = structlog.get_logger()

# Job labels that override the policy's progress settings for one job.
LABEL_METRIC = "specon.io/metric"
LABEL_DIRECTION = "specon.io/direction"
LABEL_FORMAT = "specon.io/format"


class Agent:
    def __init__(
        self,
        *,
        runtime: Runtime,
        policy: Policy,
        address: str = "",
        state_file: Path | None = None,
        labels: dict[str, str] | None = None,
        settings: AgentSettings | None = None,
        gpus: NvmlReader | None = None,
        taints_file: Path | None = None,
    ) -> None:
        """``gpus``: the NVML reader of this worker's GPUs (None: GPUs are not read);
        ``taints_file``: taints the host announces (``specon_agent.taints_file``)."""
        self.runtime = runtime
        self.policy = policy
        self.address = address
        self.state_file = state_file
        self.labels = labels or {}
        self.taints_file = TaintsFile(taints_file) if taints_file else None
        self.settings = settings or AgentSettings()  # operational knobs (timeouts, memory, backoff)
        self.classifier = classifier_for(policy.monitor)
        self.watched: dict[ContainerId, Watched] = {}
        # Containers that ended here (finished or failed) and are still reported.
        self.ended: dict[ContainerId, tuple[ContainerInfo, Phase]] = {}
        self.saved_states: dict[ContainerId, MonitorState] = self._load_states()
        # When each container was last here (running, ended, or being saved away): the saved
        # state of one gone longer than ``state_retention`` is forgotten.
        self._last_here: dict[ContainerId, float] = dict.fromkeys(self.saved_states, runtime.now())
        # Containers being saved or stopped away from here: never re-adopted by a refresh
        # that raced with the save (that would report a stopped job as running).
        self.leaving: set[ContainerId] = set()
        # Commands: id -> result (done) or task (running); results not yet acknowledged.
        self.done: dict[str, CommandResult] = {}
        self.running: dict[str, asyncio.Task[CommandResult]] = {}
        self.unacked: dict[str, tuple[int | None, CommandResult]] = {}
        self.counters = AgentCounters()
        self.windows = LossWindows()  # each job's loss curve, for the status page
        # Containers whose category changed since their state was last published.
        self.changed: set[ContainerId] = set()
        self._seq = 0
        # R(w, t), capacity and each container's CPU seconds, refreshed by ``sample_usage``.
        self.usage = 0.0
        self.capacity = Resources()
        self.cpu_seconds: dict[ContainerId, float] = {}
        # The GPUs (``specon_agent.gpus``): the newest sample, and each job's state under the
        # GPU sharing (which sets it; a job it does not name runs).
        self.gpus = GpuUsage(gpus)
        self.gpu_sample: GpuSample | None = None
        self.gpu_states: dict[ContainerId, GpuState] = {}
        # Priority on the GPUs (``specon_agent.gpu_share``): it keeps ``gpu_states``.
        gpu_file = None if state_file is None else gpu_state_path(state_file)
        grace = policy.migration.grace_period
        self.gpu_share = GpuShare(
            runtime, policy.gpu, state_file=gpu_file, grace=grace, states=self.gpu_states
        )
        # The priority action: CPU weights among this worker's containers (``specon_agent.weights``).
        self._remaining: dict[ContainerId, float] = {}  # CPU-seconds left, per running job
        weights_file = None if state_file is None else state_path(state_file)
        self.cpu_weights = CpuWeights(runtime, policy.priority, state_file=weights_file)

    @property
    def worker(self) -> WorkerId:
        return self.runtime.worker

    # -- Algorithm 1 -------------------------------------------------------------------
    async def refresh(self) -> None:
        """Adopt new containers, notice ended ones."""
        infos = await self.runtime.list_containers()
        seen = set()
        for info in infos:
            seen.add(info.id)
            if info.id in self.leaving:
                continue
            if info.alive:
                w = self.watched.get(info.id)
                if w is None:
                    self._watch(info)
                else:
                    w.info = info
                if (w := self.watched.get(info.id)) is not None:
                    declare_steps(w)  # a total its log declared, where the spec has none
            elif info.id in self.watched or info.id not in self.ended:
                stopped = info.exit_code in (0, EXIT_CHECKPOINTED)  # 75: stopped after a checkpoint
                phase: Phase = "finished" if info.finished else ("stopped" if stopped else "failed")
                gone = self.watched.pop(info.id, None)
                if gone is not None:
                    gone.tailer.close()
                self.ended[info.id] = (info, phase)
                log.info("specon.agent.container_ended", container=info.id, phase=phase,
                         exit_code=info.exit_code)  # fmt: skip
        for cid in list(self.watched):
            if cid not in seen:  # saved away or forgotten
                self.watched.pop(cid).tailer.close()
        for cid in list(self.ended):
            if cid not in seen:
                self.ended.pop(cid)
        self.leaving &= seen
        self._forget_old_states(seen)

    def _forget_old_states(self, seen: set[ContainerId]) -> None:
        now = self.runtime.now()
        for cid in (*seen, *self.watched, *self.leaving):
            self._last_here[cid] = now
        for cid in self.saved_states:
            self._last_here.setdefault(cid, now)  # saved or started since the last refresh
        here = self.watched.keys() | self.ended.keys() | self.leaving
        gone = expired(self._last_here, now, self.settings.state_retention, here)
        for cid in gone:
            del self._last_here[cid]
            self.saved_states.pop(cid, None)
        self.cpu_weights.forget(gone)
        if gone:
            self.counters.states_forgotten += len(gone)
            log.info("specon.agent.states_forgotten", containers=len(gone))
            self._save_states()

    def _progress_config(self, spec: JobSpec) -> ProgressConfig:
        labels = dict(spec.labels)
        cfg = self.policy.progress
        if LABEL_METRIC in labels:
            cfg = replace(cfg, metric=labels[LABEL_METRIC])
        if labels.get(LABEL_DIRECTION) in ("minimize", "maximize"):
            cfg = replace(cfg, direction=Direction(labels[LABEL_DIRECTION]))
        if labels.get(LABEL_FORMAT) in ("auto", "jsonl", "csv", "text"):
            cfg = replace(cfg, format=labels[LABEL_FORMAT])  # type: ignore[arg-type]
        return cfg

    def _watch(self, info: ContainerInfo) -> None:
        cfg = self._progress_config(info.spec)
        state = self.saved_states.get(info.id) or self.classifier.initial(direction=cfg.direction)
        tailer = Tailer(info.progress_path, cfg)
        # A restored job appends to the log it had: classify only what it writes from now.
        tailer.poll()
        old = self.watched.get(info.id)
        if old is not None:
            old.tailer.close()
        self.watched[info.id] = Watched(info, tailer, state)
        self.ended.pop(info.id, None)
        log.info("specon.agent.container_adopted", container=info.id, category=state.display.value)

    def tick(self, now: float) -> list[ContainerId]:
        """One categorisation interval for every watched container; the new requests."""
        samples: dict[ContainerId, list[float]] = {}
        nonfinite: dict[ContainerId, int] = {}
        for cid, w in self.watched.items():
            stepped_before = w.step is not None  # an earlier tick read a step of it
            got = w.tailer.poll()
            for reason, n in w.tailer.stats.skipped.items():
                new_skips = n - w.skipped_seen.get(reason, 0)
                if new_skips > 0:
                    self.counters.skipped[reason.value] = (
                        self.counters.skipped.get(reason.value, 0) + new_skips
                    )
                    w.skipped_seen[reason] = n
            bad = w.tailer.stats.skipped[SkipReason.NONFINITE]
            if bad > w.nonfinite_seen:
                nonfinite[cid] = bad - w.nonfinite_seen
                w.nonfinite_seen = bad
            if got:
                samples[cid] = [s.value for s in got]
                # A step the protocol cannot carry (negative, past 2^63) would get every
                # heartbeat of this worker refused: its loss still counts, its step does not.
                steps = [s.step for s in got if s.step is not None and COUNT.lo <= s.step <= COUNT.hi]
                if steps:  # the curve: the quality point's and, without a declared total, the fit's
                    w.step = steps[-1]
                    append_curve(w, steps[-1], [s.value for s in got])
                w.last_sample_at = now
                self.counters.samples += len(got)
            if w.first_step is None and stepped_before:
                # The CPU-per-step baseline, a tick after its first step was read (watched.py).
                w.first_step, w.first_cpu = w.step, self.cpu_seconds.get(cid, 0.0)
        self.windows.tick(now, samples, self.watched)
        # A job the GPU sharing has frozen logs nothing by design: such a tick is not a stale one.
        states = {
            cid: w.state
            for cid, w in self.watched.items()
            if cid in samples or self.gpu_states.get(cid) != "frozen"
        }
        # A job that declared its steps is judged against the rest of its run (robust classifier).
        horizons = {
            cid: h for cid, w in self.watched.items() if (h := horizon(w.info.spec.steps, w.step)) is not None
        }
        result = self.classifier.tick_worker(
            states, samples, now, nonfinite=nonfinite or None, horizons=horizons or None
        )
        for cid, st in result.states.items():
            old = self.watched[cid].state
            if old.display is not st.display:
                log.info(
                    "specon.agent.category_changed",
                    container=cid,
                    old=old.display.value,
                    new=st.display.value,
                    g=st.last_g,
                )
                self.changed.add(cid)
            self.watched[cid].state = st
        self.counters.ticks += 1
        self._save_states()
        return list(result.requests)

    async def publish_changes(self) -> None:
        """Show changed categories where the platform has a place for them (pod annotations)."""
        for cid in sorted(self.changed):
            w = self.watched.get(cid)
            if w is None:
                continue
            st = w.state
            notes = {
                "specon.io/category": st.display.value,
                "specon.io/migrated": "true" if st.migrated else "false",
                **({"specon.io/t-cc": f"{st.t_cc:.3f}"} if st.t_cc is not None else {}),
            }
            await self.runtime.publish_state(cid, notes)
        self.changed.clear()

    async def sample_gpus(self) -> None:
        """The newest GPU sample (NVML in a thread; the runtime's PIDs where a GPU has processes)."""
        self.gpu_sample = await self.gpus.refresh(self.runtime)

    async def sample_usage(self) -> None:
        u = await self.runtime.usage()
        self.usage = min(1.0, max(0.0, u.cpu_utilisation)) if math.isfinite(u.cpu_utilisation) else 0.0
        self.cpu_seconds = dict(u.per_container)
        await self.sample_gpus()
        devices = self.gpu_sample.devices if self.gpu_sample else ()
        self.capacity = gpu_capacity(u.capacity, devices, runtime=self.runtime.node_labels.get(RUNTIME_LABEL))

    # -- priority on the node ----------------------------------------------------------
    def running_jobs(self) -> list[Running]:
        """The running containers as the priority rule sees them (``specon_agent.priority``)."""
        return [
            running_of(
                w.info,
                w.step,
                w.state,
                self.cpu_seconds.get(cid, 0.0),
                first_step=w.first_step,
                first_cpu=w.first_cpu,
                predicted_steps=predicted_steps(w),
                curve=w.curve,
            )
            for cid, w in self.watched.items()
            if w.info.state is ContainerState.RUNNING
        ]

    async def apply_priority(self, now: float) -> None:
        """After a tick: the policy's CPU weights, those that changed applied (``specon_agent.weights``),
        and each job's remaining work for the next heartbeats."""
        running = self.running_jobs()
        self._remaining = {
            r.id: w for r in running if (w := r.remaining_work) is not None and math.isfinite(w)
        }
        await self.cpu_weights.tick(running, self.capacity.cpu, now)

    # -- heartbeat ---------------------------------------------------------------------
    def next_seq(self) -> int:
        # Wall-clock microseconds: strictly increasing, also across agent restarts.
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq

    def heartbeat(self, now: float, *, new_results: bool = True) -> Heartbeat:
        """The next heartbeat. ``new_results`` False (its containers not listed afresh): only
        results already sent go again; a new one waits for a listing at least as new as it,
        so the manager never reads a start's success beside a list that lacks its job."""
        seq = self.next_seq()
        sample, states = self.gpu_sample, self.gpu_states
        reports = [
            running_report(
                w,
                cpu_weight=self.cpu_weights.weight_of(cid),
                remaining_work=self._remaining.get(cid),
                window=self.windows.report(cid),
                gpu=gpu_use(cid, sample, states),
            )
            for cid, w in self.watched.items()
        ]
        initial = self.classifier.initial().category
        measured = self.cpu_weights.finished  # finished jobs' quality points
        for info, phase in self.ended.values():
            gpu = gpu_use(info.id, sample, states)  # a job the GPU sharing suspended says so
            state = self.saved_states.get(info.id)
            reports.append(
                ended_report(info, phase, state, initial, gpu, quality_share=measured.get(info.id))
            )
        # Suspended jobs the runtime no longer lists (its save ended their run here).
        here = self.watched.keys() | self.ended
        gone = {k: t for k, t in self.gpu_share.suspended().items() if k not in here}
        reports += suspended_reports(gone, self.saved_states, initial)
        gpus = device_reports(sample)
        results = []
        for cid, (sent_in, res) in self.unacked.items():
            if sent_in is None:
                if not new_results:
                    continue
                self.unacked[cid] = (seq, res)
            results.append(res)
        return Heartbeat(
            worker=self.worker,
            address=self.address,
            seq=seq,
            sent_at=now,
            capacity=self.capacity,
            usage=self.usage,
            containers=tuple(reports),
            results=tuple(results),
            # NVML's GPU labels, under the node's own (GPU feature discovery's win) and --label.
            labels={**gpu_labels(gpus), **self.runtime.node_labels, **self.labels},
            # The manager offers this worker only to containers whose tolerations admit these.
            taints=self.runtime.node_taints + (self.taints_file.taints() if self.taints_file else ()),
            gpus=gpus,
            quality_version=self.cpu_weights.quality_version,
        )

    def acknowledge(self, batch: CommandBatch) -> None:
        """Drop the results recorded (sent in heartbeat ``ack`` or before); take quality points sent."""
        self.cpu_weights.learn(batch.quality_version, batch.quality)
        if batch.ack is None:
            return
        for cid in [c for c, (sent, _) in self.unacked.items() if sent is not None and sent <= batch.ack]:
            del self.unacked[cid]

    # -- commands ----------------------------------------------------------------------
    def accept(self, batch: CommandBatch) -> list[asyncio.Task[CommandResult]]:
        """Start every new command in ``batch``; repeats of known commands are ignored."""
        self.acknowledge(batch)
        started = []
        for cmd in batch.commands:
            if cmd.id in self.running:
                continue
            if cmd.id in self.done:
                # Executed before and the manager still asks: its result got lost. Resend.
                self.unacked.setdefault(cmd.id, (None, self.done[cmd.id]))
                continue
            task = asyncio.create_task(self._run(cmd, batch.remaining(cmd)), name=f"specon-cmd-{cmd.id}")
            self.running[cmd.id] = task
            started.append(task)
        return started

    async def _run(self, cmd: Command, remaining: float) -> CommandResult:
        action = cmd.action.value if isinstance(cmd.action, Action) else "unknown"
        self.counters.commands[action] = self.counters.commands.get(action, 0) + 1
        log.info("specon.agent.command_started", command=cmd.id, action=action, container=cmd.container)
        try:
            res = await self.execute(cmd, remaining)
        except Exception as exc:  # a bug or an unexpected backend error: report, never die
            log.exception("specon.agent.command_crashed", command=cmd.id)
            res = CommandResult(command=cmd.id, ok=False, error=f"{type(exc).__name__}: {exc}")
        if not res.ok:
            self.counters.command_failures += 1
        log.info("specon.agent.command_finished", command=cmd.id, ok=res.ok, error=res.error)
        self.done[cmd.id] = res
        while len(self.done) > self.settings.result_memory:
            self.done.pop(next(iter(self.done)))
        self.unacked[cmd.id] = (None, res)
        self.running.pop(cmd.id, None)
        return res

    async def execute(self, cmd: Command, remaining: float) -> CommandResult:
        known = isinstance(cmd.action, Action)
        if not known:
            # Decode refuses an unknown action; one that got here anyway (a newer manager's,
            # a bug) is an error, never a stop: nothing is done to the container.
            error = f"{cmd.container}: unknown action {cmd.action!r}; nothing done"
            return CommandResult(command=cmd.id, ok=False, error=error)
        if cmd.action is Action.SAVE:
            return await self._save(cmd, remaining)
        if cmd.action is Action.START:
            return await self._start(cmd)
        if cmd.action is Action.MARK_MIGRATED:
            return self._mark(cmd)
        if cmd.action is Action.STOP:
            return await self._stop(cmd)
        assert_never(cmd.action)  # every action is handled above (mypy checks it)

    async def _save(self, cmd: Command, remaining: float) -> CommandResult:
        grace = max(1.0, min(self.policy.migration.grace_period, remaining))
        w = self.watched.get(cmd.container)
        # Its log, also when it is not watched yet (just started here): the save's lost steps.
        progress = w.info.progress_path if w is not None else await self._progress_path(cmd.container)
        self.leaving.add(cmd.container)
        began = self.runtime.now()  # the job stops training at the SIGTERM: downtime starts here
        try:
            await self.gpu_share.before_save(cmd.container)  # thawed, and left alone from now on
            res = await self.runtime.save(cmd.container, grace=grace)
        except RuntimeFailure as exc:
            # Not saved: the job keeps running here (or was never here) and is watched again.
            self.leaving.discard(cmd.container)
            return CommandResult(command=cmd.id, ok=False, error=str(exc))
        now = self.runtime.now()
        # The step it had trained to: with the checkpoint's, what a save cut short lost.
        last = None if progress is None else await asyncio.to_thread(last_record, progress)
        if w is not None:
            self.saved_states[cmd.container] = w.state
            w.tailer.close()
        self.watched.pop(cmd.container, None)
        self._save_states()
        return CommandResult(
            command=cmd.id,
            ok=True,
            checkpoint=str(res.checkpoint) if res.checkpoint else None,
            checkpoint_step=res.step,
            finished_at=now,
            detail={
                "began_at": began,
                "seconds": round(res.seconds, 3),
                "forced": res.forced,
                "rolled_back": res.rolled_back,
                "finished": res.finished,
                # No record yet: it had trained no step (None: its log is not known here).
                "last_step": (0 if progress else None) if last is None else last.get("step"),
            },
        )

    async def _progress_path(self, container: ContainerId) -> Path | None:
        try:
            listed = await self.runtime.list_containers()
        except RuntimeFailure:
            return None
        return next((c.progress_path for c in listed if c.id == container), None)

    async def _start(self, cmd: Command) -> CommandResult:
        # What runs is the job as submitted, from this runtime's own record (the spec on
        # the volume, the original pod in the API server), never a recipe that came over
        # the wire: a forged save result must not choose what this host executes.
        if cmd.spec:
            log.warning("specon.agent.command_spec_ignored", command=cmd.id, container=cmd.container)
        # Off the loop: on Kubernetes the record is read from the API server.
        spec = await asyncio.to_thread(self.runtime.job_spec, cmd.container)
        if spec is None:
            return CommandResult(command=cmd.id, ok=False, error=f"{cmd.container}: no job spec on record")
        if spec.id != cmd.container:
            return CommandResult(
                command=cmd.id, ok=False, error=f"{cmd.container}: the recorded spec is for job {spec.id}"
            )
        checkpoint = Path(cmd.checkpoint) if cmd.checkpoint else None
        self.leaving.discard(cmd.container)
        if cmd.migrated:
            base = self.saved_states.get(cmd.container) or self.classifier.initial()
            self.saved_states[cmd.container] = self.classifier.mark_migrated(base, self.runtime.now())
        starting = self.runtime.now()
        try:
            supersede = supersede_of(cmd.supersede, cmd.lost)
            info = await self._start_from(spec, checkpoint, supersede=supersede)
        except AlreadyRunning as exc:
            here = {i.id for i in await self.runtime.list_containers() if i.alive}
            if cmd.container in here:  # a repeated start: it is running here, as asked
                w = self.watched.get(cmd.container)
                if cmd.migrated and w is not None and not w.state.migrated:
                    w.state = self.classifier.mark_migrated(w.state, self.runtime.now())
                    self.changed.add(cmd.container)
                    self._save_states()
                return CommandResult(command=cmd.id, ok=True, finished_at=self.runtime.now())
            # Not a restart: a copy runs elsewhere (the manager may not hear from it yet).
            return CommandResult(command=cmd.id, ok=False, error=str(exc), detail={"running_elsewhere": True})
        except AlreadyFinished as exc:
            # Not an error to retry: the manager ends the migration (nothing left to run).
            return CommandResult(command=cmd.id, ok=False, error=str(exc), detail={"finished": True})
        except RuntimeFailure as exc:
            return CommandResult(command=cmd.id, ok=False, error=str(exc))
        offset = log_size(info.progress_path)  # what earlier runs (other hosts, other clocks) wrote
        self._watch(info)
        self._save_states()
        first = await first_record_after(
            self.runtime, info, starting, offset, self.settings.first_record_timeout
        )
        if first.never_ran:
            return await self._died_at_start(cmd, first)
        return CommandResult(command=cmd.id, ok=True, finished_at=first.at)

    async def _died_at_start(self, cmd: Command, first: FirstRecord) -> CommandResult:
        """The copy ended before its first record (a crash on restore, an OOM, a kubelet that
        refused it): no copy runs here, so the start failed, and the manager restarts the job
        elsewhere. The dead run is unlisted before the result goes out (no heartbeat may show
        it running) and forgotten, so that its record blocks no start on another host."""
        code = None if first.ended is None else first.ended.exit_code
        gone = self.watched.pop(cmd.container, None)
        if gone is not None:
            gone.tailer.close()
        try:
            await self.runtime.forget(cmd.container)
        except RuntimeFailure as exc:
            log.warning("specon.agent.forget_failed", container=cmd.container, error=str(exc))
        log.warning("specon.agent.start_died", command=cmd.id, container=cmd.container, exit_code=code)
        error = f"{cmd.container}: the started copy ended before its first progress record (exit code {code})"
        return CommandResult(command=cmd.id, ok=False, error=error, detail={"died": True})

    async def _start_from(self, spec: JobSpec, ckpt: Path | None, *, supersede: Supersede) -> ContainerInfo:
        spec = self.gpu_share.start_spec(spec)  # its MPS percentage, under mps and both
        return await start_or_fall_back(self.runtime, spec, ckpt, supersede=supersede)

    def _mark(self, cmd: Command) -> CommandResult:
        w = self.watched.get(cmd.container)
        if w is None:
            return CommandResult(command=cmd.id, ok=False, error=f"{cmd.container}: not on {self.worker}")
        w.state = self.classifier.mark_migrated(w.state, self.runtime.now())
        self.changed.add(cmd.container)
        self._save_states()
        return CommandResult(command=cmd.id, ok=True, finished_at=self.runtime.now())

    async def _stop(self, cmd: Command) -> CommandResult:
        try:
            await self.runtime.stop(cmd.container, grace=self.policy.migration.grace_period)
        except RuntimeFailure as exc:
            return CommandResult(command=cmd.id, ok=False, error=str(exc))
        return CommandResult(command=cmd.id, ok=True, finished_at=self.runtime.now())

    # -- persistence -------------------------------------------------------------------
    def _load_states(self) -> dict[ContainerId, MonitorState]:
        if self.state_file is None or not self.state_file.exists():
            return {}
        try:
            raw = json.loads(self.state_file.read_text())
            return {ContainerId(k): self.classifier.from_dict(v) for k, v in raw.items()}
        except (OSError, ValueError, StateError, AttributeError) as exc:
            log.warning("specon.agent.state_unreadable", path=str(self.state_file), error=str(exc))
            return {}

    def _save_states(self) -> None:
        for cid, w in self.watched.items():
            self.saved_states[cid] = w.state
        if self.state_file is None:
            return
        data = {cid: self.classifier.to_dict(st) for cid, st in self.saved_states.items()}
        try:
            ckpt.atomic_write(self.state_file, json.dumps(data).encode())
        except OSError as exc:
            # Classification and commands go on; only a restart would lose the latest states.
            self.counters.state_write_failures += 1
            log.warning("specon.agent.state_unwritable", path=str(self.state_file), error=str(exc))
