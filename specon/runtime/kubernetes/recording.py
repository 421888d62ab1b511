"""Each managed pod's restore record, written when its node's agent first sees it running.

A save records the pod it evicts (``calls.PodCalls.write_record``); a pod that goes without
one (``kubectl drain``, a node-pressure eviction, a node lost with its kubelet) would leave
nothing trusted to restore the job from, and a bare pod has no controller to recreate it. So
the agent records every managed, movable pod once, the first time it lists it alive (again
after a failure, at the next listing), and the reconciler can restore the job from that
record wherever it runs nowhere. A start that takes over from a lost node records the pod it
deletes the same way (``takeover``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

import structlog

from specon.runtime.base import NoSuchContainer, SaveFailed
from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.calls import PodCalls
from specon.runtime.kubernetes.pods import Manifest

log = structlog.get_logger("specon.k8s")


class Recorder:
    def __init__(
        self, calls: PodCalls, labels_of: Callable[[str], Awaitable[dict[str, str]]], *, include_owned: bool
    ) -> None:
        self._calls = calls
        self._labels_of = labels_of  # a node's labels: a GPU job keeps to its product
        self._include_owned = include_owned
        self._recorded: set[str] = set()  # pod uids this agent has recorded

    async def write(self, pod: Manifest) -> None:
        """Record ``pod`` as the API server holds it now (``SaveFailed``, ``NoSuchContainer``)."""
        node = pods.node_of(pod)
        labels = await self._labels_of(node) if node else {}
        await asyncio.to_thread(self._calls.write_record, pods.job_id(pod), pod, labels)

    async def first_sight(self, found: Iterable[Manifest]) -> None:
        """Record the pods of ``found`` not recorded yet that a save could move."""
        for pod in found:
            uid = str(pods.meta(pod).get("uid") or "")
            if not uid or uid in self._recorded or not pods.alive(pod) or not pods.migratable(pod):
                continue
            if pods.owners(pod) and not self._include_owned:
                continue
            try:
                await self.write(pod)
            except (SaveFailed, NoSuchContainer) as exc:
                log.warning("specon.k8s.record_failed", pod="/".join(pods.key_of(pod)), error=str(exc))
                continue
            self._recorded.add(uid)
