"""The ConfigMap journal: the manager's write-ahead journal in the Kubernetes API before the
``Migration`` resource (``specon_manager.k8s_crd_journal``, today's ``--journal kubernetes``).
A manager upgraded from it reads it once and carries it over
(``specon_manager.k8s_journal_upgrade``); its helpers (the mark encoding, the ConfigMap
read-modify-write, the meta ConfigMap) are the new journal's too.

Same methods as ``specon_manager.journal.Journal`` (``put``, ``get``, ``in_flight``, ``all``,
``forget``, ``put_mark``, ``marks``, ``get_meta``, ``set_meta``, ``close``). Where the records live, in the
manager's namespace:

* one ConfigMap per migration, ``<prefix>-migration-<id>``, data ``migration.json`` (the
  ``Migration`` through ``specon.wire.codec``, keys sorted); labels
  ``specon.io/record=migration`` and ``specon.io/in-flight=true|false`` let ``in_flight`` list
  only the open ones.
* ``<prefix>-marks``: one data key per container, its ``Mark`` through the codec less the
  container (``{"migrated_at", "migrations", "rebalances"}``); ``<prefix>-meta``: one data key
  per meta key.

Writes are durable when the API server answers (etcd has committed them). Every update is a
PUT carrying the ``resourceVersion`` last read: a concurrent writer makes it fail with 409,
and the read-modify-write is redone on fresh data (optimistic concurrency). ``put_mark`` also
mirrors the marks onto the job's live pods as annotations (``specon.io/migrations``,
``specon.io/rebalances``, ``specon.io/migrated-at``), best effort, for ``kubectl`` users.

Calls block (like SQLite's fsync in the file journal); the manager makes them in a thread,
off its event loop (``specon_manager.shell``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import structlog
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from specon.coordinator.migration import Mark, Migration
from specon.coordinator.retention import prunable
from specon.model import ContainerId
from specon.runtime.kubernetes.api import MERGE_PATCH, KubeApi, KubeError, pods_path
from specon.runtime.kubernetes.pods import LABEL_JOB, meta
from specon.wire import codec
from specon.wire.validate import LABEL_VALUE

log = structlog.get_logger()

RECORD = "specon.io/record"
IN_FLIGHT = "specon.io/in-flight"
ANN_MIGRATIONS = "specon.io/migrations"
ANN_REBALANCES = "specon.io/rebalances"
ANN_MIGRATED_AT = "specon.io/migrated-at"
_DATA_KEY = "migration.json"
_ATTEMPTS = 8
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_MARK_KEY = "container"  # the Mark's field that names its data key, so not in its value


class JournalError(RuntimeError):
    """The API refused or could not be reached; the journal write did not happen."""


def name_part(text: str) -> str:
    """``text`` as a DNS-1123 label part; a hash suffix keeps distinct ids distinct."""
    clean = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40]
    if clean == text:
        return clean
    return f"{clean}-{hashlib.sha256(text.encode()).hexdigest()[:8]}".strip("-")


# Fields added to ``Migration`` since its first release: left out while unset, so an older
# manager's records are written back as they were.
_MIGRATION_ADDED = ("lost_steps",)


def _encode(m: Migration) -> str:
    data = codec.to_data(m, Migration)
    for key in _MIGRATION_ADDED:
        if data.get(key) is None:
            data.pop(key, None)
    return json.dumps(data, sort_keys=True)


def _decode(text: str) -> Migration:
    """``SchemaError`` (a ``ValueError``) naming every bad field; keys it does not know (a
    newer manager's) are ignored."""
    return codec.from_data(Migration, json.loads(text), strict=False)


# Fields added to ``Mark`` since its first release: left out at their defaults, so an
# older manager's entries are written back as they were.
_MARK_ADDED = {"home": None, "finished": False, "restarts": 0}


def encode_mark(mark: Mark) -> str:
    data = codec.to_data(mark, Mark)
    del data[_MARK_KEY]
    for key, default in _MARK_ADDED.items():
        if data.get(key, default) == default:
            data.pop(key, None)
    return json.dumps(data, sort_keys=True)


def decode_mark(key: str, text: str) -> Mark:
    """The marks of container ``key``; a corrupt entry is logged and its bad fields (all of
    them, if it is not a JSON object) take their defaults: marks only count, never block."""
    try:
        raw = json.loads(text)
        return codec.from_data(Mark, {**raw, _MARK_KEY: key}, strict=False)
    except codec.SchemaError as exc:
        log.warning("specon.journal.mark_corrupt", container=key, error=str(exc))
        return exc.partial if exc.has_partial else Mark(ContainerId(key))
    except (ValueError, TypeError) as exc:  # not JSON, or not an object
        log.warning("specon.journal.mark_corrupt", container=key, error=str(exc))
        return Mark(ContainerId(key))


class KubeJournal:
    """Migrations, marks and meta as ConfigMaps in ``namespace`` (see the module doc)."""

    def __init__(
        self, api: KubeApi | Any, namespace: str, *, prefix: str = "specon", mirror_pods: bool = True
    ) -> None:
        self.api = api if isinstance(api, KubeApi) else KubeApi(api)
        self.namespace = namespace
        self.prefix = prefix
        self.mirror_pods = mirror_pods
        self.conflicts = 0  # 409s retried: concurrent writers (another manager?)
        self.path = f"configmaps/{namespace}"  # for logs, like Journal.path
        self._base = f"/api/v1/namespaces/{namespace}/configmaps"
        self._labels = {"app.kubernetes.io/managed-by": "specon"}

    def close(self) -> None:
        """Nothing to release: every write is committed when it returns."""

    # -- migrations -------------------------------------------------------------------
    def migration_name(self, migration_id: str) -> str:
        return f"{self.prefix}-migration-{name_part(migration_id)}"

    def put(self, m: Migration) -> None:
        """Insert or replace one migration record (committed when this returns)."""
        labels = {**self._labels, RECORD: "migration", IN_FLIGHT: str(m.in_flight).lower()}
        if m.container and LABEL_VALUE.fullmatch(m.container):
            labels[LABEL_JOB] = m.container
        data = {_DATA_KEY: _encode(m)}
        self.upsert(self.migration_name(m.id), lambda _old: data, labels)

    def get(self, migration_id: str) -> Migration | None:
        cm = self.read(self.migration_name(migration_id))
        return None if cm is None else self.migration_of(cm)

    def in_flight(self) -> list[Migration]:
        found = self._migrations(f"{RECORD}=migration,{IN_FLIGHT}=true")
        return sorted((m for m in found if m.in_flight), key=lambda m: (m.decided_at, m.id))

    def all(self) -> list[Migration]:
        return sorted(self._migrations(f"{RECORD}=migration"), key=lambda m: (m.decided_at, m.id))

    def forget(self, now: float, older_than: float, keep_newest: int) -> int:
        """Delete the ConfigMaps of ended migrations last updated more than ``older_than``
        seconds before ``now`` (``retention.prunable``), except the ``keep_newest`` newest;
        how many went. One that is gone already counts as deleted."""
        ended = self._migrations(f"{RECORD}=migration,{IN_FLIGHT}=false")
        ids = prunable(((m.id, m.updated_at) for m in ended if not m.in_flight), now, older_than, keep_newest)
        for i in ids:
            try:
                self.api.request("DELETE", f"{self._base}/{self.migration_name(i)}")
            except KubeError as exc:
                if exc.status != 404:
                    raise JournalError(f"delete {self.migration_name(i)}: {exc}") from exc
        return len(ids)

    def _migrations(self, selector: str) -> list[Migration]:
        data = self._call("GET", self._base, query={"labelSelector": selector})
        out = []
        for cm in data.get("items") or []:
            m = self.migration_of(cm)
            if m is not None:
                out.append(m)
        return out

    @staticmethod
    def migration_of(cm: dict[str, Any]) -> Migration | None:
        try:
            return _decode((cm.get("data") or {})[_DATA_KEY])
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("specon.journal.record_skipped", configmap=meta(cm).get("name"), error=str(exc))
            return None

    # -- marks --------------------------------------------------------------------------
    def put_mark(self, mark: Mark) -> None:
        """Set one container's marks (a key of the marks ConfigMap; other keys are kept:
        read-modify-write on the resourceVersion)."""
        key, value = self.key(mark.container), encode_mark(mark)

        def update(old: dict[str, str]) -> dict[str, str]:
            return {**old, key: value}

        self.upsert(f"{self.prefix}-marks", update, {**self._labels, RECORD: "marks"})
        if self.mirror_pods:
            self.mirror(mark)

    def marks(self) -> dict[ContainerId, Mark]:
        cm = self.read(f"{self.prefix}-marks")
        found = ((cm or {}).get("data") or {}).items()
        return {ContainerId(key): decode_mark(key, str(value)) for key, value in found}

    def mirror(self, mk: Mark) -> None:
        annotations = {ANN_MIGRATIONS: str(mk.migrations), ANN_REBALANCES: str(mk.rebalances)}
        if mk.migrated_at is not None:
            annotations[ANN_MIGRATED_AT] = f"{mk.migrated_at:.3f}"
        try:
            found = self.api.request(
                "GET", pods_path(None), query={"labelSelector": f"{LABEL_JOB}={mk.container}"}
            )
            for pod in found.get("items") or []:
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                m = meta(pod)
                self.api.request(
                    "PATCH",
                    f"{pods_path(str(m.get('namespace')))}/{m.get('name')}",
                    body={"metadata": {"annotations": annotations}},
                    content_type=MERGE_PATCH,
                )
        except KubeError as exc:  # display only: the ConfigMap is the record
            log.info("specon.journal.mirror_failed", container=mk.container, error=str(exc))

    # -- meta -----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        cm = self.read(f"{self.prefix}-meta")
        value = ((cm or {}).get("data") or {}).get(self.key(key))
        return None if value is None else str(value)

    def set_meta(self, key: str, value: str) -> None:
        k = self.key(key)
        self.upsert(f"{self.prefix}-meta", lambda old: {**old, k: value}, {**self._labels, RECORD: "meta"})

    # -- plumbing -------------------------------------------------------------------------
    @staticmethod
    def key(key: str) -> str:
        if not _KEY.match(key):
            raise ValueError(f"journal key {key!r}: use [-._a-zA-Z0-9]")
        return key

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            return self.api.request(method, path, **kw)
        except KubeError as exc:
            raise JournalError(f"{method} {path}: {exc}") from exc

    def read(self, name: str) -> dict[str, Any] | None:
        try:
            return self.api.request("GET", f"{self._base}/{name}")  # type: ignore[no-any-return]
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise JournalError(f"read {name}: {exc}") from exc

    def upsert(
        self, name: str, update: Callable[[dict[str, str]], dict[str, str]], labels: dict[str, str]
    ) -> None:
        """Read-modify-write one ConfigMap: PUT with the version read, create if absent,
        redo on 409 (someone wrote in between)."""
        self.retry_conflicts(name, lambda: self._write(name, update, labels))

    def retry_conflicts(self, what: str, attempt: Callable[[], None]) -> None:
        """``attempt`` (one read-modify-write), redone on 409 up to ``_ATTEMPTS`` tries, after a
        short random wait (client-go's RetryOnConflict backs off too): writers that collide and
        redo at once collide again in lockstep (seen: 8 conflicts in a row between two writers
        on a loaded machine). ``JournalError`` when it still fails."""

        def conflicted(_state: RetryCallState) -> None:
            self.conflicts += 1
            log.info("specon.journal.conflict", record=what)

        retrying = Retrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, KubeError) and exc.status == 409),
            stop=stop_after_attempt(_ATTEMPTS),
            wait=wait_random_exponential(multiplier=0.01, max=0.5),
            after=conflicted,
            reraise=True,
        )
        try:
            retrying(attempt)
        except KubeError as exc:
            if exc.status == 409:
                raise JournalError(f"write {what}: still conflicting after {_ATTEMPTS} attempts") from exc
            raise JournalError(f"write {what}: {exc}") from exc

    def _write(
        self, name: str, update: Callable[[dict[str, str]], dict[str, str]], labels: dict[str, str]
    ) -> None:
        """One read-modify-write; ``KubeError`` 409 when someone wrote in between."""
        cur = self.read(name)
        old = {str(k): str(v) for k, v in ((cur or {}).get("data") or {}).items()}
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
            "data": update(old),
        }
        if cur is None:
            self.api.request("POST", self._base, body=body)
        else:
            body["metadata"]["resourceVersion"] = meta(cur).get("resourceVersion")
            self.api.request("PUT", f"{self._base}/{name}", body=body)
