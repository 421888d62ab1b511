"""The Kubernetes runtime: a worker is a node, a container is a managed pod bound to it.

The only module (with its ``k8s_*`` siblings) that imports the ``kubernetes`` client, and
only for its configuration loading and HTTP plumbing: requests and responses are plain JSON
manifests (``KubeApi``), so the rules in ``specon.runtime.k8s_pods`` apply to exactly what
the API server sends, and no field is lost to the generated models.

One ``KubernetesRuntime`` per agent, for the agent's node. Pods on the node that match the
label selector are its containers (kept current by a watch on the node's pods, relisting
after ``410 Gone``); its node object is watched the same way for capacity, labels, taints.

Save (SPEC §6) goes through the **Eviction API**, with the save's grace period as the
eviction's ``gracePeriodSeconds``: the API server honours PodDisruptionBudgets (a blocked
eviction, HTTP 429, is a ``SaveFailed`` and the pod keeps running), the kubelet sends
SIGTERM, the job checkpoints to the shared volume and exits, and the pod object goes away.
The runtime waits for that, then verifies the newest complete checkpoint on the volume.
Past the grace period the kubelet has SIGKILLed the job: the result is its newest complete
checkpoint (``forced``). A pod still there long after the grace period (a kubelet that does
not answer) is never force-deleted: it may still run, so the save fails and no copy starts.

Start creates a copy of the pod from the template in the ``JobSpec`` (or, when a save result
got lost, the one the save wrote to the volume's ``jobs/<job>/spec.json``), pinned with
``spec.nodeName``; see ``k8s_pods.restored_pod``. It refuses while any pod of the job that
has not terminated exists anywhere (``AlreadyRunning``); pod names are unique per
generation, so two racing starts cannot both create one.

Deviations from the local runtime, inherent to pods: a saved or stopped pod is deleted, so
it is no longer listed afterwards; ``forget`` deletes an ended pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import structlog
import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from specon import checkpoint as ckpt
from specon import jobkit
from specon.model import ContainerId, Resources, WorkerId
from specon.progress.last import last_event
from specon.runtime import k8s_pods as pods
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
from specon.runtime.k8s_pods import DEFAULT_CLAIM, DEFAULT_SELECTOR, Manifest, PodError, SharedVolume
from specon.runtime.volume import CorruptRecordError, JobPaths

log = structlog.get_logger()

_POLL_S = 0.05  # between looks at the (watch-fed) cache while waiting for a pod to go
_SYNC_WAIT_S = 10.0  # for a new watch's first list before falling back to a direct list
_WATCH_S = 240  # server-side timeout of one watch request; the next resumes where it ended
_METRICS_RETRY_S = 300.0  # how long a missing metrics API is believed missing
_SIGKILL_EXIT = 137


class KubeError(Exception):
    """An API call failed: ``status`` is the HTTP status (0: no answer), ``reason`` the
    Status reason (``NotFound``, ``Conflict``, ``TooManyRequests``...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}" if status else message)
        self.status, self.reason, self.message = status, reason, message


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s_client.ApiClient:
    """In-cluster configuration (the pod's ServiceAccount), else the kubeconfig
    (``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``)."""
    cfg = k8s_client.Configuration()
    if kubeconfig is None and context is None:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return k8s_client.ApiClient(cfg)
        except k8s_config.ConfigException:
            pass
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context, client_configuration=cfg
    )
    return k8s_client.ApiClient(cfg)


class KubeApi:
    """The REST calls the backend makes, JSON in and out, over the official client's
    configured connection (auth, TLS, proxies). Blocking: call from a thread."""

    def __init__(self, api: k8s_client.ApiClient, *, timeout: float = 30.0) -> None:
        self.client = api
        self.timeout = timeout

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: object,
        content_type: str,
        timeout: float | tuple[float, float],
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            m, url, hdrs, data, post = self.client.param_serialize(
                method,
                path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            return self.client.call_api(m, url, hdrs, data, post, _request_timeout=timeout)
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.reason or ""), str(exc.body or exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, "Unavailable", f"{method} {path}: {exc}") from exc

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> Any:
        resp = self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=self.timeout
        )
        try:
            raw = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, "Unavailable", f"{method} {path}: {exc}") from exc
        data = _json(raw)
        if not 200 <= resp.status < 300:
            status = data if isinstance(data, dict) else {}
            raise KubeError(
                resp.status,
                str(status.get("reason") or resp.reason or ""),
                str(status.get("message") or raw[:300].decode(errors="replace")),
            )
        return data

    def watch(
        self, path: str, query: Mapping[str, str], *, seconds: int, on_open: Callable[[Any], None]
    ) -> Iterator[dict[str, Any]]:
        """The events of one watch request (``watch=true`` is added), ending when the
        server closes it. ``on_open`` receives the response so another thread can close it."""
        q = {**query, "watch": "true", "timeoutSeconds": str(seconds), "allowWatchBookmarks": "true"}
        # The read timeout ends a watch the server never closes (a silent network, an emulator).
        resp = self._send(
            "GET", path, query=q, body=None, content_type="application/json", timeout=(10.0, seconds + 30.0)
        )
        raw = resp.response
        on_open(raw)
        try:
            if not 200 <= resp.status < 300:
                data = _json(resp.read())
                status = data if isinstance(data, dict) else {}
                raise KubeError(resp.status, str(status.get("reason", "")), str(status.get("message", "")))
            for line in _lines(raw):
                event = _json(line)
                if isinstance(event, dict):
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, "Unavailable", f"watch {path}: {exc}") from exc
        finally:
            raw.release_conn()


