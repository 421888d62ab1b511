"""cgroup v1 CPU groups: detection of the ``cpu`` and ``cpuacct`` hierarchies and one group in
both (``<cpu>/<own>/<path>`` with ``cpu.cfs_quota_us``, ``cpu.shares``, and ``cpuacct.usage``
from the same path in ``cpuacct``; the two may be one joint mount). ``<own>`` is this
process's own group, so nesting works inside a container too. The Docker hosts of the
embedded cluster use the same groups for their engines."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from specon.runtime.base import cpu_shares
from specon.runtime.local.cgroup_files import (
    CGROUP_ROOT,
    PERIOD_US,
    check_part,
    make_group,
    quota_us,
    write_value,
)
from specon.runtime.local.procfs import PROC, own_cgroups


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
            check_part(part)
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
            make_group(d)
        self.set_cpus(cpus)

    def set_cpus(self, cpus: float) -> None:
        """Change the budget; takes effect at once, also for running jobs."""
        write_value(self.cpu_dir / "cpu.cfs_period_us", PERIOD_US)
        write_value(self.cpu_dir / "cpu.cfs_quota_us", quota_us(cpus))

    def child(self, name: str) -> CpuGroup:
        """The group ``name`` directly below this one (a job's, inside its worker's budget)."""
        check_part(name)
        return CpuGroup(self.cpu_dir / name, self.cpuacct_dir / name, 1)

    def make(self) -> None:
        """Create this group below an existing parent (no quota: it shares the parent's)."""
        for d in self._dirs():
            d.mkdir(exist_ok=True)

    def set_shares(self, shares: int) -> None:
        write_value(self.cpu_dir / "cpu.shares", shares)

    def set_weight(self, weight: int) -> None:
        """``weight`` (cgroup-v2 units) as v1 ``cpu.shares`` (``base.cpu_shares``)."""
        self.set_shares(cpu_shares(weight))

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
