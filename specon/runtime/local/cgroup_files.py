"""What cgroup v1 and v2 groups share: the mount root, the CPU quota arithmetic, control-file
access, path checks, and ``BudgetGroup``, the one interface ``CpuBudget`` drives a worker's
group through (``cgroup_v1.CpuGroup``, ``cgroup_v2.UnifiedGroup``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
MIN_QUOTA_US = 1_000  # the kernel refuses quotas under 1 ms
# A job's group is ``job-<id>``: a prefix no cgroup control file (cgroup.*, cpu.*, tasks) has.
JOB_PREFIX = "job-"


def quota_us(cpus: float) -> int:
    """The CPU quota per ``PERIOD_US`` for a budget of ``cpus`` cores."""
    if not math.isfinite(cpus) or cpus <= 0:
        raise ValueError(f"cpus must be a positive number, got {cpus}")
    return max(MIN_QUOTA_US, round(cpus * PERIOD_US))


# Tries of make_group before its FileNotFoundError stands: each lost race means another runtime
# removed a shared parent at that moment, which it does only once its last group is gone.
MAKE_ATTEMPTS = 5


def make_group(path: Path) -> None:
    """``mkdir -p`` for a cgroup: its parents (``<own>/specon/<cluster>``) are shared with the
    other runtimes of this host, and one closing removes them once empty, which may be between
    our making of a parent and of its child (ENOENT): make the whole path again then."""
    for attempt in range(1, MAKE_ATTEMPTS + 1):
        try:
            path.mkdir(parents=True, exist_ok=True)
            return
        except FileNotFoundError:
            if attempt == MAKE_ATTEMPTS:
                raise


def write_value(path: Path, value: object) -> None:
    """Write one control file (one ``write``: cgroupfs takes a value per write)."""
    with open(path, "w") as fh:
        fh.write(str(value))


def read_value(path: Path) -> str:
    """A control file's content, stripped; ``OSError`` where it cannot be read."""
    return path.read_text().strip()


def check_part(part: str) -> str:
    """``part`` if it is one safe path component; ``ValueError`` otherwise."""
    if not part or "/" in part or part in {".", ".."}:
        raise ValueError(f"invalid cgroup path component {part!r}")
    return part


class BudgetGroup(Protocol):
    """A worker's (or a job's) CPU group, whichever cgroup version holds it."""

    @property
    def cpu_dir(self) -> Path:
        """The group's directory in the hierarchy that holds its CPU controls."""
        ...

    @property
    def procs_files(self) -> tuple[Path, ...]:
        """The ``cgroup.procs`` files a new process of the group writes itself into."""
        ...

    def create(self, cpus: float) -> None:
        """Make the group (and its parents) with a budget of ``cpus``; ``OSError`` if refused."""
        ...

    def set_cpus(self, cpus: float) -> None:
        """Change the budget; takes effect at once, also for running jobs."""
        ...

    def child(self, name: str) -> BudgetGroup:
        """The group ``name`` directly below this one."""
        ...

    def make(self) -> None:
        """Create this group below an existing parent (no budget: it shares the parent's)."""
        ...

    def set_weight(self, weight: int) -> None:
        """The group's CPU weight among its siblings, in cgroup-v2 units (1..10000)."""
        ...

    def children(self) -> list[str]:
        """Names of the groups directly below this one."""
        ...

    def usage_ns(self) -> int:
        """Cumulative CPU time of every task that ever ran in the group, in nanoseconds."""
        ...

    def pids(self) -> set[int]:
        """Processes in the group now (not its children's)."""
        ...

    def exists(self) -> bool:
        """True while the group's directory exists."""
        ...

    def remove(self) -> bool:
        """rmdir the group's empty children, the group and its empty created parents; True
        when the group is gone. Never kills anything."""
        ...
