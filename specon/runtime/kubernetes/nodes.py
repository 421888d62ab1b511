"""Nodes, quantities and resources as plain manifests, and the placement notation of taints
and tolerations: pure rules of the Kubernetes backend (no client, no I/O), re-exported by
``specon.runtime.kubernetes.pods``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from specon.model import TAINT_UNSCHEDULABLE as TAINT_UNSCHEDULABLE  # noqa: PLC0414 (re-exported)
from specon.model import Resources
from specon.policy.placement import ANY_KEY


class PodError(ValueError):
    """A pod cannot be managed as asked; says why (a counted skip or a refusal)."""


# -- quantities and resources ------------------------------------------------------------------
_SUFFIX = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


def quantity(raw: object) -> float:
    """A Kubernetes quantity (``500m``, ``2Gi``, ``1e3``) as a float; ``PodError`` if malformed."""
    m = _QUANTITY.match(str(raw).strip())
    if not m:
        raise PodError(f"bad quantity {raw!r}")
    value = float(m.group(1)) * _SUFFIX[m.group(2)]
    if not math.isfinite(value):
        raise PodError(f"bad quantity {raw!r}")
    return value


def _resources(values: Mapping[str, Any]) -> Resources:
    gpu = sum(int(quantity(v)) for k, v in values.items() if str(k).endswith("/gpu"))
    return Resources(
        cpu=quantity(values["cpu"]) if "cpu" in values else 0.0,
        memory=int(quantity(values["memory"])) if "memory" in values else 0,
        gpu=gpu,
    )


def _requested(container: Mapping[str, Any]) -> Resources:
    """A container's requests; limits stand in where a request is missing, as the API server
    defaults them."""
    res = container.get("resources") or {}
    return _resources({**(res.get("limits") or {}), **(res.get("requests") or {})})


def _peak(a: Resources, b: Resources) -> Resources:
    return Resources(max(a.cpu, b.cpu), max(a.memory, b.memory), max(a.gpu, b.gpu))


def pod_requests(pod: Mapping[str, Any]) -> Resources:
    """What the pod holds of its node, as the kube-scheduler counts it (NodeResourcesFit's
    ``PodRequests``) and the kubelet admits it: the sum of its containers' requests, with its
    sidecars' (init containers with ``restartPolicy: Always``), or each resource's peak
    while an init container runs (with the sidecars started before it) where that is more;
    pod-level ``spec.resources`` for CPU and memory where given; plus ``spec.overhead``
    (its RuntimeClass's). One definition for a managed job's requests and for the node's
    other pods (``k8s_others``)."""
    spec = pod.get("spec") or {}
    total = Resources()
    for c in spec.get("containers") or []:
        if isinstance(c, dict):
            total = total + _requested(c)
    peak = sidecars = Resources()
    for c in spec.get("initContainers") or []:
        if not isinstance(c, dict):
            continue
        own = _requested(c)
        if c.get("restartPolicy") == "Always":  # a sidecar runs beside the containers
            total, sidecars = total + own, sidecars + own
            peak = _peak(peak, sidecars)
        else:
            peak = _peak(peak, own + sidecars)
    total = _peak(total, peak)
    res = spec.get("resources") or {}  # pod-level resources (KEP 2837): CPU and memory only
    declared = {**(res.get("limits") or {}), **(res.get("requests") or {})}
    if "cpu" in declared or "memory" in declared:
        level = _resources(declared)
        total = Resources(
            cpu=level.cpu if "cpu" in declared else total.cpu,
            memory=level.memory if "memory" in declared else total.memory,
            gpu=total.gpu,
        )
    return total + _resources(spec.get("overhead") or {})


# -- nodes -------------------------------------------------------------------------------------
TAINT_NOT_READY = "node.kubernetes.io/not-ready"


def node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


# What a kubelet's Lease lasts when it does not say (kubelet's nodeLeaseDurationSeconds).
LEASE_SECONDS = 40.0


def node_lost(node: Mapping[str, Any] | None, lease: Mapping[str, Any] | None, now: float) -> bool:
    """The node's kubelet has been silent a whole lease: neither its Lease renewed nor its
    Ready condition posted within ``leaseDurationSeconds`` of ``now`` (epoch seconds): the
    node the node lifecycle controller marks NotReady, judged from the same heartbeats, so it
    holds where no such controller runs. A Node object that is gone is lost; one with no
    heartbeat on record is not (nothing says its kubelet stopped)."""
    if node is None:
        return True
    spec = (lease or {}).get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    seconds = float(duration) if isinstance(duration, int) and duration > 0 else LEASE_SECONDS
    beats = [_epoch(spec.get("renewTime"))]
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            beats.append(_epoch(cond.get("lastHeartbeatTime")))
    heard = [b for b in beats if b is not None]
    return bool(heard) and now - max(heard) >= seconds


def _epoch(raw: object) -> float | None:
    """An API time (RFC 3339, ``Z`` or an offset, micro-seconds or none) in epoch seconds."""
    if not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def node_schedulable(node: Mapping[str, Any]) -> bool:
    """Ready and not cordoned: a worker that may receive containers."""
    return node_ready(node) and not (node.get("spec") or {}).get("unschedulable")


# Taint effects that keep a new pod off a node (PreferNoSchedule is only a preference).
PLACEMENT_EFFECTS = ("NoSchedule", "NoExecute")


def node_taints(node: Mapping[str, Any]) -> tuple[str, ...]:
    """The taints that keep new pods off the node as ``key[=value]:Effect`` (the notation of
    ``specon.policy.placement.tolerates``), including the ones Kubernetes implies for a
    cordoned or not-Ready node, so placement's taint rule covers both."""
    taints = {
        _taint(t)
        for t in (node.get("spec") or {}).get("taints") or []
        if isinstance(t, dict) and t.get("effect") in PLACEMENT_EFFECTS and t.get("key")
    }
    if (node.get("spec") or {}).get("unschedulable"):
        taints.add(f"{TAINT_UNSCHEDULABLE}:NoSchedule")
    if not node_ready(node):
        taints.add(f"{TAINT_NOT_READY}:NoSchedule")
    return tuple(sorted(taints))


def _taint(t: Mapping[str, Any]) -> str:
    value = str(t.get("value") or "")
    return f"{t.get('key')}{'=' + value if value else ''}:{t.get('effect')}"


def pod_tolerations(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The pod's tolerations in the notation of ``specon.policy.placement.tolerates``.

    Faithful to Kubernetes' ``ToleratesTaint``: operator Exists (any value) or Equal (the
    default; the value must match, an absent value matches only an empty one), an empty
    key with Exists tolerates every taint, an empty effect every effect. Left out: a
    toleration with ``tolerationSeconds`` (a NoExecute taint evicts the pod after it, so
    the node is no home for a moved job; admission adds such tolerations for not-ready and
    unreachable nodes to every pod), a PreferNoSchedule-only one (placement ignores that
    effect), and malformed ones (an empty key with Equal, an unknown operator).
    """
    out: set[str] = set()
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        if not isinstance(t, dict) or t.get("tolerationSeconds") is not None:
            continue
        key, op = str(t.get("key") or ""), str(t.get("operator") or "Equal")
        effect = str(t.get("effect") or "")
        if effect and effect not in PLACEMENT_EFFECTS:
            continue
        if op == "Exists":
            text = key or ANY_KEY
        elif op == "Equal" and key:
            text = f"{key}={t.get('value') or ''}"
        else:
            continue
        out.add(f"{text}:{effect}" if effect else text)
    return tuple(sorted(out))


def pod_node_selector(pod: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The pod's ``spec.nodeSelector``: the labels its node must carry."""
    raw = (pod.get("spec") or {}).get("nodeSelector") or {}
    if not isinstance(raw, dict):
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in raw.items()))


def node_capacity(node: Mapping[str, Any]) -> Resources:
    """Allocatable resources (capacity where allocatable is absent)."""
    status = node.get("status") or {}
    return _resources(status.get("allocatable") or status.get("capacity") or {})
