"""Usage readings of one Kubernetes node: allocatable capacity from the node object (the
runtime then deducts what the node's unmanaged pods request: ``k8s_others``), CPU
utilisation from metrics.k8s.io when it is served, else from ``/proc/stat`` deltas (a node's
agent sees the node's)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from specon.model import Resources, WorkerId
from specon.runtime.base import WorkerUsage
from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.runtime.kubernetes.pods import PodError

log = structlog.get_logger()

_METRICS_RETRY_S = 300.0  # how long a missing metrics API is believed missing


class NodeUsage:
    """The usage readings of ``node``; ``source`` says where the last utilisation came from
    (``metrics``, ``proc``, or ``none`` before the first reading)."""

    def __init__(self, api: KubeApi, node: str, *, metrics: bool = True, proc: Path = Path("/proc")) -> None:
        self.api = api
        self.node = node
        self.metrics = metrics
        self.proc = proc
        self._metrics_down_until = 0.0
        self._last_cpu: tuple[float, float] | None = None  # (busy, total) jiffies of /proc/stat
        self.source = "none"

    async def read(self, worker: WorkerId, node: Mapping[str, Any] | None) -> WorkerUsage:
        """The reading for ``worker`` given its node object (None: unknown, zero capacity)."""
        capacity = pods.node_capacity(node) if node else Resources()
        busy, total = proc_cpu(self.proc)
        util = await self._metrics_utilisation(capacity)
        if util is None:
            util = self._proc_utilisation(busy, total)
            self.source = "proc"
        else:
            self.source = "metrics"
        self._last_cpu = (busy, total)
        return WorkerUsage(
            worker=worker,
            capacity=capacity,
            cpu_utilisation=min(1.0, max(0.0, util)),
            cpu_seconds=busy / clock_ticks(),
            enforcement="kubernetes",
        )

    async def _metrics_utilisation(self, capacity: Resources) -> float | None:
        """CPU use / allocatable CPU from metrics.k8s.io, None when the API is absent."""
        if not self.metrics or capacity.cpu <= 0 or time.monotonic() < self._metrics_down_until:
            return None
        try:
            data = await asyncio.to_thread(
                self.api.request, "GET", f"/apis/metrics.k8s.io/v1beta1/nodes/{self.node}"
            )
            return pods.quantity((data.get("usage") or {})["cpu"]) / capacity.cpu
        except (KubeError, KeyError, PodError) as exc:
            self._metrics_down_until = time.monotonic() + _METRICS_RETRY_S
            log.info("specon.k8s.metrics_unavailable", node=self.node, error=str(exc), fallback="proc")
            return None

    def _proc_utilisation(self, busy: float, total: float) -> float:
        if self._last_cpu is None:
            return 0.0
        d_busy, d_total = busy - self._last_cpu[0], total - self._last_cpu[1]
        return d_busy / d_total if d_total > 0 else 0.0


def clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def proc_cpu(proc: Path) -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from ``/proc/stat``; zeros when unreadable."""
    try:
        with open(proc / "stat") as fh:
            fields = fh.readline().split()
        values = [float(v) for v in fields[1:]]
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)  # idle + iowait
    # guest time is already counted in user/nice: count fields 1-8 only
    total = sum(values[:8])
    return total - idle, total
