"""``specon demo --lose WORKER@SECONDS``: hosts lost during a real run, and what they cost.

At each loss the worker's agent and every job process on it are killed at once
(``EmbeddedCluster.lose_host``). With specon the manager's reconciler restores the jobs from
their newest checkpoints once the worker has been silent for ``recovery.after``, as
``recovered`` migrations. In the DS run (no daemons) the driver plays a Kubernetes Job's
controller instead: after the same delay it starts each killed job again from scratch (its
checkpoints removed) on the live worker running the fewest jobs. ``lost_steps`` reads the
work lost from a job's progress log, the same way for both runs.
"""

from __future__ import annotations

import math
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec


@dataclass(frozen=True, slots=True)
class HostLoss:
    """``worker``'s host dies ``at`` seconds after the run starts."""

    worker: WorkerId
    at: float


def parse_loss(text: str) -> HostLoss:
    """``WORKER@SECONDS`` (``w1@60``); ``ValueError`` saying what is wrong."""
    worker, sep, at = text.partition("@")
    if not sep or not worker.strip():
        raise ValueError(f"expected WORKER@SECONDS (e.g. w1@60), got {text!r}")
    try:
        seconds = float(at)
    except ValueError:
        raise ValueError(f"SECONDS must be a number, got {at!r} in {text!r}") from None
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"SECONDS must be >= 0, got {at!r} in {text!r}")
    return HostLoss(WorkerId(worker.strip()), seconds)


def lost_steps(records: Iterable[Mapping[str, Any]]) -> int:
    """Steps a job trained and then lost: in each run of its process that was killed (it
    neither checkpointed on a stop nor finished), those past the step the next run began at."""
    lost = 0
    last: int | None = None  # the last step the current run trained; None: no run yet
    clean = True
    for r in records:
        event = r.get("event")
        if event == "started":
            step = int(r.get("step", 0))
            if last is not None and not clean:
                lost += max(0, last - step)
            last, clean = step, False
        elif event in ("checkpointed", "finished"):
            clean = True
        elif "loss" in r and "step" in r and last is not None:
            last = int(r["step"])
    return lost


Say = Callable[[str], None]


class HostLosses:
    """Plays ``losses`` in one run; ``restart_after``: the driver restarts killed jobs from
    scratch after this many seconds (the DS run), None: the manager restores them."""

    def __init__(
        self,
        losses: Sequence[HostLoss],
        *,
        restart_after: float | None,
        spec_of: Callable[[ContainerId], JobSpec],
        say: Say,
    ) -> None:
        self.losses = sorted(losses, key=lambda x: x.at)
        self.restart_after = restart_after
        self.spec_of = spec_of
        self.say = say
        self.dead: set[WorkerId] = set()
        self.restarts = 0
        self._due: list[tuple[float, ContainerId]] = []

    async def step(self, cluster: EmbeddedCluster, now: float, finished: Callable[[str], bool]) -> None:
        """Lose the hosts due by ``now``; restart the killed jobs due (DS)."""
        while self.losses and self.losses[0].at <= now:
            loss = self.losses.pop(0)
            if loss.worker in self.dead:
                continue
            self.dead.add(loss.worker)
            killed = await cluster.lose_host(loss.worker)
            what = ", ".join(killed) or "no job"
            self.say(f"host {loss.worker} lost: its agent and {len(killed)} job(s) killed ({what})")
            if self.restart_after is not None:
                self._due += [(now + self.restart_after, c) for c in killed]
        for item in [d for d in self._due if d[0] <= now]:
            self._due.remove(item)
            if not finished(item[1]):
                await self._restart(cluster, item[1])

    async def _restart(self, cluster: EmbeddedCluster, jid: ContainerId) -> None:
        live = [w for w in cluster.workers if w not in self.dead]
        if not live:
            return  # no worker left to run it
        infos = await cluster.containers()
        counts = Counter(c.worker for c in infos if c.alive)
        target = min(live, key=lambda w: counts[w])
        for info in infos:
            if info.id == jid:
                shutil.rmtree(info.checkpoint_dir, ignore_errors=True)  # from scratch
        await cluster.submit(self.spec_of(jid), target)
        self.restarts += 1
        self.say(f"{jid} restarted from scratch on {target} (as a Kubernetes Job's new pod)")
