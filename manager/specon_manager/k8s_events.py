"""The manager's Kubernetes Events: what became of each move, on the job's pod, for
``kubectl describe pod`` (the agents record what they did on their nodes:
``specon.runtime.kubernetes.events``).

When a migration ends the manager records, on the job's newest pod (the restored copy, or the
pod a move rolled back to), ``Moved`` (from, to, reason, downtime, steps lost), ``Recovered``
(a job that ran nowhere, restored) or ``MoveRolledBack`` (Warning, with why). Recorded with
the agents' recorder (queued, aggregated into series, rate-limited per pod, never in a
decision's way), reported by ``specon.io/manager``; the pod is looked up off the event loop,
and one that cannot be found is skipped, logged. A Job's pod: the same Event on the Job too
(``kubectl describe job``).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from specon.coordinator.migration import RECOVERIES, Migration, State
from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.runtime.kubernetes.calls import PodCalls
from specon.runtime.kubernetes.events import MANAGER_CONTROLLER, EventRecorder, owner_of
from specon.runtime.kubernetes.pods import DEFAULT_SELECTOR, PodError

log = structlog.get_logger()

Described = tuple[str, str, str, str]  # type, reason, action, note


def _seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} s"


def event_of(m: Migration) -> Described | None:
    """The Event an ended migration leaves on its job's pod (None: not ended)."""
    if m.state is State.DONE:
        lost = "" if m.lost_steps is None else f", {m.lost_steps} steps lost"
        step = "the start" if m.checkpoint_step is None else f"step {m.checkpoint_step}"
        if m.reason in RECOVERIES:
            note = (
                f"restored on {m.target} from {step} ({m.reason}: it ran nowhere after {m.source}); "
                f"down {_seconds(m.downtime)}{lost}"
            )
            return "Normal", "Recovered", "Recover", note
        note = (
            f"moved from {m.source} to {m.target} ({m.reason}) at {step}; down {_seconds(m.downtime)}{lost}"
        )
        return "Normal", "Moved", "Move", note
    if m.state is State.ROLLED_BACK:
        why = m.error or "no reason recorded"
        return (
            "Warning",
            "MoveRolledBack",
            "Move",
            f"move from {m.source} to {m.target} ({m.reason}) rolled back: {why}",
        )
    return None


class MigrationEvents:
    """Records ``event_of`` each ended migration on its job's newest pod (``on_migration``)."""

    def __init__(self, api: KubeApi, *, selector: str = DEFAULT_SELECTOR) -> None:
        self.recorder = EventRecorder(api, "specon-manager", controller=MANAGER_CONTROLLER)
        self._calls = PodCalls(api, selector)
        self._tasks: set[asyncio.Task[None]] = set()

    def on_migration(self, m: Migration) -> None:
        """Called as the manager journals ``m``; returns at once (needs a running loop)."""
        described = event_of(m)
        if described is None:
            return
        task = asyncio.get_running_loop().create_task(self._record(m, described))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, m: Migration, described: Described) -> None:
        try:
            existing = await asyncio.to_thread(self._calls.job_pods, m.container)
        except (KubeError, PodError, ValueError) as exc:
            log.info("specon.manager.event_skipped", container=m.container, error=str(exc))
            return
        if not existing:
            log.info("specon.manager.event_skipped", container=m.container, error="no pod of the job")
            return
        newest = max(existing, key=pods.current)
        self.recorder.record(newest, *described)
        if (job := owner_of(newest)) is not None:  # `kubectl describe job` says it too
            self.recorder.record(job, *described)

    async def drain(self) -> None:
        """Wait for every lookup and post under way (tests, a graceful stop)."""
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks)
        await self.recorder.drain()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.recorder.close()
