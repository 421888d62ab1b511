"""A manager upgraded from the ConfigMap journal (``specon_manager.k8s_journal``) carries it
over to the ``Migration`` journal (``specon_manager.k8s_crd_journal``) when it reads the journal.

Every migration ConfigMap (in flight or ended: the ended ones go by the retention rule at the
next pruning, as they would have) is written as a ``Migration`` and every mark into its shard,
then the ConfigMap is deleted on the ``resourceVersion`` read, so one an older manager wrote
meanwhile stays for the next read. Idempotent: a manager killed midway finds the ConfigMaps it
had not deleted and writes the same records again (an unchanged record is not rewritten). A
ConfigMap that does not decode is logged and left, never deleted. The meta ConfigMap is the
new journal's as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from specon.coordinator.migration import Mark, Migration
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.pods import meta
from specon_manager.k8s_journal import RECORD, JournalError, KubeJournal, decode_mark

log = structlog.get_logger()


@dataclass(frozen=True, slots=True)
class Carried:
    """What one carry-over wrote: migrations (of them in flight) and marks."""

    migrations: int = 0
    in_flight: int = 0
    marks: int = 0


def carry_over(
    legacy: KubeJournal, put: Callable[[Migration], None], put_marks: Callable[[list[Mark]], None]
) -> Carried:
    """Write what ``legacy`` holds through ``put`` and ``put_marks``, deleting each ConfigMap
    written; ``JournalError`` if the API fails (nothing is deleted before it is written)."""
    base = f"/api/v1/namespaces/{legacy.namespace}/configmaps"
    try:
        found = legacy.api.request("GET", base, query={"labelSelector": f"{RECORD}=migration"})
    except KubeError as exc:
        raise JournalError(f"list the ConfigMap journal: {exc}") from exc
    moved = in_flight = 0
    for cm in found.get("items") or []:
        name = str(meta(cm).get("name"))
        if not name.startswith(f"{legacy.prefix}-migration-"):
            continue
        m = legacy.migration_of(cm)
        if m is None:
            continue  # logged; kept for whoever can read it
        put(m)
        _delete(legacy, base, cm)
        moved += 1
        in_flight += m.in_flight
    marks = 0
    cm = legacy.read(f"{legacy.prefix}-marks")
    if cm is not None:
        entries = [decode_mark(str(k), str(v)) for k, v in (cm.get("data") or {}).items()]
        put_marks(entries)
        _delete(legacy, base, cm)
        marks = len(entries)
    done = Carried(moved, in_flight, marks)
    if done != Carried():
        log.info("specon.journal.carried_over", migrations=moved, in_flight=in_flight, marks=marks)
    return done


def _delete(legacy: KubeJournal, base: str, cm: dict[str, Any]) -> None:
    """Delete ``cm`` if it is still as read; one changed since (409) or gone (404) is left."""
    name, version = meta(cm).get("name"), meta(cm).get("resourceVersion")
    options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": version}}
    try:
        legacy.api.request("DELETE", f"{base}/{name}", body=options)
    except KubeError as exc:
        if exc.status == 409:
            log.info("specon.journal.carry_over_again", configmap=name)  # written meanwhile
        elif exc.status != 404:
            raise JournalError(f"delete {name}: {exc}") from exc
