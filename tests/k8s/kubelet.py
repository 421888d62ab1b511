"""A test stand-in for the kubelet: bound pods become real local processes.

``FakeKubelet`` registers N Node objects (Ready, with capacity, labels, taints) and watches the
pods bound to them (``spec.nodeName``). For each pod it runs the first container's
``command + args`` as a local process and reports it through the pod status API; it finishes
deletions the way a kubelet does (SIGTERM, the grace period, SIGKILL, then a grace-0 delete).

What a container would see, mapped onto one host:
- Volume mounts: ``hostPath`` -> that host path; PVC -> its pre-bound PV's ``hostPath``/``local``
  path (no PV controller runs, so the PVC needs ``spec.volumeName``); ``emptyDir``,
  ``configMap``, ``secret`` -> a directory under the pod's directory; ``projected`` with
  ``serviceAccountToken`` sources -> a token bound to the pod with that audience and
  expiry, minted by TokenRequest as a kubelet does (not rotated). The process is not in a
  mount namespace, so every ``mountPath`` prefix in ``command``, ``args``, env values and
  ``workingDir`` is rewritten to the host directory (also after a ``--flag=`` prefix).
- Env: the kubelet's own environment (with the running interpreter's bin/ first on PATH, so
  ``python`` is the test venv's) + ``HOSTNAME`` + ``KUBERNETES_SERVICE_HOST/PORT`` + the pod's
  ``envFrom``/``env`` (literal values, ``fieldRef``, ``configMapKeyRef``, ``secretKeyRef``);
  ``$(VAR)`` references in command/args are expanded as Kubernetes does.
- ServiceAccount: when the pod's ServiceAccount exists (and automount is not off), a token
  minted by TokenRequest is written to the usual ``token``/``ca.crt``/``namespace`` files,
  mapped at ``/var/run/secrets/kubernetes.io/serviceaccount``, plus a kubeconfig in
  ``KUBECONFIG`` so ``kubernetes.config.load_config()`` authenticates as that ServiceAccount.
- Restart policy ``Always``/``OnFailure`` restarts the process (backoff 0.5 s doubling to 10 s).
- Not emulated: other containers, init containers, probes, resource limits, images.

Threads: one watches pods, one owns all state (events, process exits and kill deadlines go
through a queue), one waiter per process. ``stop()`` kills every process it started.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client, watch

from tests.k8s.cluster import SA_ISSUER, KubeCluster, present

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
WATCH_SECONDS = 30
MAX_BACKOFF = 10.0


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class NodeSpec:
    """One Node the stand-in registers and serves. ``address`` is reported as the node's
    InternalIP and as its pods' IP (any 127.0.0.0/8 address can play a separate host)."""

    name: str
    cpu: str = "4"
    memory: str = "8Gi"
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    address: str = "127.0.0.1"
    unschedulable: bool = False


