"""A Docker container's CPU counter and processes read from its cgroup on this host.

The engine's ``stats`` endpoint answers only at its collector's next 1 s sample, also with
``one-shot`` (measured: 1.0 s a call on Docker 20.10), which would stall every agent tick.
The agent runs beside its engine, so it reads the same counter the engine reports from the
container's cgroup: found once per container from its init pid's ``/proc/<pid>/cgroup``
(cgroupfs or systemd driver, v1 ``cpuacct.usage`` or v2 ``cpu.stat``), then read directly.
Where that is impossible (the agent in another pid or cgroup namespace, a remote engine) the
caller falls back to ``stats`` (for the processes: the engine's ``top``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from specon.runtime.local.cgroups import CGROUP_ROOT, PROC


class ContainerCounters:
    """Per container id: the file holding its cumulative CPU time, found once (its directory
    also lists the container's processes)."""

    def __init__(self, *, proc: Path = PROC, root: Path = CGROUP_ROOT) -> None:
        self._proc = proc
        self._root = root
        self._files: dict[str, Path] = {}

    def _locate(self, pid: int) -> Path | None:
        try:
            lines = (self._proc / str(pid) / "cgroup").read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            _, controllers, path = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                return self._root / "cpuacct" / path.lstrip("/") / "cpuacct.usage"
        for line in lines:  # cgroup v2: the unified hierarchy's "0::" line
            if line.startswith("0::") and (self._root / "cgroup.controllers").exists():
                return self._root / line[3:].lstrip("/") / "cpu.stat"
        return None

    def _path(self, container_id: str, pid: Callable[[], int | None]) -> Path | None:
        path = self._files.get(container_id)
        if path is None:
            found = pid()
            path = None if not found else self._locate(found)
            if path is not None:
                self._files[container_id] = path
        return path

    def seconds(self, container_id: str, pid: Callable[[], int | None]) -> float | None:
        """Cumulative CPU seconds of the container, or None where its cgroup cannot be read
        here. ``pid`` (the container's init pid; an engine call) is asked only the first time."""
        path = self._path(container_id, pid)
        if path is None:
            return None
        with contextlib.suppress(OSError, ValueError, IndexError):
            if path.name == "cpu.stat":
                stat = path.read_text().split()
                return int(stat[stat.index("usage_usec") + 1]) / 1e6
            return int(path.read_text().split()[0]) / 1e9
        del self._files[container_id]  # the container is gone (or restarted elsewhere)
        return None

    def procs(self, container_id: str, pid: Callable[[], int | None]) -> frozenset[int] | None:
        """PIDs of the container's processes as this host sees them (its cgroup's
        ``cgroup.procs``, frozen or not), or None where its cgroup cannot be read here."""
        path = self._path(container_id, pid)
        if path is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            found = frozenset(int(line) for line in (path.parent / "cgroup.procs").read_text().split())
            if found:  # empty: the container ended, or its cgroup moved on
                return found
        del self._files[container_id]
        return None

    def keep(self, container_ids: Iterable[str]) -> None:
        """Forget every container not among ``container_ids``."""
        alive = set(container_ids)
        for cid in set(self._files) - alive:
            del self._files[cid]


class CpuTotals:
    """A worker's cumulative CPU seconds from its containers' counters, which restart with
    each container: increments are summed per container id, never negative."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._t: float | None = None
        self.cumulative = 0.0

    def add(self, seconds: Mapping[str, float], now: float) -> tuple[float, float]:
        """One sample, each container's counter by container id at ``now`` (monotonic): the
        CPU seconds used since the previous sample and the seconds elapsed (0 the first time)."""
        first = self._t is None
        used = 0.0
        for cid, s in seconds.items():
            used += max(0.0, s - self._last.get(cid, s if first else 0.0))
            self._last[cid] = s
        for cid in set(self._last) - set(seconds):
            del self._last[cid]
        elapsed = 0.0 if self._t is None else now - self._t
        self._t = now
        self.cumulative += used
        return used, elapsed
