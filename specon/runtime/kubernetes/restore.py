"""Where a restored pod's recipe comes from, and what it may not gain: pure rules, no I/O.

A ``start`` never runs what a message carries. The manager relays the source agent's save
result to the target agent, so anyone holding one agent's manager token could otherwise
have any pod created anywhere. On Kubernetes the recipe is the job's pod **as the API
server holds it**:

* while a pod of the job still exists (an ended one, on any node), that pod;
* once the save has deleted it, the **restore record** the saving agent wrote just before
  the eviction: a PodTemplate ``specon-restore-<job>`` in the job's own namespace holding
  the pod's metadata and spec exactly as the API server returned them.

Why a PodTemplate in the job's namespace: it must outlive the pod (an annotation dies with
it); the agent may write it only in the training namespaces, through the same namespaced
Role that lets it create pods there (``manifests/training``); a record is read only from
the namespace of the job it restores, describes a pod of that namespace, and the copy is
created there, so no record, forged or not, places a pod in another namespace, and whoever
can write one in a namespace could already create pods in it. A PodTemplate rather than a
ConfigMap: the API server validates it as a pod template, and the agent needs no access to
the ConfigMaps (often configuration, sometimes secrets) of the training namespaces.

The copy may not gain privileges the original lacked (``privilege_gains``): privileged
containers, host namespaces, hostPath volumes outside the original's, another
ServiceAccount or a mounted token the original opted out of, added capabilities, privilege
escalation the original forbade. ``start`` compares the pod it is about to create with the
original and refuses any gain.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

from specon.model import ContainerId
from specon.runtime.kubernetes.pods import (
    ANN_CONTROLLED,
    LABEL_JOB,
    Manifest,
    PodError,
    annotations_of,
    controlling_job,
    job_id,
    key_of,
    meta,
    split_job_id,
)

RECORD_LABEL = "specon.io/record"
RECORD_KIND = "restore"
RECORD_PREFIX = "specon-restore-"
ANN_POD = "specon.io/pod"
ANN_POD_UID = "specon.io/pod-uid"
MAX_RECORD_BYTES = 512 * 1024  # an object holds 1.5 MiB; a pod manifest is a few KiB


# -- the record ----------------------------------------------------------------------------------
def record_name(container: str) -> str:
    """The restore record's name for a job (its container id): readable, and a hash suffix
    keeps distinct jobs distinct whatever their names."""
    _, job = split_job_id(container)
    clean = re.sub(r"[^a-z0-9-]+", "-", job.lower()).strip("-")[:200] or "job"
    digest = hashlib.sha256(container.encode()).hexdigest()[:10]
    return f"{RECORD_PREFIX}{clean}-{digest}"


def record_of(pod: Mapping[str, Any]) -> Manifest:
    """The PodTemplate recording ``pod`` (as the API server returned it) for its job."""
    job = job_id(pod)
    namespace, name = split_job_id(job)
    m = meta(pod)
    template_meta = {k: copy.deepcopy(m[k]) for k in ("name", "labels", "annotations") if m.get(k)}
    if (owner := controlling_job(pod)) is not None:  # the owner reference itself is not kept
        template_meta["annotations"] = {
            **template_meta.get("annotations", {}),
            ANN_CONTROLLED: f"Job/{owner}",
        }
    spec = copy.deepcopy(pod.get("spec") or {})
    spec.pop("nodeName", None)  # the copy is pinned where it is restored
    size = len(json.dumps(spec)) + len(json.dumps(template_meta))
    if size > MAX_RECORD_BYTES:
        raise PodError(f"pod {key_of(pod)[1]} is too large to record ({size} bytes)")
    labels = {RECORD_LABEL: RECORD_KIND}
    if re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", name):
        labels[LABEL_JOB] = name
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": record_name(job),
            "namespace": namespace,
            "labels": labels,
            "annotations": {ANN_POD: key_of(pod)[1], ANN_POD_UID: str(m.get("uid", ""))},
        },
        "template": {"metadata": template_meta, "spec": spec},
    }


def original_from_record(record: Mapping[str, Any], container: ContainerId) -> Manifest:
    """The pod a record holds, checked to be a pod of ``container``'s job in the record's
    own namespace (the namespace ``container`` names); ``PodError`` saying what is wrong."""
    namespace, _ = split_job_id(container)
    where = f"restore record {key_of(record)[0]}/{meta(record).get('name')}"
    if record.get("kind", "PodTemplate") != "PodTemplate" or key_of(record)[0] != namespace:
        raise PodError(f"{where} is not a PodTemplate of the job's namespace {namespace}")
    template = record.get("template")
    if not isinstance(template, dict) or not isinstance(template.get("spec"), dict):
        raise PodError(f"{where} holds no pod template")
    raw_meta = template.get("metadata")
    tmeta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    pod: Manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**copy.deepcopy(tmeta), "namespace": namespace},
        "spec": copy.deepcopy(template["spec"]),
    }
    pod["metadata"].setdefault("name", annotations_of(record).get(ANN_POD) or container.split(".", 1)[1])
    if not pod["spec"].get("containers"):
        raise PodError(f"{where} holds a pod without containers")
    if job_id(pod) != container:
        raise PodError(f"{where} describes job {job_id(pod)}, not {container}")
    return pod


# -- privileges ---------------------------------------------------------------------------------
def _spec(pod: Mapping[str, Any]) -> dict[str, Any]:
    s = pod.get("spec")
    return s if isinstance(s, dict) else {}


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind/name, container) of every container, init and ephemeral ones included."""
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in _spec(pod).get(kind) or []:
            if isinstance(c, dict):
                yield f"{kind}/{c.get('name', '?')}", c


