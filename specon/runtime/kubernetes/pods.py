"""Pods and nodes as plain manifests: the Kubernetes backend's pure half (no client, no I/O).

Everything here takes the JSON dicts the API server sends (camelCase keys, as
``kubectl get -o json`` prints them) and returns values or new dicts, so the rules of the
backend are testable without a cluster and ``specon.runtime.kubernetes.backend`` only moves data.

The job contract on Kubernetes (documented for users in the README):

* A managed pod matches the runtime's label selector (default ``specon.io/managed=true``).
  Its job is the label ``specon.io/job`` (stable across migrations, while the pod name
  changes), else the ``Job`` that controls it (a Job's replacement pods are one job), else
  the pod name; a job is identified by (namespace, job), so its container id
  is ``<namespace>.<job>`` (a namespace is a DNS label, without dots: the first dot splits the
  id). Two jobs of one name in two namespaces are two containers.
* It mounts the shared ReadWriteMany volume (the PVC named by the agent's ``--claim``, or a
  hostPath under ``--host-path``) and points ``SPECON_PROGRESS_FILE`` and
  ``SPECON_CHECKPOINT_DIR`` at paths inside that mount. The agent sees the same volume at
  its ``--volume`` mount; a pod path maps to it through the mount's ``subPath``
  (and the hostPath's place under ``--host-path``). Annotations ``specon.io/progress-file``
  and ``specon.io/checkpoint-dir`` (paths relative to the volume's root) override the
  environment; without either, the default layout ``jobs/<id>/progress.jsonl`` and
  ``jobs/<id>/checkpoints`` (``<id>`` the namespace-qualified container id; the local
  runtime's layout, see ``specon.runtime.volume``) applies.
* ``specon.io/migratable: "false"`` opts a pod out of saves (it is still classified); pods
  with ``ownerReferences`` are left alone unless the runtime is told ``include_owned``.
* A restored copy is pinned with ``spec.nodeName``, created in the namespace of the job and
  named ``<base>-g<generation>``; its lineage is the label ``specon.io/job`` and the
  annotations ``specon.io/restored-from`` (the previous pod) and ``specon.io/generation``.
  What it runs comes from the job's pod as the API server held it (``k8s_restore``), never
  from a message.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from specon.model import ContainerId
from specon.runtime.base import (
    ENV_CHECKPOINT_DIR,
    ENV_JOB_ID,
    ENV_PROGRESS_FILE,
    ContainerState,
    JobSpec,
    valid_job_id,
)
from specon.runtime.kubernetes import steering
from specon.runtime.kubernetes.gpu import pod_gpu_memory
from specon.runtime.kubernetes.nodes import (
    PLACEMENT_EFFECTS,
    TAINT_NOT_READY,
    TAINT_UNSCHEDULABLE,
    PodError,
    node_capacity,
    node_lost,
    node_ready,
    node_schedulable,
    node_taints,
    pod_node_selector,
    pod_requests,
    pod_tolerations,
    quantity,
)
from specon.runtime.kubernetes.selectors import Requirement, matches, parse_selector
from specon.wire.validate import DNS_LABEL, LABEL_VALUE

# The pod rules, and the node and resource rules of k8s_nodes re-exported for the backend.
__all__ = [
    "ANN_CHECKPOINT",
    "ANN_CONTAINER",
    "ANN_CONTROLLED",
    "ANN_GENERATION",
    "ANN_MIGRATABLE",
    "ANN_MODEL",
    "ANN_PROGRESS",
    "ANN_RESTORED_FROM",
    "ANN_STEPS",
    "DEFAULT_CLAIM",
    "DEFAULT_SELECTOR",
    "ENV_RESTORE_CHECKPOINT",
    "LABEL_JOB",
    "PLACEMENT_EFFECTS",
    "TAINT_NOT_READY",
    "TAINT_UNSCHEDULABLE",
    "JobFiles",
    "Manifest",
    "PodError",
    "Requirement",
    "SharedVolume",
    "alive",
    "annotations_of",
    "controlling_job",
    "dumps_template",
    "env_of",
    "exit_code",
    "generation",
    "job_container",
    "job_files",
    "job_id",
    "job_name",
    "job_spec",
    "key_of",
    "labels_of",
    "loads_template",
    "matches",
    "meta",
    "migratable",
    "node_capacity",
    "node_lost",
    "node_of",
    "node_ready",
    "node_schedulable",
    "node_taints",
    "owners",
    "parse_selector",
    "pod_node_selector",
    "pod_requests",
    "pod_tolerations",
    "qualified_id",
    "quantity",
    "replaced_by_controller",
    "restored_name",
    "restored_pod",
    "split_job_id",
    "started_at",
    "state_of",
    "template_of",
    "terminating",
    "to_pod",
    "to_volume",
]

Manifest = dict[str, Any]

DEFAULT_SELECTOR = "specon.io/managed=true"
DEFAULT_CLAIM = "specon-data"
LABEL_JOB = "specon.io/job"
ANN_MIGRATABLE = "specon.io/migratable"
# On a restore record's template: the Job that controlled the pod (its next pod is the Job's).
ANN_CONTROLLED = "specon.io/controlled-by"
ANN_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # an Indexed Job's pod's
ANN_PROGRESS = "specon.io/progress-file"
ANN_CHECKPOINT = "specon.io/checkpoint-dir"
ANN_CONTAINER = "specon.io/container"  # which container is the job, when there are several
ANN_RESTORED_FROM = "specon.io/restored-from"
ANN_GENERATION = "specon.io/generation"
ANN_STEPS = "specon.io/steps"
ANN_MODEL = "specon.io/model"
# The start command a copy was created for (the manager's pod broker): a retried create of
# the same command finds it instead of refusing it as a second copy.
ANN_STARTED_BY = "specon.io/started-by"
# Set on restored pods: the checkpoint the restore was asked for, as a path inside the pod.
# Informational: the job resumes from its newest complete checkpoint anyway (SPEC §6).
ENV_RESTORE_CHECKPOINT = "SPECON_RESTORE_CHECKPOINT"

# Annotations never copied into a template: tooling state that describes one object.
# What a copy does not inherit: kubectl's, and what specon said of the pod it copies.
_VOLATILE_ANNOTATIONS = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        ANN_STARTED_BY,
        ANN_CONTROLLED,
        steering.ANN_MOVE,
        steering.ANN_ADOPTED,
        steering.ANN_PREFERRED,
    }
)
# Volumes the ServiceAccount admission plugin injects; a copy gets its own.
_INJECTED_VOLUME = re.compile(r"^(kube-api-access-[a-z0-9]+|default-token-[a-z0-9]+)$")
_GENERATION_SUFFIX = re.compile(r"-g\d+$")
_NAMESPACE = DNS_LABEL
_MAX_POD_NAME = 63  # a pod's hostname is its name: keep it within a DNS label
_ALIVE_PHASES = frozenset({"Pending", "Running", "Unknown", ""})


# -- reading a pod -----------------------------------------------------------------------------
def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (meta(obj).get("labels") or {}).items()}


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in (meta(obj).get("annotations") or {}).items()}


def key_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name)."""
    m = meta(obj)
    return str(m.get("namespace") or "default"), str(m.get("name") or "")


