"""The writes on managed pods and their restore records: the calls that start, stop or change
what runs in the training namespaces, made by one identity, the manager's.

A node's agent asks for them (``PodWriter``: in-process as ``LocalWriter`` for a single
identity, over the wire through the manager's pod broker in a cluster), and each call here
takes only what a requester may choose (the job, the pod it names, the node it speaks for,
a grace period, the file name of a checkpoint, specon's own annotations) and reads
everything else from the API server: the pod as it holds it, the nodes, the job's trusted
original. Each call on a pod checks that the pod is a managed pod of the job bound to the
requester's node (``Forbidden`` otherwise); a create builds the copy itself, on the
requester's node, from the trusted original, and refuses a copy that would gain a
privilege (``copying.restored_copy``). So a node's credential, stolen, cannot create a pod
or evict, delete or change one on another node; what the manager lets it ask for at all
(a save or start the manager decided) is the broker's rule (``specon_manager.pod_broker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from specon.model import ContainerId
from specon.runtime.base import (
    AlreadyRunning,
    NoSuchContainer,
    RuntimeFailure,
    SaveFailed,
    StartFailed,
    Supersede,
)
from specon.runtime.kubernetes import copying, pods, steering, takeover
from specon.runtime.kubernetes.admission import holds_run_lock
from specon.runtime.kubernetes.api import KubeApi, KubeError, pods_path
from specon.runtime.kubernetes.calls import PodCalls, record_path
from specon.runtime.kubernetes.pods import DEFAULT_SELECTOR, Manifest, PodError, SharedVolume
from specon.runtime.kubernetes.webhook_probe import WebhookProbe

log = structlog.get_logger("specon.k8s")

# The annotations an agent may set on its pods (``Runtime.publish_state``): what it shows of
# a job's state, nothing a kubelet or controller acts on.
# What an agent may set on its node's pods: its classification, and that a start adopted a
# controller's replacement (``steering.ANN_ADOPTED``).
AGENT_ANNOTATIONS = frozenset(
    {"specon.io/category", "specon.io/migrated", "specon.io/t-cc", steering.ANN_ADOPTED}
)
_CHECKPOINT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")


class Forbidden(RuntimeFailure):
    """The requester may not ask for this: not its node's pod, not the job's, not managed."""


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod a requester names: it is read back from the API server, never trusted."""

    namespace: str
    name: str
    uid: str | None = None

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> PodRef:
        ns, name = pods.key_of(manifest)
        uid = pods.meta(manifest).get("uid")
        return cls(ns, name, str(uid) if uid else None)

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


def checkpoint_name(value: str | None) -> str | None:
    """A checkpoint's manifest file name in the job's checkpoint directory (``ValueError``)."""
    if value is not None and (not _CHECKPOINT_NAME.fullmatch(value) or value in (".", "..")):
        raise ValueError(f"checkpoint: not a file name: {value!r}")
    return value


class PodWriter(Protocol):
    """The writes a node's runtime needs, for its own node (``KubernetesRuntime``)."""

    async def record(self, job: ContainerId, pod: PodRef) -> None: ...
    async def evict(self, job: ContainerId, pod: PodRef, grace: float) -> None: ...
    async def delete(self, job: ContainerId, pod: PodRef, grace: int) -> None: ...
    async def forget_record(self, job: ContainerId) -> None: ...
    async def annotate(self, job: ContainerId, pod: PodRef, annotations: Mapping[str, str]) -> bool: ...
    async def create(self, job: ContainerId, checkpoint: str | None, supersede: Supersede) -> Manifest: ...
    async def withdraw(self, job: ContainerId, pod: PodRef) -> None: ...


