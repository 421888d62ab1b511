"""Each managed pod's restore record, written when its node's agent first sees it running.

A save records the pod it evicts (``writes.PodWrites.evict``); a pod that goes without
one (``kubectl drain``, a node-pressure eviction, a node lost with its kubelet) would leave
nothing trusted to restore the job from, and a bare pod has no controller to recreate it. So
the agent records every managed, movable pod once, the first time it lists it alive (again
after a failure, at the next listing), and the reconciler can restore the job from that
record wherever it runs nowhere. A start that takes over from a lost node records the pod it
deletes the same way (``takeover``). The writes go through the runtime's ``PodWriter``.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from specon.runtime.base import RuntimeFailure
from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.pods import Manifest
from specon.runtime.kubernetes.writes import PodRef, PodWriter

log = structlog.get_logger("specon.k8s")


class Recorder:
    def __init__(self, writer: PodWriter, *, include_owned: bool) -> None:
        self._writer = writer
        self._include_owned = include_owned
        self._recorded: set[str] = set()  # pod uids this agent has recorded

    async def first_sight(self, found: Iterable[Manifest]) -> None:
        """Record the pods of ``found`` not recorded yet that a save could move."""
        for pod in found:
            uid = str(pods.meta(pod).get("uid") or "")
            if not uid or uid in self._recorded or not pods.alive(pod) or not pods.migratable(pod):
                continue
            if pods.owners(pod) and not self._include_owned:
                continue
            try:
                await self._writer.record(pods.job_id(pod), PodRef.of(pod))
            except (RuntimeFailure, KubeError) as exc:
                log.warning("specon.k8s.record_failed", pod="/".join(pods.key_of(pod)), error=str(exc))
                continue
            self._recorded.add(uid)
