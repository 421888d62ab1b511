"""Priority on a GPU: which of the jobs sharing one GPU run, freeze, or are suspended.

A pure decision (no clock, no I/O): the jobs on one GPU with their weights under the node's
priority rule in, a ``GpuPlan`` out. The agent (``specon_agent.gpu_share``) applies it
through the runtime and the simulator runs the same function.

The rule, under ``mechanism`` ``freeze`` and ``both``:

- **Rank.** Jobs by weight, highest first. Among equal weights: a job that has waited
  longer than a quantum (longest first), then the running ones (the one switched in most
  recently first), then those that have waited a quantum or less. So equal weights take
  turns a quantum each, and a job frozen now never outranks, at the same instant, the job
  that displaced it (the plan is idempotent). Then the id, so the order is total.
- **Due.** Jobs are chosen in rank order while ``concurrency`` slots are left, each only
  where the chosen jobs' GPU memory stays within ``memory_total * (1 - memory_headroom)``
  (the first one chosen excepted if it already holds its memory: it holds it either way).
  So a suspended job resumes only when its memory fits, and a job that does not fit lets
  the next one run meanwhile.
- **Quanta.** A running job that has run ``quantum`` seconds or less keeps running in place
  of chosen jobs that do not run yet (the switch waits for the quantum), the lowest-ranked
  first, as many as its slot and memory need; never in place of a chosen job that already
  runs (freezing it to keep another would be a switch of its own). Slots left are filled
  again.
- **Memory.** Frozen jobs keep their GPU memory. While the running and frozen jobs' memory
  is over the budget, the frozen (or to-be-frozen) job of lowest rank is suspended
  (checkpoint and exit: Hermes's answer). A running job is never suspended to make room.
- **Exempt** jobs (one spanning several GPUs, one being saved, or one whose peers elsewhere
  would time out in their collectives) always run: never frozen nor suspended. They take no
  slot (the GPU is time-sliced between them and the jobs that run); their memory counts.

Under ``none`` (plain time-slicing, the DS baseline) and ``mps`` (percentages fixed at each
start, ``mps_percentage``) every job runs: frozen ones are thawed, nothing is frozen or
suspended, and a job left suspended (by an earlier policy) resumes as soon as its memory
fits, highest rank first. A suspended job is never forgotten: under every mechanism it is
resumed once it is due (or, without freezing, once it fits).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from specon.config.sections import GpuShareConfig
from specon.model import WEIGHT_MAX, WEIGHT_MIN, ContainerId, GpuState


@dataclass(frozen=True, slots=True)
class GpuJob:
    """One job on one GPU, as the plan needs it."""

    id: ContainerId
    # Its weight under the node's priority rule (1..10,000, as for CPU).
    weight: int
    # GPU bytes it holds now (running, frozen) or needs to come back (suspended).
    memory: int
    state: GpuState
    # When it entered its state (the caller's clock).
    since: float
    # Always runs: never frozen nor suspended (see the module's docstring).
    exempt: bool = False

    def __post_init__(self) -> None:
        if not WEIGHT_MIN <= self.weight <= WEIGHT_MAX:
            raise ValueError(f"{self.id}: weight must be in [{WEIGHT_MIN}, {WEIGHT_MAX}], got {self.weight}")
        if self.memory < 0:
            raise ValueError(f"{self.id}: memory must be >= 0, got {self.memory}")
        if self.state not in ("running", "frozen", "suspended"):
            raise ValueError(f"{self.id}: unknown state {self.state!r}")
        if not math.isfinite(self.since):
            raise ValueError(f"{self.id}: since must be finite, got {self.since}")


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """What to do on one GPU now. ``run`` in rank order; the other tuples name only the jobs
    whose state changes."""

    run: tuple[ContainerId, ...] = ()  # the jobs that run after this step
    freeze: tuple[ContainerId, ...] = ()  # running -> frozen
    thaw: tuple[ContainerId, ...] = ()  # frozen -> running
    suspend: tuple[ContainerId, ...] = ()  # -> suspended, lowest rank first
    resume: tuple[ContainerId, ...] = ()  # suspended -> running (restored on this worker)

    @property
    def changes(self) -> int:
        """How many jobs change state."""
        return len(self.freeze) + len(self.thaw) + len(self.suspend) + len(self.resume)


def freezes(cfg: GpuShareConfig) -> bool:
    """Whether ``cfg``'s mechanism freezes jobs (``freeze``, ``both``)."""
    return cfg.mechanism in ("freeze", "both")


