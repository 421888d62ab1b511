"""Pinning a local worker to whole CPUs: a cgroup cpuset (v1, or v2's in the worker's own
group), else every task's CPU affinity.

Why: ``cpu.shares`` decide only among tasks that wait for the same CPU. INFRA.md measured
1024 vs 2 shares under a 0.5-CPU quota: 0.247 / 0.253 CPU on two unpinned CPUs (each job
ran on its own CPU and the quota throttled both alike), 0.499 / 0.001 pinned to one. So a
worker whose jobs get CPU weights is confined to ``ceil(cpus)`` CPUs (``cgroups.pick_cpus``).

The cpuset is ``<cpuset>/<own>/<parent>/<cluster>/<worker>``, beside the worker's cpu and
cpuacct groups. Its CPUs are those its sibling workers' cpusets use least (ties: rotated by
the worker's offset), chosen under a lock, so agents of one cluster that run as separate
processes (each told only ``--cpus``) spread over the machine instead of all taking CPU 0;
a restarted agent keeps the CPUs its worker had. A cpuset group takes tasks only once its ``cpuset.cpus`` and
``cpuset.mems`` are written (INFRA.md), and a child's CPUs must be within its parent's, so
each level created here inherits its parent's. Every path root is a parameter, for tests
against a temporary directory tree.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from specon.runtime.local.cgroup_files import MAKE_ATTEMPTS


def parse_cpulist(text: str) -> frozenset[int]:
    """``"0-2,5"`` -> {0, 1, 2, 5}; ``ValueError`` if malformed."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        out.update(range(int(lo), int(hi if sep else lo) + 1))
    return frozenset(out)


def format_cpulist(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def least_loaded(
    n: int, available: Sequence[int], load: Mapping[int, int], offset: int = 0
) -> frozenset[int]:
    """``n`` CPUs of ``available`` with the least ``load`` (workers pinned there), ties taken in
    the order ``available`` rotated by ``offset``."""
    pool = sorted(available)
    if not pool:
        raise ValueError("no CPUs available")
    k = offset % len(pool)
    rotated = pool[k:] + pool[:k]
    return frozenset(sorted(rotated, key=lambda c: load.get(c, 0))[: max(1, min(n, len(pool)))])


def detect_cpuset(*, root: Path, own: str = "/") -> Path | None:
    """Where this process's cpuset groups go (``own``: its cpuset path from
    ``/proc/self/cgroup``); None without a writable cgroup-v1 cpuset hierarchy."""
    top = root / "cpuset"
    if not (top / "cpuset.cpus").exists() or not os.access(top, os.W_OK):
        return None
    return top / own.lstrip("/")


def _read(path: Path) -> str:
    """A control file's value ("" where there is none yet: cgroupfs always has one)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _write(path: Path, value: object) -> None:
    with open(path, "w") as fh:
        fh.write(str(value))


class CpusetGroup:
    """One worker's cpuset: the path ``parts`` below ``base`` (made by ``create``). On cgroup
    v2 (``unified``) it is the worker's own group, made with its budget: ``create`` only
    writes its ``cpuset.cpus`` (within the parent's effective CPUs), and its processes, all
    in groups below it, need no moving."""

    def __init__(self, base: Path, parts: Sequence[str], *, unified: bool = False) -> None:
        for part in parts:
            if not part or "/" in part or part in {".", ".."}:
                raise ValueError(f"invalid cgroup path component {part!r}")
        self.base = base
        self.dir = base.joinpath(*parts)
        self.levels = len(parts)
        self.unified = unified
        self.made = False

    @property
    def procs_file(self) -> Path:
        return self.dir / "cgroup.procs"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialise choosing CPUs with the other agents of this machine (``flock`` on the
        hierarchy's base directory; unlocked where that is refused)."""
        try:
            fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            yield
            return
        try:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def current(self) -> frozenset[int]:
        """The CPUs the group has now (empty: not made yet)."""
        try:
            return parse_cpulist(_read(self.dir / "cpuset.cpus"))
        except ValueError:
            return frozenset()

    def sibling_load(self) -> dict[int, int]:
        """How many of the other workers' cpusets beside this one use each CPU."""
        load: dict[int, int] = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.dir.parent):
                if entry.is_dir(follow_symlinks=False) and entry.name != self.dir.name:
                    with contextlib.suppress(ValueError):
                        for cpu in parse_cpulist(_read(Path(entry.path) / "cpuset.cpus")):
                            load[cpu] = load.get(cpu, 0) + 1
        return load

    def create(self, cpus: frozenset[int]) -> frozenset[int]:
        """Make the group confined to ``cpus`` (within its parent's); the CPUs it got.

        ``OSError`` when refused or when none of ``cpus`` is in the parent's set.
        """
        if self.unified:
            allowed = parse_cpulist(_read(self.dir.parent / "cpuset.cpus.effective"))
            return self._confine(cpus, allowed)
        for attempt in range(1, MAKE_ATTEMPTS + 1):
            try:
                self._make_path()
                break
            except FileNotFoundError:  # a shared parent removed meanwhile (cgroup_files.make_group)
                if attempt == MAKE_ATTEMPTS:
                    raise
        return self._confine(cpus, parse_cpulist(_read(self.dir.parent / "cpuset.cpus")))

    def _make_path(self) -> None:
        path = self.base
        for part in self.dir.relative_to(self.base).parts:
            parent, path = path, path / part
            path.mkdir(exist_ok=True)
            for name in ("cpuset.cpus", "cpuset.mems"):  # both, before any task joins
                if not _read(path / name):
                    _write(path / name, _read(parent / name))

    def _confine(self, cpus: frozenset[int], allowed: frozenset[int]) -> frozenset[int]:
        got = cpus & allowed
        if not got:
            raise OSError(f"none of CPUs {format_cpulist(cpus)} is in {self.dir.parent}'s cpuset")
        _write(self.dir / "cpuset.cpus", format_cpulist(got))
        self.made = True
        return got

    def adopt(self, pids: Iterable[int]) -> None:
        """Move processes (each with all its threads) into the group; gone ones are skipped.
        Nothing to do on v2: the worker's processes are all in groups below it."""
        if self.unified:
            return
        for pid in pids:
            if pid <= 0:
                continue  # "0" would move the writer itself
            with contextlib.suppress(ProcessLookupError):  # ESRCH: it exited meanwhile
                _write(self.procs_file, pid)

    def remove(self) -> bool:
        """rmdir the group, then its empty created parents; True when the group is gone.
        A group with tasks (EBUSY) is left in place; nothing is killed. On v2 the worker's
        group is its CPU group's to remove."""
        if self.unified:
            return True
        for level, path in enumerate([self.dir, *self.dir.parents][: self.levels]):
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                return level > 0  # a busy parent: another worker still uses it
        return True


def pin_tasks(pids: Iterable[int], cpus: frozenset[int], *, proc: Path = Path("/proc")) -> int:
    """Set the CPU affinity of every thread of ``pids`` (the fallback without a cpuset); how
    many threads were pinned. Threads and processes they start later inherit it."""
    pinned = 0
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(proc / str(pid) / "task") if t.isdigit()]
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus)
                pinned += 1
    return pinned
