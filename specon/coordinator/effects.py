"""The coordinator's exchange with its shell: the effects of each input, in order, and
what the shell hands it at start (``Recovered``).

The coordinator (``specon.coordinator.machine``) performs no I/O. Each input returns nothing but
leaves effects behind (``Coordinator.take_effects``): journal writes, commands for
agents, metric events and log events. A shell performs them: the manager's (journal
writes in a thread, off the event loop; commands to long polls; Prometheus; structlog)
or the simulator's (an in-memory journal, simulated agents).

Write-ahead: a command is only handed to an agent once every journal write made before
it is durable. Journal writes carry a sequence number; the shell reports the highest
one it has made durable with ``Coordinator.journaled`` and the coordinator keeps newer
commands back until then.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from specon.coordinator.migration import Cordon, Mark, Migration
from specon.model import ContainerId, WorkerId
from specon.policy.quality_memory import QualityMemory
from specon.wire import codec
from specon.wire.protocol import Command


@dataclass(frozen=True, slots=True)
class Event:
    """Something the metrics and the status page count (decoupled from Prometheus here)."""

    # "decision", "decision_pass", "migration_finished", "migration_timeout", "migration_parked",
    # "request_refused", "request_deferred", "worker_forgotten", "recovery", "recovery_gave_up",
    # "recovery_waiting"
    kind: str
    labels: dict[str, str] = field(default_factory=dict)
    downtime: float | None = None
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class PutMigration:
    """Journal this migration record (an upsert by id)."""

    seq: int
    migration: Migration


@dataclass(frozen=True, slots=True)
class PutMark:
    """Journal this container's marks (absolute values: an upsert by container)."""

    seq: int
    mark: Mark


@dataclass(frozen=True, slots=True)
class PutCordons:
    """Journal the workers being drained (all of them: a whole, rarely written record)."""

    seq: int
    cordons: tuple[Cordon, ...]


@dataclass(frozen=True, slots=True)
class PutQuality:
    """Journal the cluster's quality memory (the whole of it: small, written once per finished job)."""

    seq: int
    memory: QualityMemory


def cordons_to_text(cordons: Iterable[Cordon]) -> str:
    """The journal's ``cordons`` meta value (JSON, through the codec)."""
    return json.dumps([codec.to_data(c, Cordon) for c in sorted(cordons, key=lambda c: c.worker)])


def cordons_from_text(text: str | None) -> tuple[Cordon, ...]:
    """Inverse of ``cordons_to_text``; ``ValueError`` for a value it did not write."""
    if not text:
        return ()
    raw = json.loads(text)
    if not isinstance(raw, list):
        raise ValueError("cordons: expected a list")
    return tuple(codec.from_data(Cordon, item) for item in raw)


@dataclass(frozen=True, slots=True)
class CommandQueued:
    """``command`` waits in ``worker``'s outbox (deliverable once its writes are durable)."""

    worker: WorkerId
    command: Command


@dataclass(frozen=True, slots=True)
class Log:
    """A structured log event (namespaced name, fields)."""

    event: str
    fields: dict[str, object]
    level: Literal["info", "warning"] = "info"


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a restarted manager reads back from its journal before the first input."""

    in_flight: tuple[Migration, ...] = ()
    finished: tuple[Migration, ...] = ()
    marks: tuple[Mark, ...] = ()
    # The journal was opened by a manager before: a restart into a running cluster.
    restarted: bool = False
    cordons: tuple[Cordon, ...] = ()
    quality: QualityMemory = field(default_factory=QualityMemory)


JournalWrite = PutMigration | PutMark | PutCordons | PutQuality
Effect = PutMigration | PutMark | PutCordons | PutQuality | CommandQueued | Event | Log
# The meta keys the cordons and the quality memory are journaled under.
CORDONS_KEY = "cordons"
QUALITY_KEY = "quality_memory"


class JournalWriter(Protocol):
    """The writes a journal backend takes (SQLite, Kubernetes ConfigMaps, memory)."""

    def put(self, m: Migration) -> None: ...
    def put_mark(self, mark: Mark) -> None: ...
    def set_meta(self, key: str, value: str) -> None: ...


@runtime_checkable
class Transactional(Protocol):
    """A journal that can make many writes durable together (SQLite: one commit)."""

    def transaction(self) -> AbstractContextManager[None]: ...


def write(store: JournalWriter, writes: Iterable[JournalWrite]) -> int:
    """Make ``writes`` durable in ``store``, in order (together, where it is ``Transactional``);
    the last sequence number written (0: none)."""
    writes = list(writes)
    # The cordons and the quality memory are written whole: an earlier one in the batch is
    # superseded by the last of its kind (a heartbeat may end many jobs).
    whole = {type(w): i for i, w in enumerate(writes) if isinstance(w, PutCordons | PutQuality)}
    last = 0
    with store.transaction() if isinstance(store, Transactional) else nullcontext():
        for i, w in enumerate(writes):
            if isinstance(w, PutCordons | PutQuality) and whole[type(w)] != i:
                continue
            if isinstance(w, PutMigration):
                store.put(w.migration)
            elif isinstance(w, PutMark):
                store.put_mark(w.mark)
            elif isinstance(w, PutQuality):
                store.set_meta(QUALITY_KEY, w.memory.to_text())
            else:
                store.set_meta(CORDONS_KEY, cordons_to_text(w.cordons))
            last = w.seq
    return last


class MemoryJournal:
    """A journal that lives as long as its process (the simulator's; tests)."""

    def __init__(self) -> None:
        self.migrations: dict[str, Migration] = {}
        self.marks: dict[ContainerId, Mark] = {}
        self.meta: dict[str, str] = {}

    def put(self, m: Migration) -> None:
        self.migrations[m.id] = m

    def put_mark(self, mark: Mark) -> None:
        self.marks[mark.container] = mark

    def set_meta(self, key: str, value: str) -> None:
        self.meta[key] = value

    def all(self) -> list[Migration]:
        return sorted(self.migrations.values(), key=lambda m: (m.decided_at, m.id))
