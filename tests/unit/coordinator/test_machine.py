"""The coordinator without HTTP: requests -> Algorithm 2 -> journaled migrations -> agent commands.

A fake clock drives time; ``FakeAgent`` writes the heartbeats an agent would send
(with its own skewed clock), and the tests answer commands the way an agent does:
with a ``CommandResult`` riding on the next heartbeat.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from specon_manager.journal import Journal
from specon_manager.shell import recover

from specon.coordinator.inline import InlineCoordinator
from specon.coordinator.migration import Mark, Migration, State
from specon.model import Category, ContainerId, WorkerId
from specon.policy.decisions import Move
from specon.wire.protocol import (
    Action,
    Command,
    CommandBatch,
    CommandResult,
    ContainerReport,
    Heartbeat,
    ReallocationRequest,
)
from tests.unit.manager_fakes import (
    START,
    FakeAgent,
    FakeClock,
    commands,
    coordinator,
    only,
    policy,
    record_events,
    report,
)

CC = Category.CONVERGED
C1 = ContainerId("c1")
CKPT = "/vol/c1/ckpt-100.json"


def _one_migration(coord: InlineCoordinator) -> Migration:
    all_ = coord.journal.all()
    assert len(all_) == 1, all_
    return all_[0]


def _in_any_outbox(coord: InlineCoordinator, action: Action) -> list[Command]:
    return [c for box in coord.outbox.values() for c in box.values() if c.action is action]


def _saved(cmd: Command, agent: FakeAgent) -> CommandResult:
    return CommandResult(
        command=cmd.id,
        ok=True,
        checkpoint=CKPT,
        checkpoint_step=100,
        finished_at=agent.now(),
        spec={"image": "train:1"},
    )


def _begin_move(coord: InlineCoordinator, a: FakeAgent, b: FakeAgent) -> Command:
    """b idle, a loaded with c1 (CC, requesting) + two PC jobs: Algorithm 2 moves c1 a -> b.

    Returns the save command a's heartbeat reply carries.
    """
    assert not commands(coord.on_heartbeat(b.heartbeat()))
    batch = coord.on_heartbeat(a.heartbeat(report("c1", CC, pending=True), report("c2"), report("c3")))
    return only(batch, Action.SAVE)


def test_move_runs_save_then_start_and_measures_downtime_across_skewed_clocks(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    events = record_events(coord)
    a, b = FakeAgent("a", clock, skew=-500.0), FakeAgent("b", clock, skew=300.0)
    t0 = clock()

    save = _begin_move(coord, a, b)
    assert (save.container, save.target) == (C1, "b")
    m = _one_migration(coord)
    assert (m.source, m.target, m.reason, m.state) == ("a", "b", "converged", State.SAVING)
    assert save.migration == m.id
    assert coord.marks[C1].migrations == 1

    clock.advance(2.0)  # the save finishes at t0 + 2 ...
    result = _saved(save, a)
    clock.advance(1.0)  # ... and is reported at t0 + 3, with c1 gone from a
    reply_a = coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(result,)))
    assert not commands(reply_a, Action.SAVE), "an applied save result retires the save"
    assert coord.journal.get(m.id).state is State.RESTORING  # type: ignore[union-attr]

    start = only(coord.batch_for(b.worker), Action.START)
    assert start.container == C1 and start.migration == m.id
    assert (start.checkpoint, start.checkpoint_step) == (CKPT, 100)
    assert start.migrated, "Algorithm 2 decided for c1: it must arrive frozen in CC"
    assert start.spec == {}, "a start never carries a recipe: the target reads its own"

    clock.advance(3.0)  # the start finishes at t0 + 6 ...
    started = CommandResult(command=start.id, ok=True, finished_at=b.now())
    clock.advance(1.0)  # ... reported at t0 + 7 with c1 running on b
    reply_b = coord.on_heartbeat(b.heartbeat(report("c1", CC, migrated=True), results=(started,)))
    assert not reply_b.commands

    done = coord.journal.get(m.id)
    assert done is not None and done.state is State.DONE
    assert done.stopped_at == pytest.approx(t0 + 2.0)
    assert done.started_at == pytest.approx(t0 + 6.0)
    assert done.downtime == pytest.approx(4.0)
    assert not coord.migrations
    finished = [e for e in events if e.kind == "migration_finished"]
    assert [e.labels["result"] for e in finished] == ["done"]
    assert finished[0].downtime == pytest.approx(4.0)


def test_stay_marks_the_container_and_opens_no_migration(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat(report("p1"), report("p2")))
    batch = coord.on_heartbeat(a.heartbeat(report("c1", CC, pending=True)))
    mark = only(batch, Action.MARK_MIGRATED)
    assert mark.container == C1 and mark.target is None
    assert not commands(batch, Action.SAVE)
    assert coord.journal.all() == []
    assert coord.marks[C1].migrations == 1
    assert coord.journal.marks()[C1].migrated_at == clock()


def test_repeated_request_after_stay_is_answered_with_a_mark_only(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat(report("p1"), report("p2")))
    mark = only(coord.on_heartbeat(a.heartbeat(report("c1", CC, pending=True))), Action.MARK_MIGRATED)
    # The agent applied the mark; the result retires it.
    done = CommandResult(command=mark.id, ok=True, finished_at=a.now())
    assert not coord.on_heartbeat(a.heartbeat(report("c1", CC, migrated=True), results=(done,))).commands
    # b empties, so a move would now win; but c1 was already decided once.
    clock.advance(5.0)
    coord.on_heartbeat(b.heartbeat())
    reply = coord.on_request(
        ReallocationRequest(worker=a.worker, container=C1, t_cc=a.now(), g=0.001, sent_at=a.now())
    )
    assert [c.action for c in reply.commands] == [Action.MARK_MIGRATED]
    assert coord.journal.all() == []
    assert coord.marks[C1].migrations == 1


def test_request_for_an_already_moved_container_opens_no_second_migration(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(_saved(save, a),)))
    start = only(coord.batch_for(b.worker), Action.START)
    started = CommandResult(command=start.id, ok=True, finished_at=b.now())
    coord.on_heartbeat(b.heartbeat(report("c1", CC, migrated=True), results=(started,)))
    assert _one_migration(coord).state is State.DONE
    # A new agent on b that lost the mark requests again: answered with the mark, nothing else.
    clock.advance(5.0)
    reply = coord.on_heartbeat(b.heartbeat(report("c1", CC, pending=True)))
    assert [c.action for c in reply.commands] == [Action.MARK_MIGRATED]
    assert _one_migration(coord).state is State.DONE


def test_failed_save_with_the_job_still_running_rolls_back_without_a_start(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    failed = CommandResult(command=save.id, ok=False, error="no checkpoint within the grace period")
    reply = coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3"), results=(failed,)))
    m = _one_migration(coord)
    assert m.state is State.ROLLED_BACK
    assert m.error == "no checkpoint within the grace period"
    assert not commands(reply, Action.START) and not _in_any_outbox(coord, Action.START)


def test_failed_save_with_the_job_stopped_restarts_it_on_the_source(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    events = record_events(coord)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    failed = CommandResult(command=save.id, ok=False, error="killed", finished_at=a.now())
    reply = coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(failed,)))
    assert _one_migration(coord).state is State.FAILED
    rollback = only(reply, Action.START)
    assert rollback.container == C1 and "rollback" in rollback.id
    assert not coord.batch_for(b.worker).commands, "nothing may start on the target"

    restarted = CommandResult(command=rollback.id, ok=True, finished_at=a.now())
    coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3"), results=(restarted,)))
    m = _one_migration(coord)
    assert m.state is State.ROLLED_BACK and m.error == "killed"
    assert not coord.migrations
    assert [e.labels["result"] for e in events if e.kind == "migration_finished"] == ["rolled_back"]


def test_target_timeout_fails_the_migration_and_restarts_on_the_source(
    tmp_path: Path, clock: FakeClock
) -> None:
    pol = policy()
    coord = coordinator(tmp_path, clock, pol)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(_saved(save, a),)))
    assert commands(coord.batch_for(b.worker), Action.START)

    # b falls silent; a keeps reporting (without c1) until b's heartbeat is too old.
    clock.advance(pol.messaging.worker_timeout + 1.0)
    reply = coord.on_heartbeat(a.heartbeat(report("c2"), report("c3")))
    m = _one_migration(coord)
    assert m.state is State.FAILED and m.error is not None
    rollback = only(reply, Action.START)
    assert (rollback.container, rollback.checkpoint) == (C1, CKPT)
    assert not coord.batch_for(b.worker).commands, "the start for the dead target is withdrawn"

    restarted = CommandResult(command=rollback.id, ok=True, finished_at=a.now())
    coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3"), results=(restarted,)))
    assert _one_migration(coord).state is State.ROLLED_BACK


def _restore_ordered(coord: InlineCoordinator, a: FakeAgent, b: FakeAgent) -> Command:
    """Move c1 from a to b up to its start on b (saved on a): that start."""
    save = _begin_move(coord, a, b)
    coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(_saved(save, a),)))
    return only(coord.batch_for(b.worker), Action.START)


def test_a_restored_copy_listed_on_the_target_is_not_done_until_its_start_says_it_runs(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Issue 33 row 5: the copy is listed on the target (launched), then dies before its
    # first record (a crash on restore, an OOM, a kubelet's refusal). The start's result,
    # not the listing, ends the migration: here it failed, and the job restarts on its
    # source from the save's checkpoint instead of being counted moved while gone.
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    start = _restore_ordered(coord, a, b)

    clock.advance(1.0)
    coord.on_heartbeat(b.heartbeat(report("c1", CC, migrated=True)))  # launched, no result yet
    assert _one_migration(coord).state is State.RESTORING

    clock.advance(1.0)
    died = CommandResult(command=start.id, ok=False, error="ended before its first record",
                         finished_at=b.now(), detail={"died": True})  # fmt: skip
    coord.on_heartbeat(b.heartbeat(results=(died,)))  # and no longer listed there
    m = _one_migration(coord)
    assert m.state is State.FAILED and m.error == "ended before its first record"
    rollback = only(coord.batch_for(a.worker), Action.START)
    assert rollback.rollback and (rollback.container, rollback.checkpoint) == (C1, CKPT)

    restarted = CommandResult(command=rollback.id, ok=True, finished_at=a.now())
    coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3"), results=(restarted,)))
    assert _one_migration(coord).state is State.ROLLED_BACK


def test_global_budget_defers_a_second_request_until_the_first_migration_ends(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(
        tmp_path, clock, policy(migration={"max_concurrent": 1, "max_concurrent_per_worker": 2})
    )
    events = record_events(coord)
    a, b, x = FakeAgent("a", clock), FakeAgent("b", clock), FakeAgent("x", clock)
    coord.on_heartbeat(b.heartbeat())
    save_c1 = only(
        coord.on_heartbeat(a.heartbeat(report("c1", CC, pending=True), report("a1"), report("a2"))),
        Action.SAVE,
    )
    x_reports = (report("c4", CC, pending=True), report("x1"), report("x2"))
    reply_x = coord.on_heartbeat(x.heartbeat(*x_reports))
    assert not reply_x.commands
    assert len(coord.journal.all()) == 1
    assert any(e.kind == "request_deferred" for e in events)

    # Finish c1's move; the deferred request is decided in the same pass that ends it.
    coord.on_heartbeat(a.heartbeat(report("a1"), report("a2"), results=(_saved(save_c1, a),)))
    start = only(coord.batch_for(b.worker), Action.START)
    started = CommandResult(command=start.id, ok=True, finished_at=b.now())
    coord.on_heartbeat(b.heartbeat(report("c1", CC, migrated=True), results=(started,)))
    by_container = {m.container: m for m in coord.journal.all()}
    assert by_container[C1].state is State.DONE
    second = by_container[ContainerId("c4")]
    assert (second.source, second.state) == ("x", State.SAVING)
    assert only(coord.batch_for(x.worker), Action.SAVE).container == "c4"


def test_per_worker_budget_also_limits_the_target(tmp_path: Path, clock: FakeClock) -> None:
    pol = policy(migration={"max_concurrent": 2, "max_concurrent_per_worker": 1})
    coord = coordinator(tmp_path, clock, pol)
    a, b, x = FakeAgent("a", clock), FakeAgent("b", clock), FakeAgent("x", clock)
    coord.on_heartbeat(b.heartbeat())
    coord.on_heartbeat(a.heartbeat(report("c1", CC, pending=True), report("a1"), report("a2")))
    coord.on_heartbeat(x.heartbeat(report("c4", CC, pending=True), report("x1"), report("x2")))
    for worker in ("a", "b", "x"):
        touching = [m for m in coord.migrations.values() if worker in (m.source, m.target)]
        assert len(touching) <= 1, f"{worker} is in {len(touching)} migrations: {touching}"


def test_dry_run_journals_decisions_as_rolled_back_and_never_saves_or_starts(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock, policy(migration={"dry_run": True}))
    events = record_events(coord)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat())
    replies = [coord.on_heartbeat(a.heartbeat(report("c1", CC, pending=True), report("c2"), report("c3")))]
    for _ in range(3):
        clock.advance(5.0)
        replies.append(coord.on_heartbeat(b.heartbeat()))
        replies.append(coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3"))))
    m = _one_migration(coord)
    assert (m.container, m.source, m.target) == (C1, "a", "b")
    assert m.state is State.ROLLED_BACK
    assert m.error is not None and m.error.startswith("dry-run")
    sent = [c.action for r in replies for c in r.commands]
    assert Action.SAVE not in sent and Action.START not in sent
    assert Action.MARK_MIGRATED in sent, "the agent is told its request was answered"
    assert not coord.migrations
    assert [e.labels["result"] for e in events if e.kind == "migration_finished"] == ["dry_run"]


def test_a_job_stopped_by_a_save_whose_source_went_silent_is_restarted(
    tmp_path: Path, clock: FakeClock
) -> None:
    pol = policy()
    coord = coordinator(tmp_path, clock, pol)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    _begin_move(coord, a, b)
    # a stops c1 for the save, then is silent past worker_timeout; b keeps reporting.
    for _ in range(int(pol.messaging.worker_timeout // 5) + 1):
        clock.advance(5.0)
        coord.on_heartbeat(b.heartbeat())
    # a is back, and c1 is running nowhere.
    reply = coord.on_heartbeat(a.heartbeat(report("c2"), report("c3")))
    coord.on_heartbeat(b.heartbeat())
    starts = commands(reply, Action.START) + commands(coord.batch_for(b.worker), Action.START)
    assert [c.container for c in starts] == [C1]


def _running_on_a() -> tuple[ContainerReport, ...]:
    return report("c1", CC), report("c2"), report("c3")  # a saving job is listed as running


def _rolled_back_from(coord: InlineCoordinator, a: FakeAgent, rollback: Command) -> Migration:
    restarted = CommandResult(command=rollback.id, ok=True, finished_at=a.now())
    coord.on_heartbeat(a.heartbeat(*_running_on_a(), results=(restarted,)))
    return _one_migration(coord)


def _saving_past_its_deadline(
    tmp_path: Path, clock: FakeClock
) -> tuple[InlineCoordinator, FakeAgent, FakeAgent, Command]:
    """c1's save (returned) runs past save_timeout (10 s) with c1 still listed on a: failed."""
    pol = policy(migration={"save_timeout": 10.0})
    coord = coordinator(tmp_path, clock, pol)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    clock.advance(pol.messaging.worker_timeout + 1.0)  # past the save's deadline (and the warm-up)
    assert not coord.on_heartbeat(a.heartbeat(*_running_on_a())).commands, "no save again, no copy"
    coord.on_heartbeat(b.heartbeat())
    m = _one_migration(coord)
    assert m.state is State.FAILED and m.error is not None and m.error.startswith("deadline: saving")
    return coord, a, b, save


