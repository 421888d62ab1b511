"""Commands for agents: how the coordinator makes them and keeps them until they ran (no I/O).

A command stays in its worker's box until a result says it ran (heartbeat replies repeat
it; each is idempotent on the agent). A save already sent for a migration that then failed is
no longer sent but still awaited: it may yet stop the job, and its result says where the
checkpoint is. Write-ahead: a command is handed out only once the
journal writes made before it are durable — each carries the number of the last write
before it (its gate), and ``durable`` is the highest write the shell reported durable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from specon.config import Policy
from specon.coordinator.migration import Migration, State
from specon.model import ContainerId, WorkerId
from specon.wire.protocol import Action, Command


def migration_command(
    m: Migration,
    action: Action,
    worker: WorkerId,
    now: float,
    policy: Policy,
    *,
    migrated: bool,
    rollback: bool = False,
) -> Command:
    """The save or start (or rollback start) of ``m`` on ``worker``."""
    kind = "rollback" if rollback else action.value
    return Command(
        # A retry after a failed result is a new command: the agent answers a repeated id
        # from its memory instead of running it again. The id is unique per step and
        # attempt; what the command means is in its fields (``rollback``), never parsed
        # back out of the id.
        id=f"{m.id}:{kind}:{worker}:{m.attempts}",
        action=action,
        container=m.container,
        deadline=now + policy.migration.grace_period + policy.messaging.worker_timeout,
        migration=m.id,
        checkpoint=m.checkpoint,
        checkpoint_step=m.checkpoint_step,
        target=m.target if action is Action.SAVE else None,
        migrated=migrated,
        # No spec: the target starts the job as it was submitted (its own runtime's
        # record), never as a save result reported it (SPEC §6, security model).
        rollback=rollback,
    )


class Commander(Protocol):
    """``Coordinator.command``: a migration's command as the coordinator sends it."""

    def __call__(
        self, m: Migration, action: Action, worker: WorkerId, now: float, *, rollback: bool = False
    ) -> Command: ...


def decided(
    box: Outbox,
    migrations: Iterable[Migration],
    worker: WorkerId,
    container: ContainerId,
    action: Action,
    *,
    command: Commander,
    now: float,
) -> Command | None:
    """The command of ``action`` for ``container`` that this manager has decided ``worker``
    carries out now: one in its box not answered yet, else the one an in-flight migration
    implies, built as the coordinator builds it (``command``: a start that may take over a
    silent worker says so): a save while it is ``saving`` on its source, a start while it is
    ``restoring`` on its target, a rollback start while it has ``failed``, on either of its
    workers (``migration.rollback_home`` picks one, and turns to the other after refusals). A
    manager restarted while the worker was carrying it out has the migration back from its
    journal but not the command."""
    cmd = box.pending(worker, container, action)
    if cmd is not None or action not in (Action.SAVE, Action.START):
        return cmd
    for m in migrations:
        if m.container != container:
            continue
        if action is Action.SAVE and m.state is State.SAVING and m.source == worker:
            return command(m, action, worker, now)
        if action is Action.START and m.state is State.RESTORING and m.target == worker:
            return command(m, action, worker, now)
        if action is Action.START and m.state is State.FAILED and worker in (m.source, m.target):
            return command(m, action, worker, now, rollback=True)
    return None


def mark_command(cid: ContainerId, now: float, policy: Policy) -> Command:
    """Tell the agent that Algorithm 2 has decided for ``cid`` (it freezes the job in CC)."""
    return Command(
        id=f"mark:{cid}",
        action=Action.MARK_MIGRATED,
        container=cid,
        deadline=now + policy.messaging.worker_timeout,
    )


