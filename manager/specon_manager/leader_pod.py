"""The leader's mark on its own pod: the label ``specon.io/leader: "true"`` while it leads.

With leader election every replica is Ready (it serves ``/healthz``, the status and
``/metrics``), so readiness cannot pick the agents' replica. The HA component's Service
selects this label as well: its endpoints are the pods that are Ready *and* marked, the
leader alone, as Patroni marks its primary for a Service to select. The mark is set once the
leader has taken over (its coordinator rebuilt from the journal) and removed when it stands
down; a replica removes a mark left on its pod by an earlier process before it campaigns. A
mark that could not be removed (the API unreachable) routes some agents to a standby, which
answers them 503 until they retry: a delay, never a second leader (the Lease decides that).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from specon.runtime.kubernetes.api import MERGE_PATCH, KubeError, pods_path

log = structlog.get_logger()

LEADER_LABEL = "specon.io/leader"


class PodApi(Protocol):
    """The one call made (``specon.runtime.kubernetes.api.KubeApi``'s)."""

    def request(self, method: str, path: str, *, body: object = None, content_type: str = ...) -> Any: ...


class LeaderPod:
    """Marks one pod (this replica's own) as the leader's or not."""

    def __init__(self, api: PodApi, *, namespace: str, pod: str, retry_period: float = 2.0) -> None:
        self.api, self.namespace, self.pod = api, namespace, pod
        self.retry_period = retry_period
        # What is wanted now, set on the event loop as each call is made. A mark's thread
        # outlives its cancelled task (a replica standing down mid-mark), so every write, one
        # at a time, sends what is wanted when it runs: the last to land is the last asked.
        self.wanted: bool | None = None
        self._one_at_a_time = threading.Lock()

    @property
    def path(self) -> str:
        return f"{pods_path(self.namespace)}/{self.pod}"

    def _write(self) -> None:
        """Send what is wanted now (blocking); ``KubeError`` if the API refuses."""
        with self._one_at_a_time:
            label = "true" if self.wanted else None
            body: dict[str, Any] = {"metadata": {"labels": {LEADER_LABEL: label}}}
            self.api.request("PATCH", self.path, body=body, content_type=MERGE_PATCH)

    async def keep_marking(self, still: Callable[[], bool] | None = None) -> None:
        """Label the pod the leader's until that succeeds (every ``retry_period``; each
        distinct error logged once), or ``still()`` turns false."""
        failing, leading = None, True
        self.wanted = leading
        while still is None or still():
            try:
                await asyncio.to_thread(self._write)
            except KubeError as exc:
                if str(exc) != failing:
                    log.warning(
                        "specon.manager.leader_mark_failed", pod=self.pod, leading=leading, error=str(exc)
                    )
                failing = str(exc)
                await asyncio.sleep(self.retry_period)
                continue
            log.info("specon.manager.leader_marked", pod=self.pod, leading=leading)
            return

    async def unmark(self) -> None:
        """Remove the label once (best effort: the process may be stopping)."""
        self.wanted = False
        try:
            await asyncio.to_thread(self._write)
        except KubeError as exc:
            log.warning("specon.manager.leader_mark_failed", pod=self.pod, leading=False, error=str(exc))
