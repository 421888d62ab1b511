"""A local worker's CPU budget and CPU accounting: cgroup v1, else CPU affinity, else none.

Each worker is a cgroup-v1 CPU budget, ``<cpu>/<own>/<parent>/<cluster>/<worker>`` with
``cpu.cfs_quota_us = cpus * cpu.cfs_period_us``, and the same path in the ``cpuacct``
hierarchy for ``cpuacct.usage`` (cpu and cpuacct may be separate mounts, as on the project
machines, or one joint mount). ``<own>`` is the agent's own cgroup, so nesting works inside
a container too. Jobs join the group race-free: the forked child writes ``0`` into each
``cgroup.procs`` before it execs (``CpuBudget.preexec``).

Each job has a group of its own below its worker's (``<worker>/job-<id>``, both hierarchies):
its ``cpu.shares`` is its CPU weight among the worker's jobs and its ``cpuacct.usage`` its
CPU seconds. Shares decide only among tasks that wait for the same CPU (INFRA.md measured
0.247/0.253 CPU for 1024 vs 2 shares on two unpinned CPUs, 0.499/0.001 pinned to one), so
the first weight set also pins the worker to ``ceil(cpus)`` CPUs (``specon.runtime.local.cpuset``).

Where cgroups are not usable (not root, not mounted, cgroup v2 only) the budget falls back
to CPU affinity (a subset of ``ceil(cpus)`` CPUs) or to no limit, with a
``specon.runtime.cgroups_unavailable`` warning, and CPU use is summed from
``/proc/<pid>/stat`` of the worker's process groups. Every path root is a parameter, so
detection and the group files can be exercised against a temporary directory tree.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from specon.model import ContainerId
from specon.runtime.base import cpu_shares
from specon.runtime.local.cgroup_entry import Entry, enter, make_entry
from specon.runtime.local.cpuset import CpusetGroup, detect_cpuset, least_loaded, pin_tasks

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel refuses quotas under 1 ms
# A job's group is ``job-<id>``: a prefix no cgroup control file (cgroup.*, cpu.*, tasks) has.
JOB_PREFIX = "job-"
# Seconds a job's group is kept before an agent may prune it as unused (a launch by another
# process takes well under a second between making the group and joining it).
PRUNE_GRACE = 60.0
CLK_TCK = os.sysconf("SC_CLK_TCK")

log = structlog.get_logger()

Mode = Literal["auto", "cgroup", "affinity", "none"]


class Enforcement(enum.StrEnum):
    CGROUP = "cgroup"
    AFFINITY = "affinity"
    NONE = "none"


# -- /proc ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the runtime uses."""

    pid: int
    state: str
    ppid: int
    pgrp: int
    # utime + stime + cutime + cstime: own CPU plus that of reaped children, so a process
    # group's total survives its members reaping each other.
    cpu_ticks: int
    # Start time in clock ticks after boot: with the pid, it names one process for good.
    start_ticks: int

    @property
    def zombie(self) -> bool:
        return self.state in {"Z", "X", "x"}


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/<pid>/stat`` line; ``ValueError`` if malformed.

    The command name (field 2) may contain spaces and parentheses, so fields are counted
    from the *last* ``)``.
    """
    head, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        raise ValueError(f"malformed /proc stat line: {text[:80]!r}")
    pid = int(head.split("(", 1)[0])
    # fields[0] is field 3 (state); field n is fields[n - 3].
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ProcStat(pid, fields[0], int(fields[1]), int(fields[2]), ticks, int(fields[19]))


def read_stat(pid: int, *, proc: Path = PROC) -> ProcStat | None:
    """The process's stat, or None when it does not exist (or its stat is unreadable)."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError):
        return None


def process_alive(pid: int | None, start_ticks: int | None, *, proc: Path = PROC) -> bool:
    """True when ``pid`` is a live (non-zombie) process that started at ``start_ticks``."""
    if pid is None or pid <= 0:
        return False
    st = read_stat(pid, proc=proc)
    if st is None or st.zombie:
        return False
    return start_ticks is None or st.start_ticks == start_ticks