def _lines(resp: Any) -> Iterator[bytes]:
    """Newline-delimited chunks of a streamed response (one watch event per line)."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
    if buffer.strip():
        yield buffer


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def pods_path(namespace: str | None) -> str:
    return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"


class Informer:
    """A list+watch cache of one query, fed by a daemon thread (client-go's informer, small).

    ``accept`` filters what the server sends (it also re-applies the selectors, for servers
    that ignore them). A watch that ends is resumed from the last resourceVersion; ``410
    Gone`` (the version is too old) or any error relists, with backoff on errors.
    """

    def __init__(
        self,
        api: KubeApi,
        path: str,
        *,
        name: str,
        query: Mapping[str, str] | None = None,
        accept: Callable[[Manifest], bool] = lambda _o: True,
        watch_seconds: int = _WATCH_S,
    ) -> None:
        self.api, self.path, self.name = api, path, name
        self.query = dict(query or {})
        self.accept = accept
        self.watch_seconds = watch_seconds
        self._items: dict[tuple[str, str], Manifest] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self.relists = 0
        self.errors = 0

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"specon-watch-{self.name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()  # unblocks the watch thread's read

    def items(self) -> list[Manifest]:
        with self._lock:
            return list(self._items.values())

    def get(self, namespace: str, name: str) -> Manifest | None:
        with self._lock:
            return self._items.get((namespace, name))

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version: str | None = self._relist()
                backoff = 0.5
                while version is not None and not self._stop.is_set():
                    version = self._watch(version)
            except KubeError as exc:
                self.errors += 1
                if not self._stop.is_set():
                    log.warning("specon.k8s.watch_failed", watch=self.name, error=str(exc))
                self._stop.wait(backoff)
                backoff = min(30.0, backoff * 2)

    def _relist(self) -> str:
        data = self.api.request("GET", self.path, query=self.query)
        items = {pods.key_of(o): o for o in data.get("items") or [] if isinstance(o, dict) and self.accept(o)}
        with self._lock:
            self._items = items
        self.relists += 1
        self._synced.set()
        return str(pods.meta(data).get("resourceVersion") or "")

    def _watch(self, version: str) -> str | None:
        """Apply one watch request's events; the version to resume from, None to relist."""
        query = {**self.query, "resourceVersion": version} if version else self.query

        def opened(resp: Any) -> None:
            self._resp = resp

        for event in self.api.watch(self.path, query, seconds=self.watch_seconds, on_open=opened):
            kind, obj = event.get("type"), event.get("object")
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                if obj.get("code") == 410:
                    log.info("specon.k8s.watch_expired", watch=self.name)
                    return None
                raise KubeError(
                    int(obj.get("code") or 0), str(obj.get("reason", "")), str(obj.get("message"))
                )
            version = str(pods.meta(obj).get("resourceVersion") or version or "")
            if kind == "BOOKMARK":
                continue
            key = pods.key_of(obj)
            with self._lock:
                if kind == "DELETED" or not self.accept(obj):
                    self._items.pop(key, None)
                else:
                    self._items[key] = obj
            if self._stop.is_set():
                break
        return version


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
        for manifest in self._pods.items() if self._pods else []:
            p = self._understand(manifest)
            if p is not None and p.job == container_id:
                return p.spec
        try:
            return JobPaths.of(self.volume_root, container_id).read_spec()
        except (CorruptRecordError, ValueError) as exc:
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
            # The recipe for the restore, on the volume too: a rollback that lost the save
            # result still finds it (``job_spec``).
            self._write_spec(p.spec)
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
        template = self._template(spec)
        try:
            probe = pods.restored_pod(
                template, job=spec.id, node=self.node, gen=1, restored_from=None, restore_checkpoint=None
            )
            files = pods.job_files(probe, self.volume)
        except PodError as exc:
            raise StartFailed(spec.id, str(exc)) from exc
        ckpt_dir = self.volume_root / files.checkpoints
        restore_in_pod = None
        if checkpoint is not None:
            manifest = checkpoint.with_suffix(".json")
            if manifest.parent.resolve() != ckpt_dir.resolve():
                raise StartFailed(
                    spec.id, f"{checkpoint} is not in the job's checkpoint directory {ckpt_dir}"
                )
            try:
                ckpt.verify(manifest)
            except ckpt.CheckpointError as exc:
                raise StartFailed(spec.id, f"checkpoint does not verify: {exc}") from exc
            with contextlib.suppress(ValueError, PodError):
                relative = PurePosixPath(manifest.relative_to(self.volume_root).as_posix())
                restore_in_pod = pods.to_pod(probe, relative, self.volume)
        if _finished(self.volume_root / files.progress, ckpt_dir):
            raise StartFailed(spec.id, "already finished (done marker or final progress record)")
        existing = await self._job_pods(spec.id)
        running = [o for o in existing if pods.alive(o)]
        if running:
            where = ", ".join(
                f"{'/'.join(pods.key_of(o))} on {pods.node_of(o) or 'no node'}" for o in running
            )
            raise AlreadyRunning(spec.id, f"a pod of the job has not terminated: {where}")
        gen = max([pods.generation(template), *(pods.generation(o) for o in existing)]) + 1
        try:
            body = pods.restored_pod(
                template,
                job=spec.id,
                node=self.node,
                gen=gen,
                restored_from=str(pods.meta(template).get("name") or "") or None,
                restore_checkpoint=restore_in_pod,
            )
        except PodError as exc:
            raise StartFailed(spec.id, str(exc)) from exc
        namespace = pods.key_of(body)[0]
        try:
            created = await self._call("POST", pods_path(namespace), body=body)
        except KubeError as exc:
            if exc.status == 409:
                raise AlreadyRunning(spec.id, f"pod {pods.key_of(body)[1]} exists already: {exc}") from exc
            raise StartFailed(spec.id, f"cannot create pod {pods.key_of(body)[1]}: {exc}") from exc
        for old in existing:  # ended pods of the job are superseded: one pod per job
            with contextlib.suppress(KubeError):
                await self._delete(old, grace=0)
        p = self._understand(created)
        if p is None:  # pragma: no cover - it was built from a template that parsed
            raise StartFailed(spec.id, "created a pod that cannot be read back")
        self._write_spec(p.spec)
        log.info(
            "specon.k8s.started",
            node=self.node,
            container=spec.id,
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
        log.info("specon.k8s.forgotten", node=self.node, container=container_id, pod=p.name)

    # -- beyond the interface -----------------------------------------------------------------
    @property
    def node_labels(self) -> dict[str, str]:
        return pods.labels_of(self._node) if self._node else {}

    @property
    def node_taints(self) -> tuple[str, ...]:
        """Taint keys that keep pods off this node (cordoned and not-Ready included)."""
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

    async def _job_pods(self, job: ContainerId) -> list[Manifest]:
        """Every managed pod of ``job`` in the runtime's namespaces, on any node."""
        try:
            data = await self._call("GET", pods_path(self.namespace), query={"labelSelector": self.selector})
        except KubeError as exc:
            raise StartFailed(job, f"cannot tell whether the job runs elsewhere: {exc}") from exc
        out = []
        for o in data.get("items") or []:
            if isinstance(o, dict) and pods.matches(pods.labels_of(o), self._requirements):
                with contextlib.suppress(PodError):
                    if pods.job_id(o) == job:
                        out.append(o)
        return out

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

    def _template(self, spec: JobSpec) -> Manifest:
        text = spec.template
        if text is None:
            stored = self.job_spec(spec.id)
            text = stored.template if stored is not None else None
        if text is None:
            raise StartFailed(spec.id, "no pod template in the spec or on the volume")
        try:
            return pods.loads_template(text)
        except PodError as exc:
            raise StartFailed(spec.id, str(exc)) from exc

    def _write_spec(self, spec: JobSpec) -> None:
        paths = JobPaths(self.volume_root, spec.id)
        try:
            paths.dir.mkdir(parents=True, exist_ok=True)
            paths.write_spec(spec)
        except OSError as exc:  # the spec also travels in the save result; this is a fallback
            log.warning("specon.k8s.spec_not_written", container=spec.id, error=str(exc))

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
