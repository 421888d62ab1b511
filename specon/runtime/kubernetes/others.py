"""The node's other pods: what the pods bound to it that specon does not manage request.

The kubelet admits a pod only where its requests and those of every pod already bound to the
node fit the node's allocatable (the scheduler's NodeResourcesFit rule). The manager counts
the managed pods (their requests come with each heartbeat); the others (other teams'
workloads, DaemonSets, system pods) only the node's agent sees. So the capacity the agent
reports is the allocatable less their requests (``OtherPods.deduct``), and placement never
sends a restored copy to a node whose kubelet would refuse it (``OutOfcpu``).

Which pods: every pod bound to the node (``spec.nodeName``, in every namespace) that the
runtime does not manage (not of its namespaces, where it has some, or not matching its label
selector: its own ``managed`` predicate) and that has not finished (Succeeded or Failed pods
hold nothing; a terminating one still does). Each pod's requests are
``k8s_nodes.pod_requests``, the scheduler's sum. They come from a watch of the node's pods
(``k8s_watch.Informer``), so a heartbeat costs no API call; without a watch, or until its
first list, from a list.

Listing a node's pods in every namespace needs the cluster-wide ``list`` verb on pods, which
RBAC cannot narrow to one node. So in a cluster the agents do not count them: the manager,
whose identity may list pods, does (``ClusterRequests``), for every node at once, and takes
them off the capacity each heartbeat reports; a pod counts as managed there when its
worker's heartbeat lists its job.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

import structlog

from specon.model import ContainerId, Resources
from specon.runtime.base import WorkerUsage
from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.runtime.kubernetes.pods import Manifest, PodError
from specon.runtime.kubernetes.watch import Informer

log = structlog.get_logger()

ALL_PODS = "/api/v1/pods"  # every namespace: the kubelet counts them all


def holds_resources(pod: Manifest) -> bool:
    """Its requests count on its node: not finished (``pods.alive``: Pending, Running,
    Unknown; a terminating pod still runs)."""
    return pods.alive(pod)


def requests_of(found: list[Manifest]) -> Resources:
    """The sum of the pods' requests (``pod_requests``); an unreadable one counts nothing."""
    total = Resources()
    for pod in found:
        try:
            total = total + pods.pod_requests(pod)
        except PodError as exc:  # the API server validates quantities: not expected
            log.warning("specon.k8s.requests_unreadable", pod="/".join(pods.key_of(pod)), error=str(exc))
    return total


def remaining(allocatable: Resources, used: Resources) -> Resources:
    """``allocatable`` less ``used``, each resource at least 0."""
    return Resources(
        cpu=max(0.0, allocatable.cpu - used.cpu),
        memory=max(0, allocatable.memory - used.memory),
        gpu=max(0, allocatable.gpu - used.gpu),
    )


class _Watching:
    """Owns ``watch`` (None: read by lists instead): started on first use, stopped at close."""

    watch: Informer | None

    def start(self) -> None:
        if self.watch is not None:
            self.watch.start()

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()


class OtherPods(_Watching):
    """The pods bound to ``node`` that the runtime does not manage, and their requests.

    ``managed``: the runtime's own test of a pod (its label selector); ``namespaces``: the
    runtime's, where it manages pods of some namespaces only (those of any other are others).
    """

    def __init__(
        self,
        api: KubeApi,
        node: str,
        *,
        managed: Callable[[Manifest], bool],
        namespaces: tuple[str, ...] = (),
        watch: bool = True,
    ) -> None:
        self.api = api
        self.node = node
        self.managed = managed
        self.namespaces = namespaces
        self.query = {"fieldSelector": f"spec.nodeName={node}"}
        self.watch = (
            Informer(api, ALL_PODS, name=f"others-{node}", query=self.query, accept=self.counted)
            if watch
            else None
        )
        self._last: tuple[Resources, int] | None = None  # the last sum and count (logged)

    def counted(self, pod: Manifest) -> bool:
        """Bound here, holding resources, and not a pod the manager counts already."""
        if pods.node_of(pod) != self.node or not holds_resources(pod):
            return False
        outside = bool(self.namespaces) and pods.key_of(pod)[0] not in self.namespaces
        return outside or not self.managed(pod)

    async def requests(self) -> Resources | None:
        """What the node's other pods request: the last sum read when they cannot be read
        now, None before any was."""
        self.start()
        if self.watch is not None and self.watch.synced:
            found = self.watch.items()
        else:
            try:
                data = await asyncio.to_thread(self.api.request, "GET", ALL_PODS, query=self.query)
            except KubeError as exc:
                log.warning("specon.k8s.other_pods_unreadable", node=self.node, error=str(exc))
                return None if self._last is None else self._last[0]
            found = [o for o in data.get("items") or [] if isinstance(o, dict) and self.counted(o)]
        total = requests_of(found)
        if self._last != (total, len(found)):  # once per change
            self._last = (total, len(found))
            log.info(
                "specon.k8s.unmanaged_requests",
                node=self.node,
                pods=len(found),
                cpu=total.cpu,
                memory=total.memory,
                gpu=total.gpu,
            )
        return total

    async def deduct(self, usage: WorkerUsage) -> WorkerUsage:
        """``usage`` with the capacity left to managed pods: its capacity (the node's
        allocatable) less the others' requests."""
        used = await self.requests()
        return usage if used is None else replace(usage, capacity=remaining(usage.capacity, used))