def budget(memory_total: int, cfg: GpuShareConfig) -> float:
    """GPU bytes the running and frozen jobs may hold together (unbounded when the total is
    unknown: 0 or less)."""
    return math.inf if memory_total <= 0 else memory_total * (1.0 - cfg.memory_headroom)


def ranked(jobs: Iterable[GpuJob], cfg: GpuShareConfig, now: float) -> list[GpuJob]:
    """``jobs`` in priority order (the module's docstring: "Rank")."""

    def key(j: GpuJob) -> tuple[int, int, float, str]:
        if j.state == "running":
            tier, order = 1, -j.since  # switched in most recently first
        else:
            tier = 0 if now - j.since > cfg.quantum else 2
            order = j.since  # waiting longest first
        return -j.weight, tier, order, str(j.id)

    return sorted(jobs, key=key)


# Passes of ``plan`` at one instant: a suspension frees memory a waiting job may then take.
_PASSES = 4


def plan(jobs: Sequence[GpuJob], memory_total: int, cfg: GpuShareConfig, now: float) -> GpuPlan:
    """The plan for the jobs on one GPU of ``memory_total`` bytes at ``now``.

    Planned again on its own outcome until nothing changes (a suspension frees memory that a
    waiting job may take at once), so that the plan carried out is one the next pass at the same
    instant leaves alone. Raises ``ValueError`` for a job listed twice.
    """
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"jobs listed twice: {', '.join(dup)}")
    final = list(jobs)
    p = _plan_once(final, memory_total, cfg, now)
    for _ in range(_PASSES):
        if not p.changes:
            break
        final = after(final, p, now)
        p = _plan_once(final, memory_total, cfg, now)
    order = [j.id for j in ranked(jobs, cfg, now)]
    return _between(
        jobs, order, {j.id: j.state for j in final}, _plan_once(final, memory_total, cfg, now).run
    )


def _between(
    jobs: Sequence[GpuJob],
    order: list[ContainerId],
    end: dict[ContainerId, GpuState],
    run: tuple[ContainerId, ...],
) -> GpuPlan:
    """The plan that takes ``jobs`` (``order``: their rank) to the states ``end`` (a job
    suspended and due again within the passes is simply left running or resumed)."""
    start = {j.id: j.state for j in jobs}

    def moved(a: GpuState, b: GpuState) -> tuple[ContainerId, ...]:
        return tuple(c for c in order if start[c] == a and end[c] == b)

    return GpuPlan(
        run=tuple(c for c in run if end[c] == "running"),
        freeze=moved("running", "frozen"),
        thaw=moved("frozen", "running"),
        suspend=tuple(c for c in reversed(order) if start[c] != "suspended" and end[c] == "suspended"),
        resume=moved("suspended", "running"),
    )


def _plan_once(jobs: Sequence[GpuJob], memory_total: int, cfg: GpuShareConfig, now: float) -> GpuPlan:
    order = ranked(jobs, cfg, now)
    limit = budget(memory_total, cfg)
    # Without freezing: every resident job runs, and the suspended ones that fit.
    run = _run_set(order, cfg, now, limit) if freezes(cfg) else _fitting(order, order, limit)
    chosen = {j.id for j in run}
    rest = [j for j in order if j.id not in chosen]
    held = sum(j.memory for j in run) + sum(j.memory for j in rest if j.state != "suspended")
    suspend: list[GpuJob] = []
    for j in reversed(rest):  # lowest rank first
        if held <= limit:
            break
        if j.state != "suspended" and j.memory > 0:  # suspending frees its memory, or nothing
            suspend.append(j)
            held -= j.memory
    gone = {j.id for j in suspend}
    return GpuPlan(
        run=tuple(j.id for j in run),
        freeze=tuple(j.id for j in rest if j.state == "running" and j.id not in gone),
        thaw=tuple(j.id for j in run if j.state == "frozen"),
        suspend=tuple(j.id for j in suspend),
        resume=tuple(j.id for j in run if j.state == "suspended"),
    )