def test_a_save_that_outlives_its_deadline_still_gets_its_job_restarted_from_its_checkpoint(
    tmp_path: Path, clock: FakeClock
) -> None:
    # A big checkpoint: the save runs past save_timeout. Rolled back while the job was still
    # listed, the save then stopped it and its result was dropped: the job ran nowhere.
    coord, a, b, save = _saving_past_its_deadline(tmp_path, clock)
    clock.advance(5.0)  # the save ends: c1 stopped with its checkpoint
    reply = coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(_saved(save, a),)))
    rollback = only(reply, Action.START)
    assert (rollback.container, rollback.checkpoint, rollback.checkpoint_step) == (C1, CKPT, 100)
    assert rollback.rollback and not coord.batch_for(b.worker).commands
    m = _rolled_back_from(coord, a, rollback)
    assert m.state is State.ROLLED_BACK and m.checkpoint == CKPT


def test_a_save_that_outlives_a_cut_of_its_source_still_gets_its_job_restarted(
    tmp_path: Path, clock: FakeClock
) -> None:
    pol = policy()
    coord = coordinator(tmp_path, clock, pol)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    # a is cut off past worker_timeout while it saves; b's rollback start is refused (the job
    # is still a's on the shared volume).
    for _ in range(int(pol.messaging.worker_timeout // 5) + 1):
        clock.advance(5.0)
        for start in commands(coord.on_heartbeat(b.heartbeat()), Action.START):
            refused = CommandResult(command=start.id, ok=False, error="already running", finished_at=b.now())
            coord.on_heartbeat(b.heartbeat(results=(refused,)))
    assert _one_migration(coord).state is State.FAILED
    # a is back, still saving: its job is listed, and the migration waits for the save.
    reply = coord.on_heartbeat(a.heartbeat(*_running_on_a()))
    assert not reply.commands and _one_migration(coord).state is State.FAILED
    clock.advance(2.0)
    reply = coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(_saved(save, a),)))
    rollback = only(reply, Action.START)
    assert (rollback.container, rollback.checkpoint) == (C1, CKPT)
    assert _rolled_back_from(coord, a, rollback).state is State.ROLLED_BACK


