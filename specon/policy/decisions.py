"""What Algorithms 2 and 3 decide: typed, frozen results instead of side effects.

The manager turns these into journal entries and runtime commands; the policies only
return them. A refusal is a value, not an exception, so a caller can count and report it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from specon.model import ContainerId, WorkerId

# Worker -> score, read-only. The paper's Fig. 9 explains a decision by these numbers.
Scores = Mapping[WorkerId, float]
NO_SCORES: Scores = MappingProxyType({})

MoveReason = Literal["converged", "rebalance"]


class RefusalReason(enum.StrEnum):
    """Why Algorithm 2 made no decision for a request."""

    UNKNOWN_CONTAINER = "unknown_container"
    # The container's worker is not in the snapshot, so there is nothing to save it from.
    UNKNOWN_SOURCE = "unknown_source"
    MIGRATION_LIMIT = "migration_limit"
    # Not even the source is ready, reachable and able to keep the container.
    NO_CANDIDATE = "no_candidate"


@dataclass(frozen=True, slots=True)
class Stay:
    """The source is among the best-scored workers: keep the container where it is."""

    container: ContainerId
    worker: WorkerId
    # hash=False: a mapping is not hashable, but decisions still compare by value.
    scores: Scores = field(default_factory=lambda: NO_SCORES, hash=False)


@dataclass(frozen=True, slots=True)
class Move:
    """Save the container on ``source`` and restore it on ``target``."""

    container: ContainerId
    source: WorkerId
    target: WorkerId
    reason: MoveReason = "converged"
    scores: Scores = field(default_factory=lambda: NO_SCORES, hash=False)


@dataclass(frozen=True, slots=True)
class Refuse:
    """No decision; ``detail`` says why in words for logs and the CLI."""

    container: ContainerId
    reason: RefusalReason
    detail: str = ""


PlacementDecision = Stay | Move | Refuse