class PodStartError(Exception):
    """The pod cannot be run by the stand-in; it is marked Failed with this reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _Pod:
    uid: str
    namespace: str
    name: str
    node: NodeSpec
    pod: client.V1Pod
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: datetime | None = None
    first_start: datetime | None = None
    restarts: int = 0
    last_exit: dict[str, Any] | None = None
    restart_at: float | None = None  # monotonic time of a pending restart
    kill_deadline: float | None = None  # set when SIGTERM was sent
    finished: bool = False  # terminal phase written, or deletion completed

    @property
    def meta(self) -> client.V1ObjectMeta:
        return present(self.pod.metadata, "pod metadata")

    @property
    def spec(self) -> client.V1PodSpec:
        return present(self.pod.spec, "pod spec")


@dataclass(frozen=True)
class _PodEvent:
    kind: str  # ADDED, MODIFIED, DELETED, LISTED
    pod: client.V1Pod


@dataclass(frozen=True)
class _Exited:
    uid: str
    proc: subprocess.Popen[bytes]
    code: int


@dataclass(frozen=True)
class _Listed:
    """A full list just happened: pods missing from it were deleted while we were not watching."""

    uids: frozenset[str]


_Item = _PodEvent | _Exited | _Listed | None  # None: just wake up


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(when: datetime | None) -> str | None:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else None


def _die_with_parent() -> None:
    os.setsid()  # own process group: the whole "container" can be killed at once
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _kill_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class FakeKubelet:
    """Serves ``nodes`` for ``cluster`` until :meth:`stop`; a context manager.

    ``workdir`` holds one directory per pod (its log ``<container>.log``, emptyDirs, the
    ServiceAccount files). ``env`` is added to every process's environment.
    """

    def __init__(
        self,
        cluster: KubeCluster,
        nodes: Sequence[NodeSpec],
        *,
        workdir: Path,
        env: Mapping[str, str] | None = None,
        delete_nodes_on_stop: bool = True,
    ) -> None:
        if not nodes:
            raise ValueError("FakeKubelet needs at least one node")
        self.cluster = cluster
        self.nodes = {n.name: n for n in nodes}
        self.workdir = workdir
        self.env = dict(env or {})
        self.delete_nodes_on_stop = delete_nodes_on_stop
        self._core = client.CoreV1Api(cluster.api_client())
        self._watch_core = client.CoreV1Api(cluster.api_client())
        self._queue: queue.Queue[_Item] = queue.Queue()
        self._pods: dict[str, _Pod] = {}
        self._stopping = threading.Event()
        self._watch: watch.Watch | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # guards _pods for readers outside the sync thread
        self.errors: list[str] = []  # unexpected exceptions, for tests to assert on
        self._shutdown_grace = 2.0

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> FakeKubelet:
        self.start()
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for node in self.nodes.values():
            self._register(node)
        for target, name in ((self._sync_loop, "kubelet-sync"), (self._watch_loop, "kubelet-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, grace: float = 2.0) -> None:
        """Stop watching, SIGTERM every process, SIGKILL what is left after ``grace`` seconds."""
        self._shutdown_grace = grace
        self._stopping.set()
        self._queue.put(None)
        deadline = time.monotonic() + grace + 15
        for thread in self._threads:
            while thread.is_alive() and time.monotonic() < deadline:
                if self._watch is not None:  # again and again: a new watch may just have begun
                    self._watch.stop()  # type: ignore[no-untyped-call]
                thread.join(timeout=0.2)
        self._threads.clear()
        if self.delete_nodes_on_stop:
            for name in self.nodes:
                with contextlib.suppress(client.ApiException):
                    self._core.delete_node(name)

    # -- inspection (any thread) -----------------------------------------------------------------

    def pod_dir(self, namespace: str, name: str) -> Path | None:
        """The directory of the newest pod with that name (logs, volumes), if it ever ran here."""
        with self._lock:
            found = [p.dir for p in self._pods.values() if (p.namespace, p.name) == (namespace, name)]
        return found[-1] if found else None

    def log(self, namespace: str, name: str) -> str:
        pod_dir = self.pod_dir(namespace, name)
        if pod_dir is None:
            return ""
        return "".join(p.read_text(errors="replace") for p in sorted(pod_dir.glob("*.log")))

    def pid(self, namespace: str, name: str) -> int | None:
        with self._lock:
            for p in self._pods.values():
                if (p.namespace, p.name) == (namespace, name) and p.proc is not None:
                    return p.proc.pid
        return None

    # -- nodes -----------------------------------------------------------------------------------

    def _register(self, node: NodeSpec) -> None:
        now = _ts(_now())
        capacity = {"cpu": node.cpu, "memory": node.memory, "pods": "110"}
        conditions = [
            {"type": t, "status": "False", "reason": f"Kubelet Has No {t}", "lastHeartbeatTime": now}
            for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
        ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now}]
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": {
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **node.labels,
                },
            },
            "spec": {
                "unschedulable": node.unschedulable,
                "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in node.taints],
            },
        }
        status = {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": conditions,
                "addresses": [
                    {"type": "InternalIP", "address": node.address},
                    {"type": "Hostname", "address": node.name},
                ],
                # Every field: the client rejects a partial NodeSystemInfo when reading it back.
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": "fake",
                    "containerRuntimeVersion": "specon-fake://1",
                    "kernelVersion": os.uname().release,
                    "kubeProxyVersion": "v1.20.2",
                    "kubeletVersion": "v1.20.2",
                    "machineID": node.name,
                    "operatingSystem": "linux",
                    "osImage": "specon test stand-in",
                    "systemUUID": node.name,
                },
            }
        }
        try:
            self._core.create_node(present(client.V1Node.from_dict(body), "node"))
        except client.ApiException as err:
            if err.status != 409:
                raise
            self._core.patch_node(node.name, body)
        self._core.patch_node_status(node.name, status)
        # Admission (TaintNodesByCondition) taints every new node not-ready:NoSchedule; the node
        # lifecycle controller lifts it once the node is Ready. No controller runs here: do its
        # part, so the node carries only the taints it was declared with.
        self._core.patch_node(node.name, {"spec": {"taints": body["spec"]["taints"]}})

    # -- watch thread ----------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        resource_version: str | None = None
        while not self._stopping.is_set():
            try:
                if resource_version is None:
                    listed = self._watch_core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
                    for pod in listed.items:
                        self._queue.put(_PodEvent("LISTED", pod))
                    self._queue.put(_Listed(frozenset(present(p.metadata).uid or "" for p in listed.items)))
                    resource_version = present(listed.metadata, "list metadata").resource_version
                self._watch = watch.Watch()  # type: ignore[no-untyped-call]
                for event in self._watch.stream(  # type: ignore[no-untyped-call]
                    self._watch_core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName!=",
                    resource_version=resource_version,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=(5, WATCH_SECONDS + 10),
                ):
                    if self._stopping.is_set():
                        break
                    pod = event["object"]
                    resource_version = pod.metadata.resource_version
                    self._queue.put(_PodEvent(event["type"], pod))
            except client.ApiException as err:
                if err.status == 410:  # history compacted: list again
                    resource_version = None
                    continue
                self._note(f"watch: {err.status} {err.reason}")
                self._stopping.wait(0.5)
            except Exception as err:  # the connection dies on stop() or when the server goes away
                if not self._stopping.is_set():
                    self._note(f"watch: {err!r}")
                    self._stopping.wait(0.5)

    # -- sync thread: owns _pods -----------------------------------------------------------------

    def _sync_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                item = self._queue.get(timeout=self._next_wakeup())
            except queue.Empty:
                item = None
            try:
                if isinstance(item, _PodEvent):
                    self._on_pod(item)
                elif isinstance(item, _Exited):
                    self._on_exit(item)
                elif isinstance(item, _Listed):
                    for rec in self._pods.values():
                        if rec.uid not in item.uids and not rec.finished:
                            if rec.proc is not None:
                                _kill_group(rec.proc, signal.SIGKILL)
                            rec.finished, rec.restart_at = True, None
                self._on_timers()
            except Exception as err:
                self._note(f"sync: {err!r}")
        self._kill_all()

    def _kill_all(self) -> None:
        """On the sync thread, which started the processes: they would die with it anyway
        (PDEATHSIG), but first they get SIGTERM and the grace period."""
        procs = [p.proc for p in self._pods.values() if p.proc is not None]
        for proc in procs:
            _kill_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self._shutdown_grace
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            _kill_group(proc, signal.SIGKILL)  # also the stragglers a job left in its group
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)

    def _next_wakeup(self) -> float:
        times = [p.kill_deadline for p in self._pods.values() if p.kill_deadline is not None]
        times += [p.restart_at for p in self._pods.values() if p.restart_at is not None]
        return max(0.01, min([*times, time.monotonic() + 1.0]) - time.monotonic())

    def _on_pod(self, event: _PodEvent) -> None:
        pod = event.pod
        meta, spec = present(pod.metadata, "pod metadata"), present(pod.spec, "pod spec")
        node = self.nodes.get(spec.node_name or "")
        if node is None:
            return
        uid = present(meta.uid, "pod uid")
        rec = self._pods.get(uid)
        if event.kind == "DELETED":
            if rec is not None:
                if rec.proc is not None:  # force-deleted while running: nothing to report to
                    _kill_group(rec.proc, signal.SIGKILL)
                rec.finished = True
            return
        if rec is None:
            rec = _Pod(
                uid=uid,
                namespace=present(meta.namespace, "pod namespace"),
                name=present(meta.name, "pod name"),
                node=node,
                pod=pod,
                dir=self.workdir / f"{meta.namespace}_{meta.name}_{uid[:8]}",
            )
            with self._lock:
                self._pods[uid] = rec
            if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
                rec.finished = True  # ran before this kubelet existed
            elif meta.deletion_timestamp is None:
                self._start(rec)
        rec.pod = pod
        if meta.deletion_timestamp is not None and not rec.finished:
            self._begin_deletion(rec)
        elif meta.deletion_timestamp is not None and rec.proc is None:
            self._complete_deletion(rec)

    def _begin_deletion(self, rec: _Pod) -> None:
        rec.restart_at = None
        if rec.proc is None:
            self._complete_deletion(rec)
        elif rec.kill_deadline is None:
            grace = rec.meta.deletion_grace_period_seconds
            if grace is None:
                grace = rec.spec.termination_grace_period_seconds
            grace = 30 if grace is None else grace
            rec.kill_deadline = time.monotonic() + grace
            # Like a container runtime: SIGTERM to the main process only, SIGKILL to all later.
            with contextlib.suppress(ProcessLookupError):
                rec.proc.send_signal(signal.SIGTERM)

    def _on_exit(self, exited: _Exited) -> None:
        rec = self._pods.get(exited.uid)
        if rec is None or rec.proc is not exited.proc:
            return
        _kill_group(exited.proc, signal.SIGKILL)  # the container's other processes die with it
        rec.proc = None
        finished_at = _now()
        rec.last_exit = {
            "exitCode": exited.code,
            "reason": "Completed" if exited.code == 0 else "Error",
            "startedAt": _ts(rec.started_at),
            "finishedAt": _ts(finished_at),
        }
        if rec.kill_deadline is not None or rec.meta.deletion_timestamp is not None:
            self._write_status(
                rec, phase=self._terminal_phase(exited.code), state={"terminated": rec.last_exit}
            )
            self._complete_deletion(rec)
            return
        policy = rec.spec.restart_policy or "Always"
        if policy == "Never" or (policy == "OnFailure" and exited.code == 0):
            rec.finished = True
            self._write_status(
                rec, phase=self._terminal_phase(exited.code), state={"terminated": rec.last_exit}
            )
            return
        rec.restart_at = time.monotonic() + min(MAX_BACKOFF, 0.5 * 2**rec.restarts)
        self._write_status(
            rec,
            phase="Running",
            state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}},
        )

    def _on_timers(self) -> None:
        now = time.monotonic()
        for rec in list(self._pods.values()):
            if rec.kill_deadline is not None and now >= rec.kill_deadline and rec.proc is not None:
                _kill_group(rec.proc, signal.SIGKILL)
                rec.kill_deadline = now + 3600  # the exit event follows; do not kill again
            if rec.restart_at is not None and now >= rec.restart_at:
                rec.restart_at = None
                rec.restarts += 1
                self._start(rec)

    @staticmethod
    def _terminal_phase(code: int) -> str:
        return "Succeeded" if code == 0 else "Failed"

    def _complete_deletion(self, rec: _Pod) -> None:
        rec.finished = True
        try:
            self._core.delete_namespaced_pod(
                rec.name,
                rec.namespace,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=rec.uid)
                ),
            )
        except client.ApiException as err:
            if err.status not in (404, 409):  # already gone, or a new pod took the name
                raise

    # -- running a pod ---------------------------------------------------------------------------

    def _start(self, rec: _Pod) -> None:
        rec.dir.mkdir(parents=True, exist_ok=True)
        container = rec.spec.containers[0]
        try:
            argv, env, cwd = self._prepare(rec, container)
        except PodStartError as err:
            rec.finished = True
            self._write_status(
                rec,
                phase="Failed",
                state={"waiting": {"reason": err.reason, "message": str(err)}},
                reason=err.reason,
                message=str(err),
            )
            return
        with (rec.dir / f"{container.name}.log").open("ab") as out:
            try:
                proc = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509  (setsid + prctl: async-signal-safe)
                )
            except OSError as err:
                rec.finished = True
                reason = "StartError"
                self._write_status(
                    rec, phase="Failed", state={"waiting": {"reason": reason}}, message=str(err)
                )
                return
        rec.proc = proc
        rec.started_at = _now()
        rec.first_start = rec.first_start or rec.started_at
        threading.Thread(
            target=self._wait_for, args=(rec.uid, proc), name=f"wait-{proc.pid}", daemon=True
        ).start()
        self._write_status(rec, phase="Running", state={"running": {"startedAt": _ts(rec.started_at)}})

    def _wait_for(self, uid: str, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        self._queue.put(_Exited(uid, proc, code))

    def _prepare(self, rec: _Pod, container: client.V1Container) -> tuple[list[str], dict[str, str], Path]:
        if not container.command:
            raise PodStartError(
                "NoCommand", "the kubelet stand-in runs command+args; it cannot know an image's entrypoint"
            )
        mounts = self._mounts(rec, container)
        pod_env = self._pod_env(rec, container)
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(self.env)
        env["HOSTNAME"] = rec.name
        env["KUBERNETES_SERVICE_HOST"] = "127.0.0.1"
        env["KUBERNETES_SERVICE_PORT"] = str(self.cluster.port)
        kubeconfig = rec.dir / "kubeconfig"
        if kubeconfig.exists():
            env["KUBECONFIG"] = str(kubeconfig)
        env.update({k: _map_path(v, mounts) for k, v in pod_env.items()})
        argv = [_map_path(_expand(a, pod_env), mounts) for a in [*container.command, *(container.args or [])]]
        cwd = Path(_map_path(container.working_dir, mounts)) if container.working_dir else rec.dir
        cwd.mkdir(parents=True, exist_ok=True)
        return argv, env, cwd

    def _pod_env(self, rec: _Pod, container: client.V1Container) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.env_from or []:
            prefix = source.prefix or ""
            if source.config_map_ref is not None:
                data = self._config_map(
                    rec.namespace, source.config_map_ref.name, source.config_map_ref.optional
                )
                env.update({prefix + k: v for k, v in data.items()})
            if source.secret_ref is not None:
                data = self._secret(rec.namespace, source.secret_ref.name, source.secret_ref.optional)
                env.update({prefix + k: v for k, v in data.items()})
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = _expand(var.value or "", env)
                continue
            ref = var.value_from
            value: str | None
            if ref.field_ref is not None:
                value = self._field(rec, ref.field_ref.field_path)
            elif ref.config_map_key_ref is not None:
                cm_key = ref.config_map_key_ref
                value = self._config_map(rec.namespace, cm_key.name, cm_key.optional).get(cm_key.key)
            elif ref.secret_key_ref is not None:
                secret_key = ref.secret_key_ref
                value = self._secret(rec.namespace, secret_key.name, secret_key.optional).get(secret_key.key)
            else:
                raise PodStartError("UnsupportedEnv", f"env {var.name}: only fieldRef/configMap/secret refs")
            if value is not None:
                env[var.name] = value
        return env

    def _field(self, rec: _Pod, path: str) -> str:
        meta = rec.meta
        simple = {
            "metadata.name": meta.name,
            "metadata.namespace": meta.namespace,
            "metadata.uid": meta.uid,
            "spec.nodeName": rec.spec.node_name,
            "spec.serviceAccountName": rec.spec.service_account_name or "default",
            "status.podIP": rec.node.address,
            "status.hostIP": rec.node.address,
        }
        if path in simple:
            return str(simple[path] or "")
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if match:
            table = (meta.labels if match[1] == "labels" else meta.annotations) or {}
            return str(table.get(match[2], ""))
        raise PodStartError("UnsupportedFieldRef", f"fieldRef {path!r} is not supported by the stand-in")

    def _config_map(self, namespace: str, name: str | None, optional: bool | None) -> dict[str, str]:
        if not name:
            raise PodStartError("CreateContainerConfigError", "a configMap reference without a name")
        try:
            return dict(self._core.read_namespaced_config_map(name, namespace).data or {})
        except client.ApiException as err:
            if err.status == 404 and optional:
                return {}
            raise PodStartError("CreateContainerConfigError", f"configmap {name!r}: {err.reason}") from err

    def _secret(self, namespace: str, name: str | None, optional: bool | None) -> dict[str, str]:
        if not name:
            raise PodStartError("CreateContainerConfigError", "a secret reference without a name")
        try:
            data = self._core.read_namespaced_secret(name, namespace).data or {}
        except client.ApiException as err:
            if err.status == 404 and optional:
                return {}
            raise PodStartError("CreateContainerConfigError", f"secret {name!r}: {err.reason}") from err
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def _mounts(self, rec: _Pod, container: client.V1Container) -> dict[str, str]:
        """mountPath -> host path, for the container's volume mounts (and the SA token)."""
        volumes = {v.name: v for v in rec.spec.volumes or []}
        mounts: dict[str, str] = {}
        for mount in container.volume_mounts or []:
            volume = volumes.get(mount.name)
            if volume is None:
                raise PodStartError("CreateContainerConfigError", f"volume {mount.name!r} is not defined")
            base = self._volume_path(rec, volume)
            host = base / mount.sub_path if mount.sub_path else base
            host.mkdir(parents=True, exist_ok=True)
            mounts[mount.mount_path.rstrip("/") or "/"] = str(host)
        token_dir = self._service_account_files(rec)
        if token_dir is not None and SA_MOUNT not in mounts:
            mounts[SA_MOUNT] = str(token_dir)
        return mounts

    def _volume_path(self, rec: _Pod, volume: client.V1Volume) -> Path:
        own = rec.dir / "volumes" / volume.name
        if volume.host_path is not None:
            return Path(volume.host_path.path)
        if volume.empty_dir is not None:
            return own
        if volume.persistent_volume_claim is not None:
            return self._claim_path(rec.namespace, volume.persistent_volume_claim.claim_name)
        if volume.config_map is not None:
            cm = volume.config_map
            _write_items(own, self._config_map(rec.namespace, cm.name, cm.optional), cm.items)
            return own
        if volume.secret is not None:
            sec = volume.secret
            _write_items(own, self._secret(rec.namespace, sec.secret_name, sec.optional), sec.items)
            return own
        if volume.projected is not None:
            self._projected(rec, own, volume.name, volume.projected)
            return own
        raise PodStartError(
            "UnsupportedVolume", f"volume {volume.name!r}: type not supported by the stand-in"
        )

    def _projected(
        self, rec: _Pod, target: Path, name: str, projected: client.V1ProjectedVolumeSource
    ) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for source in projected.sources or []:
            sat = source.service_account_token
            if sat is None:
                raise PodStartError(
                    "UnsupportedVolume", f"volume {name!r}: only serviceAccountToken projections"
                )
            try:
                token = self.cluster.pod_token(
                    rec.namespace,
                    rec.name,
                    audience=sat.audience or SA_ISSUER,
                    expiration_seconds=sat.expiration_seconds or 3600,
                )
            except client.ApiException as err:
                raise PodStartError("FailedMount", f"volume {name!r}: token request: {err.reason}") from err
            (target / sat.path).write_text(token)

    def _claim_path(self, namespace: str, claim: str) -> Path:
        try:
            pvc = self._core.read_namespaced_persistent_volume_claim(claim, namespace)
        except client.ApiException as err:
            raise PodStartError("FailedMount", f"persistentvolumeclaim {claim!r}: {err.reason}") from err
        volume_name = pvc.spec.volume_name if pvc.spec else None
        if not volume_name:
            raise PodStartError(
                "FailedMount", f"claim {claim!r} names no volume (no PV controller here: set spec.volumeName)"
            )
        pv_spec = self._core.read_persistent_volume(volume_name).spec
        source = pv_spec and (pv_spec.host_path or pv_spec.local)
        if not source:
            raise PodStartError("FailedMount", f"volume {volume_name!r}: only hostPath/local PVs")
        return Path(source.path)

    def _service_account_files(self, rec: _Pod) -> Path | None:
        """Token files and a kubeconfig for the pod's ServiceAccount, when it exists."""
        if rec.spec.automount_service_account_token is False:
            return None
        account = rec.spec.service_account_name or "default"
        try:
            token = self.cluster.service_account_token(rec.namespace, account)
        except client.ApiException as err:
            if err.status == 404:  # no such ServiceAccount: run without credentials
                return None
            raise
        target = rec.dir / "serviceaccount"
        target.mkdir(parents=True, exist_ok=True)
        (target / "token").write_text(token)
        (target / "namespace").write_text(rec.namespace)
        (target / "ca.crt").write_bytes(self.cluster.ca_file.read_bytes())
        self.cluster.kubeconfig(rec.dir / "kubeconfig", token=token, namespace=rec.namespace)
        return target

    # -- status ----------------------------------------------------------------------------------

    def _write_status(
        self,
        rec: _Pod,
        *,
        phase: str,
        state: dict[str, Any],
        reason: str | None = None,
        message: str | None = None,
    ) -> None:
        container = rec.spec.containers[0]
        running = "running" in state
        now = _ts(_now())
        ready = "True" if running else "False"
        status: dict[str, Any] = {
            "phase": phase,
            "hostIP": rec.node.address,
            "podIP": rec.node.address,
            "podIPs": [{"ip": rec.node.address}],
            "startTime": _ts(rec.first_start or _now()),
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            ],
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image or "",
                    "imageID": "",
                    "containerID": f"fake://{rec.uid}/{rec.restarts}",
                    "ready": running,
                    "started": running,
                    "restartCount": rec.restarts,
                    "state": state,
                    "lastState": {"terminated": rec.last_exit}
                    if rec.last_exit and "terminated" not in state
                    else {},
                }
            ],
        }
        if reason is not None:
            status["reason"] = reason
        if message is not None:
            status["message"] = message
        try:
            self._core.patch_namespaced_pod_status(rec.name, rec.namespace, {"status": status})
        except client.ApiException as err:
            if err.status != 404:  # deleted meanwhile: nothing left to report on
                raise

    def _note(self, message: str) -> None:
        self.errors.append(message)


def _write_items(target: Path, data: Mapping[str, str], items: Sequence[client.V1KeyToPath] | None) -> None:
    target.mkdir(parents=True, exist_ok=True)
    chosen = {i.key: i.path for i in items} if items else {k: k for k in data}
    for key, rel in chosen.items():
        if key in data:
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(data[key])


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables only; ``$$`` escapes a dollar."""

    def sub(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _VAR.sub(sub, text)


def _map_path(text: str, mounts: Mapping[str, str]) -> str:
    """Rewrite a leading mountPath (whole word or after ``--flag=``) to its host directory."""
    head, sep, tail = text.partition("=") if text.startswith("-") else ("", "", text)
    for mount in sorted(mounts, key=len, reverse=True):
        if tail == mount or tail.startswith(mount.rstrip("/") + "/"):
            return head + sep + mounts[mount] + tail[len(mount) :]
    return text
