"""How a decided move is carried out: for real, or recorded only (dry-run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from specon.policy.decisions import Move

if TYPE_CHECKING:
    from specon.coordinator import Coordinator


class Executor(Protocol):
    def begin(self, coord: Coordinator, move: Move, now: float) -> None: ...


class LiveExecutor:
    """Open a journaled migration: save on the source, start on the target."""

    def begin(self, coord: Coordinator, move: Move, now: float) -> None:
        coord.open_migration(move, now)


class DryRunExecutor:
    """Journal the decision as a migration that never touched anything."""

    def begin(self, coord: Coordinator, move: Move, now: float) -> None:
        coord.record_dry_run(move, now)
