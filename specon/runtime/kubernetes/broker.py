"""The agent's ``PodWriter`` in a cluster: each write is asked of the manager's pod broker
(``POST /v1/kubernetes/pods``, ``specon.wire.pod_writes``), which makes it with the manager's
identity, so the node's own credential needs no write on pods or restore records.

``reply_for`` (the broker's side) and ``raise_for`` (this side) turn the runtime's failures
into a reply's ``outcome`` and back, so a write through the broker fails as one made
in-process does (an eviction a PodDisruptionBudget blocks is a ``SaveFailed`` on both).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from specon.model import ContainerId, WorkerId
from specon.runtime.base import (
    AlreadyFinished,
    AlreadyRunning,
    NoSuchContainer,
    RuntimeFailure,
    SaveFailed,
    StartFailed,
    Supersede,
)
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.pods import Manifest
from specon.runtime.kubernetes.writes import Forbidden, PodRef
from specon.wire.pod_writes import Outcome, PodOp, PodWriteReply, PodWriteRequest

Send = Callable[[PodWriteRequest], Awaitable[PodWriteReply]]

# Most specific first: AlreadyRunning and AlreadyFinished are StartFailed.
_OUTCOMES: tuple[tuple[type[Exception], Outcome], ...] = (
    (AlreadyRunning, Outcome.ALREADY_RUNNING),
    (AlreadyFinished, Outcome.ALREADY_FINISHED),
    (StartFailed, Outcome.START_FAILED),
    (SaveFailed, Outcome.SAVE_FAILED),
    (NoSuchContainer, Outcome.GONE),
    (Forbidden, Outcome.FORBIDDEN),
)
_FAILURES: dict[Outcome, type[RuntimeFailure]] = {
    Outcome.ALREADY_RUNNING: AlreadyRunning,
    Outcome.ALREADY_FINISHED: AlreadyFinished,
    Outcome.START_FAILED: StartFailed,
    Outcome.SAVE_FAILED: SaveFailed,
    Outcome.GONE: NoSuchContainer,
    Outcome.FORBIDDEN: Forbidden,
}


def reply_for(exc: KubeError | RuntimeFailure) -> PodWriteReply:
    """The reply that makes ``raise_for`` raise what ``exc`` is."""
    if isinstance(exc, KubeError):
        return PodWriteReply(outcome=Outcome.API, error=exc.message, status=exc.status)
    outcome = next((o for kind, o in _OUTCOMES if isinstance(exc, kind)), Outcome.FORBIDDEN)
    text, prefix = str(exc), f"{exc.container}: "
    return PodWriteReply(outcome=outcome, error=text.removeprefix(prefix))


def raise_for(reply: PodWriteReply, job: ContainerId) -> PodWriteReply:
    """``reply`` when the write was made, else the failure it names."""
    if reply.outcome is Outcome.DONE:
        return reply
    error = reply.error or reply.outcome.value
    if reply.outcome is Outcome.API:
        raise KubeError(reply.status or 0, "ViaManager", error)
    raise _FAILURES[reply.outcome](job, error)


@dataclass(frozen=True, slots=True)
class BrokerWriter:
    """``PodWriter`` for ``worker`` (the node) through the manager (``send``)."""

    send: Send
    worker: WorkerId

    async def _ask(
        self, op: PodOp, job: ContainerId, pod: PodRef | None = None, **kw: object
    ) -> PodWriteReply:
        where = {} if pod is None else {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
        req = PodWriteRequest(worker=self.worker, op=op, container=job, **where, **kw)  # type: ignore[arg-type]
        return raise_for(await self.send(req), job)

    async def record(self, job: ContainerId, pod: PodRef) -> None:
        await self._ask(PodOp.RECORD, job, pod)

    async def evict(self, job: ContainerId, pod: PodRef, grace: float) -> None:
        await self._ask(PodOp.EVICT, job, pod, grace=float(grace))

    async def delete(self, job: ContainerId, pod: PodRef, grace: int) -> None:
        await self._ask(PodOp.DELETE, job, pod, grace=float(grace))

    async def forget_record(self, job: ContainerId) -> None:
        await self._ask(PodOp.FORGET_RECORD, job)

    async def annotate(self, job: ContainerId, pod: PodRef, annotations: Mapping[str, str]) -> bool:
        return (await self._ask(PodOp.ANNOTATE, job, pod, annotations=dict(annotations))).annotated

    async def create(self, job: ContainerId, checkpoint: str | None, supersede: Supersede) -> Manifest:
        # ``supersede`` is the manager's own decision, read from its start command: not sent.
        reply = await self._ask(PodOp.CREATE, job, checkpoint=checkpoint)
        if not reply.pod:
            raise StartFailed(job, "the manager created no pod")
        return dict(reply.pod)

    async def withdraw(self, job: ContainerId, pod: PodRef) -> None:
        await self._ask(PodOp.WITHDRAW, job, pod)
