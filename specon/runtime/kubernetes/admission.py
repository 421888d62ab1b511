"""The pod admission webhook's pure half: an ``AdmissionReview`` in, its answer out.

The API server sends every create of a managed pod in a training namespace to the manager
(``components/webhook``: a ``MutatingWebhookConfiguration`` with ``failurePolicy: Ignore``,
so a manager that is down or slow never stops a pod from being created). The answer is a
JSON Patch that adds scheduling hints and nothing else:

* a pod of a job the manager is moving (a Job controller's replacement for the pod a move
  evicted) is **steered**: a required node affinity naming the move's current target, as a
  restored copy is (``steering.steer``), so kube-scheduler places it there or nowhere and
  applies every other check it applies to any pod; and its job's container waits for the
  evicted copy to end before it resumes (``$SPECON_AWAIT_PREVIOUS``, ``specon.fence``): the
  controller makes the replacement as soon as the eviction starts, while the checkpoint is
  still being written;
* any other pod gets **preferred** node affinities naming the nodes Algorithm 2 ranks first
  for a new job (weights 100, 90, ...), so its first placement follows the category counts
  where the scheduler agrees; the scheduler's own scores still decide.

A probe pod (``probe_pod``, created with ``dryRun`` by ``webhook_probe`` before a Job's pod
is evicted) is answered with its nonce, so whoever evicts knows the replacement will be
steered. A pod specon steered already (a copy the manager made) is left as it is. The patch names
node *fields* (``metadata.name``), never labels the node's owner could change, and adds
no command, image, volume or privilege.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specon.fence import ENV_AWAIT_PREVIOUS, ENV_RUN_LOCK
from specon.runtime.kubernetes import pods, steering

REVIEW_API = "admission.k8s.io/v1"
WEBHOOK_PATH = "/v1/kubernetes/admission/pods"
ANN_PREFERRED = steering.ANN_PREFERRED
MAX_PREFERRED = 5
# A probe pod carries a nonce here; the webhook's answer copies it to ``ANN_PROBE_ANSWER``.
ANN_PROBE = "specon.io/webhook-probe"
ANN_PROBE_ANSWER = "specon.io/webhook-probe-answer"
PROBE_NODE = "specon-webhook-probe"  # no such node: the probe is never created (dry run)
_TOP_WEIGHT, _WEIGHT_STEP = 100, 10

Patch = list[dict[str, Any]]


class ReviewError(ValueError):
    """A body that is not an ``admission.k8s.io/v1`` review of a pod (the message says why)."""


@dataclass(frozen=True, slots=True)
class PodReview:
    """The parts of an ``AdmissionReview`` request the webhook reads."""

    uid: str
    operation: str
    namespace: str
    pod: dict[str, Any]  # with ``metadata.namespace`` set from the request
    dry_run: bool = False  # nothing will be stored (a probe is answered only then)

    @property
    def creates_pod(self) -> bool:
        return self.operation == "CREATE"


def read_review(body: object) -> PodReview:
    """The review in ``body`` (parsed JSON); ``ReviewError`` if it is not one of a pod."""
    if not isinstance(body, Mapping):
        raise ReviewError("the body is not a JSON object")
    if body.get("apiVersion") != REVIEW_API or body.get("kind") != "AdmissionReview":
        raise ReviewError(f"expected an AdmissionReview of {REVIEW_API}")
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise ReviewError("the review has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 128:
        raise ReviewError("the request has no uid")
    kind = request.get("kind") or {}
    if not isinstance(kind, Mapping) or (kind.get("group"), kind.get("kind")) != ("", "Pod"):
        raise ReviewError("the request is not about a pod")
    pod = request.get("object")
    if not isinstance(pod, Mapping):
        raise ReviewError("the request holds no pod")
    namespace = str(request.get("namespace") or "")
    obj = copy.deepcopy(dict(pod))
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(obj.get("spec"), dict):
        raise ReviewError("the pod has no metadata or spec")
    for part in ("labels", "annotations"):
        value = meta.get(part)
        if value is not None and not (
            isinstance(value, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            raise ReviewError(f"the pod's {part} are not a map of strings")
    meta["namespace"] = namespace  # a create's object may omit it
    operation = str(request.get("operation") or "")
    return PodReview(
        uid=uid, operation=operation, namespace=namespace, pod=obj, dry_run=request.get("dryRun") is True
    )


def answer(uid: str, patch: Patch | None = None, *, warning: str | None = None) -> dict[str, Any]:
    """The ``AdmissionReview`` that allows the pod, with ``patch`` applied when given."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warning:
        response["warnings"] = [warning]
    return {"apiVersion": REVIEW_API, "kind": "AdmissionReview", "response": response}


def patch_of(response: Mapping[str, Any]) -> Patch:
    """The JSON Patch in an answer (empty: none); for tests and the benchmark."""
    raw = (response.get("response") or {}).get("patch")
    return list(json.loads(base64.b64decode(raw))) if raw else []


