"""The manager's write-ahead journal in the Kubernetes API (``--journal kubernetes``): one
``Migration`` resource (``specon.io/v1alpha1``, ``manifests/base/crd.yaml``) per migration, so
``kubectl get migrations`` and ``kubectl describe migration`` show what ``specon status`` shows,
and a manager restarted on any node recovers every in-flight migration from the API alone.

Same methods as ``specon_manager.journal.Journal``. Where the records live, in the manager's
namespace:

* ``Migration`` ``<prefix>-<id>``: ``spec`` what the migration is (id, job, from, to, reason,
  decidedAt: written once), ``status`` how far it got (state, updatedAt, checkpoint, ...,
  written through the status subresource), together every field of ``Migration`` through
  ``specon.wire.codec`` (``PLACES``), plus ``status.downtime`` for the printer column. Labels
  ``specon.io/record=migration`` and ``specon.io/in-flight`` let ``in_flight`` list only the open
  ones. Not the job's pod: a migration outlives the pod it saves.
* Marks, one per job, in ``MARK_SHARDS`` ConfigMaps ``<prefix>-marks-<nn>`` chosen by a hash of
  the job (label ``specon.io/record=mark-shard``): every job has a mark from its first
  placement (its home, for the reconciler), so they cannot live on its Migrations (most jobs
  never move), nor on its pods (a save deletes the pod, and the mark must outlive it); one
  object per job would make a manager's start list as many objects as jobs. A shard holds
  1/64 of the marks: at 10,000 jobs with long names and every field set the largest is 47 KiB
  as served (managedFields included; tests/k8s/test_crd_journal.py), so under 256 KiB up to
  ~50,000 such jobs.
* ``<prefix>-meta``: one ConfigMap, one data key per meta key (as the ConfigMap journal).

Writes are durable when the API server answers. Every update carries the ``resourceVersion``
last read: a concurrent writer makes it fail with 409 and the read-modify-write is redone on
fresh data (``KubeJournal.retry_conflicts``). A migration's write is up to three calls (its
object, its status, its in-flight label when it ends), in an order a manager killed between
them recovers from: a new object is labelled in flight before it has a status, and an object
with no status reads as ``decided`` (what a new migration is); the label goes to ``false`` only
after the ended status is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import structlog

from specon.coordinator.migration import Mark, Migration, State
from specon.coordinator.retention import prunable
from specon.model import ContainerId
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.runtime.kubernetes.pods import LABEL_JOB, meta
from specon.wire import codec
from specon.wire.validate import LABEL_VALUE
from specon_manager.k8s_journal import (
    IN_FLIGHT,
    RECORD,
    JournalError,
    KubeJournal,
    decode_mark,
    encode_mark,
    name_part,
)
from specon_manager.k8s_journal_upgrade import Carried, carry_over

log = structlog.get_logger()

GROUP = "specon.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "Migration"
PLURAL = "migrations"
MARK_SHARD = "mark-shard"  # the marks ConfigMaps' specon.io/record
# Fixed: a job's mark is always in the same shard (marks() reads every shard whatever the count).
MARK_SHARDS = 64

# Where each field of ``Migration`` (its codec key) lives in the resource: one definition, both
# ways; tests/unit/manager/test_crd_journal.py checks it names every field.
PLACES: dict[str, tuple[str, str]] = {
    "id": ("spec", "id"),
    "container": ("spec", "job"),
    "source": ("spec", "from"),
    "target": ("spec", "to"),
    "reason": ("spec", "reason"),
    "decided_at": ("spec", "decidedAt"),
    "state": ("status", "state"),
    "updated_at": ("status", "updatedAt"),
    "checkpoint": ("status", "checkpoint"),
    "checkpoint_step": ("status", "checkpointStep"),
    "stopped_at": ("status", "stoppedAt"),
    "started_at": ("status", "startedAt"),
    "error": ("status", "error"),
    "attempts": ("status", "attempts"),
    "spec": ("status", "jobSpec"),
    "lost_steps": ("status", "lostSteps"),
}
_FIELDS = frozenset(codec.wire_key(f) for f in fields(Migration))


def sections(m: Migration) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``spec`` and ``status`` of ``m``'s resource (unset fields left out)."""
    out: dict[str, dict[str, Any]] = {"spec": {}, "status": {}}
    for key, value in codec.to_data(m, Migration).items():
        if value is not None:
            section, name = PLACES[key]
            out[section][name] = value
    if m.downtime is not None:
        out["status"]["downtime"] = round(m.downtime, 3)
    return out["spec"], out["status"]