class PodWrites:
    """The checked writes, for any node, with one API identity (``PodCalls`` makes the calls)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        selector: str = DEFAULT_SELECTOR,
        volume: SharedVolume | None = None,
        include_owned: bool = False,
    ) -> None:
        self.api = api
        self.calls = PodCalls(api, selector)
        self.volume = volume or SharedVolume()
        self.include_owned = include_owned
        self.webhook = WebhookProbe(api, selector)  # asked before a Job's pod is evicted
        self._requirements = pods.parse_selector(selector)

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        return await asyncio.to_thread(self.api.request, method, path, **kw)

    async def labels_of(self, node: str | None) -> dict[str, str]:
        """A node's labels (a GPU job keeps to its product); none when unreadable."""
        if not node:
            return {}
        try:
            return pods.labels_of(await self._call("GET", f"/api/v1/nodes/{node}"))
        except KubeError as exc:
            log.warning("specon.k8s.node_unreadable", node=node, error=str(exc))
            return {}

    async def pod_on(
        self, job: ContainerId, ref: PodRef, node: str, *, steered: bool = False, replacement: bool = False
    ) -> Manifest:
        """The pod ``ref`` names as the API server holds it, if it is a managed pod of ``job``
        bound to ``node`` (``steered``: or steered there, unbound; ``replacement``: or a Job's
        unbound replacement for a move, steered anywhere) (``Forbidden``); ``NoSuchContainer``
        once it is gone or replaced."""
        try:
            pod: Manifest = await self._call("GET", f"{pods_path(ref.namespace)}/{ref.name}")
        except KubeError as exc:
            if exc.status == 404:
                raise NoSuchContainer(job, f"pod {ref.label} is gone") from exc
            if exc.status == 403:
                why = f"(is {ref.namespace} one of the training namespaces?)"
                raise Forbidden(job, f"cannot read pod {ref.label}: {exc} {why}") from exc
            raise
        if ref.uid and pods.meta(pod).get("uid") != ref.uid:
            raise NoSuchContainer(job, f"pod {ref.label} was replaced meanwhile")
        if not pods.matches(pods.labels_of(pod), self._requirements):
            raise Forbidden(job, f"pod {ref.label} is not a managed pod")
        try:
            owner = pods.job_id(pod)
        except PodError as exc:
            raise Forbidden(job, f"pod {ref.label}: {exc}") from exc
        if owner != job:
            raise Forbidden(job, f"pod {ref.label} is a pod of job {owner}, not of {job}")
        where = steering.steered_to(pod) if steered else pods.node_of(pod)
        unbound_replacement = (
            pods.node_of(pod) is None
            and pods.controlling_job(pod) is not None
            and steering.ANN_MOVE in pods.annotations_of(pod)
        )
        if where != node and not (replacement and unbound_replacement):
            raise Forbidden(job, f"pod {ref.label} is bound to {where or 'no node'}, not to {node}")
        return pod

    async def _write_record(self, job: ContainerId, pod: Manifest) -> None:
        labels = await self.labels_of(pods.node_of(pod))
        await asyncio.to_thread(self.calls.write_record, job, pod, labels)

    async def record(self, job: ContainerId, ref: PodRef, node: str) -> None:
        """Write the job's restore record from its live pod on ``node``."""
        pod = await self.pod_on(job, ref, node)
        if not pods.alive(pod):
            raise Forbidden(job, f"pod {ref.label} has ended: only a live pod is recorded")
        await self._write_record(job, pod)

    async def evict(self, job: ContainerId, ref: PodRef, node: str, grace: float) -> None:
        """Record the job's pod on ``node``, then evict it (``SaveFailed``: it keeps running)."""
        pod = await self.pod_on(job, ref, node)
        if (why := pods.unmovable(pod, self.include_owned)) is not None:
            raise SaveFailed(job, why)
        if pods.controlling_job(pod) is not None and not holds_run_lock(pod):
            raise SaveFailed(
                job,
                f"pod {ref.label} was created without the admission webhook: its job holds no run lock "
                "its replacement could wait for, so it is not evicted",
            )
        if pods.controlling_job(pod) is not None and not await self.webhook.answers(pods.key_of(pod)[0]):
            raise SaveFailed(
                job,
                f"the admission webhook does not answer in namespace {pods.key_of(pod)[0]}: a Job's pod "
                "is evicted only with it (its replacement would start unsteered beside the saving copy; "
                "components/webhook)",
            )
        await self._write_record(job, pod)  # the recipe of the restore, before the pod goes
        await asyncio.to_thread(self.calls.evict, job, pod, grace)

    async def delete(
        self, job: ContainerId, ref: PodRef, node: str, grace: int, *, alive: bool = True
    ) -> None:
        """Delete the job's pod on ``node`` (gone already is fine); ``alive``: also one that
        has not ended (a stop), else only an ended one."""
        try:
            pod = await self.pod_on(job, ref, node)
        except NoSuchContainer:
            return
        if pods.alive(pod) and not alive:
            raise Forbidden(job, f"pod {ref.label} has not ended: only a stop deletes it")
        await asyncio.to_thread(self.calls.delete, pod, grace=max(0, grace))

    async def withdraw(self, job: ContainerId, ref: PodRef, node: str) -> None:
        """Delete the job's copy steered to ``node`` that no scheduler has bound (a start past
        its deadline: ``placement``), or its Job's replacement for a move steered to a node the
        move no longer goes to (its controller makes another, steered where the move goes now),
        only as long as it is unbound; gone already, or bound meanwhile (it is then restored:
        the agent reads it again), is fine."""
        try:
            pod = await self.pod_on(job, ref, node, steered=True, replacement=True)
        except NoSuchContainer:
            return
        if pods.node_of(pod) is not None:
            return
        try:
            await asyncio.to_thread(self.calls.delete, pod, grace=0, unchanged=True)
        except KubeError as exc:
            if exc.status != 409:  # 409: changed (bound) since it was read
                raise
        log.info("specon.k8s.withdrawn", pod=ref.label, node=node, container=job)

    async def forget_record(self, job: ContainerId, node: str) -> None:
        """Delete the restore record of a job that has ended on ``node``: its newest pod ran
        there and no pod of it is alive (the agent found the job finished)."""
        existing = await asyncio.to_thread(self.calls.job_pods, job)
        if any(pods.alive(p) for p in existing):
            raise Forbidden(job, "a pod of the job is alive: its record stays")
        newest = max(existing, key=pods.recency, default=None)
        if newest is not None and pods.node_of(newest) != node:
            raise Forbidden(job, f"the job last ran on {pods.node_of(newest)}, not on {node}")
        with contextlib.suppress(KubeError):
            await self._call("DELETE", record_path(job))

    async def annotate(
        self, job: ContainerId, ref: PodRef, node: str, annotations: Mapping[str, str]
    ) -> bool:
        """Merge specon's own state annotations (``AGENT_ANNOTATIONS``) into the job's pod."""
        if extra := sorted(set(annotations) - AGENT_ANNOTATIONS):
            raise Forbidden(job, f"annotations an agent may not set: {', '.join(extra)}")
        pod = await self.pod_on(job, ref, node)
        return await asyncio.to_thread(self.calls.annotate, pod, annotations)

    async def create(
        self,
        job: ContainerId,
        node: str,
        checkpoint: str | None,
        supersede: Supersede,
        *,
        token: str | None = None,
    ) -> Manifest:
        """Create the copy of ``job`` on ``node`` from its trusted original, restoring from
        ``checkpoint`` (a manifest's file name in the job's checkpoint directory, checked by
        the node's agent on the volume). ``supersede``: a pod of the job on a lost node is
        recorded and deleted first (``takeover``). ``AlreadyRunning`` while any other pod of
        the job has not ended; ``StartFailed`` saying why otherwise. ``token`` (the start
        command's id) makes a retried create idempotent: the copy this token already made on
        ``node`` is the answer."""
        try:
            namespace, _ = pods.split_job_id(job)
            name = checkpoint_name(checkpoint)
            original, existing = await asyncio.to_thread(self.calls.lookup, job)
        except (PodError, ValueError) as exc:
            raise StartFailed(job, f"refused: {exc}") from exc
        except KubeError as exc:
            raise StartFailed(job, f"cannot read the job's pods or restore record: {exc}") from exc
        if token is not None and (made := _made_by(existing, node, token)) is not None:
            return made
        if supersede:
            calls = takeover.Calls(self._call, self._delete, self._record_lost)
            try:
                existing = await takeover.take_over(job, existing, node, supersede, calls)
            except (KubeError, SaveFailed, NoSuchContainer) as exc:
                raise StartFailed(job, f"cannot take over from a lost node: {exc}") from exc
        trusted = copying.restorable(job, original, existing)
        body = copying.restored_copy(
            trusted,
            existing,
            job=job,
            node=node,
            volume=self.volume,
            checkpoint=name,
            source_labels=await self.labels_of(pods.node_of(trusted)),
            node_labels=await self.labels_of(node) or None,
        )
        if token is not None:
            body["metadata"].setdefault("annotations", {})[pods.ANN_STARTED_BY] = token
        pod_name = pods.key_of(body)[1]
        try:
            created: Manifest = await self._call("POST", pods_path(namespace), body=body)
        except KubeError as exc:
            if exc.status == 409:
                raise AlreadyRunning(job, f"pod {pod_name} exists already: {exc}") from exc
            raise StartFailed(job, f"cannot create pod {namespace}/{pod_name}: {exc}") from exc
        for old in existing:  # ended pods of the job are superseded: one pod per job
            with contextlib.suppress(KubeError):
                await self._delete(old, grace=0)
        return created

    async def _delete(self, manifest: Manifest, *, grace: int) -> None:
        await asyncio.to_thread(self.calls.delete, manifest, grace=grace)

    async def _record_lost(self, pod: Manifest) -> None:
        await self._write_record(pods.job_id(pod), pod)


