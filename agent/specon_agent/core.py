"""The agent's work, without the network: watch containers, classify, execute commands.

``Agent`` owns one worker's runtime. ``tick`` tails every running container's progress
log and runs Algorithm 1 (through ``specon.policy.classifier``) for the whole worker;
``heartbeat`` builds the message the manager expects; ``execute`` carries out one
manager command, idempotently per command id, and queues its result until a reply
acknowledges it (``specon_agent.commands``). Monitor states are persisted after every
change, so a restarted agent keeps each container's category, pending request and
``migrated`` freeze. ``sample_usage`` also reads the worker's GPUs (``specon_agent.gpus``),
which the heartbeat reports.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import replace
from pathlib import Path

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
from specon.runtime.base import (
    ContainerInfo,
    ContainerState,
    JobSpec,
    Runtime,
)
from specon.runtime.gpu.nvml import NvmlReader
from specon.runtime.gpu.sample import GpuSample, gpu_capacity, gpu_labels
from specon.wire.limits import COUNT
from specon.wire.protocol import CommandBatch, CommandResult, Heartbeat
from specon.wire.status import Phase
from specon_agent.commands import Executing
from specon_agent.gpu_share import GpuShare, gpu_state_path
from specon_agent.gpus import GpuUsage, device_reports, gpu_use
from specon_agent.priority import Running, running_of
from specon_agent.reports import ended_report, running_report, suspended_reports
from specon_agent.taints_file import TaintsFile
from specon_agent.watched import AgentCounters, Watched, append_curve, declare_steps, predicted_steps
from specon_agent.weights import CpuWeights, state_path
from specon_agent.window import LossWindows

log = structlog.get_logger()

# Job labels that override the policy's progress settings for one job.
LABEL_METRIC = "specon.io/metric"
LABEL_DIRECTION = "specon.io/direction"
LABEL_FORMAT = "specon.io/format"


class Agent(Executing):
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