def node_of(pod: Mapping[str, Any]) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def job_name(pod: Mapping[str, Any]) -> str:
    """The job within its namespace: label ``specon.io/job``, else the name of the ``Job``
    that controls the pod (its replacements keep the job's identity), else the pod name."""
    return str(labels_of(pod).get(LABEL_JOB) or _job_of(pod) or meta(pod).get("name") or "")


def replaced_by_controller(pod: Mapping[str, Any]) -> bool:
    """Whether the job's controller, not specon, makes the pod that follows ``pod``: a Job's
    pod, or the template of a restore record that says so (``ANN_CONTROLLED``, written only by
    specon: a live pod's own annotation counts for nothing)."""
    return _job_of(pod) is not None


def _job_of(pod: Mapping[str, Any]) -> str | None:
    """The job a Job's pod is: the Job that controls ``pod`` (or controlled the pod a record's
    template holds), and the pod's completion index where it has one (an Indexed Job's pods
    are one job each)."""
    owner = controlling_job(pod)
    if owner is None:
        said = annotations_of(pod).get(ANN_CONTROLLED, "")
        if meta(pod).get("uid") or not said.startswith("Job/"):
            return None
        owner = said.removeprefix("Job/") or None
    index = annotations_of(pod).get(ANN_COMPLETION_INDEX, "")
    return f"{owner}-{index}" if owner and index.isdigit() else owner


