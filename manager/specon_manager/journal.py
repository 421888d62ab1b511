"""The manager's write-ahead journal: migrations and per-container marks in SQLite.

Every migration state is committed (``synchronous=FULL``: fsync'd) *before* the manager
acts on it, so a manager killed at any point restarts with every in-flight migration and
every ``migrated``/``rebalanced`` mark intact (SPEC §6). One file, one writer.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Protocol, TypeVar

from specon.coordinator.migration import Mark, Migration, State
from specon.coordinator.retention import prunable
from specon.model import ContainerId
from specon.wire import codec

R = TypeVar("R")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS migrations (
    id TEXT PRIMARY KEY,
    container TEXT NOT NULL,
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    reason TEXT NOT NULL,
    state TEXT NOT NULL,
    decided_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    checkpoint TEXT,
    checkpoint_step INTEGER,
    stopped_at REAL,
    started_at REAL,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    spec TEXT,
    lost_steps INTEGER
);
CREATE INDEX IF NOT EXISTS migrations_state ON migrations(state);
CREATE TABLE IF NOT EXISTS marks (
    container TEXT PRIMARY KEY,
    migrated_at REAL,
    migrations INTEGER NOT NULL DEFAULT 0,
    rebalances INTEGER NOT NULL DEFAULT 0,
    home TEXT,
    finished INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# Columns added since the first release, per table, added to an older file when it opens.
_ADDED = {
    "migrations": {"lost_steps": "INTEGER"},
    "marks": {
        "home": "TEXT",
        "finished": "INTEGER NOT NULL DEFAULT 0",
        "restarts": "INTEGER NOT NULL DEFAULT 0",
    },
}

# Rows are the records' own fields, converted by the one codec (``specon.wire.codec``) both
# ways: enums as their values, ids as text; nothing here names a field but the schema.
_COLUMNS = tuple(codec.wire_key(f) for f in fields(Migration))
_MARK_COLUMNS = tuple(codec.wire_key(f) for f in fields(Mark))


def migration_to_row(m: Migration) -> tuple[object, ...]:
    """The ``migrations`` row of ``m``, in ``_COLUMNS`` order."""
    data = codec.to_data(m, Migration)
    return tuple(data[c] for c in _COLUMNS)


def migration_from_row(row: Sequence[object]) -> Migration:
    """Inverse of ``migration_to_row``; ``ValueError`` naming every bad column."""
    return _decode(Migration, _COLUMNS, row)


# SQLite has no booleans: these columns hold 0 or 1.
_MARK_FLAGS = frozenset(codec.wire_key(f) for f in fields(Mark) if f.type == "bool")


def mark_from_row(row: Sequence[object]) -> Mark:
    """A ``marks`` row (``_MARK_COLUMNS``) as a ``Mark``; ``ValueError`` naming every bad column."""
    cells = [
        bool(v) if c in _MARK_FLAGS and v in (0, 1) else v for c, v in zip(_MARK_COLUMNS, row, strict=True)
    ]
    return _decode(Mark, _MARK_COLUMNS, cells)


def _decode(cls: type[R], columns: tuple[str, ...], row: Sequence[object]) -> R:
    try:
        return codec.from_data(cls, dict(zip(columns, row, strict=True)))
    except codec.SchemaError as e:
        raise ValueError(f"corrupt journal row {row[0]!r}: {codec.explain(e)}") from None


class JournalStore(Protocol):
    """What the manager needs of a journal: this SQLite one, or
    ``specon_manager.k8s_crd_journal.CrdJournal`` (``Migration`` resources in the Kubernetes API)."""

    def put(self, m: Migration) -> None: ...
    def get(self, migration_id: str) -> Migration | None: ...
    def in_flight(self) -> list[Migration]: ...
    def all(self) -> list[Migration]: ...
    def forget(self, now: float, older_than: float, keep_newest: int) -> int: ...
    def put_mark(self, mark: Mark) -> None: ...
    def marks(self) -> dict[ContainerId, Mark]: ...
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def close(self) -> None: ...


class Journal:
    """Durable store of migrations and marks. Thread-safe; every write is one transaction."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()  # a transaction holds it across its writes
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        for table, added in _ADDED.items():
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for column, decl in added.items():
                if column not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """The writes made inside are one transaction: durable together, with one fsync (the
        shell writes each flush's batch so: a manager meeting 8,000 new jobs writes their
        marks in a few commits, not 8,000)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- migrations -------------------------------------------------------------------
    def put(self, m: Migration) -> None:
        """Insert or replace one migration record (durable when this returns)."""
        row = migration_to_row(m)
        marks = ",".join("?" * len(_COLUMNS))
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO migrations ({','.join(_COLUMNS)}) VALUES ({marks})", row
            )

    def _rows(self, where: str = "", args: tuple[object, ...] = ()) -> Iterator[Migration]:
        with self._lock:
            cur = self._db.execute(f"SELECT {','.join(_COLUMNS)} FROM migrations {where}", args)
            rows = cur.fetchall()
        for row in rows:
            yield migration_from_row(row)

    def get(self, migration_id: str) -> Migration | None:
        return next(self._rows("WHERE id = ?", (migration_id,)), None)

    def in_flight(self) -> list[Migration]:
        terminal = tuple(s.value for s in State if s.terminal)
        return list(
            self._rows(f"WHERE state NOT IN ({','.join('?' * len(terminal))}) ORDER BY decided_at", terminal)
        )

    def all(self) -> list[Migration]:
        return list(self._rows("ORDER BY decided_at, id"))

    def forget(self, now: float, older_than: float, keep_newest: int) -> int:
        """Delete the ended migrations last updated more than ``older_than`` seconds before
        ``now`` (the retention rule, ``retention.prunable``), except the ``keep_newest``
        newest; how many went."""
        terminal = tuple(s.value for s in State if s.terminal)
        with self._lock:
            rows = self._db.execute(
                f"SELECT id, updated_at FROM migrations WHERE state IN ({','.join('?' * len(terminal))})",
                terminal,
            ).fetchall()
            ids = prunable(((str(i), float(t)) for i, t in rows), now, older_than, keep_newest)
            with self.transaction():
                self._db.executemany("DELETE FROM migrations WHERE id = ?", [(i,) for i in ids])
        return len(ids)

    # -- marks --------------------------------------------------------------------------
    def put_mark(self, mark: Mark) -> None:
        """Insert or replace one container's marks (durable when this returns). The
        coordinator computes them; the journal only keeps them."""
        row = tuple(codec.to_data(mark, Mark)[c] for c in _MARK_COLUMNS)
        cols, marks = ",".join(_MARK_COLUMNS), ",".join("?" * len(_MARK_COLUMNS))
        with self._lock:
            self._db.execute(f"INSERT OR REPLACE INTO marks ({cols}) VALUES ({marks})", row)

    def marks(self) -> dict[ContainerId, Mark]:
        with self._lock:
            rows = self._db.execute(f"SELECT {','.join(_MARK_COLUMNS)} FROM marks").fetchall()
        return {mark.container: mark for mark in map(mark_from_row, rows)}

    # -- meta -----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
