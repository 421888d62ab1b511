"""What one node's agent reads through the API, and how: its managed pods and its node object.

Managed pods: a watch (list + watch) for each namespace the agent manages, selected by label
and ``spec.nodeName``; with no namespace given, one watch across the cluster (a credential
that may list every pod: single-identity setups). The node: a watch selected by name (the
``list`` verb on nodes), or, with ``watch_node`` off, a ``get`` at most every ``NODE_TTL_S``
(the agent's least-privilege mode: RBAC cannot narrow a list to one node, so a credential
that may list nodes may list them all).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog

from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.api import KubeApi, KubeError, pods_path
from specon.runtime.kubernetes.pods import Manifest
from specon.runtime.kubernetes.watch import Informer

log = structlog.get_logger()

NODE_TTL_S = 5.0  # a node read by get: at most this often (its taints carry reclaim notices)
POLL_S = 0.05  # between looks at a watch's cache while waiting for it (or for a pod)
_SYNC_WAIT_S = 10.0  # for a new watch's first list before falling back to a direct list

Call = Callable[..., Awaitable[Any]]  # the runtime's API call: (method, path, query=...)


class NodeView:
    def __init__(
        self,
        api: KubeApi,
        node: str,
        *,
        namespaces: Sequence[str],
        selector: str,
        ours: Callable[[Manifest], bool],
        watch: bool,
        watch_node: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = node
        self.namespaces = tuple(namespaces)
        self.ours = ours
        self.pod_query = {"labelSelector": selector, "fieldSelector": f"spec.nodeName={node}"}
        scopes: Sequence[str | None] = self.namespaces or (None,)
        self.pod_watches = (
            [
                Informer(
                    api,
                    pods_path(ns),
                    name=f"pods-{node}" + (f"-{ns}" if ns else ""),
                    query=self.pod_query,
                    accept=ours,
                )
                for ns in scopes
            ]
            if watch
            else []
        )
        self.node_watch = (
            Informer(
                api,
                "/api/v1/nodes",
                name=f"node-{node}",
                query={"fieldSelector": f"metadata.name={node}"},
                accept=lambda o: pods.meta(o).get("name") == node,
            )
            if watch and watch_node
            else None
        )
        self.node_object: Manifest | None = None
        self._clock = clock
        self._node_read_at = -math.inf

    @property
    def watches(self) -> list[Informer]:
        return [*self.pod_watches, *([self.node_watch] if self.node_watch is not None else [])]

    def stop(self) -> None:
        for w in self.watches:
            w.stop()

    @property
    def synced(self) -> bool:
        return bool(self.pod_watches) and all(w.synced for w in self.pod_watches)

    def cached(self) -> list[Manifest]:
        """The managed pods in the watches' caches (every watch synced: ``synced``)."""
        return [o for w in self.pod_watches for o in w.items()]

    def get(self, namespace: str, name: str) -> Manifest | None:
        """A managed pod from the caches (None: not there)."""
        for w in self.pod_watches:
            if (found := w.get(namespace, name)) is not None:
                return found
        return None

    async def managed(self, call: Call) -> list[Manifest]:
        """The node's managed pods: from the watches' caches, else listed (``KubeError``)."""
        if self.pod_watches:
            for w in self.watches:
                w.start()
            deadline = time.monotonic() + _SYNC_WAIT_S
            while not self.synced and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
            if self.synced:
                if self.node_watch is not None and self.node_watch.synced:  # for GPU pins
                    self.node_object = next(iter(self.node_watch.items()), self.node_object)
                return self.cached()
        out = []
        for ns in self.namespaces or (None,):
            data = await call("GET", pods_path(ns), query=self.pod_query)
            out += [o for o in data.get("items") or [] if isinstance(o, dict) and self.ours(o)]
        return out

    async def read_node(self, call: Call) -> Manifest | None:
        """The node object: the watch's, else read (at most every ``NODE_TTL_S`` without a
        watch); the last one read when it cannot be read now."""
        if self.node_watch is not None and self.node_watch.synced:
            items = self.node_watch.items()
            self.node_object = items[0] if items else None
            return self.node_object
        now = self._clock()
        if self.node_watch is None and self.node_object is not None and now - self._node_read_at < NODE_TTL_S:
            return self.node_object
        try:
            self.node_object = await call("GET", f"/api/v1/nodes/{self.name}")
            self._node_read_at = now
        except KubeError as exc:
            log.warning("specon.k8s.node_unreadable", node=self.name, error=str(exc))
        return self.node_object
