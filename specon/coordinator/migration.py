"""The save/restore migration as a pure, journaled state machine (SPEC §6).

``decided → saving → saved → restoring → running → done``, and from any step before
``done``: ``failed → rolled_back`` (restart on the source from the checkpoint). A recovery
(``RECOVERIES``: a job that runs nowhere, ``specon.coordinator.reconcile``) begins at
``saved`` and ends ``rolled_back`` at once if it fails.

The manager writes each state to its journal *before* acting on it (write-ahead), then
asks ``next_step`` what to do. ``next_step`` looks only at the journaled record and at
where heartbeats currently see the container running, so the same function drives a
migration forward in normal operation and resumes or rolls back every migration that
was in flight when a manager restarts. It never issues a start while the container is
seen running anywhere else (a job never runs twice; a start repeated where the copy runs
is answered by that copy), never gives up on a container that is running nowhere (a job
is never left without a running copy), and counts a restore done only once its start's
result says the copy runs.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from specon.model import ContainerId, WorkerId
from specon.policy.move_costs import MoveCosts, Observation, backend_of, bucket_name, size_bucket

if TYPE_CHECKING:  # state.py imports this module
    from specon.coordinator.state import ClusterState
    from specon.wire.protocol import CommandResult

Reason = Literal["converged", "rebalance", "recovered", "crashed", "evacuated"]
# A recovery restores a job that runs nowhere (``specon.coordinator.reconcile``): it begins at
# ``saved`` (nothing to save: the newest complete checkpoint is the restore point) and, if
# its start fails, ends ``rolled_back`` at once: there is no source to go back to, and the
# reconciler tries again while the job runs nowhere.
RECOVERIES: frozenset[Reason] = frozenset({"recovered", "crashed"})


class State(enum.StrEnum):
    DECIDED = "decided"
    SAVING = "saving"
    SAVED = "saved"
    RESTORING = "restoring"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"

    @property
    def terminal(self) -> bool:
        return self in (State.DONE, State.ROLLED_BACK)


_NEXT: dict[State, frozenset[State]] = {
    State.DECIDED: frozenset({State.SAVING, State.FAILED}),
    State.SAVING: frozenset({State.SAVED, State.FAILED}),
    State.SAVED: frozenset({State.RESTORING, State.FAILED}),
    State.RESTORING: frozenset({State.RUNNING, State.FAILED}),
    State.RUNNING: frozenset({State.DONE}),
    State.FAILED: frozenset({State.ROLLED_BACK}),
    State.DONE: frozenset(),
    State.ROLLED_BACK: frozenset(),
}


class TransitionError(ValueError):
    """An illegal state change: a bug or a corrupt journal, never silently applied."""


@dataclass(frozen=True, slots=True)
class Migration:
    id: str
    container: ContainerId
    source: WorkerId
    target: WorkerId
    reason: Reason
    state: State = State.DECIDED
    decided_at: float = 0.0
    updated_at: float = 0.0
    # Set when the save finished: the verified checkpoint the target restores from
    # (None: the job never checkpointed and restarts from its beginning).
    checkpoint: str | None = None
    checkpoint_step: int | None = None
    # When the job stopped on the source / started on the target, for downtime.
    stopped_at: float | None = None
    started_at: float | None = None
    error: str | None = None
    attempts: int = 0
    # The runtime's job spec (JSON) from the save result, so a restarted manager can
    # still tell the target what to start.
    spec: str | None = None
    # Steps the job had trained past the checkpoint it moved with (a save cut short by a
    # drain's deadline rolls back to the newest complete checkpoint); None: not known.
    lost_steps: int | None = None

    @property
    def downtime(self) -> float | None:
        if self.stopped_at is None or self.started_at is None:
            return None
        return max(0.0, self.started_at - self.stopped_at)

    @property
    def in_flight(self) -> bool:
        return not self.state.terminal

    def to(self, state: State, *, at: float, **changes: object) -> Migration:
        """The record in ``state``; raises ``TransitionError`` for an illegal step."""
        if state not in _NEXT[self.state]:
            raise TransitionError(f"migration {self.id}: {self.state.value} -> {state.value} is not allowed")
        return replace(self, state=state, updated_at=at, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Mark:
    """A container's manager-side record: Algorithm 2 decided for it (``migrated_at``, how
    often), Algorithm 3 moved it (how often), and where it runs for the reconciler. Every
    journal backend returns these."""

    container: ContainerId
    migrated_at: float | None = None
    migrations: int = 0
    rebalances: int = 0
    # What the reconciler needs across a manager restart: the worker it last ran on, whether
    # it finished, and how often a copy that ended unfinished was restarted.
    home: WorkerId | None = None
    finished: bool = False
    restarts: int = 0


@dataclass(frozen=True, slots=True)
class Cordon:
    """A worker being drained: it takes no new jobs, and its jobs move off (``evacuated``),
    each saved before ``deadline`` (manager clock; None: as long as a save takes).
    ``taint``: the taint key that put it (``specon.coordinator.evacuation``), lifted with the
    taint; None: an operator's drain, lifted only by ``uncordon``."""

    worker: WorkerId
    since: float
    deadline: float | None = None
    taint: str | None = None


