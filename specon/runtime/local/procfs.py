"""What the local runtime reads from ``/proc``: process stats, liveness by pid and start time,
process groups, this process's cgroups and a monotone CPU meter per process group. Every
function takes the ``/proc`` root as a parameter, for tests against a temporary tree."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from specon.model import ContainerId

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK")


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


def own_unified(*, proc: Path = PROC) -> str | None:
    """This process's cgroup-v2 path (the ``0::<path>`` line of ``/proc/self/cgroup``); None
    where it has none (no unified hierarchy) or the file is unreadable."""
    try:
        lines = (proc / "self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def group_members(pgids: Iterable[int], *, proc: Path = PROC) -> dict[int, set[int]]:
    """The live (non-zombie) pids of each process group in ``pgids``, from one scan."""
    wanted = set(pgids)
    out: dict[int, set[int]] = {g: set() for g in wanted}
    for st in all_stats(proc=proc):
        if st.pgrp in wanted and not st.zombie:
            out[st.pgrp].add(st.pid)
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