def _security(c: Mapping[str, Any]) -> dict[str, Any]:
    sc = c.get("securityContext")
    return sc if isinstance(sc, dict) else {}


def service_account(pod: Mapping[str, Any]) -> str:
    s = _spec(pod)
    return str(s.get("serviceAccountName") or s.get("serviceAccount") or "default")


def _host_paths(pod: Mapping[str, Any]) -> list[PurePosixPath]:
    out = []
    for v in _spec(pod).get("volumes") or []:
        hp = v.get("hostPath") if isinstance(v, dict) else None
        if isinstance(hp, dict):
            out.append(PurePosixPath("/", str(hp.get("path") or "/")))
    return out


def _covered(path: PurePosixPath, allowed: list[PurePosixPath]) -> bool:
    if ".." in path.parts:
        return False
    return any(path == a or a in path.parents for a in allowed)


def _capabilities(c: Mapping[str, Any]) -> set[str]:
    caps = _security(c).get("capabilities") or {}
    return {str(x).upper().removeprefix("CAP_") for x in (caps.get("add") or [])}


def _escalation_allowed(c: Mapping[str, Any]) -> bool:
    """allowPrivilegeEscalation (true when unset, and always for a privileged container)."""
    sc = _security(c)
    return sc.get("allowPrivilegeEscalation") is not False or bool(sc.get("privileged"))


def privilege_gains(original: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    """What ``candidate`` may do that ``original`` may not, in words; empty: nothing."""
    gains = []
    ns_o, ns_c = key_of(original)[0], key_of(candidate)[0]
    if ns_o != ns_c:
        gains.append(f"namespace {ns_c} instead of {ns_o}")
    so, sc = _spec(original), _spec(candidate)
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if sc.get(flag) and not so.get(flag):
            gains.append(flag)
    account, had = service_account(candidate), service_account(original)
    if account != had:
        gains.append(f"service account {account} (the original's: {had})")
    token = "automountServiceAccountToken"
    if so.get(token) is False and sc.get(token) is not False:
        gains.append("a mounted ServiceAccount token (the original opted out)")
    allowed = _host_paths(original)
    for path in _host_paths(candidate):
        if not _covered(path, allowed):
            gains.append(f"hostPath volume {path}")
    before = dict(_containers(original))
    for name, c in _containers(candidate):
        old = before.get(name, {})  # a container the original lacks is held to no privilege
        if _security(c).get("privileged") and not _security(old).get("privileged"):
            gains.append(f"privileged {name}")
        added = _capabilities(c) - _capabilities(old)
        if added:
            gains.append(f"capabilities {','.join(sorted(added))} in {name}")
        if name in before and _escalation_allowed(c) and not _escalation_allowed(old):
            gains.append(f"privilege escalation in {name}")
    return gains
