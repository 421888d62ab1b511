"""The Kubernetes runtime: a worker is a node, a container is a managed pod bound to it.

The API goes through ``specon.runtime.k8s_api`` (plain JSON manifests over the official
client's connection), so the rules in ``specon.runtime.k8s_pods`` apply to exactly what the
API server sends.

One ``KubernetesRuntime`` per agent, for the agent's node. Pods on the node that match the
label selector are its containers (kept current by a watch on the node's pods, relisting
after ``410 Gone``); its node object is watched the same way for capacity, labels, taints.
A container is a job, identified by (namespace, job): its id is ``<namespace>.<job>``.

Save (SPEC §6) first records the pod, as the API server holds it, in the job's restore
record (``k8s_restore``), then goes through the **Eviction API**, with the save's grace
period as the eviction's ``gracePeriodSeconds``: the API server honours
PodDisruptionBudgets (a blocked eviction, HTTP 429, is a ``SaveFailed`` and the pod keeps
running), the kubelet sends SIGTERM, the job checkpoints to the shared volume and exits, and
the pod object goes away. The runtime waits for that, then verifies the newest complete
checkpoint on the volume. Past the grace period the kubelet has SIGKILLed the job: the
result is its newest complete checkpoint (``forced``). A pod still there long after the
grace period (a kubelet that does not answer) is never force-deleted: it may still run, so
the save fails and no copy starts.

Start takes nothing from the ``JobSpec`` it is given but the job's id: the copy is made from
the job's pod as the API server holds it (a pod of the job that still exists, else the
restore record), in the job's own namespace, pinned with ``spec.nodeName`` (see
``k8s_pods.restored_pod``), and refused if it would gain a privilege the original lacked
(``k8s_restore.privilege_gains``). It refuses while any pod of the job that has not
terminated exists anywhere (``AlreadyRunning``); pod names are unique per generation, so two
racing starts cannot both create one. ``job_spec`` answers from the same trusted sources.

Deviations from the local runtime, inherent to pods: a saved or stopped pod is deleted, so
it is no longer listed afterwards; ``forget`` deletes an ended pod (and a finished job's
restore record).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import structlog
from kubernetes import client as k8s_client

from specon import checkpoint as ckpt
from specon import jobkit
from specon.model import ContainerId, Resources, WorkerId
from specon.progress.last import last_event
from specon.runtime import k8s_pods as pods
from specon.runtime import k8s_restore as restore
from specon.runtime.base import (
    AlreadyRunning,
    ContainerInfo,
    ContainerState,
    JobSpec,
    NoSuchContainer,
    Runtime,
    RuntimeFailure,
    SaveFailed,
    SaveResult,
    StartFailed,
    StillRunning,
    WorkerUsage,
    valid_job_id,
)
from specon.runtime.k8s_api import Informer, KubeApi, KubeError, load_api_client, pods_path
from specon.runtime.k8s_pods import DEFAULT_CLAIM, DEFAULT_SELECTOR, Manifest, PodError, SharedVolume

__all__ = ["Informer", "KubeApi", "KubeError", "KubernetesRuntime", "load_api_client", "pods_path"]

log = structlog.get_logger()

_POLL_S = 0.05  # between looks at the (watch-fed) cache while waiting for a pod to go
_SYNC_WAIT_S = 10.0  # for a new watch's first list before falling back to a direct list
_METRICS_RETRY_S = 300.0  # how long a missing metrics API is believed missing
_SIGKILL_EXIT = 137


@dataclass(frozen=True, slots=True)
class _Pod:
    """A managed pod on this node, understood."""

    manifest: Manifest
    job: ContainerId
    spec: JobSpec
    progress: Path
    checkpoints: Path

    @property
    def key(self) -> tuple[str, str]:
        return pods.key_of(self.manifest)

    @property
    def name(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"


class KubernetesRuntime:
    """One node's managed pods, through the Kubernetes API."""

    def __init__(
        self,
        api: k8s_client.ApiClient | KubeApi,
        node: str,
        *,
        volume_root: Path,
        namespace: str | None = None,
        selector: str = DEFAULT_SELECTOR,
        claim: str | None = DEFAULT_CLAIM,
        host_path: str | None = None,
        include_owned: bool = False,
        watch: bool = True,
        metrics: bool = True,
        kill_slack: float = 15.0,
        proc: Path = Path("/proc"),
    ) -> None:
        try:
            valid_job_id(node)
        except ValueError as exc:
            raise ValueError(f"invalid node name: {exc}") from exc
        self.api = api if isinstance(api, KubeApi) else KubeApi(api)
        self._worker = WorkerId(node)
        self.node = node
        self.volume_root = volume_root
        self.namespace = namespace
        self.selector = selector
        self._requirements = pods.parse_selector(selector)
        self.volume = SharedVolume(claim=claim, host_path=host_path)
        self.include_owned = include_owned
        self.kill_slack = kill_slack
        self._proc = proc
        self._busy: dict[ContainerId, ContainerState] = {}
        # The last state seen of pods being saved or stopped: their exit code, once gone.
        self._last_seen: dict[tuple[str, str], Manifest] = {}
        self.skipped: dict[str, int] = {}
        self._warned: set[tuple[str, str]] = set()
        self._pod_query = {"labelSelector": selector, "fieldSelector": f"spec.nodeName={node}"}
        self._node_query = {"fieldSelector": f"metadata.name={node}"}
        self._pods = (
            Informer(
                self.api, pods_path(namespace), name=f"pods-{node}", query=self._pod_query, accept=self._ours
            )
            if watch
            else None
        )
        self._node_watch = (
            Informer(
                self.api,
                "/api/v1/nodes",
                name=f"node-{node}",
                query=self._node_query,
                accept=lambda o: pods.meta(o).get("name") == node,
            )
            if watch
            else None
        )
        self._node: Manifest | None = None
        # policy/v1 Eviction from Kubernetes 1.22 on; older servers know only v1beta1.
        self._eviction_versions = ["policy/v1", "policy/v1beta1"]
        self._metrics = metrics
        self._metrics_down_until = 0.0
        self._last_cpu: tuple[float, float] | None = None  # (busy, total) jiffies of /proc/stat
        self.last_usage_source = "none"

    # -- the Runtime interface -------------------------------------------------------------
    @property
    def worker(self) -> WorkerId:
        return self._worker

    @property
    def enforcement(self) -> str:
        return "kubernetes"  # the kubelet enforces each pod's own requests and limits

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def list_containers(self) -> list[ContainerInfo]:
        return [self._info(p) for p in self._one_per_job(await self._managed())]

    def job_spec(self, container_id: ContainerId) -> JobSpec | None:
        """The job's spec from its pod as the API server holds it: a pod of the job here (the
        watch cache), else any pod of the job, else its restore record; None if none exists
        or it cannot be read. Its ``template`` is the one ``start`` would restore.

        Blocking (up to two API calls when the pod is not on this node): call it from a
        thread (``asyncio.to_thread``) on an event loop."""
        for manifest in self._pods.items() if self._pods else []:
            p = self._understand(manifest)
            if p is not None and p.job == container_id:
                return p.spec
        try:
            original, _ = self._lookup(container_id)
            return None if original is None else pods.job_spec(original)
        except (KubeError, PodError, ValueError) as exc:
            log.warning("specon.k8s.spec_unreadable", container=container_id, error=str(exc))
            return None

    async def usage(self) -> WorkerUsage:
        node = await self._node_object()
        capacity = pods.node_capacity(node) if node else Resources()
        busy, total = _proc_cpu(self._proc)
        util = await self._metrics_utilisation(capacity)
        if util is None:
            util = self._proc_utilisation(busy, total)
            self.last_usage_source = "proc"
        else:
            self.last_usage_source = "metrics"
        self._last_cpu = (busy, total)
        return WorkerUsage(
            worker=self._worker,
            capacity=capacity,
            cpu_utilisation=min(1.0, max(0.0, util)),
            cpu_seconds=busy / _clock_ticks(),
            enforcement="kubernetes",
        )

    async def save(self, container_id: ContainerId, *, grace: float) -> SaveResult:
        p = await self._require(container_id)
        if not pods.migratable(p.manifest):
            raise SaveFailed(container_id, f"pod {p.name} opted out ({pods.ANN_MIGRATABLE}: false)")
        owners = pods.owners(p.manifest)
        if owners and not self.include_owned:
            raise SaveFailed(container_id, f"pod {p.name} is owned by {', '.join(owners)}; left alone")
        if container_id in self._busy:
            raise SaveFailed(container_id, f"a {self._busy[container_id].value} is already in progress")
        self._busy[container_id] = ContainerState.SAVING
        t0 = time.monotonic()
        try:
            before = ckpt.key(ckpt.latest_complete(p.checkpoints))
            # The recipe for the restore, from the API server, before the pod goes.
            await self._record(p)
            log.info("specon.k8s.saving", node=self.node, container=container_id, pod=p.name, grace=grace)
            await self._evict(p, grace)
            last = await self._wait_gone(p, grace + self.kill_slack)
            if last is not None:
                raise SaveFailed(
                    container_id,
                    f"pod {p.name} still terminating {grace + self.kill_slack:g}s after the eviction "
                    "(kubelet unresponsive?); it may still run, so no copy may start",
                )
            seconds = time.monotonic() - t0
            final = self._last_seen.pop(p.key, p.manifest)
            code = pods.exit_code(final)
            # Killed at the grace deadline: 137 (128 + SIGKILL) from a container runtime, -9
            # from a plain process; with no exit code, outliving the grace period tells.
            forced = code in (_SIGKILL_EXIT, -9) or (code is None and seconds >= grace)
            latest = ckpt.latest_complete(p.checkpoints)
            finished = self._finished(p)
            if latest is None and not finished and not ckpt.never_written(p.checkpoints):
                log.error("specon.k8s.save_failed", container=container_id, pod=p.name)
                raise SaveFailed(
                    container_id,
                    "the pod is gone without a verifiable checkpoint and every earlier one is corrupt",
                )
        finally:
            self._busy.pop(container_id, None)
        result = SaveResult.after(
            container_id,
            self._worker,
            latest=latest,
            before=before,
            seconds=time.monotonic() - t0,
            forced=forced,
            finished=finished,
        )
        log.info(
            "specon.k8s.saved",
            node=self.node,
            container=container_id,
            pod=p.name,
            step=result.step,
            seconds=round(result.seconds, 3),
            forced=forced,
            rolled_back=result.rolled_back,
            finished=finished,
        )
        return result

    async def start(self, spec: JobSpec, *, checkpoint: Path | None = None) -> ContainerInfo:
        """Restore job ``spec.id`` here. Only the id is used: what the copy runs comes from
        the job's pod as the API server holds it, never from ``spec``."""
        job = spec.id
        try:
            namespace, _ = pods.split_job_id(job)
        except PodError as exc:
            raise StartFailed(job, str(exc)) from exc
        if self.namespace is not None and namespace != self.namespace:
            raise StartFailed(job, f"namespace {namespace} is not this agent's namespace {self.namespace}")
        try:
            original, existing = await asyncio.to_thread(self._lookup, job)
        except KubeError as exc:
            raise StartFailed(job, f"cannot read the job's pods or restore record: {exc}") from exc
        except PodError as exc:
            raise StartFailed(job, f"refused: {exc}") from exc
        running = [o for o in existing if pods.alive(o)]
        if running:
            where = ", ".join(
                f"{'/'.join(pods.key_of(o))} on {pods.node_of(o) or 'no node'}" for o in running
            )
            raise AlreadyRunning(job, f"a pod of the job has not terminated: {where}")
        if original is None:
            raise StartFailed(
                job,
                f"no pod of the job and no restore record in namespace {namespace} "
                "(a save writes it): nothing trusted to restore from",
            )
        template = pods.template_of(original)
        try:
            probe = pods.restored_pod(
                template, job=job, node=self.node, gen=1, restored_from=None, restore_checkpoint=None
            )
            files = pods.job_files(probe, self.volume)
        except PodError as exc:
            raise StartFailed(job, str(exc)) from exc
        ckpt_dir = self.volume_root / files.checkpoints
        restore_in_pod = None
        if checkpoint is not None:
            manifest = checkpoint.with_suffix(".json")
            if manifest.parent.resolve() != ckpt_dir.resolve():
                raise StartFailed(job, f"{checkpoint} is not in the job's checkpoint directory {ckpt_dir}")
            try:
                ckpt.verify(manifest)
            except ckpt.CheckpointError as exc:
                raise StartFailed(job, f"checkpoint does not verify: {exc}") from exc
            with contextlib.suppress(ValueError, PodError):
                relative = PurePosixPath(manifest.relative_to(self.volume_root).as_posix())
                restore_in_pod = pods.to_pod(probe, relative, self.volume)
        if _finished(self.volume_root / files.progress, ckpt_dir):
            raise StartFailed(job, "already finished (done marker or final progress record)")
        gen = max([pods.generation(original), *(pods.generation(o) for o in existing)]) + 1
        try:
            body = pods.restored_pod(
                template,
                job=job,
                node=self.node,
                gen=gen,
                restored_from=str(pods.meta(original).get("name") or "") or None,
                restore_checkpoint=restore_in_pod,
            )
        except PodError as exc:
            raise StartFailed(job, str(exc)) from exc
        gains = restore.privilege_gains(original, body)
        if gains:
            raise StartFailed(
                job,
                f"refused: the copy would gain what pod {'/'.join(pods.key_of(original))} lacked: "
                + "; ".join(gains),
            )
        name = pods.key_of(body)[1]
        try:
            created = await self._call("POST", pods_path(namespace), body=body)
        except KubeError as exc:
            if exc.status == 409:
                raise AlreadyRunning(job, f"pod {name} exists already: {exc}") from exc
            raise StartFailed(job, f"cannot create pod {namespace}/{name}: {exc}") from exc
        for old in existing:  # ended pods of the job are superseded: one pod per job
            with contextlib.suppress(KubeError):
                await self._delete(old, grace=0)
        p = self._understand(created)
        if p is None:  # pragma: no cover - it was built from a pod that parsed
            raise StartFailed(job, "created a pod that cannot be read back")
        log.info(
            "specon.k8s.started",
            node=self.node,
            container=job,
            pod=p.name,
            generation=gen,
            restore_checkpoint=restore_in_pod,
        )
        return self._info(p)

    async def stop(self, container_id: ContainerId, *, grace: float) -> ContainerInfo:
        p = await self._require(container_id)
        if container_id in self._busy:
            raise RuntimeFailure(container_id, f"a {self._busy[container_id].value} is in progress")
        self._busy[container_id] = ContainerState.STOPPING
        try:
            await self._delete(p.manifest, grace=math.ceil(grace))
            if await self._wait_gone(p, grace + self.kill_slack) is not None:
                raise RuntimeFailure(container_id, f"pod {p.name} is still terminating")
        finally:
            self._busy.pop(container_id, None)
        final = self._last_seen.pop(p.key, p.manifest)
        state, code = pods.state_of(final)
        if state in (ContainerState.RUNNING, ContainerState.STOPPING):
            state = ContainerState.EXITED if code in (0, None) else ContainerState.FAILED
        log.info("specon.k8s.stopped", node=self.node, container=container_id, pod=p.name)
        return ContainerInfo(
            id=p.job,
            worker=self._worker,
            spec=p.spec,
            state=state,
            progress_path=p.progress,
            checkpoint_dir=p.checkpoints,
            started_at=pods.started_at(final),
            handle=p.name,
            exit_code=code,
            finished=self._finished(p),
        )

    async def forget(self, container_id: ContainerId) -> None:
        p = await self._require(container_id)
        if container_id in self._busy or pods.alive(p.manifest):
            raise StillRunning(container_id, "cannot forget a running pod; stop or save it first")
        with contextlib.suppress(KubeError):
            await self._delete(p.manifest, grace=0)
        if self._finished(p):  # nothing left to restore: the record goes too
            with contextlib.suppress(KubeError, PodError):
                await self._call("DELETE", _record_path(container_id))
        log.info("specon.k8s.forgotten", node=self.node, container=container_id, pod=p.name)

    # -- beyond the interface -----------------------------------------------------------------
    @property
    def node_labels(self) -> dict[str, str]:
        return pods.labels_of(self._node) if self._node else {}

    @property
    def node_taints(self) -> tuple[str, ...]:
        """Taints that keep pods off this node, ``key[=value]:Effect`` (cordoned and not-Ready
        included)."""
        return pods.node_taints(self._node) if self._node else ()

    async def publish_state(self, container_id: ContainerId, annotations: Mapping[str, str]) -> bool:
        """Merge ``annotations`` (e.g. ``specon.io/category``) into the job's pod; False if
        it has none here or the patch failed (best effort: the agent's state file rules)."""
        for p in await self._managed():
            if p.job == container_id and pods.alive(p.manifest):
                ns, name = p.key
                try:
                    await self._call(
                        "PATCH",
                        f"{pods_path(ns)}/{name}",
                        body={"metadata": {"annotations": dict(annotations)}},
                        content_type="application/merge-patch+json",
                    )
                    return True
                except KubeError as exc:
                    log.warning("specon.k8s.annotate_failed", pod=p.name, error=str(exc))
                    return False
        return False

    def close(self) -> bool:
        for inf in (self._pods, self._node_watch):
            if inf is not None:
                inf.stop()
        return True

    # -- internals ---------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> Any:
        return await asyncio.to_thread(
            self.api.request, method, path, query=query, body=body, content_type=content_type
        )

    def _ours(self, pod: Manifest) -> bool:
        return pods.node_of(pod) == self.node and pods.matches(pods.labels_of(pod), self._requirements)

    async def _raw_pods(self) -> list[Manifest]:
        """This node's managed pods: from the watch cache, or listed when it is not ready."""
        if self._pods is not None:
            self._pods.start()
            if self._node_watch is not None:
                self._node_watch.start()
            deadline = time.monotonic() + _SYNC_WAIT_S
            while not self._pods.synced and time.monotonic() < deadline:
                await asyncio.sleep(_POLL_S)
            if self._pods.synced:
                return self._pods.items()
        data = await self._call("GET", pods_path(self.namespace), query=self._pod_query)
        return [o for o in data.get("items") or [] if isinstance(o, dict) and self._ours(o)]

    async def _managed(self) -> list[_Pod]:
        try:
            raw = await self._raw_pods()
        except KubeError as exc:
            raise RuntimeFailure(self.node, f"cannot list the node's pods: {exc}") from exc
        out = []
        for manifest in raw:
            p = self._understand(manifest)
            if p is not None:
                out.append(p)
        return out

    def _understand(self, manifest: Manifest) -> _Pod | None:
        try:
            spec = pods.job_spec(manifest)
            files = pods.job_files(manifest, self.volume)
        except (PodError, ValueError) as exc:
            self._skip(manifest, "unmanageable", exc)
            return None
        return _Pod(
            manifest=manifest,
            job=spec.id,
            spec=spec,
            progress=self.volume_root / files.progress,
            checkpoints=self.volume_root / files.checkpoints,
        )

    def _skip(self, manifest: Manifest, reason: str, exc: Exception) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        key = ("/".join(pods.key_of(manifest)), str(exc))
        if key not in self._warned:
            self._warned.add(key)
            log.warning("specon.k8s.pod_skipped", pod=key[0], reason=reason, error=str(exc))

    @staticmethod
    def _one_per_job(found: list[_Pod]) -> list[_Pod]:
        """A job's live pod wins over its ended ones; among equals, the newest generation."""
        best: dict[ContainerId, _Pod] = {}
        for p in found:
            cur = best.get(p.job)
            rank = (pods.alive(p.manifest), pods.generation(p.manifest), pods.started_at(p.manifest))
            if cur is None or rank > (
                pods.alive(cur.manifest),
                pods.generation(cur.manifest),
                pods.started_at(cur.manifest),
            ):
                best[p.job] = p
        return sorted(best.values(), key=lambda p: p.job)

    async def _require(self, container_id: ContainerId) -> _Pod:
        for p in self._one_per_job(await self._managed()):
            if p.job == container_id:
                return p
        raise NoSuchContainer(container_id, f"no managed pod of the job on node {self.node}")

    def _job_pods(self, job: ContainerId) -> list[Manifest]:
        """Every managed pod of ``job`` (in its namespace, on any node). Blocking."""
        namespace, _ = pods.split_job_id(job)
        data = self.api.request("GET", pods_path(namespace), query={"labelSelector": self.selector})
        out = []
        for o in data.get("items") or []:
            if isinstance(o, dict) and pods.matches(pods.labels_of(o), self._requirements):
                with contextlib.suppress(PodError):
                    if pods.job_id(o) == job:
                        out.append(o)
        return out

    def _lookup(self, job: ContainerId) -> tuple[Manifest | None, list[Manifest]]:
        """(the job's trusted original, every pod of the job). The original is the job's
        newest pod while one exists, else the pod its restore record holds, else None.
        Blocking; ``KubeError`` when the API cannot answer, ``PodError`` for a bad record."""
        existing = self._job_pods(job)
        if existing:
            return max(existing, key=lambda o: (pods.generation(o), pods.started_at(o))), existing
        try:
            record = self.api.request("GET", _record_path(job))
        except KubeError as exc:
            if exc.status == 404:
                return None, existing
            raise
        return restore.original_from_record(record, job), existing

    async def _record(self, p: _Pod) -> None:
        """Write the job's restore record from the pod as the API server holds it now;
        ``SaveFailed`` (the pod keeps running) when that cannot be done."""
        ns, name = p.key
        try:
            pod = await self._call("GET", f"{pods_path(ns)}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                raise NoSuchContainer(p.job, f"pod {p.name} is gone") from exc
            raise SaveFailed(
                p.job, f"cannot read pod {p.name} to record it: {exc}; it keeps running"
            ) from exc
        if pods.meta(pod).get("uid") != pods.meta(p.manifest).get("uid"):
            raise NoSuchContainer(p.job, f"pod {p.name} was replaced meanwhile")
        try:
            record = restore.record_of(pod)
        except PodError as exc:
            raise SaveFailed(p.job, f"cannot record pod {p.name}: {exc}; it keeps running") from exc
        path = _record_path(p.job)
        try:
            try:
                await self._call("POST", path.rsplit("/", 1)[0], body=record)
            except KubeError as exc:
                if exc.status != 409:
                    raise
                # The job's record from an earlier save: replace it whole (a merge would keep
                # fields the pod no longer has).
                old = await self._call("GET", path)
                record["metadata"]["resourceVersion"] = pods.meta(old).get("resourceVersion")
                await self._call("PUT", path, body=record)
        except KubeError as exc:
            raise SaveFailed(
                p.job,
                f"cannot write the restore record {ns}/{record['metadata']['name']}: {exc} "
                f"(is {ns} one of the training namespaces?); the pod keeps running",
            ) from exc

    def _info(self, p: _Pod) -> ContainerInfo:
        state, code = pods.state_of(p.manifest)
        if p.job in self._busy and pods.alive(p.manifest):
            state = self._busy[p.job]
        return ContainerInfo(
            id=p.job,
            worker=self._worker,
            spec=p.spec,
            state=state,
            progress_path=p.progress,
            checkpoint_dir=p.checkpoints,
            started_at=pods.started_at(p.manifest),
            handle=p.name,
            exit_code=code,
            finished=self._finished(p),
        )

    @staticmethod
    def _finished(p: _Pod) -> bool:
        return _finished(p.progress, p.checkpoints)

    async def _evict(self, p: _Pod, grace: float) -> None:
        ns, name = p.key
        options: dict[str, Any] = {"gracePeriodSeconds": max(1, math.ceil(grace))}
        uid = pods.meta(p.manifest).get("uid")
        if uid:  # evict exactly the pod we looked at, never a same-named successor
            options["preconditions"] = {"uid": uid}
        for version in list(self._eviction_versions):
            body = {
                "apiVersion": version,
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": ns},
                "deleteOptions": options,
            }
            try:
                await self._call("POST", f"{pods_path(ns)}/{name}/eviction", body=body)
                return
            except KubeError as exc:
                if exc.status in (400, 404) and version in exc.message and len(self._eviction_versions) > 1:
                    # A server older than policy/v1 (1.22) names the version it does not know.
                    self._eviction_versions.remove(version)
                    continue
                if exc.status == 429:
                    raise SaveFailed(
                        p.job,
                        f"eviction of pod {p.name} refused by a PodDisruptionBudget ({exc.message}); "
                        "it keeps running",
                    ) from exc
                if exc.status == 404:
                    raise NoSuchContainer(p.job, f"pod {p.name} is gone") from exc
                raise SaveFailed(p.job, f"cannot evict pod {p.name}: {exc}; it keeps running") from exc
        raise SaveFailed(p.job, f"cannot evict pod {p.name}: no Eviction version is served; it keeps running")

    async def _delete(self, manifest: Manifest, *, grace: int) -> None:
        ns, name = pods.key_of(manifest)
        uid = pods.meta(manifest).get("uid")
        body: dict[str, Any] = {"gracePeriodSeconds": grace}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call("DELETE", f"{pods_path(ns)}/{name}", body=body)
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def _current(self, p: _Pod) -> Manifest | None:
        """The pod as it is now (same uid), None once it is gone."""
        ns, name = p.key
        uid = pods.meta(p.manifest).get("uid")
        if self._pods is not None and self._pods.synced:
            cur = self._pods.get(ns, name)
        else:
            try:
                cur = await self._call("GET", f"{pods_path(ns)}/{name}")
            except KubeError as exc:
                if exc.status == 404:
                    return None
                raise
        if cur is None or (uid and pods.meta(cur).get("uid") != uid):
            return None
        return cur

    async def _wait_gone(self, p: _Pod, timeout: float) -> Manifest | None:
        """Wait until the pod object is gone; the pod if it is still there at ``timeout``."""
        deadline = time.monotonic() + max(0.0, timeout)
        seen = self._last_seen
        while True:
            try:
                cur = await self._current(p)
            except KubeError as exc:
                log.warning("specon.k8s.wait_failed", pod=p.name, error=str(exc))
                cur = seen.get(p.key, p.manifest)
            if cur is None:
                return None
            seen[p.key] = cur
            if time.monotonic() >= deadline:
                return cur
            await self.sleep(_POLL_S)

    async def _node_object(self) -> Manifest | None:
        if self._node_watch is not None and self._node_watch.synced:
            items = self._node_watch.items()
            self._node = items[0] if items else None
            return self._node
        try:
            self._node = await self._call("GET", f"/api/v1/nodes/{self.node}")
        except KubeError as exc:
            log.warning("specon.k8s.node_unreadable", node=self.node, error=str(exc))
        return self._node

    async def _metrics_utilisation(self, capacity: Resources) -> float | None:
        """CPU use / allocatable CPU from metrics.k8s.io, None when the API is absent."""
        if not self._metrics or capacity.cpu <= 0 or time.monotonic() < self._metrics_down_until:
            return None
        try:
            data = await self._call("GET", f"/apis/metrics.k8s.io/v1beta1/nodes/{self.node}")
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


def _record_path(job: ContainerId) -> str:
    namespace, _ = pods.split_job_id(job)
    return f"/api/v1/namespaces/{namespace}/podtemplates/{restore.record_name(job)}"


def _finished(progress: Path, checkpoints: Path) -> bool:
    """The job completed its work: jobkit's done marker, or a final ``finished`` record."""
    return jobkit.read_done(checkpoints) is not None or last_event(progress) == "finished"


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def _proc_cpu(proc: Path) -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from ``/proc/stat`` (a node's agent sees
    the node's); zeros when unreadable."""
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


def _implements_runtime(rt: KubernetesRuntime) -> Runtime:
    return rt  # mypy proves KubernetesRuntime satisfies the Runtime protocol
