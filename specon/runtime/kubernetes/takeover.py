"""A start that supersedes a lost node's copy (``Runtime.start(supersede=True)``): the job's
pod on a node whose kubelet is gone (``nodes.node_lost``) is recorded (the job's restore
record, as a save writes it: a copy that fails to start can still be made later) and deleted
through the API, with no grace (nobody is left to honour one), before the copy is created.
A pod on a node whose kubelet still answers is left alone: the start is refused
(``AlreadyRunning``) and retried.

The copy that may still run on a partitioned node is fenced by the job's generation on the
shared volume (``specon.fence``); its kubelet kills the container once it hears that the
pod is gone.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from specon.model import ContainerId
from specon.runtime.base import Supersede
from specon.runtime.kubernetes import pods, steering
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.pods import Manifest

log = structlog.get_logger("specon.k8s")

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"

Get = Callable[..., Awaitable[Any]]  # the backend's API call: (method, path)


class Delete(Protocol):
    """The backend's pod deletion, with its grace period in seconds."""

    def __call__(self, manifest: Manifest, *, grace: int) -> Awaitable[None]: ...


Record = Callable[[Manifest], Awaitable[None]]


async def _get_or_none(get: Get, path: str) -> Manifest | None:
    try:
        return dict(await get("GET", path))
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


async def lost_node(get: Get, node: str) -> bool:
    """Whether ``node``'s kubelet is gone (``KubeError`` when the API cannot say)."""
    manifest = await _get_or_none(get, f"/api/v1/nodes/{node}")
    lease = None if manifest is None else await _get_or_none(get, f"{LEASES}/{node}")
    return pods.node_lost(manifest, lease, time.time())


@dataclass(frozen=True, slots=True)
class Calls:
    """The backend's API calls a take-over makes."""

    get: Get
    delete: Delete
    record: Record


async def take_over(
    job: ContainerId, existing: Sequence[Manifest], here: str, lost: Supersede, calls: Calls
) -> list[Manifest]:
    """``existing`` without the pods of ``job`` this call deleted: those alive on (or, unbound,
    steered to) the node ``lost`` (True: any node but ``here``) whose kubelet is gone. ``KubeError`` when the
    API cannot say or delete; what ``record`` raises when the pod cannot be recorded (then it
    is not deleted). A pod on any other node is kept: its node was not taken for lost."""
    kept = []
    for pod in existing:
        # A copy no scheduler has bound yet belongs to the node it is steered to: lost with it
        # (its agent, gone, will never withdraw it); it never ran, so there is nothing to record.
        node = steering.steered_to(pod)
        named = node != here if lost is True else node == lost
        if not pods.alive(pod) or node is None or not named or not await lost_node(calls.get, node):
            kept.append(pod)
            continue
        if pods.node_of(pod) is not None:
            await calls.record(pod)
        await calls.delete(pod, grace=0)  # its node is lost: nothing there to wait for
        log.warning("specon.k8s.lost_pod_deleted", container=job, pod="/".join(pods.key_of(pod)), node=node)
    return kept