def _run_set(order: list[GpuJob], cfg: GpuShareConfig, now: float, limit: float) -> list[GpuJob]:
    """Under freezing: the jobs that run, in rank order (Due, Quanta, Memory).

    Greedy in rank order: every exempt job, then the others while slots are left, each only
    where the run set's memory stays within ``limit`` (a resident job that would not fit is
    frozen like any other, except when it is the first to run: it holds that memory either
    way). Then each running job within its quantum takes the place of chosen jobs that do
    not run yet, the lowest-ranked first, as many as its slot and memory take; slots left
    are filled again; last the exempt jobs left suspended that fit.
    """
    run = [j for j in order if j.exempt and j.state != "suspended"]
    exempt = len(run)
    _fill(run, order, cfg, limit, exempt)
    for j in order:
        if not j.exempt and j not in run and j.state == "running" and now - j.since <= cfg.quantum:
            _hold(run, j, cfg, limit, exempt)
    _fill(run, order, cfg, limit, exempt)  # slots and memory a swap left
    for j in order:  # an exempt job left suspended (by an earlier policy) where it fits
        if j.exempt and j.state == "suspended" and _sum(run) + j.memory <= limit:
            run.append(j)
    rank = {j.id: i for i, j in enumerate(order)}
    return sorted(run, key=lambda j: rank[j.id])


def _fits(run: list[GpuJob], j: GpuJob, cfg: GpuShareConfig, limit: float, exempt: int) -> bool:
    """Whether ``j`` may join ``run`` (whose first ``exempt`` jobs take no slot): a slot is
    free and its memory fits, or it is resident and the first to run (it holds that memory
    whether it runs or not)."""
    if len(run) - exempt >= cfg.concurrency:
        return False
    return _sum(run) + j.memory <= limit or (j.state != "suspended" and len(run) == exempt)


def _fill(run: list[GpuJob], order: list[GpuJob], cfg: GpuShareConfig, limit: float, exempt: int) -> None:
    """Add the jobs that may join ``run``, in rank order."""
    for j in order:
        if not j.exempt and j not in run and _fits(run, j, cfg, limit, exempt):
            run.append(j)


def _hold(run: list[GpuJob], j: GpuJob, cfg: GpuShareConfig, limit: float, exempt: int) -> None:
    """``j``, running within its quantum, takes the place of chosen jobs that do not run yet,
    the lowest-ranked first, as many as its slot and memory take; never of a running one."""
    trial = list(run)
    waiting = [d for d in run if d.state != "running" and not d.exempt]
    while waiting and not _fits(trial, j, cfg, limit, exempt):
        trial.remove(waiting.pop())
    if _fits(trial, j, cfg, limit, exempt):
        run[:] = [*trial, j]


def _sum(jobs: Iterable[GpuJob]) -> int:
    return sum(j.memory for j in jobs)


def _fitting(order: list[GpuJob], run: list[GpuJob], limit: float) -> list[GpuJob]:
    """``run`` (in rank order) less the suspended jobs whose memory does not fit beside its
    resident jobs and the suspended ones of higher rank that do; in rank order."""
    keep = [j for j in run if j.state != "suspended"]
    used = sum(j.memory for j in keep)
    for j in run:
        if j.state == "suspended" and used + j.memory <= limit:
            keep.append(j)
            used += j.memory
    rank = {j.id: i for i, j in enumerate(order)}
    return sorted(keep, key=lambda j: rank[j.id])


def after(jobs: Sequence[GpuJob], p: GpuPlan, now: float) -> list[GpuJob]:
    """``jobs`` once ``p`` is carried out at ``now`` (each changed job's ``since`` is now)."""
    new: dict[ContainerId, GpuState] = {}
    for cid in (*p.thaw, *p.resume):
        new[cid] = "running"
    for cid in p.freeze:
        new[cid] = "frozen"
    for cid in p.suspend:
        new[cid] = "suspended"
    return [replace(j, state=new[j.id], since=now) if j.id in new else j for j in jobs]


def mps_percentage(weight: int, others: Sequence[int], cfg: GpuShareConfig) -> int:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for a job starting with ``weight`` beside running
    jobs of weights ``others``: its share of the weights, at least ``mps_min_percentage``
    (100 alone, or where the mechanism uses no MPS). Fixed for the process's life (MPS reads
    it at the client's start), so it is decided at each start and restore."""
    if cfg.mechanism not in ("mps", "both"):
        return 100
    total = weight + sum(others)
    share = 100 if total <= 0 else math.floor(100 * weight / total + 0.5)
    return max(cfg.mps_min_percentage, min(100, share))
