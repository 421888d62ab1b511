"""GPU jobs on Kubernetes: the pure rules (no client, no I/O).

A pod asks for GPUs as NVIDIA's device plugin has them: ``nvidia.com/gpu`` limits (an extended
resource is set as a limit; its request, if given, must equal it), summed over the pod's
containers as the scheduler does into ``JobSpec.requests.gpu`` (``k8s_nodes.pod_requests``).
A node offers its allocatable ``nvidia.com/gpu`` (``k8s_nodes.node_capacity``) less what its
unmanaged pods request (``k8s_others``) and, with GPU feature discovery, labels
``nvidia.com/gpu.product`` and ``nvidia.com/gpu.memory`` (MiB per device), which reach
placement as the worker's labels.

Two job settings beside the resource:

* ``specon.io/gpu-memory`` (annotation): the memory the job needs on each of its GPUs, in
  bytes or as a Kubernetes quantity (``40Gi``, ``80G``, ``42949672960``) → ``JobSpec.gpu_memory``;
  placement then keeps it off nodes whose ``nvidia.com/gpu.memory`` is smaller.
* ``specon.io/gpu-any-product: "true"`` (annotation or label): the job may move to any GPU
  product. Otherwise a GPU job keeps to the product it runs on: its ``JobSpec.selector`` gains
  ``nvidia.com/gpu.product=<its node's>`` (so Algorithm 2 offers only such nodes), and so does
  the pod a restore creates (the restore record is written with it), so the kubelet refuses a
  copy on another product too. A pod that already selects a product keeps its own choice.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from specon.model import GPU_ANY_PRODUCT_LABEL, GPU_MEMORY_NEED_LABEL, GPU_PRODUCT_LABEL
from specon.runtime.kubernetes.nodes import PodError, pod_node_selector, pod_requests, quantity

_TRUE = frozenset({"true", "yes", "1"})


def _meta_map(pod: Mapping[str, Any], field: str) -> dict[str, str]:
    raw = (pod.get("metadata") or {}).get(field) or {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def pod_gpu_memory(pod: Mapping[str, Any]) -> int:
    """Bytes of GPU memory the pod needs on each device (0: not said); ``PodError`` when the
    annotation is not a non-negative quantity of whole bytes."""
    raw = _meta_map(pod, "annotations").get(GPU_MEMORY_NEED_LABEL, "").strip()
    if not raw:
        return 0
    try:
        value = quantity(raw)
    except PodError as exc:
        raise PodError(f"{GPU_MEMORY_NEED_LABEL}={raw!r} is not a quantity (bytes, or e.g. 40Gi)") from exc
    if value < 0 or value != int(value):
        raise PodError(f"{GPU_MEMORY_NEED_LABEL}={raw!r} is not a whole, non-negative number of bytes")
    return int(value)


def allows_any_product(pod: Mapping[str, Any]) -> bool:
    """The job may run on any GPU product (``specon.io/gpu-any-product: "true"``)."""
    for field in ("annotations", "labels"):
        if _meta_map(pod, field).get(GPU_ANY_PRODUCT_LABEL, "").strip().lower() in _TRUE:
            return True
    return False


def product_pin(pod: Mapping[str, Any], node_labels: Mapping[str, str]) -> tuple[str, str] | None:
    """The ``(nvidia.com/gpu.product, <product>)`` selector pair a GPU pod on a node with
    ``node_labels`` keeps to; None when it needs none: no GPU asked, a node without the label,
    a job that allows any product, or a pod that already selects one."""
    product = node_labels.get(GPU_PRODUCT_LABEL, "")
    if not product or allows_any_product(pod):
        return None
    if any(key == GPU_PRODUCT_LABEL for key, _ in pod_node_selector(pod)):
        return None
    try:
        gpus = pod_requests(pod).gpu
    except PodError:
        return None  # unreadable requests: the spec reports them (and fails) on its own
    return (GPU_PRODUCT_LABEL, product) if gpus > 0 else None


def pin_product(pod: Mapping[str, Any], node_labels: Mapping[str, str]) -> dict[str, Any]:
    """``pod`` with ``product_pin``'s pair added to its ``spec.nodeSelector`` (a copy; the pod
    itself, unchanged, when there is nothing to add)."""
    pin = product_pin(pod, node_labels)
    if pin is None:
        return dict(pod)
    out = copy.deepcopy(dict(pod))
    spec = out.setdefault("spec", {})
    selector = spec.get("nodeSelector")
    spec["nodeSelector"] = {**(selector if isinstance(selector, dict) else {}), pin[0]: pin[1]}
    return out


def product_conflict(pod: Mapping[str, Any], node_labels: Mapping[str, str]) -> str | None:
    """Why a pod that selects a GPU product cannot run on a node with ``node_labels``, or None.
    (The kubelet would refuse it too, as a failed pod; a start refuses first, saying why.)"""
    wanted = dict(pod_node_selector(pod)).get(GPU_PRODUCT_LABEL)
    have = node_labels.get(GPU_PRODUCT_LABEL)
    if wanted is None or wanted == have:
        return None
    return (
        f"the job keeps to GPU product {wanted} ({GPU_PRODUCT_LABEL} in its nodeSelector; "
        f'{GPU_ANY_PRODUCT_LABEL}: "true" allows any) and this node has {have or "no such label"}'
    )
