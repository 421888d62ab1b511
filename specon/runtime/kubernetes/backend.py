"""The Kubernetes runtime: a worker is a node, a container is a managed pod bound to it.

One concern a module (the package's docstring lists them); the save skeleton shared with
the other backends is ``specon.runtime.saving``; the client names are importable from here.

One ``KubernetesRuntime`` per agent, for the agent's node. Pods on the node that match the
label selector are its containers (kept current by a watch on the node's pods, relisting
after ``410 Gone``); its node object is watched the same way for capacity, labels, taints,
and all its pods for what the unmanaged ones request: not free to placement (``k8s_others``).
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
restore record), in the job's own namespace, steered here through kube-scheduler (``steering``; restored
once bound here, withdrawn and failed if not within ``placement_deadline``: ``placement``),
and refused if it would gain a privilege the original lacked
(``k8s_restore.privilege_gains``). It refuses while any pod of the job that has not
terminated exists anywhere (``AlreadyRunning``); pod names are unique per generation, so two
racing starts cannot both create one. ``job_spec`` answers from the same trusted sources.

Every write on a pod or a restore record (record, evict, create, delete, annotate) goes
through the runtime's ``writes.PodWriter``: in a cluster the manager's pod broker, which makes
it with the manager's identity after checking that it is this node's to ask for, so the
agent's own credential only reads (``docs/kubernetes.md``, "Who may do what").

Events on the pods say what was done to them (``events``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog
from kubernetes import client as k8s_client

from specon.model import RUNTIME_LABEL, ContainerId, WorkerId
from specon.runtime.base import (
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
    Supersede,
    WorkerUsage,
    valid_job_id,
)
from specon.runtime.kubernetes import copying, events, gpu, others, placement, pods, recording, steering
from specon.runtime.kubernetes.adopting import adopted
from specon.runtime.kubernetes.api import KubeApi, KubeError, load_api_client, pods_path
from specon.runtime.kubernetes.calls import PodCalls
from specon.runtime.kubernetes.cgroup import CGROUP_ROOT, PodCgroups, pod_cpu_limit
from specon.runtime.kubernetes.freezer import PodProcesses
from specon.runtime.kubernetes.node_view import POLL_S, NodeView
from specon.runtime.kubernetes.pods import DEFAULT_CLAIM, DEFAULT_SELECTOR, Manifest, PodError, SharedVolume
from specon.runtime.kubernetes.usage import NodeUsage
from specon.runtime.kubernetes.watch import Informer
from specon.runtime.kubernetes.writes import Forbidden, LocalWriter, PodRef, PodWriter, PodWrites
from specon.runtime.saving import run_save

__all__ = ["Informer", "KubeApi", "KubeError", "KubernetesRuntime", "load_api_client", "pods_path"]

log = structlog.get_logger()

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
        namespaces: Sequence[str] = (),
        selector: str = DEFAULT_SELECTOR,
        claim: str | None = DEFAULT_CLAIM,
        host_path: str | None = None,
        include_owned: bool = False,
        watch: bool = True,
        watch_node: bool = True,
        count_others: bool = True,
        metrics: bool = True,
        kill_slack: float = 30.0,
        placement_deadline: float = steering.PLACEMENT_DEADLINE_S,
        proc: Path = Path("/proc"),
        cgroup_root: Path = CGROUP_ROOT,
        writer: PodWriter | None = None,
    ) -> None:
        try:
            valid_job_id(node)
        except ValueError as exc:
            raise ValueError(f"invalid node name: {exc}") from exc
        self.api = api if isinstance(api, KubeApi) else KubeApi(api)
        self._worker = WorkerId(node)
        self.node = node
        self.volume_root = volume_root
        # The namespaces whose pods it manages (none: every namespace).
        self.namespaces = tuple(namespaces) or ((namespace,) if namespace else ())
        self.selector = selector
        self._requirements = pods.parse_selector(selector)
        self.volume = SharedVolume(claim=claim, host_path=host_path)
        self.include_owned = include_owned
        self.kill_slack = kill_slack
        self.placement_deadline = placement_deadline
        self._busy: dict[ContainerId, ContainerState] = {}
        # The last state seen of pods being saved or stopped: their exit code, once gone.
        self._last_seen: dict[tuple[str, str], Manifest] = {}
        self.skipped: dict[str, int] = {}
        self._warned: set[tuple[str, str]] = set()
        self._view = NodeView(
            self.api,
            node,
            namespaces=self.namespaces,
            selector=selector,
            ours=self._ours,
            watch=watch,
            watch_node=watch_node,
        )
        # What the node's other pods request is not free to placement: counted here, or, where
        # this agent may not list them (``count_others`` off), by the manager.
        self._others = (
            others.OtherPods(self.api, node, managed=self._ours, namespaces=self.namespaces, watch=watch)
            if count_others
            else None
        )
        self._calls = PodCalls(self.api, selector)  # reads: the job's pods, its restore record
        # Writes: by default with this process's own identity (tests, one-identity setups).
        self._writer = writer or LocalWriter(
            PodWrites(self.api, selector=selector, volume=self.volume, include_owned=include_owned), node
        )
        self._recorder = recording.Recorder(self._writer, include_owned=include_owned)
        self._usage = NodeUsage(self.api, node, metrics=metrics, proc=proc)
        self._cgroups = PodCgroups(cgroup_root)  # the pods' cgroups, where the node's are mounted
        self._procs = PodProcesses(self._cgroups, proc)  # their freezer and host PIDs
        self.events = events.EventRecorder(self.api, f"specon-agent-{node}")

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
        found = self._one_per_job(await self._managed())
        self._recorder.first_sight(p.manifest for p in found)  # restorable however it goes
        return [self._info(p) for p in found]

    def job_spec(self, container_id: ContainerId) -> JobSpec | None:
        """The job's spec from its pod as the API server holds it: a pod of the job here (the
        watch cache), else any pod of the job, else its restore record; None if none exists
        or it cannot be read. Its ``template`` is the one ``start`` would restore.

        Blocking (up to two API calls when the pod is not on this node): call it from a
        thread (``asyncio.to_thread``) on an event loop."""
        for manifest in self._view.cached() if self._view.synced else []:
            p = self._understand(manifest)
            if p is not None and p.job == container_id:
                return p.spec
        try:
            original, _ = self._calls.lookup(container_id)
            return None if original is None else pods.job_spec(original)
        except (KubeError, PodError, ValueError) as exc:
            log.warning("specon.k8s.spec_unreadable", container=container_id, error=str(exc))
            return None

    async def usage(self) -> WorkerUsage:
        u = await self._usage.read(self._worker, await self._node_object())
        if self._others is not None:
            u = await self._others.deduct(u)
        seconds = await asyncio.to_thread(self._cgroups.cpu_seconds, await self._live())  # pod cgroups
        return replace(u, per_container=tuple(sorted(seconds.items())))

    async def freeze(self, container_id: ContainerId) -> bool:
        """Its pod's cgroup freezer on this node (``k8s_freezer``, which logs why where it cannot)."""
        if container_id in self._busy:
            return False  # a save or stop needs it running
        pod = next((m for job, m in await self._live() if job == container_id), None)
        return await asyncio.to_thread(self._procs.set_frozen, container_id, pod, True)

    async def thaw(self, container_id: ContainerId) -> bool:
        pod = next((m for job, m in await self._live() if job == container_id), None)
        return await asyncio.to_thread(self._procs.set_frozen, container_id, pod, False)

    async def pids(self) -> dict[ContainerId, frozenset[int]]:
        """Host PIDs from each live pod's cgroup (``k8s_freezer``: empty without ``hostPID``)."""
        return await asyncio.to_thread(self._procs.pids, await self._live())

    async def set_cpu_weight(self, container_id: ContainerId, weight: int) -> bool:
        """Its pod's cgroup on this node (``k8s_cgroup``, which logs why where it cannot)."""
        pod = next((m for job, m in await self._live() if job == container_id), None)
        return await asyncio.to_thread(self._cgroups.set_weight, container_id, pod, weight)

    async def _live(self) -> list[tuple[ContainerId, Manifest]]:
        try:
            return [(p.job, p.manifest) for p in await self._managed() if pods.alive(p.manifest)]
        except RuntimeFailure:
            return []  # the API server is away: no pod to weigh or account this time

    @property
    def last_usage_source(self) -> str:
        """Where the last utilisation reading came from: ``metrics``, ``proc`` or ``none``."""
        return self._usage.source

    async def save(self, container_id: ContainerId, *, grace: float) -> SaveResult:
        p = await self._require(container_id)
        if (why := pods.unmovable(p.manifest, self.include_owned)) is not None:
            raise SaveFailed(container_id, why)

        async def halt(t0: float) -> bool:
            await self._thaw_for_signal(p)
            # The writer records the pod (the restore's recipe, from the API server; a GPU job
            # keeps to this node's product) before it evicts it.
            try:
                await self._writer.evict(p.job, PodRef.of(p.manifest), grace)
            except NoSuchContainer:
                pass  # gone already (an eviction retried after its answer was lost): the wait says
            except (KubeError, Forbidden) as exc:
                raise SaveFailed(container_id, f"cannot evict pod {p.name}: {exc}; it keeps running") from exc
            if await self._wait_gone(p, grace + self.kill_slack) is not None:
                raise SaveFailed(
                    container_id,
                    f"pod {p.name} still terminating {grace + self.kill_slack:g}s after the eviction "
                    "(kubelet unresponsive?); it may still run, so no copy may start",
                )
            seconds = time.monotonic() - t0
            code = pods.exit_code(self._last_seen.pop(p.key, p.manifest))
            # Killed at the grace deadline: 137 (128 + SIGKILL) from a container runtime, -9
            # from a plain process; with no exit code, outliving the grace period tells.
            return code in (_SIGKILL_EXIT, -9) or (code is None and seconds >= grace)

        save = run_save(
            container_id,
            self._worker,
            grace=grace,
            checkpoints=p.checkpoints,
            busy=self._busy,
            halt=halt,
            finished=lambda: self._finished(p),
            events="specon.k8s",
            context={"node": self.node, "pod": p.name},
            corrupt="the pod is gone without a verifiable checkpoint and every earlier one is corrupt",
        )
        return await events.saved(self.events, p.manifest, grace, save)

    async def start(
        self, spec: JobSpec, *, checkpoint: Path | None = None, supersede: Supersede = False
    ) -> ContainerInfo:
        """Restore job ``spec.id`` here. Only the id is used: what the copy runs comes from
        the job's pod as the API server holds it, never from ``spec``. ``supersede``: a pod
        of the job on a lost node is deleted first (``takeover``), any other refuses it."""
        job = spec.id
        try:
            namespace, _ = pods.split_job_id(job)
        except PodError as exc:
            raise StartFailed(job, str(exc)) from exc
        if self.namespaces and namespace not in self.namespaces:
            raise StartFailed(
                job, f"namespace {namespace} is not one of this agent's: {', '.join(self.namespaces)}"
            )
        try:
            original, existing = await asyncio.to_thread(self._calls.lookup, job)
        except KubeError as exc:
            raise StartFailed(job, f"cannot read the job's pods or restore record: {exc}") from exc
        except PodError as exc:
            raise StartFailed(job, f"refused: {exc}") from exc
        # What only this node can check, on its volume: the checkpoint and that the job has
        # not finished; the writer checks the rest and makes the copy from the API server's
        # own original (a pod of the job alive elsewhere refuses it: ``AlreadyRunning``). A
        # Job's next pod is its controller's, steered here by the webhook: adopted, not made.
        adopt = original is not None and pods.replaced_by_controller(original)
        others_ = existing if not supersede else []
        trusted = original if adopt and original else copying.restorable(job, original, others_)
        name = await asyncio.to_thread(
            copying.checked_checkpoint,
            trusted,
            job=job,
            volume=self.volume,
            volume_root=self.volume_root,
            checkpoint=checkpoint,
        )
        withdraw = functools.partial(self._writer.withdraw, job)
        try:
            if adopt:
                listed = functools.partial(asyncio.to_thread, self._calls.job_pods, job)
                created = await adopted(
                    job, self.node, list_pods=listed, read=self._read_pod, withdraw=withdraw,
                    mark=functools.partial(self._writer.annotate, job), deadline=self.placement_deadline,
                )  # fmt: skip
            else:
                created = await placement.placed(
                    job, await self._writer.create(job, name, supersede), self.node,
                    read=self._read_pod, withdraw=withdraw, deadline=self.placement_deadline,
                )  # fmt: skip
        except KubeError as exc:
            raise StartFailed(job, f"cannot create the job's copy: {exc}") from exc
        restore_in_pod = pods.env_of(pods.job_container(created)).get(pods.ENV_RESTORE_CHECKPOINT)
        p = self._understand(created)
        if p is None:  # pragma: no cover - it was built from a pod that parsed
            raise StartFailed(job, "created a pod that cannot be read back")
        log.info(
            "specon.k8s.started",
            node=self.node,
            container=job,
            pod=p.name,
            generation=pods.generation(created),
            restore_checkpoint=restore_in_pod,
        )
        events.restored(self.events, created, self.node, checkpoint)
        return self._info(p)

    async def stop(self, container_id: ContainerId, *, grace: float) -> ContainerInfo:
        p = await self._require(container_id)
        if container_id in self._busy:
            raise RuntimeFailure(container_id, f"a {self._busy[container_id].value} is in progress")
        self._busy[container_id] = ContainerState.STOPPING
        try:
            await self._thaw_for_signal(p)
            try:
                await self._writer.delete(p.job, PodRef.of(p.manifest), math.ceil(grace))
            except KubeError as exc:
                raise RuntimeFailure(container_id, f"cannot delete pod {p.name}: {exc}") from exc
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
        with contextlib.suppress(KubeError, RuntimeFailure):
            await self._writer.delete(p.job, PodRef.of(p.manifest), 0)
        if self._finished(p):  # nothing left to restore: the record goes too
            with contextlib.suppress(KubeError, RuntimeFailure):
                await self._writer.forget_record(container_id)
        log.info("specon.k8s.forgotten", node=self.node, container=container_id, pod=p.name)

    # -- beyond the interface -----------------------------------------------------------------
    @property
    def node_labels(self) -> dict[str, str]:
        return {RUNTIME_LABEL: "kubernetes", **(pods.labels_of(self._node) if self._node else {})}

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
                events.classified(self.events, p.manifest, annotations)
                try:
                    return await self._writer.annotate(p.job, PodRef.of(p.manifest), annotations)
                except (KubeError, RuntimeFailure) as exc:
                    log.warning("specon.k8s.annotate_failed", pod=p.name, error=str(exc))
                    return False
        return False

    def close(self) -> bool:
        self._recorder.close()
        self._view.stop()
        if self._others is not None:
            self._others.stop()
        self.events.close()
        return True

    # -- internals ---------------------------------------------------------------------------
    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        """``api.request`` off the event loop (``query``, ``body``, ``content_type`` as it takes)."""
        return await asyncio.to_thread(self.api.request, method, path, **kw)

    def _ours(self, pod: Manifest) -> bool:
        return pods.node_of(pod) == self.node and pods.matches(pods.labels_of(pod), self._requirements)

    @property
    def _node(self) -> Manifest | None:
        return self._view.node_object

    @property
    def watches(self) -> list[Informer]:
        """Every watch it keeps (its pods', its node's, the node's other pods')."""
        mine = self._view.watches
        return mine + ([self._others.watch] if self._others and self._others.watch else [])

    async def _raw_pods(self) -> list[Manifest]:
        """This node's managed pods: from the watch caches, or listed when they are not ready."""
        if self._others is not None:
            self._others.start()
        return await self._view.managed(self._call)

    async def _managed(self) -> list[_Pod]:
        try:
            raw = await self._raw_pods()
        except KubeError as exc:
            raise RuntimeFailure(self.node, f"cannot list the node's pods: {exc}") from exc
        out, now = [], time.time()
        for manifest in raw:  # a move's replacement no start adopted yet is not the job's yet
            if steering.awaiting_adoption(manifest, now, pods.started_at(manifest)):
                continue
            p = self._understand(manifest)
            if p is not None:
                out.append(p)
        return out

    def _understand(self, manifest: Manifest) -> _Pod | None:
        try:
            # A GPU job on this node keeps to its product: placement must see the pin.
            labels = pods.labels_of(self._node) if self._node and pods.node_of(manifest) == self.node else {}
            spec = pods.job_spec(gpu.pin_product(manifest, labels))
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
            if p.job not in best or pods.current(p.manifest) > pods.current(best[p.job].manifest):
                best[p.job] = p
        return sorted(best.values(), key=lambda p: p.job)

    async def _require(self, container_id: ContainerId) -> _Pod:
        for p in self._one_per_job(await self._managed()):
            if p.job == container_id:
                return p
        raise NoSuchContainer(container_id, f"no managed pod of the job on node {self.node}")

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
            cpu_limit=pod_cpu_limit(p.manifest),
        )

    @staticmethod
    def _finished(p: _Pod) -> bool:
        return copying.finished(p.progress, p.checkpoints)

    async def _current(self, p: _Pod) -> Manifest | None:
        """The pod as it is now (same uid), None once it is gone."""
        ns, name = p.key
        uid = pods.meta(p.manifest).get("uid")
        if self._view.synced:
            cur = self._view.get(ns, name)
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

    async def _read_pod(self, ref: PodRef) -> Manifest | None:
        """The pod ``ref`` names as the API server holds it; None once it is gone."""
        try:
            pod: Manifest = await self._call("GET", f"{pods_path(ref.namespace)}/{ref.name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return pod

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
            await self.sleep(POLL_S)

    async def _node_object(self) -> Manifest | None:
        return await self._view.read_node(self._call)

    async def _thaw_for_signal(self, p: _Pod) -> None:
        """A frozen pod takes no SIGTERM (it would be killed at the grace deadline, without a
        checkpoint): thaw it first, whoever froze it."""
        frozen = p.job in self._procs.frozen or await asyncio.to_thread(self._procs.is_frozen, p.manifest)
        if frozen and not await asyncio.to_thread(self._procs.set_frozen, p.job, p.manifest, False):
            log.warning("specon.k8s.thaw_failed", container=p.job, pod=p.name)


def _implements_runtime(rt: KubernetesRuntime) -> Runtime:
    return rt  # mypy proves KubernetesRuntime satisfies the Runtime protocol
