"""The reconciler through the coordinator: every unfinished job it knows keeps one live copy.

Each case drives the coordinator with the heartbeats an agent sends when the event happens
(a host dies, a job crashes, a manager restarts) and checks that the job is restored from its
newest checkpoint on a live worker, once, journaled with its reason, and that jobs that
finished, jobs suspended by GPU sharing and jobs over the limit are left alone.
"""

from __future__ import annotations

from pathlib import Path

from specon_manager.metrics import ManagerMetrics

from specon.config import default_policy, policy_from_dict
from specon.coordinator.inline import InlineCoordinator
from specon.coordinator.migration import Mark, Migration, State
from specon.coordinator.reconcile import Reconciler, backoff
from specon.coordinator.state import ClusterState
from specon.model import Category, ContainerId, ContainerSnapshot, Resources, WorkerId
from specon.policy.placement import ClusterIndex, select_home
from specon.wire.gpu import GpuUse
from specon.wire.protocol import Action, CommandResult, ContainerReport
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

J = ContainerId("j1")


def _recoveries(coord: InlineCoordinator) -> list[Migration]:
    return [m for m in coord.journal.all() if m.reason in ("recovered", "crashed")]


def _two_workers(coord: InlineCoordinator, clock: FakeClock) -> tuple[FakeAgent, FakeAgent]:
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(a.heartbeat(report("j1")))
    coord.on_heartbeat(b.heartbeat())
    return a, b


def _silence(
    coord: InlineCoordinator, clock: FakeClock, beating: FakeAgent, seconds: float, *listed: ContainerReport
) -> None:
    """``seconds`` pass in ticker steps; only ``beating`` keeps sending heartbeats (of ``listed``)."""
    for _ in range(int(seconds)):
        clock.advance(1.0)
        coord.on_heartbeat(beating.heartbeat(*listed))
        coord.step(rebalance=True)


