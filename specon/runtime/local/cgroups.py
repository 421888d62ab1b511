"""A local worker's CPU budget, its jobs' CPU weights, CPU accounting and freezing: cgroup v2,
else cgroup v1, else CPU affinity, else none.

Each worker is a CPU budget, ``<own>/<parent>/<cluster>/<worker>`` below the agent's own group
(so nesting works inside a container too): on cgroup v2 one group (``cgroup_v2``: ``cpu.max``,
``cpu.weight``, ``cpu.stat``, controllers delegated level by level), on cgroup v1 the same
path in the ``cpu`` and ``cpuacct`` hierarchies (``cgroup_v1``: ``cpu.cfs_quota_us``,
``cpu.shares``, ``cpuacct.usage``). Jobs join race-free: a job's launcher writes ``0`` into
each ``cgroup.procs`` (``CpuBudget.entry``, ``cgroup_entry.enter``) before it forks the job.

Each job has a group of its own below its worker's (``<worker>/job-<id>``): its CPU weight
among the worker's jobs, its CPU seconds, and where it is frozen (``freezer``; on v1 the
``freezer`` hierarchy holds a group of the same path). Weights decide only among tasks that
wait for the same CPU (INFRA.md measured 0.247/0.253 CPU for 1024 vs 2 shares on two unpinned
CPUs, 0.499/0.001 pinned to one), so the first weight set also pins the worker to
``ceil(cpus)`` CPUs (``specon.runtime.local.cpuset``).

Where cgroups are not usable (not root, not mounted, a controller not delegated) the budget
falls back to CPU affinity (a subset of ``ceil(cpus)`` CPUs) or to no limit, with a
``specon.runtime.cgroups_unavailable`` warning that says what is missing, and CPU use is
summed from ``/proc/<pid>/stat`` of the worker's process groups. Every path root is a
parameter, so detection and the group files can be exercised against a temporary tree.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import structlog

from specon.model import ContainerId
from specon.runtime.local.cgroup_entry import Entry, make_entry
from specon.runtime.local.cgroup_files import (
    CGROUP_ROOT,
    JOB_PREFIX,
    MIN_QUOTA_US,
    PERIOD_US,
    BudgetGroup,
    make_group,
    quota_us,
)
from specon.runtime.local.cgroup_v1 import CpuGroup, Detection, detect
from specon.runtime.local.cgroup_v2 import UnifiedGroup, delegate, detect_unified, is_unified
from specon.runtime.local.cpuset import CpusetGroup, detect_cpuset, least_loaded, pin_tasks
from specon.runtime.local.freezer import FreezeMode, Freezer, detect_v1_freezer
from specon.runtime.local.procfs import (
    CLK_TCK,
    PROC,
    GroupCpuMeter,
    ProcStat,
    all_stats,
    boot_id,
    group_alive,
    group_members,
    own_cgroups,
    parse_stat,
    process_alive,
    read_stat,
)

__all__ = [  # the names other modules import from here, wherever they are defined now
    "CGROUP_ROOT",
    "CLK_TCK",
    "JOB_PREFIX",
    "MIN_QUOTA_US",
    "PERIOD_US",
    "PROC",
    "PRUNE_GRACE",
    "CpuBudget",
    "CpuGroup",
    "Detection",
    "Enforcement",
    "GroupCpuMeter",
    "Mode",
    "ProcStat",
    "all_stats",
    "boot_id",
    "detect",
    "group_alive",
    "own_cgroups",
    "parse_stat",
    "pick_cpus",
    "process_alive",
    "quota_us",
    "read_stat",
]

# Seconds a job's group is kept before an agent may prune it as unused (a launch by another
# process takes well under a second between making the group and joining it).
PRUNE_GRACE = 60.0

log = structlog.get_logger()

Mode = Literal["auto", "cgroup", "affinity", "none"]
Group = CpuGroup | UnifiedGroup


class Enforcement(enum.StrEnum):
    CGROUP = "cgroup"
    AFFINITY = "affinity"
    NONE = "none"


_HINT = "run the agent as root, or in a delegated systemd scope (systemd-run --scope -p Delegate=yes)"


def _v1_freezer(path: Sequence[str], root: Path, proc: Path, freezing: FreezeMode) -> CpuGroup | None:
    """The worker's group in a writable cgroup-v1 ``freezer`` hierarchy, made here; None
    without one (or with ``freezing`` signal): its jobs are frozen by signals."""
    base = None if freezing == "signal" else detect_v1_freezer(root=root, proc=proc)
    if base is None:
        return None
    group = CpuGroup(base.joinpath(*path), base.joinpath(*path), len(path))
    try:
        make_group(group.cpu_dir)
    except OSError as exc:
        log.warning("specon.runtime.freezer_unavailable", group=str(group.cpu_dir), error=str(exc))
        return None
    return group


def _budget_group(_: Group) -> BudgetGroup:
    return _  # mypy proves both group kinds satisfy the one interface


# -- affinity -----------------------------------------------------------------------------
def pick_cpus(cpus: float, available: Sequence[int], *, offset: int = 0) -> frozenset[int]:
    """``ceil(cpus)`` CPUs from ``available`` (at least one), rotated by ``offset``.

    Affinity cannot express fractions: a 0.5-CPU worker gets one whole CPU.
    """
    pool = sorted(available)
    if not pool:
        raise ValueError("no CPUs available")
    n = min(len(pool), max(1, math.ceil(cpus - 1e-9)))
    return frozenset(pool[(offset + i) % len(pool)] for i in range(n))


class CpuBudget:
    """A worker's CPU budget as enforced on this machine, its jobs' CPU weights, its CPU
    accounting, and the freezer of its jobs."""

    def __init__(
        self,
        *,
        cpus: float,
        enforcement: Enforcement,
        group: Group | None = None,
        affinity: frozenset[int] | None = None,
        proc: Path = PROC,
        cpuset: CpusetGroup | None = None,
        affinity_offset: int = 0,
        freezer: Freezer | None = None,
    ) -> None:
        quota_us(cpus)  # validates
        self.cpus = cpus
        self.enforcement = enforcement
        self.group = group
        self.affinity = affinity
        self.meter = GroupCpuMeter(proc=proc)
        # Where the worker's cpuset goes once ``pin`` makes it (None: no writable hierarchy).
        self.cpuset = cpuset
        self.affinity_offset = affinity_offset
        self.pinned: frozenset[int] | None = None  # the CPUs, once pinned
        self.freezer = freezer if freezer is not None else Freezer(proc=proc)
        self._proc = proc
        self._weight_warned: set[str] = set()

    @property
    def version(self) -> int | None:
        """The cgroup version enforcing the budget (2 or 1); None without cgroups."""
        if self.group is None:
            return None
        return 2 if isinstance(self.group, UnifiedGroup) else 1

    @classmethod
    def establish(
        cls,
        *,
        cpus: float,
        path: Sequence[str],
        mode: Mode = "auto",
        cgroup_root: Path = CGROUP_ROOT,
        proc: Path = PROC,
        affinity_offset: int = 0,
        freezing: FreezeMode = "auto",
    ) -> CpuBudget:
        """Create the budget: a cgroup v2 or v1 group when possible (``mode`` auto/cgroup),
        else fall back; and the freezer of its jobs (``freezing``: ``signal`` never uses a
        cgroup freezer, ``cgroup`` never signals).

        ``mode="cgroup"`` raises ``OSError`` instead of falling back.
        """
        reason = f"mode {mode!r} requested"
        if mode in {"auto", "cgroup"}:
            make = cls._unified if is_unified(cgroup_root) else cls._v1
            made = make(cpus, path, root=cgroup_root, proc=proc, offset=affinity_offset, freezing=freezing)
            if isinstance(made, CpuBudget):
                return made
            reason = made
            if mode == "cgroup":
                raise OSError(f"cgroup CPU budget unavailable: {reason}")
        available = sorted(os.sched_getaffinity(0))
        enforcement = Enforcement.NONE
        affinity = None
        if mode in {"auto", "affinity"} and cpus < len(available):
            affinity = pick_cpus(cpus, available, offset=affinity_offset)
            enforcement = Enforcement.AFFINITY
        if mode == "auto":
            log.warning(
                "specon.runtime.cgroups_unavailable",
                reason=reason,
                fallback=enforcement.value,
                cpus=cpus,
                affinity=sorted(affinity) if affinity else None,
            )
        freezer = Freezer(v1_worker=_v1_freezer(path, cgroup_root, proc, freezing), mode=freezing, proc=proc)
        return cls(cpus=cpus, enforcement=enforcement, affinity=affinity, proc=proc, freezer=freezer)

    @classmethod
    def _unified(
        cls, cpus: float, path: Sequence[str], *, root: Path, proc: Path, offset: int, freezing: FreezeMode
    ) -> CpuBudget | str:
        """The budget as a cgroup-v2 group, or why not."""
        det = detect_unified(root=root, proc=proc)
        if not det.available or det.own is None:
            return det.reason
        try:
            controllers = delegate(det)
        except OSError as exc:
            return str(exc)
        group = UnifiedGroup.at(det.own, *path, controllers=controllers)
        try:
            group.create(cpus)
        except OSError as exc:
            with contextlib.suppress(OSError):
                group.remove()
            return f"cannot create {group.dir} (controllers {sorted(controllers)}): {exc}; {_HINT}"
        cpuset = CpusetGroup(det.own, path, unified=True) if "cpuset" in controllers else None
        log.info("specon.runtime.cgroup_v2", group=str(group.dir), controllers=sorted(controllers))
        freezer = Freezer(v2_worker=group.dir, mode=freezing, proc=proc)
        return cls(
            cpus=cpus,
            enforcement=Enforcement.CGROUP,
            group=group,
            proc=proc,
            cpuset=cpuset,
            affinity_offset=offset,
            freezer=freezer,
        )

    @classmethod
    def _v1(
        cls, cpus: float, path: Sequence[str], *, root: Path, proc: Path, offset: int, freezing: FreezeMode
    ) -> CpuBudget | str:
        """The budget as a cgroup-v1 group (cpu, cpuacct), or why not."""
        det = detect(root=root, proc=proc)
        if not det.available:
            return det.reason
        group = CpuGroup.at(det, *path)
        try:
            group.create(cpus)
        except OSError as exc:
            with contextlib.suppress(OSError):
                group.remove()
            return f"cannot create {group.cpu_dir}: {exc}"
        base = detect_cpuset(root=root, own=own_cgroups(proc=proc).get("cpuset", "/"))
        freezer = Freezer(v1_worker=_v1_freezer(path, root, proc, freezing), mode=freezing, proc=proc)
        return cls(
            cpus=cpus,
            enforcement=Enforcement.CGROUP,
            group=group,
            proc=proc,
            cpuset=None if base is None else CpusetGroup(base, path),
            affinity_offset=offset,
            freezer=freezer,
        )

    def job_group(self, job: ContainerId) -> Group:
        """``job``'s own group inside the worker's (``ValueError`` without cgroups)."""
        if self.group is None:
            raise ValueError(f"no cgroup CPU budget (enforcement {self.enforcement.value})")
        return self.group.child(JOB_PREFIX + job)

    def entry(self, job: ContainerId | None = None) -> Entry:
        """Where a new process of the worker goes: into ``job``'s own group (made here, and
        thawed; the worker's group if that fails), its v1 freezer group likewise, and into
        the worker's v1 cpuset once pinned (a v2 cpuset is the worker's group itself)."""
        files = list(self.group.procs_files) if self.group else []
        fallback: dict[Path, Path] = {}
        if self.group is not None and job is not None:
            own = self.job_group(job)
            try:
                own.make()
                fallback = dict(zip(own.procs_files, files, strict=True))
                files = list(own.procs_files)
            except OSError as exc:  # it still runs in the budget, without a weight of its own
                log.warning("specon.runtime.job_cgroup_unavailable", container=job, error=str(exc))
        if job is not None:
            try:
                frozen = self.freezer.v1_entry(job)
                if frozen is not None:
                    files.append(frozen[0])
                    fallback[frozen[0]] = frozen[1]
                self.freezer.reset(job)
            except OSError as exc:  # it runs, frozen by signals instead
                log.warning("specon.runtime.freezer_group_unavailable", container=job, error=str(exc))
        if (
            self.pinned is not None
            and self.cpuset is not None
            and self.cpuset.made
            and not self.cpuset.unified
        ):
            files.append(self.cpuset.procs_file)
        return make_entry(files, self.affinity, fallback)

    def set_cpus(self, cpus: float) -> None:
        quota_us(cpus)
        if self.group is not None:
            self.group.set_cpus(cpus)
        self.cpus = cpus

    # -- CPU weights ----------------------------------------------------------------------
    def set_weight(self, job: ContainerId, weight: int) -> bool:
        """Give ``job`` CPU weight ``weight`` (cgroup-v2 units) among the worker's jobs: its
        group's ``cpu.weight`` (v2) or ``cpu.shares`` (v1, converted), after pinning the
        worker (``pin``). False, logged once per job and reason, where it cannot be applied."""
        try:
            own = self.job_group(job)
            if not own.cpu_dir.is_dir():
                raise OSError(f"it has no cgroup of its own here ({own.cpu_dir})")
            cpus = self.pin()
            # A job another process started (a test, the demo's submit) is not in the cpuset yet.
            if self.cpuset is not None and self.cpuset.made:
                self.cpuset.adopt(sorted(own.pids()))
            else:
                pin_tasks(sorted(own.pids()), cpus, proc=self._proc)
            own.set_weight(weight)
        except (OSError, ValueError) as exc:
            # Without cgroups every job fails alike: one warning for the worker.
            key = "" if self.group is None else f"{job}: {exc}"
            if key not in self._weight_warned:
                self._weight_warned.add(key)
                log.warning("specon.runtime.cpu_weight_unavailable", container=job, error=str(exc))
            return False
        return True

    def pin(self) -> frozenset[int]:
        """Confine the worker, its jobs now and later, to ``ceil(cpus)`` of the CPUs this
        process may use; the CPUs. Its cpuset where the hierarchy is writable (the CPUs its
        sibling workers use least, ``cpuset.least_loaded``), else every task's affinity
        (``pick_cpus`` by ``affinity_offset``). Idempotent."""
        if self.pinned is not None:
            return self.pinned
        available = sorted(os.sched_getaffinity(0))
        cpus = pick_cpus(self.cpus, available, offset=self.affinity_offset)
        how = "affinity"
        if self.cpuset is not None:
            try:
                with self.cpuset.locked():
                    had = self.cpuset.current()  # a restarted agent keeps its worker's CPUs
                    if len(had) != len(cpus) or not had <= set(available):
                        load = self.cpuset.sibling_load()
                        had = least_loaded(len(cpus), available, load, self.affinity_offset)
                    cpus = self.cpuset.create(had)
                seen: set[int] = set()
                for _ in range(3):  # again for processes forked while the first ones moved
                    new = self._pids() - seen
                    if not new:
                        break
                    self.cpuset.adopt(sorted(new))
                    seen |= new
                how = "cpuset"
            except OSError as exc:
                log.warning("specon.runtime.cpuset_unavailable", error=str(exc), fallback="affinity")
                self.cpuset.made = False
        if how == "affinity":
            pin_tasks(sorted(self._pids()), cpus, proc=self._proc)
            self.affinity = cpus  # jobs started from now on too
        self.pinned = cpus
        log.info("specon.runtime.pinned", cpus=sorted(cpus), how=how)
        return cpus

    def _pids(self) -> set[int]:
        """Processes in the worker's group and its jobs' groups now."""
        if self.group is None:
            return set()
        pids = self.group.pids()
        for name in self.group.children():
            pids |= self.group.child(name).pids()
        return pids

    def prune_jobs(self, running: Iterable[ContainerId], *, now: float | None = None) -> None:
        """Remove the (empty) groups of jobs no longer running here, except those made in the
        last ``PRUNE_GRACE`` seconds: another process (a submission, a second runtime of the
        same worker) may be starting a job into it."""
        if self.group is None:
            return
        keep = {JOB_PREFIX + job for job in running}
        now = time.time() if now is None else now
        for name in self.group.children():
            if name.startswith(JOB_PREFIX) and name not in keep:
                group = self.group.child(name)
                with contextlib.suppress(OSError):
                    if now - group.cpu_dir.stat().st_ctime < PRUNE_GRACE:
                        continue
                group.remove()  # one with tasks left stays (EBUSY)
        frozen = self.freezer.v1_worker
        if frozen is not None:  # its job groups in the v1 freezer hierarchy, as above
            for name in frozen.children():
                path = frozen.cpu_dir / name
                if not name.startswith(JOB_PREFIX) or name in keep:
                    continue
                with contextlib.suppress(OSError):
                    if now - path.stat().st_ctime >= PRUNE_GRACE:
                        path.rmdir()

    # -- accounting -----------------------------------------------------------------------
    def cpu_seconds(
        self, groups: Mapping[ContainerId, int], *, per_job: bool = True
    ) -> tuple[float, dict[ContainerId, float]]:
        """The worker's cumulative CPU seconds and each running job's (``groups``: pgids).

        A job with a group of its own is read from it (one file); the others from ``/proc``,
        and only with ``per_job``: that costs a scan of every process on the host.
        """
        if self.group is not None:
            own = self._job_seconds(groups)
            with contextlib.suppress(OSError, ValueError, IndexError):
                total = self.group.usage_ns() / 1e9
                rest = {job: pgid for job, pgid in groups.items() if job not in own}
                if per_job and rest:
                    own.update(self.meter.sample(rest))
                return total, own
        per_job_seconds = self.meter.sample(groups)
        return self.meter.total, per_job_seconds

    def job_pids(self, groups: Mapping[ContainerId, int]) -> dict[ContainerId, frozenset[int]]:
        """The pids of each running job (``groups``: pgids): its process group's members and
        whatever is in its own cgroups (processes that left the group), from one scan."""
        members = group_members(groups.values(), proc=self._proc)
        out = {}
        for job, pgid in groups.items():
            pids = set(members.get(pgid, ()))
            if self.group is not None:
                pids |= self.job_group(job).pids()
            if self.freezer.v1_worker is not None:
                pids |= self.freezer.v1_worker.child(JOB_PREFIX + job).pids()
            out[job] = frozenset(pids)
        return out

    def _job_seconds(self, jobs: Iterable[ContainerId]) -> dict[ContainerId, float]:
        out = {}
        for job in jobs:
            with contextlib.suppress(OSError, ValueError, IndexError):
                out[job] = self.job_group(job).usage_ns() / 1e9
        return out

    def close(self) -> bool:
        """Remove the cgroups (the jobs', the worker's, its cpuset, its freezer) when empty;
        True when nothing is left behind."""
        clean = self.group.remove() if self.group is not None else True
        if self.freezer.v1_worker is not None:
            clean = self.freezer.v1_worker.remove() and clean
        if self.cpuset is not None:  # also one a previous agent of this worker pinned
            clean = self.cpuset.remove() and clean
        return clean