def from_resource(obj: dict[str, Any]) -> Migration:
    """The ``Migration`` a resource holds; ``ValueError`` naming every bad field. One with no
    status yet (its writer stopped between the two writes) is as it was decided."""
    data: dict[str, Any] = {}
    for key, (section, name) in PLACES.items():
        value = (obj.get(section) or {}).get(name)
        if value is not None:
            data[key] = value
    if "state" not in data:
        data.update(state=State.DECIDED.value, updated_at=data.get("decided_at", 0.0))
    try:
        return codec.from_data(Migration, data, strict=False)
    except codec.SchemaError as exc:
        raise ValueError(codec.explain(exc)) from None


def shard_of(container: str, shards: int = MARK_SHARDS) -> int:
    """The shard of a job's mark: stable across processes and releases (not ``hash``)."""
    return int(hashlib.sha256(container.encode()).hexdigest()[:8], 16) % shards


class CrdJournal:
    """Migrations as ``Migration`` resources, marks in shards, meta in a ConfigMap (module doc)."""

    def __init__(
        self, api: KubeApi | Any, namespace: str, *, prefix: str = "specon", mirror_pods: bool = True
    ) -> None:
        # The ConfigMap journal's plumbing: the meta ConfigMap, the marks' read-modify-write,
        # the pod mirror, and the records a manager upgraded from it carries over.
        self.configmaps = KubeJournal(api, namespace, prefix=prefix, mirror_pods=mirror_pods)
        self.api = self.configmaps.api
        self.namespace = namespace
        self.prefix = prefix
        self.path = f"{PLURAL}.{GROUP}/{namespace}"  # for logs, like Journal.path
        self._base = f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"
        self._labels = {"app.kubernetes.io/managed-by": "specon"}
        self.carried = Carried()  # the last carry-over from the ConfigMap journal
        self._batch = threading.local()  # .marks: the marks a transaction holds back, or None

    @property
    def conflicts(self) -> int:
        """409s retried: concurrent writers (another manager?)."""
        return self.configmaps.conflicts

    def close(self) -> None:
        """Nothing to release: every write is committed when it returns."""

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Consecutive marks put inside are written together, one write per shard they touch
        (a manager meeting 10,000 new jobs writes 64 objects, not 10,000 read-modify-writes);
        a migration or meta write, and the end, write the marks held before it, so the
        writes reach the API in the order they were made. Not atomic: a failure inside
        drops the marks held back (the shell retries the whole batch; every write is
        idempotent)."""
        if getattr(self._batch, "marks", None) is not None:  # nested: the outer one writes
            yield
            return
        self._batch.marks = {}
        try:
            yield
            self._write_held()
        finally:
            self._batch.marks = None

    def _write_held(self) -> None:
        held: dict[ContainerId, Mark] | None = getattr(self._batch, "marks", None)
        if held:
            marks = list(held.values())
            held.clear()
            self.put_marks(marks)
            if self.configmaps.mirror_pods:
                for mk in marks:
                    self.configmaps.mirror(mk)

    # -- migrations -------------------------------------------------------------------
    def migration_name(self, migration_id: str) -> str:
        return f"{self.prefix}-{name_part(migration_id)}"

    def put(self, m: Migration) -> None:
        """Insert or replace one migration (committed when this returns)."""
        self._write_held()
        name = self.migration_name(m.id)
        spec, status = sections(m)
        labels = {**self._labels, RECORD: "migration", IN_FLIGHT: str(m.in_flight).lower()}
        if m.container and LABEL_VALUE.fullmatch(m.container):
            labels[LABEL_JOB] = m.container
        self.configmaps.retry_conflicts(f"{PLURAL}/{name}", lambda: self._write(name, spec, status, labels))

    def _write(self, name: str, spec: dict[str, Any], status: dict[str, Any], labels: dict[str, str]) -> None:
        """One pass of ``put``; ``KubeError`` 409 when someone wrote in between."""
        cur = self._get(name)
        if cur is None:
            new = {"name": name, "namespace": self.namespace, "labels": {**labels, IN_FLIGHT: "true"}}
            body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": new, "spec": spec}
            cur = self.api.request("POST", self._base, body=body)
        elif cur.get("spec") != spec:
            cur = self.api.request("PUT", f"{self._base}/{name}", body={**cur, "spec": spec})
        if cur.get("status") != status:
            cur = self.api.request("PUT", f"{self._base}/{name}/status", body={**cur, "status": status})
        have = meta(cur).get("labels") or {}
        if {**have, **labels} != have:
            body = {**cur, "metadata": {**meta(cur), "labels": {**have, **labels}}}
            self.api.request("PUT", f"{self._base}/{name}", body=body)

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api.request("GET", f"{self._base}/{name}")  # type: ignore[no-any-return]
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise JournalError(f"read {PLURAL}/{name}: {exc}") from exc

    def get(self, migration_id: str) -> Migration | None:
        obj = self._get(self.migration_name(migration_id))
        return None if obj is None else self._migration(obj)

    def in_flight(self) -> list[Migration]:
        """The open migrations; first, what a ConfigMap journal left here is carried over (a
        manager reads them when it recovers, so the leader does before it acts)."""
        self.carried = carry_over(self.configmaps, self.put, self.put_marks)
        found = self._migrations(f"{RECORD}=migration,{IN_FLIGHT}=true")
        return sorted((m for m in found if m.in_flight), key=lambda m: (m.decided_at, m.id))

    def all(self) -> list[Migration]:
        return sorted(self._migrations(f"{RECORD}=migration"), key=lambda m: (m.decided_at, m.id))

    def forget(self, now: float, older_than: float, keep_newest: int) -> int:
        """Delete the ended migrations last updated more than ``older_than`` seconds before
        ``now`` (``retention.prunable``), except the ``keep_newest`` newest; how many went. By
        their state, not their label (a writer stopped before relabelling one); one that is
        gone already counts as deleted."""
        ended = (m for m in self._migrations(f"{RECORD}=migration") if not m.in_flight)
        ids = prunable(((m.id, m.updated_at) for m in ended), now, older_than, keep_newest)
        for i in ids:
            try:
                self.api.request("DELETE", f"{self._base}/{self.migration_name(i)}")
            except KubeError as exc:
                if exc.status != 404:
                    raise JournalError(f"delete {PLURAL}/{self.migration_name(i)}: {exc}") from exc
        return len(ids)

    def _migrations(self, selector: str) -> list[Migration]:
        try:
            data = self.api.request("GET", self._base, query={"labelSelector": selector})
        except KubeError as exc:
            if exc.status == 404:  # the group/version is not served
                raise JournalError(
                    f"list {PLURAL}: the Migration CRD ({PLURAL}.{GROUP}) is not installed: "
                    "kubectl apply -k manifests/ installs it"
                ) from exc
            raise JournalError(f"list {PLURAL}: {exc}") from exc
        mine = (o for o in data.get("items") or [] if str(meta(o).get("name")).startswith(f"{self.prefix}-"))
        found = (self._migration(o) for o in mine)
        return [m for m in found if m is not None]

    @staticmethod
    def _migration(obj: dict[str, Any]) -> Migration | None:
        try:
            return from_resource(obj)
        except (ValueError, TypeError) as exc:
            log.warning("specon.journal.record_skipped", migration=meta(obj).get("name"), error=str(exc))
            return None

    # -- marks --------------------------------------------------------------------------
    def shard_name(self, container: str) -> str:
        return f"{self.prefix}-marks-{shard_of(container):02d}"

    def put_mark(self, mark: Mark) -> None:
        """Set one job's mark (a key of its shard; the shard's other keys are kept); inside a
        ``transaction``, held back until the next other write or its end."""
        held: dict[ContainerId, Mark] | None = getattr(self._batch, "marks", None)
        if held is not None:
            held[mark.container] = mark
            return
        self.put_marks([mark])
        if self.configmaps.mirror_pods:
            self.configmaps.mirror(mark)

    def put_marks(self, marks: list[Mark]) -> None:
        """Set many jobs' marks, one write per shard they touch (the carry-over's batch)."""
        by_shard: dict[str, dict[str, str]] = {}
        for mk in marks:
            key = self.configmaps.key(mk.container)
            by_shard.setdefault(self.shard_name(mk.container), {})[key] = encode_mark(mk)
        labels = {**self._labels, RECORD: MARK_SHARD}
        for name, entries in by_shard.items():

            def update(old: dict[str, str], new: dict[str, str] = entries) -> dict[str, str]:
                return {**old, **new}

            self.configmaps.upsert(name, update, labels)

    def marks(self) -> dict[ContainerId, Mark]:
        try:
            data = self.api.request(
                "GET",
                f"/api/v1/namespaces/{self.namespace}/configmaps",
                query={"labelSelector": f"{RECORD}={MARK_SHARD}"},
            )
        except KubeError as exc:
            raise JournalError(f"list the marks: {exc}") from exc
        out: dict[ContainerId, Mark] = {}
        for cm in data.get("items") or []:
            if str(meta(cm).get("name", "")).startswith(f"{self.prefix}-marks-"):
                for key, value in (cm.get("data") or {}).items():
                    out[ContainerId(key)] = decode_mark(key, str(value))
        return out

    # -- meta -----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        return self.configmaps.get_meta(key)

    def set_meta(self, key: str, value: str) -> None:
        self._write_held()
        self.configmaps.set_meta(key, value)
