"""Draining a worker through the coordinator: cordoned, every job saved and moved off
(``evacuated``), outside the migration budget, within the drain's deadline; journaled."""

from __future__ import annotations

from pathlib import Path

import pytest

from specon.coordinator.draining import UnknownWorkerError
from specon.coordinator.inline import InlineCoordinator
from specon.coordinator.migration import Migration, State, save_lost_steps
from specon.model import WorkerId
from specon.wire.protocol import Action, Command, CommandResult
from tests.unit.manager_fakes import FakeAgent, FakeClock, commands, coordinator, policy, report

A, B = WorkerId("a"), WorkerId("b")
JOBS = ("j1", "j2", "j3", "j4")


def _evacuations(coord: InlineCoordinator) -> list[Migration]:
    return [m for m in coord.journal.all() if m.reason == "evacuated"]


def _saved_at_10(saves: list[Command], agent: FakeAgent) -> tuple[CommandResult, ...]:
    """Each save's result: the job stopped at its checkpoint of step 10."""
    return tuple(
        CommandResult(
            command=c.id,
            ok=True,
            checkpoint=f"/vol/{c.container}/ckpt-10.json",
            checkpoint_step=10,
            finished_at=agent.now(),
            detail={"last_step": 10},
        )
        for c in saves
    )


def _cluster(tmp_path: Path, clock: FakeClock) -> tuple[InlineCoordinator, FakeAgent, FakeAgent]:
    # One move at a time: an evacuation must not wait for that budget.
    coord = coordinator(
        tmp_path, clock, policy(migration={"max_concurrent": 1, "max_concurrent_per_worker": 1})
    )
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    coord.on_heartbeat(b.heartbeat())
    return coord, a, b


def test_a_drain_saves_every_job_at_once_and_restores_each_on_another_worker(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord, a, b = _cluster(tmp_path, clock)
    coord.on_drain(A)
    assert coord.state.cordoned == {A} and coord.core.jobs_on(A) == sorted(JOBS)
    saves = commands(coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS))), Action.SAVE)
    assert sorted(c.container for c in saves) == sorted(JOBS)  # all four, past a budget of one
    assert {(m.source, m.target, m.state) for m in _evacuations(coord)} == {(A, B, State.SAVING)}
    # The saves stop the jobs at their checkpoints; b starts each.
    coord.on_heartbeat(a.heartbeat(results=_saved_at_10(saves, a)))
    starts = commands(coord.on_heartbeat(b.heartbeat()), Action.START)
    assert sorted(c.container for c in starts) == sorted(JOBS)
    ok = tuple(CommandResult(command=c.id, ok=True, finished_at=b.now()) for c in starts)
    coord.on_heartbeat(b.heartbeat(*(report(j) for j in JOBS), results=ok))
    coord.step(rebalance=True)
    assert {m.state for m in _evacuations(coord)} == {State.DONE}
    assert {m.lost_steps for m in _evacuations(coord)} == {0}
    assert coord.core.jobs_on(A) == [] and coord.core.jobs_on(B) == sorted(JOBS)


def test_a_cordoned_worker_takes_no_job_and_uncordon_lets_it_again(tmp_path: Path, clock: FakeClock) -> None:
    coord, a, _ = _cluster(tmp_path, clock)
    coord.on_drain(B)  # b runs nothing: nothing to move, but nothing may come
    coord.on_drain(A)
    coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    assert _evacuations(coord) == []  # nowhere to go: they stay where they are
    status = {w.id: w for w in coord.core.state.worker_status(clock(), 20.0)}
    assert status[A].cordoned and not status[A].ready and status[B].cordoned
    assert coord.on_uncordon(B) and not coord.on_uncordon(B)
    coord.step(rebalance=True)
    assert {m.target for m in _evacuations(coord)} == {B} and len(_evacuations(coord)) == 4
    with pytest.raises(UnknownWorkerError):
        coord.on_drain(WorkerId("nobody"))


