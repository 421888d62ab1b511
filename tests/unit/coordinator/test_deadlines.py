"""No migration stuck forever: deadlines on a save and a start, and failed migrations whose
workers went silent stop holding the migration budget (they still restart their job)."""

from __future__ import annotations

from pathlib import Path

from specon.coordinator.inline import InlineCoordinator
from specon.coordinator.migration import FINISHED_DURING, State
from specon.model import Category, ContainerId
from specon.wire.protocol import Action, Command, CommandResult, ContainerReport
from tests.unit.manager_fakes import (
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


def _asks(cid: str, *others: str) -> tuple[ContainerReport, ...]:
    """``cid`` converged and asking to move, beside progressing ``others``."""
    return (report(cid, CC, pending=True), *(report(o) for o in others))


def _saved(cmd: Command, agent: FakeAgent) -> CommandResult:
    ckpt = f"/vol/{cmd.container}/ckpt.json"
    return CommandResult(cmd.id, ok=True, checkpoint=ckpt, checkpoint_step=7, finished_at=agent.now())


def _states(coord: InlineCoordinator) -> dict[str, State]:
    return {m.container: m.state for m in coord.journal.all()}  # type: ignore[attr-defined]


def test_a_save_that_never_returns_rolls_back_at_its_deadline(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock, policy(migration={"save_timeout": 60.0}))
    events = record_events(coord)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat())
    save = only(coord.on_heartbeat(a.heartbeat(*_asks("c1", "c2", "c3"))), Action.SAVE)
    # The source keeps running c1 and never answers the save (a hung checkpoint).
    for _ in range(12):
        clock.advance(5.0)
        coord.on_heartbeat(b.heartbeat())
        batch = coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3")))
        assert _states(coord)["c1"] is State.SAVING, "not before its deadline"
        assert save.id in {c.id for c in batch.commands}
    clock.advance(5.0)
    batch = coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3")))
    (m,) = coord.journal.all()  # type: ignore[attr-defined]
    assert m.state is State.FAILED
    assert m.error is not None and m.error.startswith("deadline: saving for 65 s")
    assert not commands(batch, Action.SAVE), "the stuck save is withdrawn"
    assert [e.labels for e in events if e.kind == "migration_timeout"] == [{"state": "saving"}]
    # c1 still runs on its source. Ended at once, a save that then stopped it would leave it
    # running nowhere: the migration ends once no save can still be under way.
    pol = coord.policy
    clock.advance(pol.migration.grace_period + pol.messaging.worker_timeout + 1.0)
    coord.on_heartbeat(b.heartbeat())
    batch = coord.on_heartbeat(a.heartbeat(report("c1", CC), report("c2"), report("c3")))
    (m,) = coord.journal.all()  # type: ignore[attr-defined]
    assert m.state is State.ROLLED_BACK and not commands(batch)
    assert not coord.migrations


def test_after_two_migrations_stick_new_ones_still_run(tmp_path: Path, clock: FakeClock) -> None:
    """Two starts that never happen hold the whole budget (2) until their deadline; then
    both roll back onto their sources and the waiting request is answered."""
    pol = policy(migration={"restore_timeout": 60.0}, rebalance={"mode": "off"})
    coord = coordinator(tmp_path, clock, pol)
    a1, a2, a3 = (FakeAgent(f"a{i}", clock) for i in (1, 2, 3))
    b1, b2, b3 = (FakeAgent(f"b{i}", clock) for i in (1, 2, 3))
    on: dict[FakeAgent, tuple[ContainerReport, ...]] = {  # the targets report first
        b1: (report("q1"),),
        b2: (report("q2"),),
        b3: (report("q3"),),
        a1: _asks("c1", "p1", "p2"),
        a2: _asks("c2", "p3", "p4"),
    }
    replies = {agent: coord.on_heartbeat(agent.heartbeat(*reps)) for agent, reps in on.items()}
    saves = {agent: only(replies[agent], Action.SAVE) for agent in (a1, a2)}
    targets = {saves[a1].target, saves[a2].target}
    results = {a1: (_saved(saves[a1], a1),), a2: (_saved(saves[a2], a2),)}
    on[a1], on[a2] = on[a1][1:], on[a2][1:]  # saved: gone from the sources
    on[a3] = _asks("c3", "p5", "p6")  # a third request: the budget is full
    for agent, reps in on.items():
        coord.on_heartbeat(agent.heartbeat(*reps, results=results.get(agent, ())))
    assert _states(coord) == {"c1": State.RESTORING, "c2": State.RESTORING}
    assert coord.requests.keys() == {"c3"}, "deferred while two migrations hold the budget"

    # The targets never start them (say, an image that never pulls) but stay alive.
    rollbacks: dict[FakeAgent, Command] = {}
    for _ in range(13):
        clock.advance(5.0)
        for agent, reps in on.items():
            for cmd in commands(coord.on_heartbeat(agent.heartbeat(*reps)), Action.START):
                if cmd.rollback:
                    rollbacks[agent] = cmd
    assert {m: s for m, s in _states(coord).items() if m != "c3"} == {"c1": State.FAILED, "c2": State.FAILED}
    assert all(m.error and m.error.startswith("deadline: restoring") for m in coord.migrations.values())
    assert set(rollbacks) == {a1, a2}, f"rolled back onto the sources, not {targets}"
    assert all(c.checkpoint and c.checkpoint.endswith("ckpt.json") for c in rollbacks.values())

    # The sources restart their jobs; the budget frees and c3's request is answered.
    for agent, cid in ((a1, "c1"), (a2, "c2")):
        on[agent] = (report(cid, CC, migrated=True), *on[agent])
        done = CommandResult(rollbacks[agent].id, ok=True, finished_at=agent.now())
        coord.on_heartbeat(agent.heartbeat(*on[agent], results=(done,)))
    coord.on_heartbeat(a3.heartbeat(*on[a3]))
    states = _states(coord)
    assert (states["c1"], states["c2"]) == (State.ROLLED_BACK, State.ROLLED_BACK)
    assert states["c3"] is State.SAVING, "a new migration runs"