def controlling_job(pod: Mapping[str, Any]) -> str | None:
    """The name of the ``batch/v1`` Job that controls ``pod`` (None: no Job controls it)."""
    for ref in meta(pod).get("ownerReferences") or []:
        if (
            isinstance(ref, dict)
            and ref.get("controller") is True
            and ref.get("kind") == "Job"
            and str(ref.get("apiVersion", "")).startswith("batch/")
            and ref.get("name")
        ):
            return str(ref["name"])
    return None


def qualified_id(namespace: str, job: str) -> ContainerId:
    """``<namespace>.<job>``, the container id of a job; ``PodError`` if it cannot be one."""
    if not _NAMESPACE.fullmatch(namespace):
        raise PodError(f"namespace {namespace!r} is not a DNS label")
    try:
        return valid_job_id(f"{namespace}.{job}")
    except ValueError as exc:
        raise PodError(f"job {job!r} of namespace {namespace}: {exc}") from exc


def split_job_id(container: str) -> tuple[str, str]:
    """(namespace, job) of a container id made by ``qualified_id``; ``PodError`` otherwise."""
    namespace, dot, job = container.partition(".")
    if not dot or not job or not _NAMESPACE.fullmatch(namespace):
        raise PodError(f"{container!r} is not a Kubernetes job id (<namespace>.<job>)")
    return namespace, job


def job_id(pod: Mapping[str, Any]) -> ContainerId:
    """The job's container id, ``<namespace>.<job>``; ``PodError`` if unusable."""
    return qualified_id(key_of(pod)[0], job_name(pod))


def generation(pod: Mapping[str, Any]) -> int:
    try:
        return max(1, int(annotations_of(pod).get(ANN_GENERATION, "1")))
    except ValueError:
        return 1


def migratable(pod: Mapping[str, Any]) -> bool:
    return annotations_of(pod).get(ANN_MIGRATABLE, "true").strip().lower() not in {"false", "no", "0"}


def owners(pod: Mapping[str, Any]) -> list[str]:
    """``Kind/name`` of each owner reference (empty: a bare pod)."""
    refs = meta(pod).get("ownerReferences") or []
    return [f"{r.get('kind', '?')}/{r.get('name', '?')}" for r in refs if isinstance(r, dict)]


def recency(pod: Mapping[str, Any]) -> tuple[int, float]:
    """How recent a pod of a job is: its generation, then its start."""
    return generation(pod), started_at(pod)


def current(pod: Mapping[str, Any]) -> tuple[bool, int, float]:
    """Which pod of a job stands for it: one that has not ended, then the most recent."""
    return alive(pod), *recency(pod)


def unmovable(pod: Mapping[str, Any], include_owned: bool) -> str | None:
    """Why a save may not move ``pod`` (None: it may): it opted out, or a controller other than
    a Job owns it (unless ``include_owned``: its controller does not start a second copy). A
    Job's pod moves by eviction: the Job makes its replacement, the webhook steers it."""
    name = "/".join(key_of(pod))
    if not migratable(pod):
        return f"pod {name} opted out ({ANN_MIGRATABLE}: false)"
    if (found := owners(pod)) and not include_owned and controlling_job(pod) is None:
        return f"pod {name} is owned by {', '.join(found)}; left alone"
    return None


def terminating(pod: Mapping[str, Any]) -> bool:
    return bool(meta(pod).get("deletionTimestamp"))


