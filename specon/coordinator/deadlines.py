"""How long a migration may take: the deadlines on its states, when it stops holding the
budget, and when a silent side's copy is given up (pure rules; the coordinator acts on them)."""

from __future__ import annotations

from collections.abc import Callable

from specon.config import MigrationConfig, Policy
from specon.coordinator.migration import Migration, State
from specon.coordinator.reconcile import lost_after
from specon.model import WorkerId


def deadline_passed(m: Migration, spent: float, cfg: MigrationConfig) -> str | None:
    """Why ``m`` must roll back after ``spent`` seconds in its state; None within its deadline
    (only a save and a start have one: every other state is left within one pass)."""
    limit = {State.SAVING: cfg.save_timeout, State.RESTORING: cfg.restore_timeout}.get(m.state)
    if limit is None or spent <= limit:
        return None
    return f"deadline: {m.state.value} for {spent:.0f} s (limit {limit:g} s)"


def parked(m: Migration, silent: float, policy: Policy) -> str | None:
    """The journal note for a failed migration whose source and target have both been silent
    for ``silent`` seconds, once that is ``park_after`` worker timeouts; else None."""
    limit = policy.migration.park_after * policy.messaging.worker_timeout
    if m.state is not State.FAILED or silent < limit:
        return None
    return f"parked: {m.source} and {m.target} silent for {min(silent, 1e9):.0f} s (budget released)"


def save_may_stop(since: float | None, now: float, policy: Policy) -> bool:
    """Whether a save awaited ``since`` then (None: none is) may still stop its job: a save
    ends within its grace (the job is then killed and rolled back to its newest checkpoint),
    and its result rides a heartbeat within a worker timeout."""
    limit = policy.migration.grace_period + policy.messaging.worker_timeout
    return since is not None and now - since <= limit


def retry_due(refusals: int, waited: float, policy: Policy) -> bool:
    """After ``refusals`` refused restarts, whether ``waited`` seconds are enough for the next:
    heartbeat_interval * 2^(n-1), at most worker_timeout."""
    if refusals == 0:
        return True
    msg = policy.messaging
    return waited >= min(msg.worker_timeout, msg.heartbeat_interval * float(2 ** min(refusals - 1, 16)))


def fenced_side(
    m: Migration, worker: WorkerId, *, rollback: bool, silent_for: Callable[[WorkerId], float], policy: Policy
) -> WorkerId | None:
    """The side of ``m`` whose copy a start on ``worker`` supersedes (SPEC §6.5), or None.

    A forward start (a recovery's too) fences a source silent past ``worker_timeout``: its
    save stopped the job, or its host is lost. A rollback onto the source fences a target
    silent that long (its start may have run). A rollback onto the target fences the source
    only once the source is *lost* (silent past ``recovery.after``, as a recovery would):
    before that its agent may be dead while the job runs on, and the refused start is retried.
    """
    if not rollback:
        other, limit = m.source, policy.messaging.worker_timeout
    elif worker == m.target:
        other, limit = m.source, lost_after(policy)
    else:
        other, limit = m.target, policy.messaging.worker_timeout
    return other if other != worker and silent_for(other) >= limit else None