def test_a_drains_deadline_bounds_each_save_and_a_cut_short_save_reports_its_lost_steps(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord, a, _ = _cluster(tmp_path, clock)
    coord.on_drain(A, deadline=6.0)
    batch = coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    save = commands(batch, Action.SAVE)[0]
    assert batch.remaining(save) == pytest.approx(6.0)  # not grace_period + worker_timeout
    # The job could not save in time: killed, rolled back to its newest complete checkpoint.
    detail: dict[str, object] = {"forced": True, "rolled_back": True, "last_step": 73}
    cut = CommandResult(
        command=save.id,
        ok=True,
        checkpoint="/vol/ckpt-50.json",
        checkpoint_step=50,
        finished_at=a.now(),
        detail=detail,
    )
    coord.on_heartbeat(a.heartbeat(results=(cut,)))
    (m,) = [m for m in _evacuations(coord) if m.container == save.container]
    assert m.state is State.RESTORING and m.lost_steps == 23


def test_cordons_survive_a_manager_restart(tmp_path: Path, clock: FakeClock) -> None:
    coord, _, _ = _cluster(tmp_path, clock)
    coord.on_drain(A, deadline=60.0)
    coord.journal.close()
    again = coordinator(tmp_path, clock)
    assert set(again.core.cordons) == {A} and again.core.cordons[A].deadline == clock() + 60.0
    assert again.state.cordoned == {A}
    assert again.on_uncordon(A)
    again.journal.close()
    assert coordinator(tmp_path, clock).core.cordons == {}


SPOT = "aws-node-termination-handler/spot-itn=true:NoSchedule"
CORDONED = "node.kubernetes.io/unschedulable:NoSchedule"


def test_a_reclaim_notice_drains_the_worker_within_the_policys_deadline_and_lifts_with_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord, a, _ = _cluster(tmp_path, clock)
    a.taints = (SPOT,)
    coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    coord.step(rebalance=True)
    c = coord.core.cordons[A]
    deadline = coord.core.policy.recovery.evacuate_deadline
    assert (c.taint, c.deadline) == ("aws-node-termination-handler/spot-itn", clock() + deadline)
    batch = coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    saves = commands(batch, Action.SAVE)
    assert sorted(s.container for s in saves) == sorted(JOBS)
    assert all(batch.remaining(s) == pytest.approx(deadline) for s in saves)
    a.taints = ()  # the notice withdrawn: the worker takes jobs again (moves under way go on)
    coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    coord.step(rebalance=True)
    assert A not in coord.core.cordons and coord.state.cordoned == set()


def test_a_cordon_drains_with_no_deadline_a_notice_then_sets_one_and_operators_drain_stays(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord, a, b = _cluster(tmp_path, clock)
    a.taints = (CORDONED,)
    coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    coord.step(rebalance=True)
    assert (
        coord.core.cordons[A].deadline is None
        and coord.core.cordons[A].taint == "node.kubernetes.io/unschedulable"
    )
    clock.advance(5)
    a.taints = (CORDONED, SPOT)
    coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    coord.step(rebalance=True)
    c = coord.core.cordons[A]
    assert c.since == clock() - 5 and c.deadline == clock() + coord.core.policy.recovery.evacuate_deadline
    # An operator's drain is not the taint's: it outlives it.
    coord.on_drain(B)
    b.taints = (CORDONED,)
    coord.on_heartbeat(b.heartbeat())
    b.taints = ()
    coord.on_heartbeat(b.heartbeat())
    coord.step(rebalance=True)
    assert B in coord.core.cordons and coord.core.cordons[B].taint is None


def test_evacuation_off_by_policy_ignores_cordons_and_notices(tmp_path: Path, clock: FakeClock) -> None:
    coord = coordinator(tmp_path, clock, policy(recovery={"evacuate_taints": [], "evacuate_cordoned": False}))
    a = FakeAgent("a", clock)
    a.taints = (CORDONED, SPOT)
    coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS)))
    coord.step(rebalance=True)
    assert coord.core.cordons == {}


