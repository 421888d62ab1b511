"""cgroup v2 (the unified hierarchy) CPU groups: detection, delegation, and one group.

A worker's group is ``<own>/<parent>/<cluster>/<worker>``, ``<own>`` being the group this
process runs in (``0::<path>`` in ``/proc/self/cgroup``, found under the mount by the group
whose ``cgroup.procs`` lists this process: inside a container or a foreign cgroup namespace
the path read there need not exist under ``/sys/fs/cgroup`` as named). Its budget is
``cpu.max`` (``"<quota> <period>"``), each job's group ``job-<id>`` below it carries the job's
``cpu.weight`` (the specon weight itself, 1..10000: no conversion) and ``cgroup.freeze``, and
CPU time is ``usage_usec`` of ``cpu.stat``.

cgroup v2 allows controllers only in groups without processes of their own ("no internal
processes", the root excepted). So ``delegate`` enables ``cpu`` (and ``cpuset`` where offered)
level by level, from the mount's root down to ``<own>``, in each ``cgroup.subtree_control``;
where ``<own>`` itself still holds processes (the agent, and whatever else runs in its group)
they are first moved into the leaf ``<own>/specon-agent``. That is the layout systemd
prescribes for a delegated unit (``Delegate=yes``: the unit's processes live in a leaf and
the unit manages the rest of its subtree), so an agent run with ``systemd-run --scope -p
Delegate=yes`` or as a container's main process needs nothing else; agents started later from
that leaf recognise it and put their workers beside it. Groups above ``<own>`` that hold
processes are never touched: that is reported, with what to do. A worker's group holds no
process either: a process without a job group of its own goes into ``<worker>/misc``.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from specon.model import WEIGHT_MAX, WEIGHT_MIN
from specon.runtime.local.cgroup_files import (
    PERIOD_US,
    check_part,
    make_group,
    quota_us,
    read_value,
    write_value,
)
from specon.runtime.local.procfs import PROC, own_unified

log = structlog.get_logger()

# Where the processes of this process's own group go when that group must enable controllers.
AGENT_LEAF = "specon-agent"
# A worker's processes that have no job group of their own (its group may hold none).
WORKER_LEAF = "misc"
# The controllers a worker needs, and those it uses where offered (pinning, for weights).
REQUIRED = ("cpu",)
OPTIONAL = ("cpuset",)
DELEGATE_HINT = (
    "run the agent as root in a group of its own, e.g. a delegated systemd scope"
    " (systemd-run --scope -p Delegate=yes -- specon-agent ...) or as a container's main process"
)


def is_unified(root: Path) -> bool:
    """True when ``root`` is a cgroup v2 mount (it has ``cgroup.controllers``)."""
    return (root / "cgroup.controllers").is_file()


def _words(path: Path) -> frozenset[str]:
    """The space-separated words of a control file (empty when it does not exist)."""
    try:
        return frozenset(read_value(path).split())
    except FileNotFoundError:
        return frozenset()


def _procs(group: Path) -> set[int]:
    try:
        return {int(x) for x in read_value(group / "cgroup.procs").split()}
    except (FileNotFoundError, NotADirectoryError):
        return set()


@dataclass(frozen=True, slots=True)
class UnifiedDetection:
    """Whether a cgroup v2 hierarchy is here, why (not), and this process's group in it."""

    available: bool
    reason: str
    root: Path | None = None
    own: Path | None = None  # the group worker groups nest under


def resolve_own(root: Path, own: str, pid: int) -> Path | None:
    """This process's group under ``root``: the first of ``<root>/<own>`` and its shorter
    suffixes (a mount of a subtree: a container, a cgroup namespace) whose ``cgroup.procs``
    lists ``pid``; else ``<root>/<own>`` if it exists; else None."""
    parts = [check_part(p) for p in own.split("/") if p]
    candidates = [root.joinpath(*parts[i:]) for i in range(len(parts) + 1)]
    for group in candidates:
        if pid in _procs(group):
            return group
    return candidates[0] if candidates[0].is_dir() else None