def alive(pod: Mapping[str, Any]) -> bool:
    """Not terminated: the job may run (or be about to run) in it. Unknown counts as alive,
    so a pod on an unreachable node is never thought stopped."""
    return str((pod.get("status") or {}).get("phase") or "") in _ALIVE_PHASES


def job_container(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The container that runs the job: named by ``specon.io/container``, else the first
    one with the job contract's environment, else the first one."""
    containers = [c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]
    if not containers:
        raise PodError(f"pod {key_of(pod)[1]} has no containers")
    wanted = annotations_of(pod).get(ANN_CONTAINER)
    if wanted:
        for c in containers:
            if c.get("name") == wanted:
                return c
        raise PodError(f"{ANN_CONTAINER}={wanted!r} names no container of the pod")
    for c in containers:
        if {ENV_PROGRESS_FILE, ENV_CHECKPOINT_DIR} & set(env_of(c)):
            return c
    return containers[0]


def env_of(container: Mapping[str, Any]) -> dict[str, str]:
    """Literal env values (``valueFrom`` entries cannot be resolved here and are left out)."""
    out = {}
    for e in container.get("env") or []:
        if isinstance(e, dict) and "name" in e and "valueFrom" not in e:
            out[str(e["name"])] = str(e.get("value", ""))
    return out


def state_of(pod: Mapping[str, Any]) -> tuple[ContainerState, int | None]:
    """The container state and, once ended, the job container's exit code."""
    phase = str((pod.get("status") or {}).get("phase") or "")
    if phase in _ALIVE_PHASES:
        return (ContainerState.STOPPING if terminating(pod) else ContainerState.RUNNING), None
    code = exit_code(pod)
    if phase == "Succeeded":
        return ContainerState.EXITED, 0 if code is None else code
    return ContainerState.FAILED, code


def exit_code(pod: Mapping[str, Any]) -> int | None:
    """The job container's exit code, if it terminated."""
    try:
        name = job_container(pod).get("name")
    except PodError:
        return None
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if isinstance(cs, dict) and cs.get("name") == name:
            term = (cs.get("state") or {}).get("terminated") or {}
            if "exitCode" in term:
                try:
                    return int(term["exitCode"])
                except (TypeError, ValueError):
                    return None
    return None


def started_at(pod: Mapping[str, Any]) -> float:
    """Epoch seconds of the pod's start (``status.startTime``, else its creation)."""
    for raw in ((pod.get("status") or {}).get("startTime"), meta(pod).get("creationTimestamp")):
        if raw:
            try:
                return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


# -- the shared volume -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SharedVolume:
    """How to recognise the shared volume among a pod's volumes.

    ``claim``: the PersistentVolumeClaim's name. ``host_path``: a hostPath directory that
    is the volume's root (single-node clusters and tests); a pod's hostPath volume at or
    under it is the shared volume, seen at its place below that root.
    """

    claim: str | None = DEFAULT_CLAIM
    host_path: str | None = None

    def base_of(self, volume: Mapping[str, Any]) -> PurePosixPath | None:
        """Where ``volume`` starts below the shared volume's root; None if it is another one."""
        pvc = volume.get("persistentVolumeClaim")
        if isinstance(pvc, dict) and self.claim is not None and pvc.get("claimName") == self.claim:
            return PurePosixPath()
        hp = volume.get("hostPath")
        if isinstance(hp, dict) and self.host_path is not None:
            path, root = PurePosixPath(str(hp.get("path", ""))), PurePosixPath(self.host_path)
            if path == root or root in path.parents:
                return path.relative_to(root)
        return None


def _safe_relative(path: PurePosixPath) -> PurePosixPath:
    if path.is_absolute() or ".." in path.parts:
        raise PodError(f"{path} escapes the shared volume")
    return path


def _mounts(
    pod: Mapping[str, Any], container: Mapping[str, Any], volume: SharedVolume
) -> list[tuple[PurePosixPath, PurePosixPath]]:
    """(mount path in the pod, its place below the volume root) for each mount of the shared
    volume, deepest mount first."""
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or [] if isinstance(v, dict)}
    out = []
    for m in container.get("volumeMounts") or []:
        v = volumes.get(m.get("name"))
        base = None if v is None else volume.base_of(v)
        if base is None:
            continue
        sub = _safe_relative(PurePosixPath(str(m.get("subPath") or "")))
        out.append((PurePosixPath(str(m.get("mountPath", "/"))), base / sub))
    return sorted(out, key=lambda p: len(p[0].parts), reverse=True)


