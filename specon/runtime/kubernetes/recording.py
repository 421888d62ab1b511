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

import asyncio
from collections.abc import Iterable

import structlog

from specon.runtime.base import RuntimeFailure
from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.pods import Manifest
from specon.runtime.kubernetes.writes import PodRef, PodWriter

log = structlog.get_logger("specon.k8s")


class Recorder:
    """Records each movable pod once, off the caller's way: ``first_sight`` starts the writes
    and returns (a listing must not wait on them: through the manager, a write may be asked
    again for tens of seconds while it restarts); a failed one is tried again at a later
    listing, and logged once per pod."""

    def __init__(self, writer: PodWriter, *, include_owned: bool) -> None:
        self._writer = writer
        self._include_owned = include_owned
        self._recorded: set[str] = set()  # pod uids recorded (of the pods listed last)
        self._warned: set[str] = set()  # uids whose failure was logged
        self._writing: dict[str, asyncio.Task[None]] = {}

    def first_sight(self, found: Iterable[Manifest]) -> None:
        """Start recording the pods of ``found`` not recorded yet that a save could move."""
        listed = set()
        for pod in found:
            uid = str(pods.meta(pod).get("uid") or "")
            listed.add(uid)
            if not uid or uid in self._recorded or uid in self._writing or not pods.alive(pod):
                continue
            if pods.unmovable(pod, self._include_owned) is not None:
                continue
            self._writing[uid] = asyncio.get_running_loop().create_task(self._record(uid, pod))
        self._recorded &= listed  # a pod gone is never seen again: forget it
        self._warned &= listed

    async def _record(self, uid: str, pod: Manifest) -> None:
        try:
            await self._writer.record(pods.job_id(pod), PodRef.of(pod))
        except (RuntimeFailure, KubeError) as exc:
            if uid not in self._warned:
                self._warned.add(uid)
                log.warning("specon.k8s.record_failed", pod="/".join(pods.key_of(pod)), error=str(exc))
        else:
            self._recorded.add(uid)
        finally:
            self._writing.pop(uid, None)

    async def drain(self) -> None:
        """Wait for the records under way (tests)."""
        await asyncio.gather(*self._writing.values(), return_exceptions=True)

    def close(self) -> None:
        for task in list(self._writing.values()):
            task.cancel()