# What the coordinator should do next for one migration.
@dataclass(frozen=True, slots=True)
class IssueSave:
    worker: WorkerId


@dataclass(frozen=True, slots=True)
class IssueStart:
    worker: WorkerId
    checkpoint: str | None
    rollback: bool


@dataclass(frozen=True, slots=True)
class Advance:
    """The facts already show the next state; journal it and ask again."""

    state: State


@dataclass(frozen=True, slots=True)
class Wait:
    why: str


Step = IssueSave | IssueStart | Advance | Wait


def next_step(
    m: Migration,
    *,
    running_on: WorkerId | None,
    finished: bool,
    alive: frozenset[WorkerId],
    saving: bool = False,
    cordoned: Collection[WorkerId] = (),
    refused: int = 0,
) -> Step:
    """Decide the next action for ``m`` from its journaled state and the heartbeat facts.

    ``running_on`` is the worker whose latest heartbeat lists the container as running
    (None: no agent reports it running); ``finished`` says the job has completed its
    work (nothing left to move); ``alive`` are the workers with a fresh heartbeat;
    ``saving`` says a save of ``m`` reached its source and may still be under way (no
    result yet, and not older than a save can last); ``cordoned``: workers being drained,
    where a rollback goes only if no other of its two workers can take it; ``refused``: the
    rollback starts refused so far (``rollback_home``).
    Saves and starts are idempotent per migration on the agent, so repeating one after
    a lost message or a manager restart is always safe.
    """
    s = m.state
    if s.terminal:
        return Wait("terminal")
    if finished:
        return Advance(
            State.DONE if s is State.RUNNING else State.FAILED if s is not State.FAILED else State.ROLLED_BACK
        )
    if s is State.DECIDED:
        if running_on != m.source or m.target not in alive:
            # The container moved or vanished since the decision, or the target went
            # away: nothing was touched yet, so abandoning is safe.
            return Advance(State.FAILED)
        return Advance(State.SAVING)
    if s is State.SAVING:
        if (running_on is not None and running_on != m.source) or m.source not in alive:
            # Running elsewhere (someone else moved it), or the source went silent: roll
            # back; the runtime refuses the restart while a copy still runs anywhere.
            return Advance(State.FAILED)
        # Still running on the source (save not delivered or under way), or stopped but
        # the result (with the checkpoint) was lost: repeating the save gets the result.
        return IssueSave(m.source)
    if s is State.SAVED:
        if running_on is not None or m.target not in alive:
            return Advance(State.FAILED)
        return Advance(State.RESTORING)
    if s is State.RESTORING:
        if running_on not in (None, m.target) or m.target not in alive:
            return Advance(State.FAILED)
        # Listed on the target is not yet running: a copy may die before its first record
        # (a crash on restore, a kubelet's refusal). Only the start's result says it runs;
        # repeated, the start is answered by the copy already there.
        return IssueStart(m.target, m.checkpoint, rollback=False)
    if s is State.RUNNING:
        return Advance(State.DONE)
    # FAILED: make sure the job runs somewhere, preferring its source.
    if m.reason in RECOVERIES:
        return Advance(State.ROLLED_BACK)
    if running_on is not None:
        if saving and running_on == m.source:
            # A job is listed running while it saves: ended now, the save that then stops it
            # would leave it running nowhere. Its result restarts it from the checkpoint.
            return Wait("its save may still stop it")
        return Advance(State.ROLLED_BACK)
    home = rollback_home(m, alive, cordoned, refused)
    if home is None:
        return Wait("no live worker to restart on")
    return IssueStart(home, m.checkpoint, rollback=True)