def to_volume(pod: Mapping[str, Any], path_in_pod: str, volume: SharedVolume) -> PurePosixPath:
    """A path inside the pod's job container as a path relative to the shared volume's root."""
    p = PurePosixPath(path_in_pod)
    if not p.is_absolute():
        raise PodError(f"{path_in_pod!r} is not an absolute path")
    for mount, base in _mounts(pod, job_container(pod), volume):
        if p == mount or mount in p.parents:
            return _safe_relative(base / p.relative_to(mount))
    raise PodError(f"{path_in_pod} is not on the shared volume (no mount of it covers the path)")


def to_pod(pod: Mapping[str, Any], relative: PurePosixPath, volume: SharedVolume) -> str | None:
    """The inverse of ``to_volume``: where the job container sees ``relative``, if it does."""
    for mount, base in _mounts(pod, job_container(pod), volume):
        if relative == base or base in relative.parents or base == PurePosixPath():
            return str(mount / relative.relative_to(base))
    return None


@dataclass(frozen=True, slots=True)
class JobFiles:
    """A job's progress log and checkpoint directory, relative to the shared volume's root."""

    progress: PurePosixPath
    checkpoints: PurePosixPath


def job_files(pod: Mapping[str, Any], volume: SharedVolume) -> JobFiles:
    """Annotations first, then the job container's environment, then the default layout."""
    job = job_id(pod)
    ann = annotations_of(pod)
    env = env_of(job_container(pod))
    defaults = {
        ANN_PROGRESS: PurePosixPath("jobs", job, "progress.jsonl"),
        ANN_CHECKPOINT: PurePosixPath("jobs", job, "checkpoints"),
    }
    got = {}
    for annotation, variable in ((ANN_PROGRESS, ENV_PROGRESS_FILE), (ANN_CHECKPOINT, ENV_CHECKPOINT_DIR)):
        if annotation in ann:
            got[annotation] = _safe_relative(PurePosixPath(ann[annotation]))
        elif env.get(variable):
            got[annotation] = to_volume(pod, env[variable], volume)
        else:
            got[annotation] = defaults[annotation]
    return JobFiles(progress=got[ANN_PROGRESS], checkpoints=got[ANN_CHECKPOINT])


# -- templates and restored copies -------------------------------------------------------------
def template_of(pod: Mapping[str, Any]) -> Manifest:
    """The pod as a recipe for an identical copy: no status, identity, placement or owners."""
    m = meta(pod)
    annotations = {k: v for k, v in annotations_of(pod).items() if k not in _VOLATILE_ANNOTATIONS}
    spec = copy.deepcopy(pod.get("spec") or {})
    spec.pop("nodeName", None)
    injected = {
        v.get("name") for v in spec.get("volumes") or [] if _INJECTED_VOLUME.match(str(v.get("name", "")))
    }
    if injected:
        spec["volumes"] = [v for v in spec["volumes"] if v.get("name") not in injected]
        for kind in ("containers", "initContainers"):
            for c in spec.get(kind) or []:
                if c.get("volumeMounts"):
                    c["volumeMounts"] = [vm for vm in c["volumeMounts"] if vm.get("name") not in injected]
    metadata: Manifest = {"name": m.get("name"), "namespace": m.get("namespace") or "default"}
    if m.get("labels"):
        metadata["labels"] = dict(m["labels"])
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def dumps_template(template: Mapping[str, Any]) -> str:
    return json.dumps(template, sort_keys=True, separators=(",", ":"))


