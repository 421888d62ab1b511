"""A pod's cgroup on its node: where the Kubernetes backend sets a job's CPU weight and reads
its CPU seconds.

The kubelet makes one cgroup per pod under its QoS class, below the ``kubepods`` root of
its ``--cgroup-root``: with the cgroupfs driver ``kubepods/pod<uid>`` (Guaranteed),
``kubepods/burstable/pod<uid>``, ``kubepods/besteffort/pod<uid>``; with the systemd driver
``kubepods.slice/kubepods-pod<uid_>.slice``,
``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`` and the
BestEffort alike (``uid_``: the uid with ``_`` for ``-``). On cgroup v1 the weight goes to
the pod group's ``cpu.shares`` (``cpu_shares(weight)``) and the CPU seconds come from
``cpuacct.usage``; on cgroup v2 they are ``cpu.weight`` and ``cpu.stat``'s ``usage_usec``.

The agent must run on the node with the host's ``/sys/fs/cgroup`` mounted writable (a
privileged DaemonSet); elsewhere every weight is refused with one logged reason. A weight
orders pods only against their siblings: pods of one QoS class (Guaranteed pods are
siblings of the Burstable and BestEffort groups). The kubelet sets a pod's shares when it
creates its cgroup (and again on a resize); the agent writes only weights that changed.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from specon.model import ContainerId
from specon.runtime.base import cpu_shares
from specon.runtime.kubernetes.nodes import PodError, quantity

log = structlog.get_logger()

CGROUP_ROOT = Path("/sys/fs/cgroup")
QOS_CLASSES = ("Guaranteed", "Burstable", "BestEffort")
KUBEPODS = ("kubepods", "kubepods.slice")
_SEARCH_DEPTH = 5  # levels below a hierarchy's top searched for a kubepods root
RESEARCH_S = 30.0  # a pod not found searches the hierarchy again at most this often


# -- pure rules --------------------------------------------------------------------------------
def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, Mapping)]


def qos_class(pod: Mapping[str, Any]) -> str:
    """The pod's QoS class: ``status.qosClass`` as the API server set it, else computed by
    the same rule (every container's CPU and memory limited, requests equal to limits:
    Guaranteed; nothing requested or limited: BestEffort; else Burstable)."""
    given = (pod.get("status") or {}).get("qosClass")
    if given in QOS_CLASSES:
        return str(given)
    guaranteed, anything = True, False
    for c in _containers(pod):
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for r in ("cpu", "memory"):
            anything = anything or r in limits or r in requests
            if r not in limits or str(requests.get(r, limits[r])) != str(limits[r]):
                guaranteed = False
    if guaranteed and anything:
        return "Guaranteed"
    return "Burstable" if anything else "BestEffort"


def pod_cpu_limit(pod: Mapping[str, Any]) -> float | None:
    """The CPU the pod may use at most, the sum of its containers' limits; None when a
    container has no CPU limit (or one cannot be read)."""
    total = 0.0
    for c in _containers(pod):
        limit = ((c.get("resources") or {}).get("limits") or {}).get("cpu")
        if limit is None:
            return None
        try:
            total += quantity(limit)
        except PodError:
            return None
    return total or None


def pod_cgroup_names(uid: str, qos: str) -> tuple[PurePosixPath, ...]:
    """The pod's cgroup below a ``kubepods`` root, for the cgroupfs and the systemd driver."""
    if not uid or "/" in uid or uid in {".", ".."}:
        raise ValueError(f"bad pod uid {uid!r}")
    under = "" if qos == "Guaranteed" else qos.lower()
    escaped = uid.replace("-", "_")
    slice_prefix = "kubepods" if not under else f"kubepods-{under}"
    return (
        PurePosixPath(under, f"pod{uid}") if under else PurePosixPath(f"pod{uid}"),
        PurePosixPath(f"{slice_prefix}.slice" if under else "", f"{slice_prefix}-pod{escaped}.slice"),
    )


def find_kubepods(top: Path, depth: int = _SEARCH_DEPTH) -> list[Path]:
    """Every ``kubepods`` root at most ``depth`` levels below ``top`` (one per kubelet whose
    ``--cgroup-root`` is there), without descending into one."""
    found: list[Path] = []
    level = [top]
    for _ in range(depth + 1):
        below: list[Path] = []
        for d in level:
            if d.name in KUBEPODS:
                found.append(d)
                continue
            with contextlib.suppress(OSError):
                below.extend(
                    Path(e.path)
                    for e in os.scandir(d)
                    if e.is_dir(follow_symlinks=False) and not e.name.startswith("pod")
                )
        level = below
    return sorted(found)