def heading(
    m: Migration, alive: Collection[WorkerId], cordoned: Collection[WorkerId], refused: int = 0
) -> WorkerId | None:
    """Where the job of ``m`` is to run next: the target until the move failed, then the
    rollback's home (None: ended, or nowhere to go). A controller's replacement pod for the
    job is steered there (``specon.runtime.kubernetes.admission``)."""
    if m.state.terminal or m.state is State.DECIDED:  # decided: nothing was stopped yet
        return None
    if m.state is State.FAILED:
        return rollback_home(m, alive, cordoned, refused)
    return m.target


def rollback_home(
    m: Migration, alive: Collection[WorkerId], cordoned: Collection[WorkerId], refused: int = 0
) -> WorkerId | None:
    """Where a failed move restarts its job: its source, else its target, a cordoned one only
    when the other cannot take it (a drain moves it off again); each refused restart tries
    the next of them, so one worker refusing for good (its capacity taken, a kubelet's
    refusal) leaves the job running on the other, not nowhere."""
    order = [w for w in (m.source, m.target) if w in alive and w not in cordoned]
    order += [w for w in (m.source, m.target) if w in alive and w in cordoned]
    homes = list(dict.fromkeys(order))
    return homes[refused % len(homes)] if homes else None


# The journal's reason for a migration whose job completed while it was being moved.
FINISHED_DURING = "job finished during the migration"


def why_failed(m: Migration, running_on: WorkerId | None, finished: bool) -> str:
    """The journal's reason for a migration the facts turned to ``failed``."""
    if finished:
        return FINISHED_DURING
    if running_on is not None and running_on not in (m.source, m.target):
        return f"container seen running on {running_on}"
    return f"gave up in state {m.state.value} (worker unreachable or container moved)"


def save_lost_steps(res: CommandResult) -> int | None:
    """The steps a save lost: those its job trained past the checkpoint it resumes from
    (``last_step``, the agent's read of the job's log; no checkpoint: from step 0). A save
    the job completed itself (not SIGKILLed, a checkpoint newer than the request) lost none
    by the job contract, also where the log said no step (None: unknown otherwise)."""
    last = res.detail.get("last_step")
    if isinstance(last, int) and not isinstance(last, bool):
        return max(0, last - (res.checkpoint_step or 0))
    fresh = res.checkpoint is not None and not res.detail.get("forced") and not res.detail.get("rolled_back")
    return 0 if fresh else None


def learn_cost(costs: MoveCosts, m: Migration, state: ClusterState) -> dict[str, object] | None:
    """Feed a finished move's measured cost to ``costs``; the fields of its log line (None:
    nothing learned). The downtime runs from the SIGTERM on the source (the save result's
    ``began_at``) to the first record on the target (the start result's time), both on the
    manager clock; the move is keyed by the target's backend and the job's declared memory."""
    if m.state is not State.DONE or m.downtime is None or m.reason in RECOVERIES:
        return None  # a recovery's downtime is the time to notice a loss, not a move's cost
    w, c = state.workers.get(m.target), state.containers.get(m.container)
    memory = c.report.requests.memory if c is not None else 0
    obs = Observation(backend_of(w.labels if w is not None else {}), size_bucket(memory), downtime=m.downtime)
    est = costs.observe(obs)
    if est is None:
        return None
    return {
        "migration": m.id,
        "backend": obs.backend,
        "size": bucket_name(obs.bucket),
        "downtime": round(m.downtime, 3),
        "learned_downtime": round(est.downtime, 3),
        "learned_restore_cpu": round(est.restore_cpu, 3),
        "moves": est.moves,
    }