def test_failed_migrations_of_silent_workers_stop_holding_the_budget(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Workers that went silent mid-migration: after park_after worker timeouts the failed
    migrations no longer block others, and one still restarts its job when its worker is back."""
    pol = policy(migration={"park_after": 2.0}, rebalance={"mode": "off"})
    coord = coordinator(tmp_path, clock, pol)
    events = record_events(coord)
    a1, a2, a3, b1, b2, b3 = (FakeAgent(n, clock) for n in ("a1", "a2", "a3", "b1", "b2", "b3"))
    for agent in (b1, b2, b3):
        coord.on_heartbeat(agent.heartbeat(report(f"q-{agent.worker}")))
    only(coord.on_heartbeat(a1.heartbeat(*_asks("c1", "p1", "p2"))), Action.SAVE)
    only(coord.on_heartbeat(a2.heartbeat(*_asks("c2", "p3", "p4"))), Action.SAVE)
    busy = {m.target for m in coord.migrations.values()}
    idle = next(agent for agent in (b1, b2, b3) if agent.worker not in busy)
    # a1, a2 and both targets go silent (a rack lost power); a3 asks; only a3 and idle report.
    timeout = pol.messaging.worker_timeout
    alive = [a3, idle]
    reports = {a3: _asks("c3", "p5", "p6"), idle: (report(f"q-{idle.worker}"),)}
    t_silent = clock()
    while clock() - t_silent < 2.0 * timeout + 5.0:
        clock.advance(5.0)
        for agent in alive:
            coord.on_heartbeat(agent.heartbeat(*reports[agent]))
        coord.step(rebalance=True)
        if clock() - t_silent < 2.0 * timeout:
            assert "c3" not in _states(coord), "the failed migrations hold the budget for a while"
    states = _states(coord)
    assert (states["c1"], states["c2"]) == (State.FAILED, State.FAILED)
    assert all("parked" in (m.error or "") for m in coord.migrations.values() if m.container != "c3")
    assert len([e for e in events if e.kind == "migration_parked"]) == 2
    assert states["c3"] in (State.SAVING, State.DECIDED), "a new migration runs meanwhile"

    # a1 comes back without c1: the parked migration restarts c1 there, from its checkpoint.
    clock.advance(5.0)
    back = coord.on_heartbeat(a1.heartbeat(report("p1"), report("p2")))
    restart = only(back, Action.START)
    assert restart.rollback and restart.container == ContainerId("c1")


def test_a_start_refused_because_the_job_finished_ends_the_migration(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Found by the chaos run: a job that completed while its save was cut short is reported
    nowhere, and its rollback start is refused ("already finished") again and again, holding
    the budget for ever. The runtime's word that it finished ends the migration."""
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat())
    save = only(coord.on_heartbeat(a.heartbeat(*_asks("c1", "c2", "c3"))), Action.SAVE)
    failed = CommandResult(save.id, ok=False, error="source agent restarted mid-save", finished_at=a.now())
    clock.advance(1.0)
    batch = coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(failed,)))
    restart = only(batch, Action.START)
    assert restart.rollback and _states(coord)["c1"] is State.FAILED
    refused = CommandResult(
        restart.id, ok=False, error="c1: already finished", finished_at=a.now(), detail={"finished": True}
    )
    clock.advance(1.0)
    coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(refused,)))
    assert _states(coord)["c1"] is State.ROLLED_BACK and not coord.migrations


def test_a_save_whose_job_completed_ends_the_migration_and_says_why(tmp_path: Path, clock: FakeClock) -> None:
    """Seen in CI: the job trained its last step before its SIGTERM arrived. The save result
    says so before any heartbeat does; the journal names that reason, not an unreachable worker."""
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat())
    save = only(coord.on_heartbeat(a.heartbeat(*_asks("c1", "c2", "c3"))), Action.SAVE)
    done = CommandResult(save.id, ok=True, finished_at=a.now(), detail={"finished": True})
    clock.advance(1.0)
    coord.on_heartbeat(a.heartbeat(report("c2"), report("c3"), results=(done,)))
    (m,) = [m for m in coord.journal.all() if m.container == "c1"]  # type: ignore[attr-defined]
    assert m.state in (State.FAILED, State.ROLLED_BACK)
    assert m.error == FINISHED_DURING
