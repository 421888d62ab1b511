"""The operator's messages to the manager (``specon drain``, ``specon uncordon``): plain JSON
through the codec, outside the agent protocol's envelope (``specon.wire.protocol``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specon.wire import codec
from specon.wire.status import MigrationStatus

DRAIN_PATH = "/v1/workers/{worker}/drain"
UNCORDON_PATH = "/v1/workers/{worker}/uncordon"
MAX_DEADLINE = 7 * 86_400.0


@dataclass(frozen=True, slots=True)
class DrainRequest:
    """``POST /v1/workers/{worker}/drain``: seconds from now by which each job is saved (None:
    as long as each save takes); past it a save is cut short and the job restored from its
    newest complete checkpoint."""

    deadline: float | None = None

    @classmethod
    def parse(cls, body: bytes) -> DrainRequest:
        """An empty body is no deadline; ``ValueError`` saying what is wrong."""
        if not body.strip():
            return cls()
        req = codec.loads(cls, body)
        d = req.deadline
        if d is not None and not (math.isfinite(d) and 0 < d <= MAX_DEADLINE):
            raise ValueError(f"deadline: expected seconds within (0, {MAX_DEADLINE:g}], got {d}")
        return req


@dataclass(frozen=True, slots=True)
class DrainReply:
    """A worker's drain as the manager sees it: cordoned or not, the deadline (manager clock),
    the jobs still running on it, and the moves that took its jobs off since it was cordoned."""

    worker: str
    cordoned: bool
    deadline: float | None = None
    jobs: tuple[str, ...] = ()
    moves: tuple[MigrationStatus, ...] = ()

    def to_json(self) -> bytes:
        return codec.dumps(self, DrainReply)

    @classmethod
    def from_json(cls, body: bytes) -> DrainReply:
        """``ValueError`` saying what is wrong."""
        return codec.loads(cls, body, strict=False)
