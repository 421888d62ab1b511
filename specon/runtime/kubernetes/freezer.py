"""Freezing a pod where it stands, and finding its processes' host PIDs: the pod's cgroup on
its node (``k8s_cgroup`` locates it), for the GPU priority action and NVML's PID map.

**Freeze.** Kubernetes has no pause API, so the agent freezes the pod's own cgroup: on v1 its
group in the ``freezer`` hierarchy (``freezer.state`` ``FROZEN``/``THAWED``), on v2 its
``cgroup.freeze`` (``1``/``0``, done when ``cgroup.events`` says ``frozen 1``). Both freeze
the whole subtree, so every container of the pod (and its sandbox) stops; memory, GPU memory
included, stays. A frozen process takes no signal until thawed, so a save or stop thaws the pod
before the kubelet's SIGTERM (the backend does). Where the node's cgroups are not mounted
writable in the agent (the default manifests; ``components/cpu-weights`` mounts them) every
freeze is refused, False with one logged reason.

**PIDs.** NVML names processes by their PID in the host's (initial) PID namespace. The agent
sees those only in that namespace (``hostPID: true``, ``components/gpu``): it checks its own
``NSpid`` in ``/proc/self/status`` (one entry: the initial namespace) and otherwise returns no
PIDs, logged once. The PIDs come from the pod's cgroup, ``cgroup.procs`` of its group and every
group below (v1: the CPU hierarchy; v2: the unified tree); where the node's cgroup tree is not
mounted, from ``/proc/<pid>/cgroup`` of every process, which names the pod's group.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from specon.model import ContainerId
from specon.runtime.kubernetes.cgroup import PodCgroups

log = structlog.get_logger()

FREEZE_WAIT_S = 2.0  # a freeze not complete by then (a task stuck in the kernel) is undone
_POLL_S = 0.002  # the measured freeze of a CUDA job took 6 ms


def host_pid_namespace(proc: Path) -> bool | None:
    """Whether this process is in the initial PID namespace (where NVML's PIDs live): its
    ``NSpid`` has one entry. None when the kernel does not say (before Linux 4.1)."""
    try:
        for line in (proc / "self" / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()[1:]) == 1
    except OSError:
        return None
    return None


def group_pids(group: Path) -> set[int]:
    """Every PID in ``group`` and the groups below it (v1's ``cgroup.procs`` lists only a
    group's own members; a pod's processes sit in its containers' child groups)."""
    out: set[int] = set()
    for dirpath, _, filenames in os.walk(group):
        if "cgroup.procs" in filenames:
            try:
                text = (Path(dirpath) / "cgroup.procs").read_text()
            except OSError:
                continue  # a container's group removed meanwhile
            out.update(int(t) for t in text.split() if t.isdigit() and int(t) > 0)
    return out


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def proc_pids(proc: Path, uids: Mapping[str, ContainerId]) -> dict[ContainerId, set[int]]:
    """The PIDs of each pod (by uid) from ``/proc/<pid>/cgroup``: its lines name the pod's
    group (``pod<uid>``, or ``pod<uid_>`` under the systemd driver)."""
    wanted = {f"pod{uid}": job for uid, job in uids.items()}
    wanted.update({f"pod{uid.replace('-', '_')}": job for uid, job in uids.items()})
    found = re.compile(r"pod[0-9a-fA-F_-]+")
    out: dict[ContainerId, set[int]] = {}
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return out
    for name in entries:
        try:
            text = (proc / name / "cgroup").read_text()
        except OSError:
            continue  # exited meanwhile
        for m in found.finditer(text):
            key = m.group(0)
            if key in wanted:
                out.setdefault(wanted[key], set()).add(int(name))
                break
    return out


class PodProcesses:
    """Freeze, thaw and list the processes of this node's pods (blocking file I/O: call the
    methods off the event loop)."""

    def __init__(self, cgroups: PodCgroups, proc: Path = Path("/proc")) -> None:
        self.cgroups = cgroups
        self.proc = proc
        # The freezer's hierarchy: v1 mounts it apart; v2 has it in every group of the tree.
        self.freezer_top = cgroups.root if cgroups.v2 else cgroups.root / "freezer"
        self.frozen: set[ContainerId] = set()  # frozen by this agent and not thawed since
        self._warned: set[str] = set()

    def _warn(self, key: str, event: str, **kw: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(event, **kw)

    # -- freezer ------------------------------------------------------------------------------
    def freezer_unavailable(self) -> str | None:
        """Why no pod can be frozen from here, or None."""
        # A mounted hierarchy's top has cgroup.procs (v1's root group has no freezer.state).
        if not (self.freezer_top / "cgroup.procs").exists():
            return f"no cgroup freezer at {self.freezer_top} (mount the node's /sys/fs/cgroup)"
        if not os.access(self.freezer_top, os.W_OK):
            return f"{self.freezer_top} is not writable (the agent needs the node's cgroups read-write)"
        return None

    def _group(self, pod: Mapping[str, Any]) -> Path:
        rel = self.cgroups.locate(pod)
        group = None if rel is None else self.freezer_top / rel
        if group is None or not group.is_dir():
            raise OSError(f"no freezer group of pod uid {_uid(pod)} under a kubepods root")
        return group

    def state(self, group: Path) -> bool:
        """Whether ``group`` is frozen (v1: FROZEN, not FREEZING; v2: ``frozen 1``)."""
        if self.cgroups.v2:
            return "frozen 1" in (group / "cgroup.events").read_text()
        return (group / "freezer.state").read_text().strip() == "FROZEN"

    def _write(self, group: Path, frozen: bool) -> None:
        if self.cgroups.v2:
            (group / "cgroup.freeze").write_text("1" if frozen else "0")
        else:
            (group / "freezer.state").write_text("FROZEN" if frozen else "THAWED")

    def set_frozen(self, job: ContainerId, pod: Mapping[str, Any] | None, frozen: bool) -> bool:
        """Freeze (or thaw) ``pod``'s group and wait until it is; False, logged once per job and
        reason, when it cannot be. A freeze that does not complete in ``FREEZE_WAIT_S`` is undone."""
        verb = "freeze" if frozen else "thaw"
        try:
            why = self.freezer_unavailable()
            if why is not None:
                if not frozen:
                    self.frozen.discard(job)
                    return True  # nothing here can have been frozen by this agent
                raise OSError(why)
            if pod is None:
                if not frozen:  # its pod is gone: nothing left frozen
                    self.frozen.discard(job)
                    return True
                raise OSError("no live pod of the job on this node")
            group = self._group(pod)
            self._write(group, frozen)
            deadline = time.monotonic() + FREEZE_WAIT_S
            while self.state(group) != frozen:
                if time.monotonic() >= deadline:
                    if frozen:
                        self._write(group, False)
                    raise OSError(f"the {verb} of {group} did not complete in {FREEZE_WAIT_S:g}s")
                time.sleep(_POLL_S)
            log.info(f"specon.k8s.pod_{'frozen' if frozen else 'thawed'}", container=job, group=str(group))
        except (OSError, ValueError) as exc:
            key = "" if self.freezer_unavailable() else f"{job}: {verb}: {exc}"  # once per node
            self._warn(key, f"specon.k8s.{verb}_unavailable", container=job, error=str(exc))
            return False
        (self.frozen.add if frozen else self.frozen.discard)(job)
        return True

    def is_frozen(self, pod: Mapping[str, Any]) -> bool:
        """Whether ``pod``'s group is frozen now (False where that cannot be read)."""
        try:
            return self.state(self._group(pod))
        except (OSError, ValueError):
            return False

    # -- PIDs ---------------------------------------------------------------------------------
    def pids(
        self, live: Sequence[tuple[ContainerId, Mapping[str, Any]]]
    ) -> dict[ContainerId, frozenset[int]]:
        """Host PIDs of each live pod's processes; empty (logged once) outside the host's PID
        namespace, where they would not be the PIDs NVML reports."""
        if host_pid_namespace(self.proc) is False:
            self._warn(
                "pidns",
                "specon.k8s.pids_unavailable",
                error="the agent is not in the host's PID namespace (hostPID: true, components/gpu): "
                "GPU processes cannot be matched to pods",
            )
            return {}
        out: dict[ContainerId, set[int]] = {}
        missing: dict[str, ContainerId] = {}
        for job, pod in live:
            rel = self.cgroups.locate(pod)
            if rel is None:
                if _uid(pod):
                    missing[_uid(pod)] = job
                continue
            found = group_pids(self.cgroups.cpu_top / rel)
            if found:
                out.setdefault(job, set()).update(found)
        if missing:  # no cgroup tree here (or not yet): each process's own cgroup file names it
            for job, found in proc_pids(self.proc, missing).items():
                out.setdefault(job, set()).update(found)
        return {job: frozenset(p) for job, p in out.items() if p}