class Outbox:
    def __init__(self) -> None:
        self.boxes: dict[WorkerId, dict[str, Command]] = {}
        self._gate: dict[str, int] = {}  # command id -> journal writes it waits for
        # Command ids each worker has already been sent (by a reply or a poll).
        self._delivered: dict[WorkerId, set[str]] = {}
        # Saves sent for migrations that failed since, by id: (worker, command, since when).
        self._awaited: dict[str, tuple[WorkerId, Command, float]] = {}

    def put(self, worker: WorkerId, cmd: Command, *, after_write: int) -> bool:
        """Queue ``cmd`` behind journal write ``after_write``; False if it is queued already."""
        box = self.boxes.setdefault(worker, {})
        if cmd.id in box:
            return False
        box[cmd.id] = cmd
        self._gate[cmd.id] = after_write
        return True

    def pop(self, worker: WorkerId, command_id: str) -> Command | None:
        """Take out the command a result answers (None: answered already, or unknown)."""
        self._gate.pop(command_id, None)
        cmd = self.boxes.get(worker, {}).pop(command_id, None)
        awaited = self._awaited.get(command_id)
        if cmd is None and awaited is not None and awaited[0] == worker:
            del self._awaited[command_id]
            cmd = awaited[1]
        return cmd

    def deliver(self, worker: WorkerId, durable: int) -> tuple[Command, ...]:
        """The commands ``worker`` may have now; counts them as sent."""
        box = self.boxes.get(worker, {})
        ready = {cid: cmd for cid, cmd in box.items() if self._gate.get(cid, 0) <= durable}
        if ready or worker in self._delivered:  # nothing is kept for a worker never sent anything
            delivered = self._delivered.setdefault(worker, set())
            delivered.intersection_update(box)
            delivered.update(ready)
        return tuple(ready.values())

    def has_unsent(self, worker: WorkerId, durable: int) -> bool:
        """A deliverable command no reply or poll carried yet (wakes a long poll)."""
        seen = self._delivered.get(worker, set())
        return any(
            cid not in seen and self._gate.get(cid, 0) <= durable for cid in self.boxes.get(worker, {})
        )

    def has_start(self, migration: str, workers: Iterable[WorkerId]) -> bool:
        """A start of ``migration`` is queued on one of ``workers`` (never two at once)."""
        return any(
            c.migration == migration and c.action is Action.START
            for w in set(workers)
            for c in self.boxes.get(w, {}).values()
        )

    def retract(
        self, migration: str, workers: Iterable[WorkerId], *, await_saves_at: float | None = None
    ) -> None:
        """Withdraw ``migration``'s commands from ``workers`` (a migration only ever commands
        its source and its target). With ``await_saves_at`` (the time), a save already sent
        is kept for its result (``awaited_save``); otherwise nothing of it is kept."""
        for w in set(workers):
            box, sent = self.boxes.get(w, {}), self._delivered.get(w, set())
            for cid in [c for c, cmd in box.items() if cmd.migration == migration]:
                cmd = box.pop(cid)
                self._gate.pop(cid, None)
                if await_saves_at is not None and cmd.action is Action.SAVE and cid in sent:
                    self._awaited[cid] = (w, cmd, await_saves_at)
        if await_saves_at is None:
            for cid in [c for c, (_, cmd, _) in self._awaited.items() if cmd.migration == migration]:
                del self._awaited[cid]

    def pending(self, worker: WorkerId, container: ContainerId, action: Action) -> Command | None:
        """A command of ``action`` for ``container`` that ``worker`` has not answered yet (a
        save awaited after its migration failed included): what the manager's pod broker
        lets the worker's agent have done on Kubernetes (``specon_manager.pod_broker``)."""
        for cmd in self.boxes.get(worker, {}).values():
            if cmd.container == container and cmd.action is action:
                return cmd
        for w, cmd, _ in self._awaited.values():
            if w == worker and cmd.container == container and cmd.action is action:
                return cmd
        return None

    def awaited_save(self, migration: str, worker: WorkerId) -> float | None:
        """Since when a save of ``migration`` sent to ``worker`` is awaited (None: none is)."""
        for w, cmd, since in self._awaited.values():
            if w == worker and cmd.migration == migration:
                return since
        return None

    def forget(self, worker: WorkerId) -> None:
        """Drop everything kept for a pruned worker."""
        for cid in self.boxes.pop(worker, {}):
            self._gate.pop(cid, None)
        self._delivered.pop(worker, None)
        for cid in [c for c, (w, _, _) in self._awaited.items() if w == worker]:
            del self._awaited[cid]