def test_a_failed_migration_waits_for_its_save_no_longer_than_a_save_can_last(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord, a, _, _ = _saving_past_its_deadline(tmp_path, clock)
    pol = coord.policy
    # A save ends within its grace (then the job is killed and rolled back): past that and a
    # heartbeat's worth, the job still listed is running, and the migration ends.
    clock.advance(pol.migration.grace_period + pol.messaging.worker_timeout - 1.0)
    coord.on_heartbeat(a.heartbeat(*_running_on_a()))
    assert _one_migration(coord).state is State.FAILED
    clock.advance(2.0)
    coord.on_heartbeat(a.heartbeat(*_running_on_a()))
    assert _one_migration(coord).state is State.ROLLED_BACK
    assert not coord.migrations and not _in_any_outbox(coord, Action.START)


def test_downtime_is_recorded_when_the_running_job_is_seen_before_the_start_result(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    start = _restore_ordered(coord, a, b)
    clock.advance(2.0)
    started = CommandResult(command=start.id, ok=True, finished_at=b.now())
    # The agent's heartbeat loop lists c1 before the start task has reported its result ...
    coord.on_heartbeat(b.heartbeat(report("c1", CC, migrated=True)))
    clock.advance(1.0)
    # ... which rides on the next heartbeat.
    coord.on_heartbeat(b.heartbeat(report("c1", CC, migrated=True), results=(started,)))
    m = _one_migration(coord)
    assert m.state is State.DONE
    assert m.downtime == pytest.approx(2.0)


def _three_on_a(
    clock: FakeClock, tmp_path: Path, *, residence: float = 0.0, **sections: dict[str, object]
) -> InlineCoordinator:
    """r1..r3 (already decided by Algorithm 2) all on a; b idle; rebalancing on every pass;
    no minimum residence unless ``residence`` says so."""
    journal = Journal(tmp_path / "journal.db")
    for cid in ("r1", "r2", "r3"):
        journal.put_mark(Mark(ContainerId(cid), clock() - 100.0, 1, 0))
    migration = {"min_residence": residence, **sections.pop("migration", {})}
    pol = policy(rebalance={"mode": "balanced", "when": "always"}, migration=migration, **sections)
    coord = InlineCoordinator(policy=pol, journal=journal, clock=clock, recovered=recover(journal, clock()))
    # A journal with marks is a restart: decisions wait until every worker could report.
    coord.core.started_at -= pol.messaging.worker_timeout
    return coord


# r2 converged last, so it has the smallest converged duration d and is the one to move.
T_CC = {"r1": START - 300.0, "r2": START - 60.0, "r3": START - 200.0}


def _frozen(*names: str) -> tuple[ContainerReport, ...]:
    return tuple(report(n, CC, migrated=True, t_cc=T_CC[n]) for n in names)


def test_rebalance_always_moves_one_container_off_the_loaded_worker(tmp_path: Path, clock: FakeClock) -> None:
    coord = _three_on_a(clock, tmp_path)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat())
    coord.on_heartbeat(a.heartbeat(*_frozen("r1", "r2", "r3")))
    coord.step(rebalance=True)  # Algorithm 3 runs from the manager's ticker, not per heartbeat
    reply = coord.batch_for(a.worker)
    m = _one_migration(coord)
    assert (m.container, m.source, m.target, m.reason) == ("r2", "a", "b", "rebalance")
    save = only(reply, Action.SAVE)
    assert save.container == "r2"
    assert coord.marks[ContainerId("r2")].rebalances == 1

    saved = CommandResult(command=save.id, ok=True, checkpoint=CKPT, finished_at=a.now())
    coord.on_heartbeat(a.heartbeat(*_frozen("r1", "r3"), results=(saved,)))
    start = only(coord.batch_for(b.worker), Action.START)
    assert start.migrated, "a container Algorithm 2 already decided stays frozen after a rebalance"
    started = CommandResult(command=start.id, ok=True, finished_at=b.now())
    coord.on_heartbeat(b.heartbeat(*_frozen("r2"), results=(started,)))
    assert _one_migration(coord).state is State.DONE
    # Loads [2, 1]: balanced, nothing more to do however often it is asked.
    for _ in range(3):
        clock.advance(5.0)
        coord.on_heartbeat(a.heartbeat(*_frozen("r1", "r3")))
        coord.step(rebalance=True)
    assert len(coord.journal.all()) == 1


def test_a_container_stays_on_its_worker_for_the_minimum_residence_time(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = _three_on_a(clock, tmp_path, residence=60.0)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    for _ in range(12):  # up to 55 s on a: not yet movable
        coord.on_heartbeat(b.heartbeat())
        coord.on_heartbeat(a.heartbeat(*_frozen("r1", "r2", "r3")))
        coord.step(rebalance=True)
        assert coord.journal.all() == []
        clock.advance(5.0)
    coord.on_heartbeat(b.heartbeat())
    coord.on_heartbeat(a.heartbeat(*_frozen("r1", "r2", "r3")))
    coord.step(rebalance=True)
    assert _one_migration(coord).container == "r2"


def test_dry_run_rebalance_records_only_the_moves_a_live_run_would_make(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = _three_on_a(clock, tmp_path, migration={"dry_run": True})
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat())
    for _ in range(4):
        coord.on_heartbeat(a.heartbeat(*_frozen("r1", "r2", "r3")))
        coord.step(rebalance=True)
        clock.advance(5.0)
    assert [m.container for m in coord.journal.all()] == ["r2"]
    assert [c for c, mk in coord.marks.items() if mk.rebalances] == ["r2"]


# --- long poll ----------------------------------------------------------------------------


# --- crash recovery ---------------------------------------------------------------------

A, B = WorkerId("a"), WorkerId("b")
J1, J2, J3, J4 = (ContainerId(f"j{i}") for i in range(1, 5))


def _journal_in_flight(path: Path, t: float) -> None:
    """The journal a manager leaves when killed with a migration in each in-flight state (all a -> b)."""

    def decided(mid: str, cid: ContainerId) -> Migration:
        return Migration(mid, cid, A, B, "converged", State.DECIDED, t - 10.0, t - 10.0)

    saved = decided("m-saved", J2).to(State.SAVING, at=t - 9.0)
    saved = saved.to(State.SAVED, at=t - 6.0, checkpoint="/vol/j2/ck.json", stopped_at=t - 6.0)
    restoring = decided("m-restoring", J3).to(State.SAVING, at=t - 9.0)
    restoring = restoring.to(State.SAVED, at=t - 7.0, checkpoint="/vol/j3/ck.json", stopped_at=t - 7.0)
    restoring = restoring.to(State.RESTORING, at=t - 6.0)
    journal = Journal(path)
    for m in (
        decided("m-saving", J1).to(State.SAVING, at=t - 9.0),
        saved,
        restoring,
        decided("m-failed", J4).to(State.SAVING, at=t - 9.0).to(State.FAILED, at=t - 5.0, error="timed out"),
    ):
        journal.put(m)
        journal.put_mark(Mark(m.container, t - 10.0, 1, 0))
    journal.close()


def _restart_facts(a: FakeAgent, b: FakeAgent) -> tuple[Heartbeat, Heartbeat]:
    """What the agents report after the restart: j1 still on a (its save never arrived),
    j2 and j4 stopped everywhere, j3 listed on b (its start did arrive; its result did not)."""
    return a.heartbeat(report("j1", CC), report("a-busy")), b.heartbeat(report("j3", CC, migrated=True))


def _no_start_for_a_running_container(coord: InlineCoordinator) -> None:
    """No start is queued while the job runs on another worker (one repeated where the copy
    runs is answered by that copy)."""
    for worker, box in coord.outbox.items():
        for cmd in box.values():
            if cmd.action is Action.START:
                where = coord.state.running_on(cmd.container)
                assert where in (None, worker), f"{cmd.id} queued while {cmd.container} runs on {where}"


def test_new_coordinator_resumes_every_in_flight_state_from_the_journal(
    tmp_path: Path, clock: FakeClock
) -> None:
    _journal_in_flight(tmp_path / "journal.db", clock())
    coord = coordinator(tmp_path, clock)
    assert sorted(coord.migrations) == ["m-failed", "m-restoring", "m-saved", "m-saving"]
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    hb_a, hb_b = _restart_facts(a, b)
    # Both reports are in before the first pass (see the xfail tests below for why).
    coord.state.ingest(hb_a, clock())
    coord.state.ingest(hb_b, clock())
    coord.step()

    state = {m.container: m for m in coord.journal.all()}
    assert state[J1].state is State.SAVING
    assert state[J2].state is State.RESTORING
    # Listed on b is not yet running: its start is asked again, and answered by the copy there.
    assert state[J3].state is State.RESTORING
    assert state[J4].state is State.FAILED
    on_a, on_b = coord.batch_for(A), coord.batch_for(B)
    assert [(c.action, c.container) for c in on_a.commands] == [(Action.SAVE, J1), (Action.START, J4)]
    assert "rollback" in commands(on_a, Action.START)[0].id
    start_j2, start_j3 = sorted(commands(on_b, Action.START), key=lambda c: c.container)
    assert (start_j2.container, start_j2.checkpoint, start_j2.migrated) == (J2, "/vol/j2/ck.json", True)
    assert (start_j3.container, start_j3.checkpoint) == (J3, "/vol/j3/ck.json")
    _no_start_for_a_running_container(coord)

    # The agents answer; every migration reaches the end the journal promised.
    clock.advance(2.0)
    save_j1 = only(on_a, Action.SAVE)
    rollback_j4 = only(on_a, Action.START)
    results_a = (
        CommandResult(command=save_j1.id, ok=True, checkpoint="/vol/j1/ck.json", finished_at=a.now()),
        CommandResult(command=rollback_j4.id, ok=True, finished_at=a.now()),
    )
    coord.on_heartbeat(a.heartbeat(report("j4", CC, migrated=True), report("a-busy"), results=results_a))
    _no_start_for_a_running_container(coord)
    started = tuple(CommandResult(command=c.id, ok=True, finished_at=b.now()) for c in (start_j2, start_j3))
    coord.on_heartbeat(
        b.heartbeat(report("j2", CC, migrated=True), report("j3", CC, migrated=True), results=started)
    )
    state = {m.container: m for m in coord.journal.all()}
    assert {c: m.state for c, m in state.items()} == {
        J1: State.RESTORING,
        J2: State.DONE,
        J3: State.DONE,
        J4: State.ROLLED_BACK,
    }
    assert only(coord.batch_for(B), Action.START).container == J1
    _no_start_for_a_running_container(coord)


def test_recovery_waits_for_workers_it_has_not_heard_from_yet(tmp_path: Path, clock: FakeClock) -> None:
    _journal_in_flight(tmp_path / "journal.db", clock())
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    hb_a, hb_b = _restart_facts(a, b)
    reply_a = coord.on_heartbeat(hb_a)  # the agents report one after the other, as they do
    assert J3 not in {c.container for c in commands(reply_a, Action.START)}, "j3 is running on b"
    reply_b = coord.on_heartbeat(hb_b)
    assert J3 in {c.container for c in commands(reply_b, Action.START)}, "answered by the copy on b"
    state = {m.container: m.state for m in coord.journal.all()}
    assert state == {J1: State.SAVING, J2: State.RESTORING, J3: State.RESTORING, J4: State.FAILED}


def test_a_tick_before_any_heartbeat_fails_no_recovered_migration(tmp_path: Path, clock: FakeClock) -> None:
    _journal_in_flight(tmp_path / "journal.db", clock())
    coord = coordinator(tmp_path, clock)
    coord.step()
    states = {m.id: m.state for m in coord.journal.all()}
    assert states == {
        "m-saving": State.SAVING,
        "m-saved": State.SAVED,
        "m-restoring": State.RESTORING,
        "m-failed": State.FAILED,
    }


# --- explicit commands ---------------------------------------------------------------------


def test_a_rollback_start_says_so_in_a_field_and_its_result_is_read_from_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    assert not save.rollback
    failed = CommandResult(command=save.id, ok=False, error="killed", finished_at=a.now())
    rollback = only(
        coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(failed,))), Action.START
    )
    assert rollback.rollback and rollback.container == C1

    # The meaning is in the field, never parsed out of the id: an id of any shape will do.
    box = coord.outbox[a.worker]
    del box[rollback.id]
    renamed = dataclasses.replace(rollback, id="opaque-42")
    box[renamed.id] = renamed
    restarted = CommandResult(command=renamed.id, ok=True, finished_at=a.now())
    coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3"), results=(restarted,)))
    m = _one_migration(coord)
    assert m.state is State.ROLLED_BACK and not coord.migrations