def loads_template(text: str) -> Manifest:
    """Parse a template; ``PodError`` unless it is a pod manifest with a name and containers."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise PodError(f"pod template is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("kind", "Pod") != "Pod":
        raise PodError("pod template is not a Pod manifest")
    if not meta(raw).get("name") or not (raw.get("spec") or {}).get("containers"):
        raise PodError("pod template lacks metadata.name or spec.containers")
    return raw


def job_spec(pod: Mapping[str, Any]) -> JobSpec:
    """The runtime-neutral spec of a managed pod, with its template for a restore (its GPU
    product pin, where it keeps to one, is added by the caller that knows its node:
    ``k8s_gpu.pin_product``)."""
    job = job_id(pod)
    c = job_container(pod)
    command = tuple(str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])] if str(a))
    ann = annotations_of(pod)
    labels = labels_of(pod)
    # Job-level settings the agent reads (metric, direction, format, opt-out) travel as labels.
    labels.update({k: v for k, v in ann.items() if k.startswith("specon.io/") and len(v) <= 256})
    steps = ann.get(ANN_STEPS, "")
    return JobSpec(
        id=job,
        command=command or (str(c.get("image") or "pod"),),
        env=tuple(sorted(env_of(c).items())),
        requests=pod_requests(pod),
        labels=tuple(sorted(labels.items())),
        steps=int(steps) if steps.isdigit() else None,
        model=ann.get(ANN_MODEL) or labels.get(ANN_MODEL),
        template=dumps_template(template_of(pod)),
        selector=pod_node_selector(pod),
        tolerations=pod_tolerations(pod),
        gpu_memory=pod_gpu_memory(pod),
    )


def restored_name(template: Mapping[str, Any], gen: int) -> str:
    """``<base>-g<gen>``: the template's name without an earlier generation suffix."""
    base = _GENERATION_SUFFIX.sub("", str(meta(template).get("name") or "job"))
    suffix = f"-g{gen}"
    return base[: _MAX_POD_NAME - len(suffix)].rstrip("-.") + suffix


def restored_pod(
    template: Mapping[str, Any],
    *,
    job: ContainerId,
    node: str,
    gen: int,
    restored_from: str | None,
    restore_checkpoint: str | None,
) -> Manifest:
    """The copy of job ``job`` (its container id) to create for ``node``: same spec and
    volumes, in the job's namespace, steered to ``node`` by a required node affinity
    (``steering``: kube-scheduler places it there, checking everything it checks for any
    pod, or leaves it Pending), with its lineage."""
    namespace, name = split_job_id(job)
    if not LABEL_VALUE.fullmatch(name):
        raise PodError(f"job {name!r} cannot be a label value (at most 63 characters)")
    if key_of(template)[0] != namespace:
        raise PodError(f"the template is of namespace {key_of(template)[0]}, the job of {namespace}")
    pod = copy.deepcopy(dict(template))
    pod.update({"apiVersion": "v1", "kind": "Pod"})
    m = pod.setdefault("metadata", {})
    for k in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "ownerReferences",
              "managedFields", "generateName", "selfLink"):  # fmt: skip
        m.pop(k, None)
    m["name"] = restored_name(template, gen)
    m["namespace"] = namespace  # the job's own: a copy never moves to another namespace
    m["labels"] = {**(m.get("labels") or {}), LABEL_JOB: name}
    ann = {**(m.get("annotations") or {}), ANN_GENERATION: str(gen)}
    if restored_from:
        ann[ANN_RESTORED_FROM] = restored_from
    m["annotations"] = ann
    steering.steer(pod, node)
    pod.pop("status", None)
    c = job_container(pod)
    env = [e for e in c.get("env") or [] if e.get("name") != ENV_RESTORE_CHECKPOINT]
    if not any(e.get("name") == ENV_JOB_ID for e in env):
        env.append({"name": ENV_JOB_ID, "value": job})
    if restore_checkpoint is not None:
        env.append({"name": ENV_RESTORE_CHECKPOINT, "value": restore_checkpoint})
    c["env"] = env
    return pod
