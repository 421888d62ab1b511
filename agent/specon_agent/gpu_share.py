"""Priority on a GPU, its I/O shell: each tick, ``specon.policy.gpu_share``'s plan for every
GPU of the worker, carried out through the runtime (docs/gpu.md).

The jobs sharing a GPU are those NVML shows on it (``GpuSample``), weighed by the node's
priority rule among themselves, plus the jobs this agent suspended from it. A plan is carried
out in the order that frees the GPU first: freeze, suspend, thaw, resume. Freezing is
``Runtime.freeze`` (the whole job at once: its cgroup, or its process group, data-loader
workers included); suspending is ``Runtime.save`` (the job checkpoints and exits; the agent's
heartbeat reports it from this sharing's record, ``suspended``, the runtime listing it or not);
resuming is ``Runtime.start`` of this runtime's own record of
the job (``Runtime.job_spec``, never a spec from the wire) from the checkpoint it saved.

Never frozen nor suspended (they always run): a job on several GPUs, one being saved by a
command (``before_save``), and one whose processes are not all on this worker, as far as the
agent can tell: the job label ``specon.io/gpu-share: "off"``, or ``WORLD_SIZE`` over 1 in its
environment (its peers' NCCL collectives would time out while it stands still).

Which jobs are frozen or suspended is kept in a small file beside the monitor states, so a
restarted agent plans them again (and, without NVML, thaws and resumes them): a suspended
job is always resumed in the end. ``close`` thaws every frozen job. A runtime call that fails
is logged once per container, counted, and tried again at the next tick; it never stops the
agent.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from specon import checkpoint as ckpt
from specon.config.sections import GpuShareConfig
from specon.model import WEIGHT_DEFAULT, WEIGHT_MAX, WEIGHT_MIN, ContainerId, GpuState
from specon.policy.gpu_share import GpuJob, GpuPlan, mps_percentage, plan
from specon.policy.priority.rules import Settings, weights
from specon.runtime.base import AlreadyFinished, AlreadyRunning, JobSpec, Runtime, RuntimeFailure, StartFailed
from specon.runtime.gpu.sample import GpuSample
from specon.wire import codec
from specon_agent.priority import Running, progress

log = structlog.get_logger()

# A job label: "off" keeps the GPU sharing's hands off the job (it always runs).
GPU_SHARE_LABEL = "specon.io/gpu-share"
MPS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
_STATES: tuple[GpuState, ...] = ("running", "frozen", "suspended")
Toggle = Callable[[ContainerId], Awaitable[bool]]  # Runtime.freeze, Runtime.thaw


def gpu_state_path(monitor_file: Path) -> Path:
    """Where the GPU sharing's state lives beside the monitor states (``monitor.gpu.json``)."""
    return monitor_file.with_name(f"{monitor_file.stem}.gpu.json")


def exempt(spec: JobSpec | None) -> bool:
    """Whether ``spec``'s job must never be frozen nor suspended (the module's docstring)."""
    if spec is None:
        return False
    if dict(spec.labels).get(GPU_SHARE_LABEL, "").lower() in ("off", "false", "no"):
        return True
    world = dict(spec.env).get("WORLD_SIZE", "1").strip()
    return not world.isdigit() or int(world) > 1


def with_mps(spec: JobSpec, percentage: int) -> JobSpec:
    """``spec`` starting as an MPS client limited to ``percentage`` of the GPU's SMs."""
    env = tuple((k, v) for k, v in spec.env if k != MPS_ENV)
    return replace(spec, env=(*env, (MPS_ENV, str(percentage))))


@dataclass(slots=True)
class Tracked:
    """A job on one of this worker's GPUs, as the sharing last left it."""

    device: int
    memory: int
    state: GpuState
    since: float
    checkpoint: str | None = None  # suspended: the checkpoint it saved
    # What the priority rule saw of it last (a suspended job is still weighed).
    progress: Running | None = None
    # Its spec as this worker ran it: a suspended job's heartbeat report is built from it.
    spec: JobSpec | None = None