@dataclass(frozen=True, slots=True)
class _Held:
    node: str
    requests: Resources
    job: ContainerId | None  # a managed pod's job (its heartbeat may list it), else None


def _bound(pod: Manifest) -> bool:
    return bool(pods.node_of(pod))


class ClusterRequests(_Watching):
    """What every node's pods request, from one watch of all pods (the manager's): for each
    heartbeat, the requests of the pods bound to its node that it does not list as its jobs.

    An ``Index`` of the watch's cache (kept under the watch's lock, read from the event loop):
    a heartbeat costs a sum over its node's pods, never a pass over the cluster's."""

    def __init__(self, api: KubeApi, selector: str, *, watch: bool = True) -> None:
        self._requirements = pods.parse_selector(selector)
        self._lock = threading.Lock()
        self._by_node: dict[str, dict[tuple[str, str], _Held]] = {}
        self._node_of: dict[tuple[str, str], str] = {}  # where each indexed pod is
        self.watch = (
            Informer(
                api,
                ALL_PODS,
                name="all-pods",
                accept=lambda o: bool(pods.node_of(o)),
                index=self,
                store=False,
            )
            if watch
            else None
        )

    def _held(self, pod: Manifest) -> _Held | None:
        node = pods.node_of(pod)
        if not node or not holds_resources(pod):
            return None
        try:
            need = pods.pod_requests(pod)
        except PodError:
            return None
        job = None
        if pods.matches(pods.labels_of(pod), self._requirements):
            with contextlib.suppress(PodError, ValueError):
                job = pods.job_id(pod)
        return _Held(node, need, job)

    # -- the watch's Index -------------------------------------------------------------------
    def reset(self, items: Mapping[tuple[str, str], Manifest]) -> None:
        by_node: dict[str, dict[tuple[str, str], _Held]] = {}
        for key, pod in items.items():
            if (held := self._held(pod)) is not None:
                by_node.setdefault(held.node, {})[key] = held
        with self._lock:
            self._by_node = by_node
            self._node_of = {key: node for node, found in by_node.items() for key in found}

    def put(self, key: tuple[str, str], obj: Manifest | None) -> None:
        """One pod changed: O(1), whatever the cluster's size (a watch event each)."""
        held = None if obj is None else self._held(obj)
        with self._lock:
            was = self._node_of.pop(key, None)
            if was is not None:
                found = self._by_node[was]
                del found[key]
                if not found:
                    del self._by_node[was]
            if held is not None:
                self._by_node.setdefault(held.node, {})[key] = held
                self._node_of[key] = held.node

    # -- reading ------------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        return self.watch is not None and self.watch.synced

    def others(self, node: str, jobs: Iterable[str]) -> Resources:
        """What the pods bound to ``node`` request, but those of ``jobs`` (its heartbeat's)."""
        with self._lock:
            held = list(self._by_node.get(node, {}).values())
        total = Resources()
        if not held:  # no pod bound to it: no set of its jobs to build
            return total
        listed = set(jobs)
        for h in held:
            if h.job is None or h.job not in listed:
                total = total + h.requests
        return total

    def free(self, node: str, capacity: Resources, jobs: Iterable[str]) -> Resources:
        """``capacity`` (the node's allocatable) less what its other pods request; as it is
        until the watch has listed the pods once."""
        if not self.synced:
            return capacity
        return remaining(capacity, self.others(node, jobs))