# -- the node's cgroup files -------------------------------------------------------------------
class PodCgroups:
    """Pod cgroups under ``root`` (the node's ``/sys/fs/cgroup``, as mounted in the agent)."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        self.v2 = (root / "cgroup.controllers").exists()
        # The hierarchy holding the CPU controller (cpu and cpuacct may be one v1 mount).
        self.cpu_top = root if self.v2 else root / "cpu"
        self.acct_top = root if self.v2 else root / "cpuacct"
        self._roots: list[PurePosixPath] | None = None  # kubepods roots, relative to cpu_top
        self._searched = -math.inf  # monotonic time of the last search for them
        self._found: dict[str, PurePosixPath] = {}  # pod uid -> its group, relative
        self._warned: set[str] = set()

    def unavailable(self) -> str | None:
        """Why no weight can be set on this node from here, or None."""
        if self.v2:  # the v2 root has no cpu.weight of its own: ask which controllers it offers
            try:
                has_cpu = "cpu" in (self.root / "cgroup.controllers").read_text().split()
            except OSError:
                has_cpu = False
        else:
            has_cpu = (self.cpu_top / "cpu.shares").exists()
        if not has_cpu:
            return f"no cgroup CPU controller at {self.cpu_top} (mount the node's /sys/fs/cgroup)"
        if not os.access(self.cpu_top, os.W_OK):
            return f"{self.cpu_top} is not writable (the agent needs the node's cgroups read-write)"
        return None

    def locate(self, pod: Mapping[str, Any]) -> PurePosixPath | None:
        """The pod's group relative to the CPU hierarchy's top, None when not found."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid in self._found:
            return self._found[uid]
        try:
            names = pod_cgroup_names(uid, qos_class(pod))
        except ValueError:
            return None
        for fresh in (False, True):  # a kubelet started after the last search: look again
            if self._roots is None or (fresh and time.monotonic() - self._searched >= RESEARCH_S):
                self._searched = time.monotonic()
                self._roots = [
                    PurePosixPath(p.relative_to(self.cpu_top)) for p in find_kubepods(self.cpu_top)
                ]
            for base in self._roots:
                for name in names:
                    if (self.cpu_top / base / name).is_dir():
                        self._found[uid] = base / name
                        return base / name
        return None

    def set_weight(self, job: ContainerId, pod: Mapping[str, Any] | None, weight: int) -> bool:
        """Write ``weight`` into ``pod``'s group; False, logged once per job and reason, when
        it cannot be (blocking file I/O: call it off the event loop)."""
        try:
            value = weight if self.v2 else cpu_shares(weight)
            why = self.unavailable()
            if why is not None:
                raise OSError(why)
            if pod is None:
                raise OSError("no live pod of the job on this node")
            rel = self.locate(pod)
            if rel is None:
                raise OSError(
                    f"no cgroup of pod uid {(pod.get('metadata') or {}).get('uid')} under a kubepods root"
                )
            with open(self.cpu_top / rel / ("cpu.weight" if self.v2 else "cpu.shares"), "w") as fh:
                fh.write(str(value))
        except (OSError, ValueError) as exc:
            key = "" if self.unavailable() else f"{job}: {exc}"  # one warning for a whole node
            if key not in self._warned:
                self._warned.add(key)
                log.warning("specon.k8s.cpu_weight_unavailable", container=job, error=str(exc))
            return False
        return True

    def cpu_seconds(self, live: Sequence[tuple[ContainerId, Mapping[str, Any]]]) -> dict[ContainerId, float]:
        """Cumulative CPU seconds of each live pod's group that can be read (blocking); the
        groups of pods no longer live are forgotten."""
        uids = {str((pod.get("metadata") or {}).get("uid") or "") for _, pod in live}
        for gone in set(self._found) - uids:
            del self._found[gone]
        out: dict[ContainerId, float] = {}
        for job, pod in live:
            rel = self.locate(pod)
            if rel is None:
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                if self.v2:
                    stat = (self.cpu_top / rel / "cpu.stat").read_text().split()
                    out[job] = int(stat[stat.index("usage_usec") + 1]) / 1e6
                else:
                    out[job] = int((self.acct_top / rel / "cpuacct.usage").read_text().split()[0]) / 1e9
        return out