def _made_by(existing: list[Manifest], node: str, token: str) -> Manifest | None:
    """The live copy on ``node`` that the start ``token`` created already, if any."""
    mine = [
        o
        for o in existing
        if pods.alive(o)
        and steering.steered_to(o) == node
        and pods.annotations_of(o).get(pods.ANN_STARTED_BY) == token
    ]
    return max(mine, key=pods.generation, default=None)


@dataclass(frozen=True, slots=True)
class LocalWriter:
    """``PodWriter`` with this process's own API identity, for ``node`` (tests, and a
    single-identity setup where the agent may write pods)."""

    writes: PodWrites
    node: str

    async def record(self, job: ContainerId, pod: PodRef) -> None:
        await self.writes.record(job, pod, self.node)

    async def evict(self, job: ContainerId, pod: PodRef, grace: float) -> None:
        await self.writes.evict(job, pod, self.node, grace)

    async def delete(self, job: ContainerId, pod: PodRef, grace: int) -> None:
        await self.writes.delete(job, pod, self.node, grace)

    async def forget_record(self, job: ContainerId) -> None:
        await self.writes.forget_record(job, self.node)

    async def annotate(self, job: ContainerId, pod: PodRef, annotations: Mapping[str, str]) -> bool:
        return await self.writes.annotate(job, pod, self.node, annotations)

    async def create(self, job: ContainerId, checkpoint: str | None, supersede: Supersede) -> Manifest:
        return await self.writes.create(job, self.node, checkpoint, supersede)

    async def withdraw(self, job: ContainerId, pod: PodRef) -> None:
        await self.writes.withdraw(job, pod, self.node)