def test_a_lost_hosts_job_is_restored_on_a_live_worker_after_recovery_after(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    events = record_events(coord)
    _, b = _two_workers(coord, clock)
    after = coord.policy.recovery.after
    _silence(coord, clock, b, after - 2)
    assert _recoveries(coord) == []  # unreachable is not yet lost
    _silence(coord, clock, b, 2)
    (m,) = _recoveries(coord)
    assert (m.container, m.source, m.target, m.reason) == (J, "a", "b", "recovered")
    assert m.checkpoint is None  # the newest complete checkpoint, as the target finds it
    start = only(coord.on_heartbeat(b.heartbeat()), Action.START)
    # a is lost: a copy it may still run is fenced by this start's new generation.
    assert (start.container, start.rollback, start.supersede, start.lost) == (J, False, True, "a")
    # b starts it: the copy runs and the recovery is done; a is never asked for anything.
    done = CommandResult(command=start.id, ok=True, finished_at=b.now())
    coord.on_heartbeat(b.heartbeat(report("j1"), results=(done,)))
    coord.step(rebalance=True)
    (m,) = _recoveries(coord)
    assert m.state is State.DONE and m.downtime is not None and m.downtime >= after
    assert coord.state.running_on(J) == "b" and coord.marks[J].home == "b"
    assert "a" not in coord.outbox or not coord.outbox["a"]
    assert [e.labels for e in events if e.kind == "recovery"] == [{"reason": "recovered"}]
    # Once running again, nothing more is opened for it, however long a stays silent.
    _silence(coord, clock, b, 3 * after, report("j1"))
    assert len(_recoveries(coord)) == 1


def test_a_crashed_job_restarts_with_back_off_and_is_left_failed_past_the_limit(
    tmp_path: Path, clock: FakeClock
) -> None:
    pol = policy(recovery={"limit": 2, "backoff": 10.0})
    coord = coordinator(tmp_path, clock, pol)
    events = record_events(coord)
    a = FakeAgent("a", clock)
    coord.on_heartbeat(a.heartbeat(report("j1")))
    starts_at: list[float] = []
    for _ in range(4):
        clock.advance(1.0)
        batch = coord.on_heartbeat(a.heartbeat(report("j1", phase="failed")))
        for _ in range(60):
            if commands(batch, Action.START):
                break
            clock.advance(1.0)
            coord.step(rebalance=True)
            batch = coord.on_heartbeat(a.heartbeat(report("j1", phase="failed")))
        else:
            break  # none came: left failed
        start = only(batch, Action.START)
        assert not start.supersede  # its worker is alive: it can tell that the copy ended
        starts_at.append(clock())
        # The restarted copy runs a while, then crashes again.
        ok = CommandResult(command=start.id, ok=True, finished_at=a.now())
        coord.on_heartbeat(a.heartbeat(report("j1"), results=(ok,)))
        coord.step(rebalance=True)
    crashed = _recoveries(coord)
    assert [m.reason for m in crashed] == ["crashed", "crashed"]
    assert [m.state for m in crashed] == [State.DONE, State.DONE]
    assert coord.marks[J].restarts == 2
    # The second restart waited its back-off: the copy had not run long enough to clear it.
    assert starts_at[1] - starts_at[0] >= backoff(1, pol.recovery)
    assert [e.labels for e in events if e.kind == "recovery_gave_up"] == [{"reason": "crashed"}]
    metrics = ManagerMetrics()
    for e in events:
        metrics.on_event(e)
    assert metrics.recoveries.labels(reason="crashed")._value.get() == 2
    assert metrics.recoveries_skipped.labels(reason="crashed", why="gave_up")._value.get() == 1


def test_a_job_no_heartbeat_saw_running_is_restored_once_its_worker_lists_it_ended(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Started on a, which died before a heartbeat listed the job: the rebooted host lists it
    # stopped (its run from the earlier boot), the only word the manager ever gets of it.
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat())
    coord.on_heartbeat(a.heartbeat(report("j1", phase="stopped")))
    coord.step(rebalance=True)
    (m,) = _recoveries(coord)
    assert (m.reason, m.source) == ("recovered", "a") and m.target in ("a", "b")


def test_a_refused_recovery_start_ends_and_the_next_attempt_backs_off(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    _, b = _two_workers(coord, clock)
    _silence(coord, clock, b, coord.policy.recovery.after)
    start = only(coord.on_heartbeat(b.heartbeat()), Action.START)
    # The lost host may still run it (a partition): the target's runtime refuses the start.
    refused = CommandResult(command=start.id, ok=False, error="already running on worker a")
    coord.on_heartbeat(b.heartbeat(results=(refused,)))
    coord.step(rebalance=True)
    (m,) = _recoveries(coord)
    assert m.state is State.ROLLED_BACK and m.error == "already running on worker a"
    wait = backoff(1, coord.policy.recovery)
    _silence(coord, clock, b, wait - 2)
    assert len(_recoveries(coord)) == 1
    _silence(coord, clock, b, 3)
    assert len(_recoveries(coord)) == 2


def _refuse_recoveries(coord: InlineCoordinator, clock: FakeClock, detail: dict[str, object]) -> int:
    """j1 listed stopped on a, b idle: refuse every recovery start (``detail``: the results');
    the number of starts refused in 30 s."""
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    refused = 0
    for _ in range(30):
        clock.advance(1.0)
        coord.step(rebalance=True)
        for agent, listed in ((a, (report("j1", phase="stopped"),)), (b, ())):
            for start in commands(coord.on_heartbeat(agent.heartbeat(*listed)), Action.START):
                no = CommandResult(start.id, ok=False, error="j1: already running on worker c", detail=detail)
                coord.on_heartbeat(agent.heartbeat(*listed, results=(no,)))
                refused += 1
    return refused


def test_starts_refused_because_a_copy_runs_elsewhere_never_use_up_the_restart_limit(
    tmp_path: Path, clock: FakeClock
) -> None:
    # The copy that ended counts one restart; a start refused because another copy runs (one
    # the manager cannot hear from: a partition, a start it gave up on that ran after all) is
    # no restart. A chaos run left two jobs failed: six refusals in 20 s, then that copy's host
    # was lost too and nothing restored them.
    pol = policy(recovery={"limit": 2, "backoff": 1.0, "max_backoff": 2.0})
    coord = coordinator(tmp_path, clock, pol)
    events = record_events(coord)
    assert _refuse_recoveries(coord, clock, {"running_elsewhere": True}) > pol.recovery.limit
    assert coord.marks[J].restarts == 0
    assert not [e for e in events if e.kind == "recovery_gave_up"]


def test_starts_refused_for_any_other_reason_count_against_the_limit(
    tmp_path: Path, clock: FakeClock
) -> None:
    pol = policy(recovery={"limit": 2, "backoff": 1.0, "max_backoff": 2.0})
    coord = coordinator(tmp_path / "other", clock, pol)
    events = record_events(coord)
    assert _refuse_recoveries(coord, clock, {}) == pol.recovery.limit
    assert coord.marks[J].restarts == pol.recovery.limit
    assert [e.labels for e in events if e.kind == "recovery_gave_up"] == [{"reason": "recovered"}]


def test_a_restarted_manager_restores_a_job_its_journal_knows_and_nobody_reports(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    _two_workers(coord, clock)
    coord.step(rebalance=True)  # the ticker's pass journals where jobs run
    coord.journal.close()
    # The manager restarts; host a died meanwhile and never reports to the new one.
    clock.advance(30.0)
    coord = coordinator(tmp_path, clock)
    assert coord.core.restarted and coord.marks[J].home == "a"
    b = FakeAgent("b", clock)
    b.seq = 10
    _silence(coord, clock, b, coord.policy.recovery.after - 2)
    assert _recoveries(coord) == []
    _silence(coord, clock, b, 2)
    (m,) = _recoveries(coord)
    assert (m.source, m.target, m.reason) == ("a", "b", "recovered")
    assert coord.marks[J].restarts == 1  # nobody reported it: counted, as a crash is


def test_finished_and_gpu_suspended_jobs_and_a_disabled_reconciler_restore_nothing(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a, b = FakeAgent("a", clock), FakeAgent("b", clock)
    coord.on_heartbeat(a.heartbeat(report("done"), report("held")))
    coord.on_heartbeat(b.heartbeat())
    held = ContainerReport(id=ContainerId("held"), category=Category.PROGRESSING, phase="stopped",
                           gpu=GpuUse(devices=(0,), state="suspended"))  # fmt: skip
    coord.on_heartbeat(a.heartbeat(report("done", phase="finished"), held))
    _silence(coord, clock, a, 30)
    assert _recoveries(coord) == []
    assert coord.marks[ContainerId("done")].finished

    off = coordinator(tmp_path / "off", clock, policy(recovery={"enabled": False}))
    _, b2 = _two_workers(off, clock)
    _silence(off, clock, b2, 3 * off.policy.recovery.after)
    assert _recoveries(off) == []


def test_no_recovery_while_a_migration_moves_the_job_or_no_worker_can_host_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    coord = coordinator(tmp_path, clock)
    a = FakeAgent("a", clock)
    coord.on_heartbeat(a.heartbeat(report("j1")))
    # Every worker is silent: nowhere to go, so it waits (logged), and nothing is journaled.
    for _ in range(int(coord.policy.recovery.after) + 5):
        clock.advance(1.0)
        coord.step(rebalance=True)
    assert _recoveries(coord) == []
    b = FakeAgent("b", clock)
    coord.on_heartbeat(b.heartbeat())
    coord.step(rebalance=True)
    assert len(_recoveries(coord)) == 1


def _state_with(*reports: tuple[str, ContainerReport], cpu: float = 4.0) -> ClusterState:
    st = ClusterState()
    clock = FakeClock()
    agents: dict[str, FakeAgent] = {}
    for worker, _ in reports:
        agents.setdefault(worker, FakeAgent(worker, clock, cpu=cpu))
    for worker, agent in agents.items():
        st.ingest(agent.heartbeat(*(r for w, r in reports if w == worker)), clock())
    return st


def test_select_home_takes_the_least_loaded_worker_that_fits_and_never_an_unreachable_one() -> None:
    cfg = default_policy().placement
    big = ContainerReport(id=ContainerId("x"), category=Category.PROGRESSING, requests=Resources(cpu=3.0))
    st = _state_with(
        ("a", report("a1")), ("a", report("a2")), ("b", report("b1")), ("c", big), ("c", report("c1")),
    )  # fmt: skip
    index = ClusterIndex.of(st.snapshot(START, timeout=20.0, marks={}))
    job = ClusterState.placement_view(st.containers[ContainerId("b1")], {}, worker=WorkerId("b"), since=None)
    # Scores: a 2 PC, b 1 PC (the job itself), c 2 PC: b is lowest and b's own job counts.
    assert select_home(index, job, cfg=cfg, worker_timeout=20.0) == "b"
    needy = ContainerSnapshot(
        ContainerId("n"), WorkerId("gone"), Category.CONVERGED, requests=Resources(cpu=2.0)
    )
    # c has 3 of 4 CPUs taken: a 2-CPU job cannot go there; a and b can.
    assert select_home(index, needy, cfg=cfg, worker_timeout=20.0) in ("a", "b")
    stale = ClusterIndex.of(st.snapshot(START + 100.0, timeout=20.0, marks={}))
    assert select_home(stale, job, cfg=cfg, worker_timeout=20.0) is None


def test_backoff_doubles_from_its_base_to_its_cap() -> None:
    cfg = policy(recovery={"backoff": 10.0, "max_backoff": 50.0}).recovery
    assert [backoff(n, cfg) for n in range(6)] == [0.0, 10.0, 20.0, 40.0, 50.0, 50.0]


def test_reconciler_lists_a_job_once_even_if_two_facts_say_it_runs_nowhere() -> None:
    pol = default_policy()
    st = _state_with(("a", report("j1")))
    rec = Reconciler(pol, {})
    marks = {J: Mark(J, home=WorkerId("a"))}
    # Its worker is silent past recovery.after *and* the last report said it stopped.
    st.ingest_reports(WorkerId("a"), [report("j1", phase="stopped")], START)
    due = rec.due(st, marks, set(), START + pol.recovery.after + 1, started_at=0.0)
    assert [r.container for r in due] == [J]


def test_a_worker_is_lost_no_sooner_than_it_is_unreachable() -> None:
    # A file with a long worker_timeout stays valid; recovery.after below it means worker_timeout.
    pol = policy_from_dict(
        {"apiVersion": "specon/v1alpha1", "kind": "Policy", "messaging": {"worker_timeout": 600}}
    )
    assert pol.recovery.after == 60.0 and Reconciler(pol, {}).lost_after == 600.0