def detect_unified(*, root: Path, proc: Path = PROC, pid: int | None = None) -> UnifiedDetection:
    """Look for a writable cgroup v2 mount at ``root`` and this process's group in it."""
    if not is_unified(root):
        return UnifiedDetection(False, f"{root} is not a cgroup v2 (unified) mount")
    path = own_unified(proc=proc)
    if path is None:
        return UnifiedDetection(False, f"{proc}/self/cgroup has no cgroup v2 line (0::<path>)")
    try:
        own = resolve_own(root, path, os.getpid() if pid is None else pid)
    except ValueError as exc:
        return UnifiedDetection(False, f"{proc}/self/cgroup names an odd group {path!r}: {exc}")
    if own is None and os.access(root, os.W_OK):
        # Seen on the GPU machine: the group named there does not exist under the mount and
        # no group lists this process (another PID or cgroup namespace); the mount's root is
        # writable, so workers nest under it, outside this process's own limits.
        log.info("specon.runtime.cgroup_v2_own_not_found", own=path, root=str(root))
        own = root
    if own is None:
        return UnifiedDetection(
            False,
            f"this process's cgroup {path} (from {proc}/self/cgroup) is not under {root}, nor is"
            f" any group listing it, and {root} is not writable: mount the cgroup2 hierarchy it"
            f" belongs to at {root}",
        )
    if own.name == AGENT_LEAF and own != root:
        own = own.parent  # an agent started from the leaf an earlier one made: workers go beside it
    if not os.access(own, os.W_OK):
        why = f"{own} is not writable (a read-only mount, or not delegated to this user)"
        return UnifiedDetection(False, f"{why}: {DELEGATE_HINT}")
    return UnifiedDetection(True, "cgroup v2", root, own)


def _enable(group: Path, controller: str) -> None:
    """``+controller`` in ``group``'s ``cgroup.subtree_control`` unless there already."""
    if controller not in _words(group / "cgroup.subtree_control"):
        write_value(group / "cgroup.subtree_control", f"+{controller}")


def _hand_down(group: Path) -> list[int]:
    """Move every process of ``group`` into its leaf ``AGENT_LEAF``; the pids moved."""
    leaf = group / AGENT_LEAF
    leaf.mkdir(exist_ok=True)
    moved: list[int] = []
    for _ in range(5):  # again for processes forked while the first ones moved
        left = _procs(group) - set(moved)
        if not left:
            break
        for pid in sorted(left):
            with contextlib.suppress(ProcessLookupError):  # ESRCH: it exited meanwhile
                write_value(leaf / "cgroup.procs", pid)
            moved.append(pid)
    return moved


def delegate(det: UnifiedDetection, *, hand_down: bool = True) -> frozenset[str]:
    """Make ``REQUIRED`` (and what it can of ``OPTIONAL``) available to the children of
    ``det.own``, enabling each level from the mount's root down; the controllers enabled.

    ``OSError`` saying which file, which controller and what to do when a required one
    cannot be: not offered (bound to a v1 hierarchy, or not delegated), an ancestor that
    holds processes, a refused write. ``hand_down``: move ``own``'s processes into its leaf
    where they stand in the way (otherwise that is an error too).
    """
    if det.root is None or det.own is None:
        raise OSError(f"no cgroup v2 group: {det.reason}")
    chain = [det.own, *det.own.parents]
    chain = list(reversed(chain[: chain.index(det.root) + 1])) if det.root in chain else [det.own]
    enabled = set(_words(det.root / "cgroup.controllers")) & {*REQUIRED, *OPTIONAL}
    for controller in REQUIRED:
        if controller not in enabled:
            offered = " ".join(sorted(_words(det.root / "cgroup.controllers"))) or "none"
            raise OSError(
                f"the {controller} controller is not offered by {det.root}/cgroup.controllers"
                f" ({offered}): it is bound to a cgroup v1 hierarchy or disabled; boot with"
                " cgroup_no_v1=all (or systemd.unified_cgroup_hierarchy=1) or use the v1 mount"
            )
    for group in chain:
        for controller in sorted(enabled):
            optional = controller not in REQUIRED
            try:
                try:
                    _enable(group, controller)
                except OSError as exc:
                    if exc.errno != errno.EBUSY or group != det.own or not hand_down:
                        raise
                    moved = _hand_down(group)
                    log.info("specon.runtime.cgroup_leaf", group=str(group / AGENT_LEAF), moved=moved)
                    _enable(group, controller)
            except OSError as exc:
                if optional:
                    enabled.discard(controller)
                    continue
                why = (
                    f"{group} holds processes of its own (cgroup v2 allows controllers only in"
                    " groups without them)"
                    if exc.errno == errno.EBUSY
                    else str(exc)
                )
                raise OSError(
                    f"cannot enable the {controller} controller in {group}/cgroup.subtree_control:"
                    f" {why}; {DELEGATE_HINT}"
                ) from exc
    return frozenset(enabled)