def test_a_forward_start_is_not_a_rollback(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(_saved(save, a),)))
    start = only(coord.batch_for(b.worker), Action.START)
    assert not start.rollback


def test_a_rollback_onto_the_target_fences_the_source_once_it_is_lost(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The source goes silent while it saves (its host died): the move rolls back onto the
    target, the one live home. Until the source is lost (silent past ``recovery.after``) its
    agent may be dead while the job runs on, so the target refuses and the start is retried;
    from then on the start fences the source's copy (``supersede``, ``lost`` the source), as a
    recovery would, instead of waiting for the host to come back (a chaos run: 36 s)."""
    pol = policy(recovery={"after": 40.0})
    coord = coordinator(tmp_path, clock, pol)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    _begin_move(coord, a, b)
    t0, sent = clock(), dict[str, tuple[float, Command]]()
    while clock() - t0 < 120.0 and not any(c.supersede for _, c in sent.values()):
        clock.advance(1.0)
        coord.step()
        for start in commands(coord.on_heartbeat(b.heartbeat()), Action.START):
            if start.id not in sent:
                sent[start.id] = (clock() - t0, start)
            if not start.supersede:  # the target still sees a's run on the volume
                no = CommandResult(command=start.id, ok=False, error="already running", finished_at=b.now())
                coord.on_heartbeat(b.heartbeat(results=(no,)))
    *waited, (at, fencing) = sorted(sent.values(), key=lambda s: s[0])
    assert waited and all(c.rollback and not c.supersede and c.lost is None for _, c in waited)
    assert all(t < 40.0 for t, _ in waited), "a start refused after the source was lost"
    assert (fencing.container, fencing.rollback, fencing.supersede, fencing.lost) == (C1, True, True, "a")
    assert 40.0 <= at <= 40.0 + pol.messaging.worker_timeout + 1.0  # the retry back-off's cap
    assert _one_migration(coord).state is State.FAILED


def test_a_rollback_onto_a_live_source_fences_nothing(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    save = _begin_move(coord, a, b)
    failed = CommandResult(command=save.id, ok=False, error="killed", finished_at=a.now())
    start = only(coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(failed,))), Action.START)
    assert start.rollback and not start.supersede and start.lost is None


def test_record_dry_run_journals_and_counts_the_container_on_its_target(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock, policy(migration={"dry_run": True}))
    events = record_events(coord)
    m = coord.record_dry_run(Move(C1, WorkerId("a"), WorkerId("b"), "converged"), clock())
    assert _one_migration(coord) == m and m.state is State.ROLLED_BACK
    assert m.error is not None and m.error.startswith("dry-run")
    assert [e.labels["result"] for e in events] == ["dry_run"]
    assert not coord.migrations and not coord.outbox
    a = FakeAgent("a", clock)
    coord.on_heartbeat(a.heartbeat(report("c1", CC)))
    snap = coord.state.snapshot(clock(), timeout=20.0, marks=coord.marks, placed=coord.virtual)
    assert [c.worker for c in snap.containers] == ["b"]


# --- placement constraints: taints, tolerations, selectors -----------------------------------

GPU_TAINT = "gpu=a100:NoSchedule"


def _constrained_cluster(
    coord: InlineCoordinator,
    clock: FakeClock,
    *,
    tolerations: tuple[str, ...] = (),
    selector: dict[str, str] | None = None,
) -> CommandBatch:
    """a: c1 (CC, requesting) + two PC jobs; b: idle, tainted, zone=b; c: one PC job, zone=a.

    By score b (0) beats c (2) beats a; b is feasible only if c1 tolerates its taint.
    Returns a's heartbeat reply.
    """
    a, b, c = FakeAgent("a", clock), FakeAgent("b", clock), FakeAgent("c", clock)
    coord.on_heartbeat(dataclasses.replace(b.heartbeat(), taints=(GPU_TAINT,), labels={"zone": "b"}))
    coord.on_heartbeat(dataclasses.replace(c.heartbeat(report("p1")), labels={"zone": "a"}))
    req = dataclasses.replace(
        report("c1", CC, pending=True), tolerations=tolerations, selector=selector or {}
    )
    return coord.on_heartbeat(a.heartbeat(req, report("c2"), report("c3")))


def test_a_tainted_worker_is_never_the_target_of_a_container_that_does_not_tolerate_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    save = only(_constrained_cluster(coord, clock), Action.SAVE)
    assert save.target == "c"
    snap = coord.state.snapshot(clock(), timeout=20.0, marks=coord.marks)
    assert {w.id: w.taints for w in snap.workers}["b"] == (GPU_TAINT,)


@pytest.mark.parametrize("toleration", ["gpu", "gpu:NoSchedule", "gpu=a100", "*", "*:NoSchedule"])
def test_a_tainted_worker_is_a_target_for_a_container_that_tolerates_it(
    tmp_path: Path, clock: FakeClock, toleration: str
) -> None:
    coord = coordinator(tmp_path, clock)
    save = only(_constrained_cluster(coord, clock, tolerations=(toleration,)), Action.SAVE)
    assert save.target == "b"


@pytest.mark.parametrize("toleration", ["gpu:NoExecute", "gpu=h100", "other"])
def test_a_toleration_of_another_effect_value_or_key_does_not_open_a_tainted_worker(
    tmp_path: Path, clock: FakeClock, toleration: str
) -> None:
    coord = coordinator(tmp_path, clock)
    save = only(_constrained_cluster(coord, clock, tolerations=(toleration,)), Action.SAVE)
    assert save.target == "c"


def test_a_selector_restricts_the_targets(tmp_path: Path, clock: FakeClock) -> None:
    # Tolerated, b would win; the selector leaves only c (zone=a).
    coord = coordinator(tmp_path, clock)
    reply = _constrained_cluster(coord, clock, tolerations=("gpu",), selector={"zone": "a"})
    assert only(reply, Action.SAVE).target == "c"
    snap = coord.state.snapshot(clock(), timeout=20.0, marks=coord.marks)
    c1 = {c.id: c for c in snap.containers}[C1]
    assert c1.selector == (("zone", "a"),) and c1.tolerations == ("gpu",)


def test_a_selector_no_other_worker_satisfies_leaves_the_container_in_place(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Only the source (which needs no check: the job runs there) remains: a stay, never a move.
    coord = coordinator(tmp_path, clock)
    events = record_events(coord)
    reply = _constrained_cluster(coord, clock, tolerations=("*",), selector={"zone": "nowhere"})
    assert not commands(reply, Action.SAVE) and not coord.migrations
    assert any(e.kind == "decision" for e in events)