def steered_already(pod: Mapping[str, Any]) -> bool:
    """Whether specon steered this pod already (a copy the manager made)."""
    spec = pod.get("spec") or {}
    return steering.steered_to({**pod, "spec": {**spec, "nodeName": None}}) is not None


def bound(pod: Mapping[str, Any]) -> bool:
    """Whether the pod names its node itself (``spec.nodeName``: no scheduler places it)."""
    return pods.node_of(pod) is not None


def _replace(changed: Mapping[str, Any]) -> Patch:
    """Ops that give the pod ``changed``'s annotations and affinity: whole values (``add``
    replaces a member that exists), so no path reaches into keys that need escaping."""
    meta, spec = changed["metadata"], changed["spec"]
    return [
        {"op": "add", "path": "/metadata/annotations", "value": meta["annotations"]},
        {"op": "add", "path": "/spec/affinity", "value": spec["affinity"]},
    ]


def steering_patch(
    pod: Mapping[str, Any], node: str, *, move: str | None = None, await_previous: float | None = None
) -> Patch:
    """The patch that steers ``pod`` onto ``node`` (a required node affinity); with ``move``
    (its id), marked as that move's replacement (``steering.ANN_MOVE``); with
    ``await_previous``, its job's container waits that many seconds at most for the previous
    copy to end (``specon.fence``: the evicted pod may still be saving its checkpoint)."""
    changed = copy.deepcopy(dict(pod))
    steering.steer(changed, node)
    if move is not None:
        changed["metadata"]["annotations"][steering.ANN_MOVE] = move
    patch = _replace(changed)
    if bound(pod):  # placed by the scheduler, as the affinity says, not where the template said
        patch.append({"op": "remove", "path": "/spec/nodeName"})
    if await_previous is not None:
        patch += job_env_patch(changed, {ENV_AWAIT_PREVIOUS: f"{await_previous:g}", ENV_RUN_LOCK: "1"})
    return patch


def job_env_patch(pod: Mapping[str, Any], env: Mapping[str, str]) -> Patch:
    """The op that sets ``env`` in the job's container of ``pod`` (its other variables kept)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    job = pods.job_container(pod)
    index = next(i for i, c in enumerate(containers) if c is job)
    kept = [e for e in job.get("env") or [] if isinstance(e, dict) and e.get("name") not in env]
    value = [*kept, *({"name": k, "value": v} for k, v in env.items())]
    return [{"op": "add", "path": f"/spec/containers/{index}/env", "value": value}]


def holds_run_lock(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's job holds its run lock (``specon.fence``), so that a replacement can
    wait for it: the webhook set ``SPECON_RUN_LOCK`` when the pod was created."""
    try:
        return pods.env_of(pods.job_container(pod)).get(ENV_RUN_LOCK) == "1"
    except pods.PodError:
        return False


def preference_patch(pod: Mapping[str, Any], nodes: Sequence[str]) -> Patch:
    """The patch that adds a preferred node affinity for each of ``nodes`` (best first), after
    the pod's own preferred terms; empty when there are none or specon added them before."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if not nodes or ANN_PREFERRED in annotations:
        return []
    changed = copy.deepcopy(dict(pod))
    spec = changed.setdefault("spec", {})
    affinity = spec.get("affinity") or {}
    spec["affinity"] = affinity
    node_affinity = affinity.setdefault("nodeAffinity", {})
    preferred = node_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", [])
    for rank, node in enumerate(nodes[:MAX_PREFERRED]):
        preferred.append(
            {
                "weight": _TOP_WEIGHT - _WEIGHT_STEP * rank,
                "preference": {"matchFields": [{"key": steering.FIELD, "operator": "In", "values": [node]}]},
            }
        )
    meta = changed.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), ANN_PREFERRED: ",".join(nodes[:MAX_PREFERRED])}
    return _replace(changed)


def probe_pod(namespace: str, labels: Mapping[str, str], nonce: str) -> dict[str, Any]:
    """A pod that asks the webhook to answer ``nonce`` (created with ``dryRun=All`` only):
    ``labels`` make it managed, steered so that a policy requiring specon's shape admits it,
    and as restricted as Pod Security's ``restricted`` level asks, with tiny requests and limits
    (a quota may require them)."""
    tiny = {"cpu": "1m", "memory": "1Mi"}  # within any quota that asks for requests and limits
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{PROBE_NODE}-",
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {ANN_PROBE: nonce},
        },
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": "specon-webhook-probe",
                    "resources": {"requests": tiny, "limits": tiny},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    steering.steer(pod, PROBE_NODE)
    return pod


def probe_patch(pod: Mapping[str, Any]) -> Patch:
    """The answer to a probe pod: its nonce, copied to ``ANN_PROBE_ANSWER`` (empty: no probe)."""
    annotations = dict((pod.get("metadata") or {}).get("annotations") or {})
    nonce = annotations.get(ANN_PROBE)
    if not isinstance(nonce, str):
        return []
    return [{"op": "add", "path": "/metadata/annotations", "value": {**annotations, ANN_PROBE_ANSWER: nonce}}]
