"""The agent's priority action, its I/O shell: each tick, the CPU weights of the policy's
priority rule (``specon_agent.priority``) applied through the runtime, only those that changed.

A weight the runtime cannot apply is logged once per container (``specon.agent.cpu_weight_failed``),
counted, and tried again next tick; it never stops the agent. ``fair_seconds`` and the time
of the last tick are kept in a small file beside the monitor states, so a restarted agent
goes on accumulating them (the jobs ran on meanwhile) instead of starting from zero; so are
the quality points of the jobs that finished here (each reported to the manager with its ended
container) and the cluster's quality point per model, as the manager last sent them
(``priority.quality_point: memory``; ``specon.policy.quality_memory``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import structlog

from specon import checkpoint as ckpt
from specon.config import PriorityConfig
from specon.model import ContainerId
from specon.runtime.base import Runtime
from specon.wire.protocol import QualityPoint
from specon_agent.priority import Running, accrue, changed, decide, finished_shares

log = structlog.get_logger()


def state_path(monitor_file: Path) -> Path:
    """Where the priority state lives beside the monitor states (``monitor.priority.json``)."""
    return monitor_file.with_name(f"{monitor_file.stem}.priority.json")


class CpuWeights:
    """One worker's CPU weights: the rule's wish, what is in effect, and ``fair_seconds``."""

    def __init__(self, runtime: Runtime, cfg: PriorityConfig, *, state_file: Path | None = None) -> None:
        self.runtime = runtime
        self.cfg = cfg
        self.state_file = state_file
        self.fair: dict[ContainerId, float] = {}
        self.last_tick: float | None = None
        # The quality point measured of each job that finished here (``finished_shares``), the
        # running jobs of the last tick (a job gone since, having trained its steps, finished),
        # and each model's on the cluster as the manager sent them, with their version.
        self.finished: dict[ContainerId, float] = {}
        self._running: Sequence[Running] = ()
        self.shares: dict[str, float] = {}
        self.quality_version = 0  # 0: none yet
        # The weight in effect per running container (what heartbeats and /metrics report).
        self.applied: dict[ContainerId, int] = {}
        self.failures = 0
        self._failing: set[ContainerId] = set()  # logged once until it works again
        self._load()

    @property
    def enabled(self) -> bool:
        return self.cfg.rule != "none"

    def weight_of(self, cid: ContainerId) -> int | None:
        return self.applied.get(cid)

    async def tick(self, running: Sequence[Running], capacity: float, now: float) -> dict[ContainerId, int]:
        """Accrue the fair shares up to ``now``, decide every weight, apply those that
        changed; the weights decided."""
        if not self.enabled:
            return {}
        # Each container since the last tick or its start, whichever is later.
        dt = math.inf if self.last_tick is None else now - self.last_tick
        self.fair, self.last_tick = accrue(self.fair, running, capacity, dt, now=now), now
        self.finished.update(finished_shares(self._running, running))
        self._running = running
        wanted = decide(running, self.fair, self.cfg, self.shares)
        for cid in set(self.applied) - set(wanted):  # no longer running here
            del self.applied[cid]
        self._failing &= set(wanted)
        for cid, weight in sorted(changed(wanted, self.applied).items()):
            await self._apply(cid, weight)
        self._save()
        return wanted

    async def _apply(self, cid: ContainerId, weight: int) -> None:
        try:
            ok = await self.runtime.set_cpu_weight(cid, weight)
            error = None if ok else "the runtime could not apply it (its log says why)"
        except Exception as exc:  # a backend bug: counted and logged, never fatal
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if ok:
            self.applied[cid] = weight
            self._failing.discard(cid)
            log.debug("specon.agent.cpu_weight_set", container=cid, weight=weight)
            return
        self.applied.pop(cid, None)  # whatever is in effect now, it is not known to be ours
        self.failures += 1
        if cid not in self._failing:
            self._failing.add(cid)
            log.warning("specon.agent.cpu_weight_failed", container=cid, weight=weight, error=error)

    def forget(self, cids: Iterable[ContainerId]) -> None:
        """Drop what is kept of containers the agent forgot (gone past its retention)."""
        for cid in cids:
            self.fair.pop(cid, None)
            self.finished.pop(cid, None)

    def learn(self, version: int | None, points: Iterable[QualityPoint]) -> None:
        """Take the cluster's quality points (a ``CommandBatch``'s; ``version`` None: none sent)."""
        if version is None or version == self.quality_version:
            return
        self.shares, self.quality_version = {p.model: p.share for p in points}, version
        self._save()

    # -- persistence -----------------------------------------------------------------------
    def _load(self) -> None:
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            raw: Any = json.loads(self.state_file.read_text())
            fair = {ContainerId(str(k)): float(v) for k, v in raw["fair_seconds"].items()}
            at = raw.get("at")
            last = None if at is None else float(at)
            finished = {ContainerId(str(k)): float(v) for k, v in raw.get("finished", {}).items()}
            shares = {str(k): float(v) for k, v in raw.get("quality_points", {}).items()}
            version = int(raw.get("quality_version") or 0)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("specon.agent.priority_state_unreadable", path=str(self.state_file), error=str(exc))
            return
        self.fair = {k: v for k, v in fair.items() if math.isfinite(v) and v >= 0}
        self.last_tick = last if last is not None and math.isfinite(last) else None
        self.finished = {k: v for k, v in finished.items() if 0 <= v <= 1}
        self.shares = {k: v for k, v in shares.items() if 0 <= v <= 1}
        self.quality_version = version if len(self.shares) == len(shares) and version >= 0 else 0  # asks anew

    def _save(self) -> None:
        if self.state_file is None:
            return
        data = {
            "at": self.last_tick,
            "fair_seconds": self.fair,
            "finished": self.finished,
            "quality_points": self.shares,
            "quality_version": self.quality_version,
        }
        try:
            ckpt.atomic_write(self.state_file, json.dumps(data, sort_keys=True).encode())
        except OSError as exc:  # weights go on; only a restart would lose the fair shares
            log.warning("specon.agent.priority_state_unwritable", path=str(self.state_file), error=str(exc))