def all_stats(*, proc: Path = PROC) -> list[ProcStat]:
    """Every readable process (processes vanishing mid-scan are skipped)."""
    out = []
    with contextlib.suppress(OSError):
        for name in os.listdir(proc):
            if name.isdigit() and (st := read_stat(int(name), proc=proc)) is not None:
                out.append(st)
    return out


def group_alive(pgid: int, *, proc: Path = PROC) -> bool:
    """True while any non-zombie process is left in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    return any(st.pgrp == pgid and not st.zombie for st in all_stats(proc=proc))


def boot_id(*, proc: Path = PROC) -> str:
    """This boot of this host: pids and start times mean something only within it."""
    try:
        return (proc / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"host:{os.uname().nodename}"


def own_cgroups(*, proc: Path = PROC) -> dict[str, str]:
    """This process's cgroup-v1 path per controller, from ``/proc/self/cgroup``."""
    out: dict[str, str] = {}
    try:
        lines = (proc / "self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[1]:
            for controller in parts[1].split(","):
                out[controller] = parts[2]
    return out


class GroupCpuMeter:
    """Cumulative CPU seconds per process group (job), from ``/proc``, kept monotone.

    A group's /proc total drops when a member exits unreaped-by-the-group or the group
    ends, so each job keeps the largest total seen; jobs that ended still count in ``total``.
    """

    def __init__(self, *, proc: Path = PROC) -> None:
        self._proc = proc
        self._seen: dict[ContainerId, float] = {}

    def sample(self, groups: Mapping[ContainerId, int]) -> dict[ContainerId, float]:
        """Cumulative CPU seconds of each running job, given its process group id."""
        ticks: dict[int, int] = {}
        wanted = set(groups.values())
        for st in all_stats(proc=self._proc):
            if st.pgrp in wanted:
                ticks[st.pgrp] = ticks.get(st.pgrp, 0) + st.cpu_ticks
        out = {}
        for job, pgid in groups.items():
            seconds = max(self._seen.get(job, 0.0), ticks.get(pgid, 0) / CLK_TCK)
            self._seen[job] = out[job] = seconds
        return out

    @property
    def total(self) -> float:
        return sum(self._seen.values())


# -- cgroup v1 ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Detection:
    """Whether cgroup-v1 CPU budgets are usable, why (not), and where groups go."""

    available: bool
    reason: str
    cpu_base: Path | None = None
    cpuacct_base: Path | None = None


def detect(*, root: Path = CGROUP_ROOT, proc: Path = PROC) -> Detection:
    """Look for writable cgroup-v1 ``cpu`` and ``cpuacct`` hierarchies under ``root``."""
    if (root / "cgroup.controllers").exists():
        return Detection(False, f"{root} is a cgroup v2 (unified) mount; v1 cpu/cpuacct are needed")
    cpu, acct = root / "cpu", root / "cpuacct"
    if not (cpu / "cpu.cfs_quota_us").exists():
        return Detection(False, f"no cgroup-v1 cpu controller with CFS quota at {cpu}")
    if not (acct / "cpuacct.usage").exists():
        return Detection(False, f"no cgroup-v1 cpuacct controller at {acct}")
    if not (os.access(cpu, os.W_OK) and os.access(acct, os.W_OK)):
        return Detection(False, f"{cpu} / {acct} not writable (needs root or a delegated cgroup)")
    own = own_cgroups(proc=proc)
    # Nest under our own groups (as INFRA requires for memory): correct inside containers.
    cpu_base = cpu / own.get("cpu", "/").lstrip("/")
    acct_base = acct / own.get("cpuacct", "/").lstrip("/")
    return Detection(True, "cgroup v1", cpu_base, acct_base)


def quota_us(cpus: float) -> int:
    """``cpu.cfs_quota_us`` for a budget of ``cpus`` cores at the fixed period."""
    if not math.isfinite(cpus) or cpus <= 0:
        raise ValueError(f"cpus must be a positive number, got {cpus}")
    return max(MIN_QUOTA_US, round(cpus * PERIOD_US))


def _write(path: Path, value: object) -> None:
    with open(path, "w") as fh:
        fh.write(str(value))


@dataclass(frozen=True, slots=True)
class CpuGroup:
    """One worker's group in the cpu and cpuacct hierarchies (the same dir if co-mounted)."""

    cpu_dir: Path
    cpuacct_dir: Path
    # The first directory this group's path created below the detection base; ``remove``
    # stops there, so pre-existing ancestors are never touched.
    levels: int

    @classmethod
    def at(cls, detection: Detection, *parts: str) -> CpuGroup:
        if detection.cpu_base is None or detection.cpuacct_base is None:
            raise ValueError(f"cgroups unavailable: {detection.reason}")
        for part in parts:
            if not part or "/" in part or part in {".", ".."}:
                raise ValueError(f"invalid cgroup path component {part!r}")
        rel = Path(*parts)
        return cls(detection.cpu_base / rel, detection.cpuacct_base / rel, len(parts))

    def _dirs(self) -> list[Path]:
        return (
            [self.cpu_dir]
            if self.cpu_dir.resolve() == self.cpuacct_dir.resolve()
            else [
                self.cpu_dir,
                self.cpuacct_dir,
            ]
        )

    def create(self, cpus: float) -> None:
        """Make the group (and its parents) and set its quota; ``OSError`` if refused."""
        for d in self._dirs():
            d.mkdir(parents=True, exist_ok=True)
        self.set_cpus(cpus)

    def set_cpus(self, cpus: float) -> None:
        """Change the budget; takes effect at once, also for running jobs."""
        _write(self.cpu_dir / "cpu.cfs_period_us", PERIOD_US)
        _write(self.cpu_dir / "cpu.cfs_quota_us", quota_us(cpus))

    def child(self, name: str) -> CpuGroup:
        """The group ``name`` directly below this one (a job's, inside its worker's budget)."""
        if not name or "/" in name or name in {".", ".."}:
            raise ValueError(f"invalid cgroup path component {name!r}")
        return CpuGroup(self.cpu_dir / name, self.cpuacct_dir / name, 1)

    def make(self) -> None:
        """Create this group below an existing parent (no quota: it shares the parent's)."""
        for d in self._dirs():
            d.mkdir(exist_ok=True)

    def set_shares(self, shares: int) -> None:
        _write(self.cpu_dir / "cpu.shares", shares)

    def children(self) -> list[str]:
        """Names of the groups directly below this one (cpu hierarchy)."""
        with contextlib.suppress(OSError):
            return sorted(e.name for e in os.scandir(self.cpu_dir) if e.is_dir(follow_symlinks=False))
        return []

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return tuple(d / "cgroup.procs" for d in self._dirs())

    def usage_ns(self) -> int:
        """Cumulative CPU time of every task that ever ran in the group, in nanoseconds."""
        return int((self.cpuacct_dir / "cpuacct.usage").read_text().split()[0])

    def pids(self) -> set[int]:
        """Processes in the group now (cpu hierarchy)."""
        try:
            return {int(x) for x in (self.cpu_dir / "cgroup.procs").read_text().split()}
        except FileNotFoundError:
            return set()

    def exists(self) -> bool:
        return any(d.is_dir() for d in self._dirs())

    def remove(self) -> bool:
        """rmdir the group, then its empty created parents; True when the group is gone.

        Never kills anything: a group with tasks (EBUSY) is left in place.
        """
        gone = True
        for d in self._dirs():
            for name in CpuGroup(d, d, 1).children():  # the jobs' groups, once empty
                with contextlib.suppress(OSError):
                    (d / name).rmdir()
            for level, path in enumerate([d, *d.parents][: self.levels]):
                try:
                    path.rmdir()
                except FileNotFoundError:
                    continue
                except OSError:
                    # The worker group itself still busy is a real leftover; a busy parent
                    # only means another worker or cluster still uses it.
                    gone = gone and level > 0
                    break
        return gone


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
    """A worker's CPU budget as enforced on this machine, its jobs' CPU weights, and its CPU
    accounting."""

    def __init__(
        self,
        *,
        cpus: float,
        enforcement: Enforcement,
        group: CpuGroup | None = None,
        affinity: frozenset[int] | None = None,
        proc: Path = PROC,
        cpuset: CpusetGroup | None = None,
        affinity_offset: int = 0,
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
        self._proc = proc
        self._weight_warned: set[str] = set()

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
    ) -> CpuBudget:
        """Create the budget: a cgroup when possible (``mode`` auto/cgroup), else fall back.

        ``mode="cgroup"`` raises ``OSError`` instead of falling back.
        """
        reason = f"mode {mode!r} requested"
        if mode in {"auto", "cgroup"}:
            det = detect(root=cgroup_root, proc=proc)
            reason = det.reason
            if det.available:
                group = CpuGroup.at(det, *path)
                try:
                    group.create(cpus)
                    base = detect_cpuset(root=cgroup_root, own=own_cgroups(proc=proc).get("cpuset", "/"))
                    return cls(
                        cpus=cpus,
                        enforcement=Enforcement.CGROUP,
                        group=group,
                        proc=proc,
                        cpuset=None if base is None else CpusetGroup(base, path),
                        affinity_offset=affinity_offset,
                    )
                except OSError as exc:
                    reason = f"cannot create {group.cpu_dir}: {exc}"
                    with contextlib.suppress(OSError):
                        group.remove()
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
        return cls(cpus=cpus, enforcement=enforcement, affinity=affinity, proc=proc)

    def job_group(self, job: ContainerId) -> CpuGroup:
        """``job``'s own group inside the worker's (``ValueError`` without cgroups)."""
        if self.group is None:
            raise ValueError(f"no cgroup CPU budget (enforcement {self.enforcement.value})")
        return self.group.child(JOB_PREFIX + job)

    def entry(self, job: ContainerId | None = None) -> Entry:
        """Where a new process of the worker goes: into ``job``'s own group (made here; the
        worker's group if that fails), and into the worker's cpuset once pinned."""
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
        if self.pinned is not None and self.cpuset is not None and self.cpuset.made:
            files.append(self.cpuset.procs_file)
        return make_entry(files, self.affinity, fallback)

    def preexec(self, job: ContainerId | None = None) -> Callable[[], None]:
        """The ``preexec_fn`` of a new process of the worker: ``enter`` its ``entry``."""
        entry = self.entry(job)

        def preexec() -> None:
            enter(entry)

        return preexec

    def set_cpus(self, cpus: float) -> None:
        quota_us(cpus)
        if self.group is not None:
            self.group.set_cpus(cpus)
        self.cpus = cpus

    # -- CPU weights ----------------------------------------------------------------------
    def set_weight(self, job: ContainerId, weight: int) -> bool:
        """Give ``job`` CPU weight ``weight`` (cgroup-v2 units) among the worker's jobs: its
        group's ``cpu.shares``, after pinning the worker (``pin``). False, logged once per
        job and reason, where it cannot be applied."""
        try:
            shares = cpu_shares(weight)
            own = self.job_group(job)
            if not own.cpu_dir.is_dir():
                raise OSError(f"it has no cgroup of its own here ({own.cpu_dir})")
            cpus = self.pin()
            # A job another process started (a test, the demo's submit) is not in the cpuset yet.
            if self.cpuset is not None and self.cpuset.made:
                self.cpuset.adopt(sorted(own.pids()))
            else:
                pin_tasks(sorted(own.pids()), cpus, proc=self._proc)
            own.set_shares(shares)
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

    def _job_seconds(self, jobs: Iterable[ContainerId]) -> dict[ContainerId, float]:
        out = {}
        for job in jobs:
            with contextlib.suppress(OSError, ValueError, IndexError):
                out[job] = self.job_group(job).usage_ns() / 1e9
        return out

    def close(self) -> bool:
        """Remove the cgroups (the jobs', the worker's, its cpuset) when empty; True when
        nothing is left behind."""
        clean = self.group.remove() if self.group is not None else True
        if self.cpuset is not None:  # also one a previous agent of this worker pinned
            clean = self.cpuset.remove() and clean
        return clean
