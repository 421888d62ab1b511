"""Forgetting what has not been seen for a while: one rule for the manager and the agent.

The manager forgets workers and containers unseen for ``prune_after`` worker timeouts
(``specon.coordinator.state``), and its journal forgets ended migrations older than
``SPECON_MANAGER_JOURNAL_RETENTION`` (``prunable``), keeping the newest the status shows; the
agent forgets the saved classifier state of containers
gone from its worker for ``SPECON_AGENT_STATE_RETENTION`` seconds (``specon_agent.core``). Both
keep what something still in flight names.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import TypeVar

K = TypeVar("K")


def expired(
    last_seen: Mapping[K, float], now: float, older_than: float, keep: Container[object] = ()
) -> list[K]:
    """The keys last seen more than ``older_than`` seconds before ``now``, except ``keep``."""
    cut = now - older_than
    return [k for k, seen in last_seen.items() if seen < cut and k not in keep]


def prunable(
    ended: Iterable[tuple[str, float]], now: float, older_than: float, keep_newest: int
) -> list[str]:
    """Of ended records ``(id, last update)``, the ids to forget: older than ``older_than``
    seconds, except the ``keep_newest`` newest (which a restarted manager shows)."""
    last = dict(ended)
    newest = sorted(last, key=lambda k: (last[k], k))[-keep_newest:] if keep_newest > 0 else []
    return expired(last, now, older_than, keep=set(newest))