def test_a_save_with_no_checkpoint_loses_every_step_the_job_had_trained(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Killed before its first checkpoint (or before its handlers were in): it restarts from 0.
    coord, a, _ = _cluster(tmp_path, clock)
    coord.on_drain(A)
    save = commands(coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS))), Action.SAVE)[0]
    res = CommandResult(command=save.id, ok=True, checkpoint=None, checkpoint_step=None, finished_at=a.now(),
                        detail={"rolled_back": True, "last_step": 7})  # fmt: skip
    coord.on_heartbeat(a.heartbeat(results=(res,)))
    (m,) = [m for m in _evacuations(coord) if m.container == save.container]
    assert m.lost_steps == 7


@pytest.mark.parametrize(
    ("checkpoint", "detail", "lost"),
    [
        ("/vol/ckpt-80.json", {"last_step": 80}, 0),
        ("/vol/ckpt-80.json", {"last_step": 95, "forced": True, "rolled_back": True}, 15),
        (None, {"last_step": 12}, 12),  # never checkpointed: restarts from step 0
        # Its log said no step (not watched there, a record without one): a save the job
        # made itself at its SIGTERM lost nothing; one cut short lost what is unknown.
        ("/vol/ckpt-80.json", {"last_step": None}, 0),
        ("/vol/ckpt-80.json", {"last_step": None, "forced": True}, None),
        ("/vol/ckpt-50.json", {"last_step": None, "rolled_back": True}, None),
        (None, {"last_step": None}, None),
    ],
)
def test_a_saves_lost_steps_come_from_the_jobs_log_else_from_how_it_saved(
    checkpoint: str | None, detail: dict[str, object], lost: int | None
) -> None:
    step = None if checkpoint is None else int(checkpoint.rsplit("-", 1)[1].split(".")[0])
    res = CommandResult(
        command="c1", ok=True, checkpoint=checkpoint, checkpoint_step=step, finished_at=1.0, detail=detail
    )
    assert save_lost_steps(res) == lost


def test_a_drained_job_whose_restore_failed_goes_back_to_its_target_not_the_cordoned_source(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord, a, b = _cluster(tmp_path, clock)
    coord.on_drain(A)
    saves = commands(coord.on_heartbeat(a.heartbeat(*(report(j) for j in JOBS))), Action.SAVE)
    coord.on_heartbeat(a.heartbeat(results=_saved_at_10(saves, a)))
    starts = commands(coord.on_heartbeat(b.heartbeat()), Action.START)
    refused = tuple(
        CommandResult(command=c.id, ok=False, error="no room", finished_at=b.now()) for c in starts
    )
    coord.on_heartbeat(b.heartbeat(results=refused))
    clock.advance(60.0)
    coord.on_heartbeat(a.heartbeat())
    again = commands(coord.on_heartbeat(b.heartbeat()), Action.START)
    assert sorted(c.container for c in again) == sorted(JOBS) and all(c.rollback for c in again)
    assert commands(coord.on_heartbeat(a.heartbeat()), Action.START) == []  # never the drained one


def test_a_forgotten_workers_notice_cordon_goes_with_it_an_operators_drain_stays(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord, _, b = _cluster(tmp_path, clock)
    c, d = FakeAgent("c", clock), FakeAgent("d", clock)
    c.taints = (SPOT,)  # a reclaimed node: deleted after its notice, never heard of again
    coord.on_heartbeat(c.heartbeat())
    coord.on_heartbeat(d.heartbeat())
    coord.on_drain(WorkerId("d"))
    coord.step(rebalance=True)
    assert set(coord.core.cordons) == {"c", "d"}
    msg = coord.core.policy.messaging
    clock.advance(msg.prune_after * msg.worker_timeout + 1)
    coord.on_heartbeat(b.heartbeat())
    coord.core.prune(clock())
    assert {"c", "d"}.isdisjoint(coord.state.workers)  # both forgotten
    assert set(coord.core.cordons) == {"d"} and coord.state.cordoned == {"d"}
