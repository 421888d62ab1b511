"""Simulated GPUs: how the jobs that share one device progress, and what a suspend costs.

A GPU job (``JobPlan.gpu``) runs on one device of its worker; its ``step_cost`` is seconds
per step alone on that device. It takes no CPU share from the worker's CPU jobs (its
progress is the GPU's; the loop that feeds it is assumed to find a core). The jobs of one
device are in one of ``specon.model.GpuState``: running, frozen (no progress, memory kept)
or suspended (checkpointed and exited: no progress, no memory), as the agent's GPU sharing
decision (``specon.policy.gpu_share.plan``, the same pure code as the agent's) leaves them
under the policy's ``gpu`` section. Rates, measured on one H100 80GB (docs INFRA.md, "GPU";
``GpuParams`` holds the figures and says where each comes from):

* time-slicing (mechanism ``none``, ``freeze``): the n ready running jobs of a device split
  it in equal time slices, each ``1/n`` of ``slice_aggregate`` (n >= 2) of its rate alone;
  one alone runs at its full rate. Only n = 2 was measured (27.0 + 27.0 steps/s against
  57.6 alone: 94 %); the same aggregate is assumed for n > 2, as the context-switch loss
  is paid once per slice whatever the number of jobs;
* MPS (``mps``, ``both``): each job's rate is ``min(1, pct/100)`` of alone, ``pct`` its
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (``gpu_share.mps_percentage``), fixed when the
  process starts (first start, arrival after a move, resume); together never more than
  ``mps_aggregate`` (scaled down evenly where they would);
* a frozen job's runners get the device as above (SIGSTOP or the cgroup freezer gave the
  other job its full rate within 0.05 s: switching is instant here);
* a suspend stops the job at once and frees its memory; it runs again ``save + restore``
  after, at the earliest (``GpuParams.resume_delay``), from a primed standby process or
  cold (``GpuParams.standby``). A move of a GPU job costs the same.

``GpuSlot`` is one job's GPU state, ``Device`` one device's jobs, ``GpuModel`` applies a
worker's plans and rates its jobs (``specon.sim.cluster`` calls it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specon.config.sections import GpuShareConfig
from specon.model import WEIGHT_DEFAULT, ContainerId, GpuState
from specon.policy.gpu_share import GpuJob, GpuPlan, mps_percentage, plan

GB = 1e9  # the figures below are per decimal gigabyte of checkpoint
GIB = 2**30  # scenario files give GPU memory in GiB (as nvidia-smi's MiB)


@dataclass(frozen=True, slots=True)
class GpuParams:
    """The GPU law, measured on one H100 80GB HBM3 with plain PyTorch jobs (INFRA.md, "GPU").

    * ``slice_aggregate``: two saturating jobs time-sliced ran 27.0 steps/s each against 57.6
      alone, (27.0 + 27.0) / 57.6 = 0.94; assumed for more jobs too.
    * ``mps_aggregate``: MPS clients at 90 % and 10 % ran 51.0 and 5.8 steps/s against 57.6
      alone, 0.986 together.
    * ``restore_cold``, ``restore_cold_per_gb``: a job restored into a fresh process reached
      its first step 9.7-10.5 s (GRU, 1.9 MB checkpoint), 9.8-13.4 s (conv net, 3.6 MB) and
      14.2-15.8 s (MLP, 1.2 GB) after the start: 10.9 s + 3.4 s per GB of checkpoint passes
      through the three midpoints (10.1, 11.6, 15.0) within 0.8 s.
    * ``restore_standby``, ``restore_standby_per_gb``: from a primed standby process, 0.10 s,
      0.24 s and 2.99 s for the same three: 0.17 s + 2.35 s per GB.
    * ``save_per_gb``: saving the MLP's 1.2 GB state took 3.0 s (the small ones: not
      measured, taken as proportional).
    * ``checkpoint_ratio``: a job that declares no checkpoint size has this fraction of its
      GPU memory (the MLP: 1.2 GB of checkpoint, 4.5 GB resident).
    * ``standby``: restores (resume, and the arrival of a moved GPU job) use a primed standby
      process per GPU (specon's agents keep one); False: cold.
    """

    slice_aggregate: float = 0.94
    mps_aggregate: float = 0.986
    restore_cold: float = 10.9
    restore_cold_per_gb: float = 3.4
    restore_standby: float = 0.17
    restore_standby_per_gb: float = 2.35
    save_per_gb: float = 2.5
    checkpoint_ratio: float = 0.27
    standby: bool = True

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be in (0, 1], got {value}"
            for name, value in (
                ("slice_aggregate", self.slice_aggregate),
                ("mps_aggregate", self.mps_aggregate),
                ("checkpoint_ratio", self.checkpoint_ratio),
            )
            if not (math.isfinite(value) and 0 < value <= 1)
        ]
        problems += [
            f"{name} must be >= 0, got {value}"
            for name, value in (
                ("restore_cold", self.restore_cold),
                ("restore_cold_per_gb", self.restore_cold_per_gb),
                ("restore_standby", self.restore_standby),
                ("restore_standby_per_gb", self.restore_standby_per_gb),
                ("save_per_gb", self.save_per_gb),
            )
            if not (math.isfinite(value) and value >= 0)
        ]
        if problems:
            raise ValueError("; ".join(problems))

    def save_time(self, checkpoint: int) -> float:
        """Seconds to save a checkpoint of ``checkpoint`` bytes (the job holds its memory)."""
        return self.save_per_gb * checkpoint / GB

    def restore_time(self, checkpoint: int) -> float:
        """Seconds from the hand-over of a checkpoint of ``checkpoint`` bytes to the first step."""
        if self.standby:
            return self.restore_standby + self.restore_standby_per_gb * checkpoint / GB
        return self.restore_cold + self.restore_cold_per_gb * checkpoint / GB

    def move_downtime(self, checkpoint: int) -> float:
        """A GPU job's move: saved on the source, restored on the target."""
        return self.save_time(checkpoint) + self.restore_time(checkpoint)


@dataclass(slots=True, eq=False)
class GpuSlot:
    """One GPU job's state on its device (mutable, never leaves the simulator)."""

    memory: int  # bytes it holds while running or frozen
    checkpoint: int  # bytes a save writes
    device: int = -1  # its device on its worker; -1: not on one
    state: GpuState = "running"
    since: float = 0.0  # when it entered ``state``
    ready: float = 0.0  # a resumed job runs from then on (restore); before, rate 0
    saved: float = 0.0  # a suspended job's save is done then
    pct: int = 100  # its MPS percentage (fixed at its process's start)
    share: float = 0.0  # of its device's rate alone it gets now
    fair: float = 0.0  # an equal time slice of its device now (attained-service rules)


@dataclass(slots=True, eq=False)
class Device:
    index: int
    memory: int  # bytes
    jobs: dict[str, GpuSlot] = field(default_factory=dict)  # insertion order: deterministic


@dataclass(slots=True)
class GpuStats:
    freezes: int = 0
    thaws: int = 0
    suspends: int = 0
    resumes: int = 0
    # Plans that left the running jobs of a device over its memory (mechanism none/mps or an
    # unfittable set): real jobs would fail to allocate; the simulator only counts it.
    over_memory: int = 0


class GpuModel:
    """The GPU side of a run: one sharing config (the policy's ``gpu`` section) and law."""

    def __init__(self, params: GpuParams, cfg: GpuShareConfig | None) -> None:
        self.params = params
        # None: no specon agent (DS), so nothing ever freezes, suspends or sets MPS shares.
        self.cfg = cfg
        self.mps = cfg is not None and cfg.mechanism in ("mps", "both")
        self.stats = GpuStats()

    @property
    def planned(self) -> bool:
        """Whether an agent applies the sharing decision (else every job just runs)."""
        return self.cfg is not None

    @staticmethod
    def attach(devices: Sequence[Device], jid: str, slot: GpuSlot, now: float) -> Device:
        """Put ``jid`` on the device with the fewest jobs (lowest index first), running."""
        dev = min(devices, key=lambda d: (len(d.jobs), d.index))
        slot.device, slot.state, slot.since = dev.index, "running", now
        slot.ready = max(slot.ready, now)
        dev.jobs[jid] = slot
        return dev

    def started(self, dev: Device, jid: str, weights: Mapping[str, int]) -> None:
        """``jid``'s process starts on ``dev`` now: under MPS its percentage is set beside the
        device's other running jobs, for the life of the process."""
        if self.cfg is None or not self.mps:
            return
        others = [
            weights.get(j, WEIGHT_DEFAULT) for j, s in dev.jobs.items() if j != jid and s.state == "running"
        ]
        dev.jobs[jid].pct = mps_percentage(weights.get(jid, WEIGHT_DEFAULT), others, self.cfg)

    @staticmethod
    def detach(devices: Sequence[Device], jid: str, slot: GpuSlot) -> None:
        if slot.device >= 0:
            del devices[slot.device].jobs[jid]
        slot.device, slot.state, slot.share, slot.fair = -1, "running", 0.0, 0.0

    def replan(self, dev: Device, weights: Mapping[str, int], now: float) -> bool:
        """Apply the sharing decision to ``dev``'s jobs; whether any changed state."""
        if self.cfg is None or not dev.jobs:
            return False
        jobs = [
            GpuJob(ContainerId(j), int(weights.get(j, WEIGHT_DEFAULT)), s.memory, s.state, s.since)
            for j, s in dev.jobs.items()
        ]
        p = plan(jobs, dev.memory, self.cfg, now)
        self._apply(dev, p, weights, now)
        return bool(p.freeze or p.thaw or p.suspend or p.resume)

    def _apply(self, dev: Device, p: GpuPlan, weights: Mapping[str, int], now: float) -> None:
        """Carry ``p`` out (only ``replan`` calls it, with a config)."""
        jobs, st = dev.jobs, self.stats
        for cid in p.freeze:
            jobs[cid].state, jobs[cid].since = "frozen", now
            st.freezes += 1
        for cid in p.thaw:
            jobs[cid].state, jobs[cid].since = "running", now
            st.thaws += 1
        for cid in p.suspend:
            s = jobs[cid]
            # A running job stops at once; its memory is counted free (the save holds it a
            # little longer: it delays the resume instead, ``saved``).
            s.state, s.since, s.saved = "suspended", now, now + self.params.save_time(s.checkpoint)
            st.suspends += 1
        for cid in p.resume:
            s = jobs[cid]
            s.state, s.since = "running", now
            s.ready = max(now, s.saved) + self.params.restore_time(s.checkpoint)
            self.started(dev, cid, weights)
            st.resumes += 1
        held = sum(s.memory for s in jobs.values() if s.state != "suspended")
        if held > dev.memory:
            st.over_memory += 1

    def rate(self, dev: Device, now: float) -> float:
        """Set each job's ``share`` and ``fair`` on ``dev``; the next time a restoring job
        becomes ready (inf: none), when the shares change again."""
        ready = [s for s in dev.jobs.values() if s.state == "running" and s.ready <= now]
        n = len(ready)
        equal = 1.0 if len(dev.jobs) <= 1 else self.params.slice_aggregate / len(dev.jobs)
        if self.mps and n:
            wanted = [min(1.0, s.pct / 100) for s in ready]
            total = sum(wanted)
            cap = 1.0 if n == 1 else self.params.mps_aggregate
            scale = min(1.0, cap / total) if total > 0 else 0.0
            shares = [x * scale for x in wanted]
        else:
            shares = [1.0 if n <= 1 else self.params.slice_aggregate / n] * n
        for s in dev.jobs.values():
            s.share, s.fair = 0.0, equal
        for s, x in zip(ready, shares, strict=True):
            s.share = x
        pending = [s.ready for s in dev.jobs.values() if s.state == "running" and s.ready > now]
        return min(pending, default=math.inf)


def devices_of(worker: HasGpus) -> list[Device]:
    """A worker's devices, all of its ``gpu_memory`` bytes."""
    return [Device(i, worker.gpu_memory) for i in range(worker.gpus)]


class HasGpus(Protocol):
    @property
    def gpus(self) -> int: ...
    @property
    def gpu_memory(self) -> int: ...