@dataclass(frozen=True, slots=True)
class UnifiedGroup:
    """One group of the unified hierarchy: a worker's (``inner``: its processes live in its
    children) or a job's (a leaf)."""

    dir: Path
    # The first directory this group's path created below the base; ``remove`` stops there.
    levels: int
    controllers: frozenset[str] = frozenset(REQUIRED)
    inner: bool = True
    _parents: tuple[Path, ...] = field(default=(), repr=False)

    @classmethod
    def at(cls, base: Path, *parts: str, controllers: Iterable[str] = REQUIRED) -> UnifiedGroup:
        """The worker group ``parts`` below ``base`` (a delegated group: ``delegate``)."""
        for part in parts:
            check_part(part)
        levels = tuple(base.joinpath(*parts[:i]) for i in range(len(parts)))
        return cls(base.joinpath(*parts), len(parts), frozenset(controllers), True, levels)

    @property
    def cpu_dir(self) -> Path:
        return self.dir

    def _dirs(self) -> list[Path]:
        return [self.dir]

    @property
    def procs_files(self) -> tuple[Path, ...]:
        return ((self.dir / WORKER_LEAF if self.inner else self.dir) / "cgroup.procs",)

    def create(self, cpus: float) -> None:
        """Make the group (its parents too), enable its controllers down to it, make its leaf
        for stray processes and set its budget; ``OSError`` if refused."""
        make_group(self.dir)
        for group in (*self._parents, self.dir):
            for controller in sorted(self.controllers):
                _enable(group, controller)
        (self.dir / WORKER_LEAF).mkdir(exist_ok=True)
        self.set_cpus(cpus)

    def set_cpus(self, cpus: float) -> None:
        """``cpu.max``: the quota per period; takes effect at once, also for running jobs."""
        write_value(self.dir / "cpu.max", f"{quota_us(cpus)} {PERIOD_US}")

    def child(self, name: str) -> UnifiedGroup:
        """The job group ``name`` directly below this one (a leaf)."""
        return UnifiedGroup(self.dir / check_part(name), 1, self.controllers, False, (self.dir,))

    def make(self) -> None:
        """Create this group below an existing parent (no budget: it shares the parent's)."""
        self.dir.mkdir(exist_ok=True)

    def set_weight(self, weight: int) -> None:
        """``cpu.weight`` = ``weight``: the specon weight is already in cgroup-v2 units."""
        if not WEIGHT_MIN <= weight <= WEIGHT_MAX:
            raise ValueError(f"CPU weight must be within [{WEIGHT_MIN}, {WEIGHT_MAX}], got {weight}")
        write_value(self.dir / "cpu.weight", weight)

    def children(self) -> list[str]:
        with contextlib.suppress(OSError):
            return sorted(e.name for e in os.scandir(self.dir) if e.is_dir(follow_symlinks=False))
        return []

    def usage_ns(self) -> int:
        """``usage_usec`` of ``cpu.stat`` (this group and every group below it), in ns."""
        for line in read_value(self.dir / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) * 1000
        raise ValueError(f"{self.dir}/cpu.stat has no usage_usec line")

    def pids(self) -> set[int]:
        return _procs(self.dir)

    def exists(self) -> bool:
        return self.dir.is_dir()

    def remove(self) -> bool:
        """rmdir the empty children (jobs, the leaf), the group, then its empty created
        parents; True when the group is gone. A group with processes (EBUSY) stays."""
        for name in self.children():
            with contextlib.suppress(OSError):
                (self.dir / name).rmdir()
        for level, path in enumerate([self.dir, *self.dir.parents][: self.levels]):
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError:
                return level > 0  # a busy parent: another worker or cluster still uses it
        return True
