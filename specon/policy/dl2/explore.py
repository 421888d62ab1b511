"""How the trainer takes the learned rule's decisions in the simulator.

The rule (``specon.policy.priority.dl2``) orders a worker's jobs by the network's scores.
While an ``Explorer`` is active (``exploring``), the rule hands it the decision instead: the
trainer's explorers record what the rule saw and either answer as the teacher would
(imitation) or draw an order from the network's Plackett-Luce policy (reinforcement
learning). The daemons never set one: live, the rule is the network's greedy order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

from specon.policy.dl2.features import Matrix
from specon.policy.priority.base import JobProgress


class Explorer(Protocol):
    def decide(self, jobs: Sequence[JobProgress], x: Matrix) -> Sequence[int]:
        """The order (indices into ``jobs``, first runs first) for a worker's jobs, whose
        features are ``x``; the explorer's own network (the one being trained) decides."""
        ...


_ACTIVE: ContextVar[Explorer | None] = ContextVar("specon_dl2_explorer", default=None)


def active() -> Explorer | None:
    """The explorer in charge of the rule's decisions in this context (None: greedy)."""
    return _ACTIVE.get()


@contextmanager
def exploring(explorer: Explorer) -> Iterator[Explorer]:
    """Hand the rule's decisions to ``explorer`` within the block."""
    token = _ACTIVE.set(explorer)
    try:
        yield explorer
    finally:
        _ACTIVE.reset(token)