@dataclass(slots=True)
class GpuShareCounters:
    """For /metrics (``specon_agent_gpu_<name>_total``)."""

    switches: int = 0  # plans that changed which jobs run on a GPU
    freezes: int = 0
    thaws: int = 0
    suspends: int = 0
    resumes: int = 0
    failures: int = 0  # runtime calls that failed (each retried at the next tick)
    last_plan: dict[int, GpuPlan] = field(default_factory=dict)  # per device


class GpuShare:
    """One worker's GPU sharing. ``states`` says what it does with each job it knows."""

    def __init__(
        self,
        runtime: Runtime,
        cfg: GpuShareConfig,
        *,
        state_file: Path | None = None,
        grace: float = 30.0,
        states: dict[ContainerId, GpuState] | None = None,
    ) -> None:
        self.runtime = runtime
        self.cfg = cfg
        self.state_file = state_file
        self.grace = grace
        self.jobs: dict[ContainerId, Tracked] = {}
        # Each known job's state (the heartbeat's ``GpuUse.state``); the agent core may hand
        # in its own dict (``Agent.gpu_states``): it is updated in place.
        self.states: dict[ContainerId, GpuState] = {} if states is None else states
        self.counters = GpuShareCounters()
        self._saving: set[ContainerId] = set()  # a save command's, until the job is gone
        self._failing: set[ContainerId] = set()  # logged once until it works again
        self._load()

    # -- each tick -----------------------------------------------------------------------
    async def step(
        self,
        now: float,
        *,
        sample: GpuSample | None,
        running: Sequence[Running],
        fair: Mapping[ContainerId, float],
        priority: Settings,
        specs: Mapping[ContainerId, JobSpec],
        shares: Mapping[str, float] | None = None,
    ) -> None:
        """One tick for every GPU: ``running`` are the worker's running jobs as the CPU
        priority sees them (``Agent.running_jobs``), ``fair`` their fair seconds, ``specs``
        their specs, ``shares`` each model's quality point on the cluster (as the CPU
        weights'). Without a sample (no NVML) nothing is shared: what this agent froze or
        suspended before is thawed and resumed."""
        live = {r.id: r for r in running}
        self._saving &= live.keys()
        for cid in [c for c, t in self.jobs.items() if t.state != "suspended" and c not in live]:
            del self.jobs[cid]  # ended, saved away or forgotten: nothing of it is ours now
        groups = self._groups(sample, live, specs)
        for device, (members, total) in sorted(groups.items()):
            weighed = self._weights([m[0] for m in members], fair, priority, shares)
            jobs = [
                GpuJob(
                    id=r.id,
                    weight=weighed[r.id],
                    memory=t.memory,
                    state=t.state,
                    since=t.since,
                    exempt=ex or r.id in self._saving,
                )
                for r, t, ex in members
            ]
            await self.tick(now, jobs, total, device=device)
        self._publish()
        self._save()

    def _groups(
        self,
        sample: GpuSample | None,
        live: Mapping[ContainerId, Running],
        specs: Mapping[ContainerId, JobSpec],
    ) -> dict[int, tuple[list[tuple[Running, Tracked, bool]], int]]:
        """Per device: its jobs (progress, tracked state, exempt) and its memory in bytes."""
        totals = {} if sample is None else {d.index: d.memory_total for d in sample.devices}
        uses = {} if sample is None else dict(sample.containers)
        out: dict[int, tuple[list[tuple[Running, Tracked, bool]], int]] = {}
        for cid, r in live.items():
            use, t = uses.get(cid), self.jobs.get(cid)
            if t is None and r.step is None:
                continue  # still starting: a freeze could stop its launcher before it joins its budget
            seen = use is not None and bool(use.devices)
            if seen and t is not None and t.state == "suspended" and not read_after(sample, t.since):
                use, seen = None, False  # read while it was being saved: no news of it since
            if use is not None and seen:
                device, many = use.devices[0], len(use.devices) > 1
                memory = use.memory
            elif t is not None:  # ours, not (yet) seen by NVML: a job resuming
                device, many, memory = t.device, False, t.memory
            else:
                continue  # no GPU process: not ours to share
            if t is None:
                t = self.jobs[cid] = Tracked(device, memory, "running", r.started)
            elif t.state == "suspended" and (seen or r.started > t.since):
                # It runs again (a command's start): a read begun after its suspension sees it,
                # or it started after its suspension. Listed without either, it is the monitor's
                # view from before the save (a tick old), and it stays suspended: flipped, it
                # would be forgotten. So is a read begun before the save ended (the GPU loop
                # reads while the monitor tick's pass is saving it).
                t.state, t.since = "running", r.started
            t.device, t.memory, t.progress = device, memory, r
            t.spec = specs.get(cid, t.spec)
            devices = use.devices if use is not None and many else (device,)
            for d in devices:
                out.setdefault(d, ([], totals.get(d, 0)))[0].append((r, t, many or exempt(specs.get(cid))))
        for cid, t in self.jobs.items():
            if t.state == "suspended" and cid not in live:
                r = t.progress or Running(id=cid, started=t.since)
                out.setdefault(t.device, ([], totals.get(t.device, 0)))[0].append((r, t, False))
        if sample is None:
            # No NVML: nothing to share by; everything ours runs again (memory unknown).
            for members, _ in out.values():
                for i, (r, t, _ex) in enumerate(members):
                    members[i] = (r, t, True)
        return out

    @staticmethod
    def _weights(
        jobs: Sequence[Running],
        fair: Mapping[ContainerId, float],
        priority: Settings,
        shares: Mapping[str, float] | None = None,
    ) -> dict[ContainerId, int]:
        """The rule's weights among the jobs of one GPU (the default where it gives none)."""
        try:
            got = weights(progress(jobs, fair, shares), priority)
        except Exception as exc:  # a rule's bug must not stop the sharing: all equal
            log.warning("specon.agent.gpu_weights_failed", error=f"{type(exc).__name__}: {exc}")
            got = {}
        return {r.id: min(WEIGHT_MAX, max(WEIGHT_MIN, int(got.get(r.id, WEIGHT_DEFAULT)))) for r in jobs}

    async def tick(
        self, now: float, jobs: Sequence[GpuJob], memory_total: int, *, device: int = 0
    ) -> GpuPlan:
        """Plan the jobs of one GPU (``memory_total`` bytes; 0: unknown) and carry it out."""
        for j in jobs:  # the caller's word on each job is the plan's input: keep it
            t = self.jobs.setdefault(j.id, Tracked(device, j.memory, j.state, j.since))
            t.memory, t.state, t.since = j.memory, j.state, j.since
        p = plan(jobs, memory_total, self.cfg, now)
        self.counters.last_plan[device] = p
        if not p.changes:
            return p
        self.counters.switches += 1
        log.info(
            "specon.agent.gpu_plan",
            device=device,
            run=list(p.run),
            freeze=list(p.freeze),
            thaw=list(p.thaw),
            suspend=list(p.suspend),
            resume=list(p.resume),
        )
        weight = {j.id: j.weight for j in jobs}
        for cid in p.freeze:
            await self._freeze(cid, now)
        for cid in p.suspend:
            await self._suspend(cid, now)
        for cid in p.thaw:
            await self._thaw(cid, now)
        for cid in p.resume:
            others = [weight[c] for c in p.run if c != cid and self._state(c) == "running"]
            await self._resume(cid, now, mps_percentage(weight[cid], others, self.cfg))
        self._publish()
        return p

    def suspended(self) -> dict[ContainerId, Tracked]:
        """The jobs it holds suspended: they run nowhere now and come back here when due."""
        return {cid: t for cid, t in self.jobs.items() if t.state == "suspended"}

    # -- hooks and shutdown --------------------------------------------------------------
    def start_spec(self, spec: JobSpec) -> JobSpec:
        """``spec`` as a start here runs it: under ``mps`` and ``both`` a GPU job starts as an MPS
        client with the share a job of the default weight has beside those running now."""
        if self.cfg.mechanism not in ("mps", "both") or spec.requests.gpu < 1 or exempt(spec):
            return spec
        running = [t for c, t in self.jobs.items() if t.state == "running" and c != spec.id]
        others = [WEIGHT_DEFAULT] * len(running)
        return with_mps(spec, mps_percentage(WEIGHT_DEFAULT, others, self.cfg))

    async def before_save(self, cid: ContainerId) -> None:
        """Call before a save command's ``Runtime.save`` of ``cid``: a frozen job is thawed
        (it must run to checkpoint) and is left alone until it is gone."""
        self._saving.add(cid)
        if self._state(cid) == "frozen":
            await self._thaw(cid, self.runtime.now())
            self._publish()
            self._save()

    async def close(self) -> None:
        """Thaw every frozen job (the agent is leaving: time-slicing from now). Suspended
        jobs stay recorded: the next agent on this worker resumes them."""
        for cid in sorted(c for c, t in self.jobs.items() if t.state == "frozen"):
            await self._thaw(cid, self.runtime.now())
        self._publish()
        self._save()

    # -- carrying a plan out -------------------------------------------------------------
    def _state(self, cid: ContainerId) -> GpuState | None:
        t = self.jobs.get(cid)
        return None if t is None else t.state

    def _set(self, cid: ContainerId, state: GpuState, now: float) -> None:
        t = self.jobs.get(cid)
        if t is not None:
            t.state, t.since = state, now

    async def _freeze(self, cid: ContainerId, now: float) -> None:
        t = self.jobs.get(cid)
        if t is None or cid in self._saving:
            return  # a save command took it meanwhile
        # Recorded (on disk too) before the call: whatever stops this agent midway, the job
        # is thawed by ``close`` or by the next agent, never left frozen and unknown.
        before = t.since
        self._set(cid, "frozen", now)
        self._save()
        if await self._call("freeze", cid, self.runtime.freeze):
            self.counters.freezes += 1
            self._publish()
        else:
            t.state, t.since = "running", before

    async def _thaw(self, cid: ContainerId, now: float) -> None:
        if await self._call("thaw", cid, self.runtime.thaw):
            self._set(cid, "running", now)
            self.counters.thaws += 1
            self._publish()

    async def _suspend(self, cid: ContainerId, now: float) -> None:
        t = self.jobs.get(cid)
        if t is None or cid in self._saving:
            return
        if t.state == "frozen":  # it must run to checkpoint (SIGTERM waits for a thaw)
            if not await self._call("thaw", cid, self.runtime.thaw):
                return
            self._set(cid, "running", now)
        # Recorded before the save, like a freeze: a job that exits is never forgotten (if
        # the save fails after all, a resume finds it running and lets it be).
        self._set(cid, "suspended", now)
        self._save()
        try:
            res = await self.runtime.save(cid, grace=self.grace)
        except Exception as exc:  # RuntimeFailure, or a backend's bug: it keeps running
            self._set(cid, "running", now)
            self._failed("suspend", cid, exc)
            return
        self._worked(cid)
        if res.finished:
            self.jobs.pop(cid, None)  # nothing left to resume
            return
        t.since = self.runtime.now()
        t.checkpoint = None if res.checkpoint is None else str(res.checkpoint)
        self.counters.suspends += 1
        self._publish()
        log.info(
            "specon.agent.gpu_suspended", container=cid, step=res.step, memory=t.memory, seconds=res.seconds
        )

    async def _resume(self, cid: ContainerId, now: float, percentage: int) -> None:
        t = self.jobs.get(cid)
        if t is None:
            return
        try:
            spec = await asyncio.to_thread(self.runtime.job_spec, cid)
        except Exception as exc:
            self._failed("resume", cid, exc)
            return
        if spec is None or spec.id != cid:
            # Without this runtime's own record nothing may be started: said loudly, once.
            log.error("specon.agent.gpu_resume_impossible", container=cid, reason="no job spec on record")
            self.counters.failures += 1
            self.jobs.pop(cid, None)
            return
        if self.cfg.mechanism in ("mps", "both"):
            spec = with_mps(spec, percentage)
        checkpoint = None if t.checkpoint is None else Path(t.checkpoint)
        try:
            try:
                await self.runtime.start(spec, checkpoint=checkpoint)
            except StartFailed as exc:
                if checkpoint is None or isinstance(exc, AlreadyRunning | AlreadyFinished):
                    raise
                # That checkpoint no longer verifies: the newest complete one instead.
                log.warning("specon.agent.gpu_resume_fallback", container=cid, checkpoint=str(checkpoint))
                await self.runtime.start(spec, checkpoint=None)
        except (AlreadyRunning, AlreadyFinished) as exc:
            # It runs (a command started it) or has nothing left to do: not ours any more.
            log.info("specon.agent.gpu_resume_unneeded", container=cid, reason=str(exc))
            self._worked(cid)
            self.jobs.pop(cid, None)
            return
        except Exception as exc:  # RuntimeFailure or a bug: it stays suspended, tried again
            self._failed("resume", cid, exc)
            return
        self._worked(cid)
        t.state, t.since = "running", now
        self.counters.resumes += 1
        self._publish()
        log.info("specon.agent.gpu_resumed", container=cid, checkpoint=t.checkpoint, mps=percentage)

    async def _call(
        self, what: str, cid: ContainerId, call: Callable[[ContainerId], Awaitable[bool]]
    ) -> bool:
        try:
            ok = bool(await call(cid))
            error: BaseException | str | None = None if ok else "the runtime could not (its log says why)"
        except Exception as exc:  # a backend's bug: counted and logged, never fatal
            ok, error = False, exc
        if ok:
            self._worked(cid)
            log.debug(f"specon.agent.gpu_{what}", container=cid)
            return True
        self._failed(what, cid, error)
        return False

    def _worked(self, cid: ContainerId) -> None:
        self._failing.discard(cid)

    def _failed(self, what: str, cid: ContainerId, error: BaseException | str | None) -> None:
        self.counters.failures += 1
        if cid in self._failing:
            return
        self._failing.add(cid)
        text = error if isinstance(error, str) or error is None else f"{type(error).__name__}: {error}"
        if isinstance(error, RuntimeFailure):
            text = str(error)
        log.warning(f"specon.agent.gpu_{what}_failed", container=cid, error=text)

    def _publish(self) -> None:
        """``states`` in place (a dict the agent core may share): at the end of a tick and as
        each freeze, thaw, suspend or resume is done and counted, so the gauges agree with the
        counters and events (not before the call: a state recorded ahead of it is not yet so)."""
        self.states.clear()
        self.states.update({cid: t.state for cid, t in self.jobs.items()})

    # -- persistence -----------------------------------------------------------------------
    def _load(self) -> None:
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            raw: Any = json.loads(self.state_file.read_text())
            jobs = {ContainerId(str(cid)): _tracked(v) for cid, v in raw["jobs"].items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("specon.agent.gpu_state_unreadable", path=str(self.state_file), error=str(exc))
            return
        self.jobs = jobs
        self._publish()

    def _save(self) -> None:
        if self.state_file is None:
            return
        kept = {cid: t for cid, t in self.jobs.items() if t.state != "running"}
        data = {"jobs": {cid: _tracked_data(t) for cid, t in sorted(kept.items())}}
        try:
            ckpt.atomic_write(self.state_file, json.dumps(data, sort_keys=True).encode())
        except OSError as exc:  # the sharing goes on; only a restart would lose what it holds
            log.warning("specon.agent.gpu_state_unwritable", path=str(self.state_file), error=str(exc))


def read_after(sample: GpuSample | None, when: float) -> bool:
    """Whether ``sample``'s read began after ``when`` (one of unknown time counts as after)."""
    return sample is not None and (sample.at is None or sample.at > when)


def _tracked_data(t: Tracked) -> dict[str, Any]:
    return {
        "device": t.device,
        "memory": t.memory,
        "state": t.state,
        "since": t.since,
        "checkpoint": t.checkpoint,
        "progress": None if t.progress is None else codec.to_data(t.progress),
        "spec": None if t.spec is None else t.spec.to_json(),
    }


def _tracked(v: Any) -> Tracked:
    """One job of the state file; ``ValueError`` (or a ``TypeError``/``KeyError``) when bad."""
    state, since = v["state"], float(v["since"])
    device, memory = int(v["device"]), int(v["memory"])
    if state not in _STATES or not math.isfinite(since) or device < 0 or memory < 0:
        raise ValueError(f"bad GPU sharing record: {v!r}")
    checkpoint = v.get("checkpoint")
    prog = v.get("progress")
    return Tracked(
        device=device,
        memory=memory,
        state=state,
        since=since,
        checkpoint=None if checkpoint is None else str(checkpoint),
        progress=None if prog is None else codec.from_data(Running, prog),
        spec=None if v.get("spec") is None else JobSpec.from_json(v["spec"]),
    )
