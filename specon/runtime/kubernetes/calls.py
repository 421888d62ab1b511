"""The Kubernetes runtime's REST calls on a job's pods and its restore record, over
``KubeApi``: blocking, as the client is (the runtime calls them with ``asyncio.to_thread``).

Each turns the API server's answers into the runtime's outcomes: ``SaveFailed`` when the pod
keeps running, ``NoSuchContainer`` when it is gone, ``KubeError`` for the caller to judge.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import structlog

from specon.model import ContainerId
from specon.runtime.base import NoSuchContainer, SaveFailed
from specon.runtime.kubernetes import gpu, pods, restore
from specon.runtime.kubernetes.api import MERGE_PATCH, KubeApi, KubeError, pods_path
from specon.runtime.kubernetes.pods import Manifest, PodError

log = structlog.get_logger()

# Writes of a job's restore record that met another writer's change before one gives up.
RECORD_TRIES = 5


def record_path(job: ContainerId) -> str:
    """The API path of the job's restore record (a PodTemplate in the job's namespace)."""
    namespace, _ = pods.split_job_id(job)
    return f"/api/v1/namespaces/{namespace}/podtemplates/{restore.record_name(job)}"


class PodCalls:
    """The calls for the managed pods that ``selector`` picks, in any namespace and node."""

    def __init__(self, api: KubeApi, selector: str) -> None:
        self.api = api
        self.selector = selector
        self._requirements = pods.parse_selector(selector)
        # policy/v1 Eviction from Kubernetes 1.22 on; older servers know only v1beta1.
        self.eviction_versions = ["policy/v1", "policy/v1beta1"]

    def job_pods(self, job: ContainerId) -> list[Manifest]:
        """Every managed pod of ``job`` (in its namespace, on any node)."""
        namespace, _ = pods.split_job_id(job)
        data = self.api.request("GET", pods_path(namespace), query={"labelSelector": self.selector})
        out = []
        for o in data.get("items") or []:
            if isinstance(o, dict) and pods.matches(pods.labels_of(o), self._requirements):
                with contextlib.suppress(PodError):
                    if pods.job_id(o) == job:
                        out.append(o)
        return out

    def lookup(self, job: ContainerId) -> tuple[Manifest | None, list[Manifest]]:
        """(the job's trusted original, every pod of the job). The original is the job's
        newest pod while one exists, else the pod its restore record holds, else None.
        ``KubeError`` when the API cannot answer, ``PodError`` for a bad record."""
        existing = self.job_pods(job)
        if existing:
            return max(existing, key=pods.recency), existing
        try:
            record = self.api.request("GET", record_path(job))
        except KubeError as exc:
            if exc.status == 404:
                return None, existing
            raise
        return restore.original_from_record(record, job), existing

    def write_record(
        self, job: ContainerId, manifest: Manifest, node_labels: Mapping[str, str] | None = None
    ) -> None:
        """Write the job's restore record from its pod (``manifest``, as last seen) as the
        API server holds it now, a GPU job pinned to the product in ``node_labels`` (its node's:
        ``k8s_gpu.pin_product``); ``SaveFailed`` (the pod keeps running) when that cannot be
        done, ``NoSuchContainer`` when the pod is gone or was replaced."""
        ns, name = pods.key_of(manifest)
        label = f"{ns}/{name}"
        try:
            pod = self.api.request("GET", f"{pods_path(ns)}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                raise NoSuchContainer(job, f"pod {label} is gone") from exc
            raise SaveFailed(job, f"cannot read pod {label} to record it: {exc}; it keeps running") from exc
        if pods.meta(pod).get("uid") != pods.meta(manifest).get("uid"):
            raise NoSuchContainer(job, f"pod {label} was replaced meanwhile")
        try:
            record = restore.record_of(gpu.pin_product(pod, node_labels or {}))
        except PodError as exc:
            raise SaveFailed(job, f"cannot record pod {label}: {exc}; it keeps running") from exc
        try:
            self._put_record(job, record)
        except KubeError as exc:
            raise SaveFailed(
                job,
                f"cannot write the restore record {ns}/{record['metadata']['name']}: {exc} "
                f"(is {ns} one of the training namespaces?); the pod keeps running",
            ) from exc

    def _put_record(self, job: ContainerId, record: Manifest) -> None:
        """Create the job's record, or replace an earlier one whole (a merge would keep fields
        the pod no longer has). Another writer of the same record (the recorder's first sight
        of a restored pod, a save) may change it between the read and the update: on a
        conflict read it again, as client-go's ``RetryOnConflict`` does. A record of a newer
        copy of the job (a higher generation) is never replaced by an older one."""
        path = record_path(job)
        for attempt in range(RECORD_TRIES):
            last = attempt == RECORD_TRIES - 1
            try:
                self.api.request("POST", path.rsplit("/", 1)[0], body=record)
                return
            except KubeError as exc:
                if exc.status != 409:
                    raise
            try:
                old = self.api.request("GET", path)
            except KubeError as exc:
                if exc.status == 404 and not last:
                    continue  # deleted meanwhile: create it again
                raise
            if pods.generation(old.get("template") or {}) > pods.generation(record["template"]):
                return  # a newer copy of the job is recorded already: never go back to ours
            record["metadata"]["resourceVersion"] = pods.meta(old).get("resourceVersion")
            try:
                self.api.request("PUT", path, body=record)
                return
            except KubeError as exc:
                if exc.status not in (404, 409) or last:
                    raise
            finally:
                record["metadata"].pop("resourceVersion", None)

    def evict(self, job: ContainerId, manifest: Manifest, grace: float) -> None:
        """Evict the pod through the Eviction API with ``grace`` as its grace period."""
        ns, name = pods.key_of(manifest)
        label = f"{ns}/{name}"
        options: dict[str, Any] = {"gracePeriodSeconds": max(1, math.ceil(grace))}
        uid = pods.meta(manifest).get("uid")
        if uid:  # evict exactly the pod we looked at, never a same-named successor
            options["preconditions"] = {"uid": uid}
        for version in list(self.eviction_versions):
            body = {
                "apiVersion": version,
                "kind": "Eviction",
                "metadata": {"name": name, "namespace": ns},
                "deleteOptions": options,
            }
            try:
                self.api.request("POST", f"{pods_path(ns)}/{name}/eviction", body=body)
                return
            except KubeError as exc:
                if exc.status in (400, 404) and version in exc.message and len(self.eviction_versions) > 1:
                    # A server older than policy/v1 (1.22) names the version it does not know.
                    self.eviction_versions.remove(version)
                    continue
                if exc.status == 429:
                    raise SaveFailed(
                        job,
                        f"eviction of pod {label} refused by a PodDisruptionBudget ({exc.message}); "
                        "it keeps running",
                    ) from exc
                if exc.status == 404:
                    raise NoSuchContainer(job, f"pod {label} is gone") from exc
                raise SaveFailed(job, f"cannot evict pod {label}: {exc}; it keeps running") from exc
        raise SaveFailed(job, f"cannot evict pod {label}: no Eviction version is served; it keeps running")

    def delete(self, manifest: Manifest, *, grace: int, unchanged: bool = False) -> None:
        """Delete exactly this pod (its uid); gone already is fine. ``unchanged``: only as it
        was read (its resourceVersion), else ``KubeError`` 409 (e.g. bound meanwhile)."""
        ns, name = pods.key_of(manifest)
        m = pods.meta(manifest)
        version = m.get("resourceVersion") if unchanged else None
        preconditions = {"uid": m.get("uid"), "resourceVersion": version}
        body: dict[str, Any] = {"gracePeriodSeconds": grace}
        if kept := {k: v for k, v in preconditions.items() if v}:
            body["preconditions"] = kept
        try:
            self.api.request("DELETE", f"{pods_path(ns)}/{name}", body=body)
        except KubeError as exc:
            if exc.status != 404:
                raise

    def annotate(self, manifest: Manifest, annotations: Mapping[str, str]) -> bool:
        """Merge ``annotations`` into the pod; False, logged, when the patch fails."""
        ns, name = pods.key_of(manifest)
        try:
            self.api.request(
                "PATCH",
                f"{pods_path(ns)}/{name}",
                body={"metadata": {"annotations": dict(annotations)}},
                content_type=MERGE_PATCH,
            )
        except KubeError as exc:
            log.warning("specon.k8s.annotate_failed", pod=f"{ns}/{name}", error=str(exc))
            return False
        return True
